"""Stable Diffusion XL: two CLIP text encoders, pooled text and size conditions, the DDPM loss.

As `StableDiffusionXLPipeline` conditions: the penultimate hidden states of CLIP ViT-L and OpenCLIP
bigG concatenated as the cross-attention context; bigG's pooled projection and the six
micro-conditions (original height and width, crop top and left, target height and width) as the
U-Net's added embedding. The original size and crop are each sample's own, from the sample store
and the training crop, as diffusers' SDXL LoRA script computes them.

Only DDPM-type SDXL checkpoints train: one with an EDM scheduler or per-channel latent statistics
(Playground v2.5) is refused, as its noise schedule and latent scale are not the DDPM loss's.
With `force_zeros_for_empty_prompt` (SDXL base), the pipeline's unconditional branch is all-zero
embeddings, not the encoding of "": caption dropout trains on those zeros.
"""

from __future__ import annotations

from typing import Any

import torch

from gors.core.backbones import component_config, read_model_index
from gors.core.transfer import to_device
from gors.families.base import Batch, DDPMFamily, Encoding, TextEncoder, TrainingDefaults
from gors.lora import UNET_TARGET_MODULES


class StableDiffusionXLFamily(DDPMFamily):
    denoiser_lora_targets = UNET_TARGET_MODULES
    text_encoders = (TextEncoder("text_encoder", "tokenizer"), TextEncoder("text_encoder_2", "tokenizer_2"))
    defaults = TrainingDefaults(train_text_encoder=True)
    # CLIP-L's last layer feeds neither its penultimate state nor anything else SDXL reads.
    encoders_without_gradient = ("text_encoder",)

    def __init__(self, backbone, pretrained_model_name_or_path: str, revision: str | None,
                 settings: dict[str, Any]) -> None:
        super().__init__(backbone, pretrained_model_name_or_path, revision, settings)
        # The pipeline's own default when its model_index.json does not say.
        index = read_model_index(pretrained_model_name_or_path, revision)
        self.zeros_for_empty_prompt = bool(index.get("force_zeros_for_empty_prompt", True))

    @classmethod
    def check_checkpoint(cls, pretrained_model_name_or_path: str, revision: str | None) -> None:
        """Refuse an EDM-trained SDXL (Playground v2.5): diffusers' SDXL script switches to EDM training
        and to latents `(z - latents_mean) * scaling_factor / latents_std` for it; gors' DDPM loss would train
        it on the wrong noise schedule and latent scale."""
        super().check_checkpoint(pretrained_model_name_or_path, revision)
        scheduler = (read_model_index(pretrained_model_name_or_path, revision).get("scheduler") or [None, ""])[1]
        vae = component_config(pretrained_model_name_or_path, "vae", revision)
        statistics = [key for key in ("latents_mean", "latents_std") if vae.get(key) is not None]
        found = ([f"its scheduler is {scheduler} (EDM)"] if "EDM" in str(scheduler) else []) + (
            [f"its VAE config has {' and '.join(statistics)}"] if statistics else [])
        if found:
            raise ValueError(
                f"--pretrained_model_name_or_path={pretrained_model_name_or_path!r}: {' and '.join(found)}, as in an "
                "EDM-trained SDXL such as Playground v2.5. gors trains DDPM-type SDXL checkpoints only (DDPM noise, "
                "latents times scaling_factor); training this one would use the wrong noise schedule and latent "
                "scale. `gors generate` and `gors evaluate` work on it; train an SDXL with a DDPM-type scheduler.")

    def fingerprint(self) -> dict[str, Any]:
        # Dropped captions train on zero embeddings since 0.2 (before: the encoding of ""); a checkpoint
        # that dropped captions the other way must not resume into this objective.
        zeros = self.zeros_for_empty_prompt and self.settings["caption_dropout"] > 0
        return super().fingerprint() | ({"dropped_captions": "zero embeddings"} if zeros else {})

    def encode(self, encoder: TextEncoder, model: torch.nn.Module, input_ids: torch.Tensor) -> Encoding:
        output = model(input_ids, output_hidden_states=True)
        encoding = {"hidden": output.hidden_states[-2]}
        if encoder.component == "text_encoder_2":
            encoding["pooled"] = output[0]  # the projected pooled vector (`text_embeds`)
        return encoding

    def condition(self, encodings: dict[str, Encoding], batch: Batch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        side = self.settings["resolution"]
        target = torch.full_like(batch.original_size, side)
        time_ids = torch.cat([batch.original_size, batch.crop_top_left, target], dim=1)
        hidden = torch.cat([encodings["text_encoder"]["hidden"], encodings["text_encoder_2"]["hidden"]], dim=-1)
        return {
            "encoder_hidden_states": hidden.to(dtype),
            "text_embeds": encodings["text_encoder_2"]["pooled"].to(dtype),
            "time_ids": time_ids.to(batch.latents.device, dtype),
        }

    def drop_captions(self, conditioning: dict[str, torch.Tensor], dropped: torch.Tensor) -> dict[str, torch.Tensor]:
        """With `force_zeros_for_empty_prompt`, zero text embeddings (sequence and pooled) on the dropped
        rows, as the pipeline's unconditional branch has them; the size conditions stay."""
        if not self.zeros_for_empty_prompt or not dropped.any():
            return conditioning
        zeroed = {}
        for name in ("encoder_hidden_states", "text_embeds"):
            value = conditioning[name]
            rows = to_device(dropped, value.device).view(-1, *[1] * (value.dim() - 1))
            zeroed[name] = torch.where(rows, torch.zeros_like(value), value)
        return conditioning | zeroed

    def predict(self, denoiser: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        added = {"text_embeds": conditioning["text_embeds"], "time_ids": conditioning["time_ids"]}
        return denoiser(noisy, timesteps, encoder_hidden_states=conditioning["encoder_hidden_states"],
                        added_cond_kwargs=added, return_dict=False)[0]
