"""`gors evaluate --lora_dropout`: sampling with dropout on the LoRA's output, as T2I-CompBench's
`inference_eval.py` samples the official checkpoints (lora_diffusion's p = 0.1 left active)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gors.core.pipeline import LoraOutputDropout, cpu_generators, load_pipeline, pipeline_settings


@pytest.fixture(scope="module")
def lora_dir(tiny_sd_lora) -> Path:
    return tiny_sd_lora.parent


def images(pipeline, seeds=(3, 4)) -> np.ndarray:
    out = pipeline(prompt=["a red circle", "a blue square"], num_inference_steps=2, height=32, width=32,
                   generator=cpu_generators(list(seeds)), output_type="np")
    return out.images


def test_the_lora_output_is_dropped_and_rescaled_and_the_base_output_kept(tiny_sd, lora_dir):
    from peft.tuners.lora import LoraLayer

    pipeline = load_pipeline(str(tiny_sd), torch.device("cpu"), lora=str(lora_dir))
    layer = next(m for m in pipeline.unet.modules() if isinstance(m, LoraLayer))
    adapter = next(iter(layer.lora_B))
    x = torch.randn(64, layer.base_layer.in_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = layer.base_layer(x)
        delta = layer.lora_B[adapter](layer.lora_A[adapter](x)) * layer.scaling[adapter]
        LoraOutputDropout(pipeline, 0.25)
        change = layer(x) - base
    kept = change.abs() > 0
    # Each element of the LoRA's output is either dropped or kept at 1 / (1 - p) of its value.
    torch.testing.assert_close(change[kept], delta[kept] / 0.75)
    assert 0.2 < 1 - kept.float().mean().item() < 0.3  # about p of them dropped
    assert delta.abs().min() > 0  # so a zero is a drop, not a zero LoRA output


def test_sampling_with_dropout_is_reproducible_per_seed_and_recorded(tiny_sd, lora_dir):
    plain = load_pipeline(str(tiny_sd), torch.device("cpu"), lora=str(lora_dir))
    dropped = load_pipeline(str(tiny_sd), torch.device("cpu"), lora=str(lora_dir), lora_dropout=0.1)
    assert isinstance(dropped, LoraOutputDropout) and dropped.unet is dropped.pipeline.unet
    first, again = images(dropped), images(dropped)
    np.testing.assert_array_equal(first, again)  # the masks follow the call's seeds
    assert np.abs(first - images(plain)).max() > 1e-3  # and they change the images
    assert np.abs(first - images(dropped, seeds=(5, 4))).max() > 1e-3
    # Each image's masks are its own (its seed and prompt): the same image alone in a call, whatever shares its batch.
    for index, (prompt, seed) in enumerate([("a red circle", 3), ("a blue square", 4)]):
        alone = dropped(prompt=[prompt], num_inference_steps=2, height=32, width=32, generator=cpu_generators([seed]),
                        output_type="np").images[0]
        assert np.abs(alone - first[index]).max() < 1e-5, prompt
    # The same seed under two prompts (T2I-CompBench's 42 + n for every prompt) draws other masks.
    same_seed = images(dropped, seeds=(3, 3))
    masks = dropped._seeds
    assert masks[0] != masks[1] and np.abs(same_seed[0] - first[0]).max() < 1e-5
    settings = pipeline_settings(str(tiny_sd), torch.float32, lora=str(lora_dir), lora_dropout=0.1)
    assert settings["lora_dropout"] == 0.1 and settings["lora_dropout_masks"] == "per image and prompt"
    assert "lora_dropout" not in pipeline_settings(str(tiny_sd), torch.float32, lora=str(lora_dir))
    with pytest.raises(ValueError, match="without a LoRA"):
        load_pipeline(str(tiny_sd), torch.device("cpu"), lora_dropout=0.1)
    plain.fuse_lora()  # a merged LoRA's output never passes lora_B at sampling: refused, not silently undropped
    with pytest.raises(ValueError, match="merged, DoRA or embedding"):
        LoraOutputDropout(plain, 0.1)


@pytest.mark.parametrize(("flags", "message"), [
    (["--lora", "x", "--lora_dropout", "1"], "--lora_dropout=1.0: must be in [0, 1)"),
    (["--lora_dropout", "0.1"], "--lora_dropout=0.1 without --lora"),
    (["--lora", "x", "--lora_dropout", "0.1", "--torch_compile", "inductor"], "break the compiled graph"),
])
def test_bad_dropout_flags_are_refused(flags, message, capsys, tmp_path):
    from gors.cli import main

    with pytest.raises(SystemExit):
        main(["evaluate", "--output_dir", str(tmp_path / "eval"), *flags])
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "eval").exists()  # refused before any work


def test_an_evaluation_with_dropout_records_it(tiny_sd, lora_dir, tmp_path):
    from gors.config import EvaluateConfig
    from gors.evaluate import evaluate

    config = EvaluateConfig(pretrained_model_name_or_path=str(tiny_sd), lora=str(lora_dir), lora_dropout=0.1,
                            benchmarks="toy", max_prompts=2, images_per_prompt=1, num_inference_steps=2, resolution=32,
                            output_dir=str(tmp_path), columns="none")
    evaluate(config)
    assert json.loads((tmp_path / "summary.json").read_text())["lora_dropout"] == 0.1
    store_settings = json.loads((tmp_path / "toy" / "held_out" / "samples" / "settings.json").read_text())
    assert store_settings["lora_dropout"] == 0.1


class _TinyPipeline:
    """A pipeline of one LoRA linear layer: each image's row of ones through it (all `LoraOutputDropout` reads)."""

    def __init__(self, **config) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        torch.manual_seed(0)
        net = inject_adapter_in_model(LoraConfig(r=2, target_modules=["0"], **config),
                                      torch.nn.Sequential(torch.nn.Linear(8, 64)))
        with torch.no_grad():
            net[0].lora_B["default"].weight.normal_()
        self.components = {"unet": net}

    def __call__(self, prompt, generator=None):
        with torch.no_grad():
            return self.components["unet"](torch.ones(len(generator), 8))


def test_one_prompt_for_several_images_drops_as_that_prompt_per_image():
    # A single prompt string stands for every image of the call: each image's masks are those of its own seed and
    # prompt, as in a call of one image, whatever the batching.
    from gors.core.pipeline import cpu_generators

    dropped = LoraOutputDropout(_TinyPipeline(), 0.5)
    shared = dropped(prompt="a red circle", generator=cpu_generators([3, 4]))
    listed = dropped(prompt=["a red circle", "a red circle"], generator=cpu_generators([3, 4]))
    alone = dropped(prompt="a red circle", generator=cpu_generators([4]))
    torch.testing.assert_close(shared, listed, rtol=0, atol=0)
    torch.testing.assert_close(shared[1:], alone, rtol=1e-5, atol=1e-5)  # the same mask: only rounding differs
    assert not torch.equal(shared[0], shared[1])  # two images, two masks


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_a_dropout_of_0_or_1_is_refused(p):
    # p = 1 would divide the kept output by zero; p = 0 is no dropout (the flag's absence).
    with pytest.raises(ValueError, match=r"lora_dropout must be in \(0, 1\)"):
        LoraOutputDropout(_TinyPipeline(), p)


def test_dora_layers_are_refused():
    # DoRA rescales after lora_B: a hook on lora_B's output would not drop what lora_diffusion's dropout drops.
    with pytest.raises(ValueError, match="merged, DoRA or embedding layers"):
        LoraOutputDropout(_TinyPipeline(use_dora=True), 0.1)


def test_an_images_masks_are_seeded_from_its_seed_and_prompt_as_recorded():
    # `DROPOUT_MASKS` names this seeding in the results: images sampled with dropout by another gors version
    # compare only if it stays the same (sha256 of "<seed>\0<prompt>", its first 8 bytes, 63 bits).
    from gors.core.pipeline import mask_seed

    assert mask_seed(42, "a red book and a blue cup") == 4137532108812490607
    assert mask_seed(-1, "") == 9180342214983553198


def test_a_call_whose_prompts_do_not_match_its_images_draws_one_stream_from_all_of_them():
    # Three prompts for two images cannot be paired: the masks come from one generator seeded from all seeds and
    # prompts, the same on a rerun and other for other prompts.
    dropped = LoraOutputDropout(_TinyPipeline(), 0.5)
    prompts = ["a red circle", "a blue square", "a green cup"]
    first = dropped(prompt=prompts, generator=cpu_generators([3, 4]))
    torch.testing.assert_close(dropped(prompt=prompts, generator=cpu_generators([3, 4])), first, rtol=0, atol=0)
    other = dropped(prompt=prompts[:2] + ["a yellow cup"], generator=cpu_generators([3, 4]))
    assert not torch.equal(other, first)
    paired = dropped(prompt=prompts[:2], generator=cpu_generators([3, 4]))
    assert not torch.equal(paired, first)


def test_a_pipeline_without_lora_layers_is_refused():
    # Without a LoRA layer no hook would be set: the samples would be the undropped LoRA's, recorded as dropped.
    plain = _TinyPipeline()
    plain.components = {"unet": torch.nn.Sequential(torch.nn.Linear(8, 64)), "tokenizer": object()}
    with pytest.raises(ValueError, match="the pipeline has no LoRA layers to drop"):
        LoraOutputDropout(plain, 0.1)


def test_a_dropout_pipeline_copies_and_reads_its_pipeline_s_attributes_through():
    # A copy is made without running __init__: reading an attribute then must not look `pipeline` up forever.
    import copy

    pipeline = _TinyPipeline()
    dropped = LoraOutputDropout(pipeline, 0.5)
    copied = copy.copy(dropped)
    assert copied.pipeline is pipeline and copied.components is pipeline.components and copied.p == 0.5


def test_a_layer_whose_rows_are_no_multiple_of_the_images_is_masked_from_the_first_image_s_stream():
    # Rows that cannot be told apart by image (a pipeline batching otherwise) are masked as one stream: the first
    # image's, as that image alone would mask them, never some rows from one image's stream and some from another's.
    class Rows(_TinyPipeline):
        def __call__(self, prompt, generator=None, rows=3):
            with torch.no_grad():
                return self.components["unet"](torch.ones(rows, 8))

    dropped = LoraOutputDropout(Rows(), 0.5)
    both = dropped(prompt="a red circle", generator=cpu_generators([3, 4]))
    first_alone = dropped(prompt="a red circle", generator=cpu_generators([3]))
    torch.testing.assert_close(both, first_alone, rtol=0, atol=0)
    assert not torch.equal(both, dropped(prompt="a red circle", generator=cpu_generators([5, 4])))
