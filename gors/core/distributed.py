"""Small helpers for work split over Accelerate processes.

Each stage hands every process its share with `accelerator.split_between_processes(items)`:
contiguous slices whose sizes differ by at most one.

Processes started by a launcher (torchrun, which `accelerate launch --multi_gpu` runs) die with it:
torchrun starts each worker in its own session, so a launcher killed alone (SIGKILL, OOM killer)
would leave its workers writing into the run folder. `make_accelerator` and `process_state` start
that watch (`die_with_launcher`), and make gors' warnings speak once per launch (`gors.core.logs`).

A command ends its trackers when it ends, but the process group only when the process exits (`end_training`):
a script may run another command in the same launched processes, and torch cannot form a second default group
over a launcher's store.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
from accelerate import Accelerator, PartialState
from tqdm.auto import tqdm

import gors
from gors.core.logs import speak_once

T = TypeVar("T")

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_watching_launcher = False
_ending_group_at_exit = False
SHARED_CHECK_PREFIX = ".shared-check-"  # + host, pid and time of the command that checks
# How long another node may take to see a file the main process wrote (network filesystems publish
# new files with a delay); every stage relies on the same visibility after its barriers.
SHARED_CHECK_WAIT_S = 30.0
# What to do when processes disagree on a model's version, each read in its node's own Hugging Face cache
# (or its own copy of a local folder).
SAME_SNAPSHOT_FIX = ("Every node must resolve each model to the same snapshot: point HF_HOME at one shared cache, "
                     "or pin the revision; a local model folder must hold the same files on every node")
# Why a file other processes wrote is still missing here after the wait.
NOT_VISIBLE = ("every node must see one run folder at the same path (a shared filesystem such as NFS or Lustre); if "
               "it does, this node's view of it lags: rerun the same command, finished work is kept")


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
    accelerator = Accelerator(cpu=_cpu_only(), **kwargs)
    speak_once(accelerator.num_processes, accelerator.process_index)
    return accelerator


def end_training(accelerator: Accelerator) -> None:
    """`accelerator.end_training()` at the end of a command, but the process group is destroyed at the process's exit
    rather than now: another command of the same script (`gors.cli.main` or the stage functions, called twice under
    one `accelerate launch`) goes on in it. torch cannot form a second default group over torchrun's store: the new
    group's keys are the destroyed one's, and its processes connect to the old group's closed ports."""
    global _ending_group_at_exit
    for tracker in accelerator.trackers:
        tracker.finish()
    if not _ending_group_at_exit:
        _ending_group_at_exit = True
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def process_state() -> PartialState:
    """The process layout without an Accelerator, for stages that train nothing."""
    die_with_launcher()
    state = PartialState(cpu=_cpu_only())
    speak_once(state.num_processes, state.process_index)
    return state


def _sees(path: Path, token: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if path.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def check_shared_folder(folder: str | Path, state: PartialState, wait_s: float = SHARED_CHECK_WAIT_S) -> None:
    """Refuse, on every process, a run folder that some processes do not share with the main one.

    Each stage's main process writes files (prompts, settings, scores, checkpoints) that all
    processes read after a barrier, so every node must see one folder (a shared filesystem). On
    node-local folders a run would fail much later with a misleading "no samples" error; this fails
    at the start, naming the processes and hosts that could not see the folder. A collective call.
    """
    if state.num_processes == 1:
        return
    from accelerate.utils import broadcast_object_list, gather_object

    from gors.core.io import NotSharedError, PathError, atomic_write_bytes

    # Named per command: two commands checking one folder at once must not read each other's file.
    name = failure = None
    if state.is_main_process:
        name = f"{SHARED_CHECK_PREFIX}{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        try:
            atomic_write_bytes(Path(folder) / name, name.encode())
        except OSError as err:  # told to every process: the others would otherwise wait in the broadcast
            failure = (f"--output_dir={str(folder)!r} cannot be written: {err.strerror or err}; pass a folder "
                       "you can write to")
    name, failure = broadcast_object_list([name, failure])
    if failure is not None:
        raise PathError(failure)
    path = Path(folder) / name
    seen = state.is_main_process or _sees(path, name, wait_s)
    answers = gather_object([(state.process_index, socket.gethostname(), seen)])
    blind = [f"process {index} on {host}" for index, host, ok in answers if not ok]
    state.wait_for_everyone()
    if state.is_main_process:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    if blind:
        raise NotSharedError(
            f"{folder} is not shared by every process of this launch: {', '.join(blind)} cannot see what the main "
            f"process (on {answers[0][1]}) writes there. On several nodes, --output_dir must be on a filesystem "
            "every node mounts (NFS, Lustre, ...), at the same path."
        )


def main_process_decides(state: PartialState, decide: Callable[[], T]) -> T:
    """`decide()` run on the main process only, and its answer, or the error it raised, on every process.

    For decisions read from the run folder (which checkpoint to go on from): each process reading it
    for itself could see another state of a network filesystem and train from another step, which
    DDP does not notice until the processes wait at different barriers. A collective call.
    """
    if state.num_processes == 1:
        return decide()
    from accelerate.utils import broadcast_object_list

    answer = failure = None
    if state.is_main_process:
        try:
            answer = decide()
        except Exception as err:  # every process raises it, where the others would wait in the broadcast
            failure = _travelling(err)
    answer, failure = broadcast_object_list([answer, failure])
    if failure is not None:
        raise failure
    return answer


def every_process_tries(state: PartialState, attempt: Callable[[], T]) -> list[T]:
    """`attempt()` run on every process, and their answers in process order on every process; where one
    raised, every process raises the error of the first that did (its own, where it raised itself).

    For what each process finds out for itself (the largest micro-batch its device fits): one that
    raised alone would leave the others waiting in the gather. A collective call.
    """
    try:
        answer, failure = attempt(), None
    except Exception as err:
        answer, failure = None, err
    if state.num_processes > 1:
        from accelerate.utils import gather_object

        outcomes = gather_object([(answer, None if failure is None else _travelling(failure))])
    else:
        outcomes = [(answer, failure)]
    if failure is not None:
        raise failure
    first = next((error for _, error in outcomes if error is not None), None)
    if first is not None:
        raise first
    return [answer for answer, _ in outcomes]


def _travelling(err: Exception) -> Exception:
    """`err` where it pickles, to be sent to other processes; else a RuntimeError that tells its message."""
    try:
        pickle.dumps(err)
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err


def check_agreement(state: PartialState, values: dict[str, Any] | None, what: str, fix: str) -> None:
    """Refuse, on every process, `values` (name -> JSON-able value) that differ between processes.

    For what each process works out for itself but all must share (the commit of a model, read from each
    node's own Hugging Face cache): the error names each differing value, where each process (index and
    host) stands, then `fix`. A process with nothing to compare (None: it loaded no model, having no
    share of the work) is left out. A collective call.
    """
    if state.num_processes == 1:
        return
    from accelerate.utils import gather_object

    answers = [answer for answer in gather_object([(state.process_index, socket.gethostname(), values)])
               if answer[2] is not None]
    if len(answers) < 2:
        return
    first, host, reference = answers[0]
    differences = [f"{name} {reference.get(name)!r} on process {first} ({host}), {theirs.get(name)!r} on "
                   f"process {index} ({their_host})"
                   for index, their_host, theirs in answers[1:] for name in sorted(reference.keys() | theirs.keys())
                   if reference.get(name) != theirs.get(name)]
    if differences:
        raise RuntimeError(f"the processes of this launch do not agree on {what}: {'; '.join(differences)}. {fix}")


def wait_until_visible(read: Callable[[], T], complete: Callable[[T], bool], wait_s: float | None = None) -> T:
    """`read()` again until `complete(answer)`, for up to `wait_s` seconds (default `SHARED_CHECK_WAIT_S`);
    returns the last answer.

    For what other processes wrote before a barrier: a network filesystem may show it to this node a
    little later. The caller says what an answer still incomplete after the wait means.
    """
    deadline = time.monotonic() + (SHARED_CHECK_WAIT_S if wait_s is None else wait_s)
    answer = read()
    while not complete(answer) and time.monotonic() < deadline:
        time.sleep(0.5)
        answer = read()
    return answer


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
