"""The speed scripts time the batch they report: where gors would halve a batch that does not fit the
device (`gors.core.memory`), the script stops instead of printing a ratio of another batch size."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def generation():
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import each other as top-level modules
    try:
        yield importlib.import_module("generation")
    finally:
        sys.path[:] = [entry for entry in sys.path if entry != str(BENCHMARKS)]


def test_the_generation_script_stops_where_gors_would_halve_its_batch(generation, monkeypatch):
    import gors.core.sampling

    generators = gors.core.sampling.cpu_generators

    def at_most_four(seeds):
        if len(seeds) > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return generators(seeds)

    arguments = ["--repeats", "1", "--steps", "2"]
    (result,) = generation.measure(arguments)
    assert len(result.ratios) == 1  # at the stated batch it times and compares
    monkeypatch.setattr(gors.core.sampling, "cpu_generators", at_most_four)
    with pytest.raises(SystemExit, match=r"\[generation\] out of device memory at gors' batch of 8 images: gors went "
                                         r"on at 4, so the timing would not be of the batch this script reports; "
                                         r"lower --resolution"):
        generation.measure(arguments)
