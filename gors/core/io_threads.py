"""File work on worker threads, overlapped with the device's: image files written while the next
batch generates (`OrderedWorker`), and read while the current batch scores (`prefetched`).

PIL's codecs, hashlib and the file system release the GIL, so the thread's work overlaps the caller's
(on a GPU, kernels it waits for). Either way the items are handled one after the other in the order
given, exactly as a loop in the caller would, so files, records and scores come out the same.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from gors.core.logs import own_work_logger

DONE = object()  # a worker queue's end marker
logger = own_work_logger(__name__)  # this process's threads
T = TypeVar("T")
U = TypeVar("U")


def finish(thread: threading.Thread, items: queue.Queue) -> None:
    """Hand a worker thread the end marker `DONE` after the items queued (waiting while its queue is full
    and it lives: one that failed stops taking items) and join it."""
    while thread.is_alive():
        try:
            items.put(DONE, timeout=1.0)
            break
        except queue.Full:
            continue
    thread.join()


class OrderedWorker:
    """`work(item)` for each `put(item)`, in order, on a thread of its own; a context manager.

    `put` blocks while `max_pending` items wait, and raises the worker's error (the exception `work`
    raised, itself) once it failed, so that the caller stops at its next item. Leaving the `with`
    block processes what is queued and joins the thread: normally raising the worker's error; when the
    block itself raises (an error, Ctrl-C), the worker still finishes the queued items, and its own
    error, if any, is logged, so that the block's is the one seen.
    """

    def __init__(self, work: Callable[[Any], None], name: str, max_pending: int = 1) -> None:
        self._work = work
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> OrderedWorker:
        self._thread.start()
        return self

    def put(self, item: Any) -> None:
        """Queue `item` for the worker, waiting while `max_pending` items wait; raises the worker's error."""
        self._raise_error()
        while True:
            try:
                self._queue.put(item, timeout=1.0)
                return
            except queue.Full:  # a worker that failed takes no more items: look again
                self._raise_error()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        finish(self._thread, self._queue)
        if error is None:
            self._raise_error()
        elif self._error is not None and self._error is not error:
            logger.warning("%s also failed: %s", self._thread.name, self._error)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not DONE:
                self._work(item)
        except BaseException as error:  # handed to the caller by `put` (which looks every second) or on leaving
            self._error = error


def prefetched(items: Iterable[T], load: Callable[[T], U], name: str, ahead: int = 1) -> Iterator[tuple[T, U]]:
    """(item, load(item)) for each item in order, `load` running on a thread up to `ahead` items before the
    caller: generation's scoring stage reads and decodes the next batch's images while the reward scores
    this one. An error of `load` is raised, itself, when the caller reaches its item; the items after it
    are not loaded. Leaving the loop early stops the thread after the item it is loading."""
    results: queue.Queue = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(value: Any) -> bool:
        """Queue `value` unless the caller has left; returns whether it was queued."""
        while not stop.is_set():
            try:
                results.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put((item, load(item))):
                    return
            put(DONE)
        except BaseException as error:  # raised on the caller's thread at this item
            put(error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while (result := results.get()) is not DONE:
            if isinstance(result, BaseException):
                raise result
            yield result
    finally:
        stop.set()
        thread.join()
