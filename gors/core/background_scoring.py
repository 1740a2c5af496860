"""Scoring overlapped with generation: each finished batch of images is scored on a second thread
while the pipeline generates the next.

The generation loop hands every batch it has written to the store to `BackgroundScorer.add`; a
worker thread scores the images in the order they came, in batches of the reward's batch size,
and appends the rows to the process's score part, exactly as `gors score` would. On a fresh run
the images arrive in the order `gors score` would take them, so the batches, and the scores, are
the same as scoring after generation (tested). The images are scored from memory: a PNG is
lossless, so they are the pixels `gors score` would read back.

What it buys: the reward model's kernels run while the denoiser's do (on a GPU on a stream of
their own), and the PNG decode of a separate scoring pass is gone. What it costs: both models in
memory at once. A queue of `max_pending` batches bounds the images held; when the reward is the
slower of the two, generation waits for it.

Resumable as the stages are: an image is in the store before it is queued, and a row is appended
only once its batch is scored, so after a crash `gors score` (the next stage of `gors run`)
scores whatever has no row yet.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from gors.core.io_threads import DONE, finish
from gors.core.logs import own_work_logger
from gors.core.memory import DROP_OVERLAP, MORE_MEMORY
from gors.core.scoring import (
    Scorer,
    append_scores,
    build_checked_reward,
    score_part,
    scorer_commits,
)
from gors.core.store import SampleKey, same_image, sample_key

logger = own_work_logger(__name__)  # this process's scoring thread


class BackgroundScorer:
    """Scores the images of a generation loop on a worker thread (see the module docstring).

    Args:
        scores_folder: the score folder, already made ready by `gors.core.scoring.open_score_folder`.
        make_reward: builds the reward; called by `open`, on the calling thread, so that a reward
            that cannot be built fails before the first image is generated.
        batch_size: images per reward call.
        process_index: which score part this process appends to.
        device: the reward's device; on CUDA the worker runs on a stream of its own.
        prompt_metadata: per-prompt metadata merged under each record (see `score_rows`).
        done: the rows already in the folder, by sample key (`open_score_folder`'s); a sample with a row
            of its image file is not scored again, one generated anew since is.
        max_pending: generation batches that may wait for the worker before `add` blocks.
        batch_flag: the flag that sets `batch_size`, named when a batch does not fit the device (it is then
            halved: `gors.core.scoring.append_scores`).
    """

    def __init__(self, scores_folder: Path, make_reward: Callable[[], Scorer], batch_size: int,
                 process_index: int, device: torch.device, prompt_metadata: Sequence[dict[str, Any]] | None = None,
                 done: Mapping[SampleKey, dict] | None = None, max_pending: int = 2,
                 batch_flag: str | None = None) -> None:
        self.out_file = score_part(scores_folder, process_index)
        self.make_reward = make_reward
        self.batch_size = batch_size
        self.batch_flag = batch_flag
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # accelerate names a single process's GPU plain "cuda"; the worker thread's `set_device` needs the
            # index, which is this (the calling) thread's current device.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.prompt_metadata = prompt_metadata
        if done is not None and not isinstance(done, Mapping):
            raise TypeError("done: the rows already scored, by sample key (`open_score_folder`'s), not a set of keys")
        self.done = dict(done or {})
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_raised = False
        self._stopped = threading.Event()
        self.model_commits: dict[str, str | None] = {}

    def open(self) -> None:
        """Build the reward and start the worker; generation calls it once this process has work."""
        if self._thread is not None:
            return
        reward = build_checked_reward(self.out_file.parent, self.make_reward, bool(self.done))
        self.model_commits = scorer_commits(reward)
        self._thread = threading.Thread(target=self._work, args=(reward,), name="gors-background-scoring",
                                        daemon=True)
        self._thread.start()

    def add(self, records: Sequence[dict[str, Any]], images: Sequence[Image.Image]) -> None:
        """Queue a batch that is in the store (records with their `path`); blocks while the queue is full.

        Raises the worker's error, if it failed, so that generation stops at the next batch. After
        `stop`, the batch is left to the score stage.
        """
        self._raise_worker_error()
        if self._thread is None:
            raise RuntimeError("BackgroundScorer.add before open()")
        while not self._stopped.is_set():
            try:
                self._queue.put((list(records), list(images)), timeout=1.0)
                return
            except queue.Full:  # a worker that died leaves the queue full: look again
                self._raise_worker_error()

    def stop(self) -> None:
        """Take no more batches: generation failed or was interrupted (`abandon` follows), so an `add`
        waiting for room on the writer's thread returns at once, its batch scored by the score stage."""
        self._stopped.set()

    def close(self) -> None:
        """Score what is queued, stop the worker, and raise its error if it failed (and `add` did not)."""
        if self._thread is None:
            return
        finish(self._thread, self._queue)
        self._thread = None
        self._raise_worker_error()

    def abandon(self) -> None:
        """Stop the worker without scoring what is still queued (the score stage scores it on the
        rerun): after generation failed or was interrupted, its error is the one to see, so the
        worker's own error, if any, is logged rather than raised."""
        if self._thread is None:
            return
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        try:
            self.close()
        except Exception as err:  # of any kind: the interrupt or generation's error is the one raised
            logger.warning("%s", err)

    def _raise_worker_error(self) -> None:
        if self._error is not None and not self._error_raised:
            self._error_raised = True
            message = (f"scoring overlapped with generation failed: {self._error}. The images generated so far are in "
                       f"the store and every finished score row in {self.out_file}; fix the cause and rerun: only "
                       "what is missing is generated and scored.")
            # Of the worker's own kind, so that an expected error (a bad reward's output) stays one line; a disk
            # error is recognised by its cause's errno (`gors.cli`).
            try:
                error = type(self._error)(message)
            except Exception:  # a kind that takes other arguments
                error = RuntimeError(message)
            raise error from self._error

    def _work(self, reward: Scorer) -> None:
        records: list[dict[str, Any]] = []
        images: list[Image.Image] = []
        try:
            if self.device.type == "cuda":  # a new thread starts on GPU 0: this process's GPU, for code assuming it
                torch.cuda.set_device(self.device)
            stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream(self.device))  # the weights copied on the default stream
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                while True:
                    item = self._queue.get()
                    finished = item is DONE
                    if not finished:
                        for record, image in zip(*item, strict=True):
                            row = self.done.get(sample_key(record))
                            if row is None or not same_image(row, record):
                                records.append(record)
                                images.append(image)
                    while len(records) >= self.batch_size or (finished and records):
                        batch, records = records[: self.batch_size], records[self.batch_size :]
                        batch_images, images = images[: self.batch_size], images[self.batch_size :]
                        self.batch_size = append_scores(
                            reward, batch, batch_images, self.out_file, self.prompt_metadata, self.batch_size,
                            self.batch_flag, f"{DROP_OVERLAP}, or {MORE_MEMORY}")
                    if finished:
                        return
        except BaseException as err:  # handed to the generation thread by `add` (which looks every second) or `close`
            self._error = err
