"""A tiny FLUX.1 pipeline of the real diffusers/transformers classes, random weights.

The structure is FLUX.1's: a `FluxTransformer2DModel` with double-stream (joint) and
single-stream blocks and 3-axis rotary embeddings, on 2 x 2-packed latents; CLIP-L's pooled
output (`CLIPTextModel`) as the pooled vector and T5's states as the text tokens; a 16-channel
`AutoencoderKL` without quant convs, with FLUX's scaling and shift factors; the
`FlowMatchEulerDiscreteScheduler` config of the released checkpoints. FLUX.1-dev embeds the
guidance scale (guidance distillation) and shifts its schedule with the image size; FLUX.1-schnell
has neither.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gors.testing.sdxl import CLIP_L_HIDDEN, build_clip_tokenizer, build_tiny_clip_text_encoder
from gors.testing.t5 import T5_D_MODEL, build_t5_tokenizer, build_tiny_t5_encoder

LATENT_CHANNELS = 16


def flux_scheduler_config(schnell: bool = False) -> dict[str, object]:
    """`scheduler/scheduler_config.json` of black-forest-labs/FLUX.1-dev (or -schnell)."""
    return dict(
        num_train_timesteps=1000,
        shift=1.0 if schnell else 3.0,
        use_dynamic_shifting=not schnell,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )


def build_tiny_flux_pipeline(save_dir: str | Path, seed: int = 0, schnell: bool = False) -> Path:
    """Create and save a tiny random `FluxPipeline`; return `save_dir`.

    Sizes: the VAE downsamples once and the transformer packs 2 x 2 latents, so image sides must
    be multiples of 4 (32 x 32: 16 x 16 x 16 latents, 64 image tokens); pass `height`/`width`,
    since FluxPipeline's default is 128 x the VAE factor. Transformer of 1 double- and 1
    single-stream block, 2 heads of 16 (rotary axes 4 + 6 + 6), text width 128 (T5), pooled width
    32 (CLIP-L); T5 takes `max_sequence_length` tokens (512 by default); about 2.7 M parameters,
    most of them the CLIP token embedding.

    Args:
        save_dir: folder that `FluxPipeline.from_pretrained` will load.
        seed: seed of the random initialisation (same seed, same weights).
        schnell: build FLUX.1-schnell (no guidance embedding, fixed shift 1) instead of -dev.
    """
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    save_dir = Path(save_dir)
    torch.manual_seed(seed)
    tokenizer = build_clip_tokenizer()
    tokenizer_2 = build_t5_tokenizer()
    text_encoder = build_tiny_clip_text_encoder(CLIP_L_HIDDEN, False, tokenizer.pad_token_id)
    text_encoder_2 = build_tiny_t5_encoder(len(tokenizer_2))
    transformer = FluxTransformer2DModel(
        patch_size=1,
        # The pipeline packs 2 x 2 latent patches into one token: 4 x the VAE's channels.
        in_channels=4 * LATENT_CHANNELS,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=T5_D_MODEL,
        pooled_projection_dim=CLIP_L_HIDDEN,
        guidance_embeds=not schnell,
        # The rotary axes (text id, row, column) add up to the head width, as 16 + 56 + 56 = 128.
        axes_dims_rope=(4, 6, 6),
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=LATENT_CHANNELS,
        sample_size=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    pipeline = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**flux_scheduler_config(schnell)),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    pipeline.save_pretrained(save_dir)
    return save_dir
