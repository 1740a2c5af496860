"""Stable Diffusion 1.x/2.x: one CLIP text encoder, a U-Net, the DDPM loss (GORS as published)."""

from __future__ import annotations

import torch

from gors.families.base import Batch, DDPMFamily, Encoding, TextEncoder, TrainingDefaults
from gors.lora import UNET_TARGET_MODULES


class StableDiffusionFamily(DDPMFamily):
    """The official GORS set-up: LoRA on every U-Net attention projection and the CLIP encoder's."""

    denoiser_lora_targets = UNET_TARGET_MODULES
    text_encoders = (TextEncoder("text_encoder", "tokenizer"),)
    defaults = TrainingDefaults(train_text_encoder=True)

    def encode(self, encoder: TextEncoder, model: torch.nn.Module, input_ids: torch.Tensor) -> Encoding:
        return {"hidden": model(input_ids, return_dict=False)[0]}  # the last hidden state, as the pipeline

    def condition(self, encodings: dict[str, Encoding], batch: Batch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {"encoder_hidden_states": encodings["text_encoder"]["hidden"].to(dtype)}

    def predict(self, denoiser: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        return denoiser(noisy, timesteps, conditioning["encoder_hidden_states"], return_dict=False)[0]
