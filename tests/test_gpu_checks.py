"""`benchmarks/gpu_checks.py` (the GPU session's checks of CUDA-only paths) on the CPU, without its
CUDA parts, so that the script a short GPU lease runs is known to work before it gets there."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_checks import check_copies_without_syncs, check_deferred_lr_decision, check_fused_lora_layers


def test_the_copy_check_passes_off_cuda():
    assert check_copies_without_syncs(torch.device("cpu")).startswith("values exact")


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_deferred_lr_decision_check_passes_with_a_cpu_loss_scaler():
    result = check_deferred_lr_decision(torch.device("cpu"))
    assert result.startswith("learning rates [1.0, 0.9, 0.9, 0.8, 0.7, 0.7] with overflows at")


def test_the_fused_lora_check_passes_in_bf16_on_the_cpu():
    result = check_fused_lora_layers(torch.device("cpu"))
    assert result.startswith("joint cast equal to a cast per weight bit for bit") and "bfloat16 steps" in result
