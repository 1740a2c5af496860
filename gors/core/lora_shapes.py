"""Checking a diffusers-format LoRA file against the layers of the pipeline it is loaded into.

diffusers' `load_lora_weights` skips, with a warning at most, LoRA weights that find no layer (a
LoRA of a larger model of the same family loads in part) and fails with a bare `IndexError` on a
file holding only down-projections; transformers' text-encoder path ends in a traceback on other
widths. Read from the file's header (no tensor is loaded), every weight is matched to its layer
before anything loads, and the first that does not fit is named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gors.core.backbones import LORA_COMPONENTS, read_model_index

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

# Weight-name endings diffusers writes (peft's names, then its older ones) -> which projection it is.
LORA_SUFFIXES = {
    ".lora_A.weight": "down",
    ".lora_B.weight": "up",
    ".lora.down.weight": "down",
    ".lora.up.weight": "up",
    ".lora_linear_layer.down.weight": "down",
    ".lora_linear_layer.up.weight": "up",
}
# A peft model's own state dict keeps the adapter's name in each weight's (`...to_q.lora_A.default.weight`);
# `get_peft_model_state_dict` and diffusers' `save_lora_weights` drop it, and diffusers reads no other.
_ADAPTER_NAMED = re.compile(r"\.lora_[AB]\.([^.]+)\.weight$")
# Entries of a diffusers-format file that carry no projection (scales, DoRA magnitudes, biases).
_OTHER_ENDINGS = (".alpha", ".lora_magnitude_vector", ".lora_B.bias", ".lora.up.bias")


@dataclass
class LoraLayer:
    """The projections a LoRA file holds for one layer: shapes as stored, None where absent."""

    component: str
    path: str
    down: tuple[int, ...] | None = None
    up: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.component}.{self.path}"


def lora_components(pipeline: DiffusionPipeline | ConfigOnlyPipeline) -> tuple[str, ...]:
    """The names a diffusers-format LoRA file of `pipeline` may begin its weight names with: every family's
    (`LORA_COMPONENTS`) and the pipeline's own model components, so that a family whose denoiser or encoder
    is named otherwise is checked too."""
    own = (name for name, value in pipeline.components.items() if isinstance(value, torch.nn.Module))
    return tuple(dict.fromkeys((*LORA_COMPONENTS, *own)))


def lora_layers(shapes: dict[str, tuple[int, ...]], components: tuple[str, ...] = LORA_COMPONENTS,
                ) -> list[LoraLayer] | None:
    """The layers of a diffusers-format LoRA state dict given as {weight name: shape}, whose names begin with
    one of `components`; None for any other format (kohya, lora_diffusion, attention-processor names:
    diffusers converts those itself)."""
    layers: dict[str, LoraLayer] = {}
    for key, shape in shapes.items():
        component, _, rest = key.partition(".")
        if component not in components:
            return None
        if rest.endswith(_OTHER_ENDINGS):
            continue
        suffix = next((s for s in LORA_SUFFIXES if rest.endswith(s)), None)
        if suffix is None:
            return None
        path = rest[: -len(suffix)]
        layer = layers.setdefault(f"{component}.{path}", LoraLayer(component, path))
        setattr(layer, LORA_SUFFIXES[suffix], tuple(shape))
    return list(layers.values())


def _layer_module(component: torch.nn.Module, path: str) -> torch.nn.Module | None:
    # LoRA files name a CLIP text encoder's layers with or without `text_model.`, a level transformers 5 removed.
    for candidate in dict.fromkeys((path, path.removeprefix("text_model."), f"text_model.{path}")):
        try:
            module = component.get_submodule(candidate)
        except AttributeError:
            continue
        return getattr(module, "base_layer", module)  # a layer that already carries an adapter
    return None


def _features(module: torch.nn.Module) -> tuple[int, int] | None:
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, torch.nn.Conv2d):
        return module.in_channels, module.out_channels
    return None


def lora_file_problem(layers: list[LoraLayer]) -> str | None:
    """What makes `layers` no whole LoRA (a projection without its pair, ranks that differ), or None."""
    for layer in layers:
        if layer.down is None or layer.up is None:
            have, lack = ("down", "up") if layer.up is None else ("up", "down")
            return f"it holds the {have}-projection of {layer.name} without its {lack}-projection"
        if layer.down[0] != layer.up[1]:
            return (f"its {layer.name} has a down-projection of rank {layer.down[0]} and an up-projection of "
                    f"rank {layer.up[1]}")
    return None


def lora_misfit(pipeline: DiffusionPipeline | ConfigOnlyPipeline, layers: list[LoraLayer]) -> str | None:
    """The first of `layers` (whole pairs) that finds no layer of the pipeline or does not fit it, in words;
    None when all fit."""
    for layer in layers:
        component = pipeline.components.get(layer.component)
        module = _layer_module(component, layer.path) if isinstance(component, torch.nn.Module) else None
        if module is None:
            kind = getattr(pipeline, "class_name", type(pipeline).__name__)
            return f"it has weights for {layer.name}, a layer this {kind} does not have"
        features = _features(module)
        if features is not None and features != (layer.down[1], layer.up[0]):
            return (f"its {layer.name} maps {layer.down[1]} to {layer.up[0]} features, the model's layer "
                    f"{features[0]} to {features[1]}")
    return None


# How a down-projection's weight name ends in the formats diffusers converts (peft, diffusers' older names, kohya,
# attention processors' `to_q_lora.down`): one per layer of the file, whatever the format.
_DOWN_ENDINGS = (".lora_A.weight", "down.weight")


# kohya's name prefixes -> the component diffusers loads them into ("denoiser": the U-Net or transformer).
KOHYA_PREFIXES = {"lora_unet_": "denoiser", "lora_te_": "text_encoder", "lora_te1_": "text_encoder",
                  "lora_te2_": "text_encoder_2", "lora_te3_": "text_encoder_3"}
UNPLACED = ""  # layers whose name says no component


def file_lora_layer_counts(shapes: dict[str, tuple[int, ...]], denoiser: str,
                           components: tuple[str, ...] = LORA_COMPONENTS) -> dict[str, int]:
    """Component -> how many of its layers a LoRA file of any format adapts (its down-projections), by the
    names' component (one of `components`, kohya's `lora_te2_`, ...); `UNPLACED` for names that say none.
    `denoiser`: the pipeline's U-Net or transformer component."""
    counts: dict[str, int] = {}
    for key in shapes:
        if not key.endswith(_DOWN_ENDINGS):
            continue
        component = key.split(".", 1)[0] if key.split(".", 1)[0] in components else UNPLACED
        kohya = next((prefix for prefix in KOHYA_PREFIXES if key.startswith(prefix)), None)
        if kohya is not None:
            component = denoiser if KOHYA_PREFIXES[kohya] == "denoiser" else KOHYA_PREFIXES[kohya]
        counts[component] = counts.get(component, 0) + 1
    return counts


def lora_layers_left_out(in_file: dict[str, int], loaded: dict[str, int]) -> list[str]:
    """The components of which fewer layers loaded than the file adapts, in words ("text_encoder_2: 2 in the
    file, 0 loaded"). A component whose fused layers diffusers splits (FLUX's qkv) loads more than the file
    holds, which can hide a layer left out there; a component with none loaded is always named."""
    short = {component: count for component, count in in_file.items() if component != UNPLACED
             and loaded.get(component, 0) < count}
    if in_file.get(UNPLACED) and sum(in_file.values()) > sum(loaded.values()):
        short[UNPLACED] = in_file[UNPLACED]
    return [f"{component or 'unnamed layers'}: {count} in the file, "
            f"{loaded.get(component, 0) if component else sum(loaded.values())} loaded"
            for component, count in short.items()]


def loaded_lora_layers(pipeline: DiffusionPipeline) -> dict[str, int]:
    """Component name -> how many of its layers carry a LoRA (peft's `LoraLayer`), for the components that
    have any."""
    from peft.tuners.lora import LoraLayer

    counts = {name: sum(isinstance(module, LoraLayer) for module in component.modules())
              for name, component in pipeline.components.items() if isinstance(component, torch.nn.Module)}
    return {name: count for name, count in counts.items() if count}


def model_name(pipeline: DiffusionPipeline | ConfigOnlyPipeline) -> str:
    """The path or Hub id a pipeline was loaded from, else its class name: how messages name the model."""
    return getattr(pipeline, "name_or_path", None) or type(pipeline).__name__


def read_lora_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """{weight name: shape} of a safetensors file, from its header only."""
    from safetensors import safe_open

    with safe_open(str(file), "pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}


def peft_adapter_names(shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """The adapter names a LoRA file's weight names keep (`lora_A.default.weight`: ["default"]), sorted; empty
    for the files diffusers reads."""
    return sorted({match.group(1) for key in shapes if (match := _ADAPTER_NAMED.search(key))})


@dataclass
class ConfigOnlyPipeline:
    """A pipeline's model components built from their configs on the meta device, no weights read: what
    `check_lora_shapes` reads of a pipeline, before any weights load."""

    name_or_path: str
    class_name: str
    components: dict[str, torch.nn.Module]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, revision: str | None = None) -> ConfigOnlyPipeline:
        import importlib

        from accelerate import init_empty_weights

        index = read_model_index(pretrained_model_name_or_path, revision)
        components = {}
        for name, value in index.items():
            if not (isinstance(value, list) and len(value) == 2 and value[0] in ("diffusers", "transformers")):
                continue
            module_class = getattr(importlib.import_module(value[0]), value[1], None)
            if not (isinstance(module_class, type) and issubclass(module_class, torch.nn.Module)):
                continue  # a tokenizer, a scheduler
            with init_empty_weights():
                if value[0] == "diffusers":
                    config = module_class.load_config(pretrained_model_name_or_path, subfolder=name, revision=revision)
                    components[name] = module_class.from_config(config)
                else:
                    config = module_class.config_class.from_pretrained(pretrained_model_name_or_path, subfolder=name,
                                                                       revision=revision)
                    components[name] = module_class._from_config(config)
        return cls(pretrained_model_name_or_path, index.get("_class_name", "pipeline"), components)


def check_lora_fits_before_loading(pretrained_model_name_or_path: str, lora: str, revision: str | None = None) -> None:
    """`check_lora_shapes` for a local safetensors LoRA against the model's components built from their configs
    (`ConfigOnlyPipeline`): a LoRA of another base model is refused before a command writes anything. Where the
    configs cannot be read or built, nothing is refused here: the load checks the pipeline itself."""
    from gors.core.pipeline import local_lora_file

    file = local_lora_file(lora)
    if file is None or file.suffix != ".safetensors":
        return
    try:
        pipeline = ConfigOnlyPipeline.from_pretrained(pretrained_model_name_or_path, revision)
    except Exception:  # noqa: BLE001 (a model whose configs this check cannot build is checked as it loads)
        return
    check_lora_shapes(pipeline, read_lora_shapes(file), lora)


def check_lora_shapes(pipeline: DiffusionPipeline | ConfigOnlyPipeline, shapes: dict[str, tuple[int, ...]],
                      lora: str) -> None:
    """Refuse a local diffusers-format LoRA file (its `read_lora_shapes`) that is no whole LoRA, or with a weight
    that finds no layer of `pipeline` or does not fit it, and one saved from a peft model's own state dict (which
    diffusers fails on with an error that does not say why). Other formats are left to diffusers, which
    converts them."""
    adapters = peft_adapter_names(shapes)
    if adapters:
        example = next(key for key in shapes if _ADAPTER_NAMED.search(key))
        raise ValueError(
            f"LoRA {lora} was saved from a peft model's state_dict(): its weight names keep the adapter name "
            f"{', '.join(map(repr, adapters))} ({example}), which diffusers does not read. Save it with "
            "peft.get_peft_model_state_dict(model) (or a pipeline's save_lora_weights), which drops the name"
            + (", one adapter per file" if len(adapters) > 1 else "")
        )
    layers = lora_layers(shapes, lora_components(pipeline))
    if layers is None:
        return
    problem = lora_file_problem(layers)
    if problem is not None:
        raise ValueError(f"LoRA {lora} is not a whole LoRA: {problem}; pass the folder or file a training run wrote")
    problem = lora_misfit(pipeline, layers)
    if problem is not None:
        raise ValueError(f"LoRA {lora} does not fit {model_name(pipeline)}: {problem}. It was trained on another base model; "
                         "pass the model it was trained on")
