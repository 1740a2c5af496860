"""Host-device copies (`gors.core.transfer`) off a CUDA device: plain copies with the same values.
(On a GPU, `benchmarks/train_step.py --device cuda` counts the training step's synchronisations.)"""

from __future__ import annotations

import torch

from gors.core.transfer import HostValue, to_device


def test_to_device_off_cuda_is_a_plain_copy():
    tensor = torch.arange(6.0).view(2, 3)
    moved = to_device(tensor[torch.tensor([1, 0])], torch.device("cpu"))
    assert moved.device.type == "cpu" and torch.equal(moved, torch.tensor([[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]))


def test_a_host_value_keeps_the_value_it_was_given():
    loss = torch.tensor(0.25, requires_grad=True) * 2
    held = HostValue(loss)
    with torch.no_grad():
        loss.add_(1.0)  # the training goes on with the tensor; the logged value is the one held
    assert held.get().item() == 0.5 and not held.get().requires_grad
