"""Stable Diffusion 3 / 3.5: CLIP-L, CLIP-G and T5 into an MMDiT, the rectified-flow loss.

As `StableDiffusion3Pipeline` conditions: the CLIP encoders' penultimate hidden states,
concatenated and zero-padded to T5's width, precede T5's states (`--max_sequence_length` tokens,
the pipeline's 256 by default); the two pooled projections, concatenated, are the pooled vector.
LoRA may train the two CLIP encoders; T5 stays frozen, and its states are cached.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gors.families.base import Batch, Encoding, FlowMatchingFamily, TextEncoder, TrainingDefaults


class StableDiffusion3Family(FlowMatchingFamily):
    text_encoders = (
        TextEncoder("text_encoder", "tokenizer"),
        TextEncoder("text_encoder_2", "tokenizer_2"),
        TextEncoder("text_encoder_3", "tokenizer_3", lora=False, t5=True),
    )
    # diffusers' SD3 LoRA script: logit-normal timesteps, text encoders frozen unless asked. Its default
    # `--precondition_outputs 1` (target x0, i.e. the loss times sigma^2) is not taken: the target is
    # `noise - x0`, as in the FLUX script and the SD3 paper (`gors.loss`).
    defaults = TrainingDefaults(train_text_encoder=False, weighting_scheme="logit_normal", max_sequence_length=256)

    def encode(self, encoder: TextEncoder, model: torch.nn.Module, input_ids: torch.Tensor) -> Encoding:
        if encoder.t5:
            return {"hidden": model(input_ids)[0]}
        output = model(input_ids, output_hidden_states=True)
        return {"hidden": output.hidden_states[-2], "pooled": output[0]}

    def condition(self, encodings: dict[str, Encoding], batch: Batch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        clip = torch.cat([encodings["text_encoder"]["hidden"], encodings["text_encoder_2"]["hidden"]], dim=-1)
        t5 = encodings["text_encoder_3"]["hidden"]
        clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        pooled = torch.cat([encodings["text_encoder"]["pooled"], encodings["text_encoder_2"]["pooled"]], dim=-1)
        return {"encoder_hidden_states": torch.cat([clip, t5.to(clip.dtype)], dim=-2).to(dtype),
                "pooled_projections": pooled.to(dtype)}

    def predict(self, denoiser: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        return denoiser(hidden_states=noisy, timestep=timesteps, return_dict=False, **conditioning)[0]
