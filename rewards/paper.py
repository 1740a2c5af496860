"""Which reward the GORS paper trains each T2I-CompBench category with, biased and unbiased, and its tau.

Biased GORS rewards the category's own evaluation metric; GORS-unbiased rewards a different model,
so that a gain on the benchmark cannot come from gaming its metric. The toy world (category `toy`)
joins the paper's tables here with its own reward pair and taus; `gors.core.paper` keeps the
paper's facts only.
"""

from __future__ import annotations

from gors.core import paper
from gors.core.prompts import TOY_CATEGORY

# The paper's tables (`gors.core.paper`), plus the toy world's pair: its exact oracle is the
# metric, and a CNN that never sees the oracle's rules is the unbiased reward.
METRIC_REWARD: dict[str, str] = {**paper.METRIC_REWARD, TOY_CATEGORY: "toy_oracle"}
UNBIASED_REWARD: dict[str, str] = {**paper.UNBIASED_REWARD, TOY_CATEGORY: "toy_classifier"}
DEFAULT_REWARD = "b_vqa"

# The toy world's tau per reward, for every prompt: the two rewards' scales differ, so each has its
# own (the paper's tau is per category, whichever reward). The oracle scores the fraction of binding
# checks passed, so 0.99 keeps exactly the images with every binding right. The classifier gives
# correct renders about 0.95 and swapped ones about 0; 0.9 rather than 0.5 was chosen on the
# validation split of the train prompts (docs/toy_world_results.md).
TOY_THRESHOLDS: dict[str, float] = {METRIC_REWARD[TOY_CATEGORY]: 0.99, UNBIASED_REWARD[TOY_CATEGORY]: 0.9}
THRESHOLD_CATEGORIES = (*paper.CATEGORIES, TOY_CATEGORY)  # the categories with a default tau


def resolve_reward(reward: str | None, unbiased: bool, category: str | None) -> str:
    """The `--reward` value a run uses.

    An explicit `reward` wins; `unbiased` then must be off. Without one, the category's metric
    (or, with `unbiased`, its unbiased reward); b_vqa when there is no category.
    """
    if reward is not None:
        if unbiased:
            raise ValueError(
                f"--reward={reward!r} (given, or set by a recipe or a --config file) and --unbiased both choose the "
                "reward; give one of them (--unbiased picks the paper's unbiased reward for --category)."
            )
        return reward
    table = UNBIASED_REWARD if unbiased else METRIC_REWARD
    if category is None:
        if unbiased:
            raise ValueError(
                "--unbiased needs a category to choose the reward for: pass --category "
                f"({', '.join(UNBIASED_REWARD)}) or name the reward with --reward."
            )
        return DEFAULT_REWARD
    if unbiased and category in paper.ALL_CATEGORIES and category not in table:
        raise ValueError(f"--unbiased: the paper has no unbiased reward for {category} prompts (only for "
                         f"{', '.join(paper.UNBIASED_REWARD)}); name the reward with --reward")
    if category not in table:
        raise ValueError(f"Unknown category {category!r}; known: {', '.join(table)}")
    return table[category]


def toy_threshold(reward: str) -> float:
    """The toy world's tau in [0, 1) for `reward` (a `--reward` value): 0.99 for toy_oracle, 0.9 for toy_classifier."""
    if reward not in TOY_THRESHOLDS:
        known = ", ".join(f"{name} {tau}" for name, tau in TOY_THRESHOLDS.items())
        raise ValueError(f"No toy tau for reward {reward!r} (the toy taus: {known}); pass --reward_threshold.")
    return TOY_THRESHOLDS[reward]


# Rewards on whose scale a category's tau keeps no sample: the paper's non-spatial tau (0.75) read on its
# metric, CLIPScore's raw cosine, which for an image and its prompt lies around 0.2-0.4 (docs/rewards.md).
TAU_ABOVE_SCALE: dict[tuple[str, str], str] = {
    ("non_spatial", "clip_score"): "CLIPScore's raw cosine, about 0.2-0.4 for an image and its prompt",
}


def check_tau_on_scale(category: str, reward: str) -> None:
    """Refuse, before any image is generated, selecting by `reward` with `category`'s tau where that tau is
    above the reward's scale (`TAU_ABOVE_SCALE`): every sample would be generated and scored, then none kept."""
    scale = TAU_ABOVE_SCALE.get((category, reward))
    if scale is not None:
        tau = min(paper.SELECTION_THRESHOLDS[category])
        raise ValueError(f"the paper's {category} tau ({tau}) is above what {reward} scores ({scale}), so no sample "
                         "would be kept after generating and scoring them all: pass --reward_threshold, or "
                         "--select_top_fraction (e.g. 0.25: each prompt's best quarter), or --unbiased")


def selection_threshold(category: str, reward: str, prompt_index: int) -> float:
    """GORS tau in [0, 1) for the `prompt_index`-th prompt (0-based) of a category's train prompts, selecting by `reward`.

    A T2I-CompBench category's tau is the paper's whichever the reward (`gors.core.paper.selection_threshold`);
    the toy category's is the reward's (`toy_threshold`).
    """
    if category == TOY_CATEGORY:
        if prompt_index < 0:
            raise ValueError(f"prompt_index must be >= 0, got {prompt_index}")
        return toy_threshold(reward)
    if category not in paper.SELECTION_THRESHOLDS:
        raise ValueError(f"No GORS threshold for category {category!r}; known categories: "
                         f"{', '.join(THRESHOLD_CATEGORIES)}. Pass --reward_threshold, or --category with one of "
                         "them to take its tau")
    return paper.selection_threshold(category, prompt_index)
