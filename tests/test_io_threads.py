"""`gors.core.io_threads`: the worker threads that write generated batches while the next one denoises
(`OrderedWorker`) and read the next batch's images while this one scores (`prefetched`). Pure
threading, no models."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gors.core.io_threads import OrderedWorker, prefetched


def test_items_are_processed_in_order_while_the_caller_goes_on():
    done: list[int] = []
    release = threading.Event()

    def work(item: int) -> None:
        if item == 0:
            assert release.wait(10)  # the first item is slow to write
        done.append(item)

    with OrderedWorker(work, name="test-writer", max_pending=1) as worker:
        worker.put(0)
        worker.put(1)  # returns while item 0 is still being worked on: one item may wait
        assert done == []
        release.set()
        worker.put(2)
    assert done == [0, 1, 2]  # leaving the block waits for every item


def test_the_workers_error_stops_the_caller_at_its_next_item():
    done: list[int] = []
    full = OSError(28, "No space left on device")

    def work(item: int) -> None:
        if item == 1:
            raise full
        done.append(item)

    with pytest.raises(OSError) as raised:
        with OrderedWorker(work, name="test-writer") as worker:
            for item in range(100):
                worker.put(item)
    assert raised.value is full  # the error itself, so that the CLI's one-line handling of it applies
    assert done == [0]


def test_a_failed_worker_lets_no_more_items_in_than_the_queue_held():
    """A caller waiting on the full queue when the worker fails gets the error: the failed worker does not
    empty its queue to let one more item (a whole generated batch, never written) in."""
    given: list[int] = []
    release = threading.Event()

    def work(item: int) -> None:
        assert release.wait(10)
        raise OSError(28, "No space left on device")

    threading.Timer(0.5, release.set).start()  # fails while the caller waits to put item 2
    with pytest.raises(OSError):
        with OrderedWorker(work, name="test-writer", max_pending=1) as worker:
            for item in range(100):
                worker.put(item)
                given.append(item)
    assert given == [0, 1]  # 0 taken, 1 queued; 2 waited for room and met the error


def test_an_error_of_the_block_still_writes_what_is_queued_and_is_the_one_raised(caplog):
    done: list[int] = []

    def work(item: int) -> None:
        if item == 2:
            raise ValueError("disk gone")
        done.append(item)

    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        with OrderedWorker(work, name="test-writer", max_pending=3) as worker:
            for item in range(3):
                worker.put(item)
            raise KeyboardInterrupt
    assert done == [0, 1]  # the items handed over before Ctrl-C are written
    assert "test-writer also failed: disk gone" in caplog.text


def test_an_error_at_the_last_item_is_raised_on_leaving_the_block():
    def work(item: int) -> None:
        raise RuntimeError(f"item {item} failed")

    with pytest.raises(RuntimeError, match="item 0 failed"):
        with OrderedWorker(work, name="test-writer") as worker:
            worker.put(0)


def test_prefetched_loads_the_next_item_while_the_caller_holds_this_one():
    loaded: list[int] = []
    second_loaded = threading.Event()

    def load(item: int) -> str:
        loaded.append(item)
        if item == 1:
            second_loaded.set()
        return f"image {item}"

    seen = []
    for item, value in prefetched(range(3), load, name="test-reader"):
        if item == 0:
            assert second_loaded.wait(10)  # read ahead while item 0 is being scored
        seen.append((item, value))
    assert seen == [(0, "image 0"), (1, "image 1"), (2, "image 2")]
    assert loaded == [0, 1, 2]


def test_prefetched_raises_a_load_error_at_its_item_and_loads_nothing_after_it():
    loaded: list[int] = []
    corrupt = OSError("image 1: hash mismatch")

    def load(item: int) -> int:
        loaded.append(item)
        if item == 1:
            raise corrupt
        return item

    seen = []
    with pytest.raises(OSError) as raised:
        for item, _ in prefetched(range(5), load, name="test-reader"):
            seen.append(item)
    assert raised.value is corrupt and seen == [0] and loaded == [0, 1]


def test_leaving_a_prefetched_loop_early_stops_its_thread():
    loaded: list[int] = []
    for item, _ in prefetched(range(1000), lambda i: loaded.append(i), name="test-reader-early"):
        if item == 2:
            break
    assert not any(thread.name == "test-reader-early" for thread in threading.enumerate())
    assert len(loaded) <= 5  # the items handed over, the one queued ahead and the one loading


def test_leaving_the_block_waits_for_a_slow_last_item_and_raises_its_error():
    # Leaving joins the worker: the last batch is written (or its error raised) before the caller goes on.
    done: list[int] = []

    def slow(item: int) -> None:
        time.sleep(0.3)
        done.append(item)

    with OrderedWorker(slow, name="test-writer-slow") as worker:
        worker.put(0)
    assert done == [0]
    assert not any(thread.name == "test-writer-slow" for thread in threading.enumerate())

    def slow_failing(item: int) -> None:
        time.sleep(0.3)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        with OrderedWorker(slow_failing, name="test-writer-slow") as worker:
            worker.put(0)


def test_a_put_after_the_worker_failed_raises_at_once_even_with_room_in_the_queue():
    # The caller stops at its next item: not one more batch generated and queued for a worker that is gone.
    failed = threading.Event()

    def work(item: int) -> None:
        failed.set()
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        with OrderedWorker(work, name="test-writer", max_pending=4) as worker:
            worker.put(0)
            assert failed.wait(10)
            worker._thread.join(10)  # the worker has recorded its error and stopped; the queue has room
            with pytest.raises(OSError):
                worker.put(1)
            assert worker._queue.empty()


class _Stop(BaseException):
    """Not an Exception (as SystemExit or KeyboardInterrupt): it must still reach the caller."""


def test_an_error_that_is_no_exception_reaches_the_caller_too():
    def work(item: int) -> None:
        raise _Stop("stopped")

    with pytest.raises(_Stop):
        with OrderedWorker(work, name="test-writer") as worker:
            worker.put(0)

    def load(item: int) -> int:
        if item == 1:
            raise _Stop("stopped")
        return item

    seen = []
    with pytest.raises(_Stop):
        for item, _ in prefetched(range(3), load, name="test-reader"):
            seen.append(item)
    assert seen == [0]
