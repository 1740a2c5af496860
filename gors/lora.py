"""LoRA on a pipeline's denoiser and text encoders, saved and loaded in the diffusers format.

The Stable Diffusion targets are the official GORS ones (T2I-CompBench trained with
`lora_diffusion`): every attention projection of the U-Net (self- and cross-attention) and of the
CLIP text encoder. Other families name theirs in `gors.families`. Alpha equals the rank, so the
LoRA scale is 1 as in the released checkpoints.

A LoRA file holds one block of weights per component, prefixed by the component's name in the
pipeline (`unet.`, `transformer.`, `text_encoder.`, `text_encoder_2.`): the layout that the
family's `Pipeline.save_lora_weights` writes and `Pipeline.load_lora_weights` reads. A CLIP text
encoder's layers are named under `text_model.` as transformers 4 builds it, in Hub LoRAs and in
diffusers' loaders; transformers 5 builds `CLIPTextModel` without that wrapper, so its names get
the prefix on save and lose it on load (`TEXT_MODEL_PREFIX`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from gors.core.backbones import LORA_WEIGHT_NAME
from gors.core.fused_lora import fuse_lora_forward
from gors.core.io import publish_files

UNET_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
TEXT_ENCODER_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "out_proj")
SD_PIPELINE = "StableDiffusionPipeline"
TEXT_MODEL_PREFIX = "text_model."


def _unwrapped_clip(module: torch.nn.Module) -> bool:
    """A `CLIPTextModel` built without its `text_model` wrapper (transformers 5)."""
    from transformers import CLIPTextModel

    return isinstance(module, CLIPTextModel) and not hasattr(module, "text_model")


def with_text_model_prefix(state: Mapping[str, torch.Tensor], module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s LoRA weights named as in a LoRA file (`text_model.encoder...` for a CLIP text encoder)."""
    prefix = TEXT_MODEL_PREFIX if _unwrapped_clip(module) else ""
    return {prefix + key: value for key, value in state.items()}


def _lora_config(rank: int, targets: Sequence[str]):
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=list(targets))


def add_lora(module: torch.nn.Module, target_modules: Sequence[str], rank: int) -> None:
    """Inject rank-`rank` LoRA adapters into `module`; its base weights are frozen, only the adapters train.

    diffusers models take theirs through `add_adapter`; transformers models from peft directly,
    since transformers 5 refuses `PreTrainedModel.add_adapter` with current peft releases. The
    linear layers then run fused (`gors.core.fused_lora`).
    """
    from peft import inject_adapter_in_model

    module.requires_grad_(False)
    config = _lora_config(rank, target_modules)
    if _is_diffusers_model(module):
        module.add_adapter(config)
    else:
        inject_adapter_in_model(config, module)
    fuse_lora_forward(module)


def _is_diffusers_model(module: torch.nn.Module) -> bool:
    from diffusers import ModelMixin

    return isinstance(module, ModelMixin)


@contextmanager
def adapters_disabled(*modules: torch.nn.Module) -> Iterator[None]:
    """Run `modules` as their base models: every LoRA layer in them off inside the block, on again after."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [layer for module in modules for layer in module.modules() if isinstance(layer, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def lora_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable LoRA parameters of `module` (peft's `lora_A` / `lora_B`, DoRA's magnitudes)."""
    return [p for name, p in module.named_parameters() if "lora_" in name and p.requires_grad]


def _pipeline_class(name: str):
    import diffusers

    return getattr(diffusers, name)


def save_lora(save_dir: str | Path, modules: Mapping[str, torch.nn.Module], pipeline_class: str = SD_PIPELINE,
              peft_names: bool = False) -> Path:
    """Write `pytorch_lora_weights.safetensors` with the adapters of `modules` (component name -> module),
    as `pipeline_class.load_lora_weights` reads it.

    `peft_names`: keep peft's weight names (`lora_A`/`lora_B`), as diffusers' SD3 and FLUX scripts
    save; otherwise diffusers' older names (`lora.down`/`lora.up`), as its SD and SDXL scripts save.
    """
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
        state = get_peft_model_state_dict(module)
        return with_text_model_prefix(state if peft_names else convert_state_dict_to_diffusers(state), module)

    layers = {f"{name}_lora_layers": weights(module) for name, module in modules.items()}
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    for stale in save_dir.glob(".lora-*"):  # left by a save killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    # Written beside and then moved in, so a kill mid-write leaves the previous LoRA whole.
    with tempfile.TemporaryDirectory(dir=save_dir, prefix=".lora-") as staging:
        _pipeline_class(pipeline_class).save_lora_weights(staging, **layers)
        publish_files(staging, save_dir)
    return save_dir / LORA_WEIGHT_NAME


def load_lora(load_dir: str | Path, modules: Mapping[str, torch.nn.Module], pipeline_class: str = SD_PIPELINE) -> None:
    """Load a diffusers-format LoRA into modules that already carry adapters (see `add_lora`).

    Every adapter weight of `modules` must come from the file and every weight of the file must
    find its adapter: a `ValueError` names the first ones otherwise (peft alone would skip them).
    """
    from diffusers.utils import (
        convert_state_dict_to_diffusers,
        convert_state_dict_to_peft,
        convert_unet_state_dict_to_peft,
    )
    from peft.utils import set_peft_model_state_dict

    loaded = _pipeline_class(pipeline_class).lora_state_dict(str(load_dir))
    state_dict = loaded[0] if isinstance(loaded, tuple) else loaded  # some mixins also return the alphas

    for name, module in modules.items():
        prefix = f"{name}."
        part = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not part:
            raise ValueError(f"{load_dir} has no LoRA weights for the {name}; it was saved by a run that did not "
                             f"train it")
        if _is_diffusers_model(module):
            converted = convert_unet_state_dict_to_peft(part)
        else:
            if _unwrapped_clip(module):
                part = {key.removeprefix(TEXT_MODEL_PREFIX): value for key, value in part.items()}
            converted = convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))
        result = set_peft_model_state_dict(module, converted, adapter_name="default")
        missing = [key for key in result.missing_keys if "lora_" in key]
        if result.unexpected_keys or missing:
            found = ", ".join(f"{what} {keys[0]} ({len(keys)} in all)"
                              for what, keys in (("unexpected", result.unexpected_keys), ("missing", missing)) if keys)
            raise ValueError(f"{load_dir}: its {name} LoRA does not fit the {name}'s adapters: {found}. It was "
                             "saved for another model, other LoRA targets or another layer naming.")
