"""Copies of a run folder's parts for tests that train on a shared, read-only fixture run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TRAINING_INPUTS = ("samples", "scores", "selection.jsonl")  # what `gors train` reads from a selected run


def copy_selected_run(selected_run: Any, destination: Path) -> Path:
    """`destination` holding the training inputs of `selected_run` (a config whose output_dir was selected)."""
    for name in TRAINING_INPUTS:
        source = Path(selected_run.output_dir) / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, destination / name)
    return destination
