"""The toy text-to-image model: Stable Diffusion's classes at toy size.

`UNet2DConditionModel` (cross-attention at both resolutions), `AutoencoderKL` (64 x 64 pixels ->
8 x 8 x 4 latents), `CLIPTextModel` with a small CLIP BPE tokenizer over the toy vocabulary,
and a DDIM scheduler: `StableDiffusionPipeline.from_pretrained` loads it like any SD checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from transformers.convert_slow_tokenizer import bytes_to_unicode

from gors.core.toy.world import COLOURS, IMAGE_SIZE, RELATIONS, SHAPES

MAX_TOKENS = 16  # the longest prompts ("a yellow triangle on the right of a green circle"): 10 words + 2
LATENT_SCALE = 8  # pixels per latent cell along each side, as in Stable Diffusion


def toy_words() -> list[str]:
    """Every word of the toy world's prompts (articles, colours, shapes, relations): the tokenizer's vocabulary."""
    words = {"a", "an", "and"} | set(COLOURS) | set(SHAPES)
    for relation in RELATIONS:
        words |= set(relation.split())
    return sorted(words)


def write_toy_tokenizer_files(save_dir: str | Path) -> tuple[Path, Path]:
    """CLIP BPE files whose merges spell each toy word as one token (other text falls back to bytes)."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    symbols = list(bytes_to_unicode().values())  # CLIP's byte-level symbols, in vocabulary order
    vocab = symbols + [s + "</w>" for s in symbols]
    merges: list[tuple[str, str]] = []
    # Longer words first: their merge chains then outrank the shorter words' (e.g. "tr" + "i" in
    # "triangle" before "r" + "i" of "right"), so every toy word comes out as one token.
    for word in sorted(toy_words(), key=lambda w: (-len(w), w)):
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        built = pieces[0]
        for piece in pieces[1:]:
            merges.append((built, piece))
            built += piece
            if built not in vocab:
                vocab.append(built)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    vocab_file, merges_file = save_dir / "vocab.json", save_dir / "merges.txt"
    vocab_file.write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    merges_file.write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return vocab_file, merges_file


def build_toy_components(work_dir: str | Path, seed: int = 0, unet_channels: Sequence[int] = (32, 64)) -> dict:
    """Randomly initialised tokenizer, text encoder, VAE, U-Net and schedulers of the toy model.

    `unet_channels` gives one cross-attention block per entry (each but the last halves the 8 x 8
    latent grid), so its length sets how coarse the U-Net's deepest grid is.
    """
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    vocab_file, merges_file = write_toy_tokenizer_files(Path(work_dir) / "tokenizer_files")
    tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=MAX_TOKENS)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=MAX_TOKENS,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(16, 32, 32, 32),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=IMAGE_SIZE,
    )
    unet = UNet2DConditionModel(
        sample_size=IMAGE_SIZE // LATENT_SCALE,
        in_channels=4,
        out_channels=4,
        block_out_channels=tuple(unet_channels),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D",) * len(unet_channels),
        up_block_types=("CrossAttnUpBlock2D",) * len(unet_channels),
        cross_attention_dim=64,
        attention_head_dim=8,
        norm_num_groups=16,
    )
    schedule = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", prediction_type="epsilon")
    return {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "unet": unet,
        "noise_scheduler": DDPMScheduler(num_train_timesteps=1000, **schedule),
        "scheduler": DDIMScheduler(num_train_timesteps=1000, clip_sample=False, set_alpha_to_one=False,
                                   steps_offset=1, **schedule),
    }
