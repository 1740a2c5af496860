"""`gors run`: generate -> score -> select -> train in one run folder, on one Accelerator."""

from __future__ import annotations

from accelerate import Accelerator

from gors.config import RunConfig
from gors.core.lock import run_folder_lock
from gors.generate import generate
from gors.score import score
from gors.select import select
from gors.train import train, training_accelerator

STAGES = ("generate", "score", "select", "train")


def run_stages(config: RunConfig, accelerator: Accelerator, command: str = "gors run") -> None:
    """generate -> score -> select -> train in one run folder, on the given Accelerator.

    The folder's four stage locks are held throughout, so that no `gors <stage>` on the same folder
    interleaves with the run; `command` names this run in the refusal such a command gets.
    """
    with run_folder_lock(config.output_dir, STAGES, command):
        generate(config, accelerator)
        score(config, accelerator)
        select(config, write=accelerator.is_main_process)
        accelerator.wait_for_everyone()
        train(config, accelerator)


def run(config: RunConfig, command: str = "gors run") -> None:
    """`gors run`: all four stages on one Accelerator set up for training."""
    accelerator = training_accelerator(config)
    run_stages(config, accelerator, command)
    accelerator.end_training()
