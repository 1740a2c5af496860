"""What every speed script shares: interleaved, repeated timing of a reference against gors, and its row.

Each comparison times the reference exactly as the official code runs it and gors' path on the
same inputs, alternating the two in one process (`paired_ratios`; `interleaved_ratios` for
several references), so that a slow spell of the machine hits all; the ratio reference / gors
of each repeat is kept, and the table reports their minimum and median with an agreement check of
the outputs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch


def machine(device: str) -> str:
    """The processor (or GPU) and the library versions the table was measured with."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()} kernels), {torch.get_num_threads()} threads"
    return f"{name}; torch {torch.__version__}, Python {platform.python_version()}"


def cpu_name() -> str:
    """The processor's model name where Linux states it, else its architecture: CPU ratios differ
    between processors (benchmarks/README.md), so a table names the one it was measured on."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def checked_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> torch.device:
    """`args.device`, after refusing (as a usage error) CUDA where there is none and `--repeats` (where the
    script has it) below 1."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here")
    if getattr(args, "repeats", 1) < 1:
        parser.error("--repeats must be >= 1")
    return device


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """(result, seconds) of one call, the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = function()
    synchronize(device)
    return result, time.perf_counter() - start


def refuse_halved(went_on_at: int | None, script: str, stated: str, fix: str) -> None:
    """Stop the script where gors halved a batch that did not fit the device (`gors.core.memory`): the timing
    would be of a smaller batch than the `stated` one its row reports. `went_on_at`: the size gors went on at
    (a `BatchLimit`'s size; None while nothing was halved); `fix`: what lowers the stated batch."""
    if went_on_at is not None:
        raise SystemExit(f"[{script}] out of device memory at {stated}: gors went on at {went_on_at}, so the timing "
                         f"would not be of the batch this script reports; {fix} and run it again")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (e.g. `--repeats`; 0 pairs would give no ratio)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def paired_ratios(reference: Callable[[], Any], gors: Callable[[], Any], device: torch.device, repeats: int,
                  warmup: int = 1) -> tuple[list[float], Any, Any]:
    """`repeats` ratios reference seconds / gors seconds, the two run alternately (the first of each
    pair alternating too), after `warmup` untimed calls of each; returns the ratios and the last outputs."""
    (ratios,), (reference_output,), gors_output = interleaved_ratios([reference], gors, device, repeats, warmup)
    return ratios, reference_output, gors_output


def interleaved_ratios(references: Sequence[Callable[[], Any]], gors: Callable[[], Any], device: torch.device,
                       repeats: int, warmup: int = 1) -> tuple[list[list[float]], list[Any], Any]:
    """`paired_ratios` for several references of one gors path: each repeat runs every reference and
    gors once, the order rotated by one per repeat (each comes first equally often when `repeats` is
    a multiple of the procedures), after `warmup` untimed calls of each; returns each reference's
    `repeats` ratios, their last outputs and gors' last."""
    calls = [*references, gors]
    for _ in range(warmup):
        for call in calls:
            call()
    ratios: list[list[float]] = [[] for _ in references]
    outputs: list[Any] = [None] * len(calls)
    for repeat in range(repeats):
        seconds = [0.0] * len(calls)
        for shift in range(len(calls)):
            k = (repeat + shift) % len(calls)
            outputs[k], seconds[k] = timed(calls[k], device)
        for k, reference_ratios in enumerate(ratios):
            reference_ratios.append(seconds[k] / seconds[-1])
    return ratios, outputs[:-1], outputs[-1]


@dataclass(frozen=True)
class SpeedResult:
    """One comparison: what was timed, on what sizes, the paired ratios and how well the outputs agree."""

    stage: str
    reference: str
    sizes: str
    ratios: list[float]
    agreement: str
    # The `gors estimate` stage (generate, score, train) whose official time this row's median prices, if any.
    prices: str | None = None
    # gors' per-process batch in a training row (its `cost_model.py` calibration must train at the same).
    batch: int | None = None

    @property
    def minimum(self) -> float:
        return min(self.ratios)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    def row(self) -> str:
        return (f"| {self.stage} | {self.reference} | {self.minimum:.2f}x / {self.median:.2f}x | {self.agreement} | "
                f"{self.sizes} |")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "min": self.minimum, "median": self.median}


TABLE_HEADER = ("| stage | reference procedure | gors vs reference (min / median) | agreement | sizes |\n"
                "|---|---|---|---|---|")


def print_table(results: list[SpeedResult]) -> None:
    """A script's rows under the shared header, as `python -m benchmarks` prints them all."""
    print(TABLE_HEADER)
    print("\n".join(result.row() for result in results))
