"""gors' warnings under several processes: said once per launch, or by each process about its own work.

Most warnings (a model's note, a store made by an older gors) are the same on every process: under a
multi-process launch only the main process says them, and every process its errors (`speak_once`, which
`gors.core.distributed.make_accelerator` and `process_state` run). A warning about one process's own work
(its device's memory, the part files and threads it writes with) comes from a logger that
`own_work_logger` made: every process says its own, starting `process N:`. One process alone: nothing
changes. A warning about one thing (a file, a folder, a name) is said once per process (`first_time`).
"""

from __future__ import annotations

import logging

# The packages whose loggers speak once per launch.
PACKAGES = ("gors", "rewards", "evaluators")
_own_work: set[str] = set()
_process: int | None = None  # this process's index, once `speak_once` found several
_said: set[tuple[object, ...]] = set()


class _NameProcess(logging.Filter):
    """Starts a record's message with `process N: `."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"process {self.index}: {record.msg}"
        return True


def first_time(*key: object) -> bool:
    """Whether this process meets `key` (a kind of warning, then what it is about) for the first time: a
    warning said at every meeting (each stage's lock, each read of a file) is said once."""
    if key in _said:
        return False
    _said.add(key)
    return True


def own_work_logger(name: str) -> logging.Logger:
    """The logger `name` (a module's `__name__`, or a child of it) for warnings about this process's own work."""
    logger = logging.getLogger(name)
    _own_work.add(name)
    if _process is not None:  # made after `speak_once`
        _speak_for_itself(logger, _process)
    return logger


def speak_once(num_processes: int, process_index: int) -> None:
    """Under several processes, let process 0 alone log the packages' warnings, every process its errors and,
    naming itself, its own work's warnings. Idempotent."""
    global _process
    if num_processes == 1:
        return
    _process = process_index
    if process_index != 0:
        for name in PACKAGES:
            logging.getLogger(name).setLevel(logging.ERROR)
    for name in _own_work:
        _speak_for_itself(logging.getLogger(name), process_index)


def _speak_for_itself(logger: logging.Logger, index: int) -> None:
    if index != 0:  # not its package's ERROR; on process 0 the level stays the user's
        logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _NameProcess) for f in logger.filters):
        logger.addFilter(_NameProcess(index))
