"""A tiny random CLIP model of the real `transformers` classes, for offline tests.

`build_tiny_clip`: `CLIPModel` + `CLIPProcessor` with the structure and token conventions of
`openai/clip-vit-base-patch32` (the real 49 408-token CLIP BPE vocabulary, 77 text positions,
bos `<|startoftext|>`, eos = pad = `<|endoftext|>`, the config's legacy token ids 0/1/2);
32x32 images, 8x8 patches, hidden size 32.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from gors.testing.blip import IMAGE_SIZE
from gors.testing.sd import CLIP_VOCAB_SIZE, write_clip_tokenizer_files

CLIP_CONTEXT_LENGTH = 77


def build_tiny_clip(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random CLIP model and its processor; returns `save_dir`.

    `CLIPModel.from_pretrained(save_dir)` and `CLIPProcessor.from_pretrained(save_dir)` load it
    offline. The same `seed` gives the same weights.
    """
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTokenizer,
    )

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    files = write_clip_tokenizer_files(save_dir / "_tokenizer_files")
    tokenizer = CLIPTokenizer(
        str(files / "vocab.json"), str(files / "merges.txt"), model_max_length=CLIP_CONTEXT_LENGTH
    )
    # The real processor's resize-shortest-edge + centre-crop, at 32 pixels instead of 224.
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(save_dir)
    shutil.rmtree(files)

    tower = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = CLIPConfig(
        text_config=dict(
            tower,
            vocab_size=CLIP_VOCAB_SIZE,
            max_position_embeddings=CLIP_CONTEXT_LENGTH,
            # The ids of the real checkpoint's config (not the tokenizer's): eos_token_id == 2
            # makes CLIPTextTransformer pool the highest token id, <|endoftext|>, as OpenAI's.
            bos_token_id=0,
            pad_token_id=1,
            eos_token_id=2,
        ),
        vision_config=dict(tower, image_size=IMAGE_SIZE, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(seed)
    CLIPModel(config).eval().save_pretrained(save_dir)
    return save_dir
