"""The unbiased reward for complex prompts: the paper's three unbiased rewards, averaged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rewards.base import RewardOutput
from rewards.combined import RewardSpec, WeightedReward, check_member_options, member_models

MEMBERS = ("grounded_sam", "grounded_detection", "blip_clip")
# What this reward sets in a member: grounded detection judges the spatial part of complex prompts.
MEMBER_SETTINGS: dict[str, dict[str, Any]] = {"grounded_detection": {"complex": True}}


class UnbiasedComplexReward(WeightedReward):
    """Weighted mean of Grounded-SAM (binding), grounded detection (spatial) and BLIP-CLIP
    (non-spatial), each in [0, 1], so the score is in [0, 1]. None of them is a T2I-CompBench metric.

    Grounded detection parses objects around the preposition (`complex=True`, as 3-in-1's spatial
    term does). A prompt without a spatial relation word (most complex prompts are about actions)
    has nothing for it to judge, so it is left out of that image's mean rather than counted as 0;
    the details list the members used.

    Args:
        device, torch_dtype, batch_size: passed to the members.
        weights: member name -> weight (> 0); default: equal weights (the mean).
        grounded_sam, grounded_detection, blip_clip: keyword arguments of each member (e.g. its
            `model_name_or_path`).
    """

    name = "unbiased_complex"
    # 3: its members' version 3 / 2 changes, and the spatial member counts only where the prompt names two
    # objects (2: its grounded_detection member suppresses per class; 1: no NMS)
    scoring_version = 3
    categories = ("complex",)
    description = "unbiased complex reward: mean of grounded_sam, grounded_detection and blip_clip"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse, before any of the three models loads, a `model_name_or_path` (each member has its own),
        weights for no member, and a member's option it does not take or a value it would refuse."""
        if options.get("model_name_or_path") is not None:
            raise ValueError("unbiased_complex combines three rewards; give each one's model in its options "
                             "(grounded_sam, grounded_detection, blip_clip: {'model_name_or_path': ...})")
        unknown = sorted(set(options.get("weights") or {}) - set(MEMBERS))
        if unknown:
            raise ValueError(f"weights for unknown members {unknown}; the members are {list(MEMBERS)}")
        for name in MEMBERS:
            check_member_options(name, options.get(name) or {}, MEMBER_SETTINGS.get(name))

    @classmethod
    def models(cls, options: Mapping[str, Any]) -> dict[str, str]:
        """The three members' models, keyed `<member>.<option>` (e.g. `grounded_sam.sam_model_name_or_path`)."""
        return member_models({name: options.get(name) or {} for name in MEMBERS})

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
        given = {"grounded_sam": grounded_sam, "grounded_detection": grounded_detection, "blip_clip": blip_clip}
        self.check_options({"model_name_or_path": model_name_or_path, "weights": weights, **given})
        weights = dict(weights or {})
        specs = [RewardSpec(name, weights.get(name, 1.0)) for name in MEMBERS]
        options = {name: {**MEMBER_SETTINGS.get(name, {}), **(given[name] or {})} for name in MEMBERS}
        super().__init__(specs, device, torch_dtype, batch_size, options=options)

    def image_weights(self, outputs: Mapping[str, RewardOutput], index: int) -> dict[str, float]:
        """The members' weights for image `index`: the spatial member counts only where the prompt is
        spatial, a relation word and two objects (a relation word alone, "nearby", is no layout to judge,
        and would count as a 0)."""
        spatial = outputs["grounded_detection"].details[index]
        if spatial.get("relation") is not None and spatial.get("objects") is not None:
            return self.weights
        return {name: weight for name, weight in self.weights.items() if name != "grounded_detection"}
