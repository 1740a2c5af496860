"""What each stage of a run cost: wall time, work done, throughput and peak memory, in `timings.json`.

`gors run` times each stage on the main process from its start until every process has finished
it, and counts the work that invocation did from the run folder (images generated, images
scored, images selected from, optimizer steps), so a resumed run reports the rate of the work it
actually did. The file keeps the latest invocation of each stage that did work, and every
invocation in `history`; `gors estimate` turns its rates into GPU-hours of a full run.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tabulate import tabulate

import gors
from gors.core.clock import StageMarks, listening
from gors.core.io import atomic_write_json, read_json

TIMINGS_FILE = "timings.json"
GIB = 2**30


@dataclass(frozen=True)
class StageTiming:
    """One invocation of one stage.

    Attributes:
        stage: "generate", "score", "select", "train", or "generate+score" (`--overlap_scoring`).
        seconds: wall time, start to the last process's end.
        setup_seconds: of `seconds`, the main process's one-off set-up before its first unit of work
            (loading the pipeline or reward model, building the trainer: `gors.core.clock`); 0 when
            the stage had nothing to do or marks no set-up.
        warmup_seconds: of `seconds`, what the main process's first batch or step (first two steps under
            CUDA graphs, the second recording them) took beyond the pace of the ones after it (CUDA kernels
            loaded on first use, autotuning, compiling); None where that pace is unknown (fewer than two
            batches or steps, three under CUDA graphs, or a gors before 0.2).
        wrapup_seconds: of `seconds`, the time after the main process's last batch or step: the last
            batch's writing, the final checkpoint, validation and LoRA, waiting for the other processes;
            None where unknown (as `warmup_seconds`).
        work: units done by this invocation (work already in the folder does not count).
        main_work: of `work`, the units the main process did itself (its share of the images; every step);
            None where the stage marks no batches (select) or in timings of a gors before it was recorded.
        wrapup_work: of `main_work`, the units done in the wrap-up: a last batch shorter than the others
            (`StageMarks.steady_last`), whose time is wrap-up too; 0 where none.
        unit: "images", "samples" or "steps".
        num_processes: processes (GPUs) the work was shared over.
        peak_gpu_memory_gib: the main process's peak allocated GPU memory during the stage; None off GPU.
        peak_rss_gib: the main process's peak resident memory since it started (the OS keeps no per-stage peak).
        device: the main process's device, e.g. "NVIDIA H100 80GB HBM3" or "cpu".
    """

    stage: str
    seconds: float
    work: int
    unit: str
    num_processes: int
    peak_gpu_memory_gib: float | None
    peak_rss_gib: float
    device: str
    setup_seconds: float = 0.0
    warmup_seconds: float | None = None
    wrapup_seconds: float | None = None
    main_work: int | None = None
    wrapup_work: int = 0

    @property
    def one_off_seconds(self) -> float:
        """Set-up, warm-up and wrap-up: what a longer run of the stage spends once."""
        return self.setup_seconds + (self.warmup_seconds or 0.0) + (self.wrapup_seconds or 0.0)

    @property
    def rate(self) -> float:
        """Units per second over all processes, set-up included (0 when no work was done)."""
        return self.work / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate_per_process(self) -> float:
        """Units per second of one process (one GPU), set-up included."""
        return self.rate / self.num_processes

    @property
    def work_rate(self) -> float:
        """Units per second over all processes without the one-off seconds and the units done in them: the pace
        `gors estimate` scales (0 when no work was done or no time was left)."""
        busy = self.seconds - self.one_off_seconds
        return max(self.work - self.wrapup_work * self.num_processes, 0) / busy if busy > 0 else 0.0


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _peak_rss_gib() -> float:
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (GIB if sys.platform == "darwin" else 2**20)


@contextmanager
def timed_stage(stage: str, unit: str, done: Callable[[], int] | None, accelerator: Accelerator,
                timings: list[StageTiming], resumable: bool = True,
                on_finish: Callable[[StageTiming], None] | None = None) -> Iterator[None]:
    """Time the body as `stage`; `done()` counts the stage's finished units in the run folder, read
    before (for a `resumable` stage, whose finished units are skipped) and after. `done=None`: the work is
    what the stage itself marked (`gors.core.clock.units_done`), for units every process counts alike
    (training's optimizer steps), where the folder may hold more than this run did (a checkpoint past
    --max_train_steps, kept from a longer training). Appends a `StageTiming` to `timings` when the body
    completes, and hands it to `on_finish` (e.g. to record it at once, so that a run stopped in a later
    stage keeps it)."""
    before = done() if resumable and done is not None else 0
    cuda = accelerator.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    start = time.perf_counter()
    with listening() as marks:
        yield
    accelerator.wait_for_everyone()
    end = time.perf_counter()
    if marks.done_before is not None:
        before = marks.done_before
    warmup, wrapup = warmup_and_wrapup(marks, end)
    timings.append(StageTiming(
        stage=stage,
        seconds=end - start,
        work=max(done() - before, 0) if done is not None else (marks.last[1] if marks.last is not None else 0),
        unit=unit,
        num_processes=accelerator.num_processes,
        peak_gpu_memory_gib=torch.cuda.max_memory_allocated(accelerator.device) / GIB if cuda else None,
        peak_rss_gib=_peak_rss_gib(),
        device=_device_name(accelerator.device),
        setup_seconds=marks.work_start - start if marks.work_start is not None else 0.0,
        warmup_seconds=warmup,
        wrapup_seconds=wrapup,
        main_work=marks.last[1] if marks.last is not None else None,
        wrapup_work=marks.last[1] - marks.steady_last()[1] if wrapup is not None else 0,
    ))
    if on_finish is not None:
        on_finish(timings[-1])


def warmup_and_wrapup(marks: StageMarks, end: float) -> tuple[float | None, float | None]:
    """A stage's warm-up (its first `marks.warmup_units` units' seconds beyond the pace of the units after them,
    >= 0) and wrap-up (from its last full batch to `end`: `StageMarks.steady_last`), from its marks; (None, None)
    without full batches after the warm-up to give a pace."""
    last = marks.steady_last()
    if marks.work_start is None or marks.first is None or last is None or last[1] <= marks.first[1]:
        return None, None
    (first_time, first_units), (last_time, last_units) = marks.first, last
    pace = (last_time - first_time) / (last_units - first_units)  # seconds per unit after the warm-up
    return max(first_time - marks.work_start - first_units * pace, 0.0), end - last_time


def write_timings(output_dir: str | Path, timings: list[StageTiming], settings: dict[str, Any]) -> Path:
    """Merge this invocation's stage timings into `<output_dir>/timings.json` (main process only).

    `settings`: what the rates depend on (steps, resolution, batch sizes, model, reward), recorded
    with each invocation so that `gors estimate` can scale them.
    """
    path = Path(output_dir) / TIMINGS_FILE
    try:
        record = read_timings(path) or {"stages": {}, "history": []}
    except ValueError as err:  # the run's work is done: keep the unreadable file aside, not the run's result
        path.replace(path.with_name(path.name + ".bad"))
        print(f"warning: {err}; moved it to {path.name}.bad and started a new one", file=sys.stderr)
        record = {"stages": {}, "history": []}
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for timing in timings:
        entry = asdict(timing) | {"rate": timing.rate, "rate_per_process": timing.rate_per_process,
                                  "finished": when, "settings": settings}
        record.setdefault("history", []).append(entry)
        if timing.work > 0:  # a stage that found everything done measured nothing
            record["stages"][timing.stage] = entry
    record["gors_version"] = gors.__version__
    atomic_write_json(path, record)
    return path


def read_timings(path: str | Path) -> dict[str, Any] | None:
    """A `timings.json` (a run folder or the file itself); None when there is none, a ValueError
    naming the file when it is no timings file."""
    path = Path(path)
    path = path / TIMINGS_FILE if path.is_dir() else path
    if not path.is_file():
        return None
    what = f"a {TIMINGS_FILE} that `gors run` wrote"
    record = read_json(path, what)
    if not (isinstance(record, dict) and isinstance(record.get("stages"), dict)
            and all(isinstance(entry, dict) for entry in record["stages"].values())):
        raise ValueError(f"{path}: not a timings file (no 'stages' mapping); expected {what}")
    return record


def format_timings(timings: list[StageTiming]) -> str:
    """A table of this invocation's stages, for the end of `gors run`: "rate" is the work over the wall
    time, set-up included; "work rate" the work over the wall time without the one-off seconds (set-up,
    the first batch's warm-up and the wrap-up after the last; both rates over all processes)."""
    headers = ["stage", "wall s", "one-off s", "work", "unit", "rate /s (incl. set-up)", "work rate /s",
               "per process /s (incl. set-up)", "peak GPU GiB", "peak RSS GiB"]
    # Columns sized to the longest cell ("generate+score"); no peak GPU memory off GPU shows as "-".
    # A stage that did nothing this time (a finished rerun) has no rate: "-", not 0.00.
    body = [[t.stage, t.seconds, t.one_off_seconds, t.work, t.unit, *((t.rate, t.work_rate, t.rate_per_process)
                                                                     if t.work else (None, None, None)),
             t.peak_gpu_memory_gib, t.peak_rss_gib] for t in timings]
    return tabulate(body, headers=headers, tablefmt="simple", floatfmt=(None, ".1f", ".1f", None, None, ".2f", ".2f",
                                                                        ".2f", ".1f", ".1f"), missingval="-")
