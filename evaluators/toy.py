"""The `toy` benchmark: binding accuracy of the toy world, judged by the exact oracle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from evaluators.base import Benchmark, BenchmarkPrompt
from evaluators.results import Metric
from gors.core.backbones import SamplingDefaults
from gors.core.toy.world import SPLITS, ToyPrompt, prompts_of_split
from rewards.toy_rules import BINDING_ERRORS


@dataclass
class ToyBenchmark(Benchmark):
    """Attribute-binding accuracy on the toy world's prompts, judged by the exact oracle.

    The protocol fields are `Benchmark`'s, with the toy model's defaults: 4 images per prompt
    (seeds `seed + 100000 * prompt + image`, seed 2024), DDIM 20 steps, guidance 4.0, 64 px,
    32 images per generation batch.

    Args:
        split: "held_out" (prompts with colour-shape combinations never seen in training), "train",
            or "fit" / "val" (and the folds "fit_square" / "val_square", "fit_triangle" / "val_triangle"), the
            train prompts split the same way (for choosing settings).
    """

    split: str = "held_out"
    images_per_prompt: int | None = 4
    seed: int = 2024  # fixed by the protocol, apart from any training seed
    batch_size: int = 32

    name = "toy"
    scorer = "toy_oracle"
    primary_metric = "binding_accuracy"
    subset_field = "split"
    official_images_per_prompt = 4
    official_sampling = SamplingDefaults(20, 4.0, 64, "DDIMScheduler")  # the toy model's
    metrics = (
        Metric("binding_accuracy", help="share of images with every object in its own colour and shape, nothing else"),
        Metric("binding_accuracy_and", help="binding_accuracy of the prompts without a relation"),
        Metric("binding_accuracy_relation", help="binding_accuracy of the prompts with a relation"),
        Metric("relation_accuracy", help="share of relation images, both objects found, whose relation holds"),
        Metric("full_accuracy", help="share of images with binding and relation right"),
        Metric("mean_score", help="mean oracle score (fraction of binding checks passed)"),
        Metric("prompts_with_a_correct_image", help="share of prompts with at least one correctly bound image"),
    ) + tuple(Metric(f"binding_errors.{kind}", higher_is_better=False, help=f"share of images with {meaning}")
              for kind, meaning in BINDING_ERRORS.items())

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.split not in SPLITS:  # here, so that a mistyped `toy:NAME` stops before any generation
            raise ValueError(f"toy split {self.split!r}; choose one of {', '.join(SPLITS)} (as in toy:held_out)")

    def prompts(self) -> list[BenchmarkPrompt]:
        return [BenchmarkPrompt(p.text) for p in self.subsample(prompts_of_split(self.split))]

    def data_version(self) -> dict[str, Any]:
        # The toy world is code (gors.core.toy.world): its prompts are told apart by the summary's prompts_sha256.
        return {"source": "gors.core.toy.world", "split": self.split}

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        details = row["details"]
        if "bound" not in details:
            raise ValueError(
                f"the toy score of {row['prompt']!r} has no binding verdict: it was written by an older "
                "toy_oracle. Delete the scores/ folder of this evaluation (or use a new output folder) to score again."
            )
        return {"correct": details["bound"], "relation_correct": details["relation_holds"],
                "all_correct": details["correct"], "reason": "; ".join(details["reasons"]),
                # None in scores written before the oracle named its errors: those still give every accuracy.
                "errors": details.get("errors")}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Shares of images, each in [0, 1]:

        - binding_accuracy: every object drawn with its own colour and shape, nothing else drawn
          (attribute binding, T2I-CompBench's colour and shape categories); also split into
          prompts without a relation (`_and`) and with one (`_relation`);
        - relation_accuracy: of the relation prompts' images with both objects found, those whose
          relation holds (0.5 is chance for a model that ignores the relation word);
        - full_accuracy: binding and relation both right;
        - prompts_with_a_correct_image: prompts with at least one image whose binding is right;
        - mean_score: the mean oracle score (by default the fraction of binding checks passed);
        - binding_errors: for each kind of `rewards.toy_rules.BINDING_ERRORS`, the share of images
          with it (an image can have several); None for scores that predate them.
        """
        correct = np.array([row["correct"] for row in rows], dtype=float)
        relation = np.array([ToyPrompt.parse(row["prompt"]).relation is not None for row in rows])
        judged = [row["relation_correct"] for row in rows if row["relation_correct"] is not None]
        by_prompt: dict[Any, list[float]] = {}
        for row, ok in zip(rows, correct):
            # A prompt is its index (the bootstrap renumbers a prompt drawn twice); hand-made rows may lack one.
            by_prompt.setdefault(row.get("prompt_index", row["prompt"]), []).append(ok)
        return {
            "binding_accuracy": float(correct.mean()),
            "binding_accuracy_and": float(correct[~relation].mean()) if (~relation).any() else None,
            "binding_accuracy_relation": float(correct[relation].mean()) if relation.any() else None,
            "relation_accuracy": float(np.mean(judged)) if judged else None,
            "full_accuracy": float(np.mean([row["all_correct"] for row in rows])),
            "mean_score": float(np.mean([row["score"] for row in rows])),
            "prompts_with_a_correct_image": float(np.mean([max(v) for v in by_prompt.values()])),
            "binding_errors": error_shares([row.get("errors") for row in rows]),
            "num_images": len(rows),
            "num_prompts": len(by_prompt),
            "split": self.split,
        }


def error_shares(errors: list[list[str] | None]) -> dict[str, float] | None:
    """For each kind of `BINDING_ERRORS`, the share in [0, 1] of images whose error list names it;
    None when any image has no error list (scored before the oracle named its errors)."""
    if not errors or any(kinds is None for kinds in errors):
        return None
    return {kind: sum(kind in kinds for kinds in errors) / len(errors) for kind in BINDING_ERRORS}
