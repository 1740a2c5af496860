"""When a stage's setup ends and its work begins, for the stage timings of `gors run`.

A stage's wall time holds one-off setup (loading the pipeline or the reward model, building the
trainer, caching latents) beside its work. `gors estimate` scales the work to a full run and
counts the setup once, so the stages say when their setup is over by calling `work_starts()`;
`gors.timings.timed_stage` listens through `listening()`. Outside a timed stage the call does
nothing. A stage whose work does not simply go on from what its folder held (training that
starts over, its old checkpoints set aside) also says where its work starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_marks: ContextVar[list[tuple[float, int | None]] | None] = ContextVar("gors_stage_work_starts", default=None)


def work_starts(done_before: int | None = None) -> None:
    """Mark now as the end of the current timed stage's setup (the first mark counts).

    `done_before`: the units of work finished before this stage's own (e.g. the step training
    starts from); by default, what the timed stage counted in the folder when it began.
    """
    marks = _marks.get()
    if marks is not None and not marks:
        marks.append((time.perf_counter(), done_before))


@contextmanager
def listening() -> Iterator[list[tuple[float, int | None]]]:
    """Collect the `work_starts` marks of the block: a list holding the first one's
    (`time.perf_counter()`, `done_before`), or empty when the block marked none (it had no work)."""
    marks: list[tuple[float, int | None]] = []
    token = _marks.set(marks)
    try:
        yield marks
    finally:
        _marks.reset(token)
