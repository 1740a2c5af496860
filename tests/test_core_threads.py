import pytest
import torch

from gors.core.threads import torch_threads


def test_torch_threads_sets_the_count_for_the_block_and_restores_it_after_an_error():
    before = torch.get_num_threads()  # conftest's one thread
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(2):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


def test_torch_threads_refuses_a_count_below_one():
    with pytest.raises(ValueError, match="at least 1"):
        with torch_threads(0):
            pass
