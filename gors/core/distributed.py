"""Small helpers for work split over Accelerate processes.

Each stage hands every process its share with `accelerator.split_between_processes(items)`:
contiguous slices whose sizes differ by at most one.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence, TypeVar

import torch
from accelerate import Accelerator, PartialState
from tqdm.auto import tqdm

T = TypeVar("T")


def _cpu_only() -> bool:
    # `accelerate launch --multi_gpu` (torchrun) on a machine without GPUs starts the processes but
    # does not tell them to use the CPU; without this they would each think they run alone.
    return not torch.cuda.is_available()


def make_accelerator(**kwargs: Any) -> Accelerator:
    """An `Accelerator` that also forms a process group on CPU-only machines (gloo)."""
    return Accelerator(cpu=_cpu_only(), **kwargs)


def process_state() -> PartialState:
    """The process layout without an Accelerator, for stages that train nothing."""
    return PartialState(cpu=_cpu_only())


def batches(items: Sequence[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items, the last one possibly shorter (`itertools.batched` needs Python 3.12)."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def progress_bar(total: int, accelerator: Accelerator, desc: str) -> tqdm:
    """A bar on the main process only; it counts the main process's share of the work.

    Not `accelerate.utils.tqdm`: that one shows a bar on the first process of every node, and
    neither says that the count is one process's share.
    """
    suffix = f" (process 0 of {accelerator.num_processes})" if accelerator.num_processes > 1 else ""
    return tqdm(total=total, desc=desc + suffix, disable=not accelerator.is_main_process, dynamic_ncols=True)


def reset_process_state() -> None:
    """Forget Accelerate's process-wide state, to start another independent run in the same Python
    process (tests, notebooks); a new Accelerator may then use other settings."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
