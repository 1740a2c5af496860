"""FLUX.1 [dev] and [schnell]: CLIP-L pooled + T5 into a double/single-stream transformer on packed
latents, the rectified-flow loss.

As `FluxPipeline` conditions: CLIP-L's pooled output is the pooled vector, T5's states
(`--max_sequence_length` tokens, the pipeline's 512 by default) the text tokens with zero ids;
latents are packed into 2 x 2 patches with (0, row, column) ids; the transformer takes the
timestep / 1000 and, for guidance-distilled [dev], the guidance scale the samples were drawn with.
Only the transformer trains: diffusers can train FLUX.1's CLIP encoder, gors does not (its pooled
vector is one of 768 numbers beside T5's states; see docs/model_families.md).
"""

from __future__ import annotations

from typing import Any

import torch

from gors.core.backbones import Backbone, flux_guidance_embeds
from gors.core.transfer import to_device
from gors.families.base import Batch, Encoding, FlowMatchingFamily, TextEncoder, TrainingDefaults


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, 4C): 2 x 2 patches as tokens, FluxPipeline's layout."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of `pack_latents` for latents of `height` x `width`."""
    b, _, packed = tokens.shape
    c = packed // 4
    return tokens.view(b, height // 2, width // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, height, width)


def latent_image_ids(height: int, width: int) -> torch.Tensor:
    """(H/2 * W/2, 3) rotary position ids of the packed latents: (0, row, column)."""
    ids = torch.zeros(height // 2, width // 2, 3)
    ids[..., 1] = torch.arange(height // 2)[:, None]
    ids[..., 2] = torch.arange(width // 2)[None, :]
    return ids.reshape(-1, 3)


class FluxFamily(FlowMatchingFamily):
    text_encoders = (
        TextEncoder("text_encoder", "tokenizer", lora=False),
        TextEncoder("text_encoder_2", "tokenizer_2", lora=False, t5=True),
    )
    # diffusers' FLUX LoRA script: uniform timesteps, no weighting.
    defaults = TrainingDefaults(train_text_encoder=False, weighting_scheme="none", max_sequence_length=512)

    def __init__(self, backbone: Backbone, pretrained_model_name_or_path: str, revision: str | None,
                 settings: dict[str, Any]) -> None:
        super().__init__(backbone, pretrained_model_name_or_path, revision, settings)
        self.guidance_embeds = flux_guidance_embeds(pretrained_model_name_or_path, revision)

    def fingerprint(self) -> dict[str, Any]:
        guidance = {"guidance_scale": self.settings["guidance_scale"]} if self.guidance_embeds else {}
        return super().fingerprint() | guidance

    def encode(self, encoder: TextEncoder, model: torch.nn.Module, input_ids: torch.Tensor) -> Encoding:
        if encoder.t5:
            return {"hidden": model(input_ids, output_hidden_states=False)[0]}
        return {"pooled": model(input_ids, output_hidden_states=False).pooler_output}

    def condition(self, encodings: dict[str, Encoding], batch: Batch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        hidden = encodings["text_encoder_2"]["hidden"]
        b, _, h, w = batch.latents.shape
        device = batch.latents.device
        conditioning = {
            "encoder_hidden_states": hidden.to(dtype),
            "pooled_projections": encodings["text_encoder"]["pooled"].to(dtype),
            "txt_ids": torch.zeros(hidden.shape[1], 3, device=device, dtype=dtype),
            "img_ids": to_device(latent_image_ids(h, w), device).to(dtype),
        }
        if self.guidance_embeds:
            conditioning["guidance"] = torch.full((b,), float(self.settings["guidance_scale"]), device=device)
        return conditioning

    def predict(self, denoiser: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        _, _, h, w = noisy.shape
        # In the latents' dtype before dividing, as `FluxPipeline` samples (diffusers' training script divides in
        # float32: in bfloat16 about a fifth of the timesteps then reach the embedding one step apart).
        tokens = denoiser(hidden_states=pack_latents(noisy), timestep=timesteps.to(noisy.dtype) / 1000,
                          return_dict=False, **conditioning)[0]
        return unpack_latents(tokens, h, w)
