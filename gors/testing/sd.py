"""A tiny Stable Diffusion pipeline of the real diffusers/transformers classes, random weights.

It has the exact structure of SD (CLIP text encoder, KL-VAE, conditional U-Net with self- and
cross-attention, DDIM scheduler) at a size that runs the whole GORS loop on a CPU in seconds.
The tokenizer is the real CLIP BPE vocabulary that ships inside `open_clip`, so prompts tokenise
exactly as they do for Stable Diffusion.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import torch

CLIP_VOCAB_SIZE = 49408
# The CLIP BPE file holds 48 894 merges after its header line (vocab 49408 = 512 byte symbols
# + merges + 2 special tokens).
_CLIP_MERGES = CLIP_VOCAB_SIZE - 512 - 2


def byte_symbols() -> list[str]:
    """GPT-2/CLIP's reversible byte -> printable unicode mapping, in the vocabulary's order."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_clip_tokenizer_files(save_dir: str | Path) -> Path:
    """Write CLIP's `vocab.json` and `merges.txt` from the BPE file bundled with open_clip."""
    # Located, not imported: importing open_clip pulls in its own dependencies (ftfy, timm), which
    # only its models need.
    spec = importlib.util.find_spec("open_clip")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("write_clip_tokenizer_files needs the open_clip_torch package (its BPE file): "
                                  "pip install open_clip_torch")
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    bpe_path = Path(spec.origin).parent / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe_path, "rt", encoding="utf-8").read().split("\n")
    merges = [tuple(line.split()) for line in lines[1 : _CLIP_MERGES + 1]]
    symbols = byte_symbols()
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (save_dir / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}))
    (save_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return save_dir


def build_tiny_sd_pipeline(save_dir: str | Path, seed: int = 0, resolution: int = 32):
    """Create, save and return a tiny random `StableDiffusionPipeline` at `save_dir`.

    Args:
        save_dir: folder that `StableDiffusionPipeline.from_pretrained` will load.
        seed: seed of the random initialisation (same seed, same weights).
        resolution: image side in pixels; latents are `resolution // 2` (one VAE downsampling).
    """
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    save_dir = Path(save_dir)
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=resolution // 2,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        sample_size=resolution,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=CLIP_VOCAB_SIZE,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=CLIP_VOCAB_SIZE - 2,
            eos_token_id=CLIP_VOCAB_SIZE - 1,
            pad_token_id=CLIP_VOCAB_SIZE - 1,
        )
    )
    tokenizer_dir = write_clip_tokenizer_files(save_dir / "_tokenizer_files")
    tokenizer = CLIPTokenizer(
        str(tokenizer_dir / "vocab.json"), str(tokenizer_dir / "merges.txt"), model_max_length=77
    )
    # Stable Diffusion's own scheduler settings (scaled-linear betas, epsilon prediction).
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type="epsilon",
    )
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(save_dir)
    for leftover in tokenizer_dir.iterdir():
        leftover.unlink()
    tokenizer_dir.rmdir()
    return pipeline
