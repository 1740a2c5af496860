"""Paper configurations for each T2I-CompBench category, and GORS on GenEval-style prompts;
`recipes/gors_<name>.py` call these."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from gors.cli import TRAINING_INTERRUPTED, expected_errors, parse_config, quiet_dependency_warnings
from gors.config import Derived, RunConfig
from gors.core.io import check_folder_path, first_missing, make_folder, remove_folder_holding_only
from gors.core.paper import CATEGORIES, GORS_GLOBAL_BATCH


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
        # The category's (a --config file may change it) and whether unbiased: no run replaces another's LoRA.
        "output_dir": Derived("runs/gors_<category>, + _unbiased with --unbiased",
                              lambda values: f"runs/gors_{values['category'] or category}"
                                             f"{'_unbiased' if values['unbiased'] else ''}"),
        # The paper's 2 per GPU x 8 GPUs, on any number of GPUs that divides it (accumulating on fewer).
        "global_batch_size": GORS_GLOBAL_BATCH,
    }


@expected_errors(TRAINING_INTERRUPTED)  # one line `error: ...` and exit status 2, as in `gors`
def run_recipe(category: str, argv: Sequence[str] | None = None) -> RunConfig:
    """Parse overrides on top of the category's paper defaults and run the whole GORS loop."""
    quiet_dependency_warnings()
    script = f"recipes/gors_{category}.py"
    config = parse_config(RunConfig, argv, defaults=recipe_defaults(category), prog=script)
    from gors.run import run  # here, not above: `--help` answers without importing torch and diffusers

    run(config, command=script)
    return config


# The recipe's training prompts, written into the run folder on first use.
GENEVAL_TRAIN_PROMPTS = "geneval:train"
GENEVAL_TRAIN_FILE = "geneval_train_prompts.jsonl"
GENEVAL_TRAIN_SEED = 0
# No published tau exists for graded GenEval scores. 0.7 keeps every GenEval-correct sample (1.0)
# and the near misses of the tags with finer credit: color_attr with one wrong colour (0.75);
# counting one object short (0.75, 0.83, 0.88 for 2, 3, 4 asked) or one too many of 3 or 4 (0.75,
# 0.8; of 2: 0.67, dropped). On two_object, colors and position (2 or 3 credits) one miss falls to
# 0.5 or 0.67: only correct images pass. Untested in training: a starting point, not a finding.
GENEVAL_TAU = 0.7


def geneval_recipe_defaults() -> dict[str, Any]:
    """GORS on GenEval-style prompts: SD-2-base (the paper's base, as in the other recipes),
    `GENEVAL_TRAIN_PROMPTS`, the `geneval_graded` reward and GenEval as validation. Its tau,
    `GENEVAL_TAU`, is set after parsing, where no selection flag is given (`geneval_recipe_config`)."""
    return {
        "train_prompts": GENEVAL_TRAIN_PROMPTS,
        "reward": "geneval_graded",
        "validation_benchmark": "geneval",
        "output_dir": "runs/gors_geneval",
        "global_batch_size": GORS_GLOBAL_BATCH,
    }


def with_geneval_train_prompts(config: RunConfig) -> RunConfig:
    """`config`, its `GENEVAL_TRAIN_PROMPTS` replaced by `<output_dir>/geneval_train_prompts.jsonl`:
    700 GenEval-style prompts (seed 0) sharing no combination with GenEval's test prompts
    (`evaluators.geneval_train_prompts`), written when the file is missing, kept when it exists (a
    resumed run trains on the prompts it started with). Other `--train_prompts` pass unchanged."""
    if config.train_prompts != GENEVAL_TRAIN_PROMPTS:
        return config
    from evaluators.geneval_train_prompts import DEFAULT_NUM_PROMPTS, generate_train_prompts, write_train_prompts

    path = Path(config.output_dir) / GENEVAL_TRAIN_FILE
    if not path.is_file():  # every process writes the same bytes atomically
        check_folder_path(config.output_dir, "--output_dir")
        prompts = generate_train_prompts(DEFAULT_NUM_PROMPTS, GENEVAL_TRAIN_SEED)  # reads GenEval's: before the folder
        write_train_prompts(make_folder(config.output_dir, "--output_dir") / GENEVAL_TRAIN_FILE, prompts)
    return replace(config, train_prompts=str(path))


def geneval_recipe_config(argv: Sequence[str] | None = None, prog: str = "recipes/gors_geneval.py",
                          write_prompts: bool = True) -> RunConfig:
    """The GenEval recipe's config: overrides on top of `geneval_recipe_defaults`, training prompts in place
    (`write_prompts=False`: still `GENEVAL_TRAIN_PROMPTS`, for `with_geneval_train_prompts`)."""
    config = parse_config(RunConfig, argv, defaults=geneval_recipe_defaults(), prog=prog)
    # A default, not a parser default: --select_top_fraction or --tau_schedule replace it.
    if config.reward_threshold is None and config.select_top_fraction is None and config.tau_schedule is None:
        config = replace(config, reward_threshold=GENEVAL_TAU)
    return with_geneval_train_prompts(config) if write_prompts else config


@expected_errors(TRAINING_INTERRUPTED)
def run_geneval_recipe(argv: Sequence[str] | None = None) -> RunConfig:
    """Parse overrides on top of the GenEval recipe's defaults and run the whole GORS loop."""
    quiet_dependency_warnings()
    script = "recipes/gors_geneval.py"
    config = geneval_recipe_config(argv, prog=script, write_prompts=False)
    folder = Path(config.output_dir).absolute()
    created, made = not folder.exists(), first_missing(folder)
    config = with_geneval_train_prompts(config)
    from gors.run import run  # here, not above: `--help` answers without importing torch and diffusers

    try:
        run(config, command=script)
    except BaseException:
        if created:  # a run refused before it began leaves no folder of the prompts alone, as `gors run` leaves none
            remove_folder_holding_only(folder, [GENEVAL_TRAIN_FILE], made)
        raise
    return config
