"""The official GORS LoRA checkpoints (T2I-CompBench), downloaded and converted to the diffusers format.

T2I-CompBench released one LoRA per category, trained on `stabilityai/stable-diffusion-2-base`
with the `lora_diffusion` library: `<name>.pt` (U-Net) and `<name>.text_encoder.pt` (text
encoder), each a flat list of fp16 tensors `[up, down, up, down, ...]`, rank 4, scale 1. A pair
carries no layer name: its meaning is its position in the order `lora_diffusion` walked the model,
which this module reproduces (`lora_diffusion_targets`) to give every pair its module name.

`gors convert-lora official:color OUT` writes `OUT/pytorch_lora_weights.safetensors`, which
`StableDiffusionPipeline.load_lora_weights(OUT)`, `gors.lora.load_lora` and `--lora OUT` load.
`official_lora_folder("color")` (what `--lora official:color` reads) does the same once into the cache
and returns the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gors._moved import moved_names
from gors.cli import parse_config
from gors.config import check_values
from gors.core.data import PinnedSource, cache_root, fetch_pinned_file
from gors.core.io import file_sha256, fsync_path, remove_stale_staging, set_usual_permissions
from gors.core.paper import CATEGORIES, OFFICIAL_CHECKPOINT_STEMS
from gors.core.pipeline import LORA_DIFFUSION_TEXT_ENCODER_SUFFIX, LORA_WEIGHT_FILES
from gors.core.prompts import T2I_COMPBENCH_COMMIT, T2I_COMPBENCH_REPOSITORY
from gors.lora import LORA_WEIGHT_NAME, TEXT_ENCODER_TARGET_MODULES, UNET_TARGET_MODULES, with_text_model_prefix
from gors.sd2_architecture import SD2_BASE, architecture_configs, empty_models

OFFICIAL_PREFIX = "official:"
# 0.1 names that moved in 0.2 (CHANGELOG.md); they warn and forward until 0.3.
__getattr__ = moved_names(__name__, {
    "TEXT_ENCODER_SUFFIX": "gors.core.pipeline:LORA_DIFFUSION_TEXT_ENCODER_SUFFIX",
    "resolve_lora": "gors.lora_sources:resolve_lora",
})
# sha256 of the files under GORS_finetune/checkpoint/ at T2I_COMPBENCH_COMMIT.
OFFICIAL_LORA_SHA256: dict[str, str] = {
    "color/lora_weight_e357_s124500.pt": "aa383a5a81af07ac1fa5e9cc57db64cac09d1568d20593cd1cc5f6fd27bf6806",
    "color/lora_weight_e357_s124500.text_encoder.pt": "93d174a63dc2746c1e5f762c557958c3c66b10375b908c83eda74aecbe88e4c3",
    "shape/lora_weight_e180_s49000.pt": "6066ba80e7568424361f7c3b34c9bc853d9a2454e6af269de7cec56684388f7e",
    "shape/lora_weight_e180_s49000.text_encoder.pt": "797ca0ebb6acb00bf83638431e16e022f734c8d0c0a7d508a59d08c9a1bbd5d8",
    "texture/lora_weight_e118_s63000.pt": "833e28a7893e0b1780f95af838c5d662bf5b357b01b82fabd6af4b9f4337c495",
    "texture/lora_weight_e118_s63000.text_encoder.pt": "0eef7d477a7ed6e16262c6bb04b0d169996a9a59953c087f399d515e5c277d30",
    "spatial/spatial.pt": "c50abc49e9c6648d96e42874cf2588e8b8d3af2302421c35862c7dba44aab354",
    "spatial/spatial.text_encoder.pt": "274d5dc76b77385d4249383b2c393191c179d49608584ffa28f98220f24afdff",
    "non_spatial/non_spatial.pt": "e235209e042d48b14173f69e096c370dcfc5bc19d93d3cc720ab2a1b66564053",
    "non_spatial/non_spatial.text_encoder.pt": "97c075ed93d0e73cf663b763f84e4c0643f6ea949fe4a0f3890ed0d7dd300e0a",
    "complex/complex.pt": "cecbf1ee67fe42d9f586df2482248f26477a9682210e3442d634e48f6c76bd44",
    "complex/complex.text_encoder.pt": "4a7d93d8b74dd51dc7474ac39962a6e517a2133e460e62a99c2b1e45f2ce94ef",
}
GORS_CHECKPOINTS = PinnedSource(
    name="gors_checkpoints",
    repository=T2I_COMPBENCH_REPOSITORY,
    commit=T2I_COMPBENCH_COMMIT,
    folder="GORS_finetune/checkpoint/",
    sha256=OFFICIAL_LORA_SHA256,
    offline_hint="(a copy of T2I-CompBench's GORS_finetune/checkpoint/ folder, keeping the <category>/ sub-folders)",
)
# The classes whose nn.Linear children lora_diffusion replaced: the official training script
# targets "CrossAttention" and "Attention" (diffusers renamed the first to the second after 0.14)
# in the U-Net, "CLIPAttention" in the text encoder.
UNET_ATTENTION_CLASSES = ("CrossAttention", "Attention")
TEXT_ENCODER_ATTENTION_CLASSES = ("CLIPAttention",)
# Bump when the converted file changes, so stale conversions in the cache are not reused.
CONVERSION_VERSION = "diffusers-v2"  # v2: text-encoder layers under text_model., as Hub LoRAs
SOURCE_RECORD = "gors_lora_source.json"


class LoraConversionError(ValueError):
    """A lora_diffusion checkpoint does not fit the model it is converted for."""


def _check_category(category: str) -> None:
    if category not in OFFICIAL_CHECKPOINT_STEMS:
        raise ValueError(
            f"Unknown GORS category {category!r}: the official LoRA checkpoints are "
            f"{', '.join(OFFICIAL_PREFIX + c for c in CATEGORIES)}."
        )


def official_lora_files(category: str) -> tuple[Path, Path]:
    """The (U-Net, text-encoder) `.pt` files of an official GORS checkpoint, sha256-verified.

    `category` is one of color, shape, texture, spatial, non_spatial, complex. With
    `GORS_DATA_DIR` set only that folder is read (`<dir>/<category>/<file>` or
    `<dir>/gors_checkpoints/<category>/<file>`); otherwise the files are downloaded once from
    T2I-CompBench at the pinned commit into `$GORS_CACHE_DIR` (see `gors.core.data.fetch_pinned_file`).
    """
    _check_category(category)
    stem = f"{category}/{OFFICIAL_CHECKPOINT_STEMS[category]}"
    return fetch_pinned_file(GORS_CHECKPOINTS, stem + ".pt"), fetch_pinned_file(GORS_CHECKPOINTS, stem + LORA_DIFFUSION_TEXT_ENCODER_SUFFIX)


def lora_diffusion_targets(model: torch.nn.Module, attention_classes: Sequence[str]) -> list[tuple[str, torch.nn.Linear]]:
    """The `nn.Linear` layers lora_diffusion adapted, in the order of its checkpoint's pairs.

    lora_diffusion visits `model.modules()` and, inside every module whose class name is in
    `attention_classes`, that module's `named_modules()`: registration order, not the order of the
    forward pass. For the SD 2 U-Net that gives the down blocks, then the up blocks, then the mid
    block (UNet2DConditionModel creates the `down_blocks` and `up_blocks` lists before it sets
    `mid_block`), and in each attention to_q, to_k,
    to_v, to_out.0; for CLIP it gives k_proj, v_proj, q_proj, out_proj per layer.
    """
    targets = []
    for name, module in model.named_modules():
        if type(module).__name__ in attention_classes:
            for child_name, child in module.named_modules():
                if isinstance(child, torch.nn.Linear):
                    targets.append((f"{name}.{child_name}", child))
    return targets


def read_lora_diffusion(path: str | os.PathLike[str]) -> list[torch.Tensor]:
    """The flat `[up, down, up, down, ...]` tensor list of a lora_diffusion `.pt` file.

    Read with `weights_only=True`: a downloaded pickle cannot run code.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA checkpoint {str(path)!r} does not exist.")
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several unrelated types for a file that is not a checkpoint
        # Not torch's message: it runs to several lines advising weights_only=False, which would run pickled code.
        raise LoraConversionError(f"{path} is not a lora_diffusion checkpoint: torch.load cannot read it as tensors "
                                  f"({type(err).__name__}; not a PyTorch file, or cut short)") from err
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) and t.ndim == 2 for t in tensors):
        raise LoraConversionError(
            f"{path} is not a lora_diffusion checkpoint: expected a list of 2-D tensors [up, down, ...], "
            f"got {type(tensors).__name__}."
        )
    return list(tensors)


def map_lora_pairs(
    tensors: Sequence[torch.Tensor], layers: Sequence[tuple[str, int, int]], what: str
) -> dict[str, torch.Tensor]:
    """Give pair i = (tensors[2i], tensors[2i+1]) = (up, down) to layer i; peft-named float32 weights.

    `layers` are (module name, in_features, out_features) in the checkpoint's order. The result
    maps `<name>.lora_A.weight` to down (rank, in_features) and `<name>.lora_B.weight` to up
    (out_features, rank). Every count and shape is checked; one rank for all pairs.
    """
    expected = (
        f"the model has {len(layers)} attention linear layers, so a checkpoint for it holds "
        f"{2 * len(layers)} tensors (official GORS, SD 2 base: 256 for the U-Net, 184 for the text encoder)"
    )
    if len(tensors) != 2 * len(layers):
        hint = "an odd number: truncated or not alternating up/down" if len(tensors) % 2 else "a different model"
        raise LoraConversionError(
            f"{what}: the checkpoint holds {len(tensors)} tensors ({hint}), but {expected}. Use the checkpoint "
            f"with the base model it was trained on (--pretrained_model_name_or_path)."
        )
    rank = tensors[0].shape[1] if len(tensors) else 0
    state: dict[str, torch.Tensor] = {}
    for i, (name, in_features, out_features) in enumerate(layers):
        up, down = tensors[2 * i], tensors[2 * i + 1]
        if tuple(up.shape) != (out_features, rank) or tuple(down.shape) != (rank, in_features):
            raise LoraConversionError(
                f"{what}: pair {i} (tensors {2 * i}, {2 * i + 1}) has up {tuple(up.shape)} and down "
                f"{tuple(down.shape)}, but layer {name} is Linear({in_features} -> {out_features}) and needs up "
                f"({out_features}, {rank}) and down ({rank}, {in_features}). The checkpoint is for another "
                f"architecture: pass its base model with --pretrained_model_name_or_path."
            )
        state[f"{name}.lora_A.weight"] = down.float()
        state[f"{name}.lora_B.weight"] = up.float()
    return state


def _layers(model: torch.nn.Module, attention_classes: Sequence[str], allowed: Sequence[str], what: str):
    layers = []
    for name, linear in lora_diffusion_targets(model, attention_classes):
        if not name.endswith(tuple("." + a for a in allowed)):
            raise LoraConversionError(
                f"{what}: attention layer {name} is not one of the GORS LoRA targets {', '.join(allowed)}; "
                f"this model's attention differs from Stable Diffusion 2's."
            )
        layers.append((name, linear.in_features, linear.out_features))
    if not layers:
        raise LoraConversionError(f"{what}: no {' / '.join(attention_classes)} module found in {type(model).__name__}.")
    return layers


def _tensors(source: str | os.PathLike[str] | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list(source) if isinstance(source, (list, tuple)) else read_lora_diffusion(source)


def _describe(source) -> str:
    return "(tensor list)" if isinstance(source, (list, tuple)) else str(source)


def convert_lora_diffusion(
    unet_pt: str | os.PathLike[str] | Sequence[torch.Tensor],
    text_encoder_pt: str | os.PathLike[str] | Sequence[torch.Tensor],
    unet: torch.nn.Module,
    text_encoder: torch.nn.Module,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Map lora_diffusion checkpoints (paths or loaded tensor lists) onto a U-Net and a CLIP text encoder.

    Returns the (U-Net, text encoder) LoRA state dicts in peft naming (`<module>.lora_A.weight`
    = down, `<module>.lora_B.weight` = up, float32), module names as in the given models. The
    models' weights are never read: models on the meta device (`gors.sd2_architecture.empty_models`)
    work. Raises `LoraConversionError` when the counts or shapes do not fit.
    """
    unet_layers = _layers(unet, UNET_ATTENTION_CLASSES, UNET_TARGET_MODULES, "U-Net")
    text_layers = _layers(text_encoder, TEXT_ENCODER_ATTENTION_CLASSES, TEXT_ENCODER_TARGET_MODULES, "text encoder")
    return (
        map_lora_pairs(_tensors(unet_pt), unet_layers, f"U-Net LoRA {_describe(unet_pt)}"),
        map_lora_pairs(_tensors(text_encoder_pt), text_layers, f"text-encoder LoRA {_describe(text_encoder_pt)}"),
    )


def checkpoint_pair(source: str | os.PathLike[str] | tuple[str | os.PathLike[str], str | os.PathLike[str]]) -> tuple[Path, Path]:
    """The (U-Net, text-encoder) `.pt` files named by `source`.

    `source`: `official:<category>`; a folder holding one `<name>.pt` with its
    `<name>.text_encoder.pt`; either of those two files (the other is found next to it, as
    lora_diffusion's `patch_pipe` does); or a (U-Net, text-encoder) pair of paths.
    """
    if isinstance(source, tuple):
        unet_pt, text_pt = (Path(p).expanduser() for p in source)
    elif str(source).startswith(OFFICIAL_PREFIX):
        return official_lora_files(str(source)[len(OFFICIAL_PREFIX):])
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*" + LORA_DIFFUSION_TEXT_ENCODER_SUFFIX))
            if not found and any((path / name).is_file() for name in LORA_WEIGHT_FILES):
                raise ValueError(
                    f"{path} already holds a diffusers LoRA ({LORA_WEIGHT_NAME}): nothing to convert. Pass the folder "
                    "to --lora as it is (gors run folders and convert-lora's outputs are such folders)."
                )
            if len(found) != 1:
                raise FileNotFoundError(
                    f"{path} holds {len(found)} '*{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX}' files; expected exactly one "
                    f"<name>.pt with its <name>{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX}. Pass the U-Net .pt file instead."
                )
            path = found[0]
        if path.name.endswith(LORA_DIFFUSION_TEXT_ENCODER_SUFFIX):
            unet_pt, text_pt = path.with_name(path.name[: -len(LORA_DIFFUSION_TEXT_ENCODER_SUFFIX)] + ".pt"), path
        elif path.suffix == ".pt":
            unet_pt, text_pt = path, path.with_name(path.stem + LORA_DIFFUSION_TEXT_ENCODER_SUFFIX)
        else:
            raise ValueError(
                f"LoRA source {str(source)!r} is not official:<category>, a folder or a lora_diffusion .pt file."
            )
    for file in (unet_pt, text_pt):
        if not file.is_file():
            raise FileNotFoundError(
                f"LoRA checkpoint {str(file)!r} does not exist: a lora_diffusion LoRA is a <name>.pt (U-Net) "
                f"with <name>{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX} next to it."
            )
    return unet_pt, text_pt


def write_diffusers_lora(
    output_dir: str | os.PathLike[str],
    unet_state: dict[str, torch.Tensor],
    text_encoder_state: dict[str, torch.Tensor],
    source_record: dict | None = None,
) -> Path:
    """Write peft-named LoRA state dicts as `output_dir/pytorch_lora_weights.safetensors`.

    The same layout `gors.lora.save_lora` writes; no alphas are stored, so loaders use
    alpha = rank (scale 1, as lora_diffusion). The file appears atomically. `source_record`,
    when given, is written next to it as `gors_lora_source.json`.
    """
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_diffusers

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(output_dir, ".convert.*")  # a killed conversion's
    staging = Path(tempfile.mkdtemp(dir=output_dir, prefix=".convert."))
    try:
        StableDiffusionPipeline.save_lora_weights(
            staging,
            unet_lora_layers=convert_state_dict_to_diffusers(unet_state),
            text_encoder_lora_layers=convert_state_dict_to_diffusers(text_encoder_state),
        )
        if source_record is not None:
            (staging / SOURCE_RECORD).write_text(json.dumps(source_record, indent=2) + "\n")
        # The record describes the weights beside it: an earlier one goes before the weights are replaced and the
        # new one comes after them, so that a kill never leaves a record beside other weights.
        (output_dir / SOURCE_RECORD).unlink(missing_ok=True)
        for name in (LORA_WEIGHT_NAME, SOURCE_RECORD):
            if (staging / name).exists():
                fsync_path(staging / name)
                set_usual_permissions(staging / name)  # the writer leaves 0600; a LoRA is as readable as any model
                os.replace(staging / name, output_dir / name)
        fsync_path(output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir / LORA_WEIGHT_NAME


def convert_official_lora(
    source: str | os.PathLike[str] | tuple[str | os.PathLike[str], str | os.PathLike[str]],
    output_dir: str | os.PathLike[str],
    pretrained_model_name_or_path: str = SD2_BASE,
) -> Path:
    """Convert a lora_diffusion LoRA (see `checkpoint_pair` for `source`) into a diffusers LoRA folder.

    Only the base model's configs are read, never its weights. Returns the written
    `pytorch_lora_weights.safetensors`.
    """
    unet_pt, text_pt = checkpoint_pair(source)
    unet, text_encoder = empty_models(*architecture_configs(pretrained_model_name_or_path))
    unet_state, text_state = convert_lora_diffusion(unet_pt, text_pt, unet, text_encoder)
    text_state = with_text_model_prefix(text_state, text_encoder)  # the Hub's layout, whichever transformers
    record = {
        "source": str(source) if not isinstance(source, tuple) else [str(p) for p in source],
        "files": {str(p): file_sha256(p) for p in (unet_pt, text_pt)},
        "format": "lora_diffusion",
        "base_model": pretrained_model_name_or_path,
        "rank": int(next(iter(unet_state.values())).shape[0]),
        "unet_pairs": len(unet_state) // 2,
        "text_encoder_pairs": len(text_state) // 2,
        "conversion": CONVERSION_VERSION,
    }
    return write_diffusers_lora(output_dir, unet_state, text_state, record)


def official_lora_folder(category: str) -> str:
    """A folder holding the official LoRA of `category`, converted to the diffusers format (for SD-2-base, which
    it was trained on): once into `$GORS_CACHE_DIR/official_lora/<commit>/<version>/<category>`, then reused.
    Concurrent processes each convert into a staging folder and the first rename wins."""
    _check_category(category)
    folder = cache_root() / "official_lora" / T2I_COMPBENCH_COMMIT / CONVERSION_VERSION / category
    if (folder / LORA_WEIGHT_NAME).is_file():
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{category}."))
    try:
        convert_official_lora(f"{OFFICIAL_PREFIX}{category}", staging, SD2_BASE)
        set_usual_permissions(staging)  # mkdtemp makes it private; the cache is shared like any model cache
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / LORA_WEIGHT_NAME).is_file():  # not another process winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


@dataclass
class ConvertLoraConfig:
    """Convert a lora_diffusion LoRA (the official GORS checkpoints of T2I-CompBench) into a diffusers LoRA
    folder (OUT/pytorch_lora_weights.safetensors) for --lora or pipe.load_lora_weights(OUT)."""

    source: str = field(metadata={
        "positional": True, "metavar": "IN",
        "help": f"official:<category> ({', '.join(CATEGORIES)}; downloaded from {T2I_COMPBENCH_REPOSITORY} "
        f"at commit {T2I_COMPBENCH_COMMIT[:7]}, sha256-checked, GORS_DATA_DIR for offline copies), a folder "
        f"holding <name>.pt and <name>{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX}, or the U-Net <name>.pt itself.",
    })
    output_dir: str = field(metadata={
        "positional": True, "metavar": "OUT", "help": "Folder to write the diffusers LoRA into.",
    })
    pretrained_model_name_or_path: str = field(default=SD2_BASE, metadata={
        "help": "Base model the LoRA was trained on; only its unet/ and text_encoder/ configs are read "
        "(default: %(default)s, whose configs are built in when offline).",
    })

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        self.output_dir = os.path.expanduser(self.output_dir)  # `~` from a quoted argument, as a shell would


def convert(config: ConvertLoraConfig) -> None:
    """`gors convert-lora IN OUT`: convert, and say how to use the result; bad input exits with its reason."""
    out = Path(config.output_dir).expanduser()
    if out.exists() and not out.is_dir():  # before a download of the official checkpoint
        raise SystemExit(f"error: OUT {config.output_dir!r} is a file, not a folder; pass a folder to write the LoRA into")
    try:
        path = convert_official_lora(config.source, config.output_dir, config.pretrained_model_name_or_path)
    except (LoraConversionError, OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from err
    print(f"Wrote {path}; use it with --lora {config.output_dir}")


def main(argv: Sequence[str] | None = None) -> None:
    """`gors convert-lora IN OUT [--pretrained_model_name_or_path M]`."""
    convert(parse_config(ConvertLoraConfig, argv, prog="gors convert-lora"))
