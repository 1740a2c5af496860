"""Training per model family: how each backbone encodes prompts, what its denoiser learns, where LoRA goes.

| family | denoiser (LoRA targets) | text encoders (LoRA) | loss |
|---|---|---|---|
| sd | U-Net: to_q, to_k, to_v, to_out.0 | CLIP (q, k, v, out_proj; on by default) | DDPM, epsilon or v |
| sdxl | U-Net: same | CLIP-L and bigG (each switchable; on by default) | DDPM, epsilon, size conditions |
| sd3 | MMDiT: attention projections of both streams | CLIP-L and bigG (off by default); T5 frozen | flow matching |
| flux | FLUX transformer: same | none (CLIP-L and T5 frozen) | flow matching, guidance input |

`resolve_training` picks the class from the family `gors.core.backbones` recognised in the
checkpoint's `model_index.json`.
"""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from typing import Any, TypeVar

from gors.core.backbones import Backbone, check_resolution
from gors.families.base import BasePrediction, Batch, TextEncoder, TrainingDefaults, TrainingFamily
from gors.families.flux import FluxFamily
from gors.families.sd import StableDiffusionFamily
from gors.families.sd3 import StableDiffusion3Family
from gors.families.sdxl import StableDiffusionXLFamily

TRAINING_FAMILIES: dict[str, type[TrainingFamily]] = {
    "sd": StableDiffusionFamily,
    "sdxl": StableDiffusionXLFamily,
    "sd3": StableDiffusion3Family,
    "flux": FluxFamily,
}


C = TypeVar("C")


logger = logging.getLogger(__name__)

# The timestep densities' parameters, by the --weighting_scheme that draws with them.
DENSITY_OPTIONS = {"logit_mean": "logit_normal", "logit_std": "logit_normal", "mode_scale": "mode"}


def check_density_options(config: Any, scheme: str | None, label: str) -> None:
    """Warn of a density parameter changed from its default where the resolved `scheme` (None: a DDPM family)
    draws no timestep with it: it is taken and does nothing. A warning, not a refusal: runs made before it
    record the value (round settings, checkpoints), and their rerun with the same flags must go on."""
    defaults = {spec.name: spec.default for spec in fields(config) if spec.name in DENSITY_OPTIONS}
    unused = [f"--{name}" for name, used_by in DENSITY_OPTIONS.items()
              if getattr(config, name) != defaults[name] and scheme != used_by]
    if not unused:
        return
    them = "it" if len(unused) == 1 else "them"
    if scheme is None:
        advice = f"{label} trains with the DDPM loss, which takes no timestep density; they apply to SD3 and FLUX.1"
    else:
        advice = (f"{label} draws its timesteps with --weighting_scheme {scheme}, which takes no such parameter; "
                  f"pass the scheme that uses {them} (logit_normal: --logit_mean, --logit_std; mode: --mode_scale)")
    logger.warning("%s: %s. Drop %s: %s does nothing here.", ", ".join(unused), advice, them, them)


def sampled_t5_length(cls: type[TrainingFamily], backbone: Backbone) -> int | None:
    """The T5 tokens gors samples `backbone` with (generation, evaluation, validation): what training takes."""
    return backbone.call_kwargs.get("max_sequence_length", cls.defaults.max_sequence_length)


def refuse_untrainable(config: Any, cls: type[TrainingFamily], backbone: Backbone, sampled_resolution: int | None,
                       label: str) -> None:
    """Refuse the settings `cls` cannot train (see `resolve_training`), naming the flag and what to pass."""
    clip = cls.lora_text_encoders()
    if not clip and (config.train_text_encoder or config.train_text_encoder_2):
        given = "--train_text_encoder" if config.train_text_encoder else "--train_text_encoder_2"
        raise ValueError(f"{given}: gors trains only the transformer of {label}; its text encoders "
                         "stay frozen (and cached). Leave the flag unset.")
    if config.train_text_encoder_2 and len(clip) < 2:
        raise ValueError(f"--train_text_encoder_2: {label} has no second CLIP text encoder; use --train_text_encoder.")
    flow = cls.trains_a_flow()
    if config.weighting_scheme is not None and not flow:
        raise ValueError(f"--weighting_scheme={config.weighting_scheme}: {label} trains with the DDPM loss; the "
                         "flow-matching options apply to SD3 and FLUX.1.")
    for flag in ("timestep_range", "anchor_below"):
        if getattr(config, flag) is not None and flow:
            raise ValueError(f"--{flag}: {label} trains a rectified flow, whose timesteps come from "
                             f"--weighting_scheme; --{flag} applies to the DDPM families (SD 1/2, SDXL).")
    if config.max_sequence_length is not None and not cls.has_t5():
        raise ValueError(f"--max_sequence_length: {label} has no T5 encoder; its CLIP encoders take 77 tokens.")
    sampled_length = sampled_t5_length(cls, backbone)
    if cls.has_t5() and config.max_sequence_length not in (None, sampled_length):
        raise ValueError(f"--max_sequence_length={config.max_sequence_length}: gors samples {label} with the "
                         f"{sampled_length} T5 tokens (generation, evaluation, validation); training "
                         "on another length would train a conditioning no sampler uses. Leave the flag unset.")
    if None not in (config.resolution, sampled_resolution) and config.resolution != sampled_resolution:
        raise ValueError(f"--resolution={config.resolution}: the samples were generated at {sampled_resolution} px "
                         "(samples/settings.json); training at another side would resize every image. Leave "
                         f"--resolution unset (or pass {sampled_resolution}), or generate again at "
                         f"{config.resolution} in a new --output_dir.")


def resolve_training(config: C, backbone: Backbone, sampled_guidance: float | None = None,
                     sampled_resolution: int | None = None) -> tuple[C, TrainingFamily]:
    """`config` with every family-dependent default filled in, and the family that trains it.

    `sampled_guidance`: the guidance scale the selected samples were generated with (FLUX.1 [dev]
    takes it as an input, as its pipeline passes it); None for the family's default.
    `sampled_resolution`: the image side (pixels) they were generated at, the default of
    `--resolution`; None for the family's default.

    Settings the family cannot take are refused here, before any weights load: a checkpoint of the
    family that gors cannot train (an EDM SDXL), a text-encoder LoRA on a family without a trainable
    one (FLUX.1), a second encoder on a family with one, flow-matching options on a DDPM family and
    DDPM timestep options on a flow, a T5 length without T5 or other than the one gors samples with,
    a resolution off the family's grid or other than the samples'.
    """
    cls = TRAINING_FAMILIES[backbone.name]
    cls.check_checkpoint(config.pretrained_model_name_or_path, config.revision)
    label = f"a {backbone.pipeline_class} ({backbone.name} family)"
    refuse_untrainable(config, cls, backbone, sampled_resolution, label)

    clip = cls.lora_text_encoders()
    first = cls.defaults.train_text_encoder if config.train_text_encoder is None else config.train_text_encoder
    second = (first if config.train_text_encoder_2 is None else config.train_text_encoder_2) and len(clip) > 1
    if not (config.train_unet or first or second):
        raise ValueError(f"--no_train_unet leaves nothing to train on {label}: train its "
                         f"{'text encoders' if clip else 'transformer'}.")
    scheme = (config.weighting_scheme or cls.defaults.weighting_scheme) if cls.trains_a_flow() else None
    check_density_options(config, scheme, label)
    resolution = sampled_resolution if config.resolution is None else config.resolution
    sampling = backbone.sampling.resolve(None, sampled_guidance, resolution)
    resolved = replace(
        config,
        resolution=check_resolution(backbone, sampling[2]),
        train_text_encoder=bool(first and clip),
        train_text_encoder_2=bool(second),
        weighting_scheme=scheme,
        max_sequence_length=(config.max_sequence_length or sampled_t5_length(cls, backbone)) if cls.has_t5() else None,
    )
    settings = {name: getattr(resolved, name) for name in (
        "resolution", "train_text_encoder_2", "weighting_scheme", "logit_mean", "logit_std", "mode_scale",
        "max_sequence_length", "timestep_range", "anchor_below", "caption_dropout")} | {"guidance_scale": sampling[1]}
    return resolved, cls(backbone, resolved.pretrained_model_name_or_path, resolved.revision, settings)


__all__ = ["TRAINING_FAMILIES", "BasePrediction", "Batch", "TextEncoder", "TrainingDefaults", "TrainingFamily",
           "resolve_training"]
