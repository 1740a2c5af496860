"""A tiny Stable Diffusion XL pipeline of the real diffusers/transformers classes, random weights.

The structure is SDXL's: two CLIP text encoders (a `CLIPTextModel` as CLIP ViT-L and a
`CLIPTextModelWithProjection` as OpenCLIP bigG, whose tokenizer pads with "!"), their penultimate
hidden states concatenated as the U-Net's cross-attention context, the bigG pooled projection plus
six size/crop conditions as the U-Net's "text_time" added embedding, linear-projection
transformer blocks with more layers in the deeper block, an `AutoencoderKL` with SDXL's scaling
factor, and SDXL's `EulerDiscreteScheduler` settings. Both tokenizers are the real CLIP BPE.

The two CLIP builders here are shared with the SD3 and FLUX builders: SD3 and FLUX.1 condition on
the same CLIP-L (and SD3 also on bigG).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from gors.testing.sd import CLIP_VOCAB_SIZE, write_clip_tokenizer_files

CLIP_MAX_LENGTH = 77
# Tiny widths of CLIP ViT-L (768) and OpenCLIP bigG (1280): different, as in the real models.
CLIP_L_HIDDEN = 32
CLIP_G_HIDDEN = 64
ADDITION_TIME_EMBED_DIM = 8  # 256 in SDXL
# SDXL's added conditions: original size, crop top-left and target size, two numbers each.
NUM_TIME_IDS = 6


def build_clip_tokenizer(pad_token: str = "<|endoftext|>"):
    """A `CLIPTokenizer` with the real CLIP BPE; bigG's tokenizers (SDXL, SD3) pad with "!"."""
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        files = write_clip_tokenizer_files(tmp)
        return CLIPTokenizer(
            str(files / "vocab.json"),
            str(files / "merges.txt"),
            pad_token=pad_token,
            model_max_length=CLIP_MAX_LENGTH,
        )


def build_tiny_clip_text_encoder(hidden_size: int, with_projection: bool, pad_token_id: int):
    """A random 2-layer CLIP text encoder; seed torch before calling.

    Args:
        hidden_size: width; with a projection, `projection_dim` is the same (768 / 1280 in
            CLIP-L / bigG) and its `text_embeds` is the pooled vector the pipelines use.
        with_projection: `CLIPTextModelWithProjection` (SDXL's second, SD3's both) or
            `CLIPTextModel`, whose `pooler_output` FLUX uses.
        pad_token_id: id of the tokenizer's pad token (the eos id, or 0 for bigG's "!").
    """
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=CLIP_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=37,
        projection_dim=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CLIP_MAX_LENGTH,
        # OpenAI's CLIP-L uses quick_gelu, OpenCLIP's bigG plain gelu.
        hidden_act="gelu" if hidden_size == CLIP_G_HIDDEN else "quick_gelu",
        bos_token_id=CLIP_VOCAB_SIZE - 2,
        eos_token_id=CLIP_VOCAB_SIZE - 1,
        pad_token_id=pad_token_id,
    )
    model_class = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return model_class(config).eval()


def build_tiny_sdxl_vae():
    """A tiny `AutoencoderKL` with SDXL's latent scaling (PixArt-Sigma uses SDXL's VAE too)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        sample_size=32,
        scaling_factor=0.13025,
    )


def build_tiny_sdxl_pipeline(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random `StableDiffusionXLPipeline`; return `save_dir`.

    Sizes: 32 x 32 images by default (the VAE downsamples once: 16 x 16 x 4 latents); U-Net
    channels (32, 64) with 1 and 2 transformer layers (2 and 4 heads), cross-attention width
    96 = 32 (CLIP-L) + 64 (bigG), added embedding 112 = 64 (bigG projection) + 6 x 8; CLIP text
    encoders of 2 layers; about 6.9 M parameters, most of them the two CLIP token embeddings.

    Args:
        save_dir: folder that `StableDiffusionXLPipeline.from_pretrained` will load.
        seed: seed of the random initialisation (same seed, same weights).
    """
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    save_dir = Path(save_dir)
    torch.manual_seed(seed)
    tokenizer = build_clip_tokenizer()
    tokenizer_2 = build_clip_tokenizer(pad_token="!")
    text_encoder = build_tiny_clip_text_encoder(CLIP_L_HIDDEN, False, tokenizer.pad_token_id)
    text_encoder_2 = build_tiny_clip_text_encoder(CLIP_G_HIDDEN, True, tokenizer_2.pad_token_id)
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2),
        # As in SDXL's config, this is the number of heads per block.
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        cross_attention_dim=CLIP_L_HIDDEN + CLIP_G_HIDDEN,
        addition_embed_type="text_time",
        addition_time_embed_dim=ADDITION_TIME_EMBED_DIM,
        projection_class_embeddings_input_dim=CLIP_G_HIDDEN + NUM_TIME_IDS * ADDITION_TIME_EMBED_DIM,
    )
    vae = build_tiny_sdxl_vae()
    # The scheduler config of stabilityai/stable-diffusion-xl-base-1.0.
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="epsilon",
        interpolation_type="linear",
        timestep_spacing="leading",
        steps_offset=1,
    )
    pipeline = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        # Not a config entry: loading decides again, from whether invisible-watermark is installed.
        add_watermarker=False,
    )
    pipeline.save_pretrained(save_dir)
    return save_dir
