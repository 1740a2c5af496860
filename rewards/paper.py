"""Which reward the GORS paper trains each T2I-CompBench category with, biased and unbiased.

Biased GORS rewards the category's own evaluation metric; GORS-unbiased rewards a different model,
so that a gain on the benchmark cannot come from gaming its metric.
"""

from __future__ import annotations

from gors.core import paper

# The paper's tables (`gors.core.paper`), plus the toy world's pair: its exact oracle is the
# metric, and a CNN that never sees the oracle's rules is the unbiased reward.
METRIC_REWARD: dict[str, str] = {**paper.METRIC_REWARD, "toy": "toy_oracle"}
UNBIASED_REWARD: dict[str, str] = {**paper.UNBIASED_REWARD, "toy": "toy_classifier"}
DEFAULT_REWARD = "b_vqa"


def resolve_reward(reward: str | None, unbiased: bool, category: str | None) -> str:
    """The `--reward` value a run uses.

    An explicit `reward` wins; `unbiased` then must be off. Without one, the category's metric
    (or, with `unbiased`, its unbiased reward); b_vqa when there is no category.
    """
    if reward is not None:
        if unbiased:
            raise ValueError(
                f"--reward={reward!r} and --unbiased both choose the reward; give one of them "
                "(--unbiased picks the paper's unbiased reward for --category)."
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
    if category not in table:
        raise ValueError(f"Unknown category {category!r}; known: {', '.join(table)}")
    return table[category]
