"""A tiny random Mask2Former instance segmenter of the real `transformers` classes, for offline tests.

`build_tiny_mask2former`: `Mask2FormerForUniversalSegmentation` + `Mask2FormerImageProcessor`
with the label set of `facebook/mask2former-swin-small-coco-instance` (the 80 COCO thing classes
under detectron2's names, e.g. "mouse", "remote", "keyboard", which GenEval calls "computer
mouse", "tv remote", "computer keyboard") and a Swin backbone with four stages. Only the sizes
differ from the real checkpoint: 64-pixel inputs, hidden size 32, one layer per block, 10 queries.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rewards.geneval_rules import GENEVAL_CLASSES

IMAGE_SIZE = 64
# detectron2's COCO names where GenEval's object_names.txt uses longer ones.
DETECTRON2_NAMES = {"computer mouse": "mouse", "tv remote": "remote", "computer keyboard": "keyboard"}


def coco_instance_labels() -> dict[int, str]:
    """id2label of the COCO instance checkpoints on the Hub: 80 classes, detectron2's names."""
    return {i: DETECTRON2_NAMES.get(name, name) for i, name in enumerate(GENEVAL_CLASSES)}


def build_tiny_mask2former(save_dir: str | Path, seed: int = 0, num_queries: int = 10) -> Path:
    """Create and save a tiny random Mask2Former and its image processor; returns `save_dir`.

    `Mask2FormerForUniversalSegmentation.from_pretrained(save_dir)` and
    `Mask2FormerImageProcessor.from_pretrained(save_dir)` load it offline. Images are resized to
    a shortest edge of 64 pixels (longest 96). The same `seed` gives the same weights.
    """
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessor,
        SwinConfig,
    )

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    Mask2FormerImageProcessor(size={"shortest_edge": IMAGE_SIZE, "longest_edge": 96}).save_pretrained(
        save_dir
    )
    backbone = SwinConfig(
        image_size=IMAGE_SIZE, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
        window_size=2, out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    id2label = coco_instance_labels()
    # The pixel decoder's GroupNorm has 32 groups: 32 channels is the smallest width.
    config = Mask2FormerConfig(
        backbone_config=backbone, feature_size=32, mask_feature_size=32, hidden_dim=32,
        encoder_feedforward_dim=32, encoder_layers=1, decoder_layers=2, num_attention_heads=2,
        dim_feedforward=32, num_queries=num_queries, id2label=id2label,
        label2id={name: i for i, name in id2label.items()},
    )
    torch.manual_seed(seed)
    Mask2FormerForUniversalSegmentation(config).eval().save_pretrained(save_dir)
    return save_dir
