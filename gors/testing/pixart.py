"""A tiny PixArt-Sigma pipeline of the real diffusers/transformers classes, random weights.

The structure is PixArt-Σ's (`PixArt-alpha/PixArt-Sigma-XL-2-1024-MS`): a DiT
(`PixArtTransformer2DModel` with adaLN-single, cross-attention to T5 states, no size/aspect
conditions, learned variance: twice the latent channels out), a T5 encoder, a 4-channel
`AutoencoderKL` with SDXL's scaling factor (PixArt-Σ uses SDXL's VAE) and PixArt's
`DPMSolverMultistepScheduler` settings. PixArt is an evaluation-only family in gors.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gors.testing.sdxl import build_tiny_sdxl_vae
from gors.testing.t5 import T5_D_MODEL, build_t5_tokenizer, build_tiny_t5_encoder


def build_tiny_pixart_pipeline(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random `PixArtSigmaPipeline`; return `save_dir`.

    Sizes: 32 x 32 images by default (the VAE downsamples once: 16 x 16 x 4 latents, 2 x 2
    patches, 64 image tokens); DiT of 2 layers, 2 heads of 16, caption width 128 (T5); T5 takes
    `max_sequence_length` tokens (300 by default); about 1.1 M parameters (T5 0.39 M, VAE
    0.66 M). Call it with `use_resolution_binning=False`: the pipeline's size bins exist only for
    the real sample sizes (32 to 256 latents), and the default raises "Invalid sample size" here.

    Args:
        save_dir: folder that `PixArtSigmaPipeline.from_pretrained` will load.
        seed: seed of the random initialisation (same seed, same weights).
    """
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    save_dir = Path(save_dir)
    torch.manual_seed(seed)
    tokenizer = build_t5_tokenizer()
    text_encoder = build_tiny_t5_encoder(len(tokenizer))
    num_heads, head_dim = 2, 16
    transformer = PixArtTransformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        num_attention_heads=num_heads,
        attention_head_dim=head_dim,
        cross_attention_dim=num_heads * head_dim,
        caption_channels=T5_D_MODEL,
        norm_type="ada_norm_single",
        use_additional_conditions=False,
    )
    vae = build_tiny_sdxl_vae()  # PixArt-Sigma decodes with SDXL's VAE
    # The scheduler config of PixArt-Sigma-XL-2-1024-MS: DPM-Solver++ (2nd order) on linear betas.
    scheduler = DPMSolverMultistepScheduler(
        beta_start=0.0001,
        beta_end=0.02,
        beta_schedule="linear",
        prediction_type="epsilon",
        solver_order=2,
        algorithm_type="dpmsolver++",
    )
    pipeline = PixArtSigmaPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )
    pipeline.save_pretrained(save_dir)
    return save_dir
