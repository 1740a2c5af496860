"""The toy world's exact scorer as a reward: `rewards.toy_rules` behind the `Reward` protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from PIL import Image

from gors.core.toy.world import ToyPrompt, check_toy_prompts
from rewards import toy_rules as oracle
from rewards.base import Reward, RewardOutput


class ToyOracleReward(Reward):
    """Exact prompt-image agreement in the toy world, from colour segmentation and shape geometry.

    Each image is segmented into blobs of the palette colours and each blob's shape is named
    (`rewards.toy_rules`). The prompt gives checks: one per object ("a red circle is present"), one
    for the relation between the objects' centres if the prompt has one, and "no extra objects".
    The score is the fraction of checks passed, in [0, 1]: with `checks="binding"` (the default,
    the `toy` benchmark's metric, attribute binding) of the object and no-extra checks, with
    `checks="all"` of every check, the relation's too. 1.0 means the image passes them all.
    Details per image: `bound` (binding right), `relation_holds` (None without a relation or with
    an object missing), `correct` (every check), the checks and a reason per failed one. Exact on
    rendered scenes; tolerant of blur and colour noise.

    There is no model: `model_name_or_path` must be None, and the other arguments are accepted for
    the common interface and ignored. Prompts must be toy-world prompts (see `ToyPrompt.parse`).

    Args:
        checks: "binding" or "all", the checks the score counts (details report all of them).
    """

    name = "toy_oracle"
    default_model = None
    categories = ("toy",)
    description = ("exact toy-world check by colour segmentation and shape geometry: the fraction of binding "
                   "checks passed (checks='all' adds the relation)")

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse a model (there is none) and a `checks` other than "binding" or "all"."""
        if options.get("model_name_or_path") is not None:
            raise ValueError(f"toy_oracle has no model to load; got model_name_or_path="
                             f"{options['model_name_or_path']!r}, leave it unset")
        if options.get("checks", "binding") not in ("binding", "all"):
            raise ValueError(f"checks={options['checks']!r}; choose 'binding' (objects and bindings) or 'all' "
                             "(the relation too)")

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        checks: Literal["binding", "all"] = "binding",
    ) -> None:
        self.check_options({"model_name_or_path": model_name_or_path, "checks": checks})
        super().__init__(None, device, torch_dtype, batch_size)
        self.checks = checks

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[dict[str, Any]] | None) -> None:
        """Refuse a prompt outside the toy world before any image is generated for it."""
        check_toy_prompts(prompts, cls.name)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        parsed = [ToyPrompt.parse(prompt) for prompt in prompts]  # a non-toy prompt fails before any work
        scores, details = [], []
        for image, prompt in zip(images, parsed):
            judgement = oracle.judge_image(prompt, image)
            scores.append(judgement.binding_score if self.checks == "binding" else judgement.score)
            details.append(
                {
                    "bound": judgement.bound,
                    "relation_holds": judgement.relation_holds,
                    "correct": judgement.correct,
                    "reasons": list(judgement.reasons),
                    "found": list(judgement.found),
                    "errors": list(judgement.errors),
                    "checks": [[check, bool(passed)] for check, passed in judgement.checks],
                }
            )
        return RewardOutput(scores=scores, details=details)
