"""The speed scripts: they time the batch they report (where gors would halve a batch that does not
fit the device, `gors.core.memory`, the script stops instead of printing a ratio of another batch
size), interleave their procedures, and their references run as the official code does."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    """`importlib.import_module` with benchmarks/ on the path (the scripts import each other as top-level modules)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module
    finally:
        sys.path[:] = [entry for entry in sys.path if entry != str(BENCHMARKS)]


@pytest.fixture(scope="module")
def generation(scripts):
    return scripts("generation")


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


def test_interleaved_ratios_rotate_the_procedures_and_divide_by_gors(scripts, monkeypatch):
    common = scripts("common")
    order: list[str] = []
    seconds = {"share": 6.0, "mini": 3.0, "gors": 2.0}

    def clock(function, device):
        name = function()
        order.append(name)
        return f"{name} output", seconds[name]

    monkeypatch.setattr(common, "timed", clock)
    procedures = [lambda: "share", lambda: "mini"]
    ratios, outputs, output = common.interleaved_ratios(procedures, lambda: "gors", torch.device("cpu"), repeats=3,
                                                        warmup=0)
    assert order == ["share", "mini", "gors", "mini", "gors", "share", "gors", "share", "mini"]
    assert ratios == [[3.0] * 3, [1.5] * 3]
    assert outputs == ["share output", "mini output"] and output == "gors output"
    order.clear()
    pair, reference, ours = common.paired_ratios(procedures[0], lambda: "gors", torch.device("cpu"), 2, warmup=0)
    assert order == ["share", "gors", "gors", "share"] and pair == [3.0, 3.0]  # two procedures alternate
    assert reference == "share output" and ours == "gors output"


def test_warm_up_calls_run_every_procedure_untimed(scripts, monkeypatch):
    common = scripts("common")
    calls: list[str] = []

    def clock(function, device):
        calls.append("timed")
        return function(), 1.0

    monkeypatch.setattr(common, "timed", clock)
    procedures = [lambda: calls.append("share"), lambda: calls.append("mini")]
    ratios, _, _ = common.interleaved_ratios(procedures, lambda: calls.append("gors"), torch.device("cpu"),
                                             repeats=1, warmup=2)
    assert calls == ["share", "mini", "gors"] * 2 + ["timed", "share", "timed", "mini", "timed", "gors"]
    assert ratios == [[1.0], [1.0]]


def test_mllm_cot_s_minigpt4_reference_runs_the_vision_tower_once_per_image(scripts, tmp_path):
    """MiniGPT-4-CoT's procedure (the image encoded once, every turn generated from scratch) gives the
    answers of the ShareGPT4V-CoT procedure (vision in every turn) with one vision pass instead of one per turn."""
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    from gors.testing.qwen3_vl import build_tiny_qwen3_vl

    mllm_cot = scripts("mllm_cot")
    model_dir = build_tiny_qwen3_vl(tmp_path / "tiny", seed=0)
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (64, 80, 3), dtype=np.uint8))
    questions = ["Describe the image.", "Rate it from 0 to 100.", "And the colours?"]
    eos = [processor.tokenizer.eos_token_id]
    passes = []
    model.model.visual.register_forward_hook(lambda module, inputs, output: passes.append(inputs[0].shape))

    every_turn = mllm_cot.official_conversation(model, processor, image, questions, 6, eos)
    assert len(passes) == 3
    passes.clear()
    once = mllm_cot.official_conversation(model, processor, image, questions, 6, eos, vision_once=True)
    assert len(passes) == 1
    assert once == every_turn and len(once) == 3
