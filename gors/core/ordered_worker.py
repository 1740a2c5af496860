"""One function run on a worker thread over the items handed to it, in the order given, with at most
`max_pending` items waiting, so that the caller goes on with the next one meanwhile.

Generation hands each batch of images to one (`gors.core.sampling`): while the GPU denoises the next
batch, the worker PNG-encodes, hashes and fsyncs this one, which PIL, hashlib and the file system do
without holding the GIL. The items are processed exactly as a loop in the caller would, one after the
other, so files and records come out the same.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

_DONE = object()  # the queue's end marker
logger = logging.getLogger(__name__)


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
        self._raise_error()
        while True:
            try:
                self._queue.put(item, timeout=1.0)
                return
            except queue.Full:  # a worker that failed empties the queue and stops: look again
                self._raise_error()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        while self._thread.is_alive():
            try:
                self._queue.put(_DONE, timeout=1.0)
                break
            except queue.Full:
                continue
        self._thread.join()
        if error is None:
            self._raise_error()
        elif self._error is not None and self._error is not error:
            logger.warning("%s also failed: %s", self._thread.name, self._error)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _DONE:
                self._work(item)
        except BaseException as error:  # handed to the caller by `put` or on leaving the block
            self._error = error
            with contextlib.suppress(queue.Empty):  # unblock a caller waiting on a full queue
                while True:
                    self._queue.get_nowait()
