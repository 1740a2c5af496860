"""Stable Diffusion XL: two CLIP text encoders, pooled text and size conditions, the DDPM loss.

As `StableDiffusionXLPipeline` conditions: the penultimate hidden states of CLIP ViT-L and OpenCLIP
bigG concatenated as the cross-attention context; bigG's pooled projection and the six
micro-conditions (original height and width, crop top and left, target height and width) as the
U-Net's added embedding. The original size and crop are each sample's own, from the sample store
and the training crop, as diffusers' SDXL LoRA script computes them.
"""

from __future__ import annotations

import torch

from gors.families.base import Batch, DDPMFamily, Encoding, TextEncoder, TrainingDefaults
from gors.lora import UNET_TARGET_MODULES


class StableDiffusionXLFamily(DDPMFamily):
    denoiser_lora_targets = UNET_TARGET_MODULES
    text_encoders = (TextEncoder("text_encoder", "tokenizer"), TextEncoder("text_encoder_2", "tokenizer_2"))
    defaults = TrainingDefaults(train_text_encoder=True)
    # CLIP-L's last layer feeds neither its penultimate state nor anything else SDXL reads.
    lora_without_gradient = True

    def encode(self, encoder: TextEncoder, model: torch.nn.Module, input_ids: torch.Tensor) -> Encoding:
        output = model(input_ids, output_hidden_states=True)
        encoding = {"hidden": output.hidden_states[-2]}
        if encoder.component == "text_encoder_2":
            encoding["pooled"] = output[0]  # the projected pooled vector (`text_embeds`)
        return encoding

    def condition(self, encodings: dict[str, Encoding], batch: Batch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        side = self.settings["resolution"]
        target = torch.tensor([side, side], device=batch.original_size.device).expand(len(batch.latents), 2)
        time_ids = torch.cat([batch.original_size, batch.crop_top_left, target], dim=1)
        hidden = torch.cat([encodings["text_encoder"]["hidden"], encodings["text_encoder_2"]["hidden"]], dim=-1)
        return {
            "encoder_hidden_states": hidden.to(dtype),
            "text_embeds": encodings["text_encoder_2"]["pooled"].to(dtype),
            "time_ids": time_ids.to(batch.latents.device, dtype),
        }

    def predict(self, denoiser: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        added = {"text_embeds": conditioning["text_embeds"], "time_ids": conditioning["time_ids"]}
        return denoiser(noisy, timesteps, encoder_hidden_states=conditioning["encoder_hidden_states"],
                        added_cond_kwargs=added, return_dict=False)[0]
