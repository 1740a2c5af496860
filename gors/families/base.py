"""What a trainer needs to know about a model family, and the two losses the families share.

A `TrainingFamily` loads a checkpoint's trainable parts (`components`), says which of them carry
LoRA adapters and with which targets, encodes prompts one text encoder at a time (so a frozen
encoder's output can be cached while another one trains), turns cached VAE latents into the
denoiser's input space, and computes one micro-batch's reward-weighted loss. The trainer
(`gors.train`) does the rest the same way for every family.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch

from gors.core.backbones import Backbone, read_model_index
from gors.core.hub import from_pretrained
from gors.core.transfer import to_device
from gors.loss import (
    diffusion_target,
    flow_matching_noisy,
    flow_matching_sigmas,
    flow_matching_weighting,
    reward_weighted_loss,
    timestep_density,
)

if TYPE_CHECKING:
    from diffusers import SchedulerMixin
    from transformers import PreTrainedTokenizerBase

# One text encoder's outputs, by name ("hidden", "pooled", ...), one row per prompt.
Encoding = dict[str, torch.Tensor]


@dataclass(frozen=True)
class TextEncoder:
    """A text encoder of the family's pipeline.

    Attributes:
        component: its name in the pipeline ("text_encoder", "text_encoder_2", ...).
        tokenizer: the name of its tokenizer.
        lora: whether gors can train a LoRA on it (the CLIP encoders; T5 stays frozen, as in
            diffusers' scripts).
        t5: whether it is the T5 encoder, whose sequence length is `--max_sequence_length`.
    """

    component: str
    tokenizer: str
    lora: bool = True
    t5: bool = False


@dataclass(frozen=True)
class TrainingDefaults:
    """A family's training defaults, used where the flag is left unset.

    `train_text_encoder` is on for the U-Net families, as GORS trains its CLIP encoder, and off
    for SD3/FLUX.1, as diffusers' scripts for them. Learning rates and rank need no per-family
    default: GORS's (1e-4, 5e-6, rank 4) are diffusers' LoRA scripts' for every family.
    """

    train_text_encoder: bool
    weighting_scheme: str | None = None  # flow-matching families only
    max_sequence_length: int | None = None  # families with T5 only: the pipeline's default


@dataclass
class Batch:
    """One micro-batch: cached latents (already in the denoiser's scale), rewards and per-sample conditions."""

    latents: torch.Tensor
    rewards: torch.Tensor
    original_size: torch.Tensor  # (B, 2) height, width of the stored image
    crop_top_left: torch.Tensor  # (B, 2)

    def rows(self, index: torch.Tensor) -> Batch:
        return Batch(self.latents[index], self.rewards[index], self.original_size[index], self.crop_top_left[index])


# (noisy latents, timesteps, row indices in the micro-batch on the host, the same on the device) of some rows
# -> the base model's prediction. Both copies of the indices: the host's index host tensors without a transfer.
BasePrediction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TrainingFamily:
    """Base of the trainable families; subclasses set the class attributes and the three encoding hooks."""

    denoiser: ClassVar[str] = "unet"
    denoiser_lora_targets: ClassVar[tuple[str, ...]]
    text_encoders: ClassVar[tuple[TextEncoder, ...]]
    text_encoder_lora_targets: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj", "out_proj")
    defaults: ClassVar[TrainingDefaults]
    # Denoisers whose scheduler is not a DDPM one name the scheduler class they train with.
    training_scheduler: ClassVar[str] = "DDPMScheduler"
    # Whether LoRA files keep peft's weight names, as diffusers' scripts for the family save them.
    peft_lora_names: ClassVar[bool] = False
    # The text encoders some of whose adapters never get a gradient (a layer after the one the family reads).
    encoders_without_gradient: ClassVar[tuple[str, ...]] = ()

    def __init__(self, backbone: Backbone, pretrained_model_name_or_path: str, revision: str | None,
                 settings: dict[str, Any]) -> None:
        """`settings`: the resolved training options the family reads (resolution, guidance, weighting ...)."""
        self.backbone = backbone
        self.name_or_path = pretrained_model_name_or_path
        self.revision = revision
        self.settings = settings

    @classmethod
    def check_checkpoint(cls, pretrained_model_name_or_path: str, revision: str | None) -> None:
        """Refuse, from its configs (no weights), a checkpoint of the family that this training does not fit:
        here, one without a text encoder the family conditions on (an SD3 saved without T5, whose pipeline
        samples without it), which loading would meet as a component of class None."""
        index = read_model_index(pretrained_model_name_or_path, revision)
        missing = [encoder for encoder in cls.text_encoders
                   if any((index.get(name) or [None])[0] is None for name in (encoder.component, encoder.tokenizer))]
        if missing:
            names = ", ".join(e.component + (" (T5)" if e.t5 else "") for e in missing)
            raise ValueError(
                f"--pretrained_model_name_or_path={pretrained_model_name_or_path!r}: its model_index.json has no "
                f"{names}, which training conditions on, as diffusers' LoRA scripts do. "
                "`gors generate` and `gors evaluate` sample it as its pipeline does; to train, use the checkpoint "
                "with all its text encoders.")

    @classmethod
    def lora_text_encoders(cls) -> list[TextEncoder]:
        """The text encoders that can carry a LoRA (the CLIP ones), in the pipeline's order."""
        return [encoder for encoder in cls.text_encoders if encoder.lora]

    @classmethod
    def trains_a_flow(cls) -> bool:
        """Whether the denoiser learns a rectified flow (SD3, FLUX.1) rather than DDPM noise."""
        return cls.training_scheduler != "DDPMScheduler"

    @classmethod
    def has_t5(cls) -> bool:
        return any(encoder.t5 for encoder in cls.text_encoders)

    # ----- loading ----------------------------------------------------------------------------
    def load(self, component: str, dtype: torch.dtype = torch.float32) -> Any:
        """One component of the checkpoint, by the class its `model_index.json` names (as diffusers loads it)."""
        library, class_name = read_model_index(self.name_or_path, self.revision)[component]
        cls = getattr(importlib.import_module(library), class_name)
        kwargs = {} if component.startswith(("tokenizer", "scheduler")) else {"dtype": dtype}
        return from_pretrained(cls.from_pretrained, self.name_or_path, "--pretrained_model_name_or_path",
                               subfolder=component, revision=self.revision, **kwargs)

    def load_scheduler(self) -> SchedulerMixin:
        """The noise schedule that training samples from: the checkpoint's scheduler config, read by the
        family's training scheduler class (as diffusers' scripts read it)."""
        import diffusers

        cls = getattr(diffusers, self.training_scheduler)
        return from_pretrained(cls.from_pretrained, self.name_or_path, "--pretrained_model_name_or_path",
                               subfolder="scheduler", revision=self.revision)

    # ----- prompts ----------------------------------------------------------------------------
    def max_length(self, encoder: TextEncoder, tokenizer: PreTrainedTokenizerBase) -> int:
        """The token length prompts are padded and cut to: T5's `max_sequence_length`, else the tokenizer's."""
        return self.settings["max_sequence_length"] if encoder.t5 else tokenizer.model_max_length

    def tokenize(self, encoder: TextEncoder, tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> torch.Tensor:
        """Token ids (N, L), padded to the length the pipeline pads to."""
        return tokenizer(prompts, padding="max_length", max_length=self.max_length(encoder, tokenizer),
                         truncation=True, return_tensors="pt").input_ids

    def encode(self, encoder: TextEncoder, model: torch.nn.Module, input_ids: torch.Tensor) -> Encoding:
        """One encoder's outputs for these ids, as the family's pipeline computes them."""
        raise NotImplementedError

    def condition(self, encodings: dict[str, Encoding], batch: Batch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The denoiser's conditioning, from every encoder's outputs (by component), in the compute dtype."""
        raise NotImplementedError

    def drop_captions(self, conditioning: dict[str, torch.Tensor], dropped: torch.Tensor) -> dict[str, torch.Tensor]:
        """The conditioning with caption dropout's rows (`dropped`, a boolean row mask) as the pipeline's
        unconditional branch has them. By default they already are: the encoding of "" (their prompt)."""
        return conditioning

    # ----- latents and loss -------------------------------------------------------------------
    def scale_latents(self, latents: torch.Tensor, vae_config: Any) -> torch.Tensor:
        """VAE latents in the denoiser's space: `(z - shift) * scale`."""
        shift = getattr(vae_config, "shift_factor", None) or 0.0
        return (latents - shift) * vae_config.scaling_factor if shift else latents * vae_config.scaling_factor

    def sample_noise(self, latents: torch.Tensor, scheduler: SchedulerMixin) -> tuple[torch.Tensor, torch.Tensor]:
        """(noise, position) of one micro-batch, drawn in this order before anything else random:
        the position is a timestep (DDPM) or a place u in [0, 1] of the schedule (flow matching)."""
        raise NotImplementedError

    def loss(self, denoiser: torch.nn.Module, scheduler: SchedulerMixin, batch: Batch, conditioning: dict[str, torch.Tensor],
             noise: torch.Tensor, position: torch.Tensor, dtype: torch.dtype,
             base_prediction: BasePrediction | None = None) -> torch.Tensor:
        """The reward-weighted loss of one micro-batch (a scalar, float32). `base_prediction`: the base
        model's output for some rows (`--anchor_below`, DDPM families)."""
        raise NotImplementedError

    def predict(self, denoiser: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        """The denoiser's output for noisy latents (in the compute dtype) at these timesteps."""
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint of this family is bound to beyond the shared settings: the LoRA targets
        (and, with a second CLIP encoder, whether it trains)."""
        fingerprint = {f"{self.denoiser}_target_modules": list(self.denoiser_lora_targets),
                       "text_encoder_target_modules": list(self.text_encoder_lora_targets)}
        if len(self.lora_text_encoders()) > 1:
            fingerprint["train_text_encoder_2"] = self.settings["train_text_encoder_2"]
        return fingerprint

    def trained_text_encoders(self, train_text_encoder: bool) -> list[TextEncoder]:
        """The encoders that carry a LoRA: the first CLIP with `train_text_encoder`, the second with
        `--train_text_encoder_2`."""
        clip = self.lora_text_encoders()
        return clip[:1] * train_text_encoder + clip[1:2] * bool(self.settings["train_text_encoder_2"])


class DDPMFamily(TrainingFamily):
    """U-Net families trained on the DDPM forward process: uniform integer timesteps, epsilon or v target."""

    def load_scheduler(self) -> SchedulerMixin:
        """The schedule, after checking that `--timestep_range` lies in it (before any weights load)."""
        scheduler = super().load_scheduler()
        num_timesteps = scheduler.config.num_train_timesteps
        if self.settings["timestep_range"] is not None and self.settings["timestep_range"][1] > num_timesteps:
            begin, end = self.settings["timestep_range"]
            raise ValueError(f"--timestep_range {begin} {end}: the model's noise schedule has {num_timesteps} "
                             f"timesteps; give an END <= {num_timesteps}")
        return scheduler

    def sample_noise(self, latents: torch.Tensor, scheduler: SchedulerMixin) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn_like(latents)
        begin, end = self.settings["timestep_range"] or (0, scheduler.config.num_train_timesteps)
        timesteps = torch.randint(begin, end, (len(latents),), device=latents.device)
        return noise, timesteps

    def fingerprint(self) -> dict[str, Any]:
        # Only when set, so that checkpoints made before the options still resume.
        options = {k: self.settings[k] for k in ("timestep_range", "anchor_below") if self.settings[k] is not None}
        return super().fingerprint() | options

    def loss(self, denoiser: torch.nn.Module, scheduler: SchedulerMixin, batch: Batch, conditioning: dict[str, torch.Tensor],
             noise: torch.Tensor, position: torch.Tensor, dtype: torch.dtype,
             base_prediction: BasePrediction | None = None) -> torch.Tensor:
        noisy = scheduler.add_noise(batch.latents, noise, position)
        target = diffusion_target(scheduler, batch.latents, noise, position)
        if self.settings["anchor_below"] is not None:
            # Before the trained forward: the base pass switches the adapters off and on again. Which rows it
            # takes is read from the device once (the batch's shapes depend on it); the rest indexes with them.
            rows = (position < self.settings["anchor_below"]).cpu().nonzero().flatten()
            if len(rows):
                at = to_device(rows, noisy.device)
                target = target.clone()
                target[at] = base_prediction(noisy[at].to(dtype), position[at], rows, at).to(target.dtype)
        prediction = self.predict(denoiser, noisy.to(dtype), position, conditioning)
        return reward_weighted_loss(prediction, target, batch.rewards)


class FlowMatchingFamily(TrainingFamily):
    """Rectified-flow transformers: sigmas from a timestep density, target `noise - x0`, optional weighting."""

    denoiser = "transformer"
    training_scheduler = "FlowMatchEulerDiscreteScheduler"
    peft_lora_names = True
    # The attention projections of the joint (MMDiT) blocks, image and text streams, as in diffusers'
    # SD3 script; in FLUX's single-stream blocks only q, k and v match (their attention has no
    # output projection: the block's proj_out follows, untrained).
    denoiser_lora_targets = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                             "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")

    def sample_noise(self, latents: torch.Tensor, scheduler: SchedulerMixin) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn_like(latents)
        s = self.settings
        u = timestep_density(s["weighting_scheme"], len(latents), s["logit_mean"], s["logit_std"], s["mode_scale"])
        return noise, u

    def loss(self, denoiser: torch.nn.Module, scheduler: SchedulerMixin, batch: Batch, conditioning: dict[str, torch.Tensor],
             noise: torch.Tensor, position: torch.Tensor, dtype: torch.dtype,
             base_prediction: BasePrediction | None = None) -> torch.Tensor:
        timesteps, sigmas = flow_matching_sigmas(scheduler, position)
        timesteps, sigmas = to_device(timesteps, noise.device), to_device(sigmas, noise.device)
        noisy = flow_matching_noisy(batch.latents, noise, sigmas)
        prediction = self.predict(denoiser, noisy.to(dtype), timesteps, conditioning)
        weighting = flow_matching_weighting(self.settings["weighting_scheme"], sigmas)
        return reward_weighted_loss(prediction, noise - batch.latents, batch.rewards, weighting)

    def fingerprint(self) -> dict[str, Any]:
        s = self.settings
        return super().fingerprint() | {k: s[k] for k in ("weighting_scheme", "logit_mean", "logit_std", "mode_scale",
                                                          "max_sequence_length")}
