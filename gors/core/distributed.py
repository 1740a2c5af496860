"""Small helpers for work split over Accelerate processes.

Each stage hands every process its share with `accelerator.split_between_processes(items)`:
contiguous slices whose sizes differ by at most one.

Processes started by a launcher (torchrun, which `accelerate launch --multi_gpu` runs) die with it:
torchrun starts each worker in its own session, so a launcher killed alone (SIGKILL, OOM killer)
would leave its workers writing into the run folder. `make_accelerator` and `process_state` start
that watch (`die_with_launcher`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any, Iterator, Sequence, TypeVar

import torch
from accelerate import Accelerator, PartialState
from tqdm.auto import tqdm

import gors

T = TypeVar("T")

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_watching_launcher = False


def _cpu_only() -> bool:
    # `accelerate launch --multi_gpu` (torchrun) on a machine without GPUs starts the processes but
    # does not tell them to use the CPU; without this they would each think they run alone.
    return not torch.cuda.is_available()


def started_by_launcher() -> bool:
    """Whether torchrun (or a launcher that sets its variables) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)  # the launcher is gone: stop as abruptly as a SIGKILL would (every write is atomic)


def die_with_launcher() -> None:
    """Under a launcher, end this process when the launcher dies; elsewhere (a plain `gors ...`, which
    may rightly outlive its shell under nohup) do nothing. Idempotent.

    Linux: the kernel sends SIGKILL on the parent's death (`prctl(PR_SET_PDEATHSIG)`); elsewhere a
    daemon thread polls the parent id every second. A launcher that died before this call (while
    Python started and imported torch) is caught by comparing the parent with the one seen when
    `gors` was first imported.
    """
    global _watching_launcher
    if _watching_launcher or not started_by_launcher():
        return
    _watching_launcher = True
    parent = gors.PARENT_AT_START  # read when gors was first imported, before torch
    try:
        if not sys.platform.startswith("linux"):
            raise OSError("PR_SET_PDEATHSIG is Linux-only")
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    except (OSError, AttributeError):
        threading.Thread(target=_watch_parent, args=(parent,), name="gors-die-with-launcher", daemon=True).start()
    if os.getppid() != parent:  # it died before the kernel was told to watch
        os.kill(os.getpid(), signal.SIGKILL)


def make_accelerator(**kwargs: Any) -> Accelerator:
    """An `Accelerator` that also forms a process group on CPU-only machines (gloo)."""
    die_with_launcher()
    return Accelerator(cpu=_cpu_only(), **kwargs)


def process_state() -> PartialState:
    """The process layout without an Accelerator, for stages that train nothing."""
    die_with_launcher()
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
