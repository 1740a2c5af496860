"""`gors run`: generate -> score -> select -> train in one run folder, on one Accelerator."""

from __future__ import annotations

from accelerate import Accelerator

from gors.config import RunConfig
from gors.generate import generate
from gors.score import score
from gors.select import select
from gors.train import train, training_accelerator


def run_stages(config: RunConfig, accelerator: Accelerator) -> None:
    """generate -> score -> select -> train in one run folder, on the given Accelerator."""
    generate(config, accelerator)
    score(config, accelerator)
    select(config, write=accelerator.is_main_process)
    accelerator.wait_for_everyone()
    train(config, accelerator)


def run(config: RunConfig) -> None:
    """`gors run`: all four stages on one Accelerator set up for training."""
    accelerator = training_accelerator(config)
    run_stages(config, accelerator)
    accelerator.end_training()
