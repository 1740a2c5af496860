"""Torch's intra-op thread count, set for a block and restored after it."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run the block on `num_threads` intra-op threads (>= 1), then restore the caller's count,
    also when the block raises. Results of CPU kernels can depend on the count (summation order),
    so reproducible CPU jobs fix it; tiny models run fastest on one thread on a shared CPU."""
    if num_threads < 1:
        raise ValueError(f"num_threads is {num_threads}; it must be at least 1")
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
