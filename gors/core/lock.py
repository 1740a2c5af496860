"""One writer per stage per run folder: `<folder>/.lock-<stage>`, held for the stage's whole duration.

Two commands that write the same stage of one folder at once would both do all the work and record
every sample twice, so the second is refused with the first one's identity. The lock is an OS file
lock (`fcntl.flock`, which the OS drops when its holder dies, however it dies) plus a JSON record
in the file (pid, host, stage, command line, start time) that only says who holds it. A record whose
file lock is free is stale (its holder was killed): it is taken over with a note.

The main process of a launch holds the stage's lock. Each other process holds a lock of its own,
`.lock-<stage>-process-<index>`, over the part files it appends to: a process of an earlier launch
that outlived it (its node's agent not yet stopped it) would otherwise append to the same part as
the retry's process of that index (a retry with fewer processes: its main process locks the shares
beyond its own). Every process of the launch stops with the same error when any lock is taken. A
lock file is kept after use (emptied): deleting it would let a process that opened the old file and
one that creates a new one both hold "the" lock.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import socket
import sys
import time
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import psutil

from gors.core.io import UNUSABLE_PATH, PathError, first_missing, make_folder, remove_folder_holding_only, unusable_path
from gors.core.logs import first_time

# The (folder, stage) locks the current call stack holds: a stage function called by a command that holds its
# lock (`gors run`'s generate, the CLI's) runs under it (`holds_stages`).
_HELD: ContextVar[frozenset[tuple[str, str]]] = ContextVar("gors_held_locks", default=frozenset())

F = TypeVar("F", bound=Callable[..., Any])


class LockError(RuntimeError):
    """The run folder's stage is being written by another command; the message names it."""


def lock_path(folder: str | Path, stage: str) -> Path:
    """The lock file of `stage` in `folder`."""
    return Path(folder) / f".lock-{stage}"


def process_lock_stage(stage: str, process_index: int) -> str:
    """The lock name (as `stage` is) of a non-main process's share of `stage`."""
    return f"{stage}-process-{process_index:05d}"


def _shares_beyond(folder: Path, stages: Sequence[str], num_processes: int) -> list[str]:
    """The lock names of shares in `folder` that no process of a launch of `num_processes` takes: those
    of an earlier launch with more processes, whose stray process would append to a part no one locks."""
    names = []
    for stage in stages:
        pattern = re.compile(re.escape(lock_path(folder, process_lock_stage(stage, 0)).name[:-5]) + r"(\d{5})")
        for path in folder.glob(".lock-*") if folder.is_dir() else ():
            match = pattern.fullmatch(path.name)
            if match and int(match.group(1)) >= num_processes:
                names.append(process_lock_stage(stage, int(match.group(1))))
    return sorted(names)


def describe_holder(record: dict) -> str:
    """A lock record in words: the command, its pid and host, since when."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["started"]))
    return f"`{record['command']}` (pid {record['pid']} on host {record['host']}, since {started})"


def holder_runs(record: dict) -> bool:
    """Whether the process a lock record of this host names still runs: its pid is taken by a process that
    started before the record was written. A pid the OS gave again to a later process after the holder was
    killed is not the holder's."""
    try:
        started = psutil.Process(record["pid"]).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process, of unknown start: the pid is all there is
        return True
    # The OS counts a process's start in clock ticks from a boot time kept to the second.
    return started <= record["started"] + 1.0


def _read_record(fd: int) -> dict | None:
    text = os.pread(fd, 1 << 16, 0).decode("utf-8", errors="replace")
    try:
        record = json.loads(text)
    except ValueError:  # empty (released, or its holder has not written it yet) or cut short
        return None
    return record if isinstance(record, dict) and {"command", "pid", "host", "started"} <= record.keys() else None


def lock_records(folder: str | Path) -> dict[str, dict]:
    """Stage -> the record in its lock file, for the stages of `folder` whose lock file holds one (a command
    holds it, or held it and was killed: the record alone cannot tell). Takes no lock: read beside a run."""
    records = {}
    for path in sorted(Path(folder).glob(".lock-*")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            record = _read_record(fd)
        finally:
            os.close(fd)
        if record is not None:
            records[path.name.removeprefix(".lock-")] = record
    return records


def _acquire(folder: Path, stage: str, command: str, note_stale: bool = True) -> int:
    """Lock `stage` of `folder` in this process; returns the open lock file, or raises LockError.
    `note_stale`: say when a dead holder's lock is taken over."""
    make_folder(folder, "--output_dir")  # every command that locks a folder takes it from --output_dir
    try:
        fd = os.open(lock_path(folder, stage), os.O_RDWR | os.O_CREAT, 0o644)
    except UNUSABLE_PATH as err:
        raise unusable_path(err, folder, "--output_dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_record(fd)
        os.close(fd)
        who = describe_holder(holder) if holder else "another command"
        raise LockError(f"{folder} is being written by {who}; wait for it or stop it. "
                        "A stale lock is taken over automatically.") from None
    stale = _read_record(fd) if note_stale else None
    # Once per folder and holder: a command takes several stages' locks, which the holder held alike.
    if stale and first_time("stale lock", str(folder), str(stale["pid"]), str(stale["host"])):
        print(f"note: {folder}: taking over the lock of {describe_holder(stale)}, which holds it no longer (it stopped, "
              "or this folder is a copy made while it ran)", file=sys.stderr)
    record = {"stage": stage, "command": command, "pid": os.getpid(), "host": socket.gethostname(),
              "argv": sys.argv, "started": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return fd


def _release(fd: int) -> None:
    # Emptied first: a record left behind would read as a stale lock to the next command.
    os.ftruncate(fd, 0)
    os.close(fd)  # drops the flock


def _acquire_all(held: ExitStack, folder: Path, stages: Sequence[str], command: str,
                 note_stale: bool = True) -> tuple[str, str] | None:
    """Take the locks of `stages`, each released by `held`; returns None, or the refusal as (kind, message)
    to tell every process."""
    try:
        for stage in stages:
            held.callback(_release, _acquire(folder, stage, command, note_stale))
    except (LockError, PathError) as err:
        return type(err).__name__, str(err)
    except OSError as err:  # e.g. a full or read-only disk: said to every process, none left waiting
        return "PathError", (f"--output_dir={str(folder)!r} cannot be locked: {err.strerror or err} "
                             f"on {err.filename or folder}; pass a folder you can write to")
    return None


def _raise(refusal: tuple[str, str] | None) -> None:
    if refusal is not None:
        kind, message = refusal
        raise (PathError if kind == "PathError" else LockError)(message)


@contextmanager
def run_folder_lock(folder: str | Path, stages: Sequence[str], command: str) -> Iterator[None]:
    """Hold the locks of `stages` in `folder` for the body, in every process of the launch.

    `command` names the holder in a refusal ("gors score"). The main process takes the locks and
    tells the others whether it got them: all raise the same `LockError` when one is held (or the
    same `PathError` when the folder cannot be made or written). With several processes it then checks that
    all of them see the folder (`check_shared_folder`), and every other process takes its own locks
    (`process_lock_stage`): a process of an earlier launch still writing that share stops all of this
    one, named. The locks are released when the body ends, however it ends (and by the OS when the
    process dies).
    """
    # Here, not at the top: `gors.cli` imports this module and stays light for `gors --help`.
    from accelerate.utils import broadcast_object_list, gather_object

    from gors.core.distributed import check_shared_folder, process_state

    state = process_state()
    # Made by this lock (with the parents from `made` on), if anything fails below.
    created = state.is_main_process and not Path(folder).exists()
    made = first_missing(Path(folder).absolute())
    with ExitStack() as held:
        refusal = None
        if state.is_main_process:
            refusal = _acquire_all(held, Path(folder), stages, command)
            # A retry with fewer processes: the shares only an earlier launch had are locked by the main one.
            if refusal is None:
                refusal = _acquire_all(held, Path(folder), _shares_beyond(Path(folder), stages, state.num_processes),
                                       command, note_stale=False)
        if state.num_processes > 1:
            refusal = broadcast_object_list([refusal])[0]
        _raise(refusal)
        if state.num_processes > 1:
            check_shared_folder(folder, state)
            # The main process said when it took over a dead launch's lock: its other processes' are no news.
            mine = None if state.is_main_process else _acquire_all(
                held, Path(folder), [process_lock_stage(stage, state.process_index) for stage in stages], command,
                note_stale=False)
            _raise(next((refusal for refusal in gather_object([mine]) if refusal is not None), None))
        token = _HELD.set(_HELD.get() | {(os.path.realpath(folder), stage) for stage in stages})
        try:
            yield
        except BaseException:
            # Registered last, so it runs first: while the locks are still held. Only the main process's lock files
            # are removed: another process's lock, held until it stops, keeps the folder (deleting a held lock would
            # let another command take it).
            if created:
                held.callback(remove_folder_holding_only, Path(folder).absolute(),
                              [lock_path(folder, stage).name for stage in stages], made)
            raise
        finally:
            _HELD.reset(token)
        # Released only when every process is done writing; after an error the launcher stops them all.
        # A body that ended the process group (a caller's own `accelerator.end_training()`; gors' commands
        # leave it to the process's exit) has passed its last barrier already: only the main process, which
        # holds the locks, still writes.
        import torch.distributed

        if state.num_processes == 1 or torch.distributed.is_initialized():
            state.wait_for_everyone()



@contextmanager
def holding(folder: str | Path, stages: Sequence[str], command: str) -> Iterator[None]:
    """`run_folder_lock` of the `stages` of `folder` that this call stack does not hold already: a stage run by
    a command that holds its lock (`gors run`, the CLI) takes none again, one a script calls takes it. As
    `run_folder_lock`, it is collective: call it on every process of a launch. A thread starts with an empty
    context, so a stage called from a thread of a holder takes the locks again (and is refused)."""
    held = _HELD.get()
    missing = [stage for stage in stages if (os.path.realpath(folder), stage) not in held]
    if not missing:
        yield
        return
    with run_folder_lock(folder, missing, command):
        yield


def check_run_folder(output_dir: str | Path, command: str) -> None:
    """Refuse a run folder that does not exist (a mistyped `--output_dir`) for `command`, which reads
    what earlier stages wrote there: before its lock would create the folder and leave it behind."""
    if not os.path.exists(output_dir):
        raise FileNotFoundError(f"--output_dir {output_dir}: no such run folder; `{command}` works on the folder of "
                                "a run that `gors generate` (or `gors run`) started: check the path")


def holds_stages(*stages: str, reads_run: bool = False) -> Callable[[F], F]:
    """A stage function `function(config, ...)` runs `holding` `stages` of `config.output_dir`, as `gors <stage>`
    does, also when a script calls it. `function.__name__` names the holder in a refusal (`gors generate`).
    `reads_run`: the stage reads what earlier ones wrote, so a folder that does not exist is refused
    (`check_run_folder`) rather than made by the lock."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def locked(config: Any, *args: Any, **kwargs: Any) -> Any:
            if reads_run:
                check_run_folder(config.output_dir, f"gors {function.__name__}")
            with holding(config.output_dir, stages, f"gors {function.__name__}"):
                return function(config, *args, **kwargs)

        return locked  # type: ignore[return-value]

    return decorate
