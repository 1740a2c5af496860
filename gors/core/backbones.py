"""Model families: which text-to-image backbone a checkpoint is, read from its `model_index.json`.

A family is recognised from the pipeline class the checkpoint names (`_class_name`), never from
its name string. It says how to load the pipeline and how to sample from it by default (the
sampler, steps, guidance and resolution its authors recommend); benchmarks whose official
protocol was written for a family (T2I-CompBench's DDIM 30 steps for Stable Diffusion 1/2) keep
theirs for that family, and every value can be overridden. Training is implemented for the
four families above (`gors.families`); every diffusers text-to-image pipeline generates and evaluates.

| family | pipelines | sampler | steps | guidance | px | source of the defaults |
|---|---|---|---|---|---|---|
| sd | StableDiffusionPipeline | DDIM | 30 | 7.5 | 512 | T2I-CompBench protocol (GORS paper) |
| sdxl | StableDiffusionXLPipeline | the checkpoint's (Euler) | 50 | 5.0 | 1024 | diffusers' pipeline defaults |
| sd3 | StableDiffusion3Pipeline | the checkpoint's (flow-matching Euler) | 28 (3.5 Medium 40) | 3.5 (3.5 Medium 4.5, SD3 Medium 7.0) | 1024 | SD3.5 Large, SD3.5 Medium and SD3 Medium model cards |
| flux | FluxPipeline | the checkpoint's (flow-matching Euler) | 50 (schnell 4) | 3.5 (schnell 0) | 1024 | FLUX.1 [dev] / [schnell] model cards |
| any other | its `_class_name` | the checkpoint's | the pipeline's `__call__` defaults | | from its configs | the pipeline's own |
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gors.core.hub import ModelLoadError, check_model_path, load_hint, one_line, raise_if_gated

MODEL_INDEX = "model_index.json"
MODEL_FLAG = "--pretrained_model_name_or_path"  # the option that names the pipeline in every refusal here


@dataclass(frozen=True)
class SamplingDefaults:
    """A family's recommended sampling: steps, guidance scale, image side in pixels and sampler.

    `scheduler` is the diffusers scheduler class to sample with, or None to keep the checkpoint's own.
    A benchmark's official sampling may leave `resolution` None: the checkpoint's own side, as a
    pipeline called without a size generates (`evaluators.base.Benchmark.protocol`).
    """

    num_inference_steps: int
    guidance_scale: float
    resolution: int | None
    scheduler: str | None = None

    def resolve(self, num_inference_steps: int | None, guidance_scale: float | None,
                resolution: int | None) -> tuple[int, float, int | None]:
        """(steps, guidance, side): each value given, else these defaults."""
        return (self.num_inference_steps if num_inference_steps is None else num_inference_steps,
                self.guidance_scale if guidance_scale is None else guidance_scale,
                self.resolution if resolution is None else resolution)


@dataclass(frozen=True)
class Backbone:
    """One model family (see the module docstring).

    Attributes:
        name: the family's short name ("sd", "sdxl", "sd3", "flux", or "pipeline" for any other).
        pipeline_class: the diffusers pipeline class the checkpoint names.
        sampling: its default sampling.
        trainable: whether `gors train` supports it.
        resolution_multiple: image sides must be multiples of this (VAE factor x patch size).
        pipeline_kwargs: extra `from_pretrained` arguments (Stable Diffusion: no safety checker, which
            would silently turn flagged samples black and so into low-reward samples).
        call_kwargs: extra arguments of every pipeline call.
    """

    name: str
    pipeline_class: str
    sampling: SamplingDefaults
    trainable: bool = False
    resolution_multiple: int = 8
    pipeline_kwargs: dict[str, Any] = field(default_factory=dict)
    call_kwargs: dict[str, Any] = field(default_factory=dict)


_NO_SAFETY_CHECKER = {"safety_checker": None, "requires_safety_checker": False}
FAMILIES: dict[str, Backbone] = {
    "StableDiffusionPipeline": Backbone(
        "sd", "StableDiffusionPipeline", SamplingDefaults(30, 7.5, 512, "DDIMScheduler"), trainable=True,
        pipeline_kwargs=_NO_SAFETY_CHECKER,
    ),
    "StableDiffusionXLPipeline": Backbone("sdxl", "StableDiffusionXLPipeline", SamplingDefaults(50, 5.0, 1024),
                                          trainable=True),
    "StableDiffusion3Pipeline": Backbone(
        "sd3", "StableDiffusion3Pipeline", SamplingDefaults(28, 3.5, 1024), trainable=True, resolution_multiple=16
    ),
    "FluxPipeline": Backbone("flux", "FluxPipeline", SamplingDefaults(50, 3.5, 1024), trainable=True,
                             resolution_multiple=16),
}
FLUX_SCHNELL_SAMPLING = SamplingDefaults(4, 0.0, 1024)
# Stable Diffusion 3.5 Medium (an MMDiT-X: its transformer config lists `dual_attention_layers`), as
# its model card samples it; SD3.5 Large takes the family's 28 steps at 3.5. (SD3.5 Large Turbo's
# config is Large's: it cannot be told apart, so pass its 4 steps and guidance 0.)
SD35_MEDIUM_SAMPLING = SamplingDefaults(40, 4.5, 1024)
# Stable Diffusion 3 Medium, the one SD3 without RMS-normed queries and keys (no `qk_norm` in its
# transformer config; every SD3.5 has "rms_norm"), as its model card and diffusers' docs sample it.
SD3_MEDIUM_SAMPLING = SamplingDefaults(28, 7.0, 1024)
# FLUX.1 [schnell] reads 256 T5 tokens (Black Forest Labs' reference and diffusers' docs; the
# pipeline's default, 512, is [dev]'s).
FLUX_SCHNELL_T5_TOKENS = 256
# Families whose T5 encoder and transformer activations leave fp16's range (diffusers runs them in bf16).
BF16_FAMILIES = ("sd3", "flux")


def half_precision_warning(backbone: Backbone, dtype: Any) -> str | None:
    """A warning for fp16 on a family that wants bf16, else None (`dtype`: a torch dtype)."""
    if backbone.name in BF16_FAMILIES and str(dtype) == "torch.float16":
        return (f"fp16 on a {backbone.pipeline_class}: its T5 encoder and transformer activations can overflow fp16 "
                "(washed-out or black samples, NaN losses); pass --mixed_precision bf16")
    return None


def family_precision(backbone: Backbone, mixed_precision: str | None) -> str | None:
    """The `--mixed_precision` to run `backbone` in: `mixed_precision` when given; without it the
    accelerate config's (None), except that a family that wants bf16 (SD3/3.5, FLUX.1) takes "bf16"
    where the config says fp16 (the shipped GPU configs do, for Stable Diffusion 2): fp16 gives such a
    model black samples and NaN losses. Only an explicit `--mixed_precision fp16` runs it in fp16."""
    configured = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()  # what `accelerate launch` sets
    if mixed_precision is None and configured == "fp16" and backbone.name in BF16_FAMILIES:
        _say_bf16(backbone.pipeline_class)
        return "bf16"
    return mixed_precision


@functools.cache
def _say_bf16(pipeline_class: str) -> None:
    """`family_precision`'s note, once per process and from the first process of a launch only."""
    if os.environ.get("RANK", "0") == "0":
        print(f"[gors] {pipeline_class} runs in bf16, not the accelerate config's fp16, whose range its activations "
              "leave; pass --mixed_precision fp16 to run it in fp16 anyway", flush=True)
TRAINABLE = tuple(family.name for family in FAMILIES.values() if family.trainable)


def read_model_index(pretrained_model_name_or_path: str, revision: str | None = None) -> dict[str, Any]:
    """The checkpoint's `model_index.json` (a local folder's, or downloaded alone from the Hub)."""
    name = check_model_path(pretrained_model_name_or_path, MODEL_FLAG)
    if os.path.isdir(name):
        path = Path(name) / MODEL_INDEX
        if not path.is_file():
            raise FileNotFoundError(
                f"{MODEL_FLAG}={pretrained_model_name_or_path!r} has no {MODEL_INDEX}: it is not a diffusers pipeline "
                f"folder. Pass a folder written by `pipeline.save_pretrained` or a Hub id of a diffusers pipeline."
            )
        return json.loads(path.read_text())
    from diffusers import DiffusionPipeline

    try:
        return dict(DiffusionPipeline.load_config(name, revision=revision))
    except (OSError, ValueError) as err:
        raise_if_gated(err, pretrained_model_name_or_path, MODEL_FLAG)
        raise ModelLoadError(
            f"{MODEL_FLAG}={pretrained_model_name_or_path!r}: could not read its {MODEL_INDEX} ({one_line(err)}). "
            f"{load_hint(name, err)}"
        ) from err


def component_config(name: str, subfolder: str, revision: str | None) -> dict[str, Any]:
    """The `config.json` of one component of a pipeline folder or Hub id (no weights are read)."""
    from diffusers.configuration_utils import ConfigMixin

    class _Config(ConfigMixin):
        config_name = "config.json"

    try:
        return dict(_Config.load_config(name, subfolder=subfolder, revision=revision))
    except (OSError, ValueError) as err:  # diffusers calls a gated repo "not a valid model identifier"
        raise_if_gated(err, name, MODEL_FLAG)
        raise


def _generic(class_name: str, name: str, revision: str | None) -> Backbone:
    """Any other pipeline: its own scheduler, its `__call__` defaults, a side from its configs."""
    import diffusers

    pipeline_cls = getattr(diffusers, class_name, None)
    if pipeline_cls is None:
        raise ValueError(f"{MODEL_INDEX} names {class_name!r}, which this diffusers ({diffusers.__version__}) "
                         "does not have; upgrade diffusers or pass another checkpoint.")
    parameters = inspect.signature(pipeline_cls.__call__).parameters
    steps = parameters["num_inference_steps"].default if "num_inference_steps" in parameters else 30
    guidance = parameters["guidance_scale"].default if "guidance_scale" in parameters else 1.0
    denoiser = "transformer" if _has(name, "transformer", revision) else "unet"
    side = native_side(name, denoiser, revision)
    # Resolution binning (PixArt, Sana) renders a nearby trained size and resizes the result; a benchmark's
    # side is generated as it is instead (at the trained sizes, such as 1024, binning changes nothing).
    call_kwargs = {"use_resolution_binning": False} if "use_resolution_binning" in parameters else {}
    # A safety checker blackens flagged images, which would pass for low-reward samples (as for Stable Diffusion).
    takes = inspect.signature(pipeline_cls.__init__).parameters
    pipeline_kwargs = {key: value for key, value in _NO_SAFETY_CHECKER.items() if key in takes}
    return Backbone("pipeline", class_name, SamplingDefaults(int(steps), float(guidance), int(side)),
                    call_kwargs=call_kwargs, pipeline_kwargs=pipeline_kwargs)


def native_side(name: str, denoiser: str, revision: str | None) -> int:
    """The image side in pixels the checkpoint was trained at: its denoiser's `sample_size` (latent
    pixels) times the VAE's downsampling, 2^(levels - 1) (`block_out_channels`, or a DC-AE's
    `encoder_block_out_channels`: Sana's 32)."""
    sample_size = component_config(name, denoiser, revision).get("sample_size", 64)
    vae = component_config(name, "vae", revision)
    levels = len(vae.get("block_out_channels") or vae.get("encoder_block_out_channels") or [0] * 4)
    return (sample_size[0] if isinstance(sample_size, (list, tuple)) else sample_size) * 2 ** (levels - 1)


def flux_guidance_embeds(name: str, revision: str | None) -> bool:
    """Whether a FLUX transformer takes the guidance scale as an input (guidance-distilled [dev]); a config
    without `guidance_embeds` has none, as diffusers' `FluxTransformer2DModel` defaults to False ([schnell])."""
    return bool(component_config(name, "transformer", revision).get("guidance_embeds", False))


def _has(name: str, subfolder: str, revision: str | None) -> bool:
    try:
        component_config(name, subfolder, revision)
    except (OSError, ValueError):
        return False
    return True


def detect_backbone(pretrained_model_name_or_path: str, revision: str | None = None) -> Backbone:
    """The family of a checkpoint, from the pipeline class its `model_index.json` names (no weights are read)."""
    index = read_model_index(pretrained_model_name_or_path, revision)
    class_name = index.get("_class_name")
    if not isinstance(class_name, str):
        raise ValueError(f"{MODEL_FLAG}={pretrained_model_name_or_path!r}: its {MODEL_INDEX} names no pipeline class "
                         "(`_class_name`); it is not a diffusers pipeline.")
    name = check_model_path(pretrained_model_name_or_path, MODEL_FLAG)
    if class_name not in FAMILIES:
        return _generic(class_name, name, revision)
    backbone = FAMILIES[class_name]
    if backbone.name == "sd":  # SD 1.x and SD-2-base: 512; SD 2.x 768-v: 768
        backbone = replace(backbone, sampling=replace(backbone.sampling, resolution=native_side(name, "unet", revision)))
    if backbone.name == "sd3":
        transformer = component_config(name, "transformer", revision)
        if transformer.get("dual_attention_layers"):
            backbone = replace(backbone, sampling=SD35_MEDIUM_SAMPLING)
        elif not transformer.get("qk_norm"):
            backbone = replace(backbone, sampling=SD3_MEDIUM_SAMPLING)
    if backbone.name == "flux" and not flux_guidance_embeds(name, revision):
        # schnell: distilled to 4 steps without guidance, on 256 T5 tokens
        backbone = replace(backbone, sampling=FLUX_SCHNELL_SAMPLING,
                           call_kwargs={"max_sequence_length": FLUX_SCHNELL_T5_TOKENS})
    return backbone


def check_resolution(backbone: Backbone, resolution: int, flag: str = "--resolution") -> int:
    """`resolution` if the family can take it (a multiple of its VAE factor x patch size), else a clear error
    naming `flag`."""
    if resolution % backbone.resolution_multiple:
        raise ValueError(
            f"{flag}={resolution}: a {backbone.pipeline_class} needs a multiple of {backbone.resolution_multiple} "
            f"(e.g. {resolution - resolution % backbone.resolution_multiple or backbone.resolution_multiple})."
        )
    return resolution


# Components a diffusers-format LoRA names its weights by ("unet.down_blocks...", "transformer.x...").
LORA_COMPONENTS = ("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3")
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def check_lora_loader(backbone: Backbone, lora: str, shown: str | None = None) -> None:
    """Refuse, before any weights load, a LoRA for a pipeline class that diffusers loads none into
    (e.g. PixArt-Sigma's, which gors evaluates but does not train). `shown`: `--lora` as typed where `lora` is
    what it resolved to (`official:<category>`, `hub:<org>/<name>`)."""
    import diffusers

    if not hasattr(getattr(diffusers, backbone.pipeline_class), "load_lora_weights"):
        raise ValueError(f"--lora={(shown or lora)!r}: a {backbone.pipeline_class} has no LoRA loader in diffusers "
                         f"{diffusers.__version__}; evaluate it without --lora")


def check_lora_fits(pretrained_model_name_or_path: str, lora: str, revision: str | None = None,
                    shown: str | None = None) -> None:
    """Refuse, before any weights load, a local diffusers-format LoRA made for another model family:
    one whose weights name components (`unet`, `transformer`, ...) the pipeline does not have (`shown`: as
    `check_lora_loader`'s).

    Other formats (kohya) are left to diffusers' `load_lora_weights`, which converts them.
    """
    path = Path(lora).expanduser()
    file = path / LORA_WEIGHT_NAME if path.is_dir() else path
    if not file.is_file() or file.suffix != ".safetensors":  # a torch pickle: diffusers reads it
        return
    from safetensors import safe_open

    with safe_open(str(file), "pt") as handle:
        keys = list(handle.keys())
    # diffusers' own test of a LoRA file (every format it converts names its weights so), which it fails late with
    # "Invalid LoRA checkpoint", once the pipeline is loaded.
    if not any("lora" in key for key in keys):
        raise ValueError(f"--lora={(shown or lora)!r} holds no LoRA weights (none of the {len(keys)} tensors of "
                         f"{file.name}, e.g. {keys[0] if keys else 'none'!r}, is named as LoRA weights are): a model's "
                         "own weights? Give a LoRA file, or the run folder whose training wrote one")
    named = {key.split(".", 1)[0] for key in keys} & set(LORA_COMPONENTS)
    index = read_model_index(pretrained_model_name_or_path, revision)
    present = {name for name, value in index.items() if isinstance(value, list) and value and value[0] is not None}
    foreign = sorted(named - present)
    if foreign:
        raise ValueError(
            f"--lora={(shown or lora)!r} has weights for {', '.join(sorted(named))}, but the {index.get('_class_name')} at "
            f"{pretrained_model_name_or_path!r} has no {', '.join(foreign)}: the LoRA was trained on another model "
            "family. Pass the base model it was trained on."
        )


def check_trainable(backbone: Backbone, flag_value: str) -> None:
    """Refuse, before any weights load, a family `gors train` does not support."""
    if not backbone.trainable:
        raise ValueError(
            f"{MODEL_FLAG}={flag_value!r} is a {backbone.pipeline_class} ({backbone.name} family); "
            f"gors trains the {', '.join(TRAINABLE)} families "
            f"({', '.join(f.pipeline_class for f in FAMILIES.values() if f.trainable)}). "
            "It generates and evaluates any diffusers pipeline: `gors generate` and `gors evaluate` work on it."
        )
