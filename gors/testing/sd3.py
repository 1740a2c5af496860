"""A tiny Stable Diffusion 3 pipeline of the real diffusers/transformers classes, random weights.

The structure is SD3-medium's: an MMDiT (`SD3Transformer2DModel`: joint text-image attention
blocks, the last one context-pre-only) conditioned on CLIP-L and bigG (both
`CLIPTextModelWithProjection`: their penultimate states, concatenated and zero-padded to T5's
width, precede T5's states; their projections, concatenated, are the pooled vector) and a T5
encoder; a 16-channel `AutoencoderKL` without quant convs, with SD3's scaling and shift factors;
the rectified-flow `FlowMatchEulerDiscreteScheduler` with SD3's shift of 3.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gors.testing.sdxl import CLIP_G_HIDDEN, CLIP_L_HIDDEN, build_clip_tokenizer, build_tiny_clip_text_encoder
from gors.testing.t5 import T5_D_MODEL, build_t5_tokenizer, build_tiny_t5_encoder


def build_tiny_sd3_pipeline(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random `StableDiffusion3Pipeline`; return `save_dir`.

    Sizes: 32 x 32 images by default (the VAE downsamples once: 16 x 16 x 16 latents, 2 x 2
    patches, 64 image tokens; sizes must be multiples of 4); MMDiT of 2 layers, 2 heads of 16,
    joint attention width 128 (T5), pooled width 96 = 32 (CLIP-L) + 64 (bigG); positional
    embeddings for up to 16 x 16 patches (64 px); the text is 77 CLIP + `max_sequence_length`
    (256 by default) T5 tokens; about 6.0 M parameters, most of them the two CLIP token embeddings.

    Args:
        save_dir: folder that `StableDiffusion3Pipeline.from_pretrained` will load.
        seed: seed of the random initialisation (same seed, same weights).
    """
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    save_dir = Path(save_dir)
    torch.manual_seed(seed)
    tokenizer = build_clip_tokenizer()
    tokenizer_2 = build_clip_tokenizer(pad_token="!")
    tokenizer_3 = build_t5_tokenizer()
    text_encoder = build_tiny_clip_text_encoder(CLIP_L_HIDDEN, True, tokenizer.pad_token_id)
    text_encoder_2 = build_tiny_clip_text_encoder(CLIP_G_HIDDEN, True, tokenizer_2.pad_token_id)
    text_encoder_3 = build_tiny_t5_encoder(len(tokenizer_3))
    num_heads, head_dim = 2, 16
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=head_dim,
        num_attention_heads=num_heads,
        joint_attention_dim=T5_D_MODEL,
        # The text stream has the image stream's width, as in SD3 (1536 = 24 x 64).
        caption_projection_dim=num_heads * head_dim,
        pooled_projection_dim=CLIP_L_HIDDEN + CLIP_G_HIDDEN,
        pos_embed_max_size=16,
        qk_norm="rms_norm",  # as every SD3.5 (SD3 Medium has none)
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=16,
        sample_size=32,
        scaling_factor=1.5305,
        shift_factor=0.0609,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    # The scheduler config of stabilityai/stable-diffusion-3-medium-diffusers.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )
    pipeline.save_pretrained(save_dir)
    return save_dir
