"""Host-device copies that do not make the host wait for the device.

On a CUDA device, a copy from ordinary (pageable) host memory and every read of a device value on the
host (`.item()`, `.tolist()`, `.cpu()`) first wait until the device has run all the work queued before
them. Meanwhile the host queues nothing, so the device then idles while the host prepares the next
kernels. A training step made one such copy per micro-batch tensor and one read per logged loss; these
helpers queue the copies like kernels instead. Elsewhere (a CPU) they are plain copies.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor`, a host tensor, on `device`. To a CUDA device it goes through page-locked memory and is
    queued without waiting; torch's page-locked allocator keeps that block until the copy has run."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class HostValue:
    """A tensor's value copied to the host, the copy queued behind the device's work; `get()` waits for
    that copy alone, not for the work queued after it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        self._copied: torch.cuda.Event | None = None
        if tensor.device.type == "cuda":
            self._value = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._value.copy_(tensor, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(tensor.device))  # the stream the copy went on
        else:
            self._value = tensor.to("cpu", copy=True)

    def get(self) -> torch.Tensor:
        """The value, a host tensor."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._value
