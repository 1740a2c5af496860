"""The unbiased reward for complex prompts: the paper's three unbiased rewards, averaged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rewards.combined import RewardSpec, WeightedReward

MEMBERS = ("grounded_sam", "grounded_detection", "blip_clip")


class UnbiasedComplexReward(WeightedReward):
    """Weighted mean of Grounded-SAM (binding), grounded detection (spatial) and BLIP-CLIP
    (non-spatial), each in [0, 1], so the score is in [0, 1]. None of them is a T2I-CompBench metric.

    Args:
        device, torch_dtype, batch_size: passed to the members.
        weights: member name -> weight (> 0); default: equal weights (the mean).
        grounded_sam, grounded_detection, blip_clip: keyword arguments of each member (e.g. its
            `model_name_or_path`).
    """

    name = "unbiased_complex"
    categories = ("complex",)
    description = "unbiased complex reward: mean of grounded_sam, grounded_detection and blip_clip"

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        weights: Mapping[str, float] | None = None,
        grounded_sam: Mapping[str, Any] | None = None,
        grounded_detection: Mapping[str, Any] | None = None,
        blip_clip: Mapping[str, Any] | None = None,
    ) -> None:
        if model_name_or_path is not None:
            raise ValueError(
                "unbiased_complex combines three rewards; give each one's model in its options "
                "(grounded_sam, grounded_detection, blip_clip: {'model_name_or_path': ...})"
            )
        weights = dict(weights or {})
        unknown = sorted(set(weights) - set(MEMBERS))
        if unknown:
            raise ValueError(f"weights for unknown members {unknown}; the members are {list(MEMBERS)}")
        bad = {name: w for name, w in weights.items() if not w > 0}
        if bad:
            raise ValueError(f"weights {bad} must be > 0")
        specs = [RewardSpec(name, weights.get(name, 1.0)) for name in MEMBERS]
        options = {"grounded_sam": grounded_sam, "grounded_detection": grounded_detection, "blip_clip": blip_clip}
        super().__init__(
            specs, device, torch_dtype, batch_size,
            options={name: value for name, value in options.items() if value},
        )
