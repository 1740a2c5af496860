"""A tiny random DPT-Hybrid depth model of the real `transformers` classes, for offline tests.

`build_tiny_dpt`: `DPTForDepthEstimation` + `DPTImageProcessor` with the structure of
`Intel/dpt-hybrid-midas` (``is_hybrid=True``: a BiT bottleneck backbone with three stages whose
first two feature maps feed the neck directly, a ViT on the last one with "project" readout,
reassemble factors 1, 1, 1, 0.5, mean/std 0.5 normalisation); only the sizes differ: 32 x 32
inputs, BiT widths 8/16/32, a two-layer ViT of width 16, fusion width 16.
"""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE_SIZE = 32
PATCH_SIZE = 16  # the BiT backbone's total stride, as in the real checkpoint
_BIT_WIDTHS = (8, 16, 32)
_VIT_WIDTH = 16


def build_tiny_dpt(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random DPT-Hybrid depth estimator and its image processor.

    `AutoModelForDepthEstimation.from_pretrained(save_dir)` and
    `AutoImageProcessor.from_pretrained(save_dir)` load it offline. The same `seed` gives the same
    weights. Returns `save_dir`.
    """
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    DPTImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(save_dir)
    grid = IMAGE_SIZE // PATCH_SIZE
    config = DPTConfig(
        is_hybrid=True,
        backbone_config={
            "model_type": "bit",
            "global_padding": "same",
            "layer_type": "bottleneck",
            "embedding_size": 8,
            "num_groups": 4,  # group norms over 8 channels (the real model: 32 groups)
            "hidden_sizes": list(_BIT_WIDTHS),
            "depths": [1, 1, 1],
            "out_features": ["stage1", "stage2", "stage3"],
            "embedding_dynamic_padding": True,
        },
        backbone_featmap_shape=[1, _BIT_WIDTHS[-1], grid, grid],
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=_VIT_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        # Entries 0 and 1 are the BiT stages; 2 and 3 pick ViT layers (the real model: 8 and 11).
        backbone_out_indices=[0, 1, 0, 1],
        neck_hidden_sizes=[_BIT_WIDTHS[0], _BIT_WIDTHS[1], _VIT_WIDTH, _VIT_WIDTH],
        reassemble_factors=[1, 1, 1, 0.5],
        fusion_hidden_size=16,
        readout_type="project",
        # A larger init than DPT's 0.02 so the random depth maps vary visibly across pixels.
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    DPTForDepthEstimation(config).eval().save_pretrained(save_dir)
    return save_dir
