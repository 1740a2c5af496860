"""A tiny random SAM (`SamModel` + `SamProcessor`) for offline tests.

The structure and processor conventions are those of `facebook/sam-vit-huge` (ViT image encoder
with windowed and global attention and relative positions, prompt encoder, two-way mask decoder;
images resized to a longest edge and padded to a square; boxes rescaled to the resized image);
only the sizes differ: 64-pixel inputs, 8x8 patches (an 8x8 image embedding, 32x32 low-res
masks), hidden size 32, two layers per tower.
"""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE_SIZE = 64
PATCH_SIZE = 8
HIDDEN_SIZE = 32


def build_tiny_sam(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random SAM model and its processor; returns `save_dir`.

    `SamModel.from_pretrained(save_dir)` and `SamProcessor.from_pretrained(save_dir)` load it
    offline. The same `seed` gives the same weights.
    """
    from transformers import SamConfig, SamImageProcessor, SamModel, SamProcessor

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    image_processor = SamImageProcessor(
        size={"longest_edge": IMAGE_SIZE},
        pad_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        mask_size={"longest_edge": IMAGE_SIZE // 4},
        mask_pad_size={"height": IMAGE_SIZE // 4, "width": IMAGE_SIZE // 4},
    )
    SamProcessor(image_processor=image_processor).save_pretrained(save_dir)

    # The image embedding, the prompt embeddings and the mask decoder share one width
    # (`output_channels` = prompt and decoder `hidden_size`); the random positional encoding
    # has 2 * num_pos_feats channels, so num_pos_feats is half of it.
    config = SamConfig(
        vision_config={
            "hidden_size": HIDDEN_SIZE,
            "output_channels": HIDDEN_SIZE,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "window_size": 4,
            "global_attn_indexes": [1],
            "num_pos_feats": HIDDEN_SIZE // 2,
            "mlp_dim": 64,
        },
        prompt_encoder_config={
            "hidden_size": HIDDEN_SIZE,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "mask_input_channels": 4,
        },
        mask_decoder_config={
            "hidden_size": HIDDEN_SIZE,
            "mlp_dim": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "iou_head_hidden_dim": HIDDEN_SIZE,
        },
        # Larger than SAM's 0.02 so random masks differ visibly between boxes and images.
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    model = SamModel(config).eval()
    model.save_pretrained(save_dir)
    return save_dir
