"""Paper configurations for each T2I-CompBench category; `recipes/gors_<category>.py` call these."""

from __future__ import annotations

from typing import Any, Sequence

from gors.cli import expected_errors, parse_config
from gors.config import RunConfig
from gors.core.paper import CATEGORIES


def recipe_defaults(category: str) -> dict[str, Any]:
    """The paper's GORS run for `category`: SD-2-base, the category's train prompts, reward and tau.

    The reward is the category's T2I-CompBench metric (`rewards.paper.METRIC_REWARD`); `--unbiased`
    swaps in the paper's unbiased reward and `--reward` any other.
    """
    if category not in CATEGORIES:
        raise ValueError(f"Unknown category {category!r}; known: {', '.join(CATEGORIES)}")
    return {
        "train_prompts": category,
        "category": category,
        "output_dir": f"runs/gors_{category}",
    }


@expected_errors()  # one line `error: ...` and exit status 2, as in `gors`
def run_recipe(category: str, argv: Sequence[str] | None = None) -> RunConfig:
    """Parse overrides on top of the category's paper defaults and run the whole GORS loop."""
    script = f"recipes/gors_{category}.py"
    config = parse_config(RunConfig, argv, defaults=recipe_defaults(category), prog=script)
    from gors.run import run  # here, not above: `--help` answers without importing torch and diffusers

    run(config, command=script)
    return config
