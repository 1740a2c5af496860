"""When a stage's set-up ends, its first batch is done and its last, for the stage timings of `gors run`.

A stage's wall time holds one-off costs beside its work: set-up before the first batch (loading
the pipeline or the reward model, building the trainer, caching latents), the first batch's
warm-up (CUDA kernels loaded on first use, autotuning, `torch.compile`'s compiling) and the
wrap-up after the last (the final checkpoint and LoRA). `gors estimate` scales the steady pace in
between to a full run and counts the rest once, so the stages say when their set-up is over
(`work_starts()`) and when each batch or step is done (`units_done()`); `gors.timings.timed_stage`
listens through `listening()`. Outside a timed stage, and inside `untimed()` (validation's batches
within training), the calls do nothing. A stage whose work does
not simply go on from what its folder held (training that starts over, its old checkpoints set
aside) also says where its work starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class StageMarks:
    """The marks of one timed stage (`time.perf_counter()` seconds).

    Attributes:
        work_start: when the set-up ended, None if the stage marked none (it had no work).
        done_before: units finished before the stage's own work, None for what its folder held.
        first, last: (time, units done so far) at the end of the first `warmup_units` units (or the first
            `units_done` before that) and at the latest `units_done`, None before one.
        previous: the mark before `last`, and `previous_batch` the units of the batch that it ended.
        warmup_units: the units whose end starts the pace (1; 2 where the second unit also records, as CUDA
            graphs do).
    """

    work_start: float | None = None
    done_before: int | None = None
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None
    previous: tuple[float, int] | None = None
    previous_batch: int = 0
    warmup_units: int = 1

    def steady_last(self) -> tuple[float, int] | None:
        """Where the steady pace ends: the latest mark, or the one before it where the last batch was shorter
        than the one before (a share's remainder, which runs at another pace per unit and, compiled, compiles
        anew): that batch is wrap-up, as the work after the last full batch."""
        if self.last is not None and self.previous is not None \
                and self.last[1] - self.previous[1] < self.previous_batch:
            return self.previous
        return self.last


_marks: ContextVar[StageMarks | None] = ContextVar("gors_stage_marks", default=None)


def work_starts(done_before: int | None = None, warmup_units: int = 1) -> None:
    """Mark now as the end of the current timed stage's setup (the first mark counts).

    `done_before`: the units of work finished before this stage's own (e.g. the step training
    starts from); by default, what the timed stage counted in the folder when it began.
    `warmup_units`: how many of the first units are warm-up, not the pace (>= 1): a training step whose
    denoiser replays as CUDA graphs compiles and warms up in its first step and records in its second.
    """
    marks = _marks.get()
    if marks is not None and marks.work_start is None:
        marks.work_start, marks.done_before, marks.warmup_units = time.perf_counter(), done_before, warmup_units


def units_done(done: int) -> None:
    """Mark now as the end of a batch or step of the current timed stage, `done` units of its own work
    finished so far (images of this process, optimizer steps); the host's clock, not synchronised with
    the device: each mark is as far ahead of the device's work as the queue of launched kernels."""
    marks = _marks.get()
    if marks is not None and marks.work_start is not None:
        if marks.last is not None:
            marks.previous_batch = marks.last[1] - (marks.previous[1] if marks.previous is not None else 0)
        marks.previous, marks.last = marks.last, (time.perf_counter(), done)
        if marks.first is None or marks.first[1] < marks.warmup_units:
            marks.first = marks.last


@contextmanager
def listening() -> Iterator[StageMarks]:
    """Collect the marks of the block."""
    marks = StageMarks()
    token = _marks.set(marks)
    try:
        yield marks
    finally:
        _marks.reset(token)


@contextmanager
def untimed() -> Iterator[None]:
    """A block whose batches are not the timed stage's work (validation inside training generates and
    scores images): its `work_starts` and `units_done` calls are not recorded."""
    token = _marks.set(None)
    try:
        yield
    finally:
        _marks.reset(token)
