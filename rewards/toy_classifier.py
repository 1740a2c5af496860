"""A learned toy-world reward: a small CNN's presence probabilities of colour-shape combinations.

The unbiased counterpart of the exact oracle (`toy_oracle`): it measures something different
(learned presence of the prompt's combinations and absence of swapped ones, ignoring spatial
relations), so training on one and evaluating on the other shows reward hacking, or its absence.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from gors.core.hub import from_pretrained
from gors.core.toy import PRETRAINED_DIR, world
from rewards.base import MODEL_FLAG, Reward, RewardOutput
from rewards.toy_cnn import COMBINATION_INDEX, COMBINATIONS, ToyClassifier, combination_name, predict_presence


def binding_score(probabilities: np.ndarray, prompt: world.ToyPrompt) -> tuple[float, dict[str, Any]]:
    """Score in [0, 1] and details of one image's presence probabilities (12,) against a prompt.

    score = mean_{o in prompt} P(o) * (1 - max_{c in C} P(c)), where C holds the combinations not
    in the prompt that share a colour or a shape with a prompt object (the swapped bindings,
    e.g. "red square" and "blue circle" for "a red circle and a blue square"). The relation, if
    any, is ignored.
    """
    objects = [(o.colour, o.shape) for o in prompt.objects]
    wanted = set(objects)
    present = {combination_name(c): float(probabilities[COMBINATION_INDEX[c]]) for c in objects}
    # Mean over the prompt's objects as written (a repeated object counts twice).
    mean_present = float(np.mean([probabilities[COMBINATION_INDEX[c]] for c in objects]))
    confusable = [
        c
        for c in COMBINATIONS
        if c not in wanted and any(c[0] == o.colour or c[1] == o.shape for o in prompt.objects)
    ]
    # Every prompt has confusable combinations (12 combinations, at most 2 in a prompt).
    worst = max(confusable, key=lambda c: probabilities[COMBINATION_INDEX[c]])
    worst_p = float(probabilities[COMBINATION_INDEX[worst]])
    score = min(max(mean_present * (1.0 - worst_p), 0.0), 1.0)
    return score, {"present": present, "confusions": {combination_name(worst): worst_p}}


class ToyClassifierReward(Reward):
    """Learned binding score of toy-world (image, prompt) pairs; scores in [0, 1].

    A `ToyClassifier` gives P(c) for each of the 12 colour-shape combinations c. With C the
    combinations that are not in the prompt but share a colour or a shape with one of its objects:

        score = mean_{o in prompt objects} P(o) * (1 - max_{c in C} P(c))

    It rewards the right bindings and penalises swapped ones ("a red square" drawn for "a red
    circle"); spatial relations are ignored. Details per image: {"present": {"red circle": p, ...}
    for the prompt's objects, "confusions": {name of the most likely c in C: P(c)}}.

    Args:
        model_name_or_path: a folder saved by `ToyClassifier.save_pretrained`; default the
            weights shipped in the package (written by `gors toy pretrain`).
        device, torch_dtype, batch_size: see `Reward`; `batch_size` images per forward pass.
    """

    name = "toy_classifier"
    default_model = str(PRETRAINED_DIR / "classifier")
    categories = ("toy",)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 64,
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        path = str(self.model_name_or_path)
        if path == self.default_model and not Path(path).is_dir():
            raise FileNotFoundError(
                f"The packaged toy classifier weights are missing ({path}). Restore them (git checkout "
                f"gors/core/toy/pretrained), or train a toy model with `gors toy pretrain --output_dir toy_model` and "
                f"pass model_name_or_path ({MODEL_FLAG}) toy_model/classifier."
            )
        model = from_pretrained(ToyClassifier.from_pretrained, path, MODEL_FLAG, dtype=self.torch_dtype)
        self.model = model.to(self.device).eval().requires_grad_(False)

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[dict[str, Any]] | None) -> None:
        """Refuse a prompt outside the toy world before any image is generated for it."""
        world.check_toy_prompts(prompts, cls.name)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        parsed = [world.ToyPrompt.parse(p) for p in prompts]  # ValueError for a non-toy prompt, before any work
        probabilities = predict_presence(self.model, images, batch_size=self.batch_size)
        results = [binding_score(p, prompt) for p, prompt in zip(probabilities, parsed)]
        return RewardOutput(scores=[s for s, _ in results], details=[d for _, d in results])
