"""Out of device memory: batches that shrink until they fit, and errors that say what to change.

torch's out-of-memory error names the bytes it could not allocate but not the flag that sets them.
Generation and scoring, whose batch size changes no image and no score beyond float rounding
(every image has its own seed; a reward scores each image for itself), halve a batch that does not
fit and go on, so that a large `--generation_batch_size` comes down to a batch that fits, the
largest of its halvings (`in_batches_that_fit`); a `BatchLimit` kept across calls (a training run's
validations, which meet the same models in memory each time) starts each call at the size that last fit.
Training, whose batch is part of what it learns, stops with a message that names its flags
(`out_of_memory_advice`); with `--auto_train_batch_size` it tries its micro-batch sizes once before the
first step (`largest_that_fits` of `micro_batch_sizes`) and trains at the largest that fit.
Every stage writes as it goes and resumes, so the same command with other values goes on from there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from gors.core.logs import own_work_logger

logger = own_work_logger(__name__)  # this process's device
T = TypeVar("T")

# What to do when one item does not fit: the stage's own advice goes before it.
MORE_MEMORY = "run the same command again on a device with more memory or with its other processes stopped"
# Under `gors run --overlap_scoring` the pipeline and the reward share the device.
DROP_OVERLAP = "drop --overlap_scoring (the pipeline and the reward share the device)"


# How CUDA libraries other than torch's allocator say that they ran out of memory: as a plain RuntimeError.
LIBRARY_OUT_OF_MEMORY = ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA error: out of memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` says the device ran out of memory: torch's allocator's error, or cuDNN's or cuBLAS's failure
    to allocate their workspace."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and any(text in str(err) for text in LIBRARY_OUT_OF_MEMORY))


class DeviceMemoryError(RuntimeError):
    """The device ran out of memory in a stage; the message names the stage and what lowers its memory."""


def _error(doing: str, advice: str, err: RuntimeError) -> DeviceMemoryError:
    detail = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
    return DeviceMemoryError(f"out of device memory while {doing}: {advice}. What was finished is kept (torch: {detail})")


@contextlib.contextmanager
def out_of_memory_advice(doing: str, advice: str) -> Iterator[None]:
    """Raise torch's out-of-memory error met while `doing` as a `DeviceMemoryError` that gives `advice`
    (what to change and how to go on, e.g. "pass --gradient_checkpointing (...)")."""
    try:
        yield
    except RuntimeError as err:
        if not is_out_of_memory(err):
            raise
        raise _error(doing, advice, err) from err


@dataclass
class BatchLimit:
    """The largest batch size that fit the device where a smaller one was needed; None while nothing was halved.

    Handed to `in_batches_that_fit` call after call, it starts each call at that size instead of failing
    again at the size asked for; a speed script reads it to refuse timings of a batch other than its own.
    """

    size: int | None = None

    def start(self, size: int) -> int:
        """The size a call asked to run at `size` starts at."""
        return size if self.size is None else min(size, self.size)


@dataclass
class BatchLimits:
    """The limits of an evaluation's two batched stages, kept across evaluations (`Benchmark.evaluate`)."""

    generation: BatchLimit = field(default_factory=BatchLimit)
    scoring: BatchLimit = field(default_factory=BatchLimit)


def in_batches_that_fit(items: Sequence[T], size: int, work: Callable[[list[T]], None], doing: str, unit: str,
                        flag: str | None, at_one: str, limit: BatchLimit | None = None) -> int:
    """`work` on consecutive batches of `items`, at most `size` long, in order; returns the size that fit.

    A batch that runs the device out of memory is tried again at half the size (a warning names `flag`,
    the option that sets the size, so the next run starts there), down to one item; at one item it is a
    `DeviceMemoryError` that gives `at_one`. `work` must run its device work before any side effect, so
    that a batch that ran out of memory left nothing behind. `doing` and `unit` word the messages:
    "generating 512 px images", "images per pipeline call". `limit`, where given, lowers `size` to the
    size that fit in an earlier call and records each halving.
    """
    if limit is not None:
        size = limit.start(size)
    start = 0
    while start < len(items):
        batch = list(items[start:start + size])
        try:
            work(batch)
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
            if len(batch) == 1:
                raise _error(f"{doing} one at a time", at_one, err) from err
        else:
            start += len(batch)
            continue
        # Out of the handler, the error's frames and the tensors they hold are released.
        smaller = size // 2
        while smaller >= len(batch):  # a short last batch: not the same batch again
            smaller //= 2
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.warning("out of device memory while %s at %d %s: going on at %d%s", doing, size, unit, smaller,
                       f" (pass {flag} {smaller} to start there)" if flag else "")
        size = smaller
        if limit is not None:
            limit.size = size
    return size


def micro_batch_sizes(share: int) -> list[int]:
    """The micro-batch sizes that split `share` samples into whole micro-batches, tried largest first: `share`,
    then the largest divisor of it at most half the size before, down to 1 (16: 16, 8, 4, 2, 1; 12: 12, 6, 3, 1)."""
    sizes = [share]
    while sizes[-1] > 1:
        sizes.append(max(d for d in range(1, sizes[-1] // 2 + 1) if share % d == 0))
    return sizes


def largest_that_fits(sizes: Sequence[int], attempt: Callable[[int], None], doing: str) -> int | None:
    """The first of `sizes` (largest first) at which `attempt(size)` does not run the device out of memory;
    None when none does. `attempt` must leave nothing behind, whether it fits or not; a warning names each
    size that did not fit ("while `doing` at 16")."""
    for size in sizes:
        try:
            attempt(size)
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
        else:
            return size
        # Out of the handler, the error's frames and the tensors they hold are released.
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.warning("out of device memory while %s at %d", doing, size)
    return None
