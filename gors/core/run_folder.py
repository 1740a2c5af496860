"""The layout of a run folder: where each stage reads and writes (see docs/run_folders.md, "Output layout")."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

SAMPLES_DIR = "samples"  # the sample store (`gors.core.store`)
SCORES_DIR = "scores"  # one sub-folder of score shards per reward
SELECTION_FILE = "selection.jsonl"
SELECTION_SUMMARY_FILE = "selection_summary.json"
CHECKPOINTS_DIR = "checkpoints"
# Written last into a checkpoint folder: a `checkpoint-<step>` folder without it is incomplete.
CHECKPOINT_MARKER = "checkpoint.json"
LATENT_CACHE_DIR = "latent_cache"
# The outputs of frozen text encoders over the selection's prompts (`--cache_text_embeddings`).
TEXT_EMBEDDING_CACHE_DIR = "text_embedding_cache"
BEST_DIR = "best"  # the best LoRA of --validation_benchmark (`gors.validation`)
BEST_FILE = "best.json"  # in BEST_DIR: whose best it is
ROUNDS_FILE = "rounds.json"  # online GORS: what each finished round did (`gors.rounds`)


def reward_key(reward: str) -> str:
    """A file-name-safe name for a reward spec (e.g. 'my.module:MyReward' -> 'my.module_MyReward')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", reward).strip("_")


def reward_column(reward: str) -> str:
    """The sample store's column of a reward's scores (`gors score` adds it): `reward_<reward_key>`."""
    return f"reward_{reward_key(reward)}"


def samples_dir(output_dir: str | Path) -> Path:
    """The run folder's sample store (`gors.core.store.SampleStore`), written by `gors generate`."""
    return Path(output_dir) / SAMPLES_DIR


def scores_dir(output_dir: str | Path, reward: str) -> Path:
    """Where `gors score` writes `reward`'s scores of the run's samples: one folder per reward spec."""
    return Path(output_dir) / SCORES_DIR / reward_key(reward)


def round_dir(output_dir: str | Path, index: int) -> Path:
    """Round `index`'s own run folder (samples, scores, selection, checkpoints, LoRA) in an online run."""
    return Path(output_dir) / f"round-{index:03d}"


def is_rounds_folder(output_dir: str | Path) -> bool:
    """Whether `output_dir` holds a --rounds run: its rounds file, or (stopped in round 0) its first round."""
    return (Path(output_dir) / ROUNDS_FILE).is_file() or round_dir(output_dir, 0).is_dir()


def best_folder(output_dir: str | Path) -> Path | None:
    """The folder of the best LoRA of validation, for a reader: `best/`, or the copy a publish that was
    interrupted between its two renames left aside (`.best.old`, which the training puts back); None
    without one. Readers never rename it back themselves: that is the training's to do."""
    for folder in (Path(output_dir) / BEST_DIR, Path(output_dir) / f".{BEST_DIR}.old"):
        if folder.is_dir():
            return folder
    return None


def in_numbered_order(paths: Iterable[Path]) -> list[Path]:
    """`paths` named alike but for a number (`checkpoints.previous-<n>`), by that number: 2 before 10."""
    return sorted(paths, key=lambda path: (len(path.name), path.name))
