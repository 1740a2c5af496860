"""Out of device memory, said as what to change.

torch's out-of-memory error names the bytes it could not allocate but not the flag that sets them.
A stage that knows which of its flags sizes its memory (the images per pipeline or reward call, the
samples per micro-batch) turns the error into one that names it, so the CLI prints one line. Every
stage writes as it goes and resumes, so the same command with a smaller value goes on from there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class DeviceMemoryError(RuntimeError):
    """The device ran out of memory in a stage; the message names the stage and what lowers its memory."""


@contextlib.contextmanager
def out_of_memory_advice(doing: str, advice: str | None) -> Iterator[None]:
    """Raise torch's out-of-memory error met while `doing` as a `DeviceMemoryError` that gives `advice`
    (an imperative clause, e.g. "lower --generation_batch_size"); with `advice` None, as it is."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        if advice is None:
            raise
        detail = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
        raise DeviceMemoryError(f"out of device memory while {doing}: {advice}, and run the same command again; what "
                                f"was finished is kept (torch: {detail})") from err
