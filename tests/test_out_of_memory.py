"""Out of device memory: generation and scoring halve a batch that does not fit and go on, with the same
images and scores; what cannot shrink further, or training, is one `error:` line that says what to change,
and the work finished before it stays.

torch's own `OutOfMemoryError` is raised where the device would raise it (a pipeline call, a reward
call, a training micro-batch) on the CPU; everything around it is the real stage."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from gors.cli import main
from gors.core.memory import BatchLimit, DeviceMemoryError, in_batches_that_fit, out_of_memory_advice
from gors.core.run_folder import samples_dir, scores_dir
from gors.core.scoring import load_scores
from gors.core.store import SampleStore
from gors.core.toy import PRETRAINED_DIR
from tests.run_copies import copy_selected_run

TORCH_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB"
TOY_PIPELINE = str(PRETRAINED_DIR / "pipeline")


def out_of_memory(when):
    """A wrapper that makes a function raise torch's out-of-memory error where `when(calls, args, kwargs)`."""
    def wrap(function):
        calls = []

        def wrapped(*args, **kwargs):
            calls.append(1)
            if when(len(calls), args, kwargs):
                raise torch.OutOfMemoryError(f"{TORCH_MESSAGE}\nOf the allocated memory 20.1 GiB is allocated by "
                                             "PyTorch")
            return function(*args, **kwargs)

        return wrapped
    return wrap


def fail_at_call(function, failing: int):
    """`function`, raising torch's out-of-memory error at its `failing`-th call (1-based)."""
    return out_of_memory(lambda calls, args, kwargs: calls == failing)(function)


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def generate_args(run: str, *extra: str) -> list[str]:
    return ["generate", "--output_dir", run, "--pretrained_model_name_or_path", TOY_PIPELINE, "--train_prompts",
            "toy:train", "--max_prompts", "1", "--images_per_prompt", "4", "--num_inference_steps", "2", *extra]


def image_hashes(run: str) -> dict[tuple[int, int], str]:
    return {(r["prompt_index"], r["image_index"]): r["image_sha256"] for r in SampleStore(samples_dir(run)).records()}


def test_batches_are_halved_until_they_fit_and_one_item_that_does_not_fit_is_an_error(caplog):
    done = []

    def work(batch):
        if len(batch) > 2:
            raise torch.OutOfMemoryError(TORCH_MESSAGE)
        done.append(batch)

    with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
        size = in_batches_that_fit(list(range(7)), 8, work, "scoring", "images per reward call",
                                   "--reward_batch_size", "score elsewhere")
    assert done == [[0, 1], [2, 3], [4, 5], [6]] and size == 2
    assert [r.getMessage() for r in caplog.records] == [
        "out of device memory while scoring at 8 images per reward call: going on at 4 (pass --reward_batch_size 4 "
        "to start there)",
        "out of device memory while scoring at 4 images per reward call: going on at 2 (pass --reward_batch_size 2 "
        "to start there)"]

    def never_fits(batch):
        raise torch.OutOfMemoryError(f"{TORCH_MESSAGE}\nmore detail")

    with pytest.raises(DeviceMemoryError) as err:
        in_batches_that_fit([0, 1], 2, never_fits, "scoring", "images per reward call", None, "score elsewhere")
    assert str(err.value) == ("out of device memory while scoring one at a time: score elsewhere. What was finished "
                              f"is kept (torch: {TORCH_MESSAGE})")


def test_cudnn_and_cublas_failing_to_allocate_are_out_of_memory_too_and_other_runtime_errors_are_not():
    done = []

    def work(batch):
        if len(batch) > 1:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")
        done.append(batch)

    assert in_batches_that_fit([0, 1, 2], 4, work, "generating", "images", None, "elsewhere") == 1
    assert done == [[0], [1], [2]]

    def broken(batch):
        raise RuntimeError("Input type (c10::Half) and bias type (float) should be the same")

    with pytest.raises(RuntimeError, match="should be the same"):
        in_batches_that_fit([0, 1], 2, broken, "generating", "images", None, "elsewhere")
    with pytest.raises(DeviceMemoryError, match="CUBLAS_STATUS_ALLOC_FAILED"):
        with out_of_memory_advice("training", "lower --train_batch_size"):
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")



def test_a_runtime_error_other_than_out_of_memory_is_raised_itself_at_the_first_batch():
    # Not halved down to one item and then reported as out of memory (whose message would still quote it).
    calls = []
    error = RuntimeError("Input type (c10::Half) and bias type (float) should be the same")

    def broken(batch):
        calls.append(list(batch))
        raise error

    with pytest.raises(RuntimeError) as raised:
        in_batches_that_fit([0, 1, 2, 3], 4, broken, "generating", "images", None, "elsewhere")
    assert raised.value is error and calls == [[0, 1, 2, 3]]

def test_the_training_advice_keeps_torch_s_first_line_and_other_errors_pass_through():
    with pytest.raises(DeviceMemoryError) as err:
        with out_of_memory_advice("training", "lower --train_batch_size"):
            raise torch.OutOfMemoryError(f"{TORCH_MESSAGE}\nmore detail")
    assert str(err.value) == ("out of device memory while training: lower --train_batch_size. What was finished is "
                              f"kept (torch: {TORCH_MESSAGE})")
    with pytest.raises(ValueError, match="other"):
        with out_of_memory_advice("training", "lower --train_batch_size"):
            raise ValueError("other")


def test_generation_halves_a_batch_that_does_not_fit_and_makes_the_same_images(tmp_path, monkeypatch, caplog):
    import gors.generate

    one_at_a_time = str(tmp_path / "one")
    main(generate_args(one_at_a_time, "--generation_batch_size", "1"))
    load = gors.generate.load_pipeline
    only_one = out_of_memory(lambda calls, args, kwargs: len(kwargs["prompt"]) > 1)
    monkeypatch.setattr(gors.generate, "load_pipeline", lambda *a, **k: only_one(load(*a, **k)))
    run = str(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
        main(generate_args(run, "--generation_batch_size", "4"))
    assert image_hashes(run) == image_hashes(one_at_a_time) and len(image_hashes(run)) == 4
    assert [r.getMessage() for r in caplog.records][-1] == (
        "out of device memory while generating 64 px images at 2 images per pipeline call: going on at 1 (pass "
        "--generation_batch_size 1 to start there)")


def test_an_fp16_sdxl_out_of_memory_in_its_float32_decode_goes_on_at_half_with_its_vae_cast_back(tiny_sdxl,
                                                                                                  tmp_path):
    from gors.core.backbones import detect_backbone
    from gors.core.distributed import make_accelerator
    from gors.core.pipeline import load_pipeline, pipeline_settings
    from gors.core.sampling import SamplingProtocol, generate_samples

    backbone = detect_backbone(str(tiny_sdxl))
    accelerator = make_accelerator()
    decoded_in = []

    def loader():
        pipeline = load_pipeline(str(tiny_sdxl), accelerator.device, torch.float16, backbone=backbone)
        decoder = pipeline.vae.decoder  # the pipeline upcasts the VAE to float32 for this, and back after
        decoder.forward = out_of_memory(lambda calls, args, kwargs: decoded_in.append(pipeline.vae.dtype)
                                        or args[0].shape[0] > 2)(decoder.forward)
        return pipeline

    store = SampleStore(tmp_path / "samples")
    protocol = SamplingProtocol(images_per_prompt=2, num_inference_steps=2, guidance_scale=5.0, resolution=32,
                                batch_size=4, seed=0)
    generate_samples(store, ["a red cube", "two dogs"], protocol, loader, accelerator,
                     settings=pipeline_settings(str(tiny_sdxl), torch.float16, backbone=backbone))
    assert len(store.records()) == 4 and decoded_in == [torch.float32] * 3  # 4 (out of memory), then 2 and 2


def test_an_image_that_does_not_fit_alone_is_one_line_and_the_images_before_it_stay(tmp_path, monkeypatch, capsys):
    import gors.generate

    run = str(tmp_path / "run")
    load = gors.generate.load_pipeline
    monkeypatch.setattr(gors.generate, "load_pipeline", lambda *a, **k: fail_at_call(load(*a, **k), failing=3))
    with pytest.raises(SystemExit) as exit_info:
        main(generate_args(run, "--generation_batch_size", "1"))
    assert exit_info.value.code == 2
    assert error_lines(capsys) == [
        "error: out of device memory while generating 64 px images one at a time: run the same command again on a "
        "device with more memory or with its other processes stopped; or generate in half precision "
        "(--mixed_precision fp16 or bf16), in a new --output_dir once images are stored (a store keeps its "
        f"precision). What was finished is kept (torch: {TORCH_MESSAGE})"]
    assert len(SampleStore(samples_dir(run)).records()) == 2


def test_scoring_halves_a_batch_that_does_not_fit_and_gives_the_same_scores(tmp_path, monkeypatch, caplog, capsys):
    import gors.core.scoring

    run = str(tmp_path / "run")
    main(generate_args(run))
    main(["score", "--output_dir", run, "--reward", "toy_oracle", "--reward_batch_size", "1"])
    expected = load_scores(run, "toy_oracle")
    shutil.rmtree(scores_dir(run, "toy_oracle"))
    monkeypatch.setattr(gors.core.scoring, "score_rows", out_of_memory(
        lambda calls, args, kwargs: len(args[1]) > 1)(gors.core.scoring.score_rows))
    with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
        main(["score", "--output_dir", run, "--reward", "toy_oracle", "--reward_batch_size", "2"])
    assert load_scores(run, "toy_oracle") == expected and len(expected) == 4
    assert [r.getMessage() for r in caplog.records] == [
        "out of device memory while scoring at 2 images per reward call: going on at 1 (pass --reward_batch_size 1 "
        "to start there)"]

    monkeypatch.setattr(gors.core.scoring, "score_rows", fail_at_call(gors.core.scoring.score_rows, failing=1))
    shutil.rmtree(scores_dir(run, "toy_oracle"))
    with pytest.raises(SystemExit):
        main(["score", "--output_dir", run, "--reward", "toy_oracle", "--reward_batch_size", "1"])
    assert error_lines(capsys)[-1].startswith("error: out of device memory while scoring one at a time: run the same "
                                              "command again on a device with more memory or with its other")


def test_evaluation_names_its_own_flags(tmp_path, monkeypatch, caplog):
    import gors.core.sampling
    import gors.core.scoring

    generators = gors.core.sampling.cpu_generators
    monkeypatch.setattr(gors.core.sampling, "cpu_generators", out_of_memory(
        lambda calls, args, kwargs: len(args[0]) > 1)(generators))
    monkeypatch.setattr(gors.core.scoring, "score_rows", out_of_memory(
        lambda calls, args, kwargs: len(args[1]) > 1)(gors.core.scoring.score_rows))
    with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
        main(["evaluate", "--benchmarks", "toy:train", "--pretrained_model_name_or_path", TOY_PIPELINE,
              "--max_prompts", "2", "--columns", "none", "--generation_batch_size", "2", "--scorer_batch_size", "2",
              "--output_dir", str(tmp_path / "eval")])
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.endswith("(pass --generation_batch_size 1 to start there)") for m in messages)
    assert any(m.endswith("(pass --scorer_batch_size 1 to start there)") for m in messages)


@pytest.mark.parametrize("flags, lower", [
    ([], "lower --train_batch_size and raise --gradient_accumulation_steps as much"),
    (["--global_batch_size", "4"], "lower --train_batch_size"),  # the accumulation follows by itself
    (["--torch_compile", "inductor:reduce-overhead"], "lower --train_batch_size and raise "
     "--gradient_accumulation_steps as much with --torch_compile inductor, which accumulates micro-batches where CUDA "
     "graphs do not"),
])
def test_training_out_of_memory_names_the_micro_batch_flags(selected_run, tiny_sd, tmp_path, monkeypatch, capsys,
                                                           flags, lower):
    from gors.train import GORSTrainer

    run = tmp_path / "run"
    copy_selected_run(selected_run, run)
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", fail_at_call(GORSTrainer._micro_batch_loss, failing=1))
    with pytest.raises(SystemExit):
        main(["train", "--output_dir", str(run), "--pretrained_model_name_or_path", str(tiny_sd), "--resolution", "32",
              "--max_train_steps", "2", "--report_to", "none", *flags])
    assert error_lines(capsys) == [
        f"error: out of device memory while training, 2 samples per micro-batch on each process: {lower} (as many "
        "samples per update; the training starts again from step 0, its checkpoints set aside), or pass "
        "--gradient_checkpointing (the training resumes from its last checkpoint), or run the same command again on "
        f"a device with more memory or with its other processes stopped. What was finished is kept (torch: "
        f"{TORCH_MESSAGE})"]


def test_evaluation_keeps_each_benchmark_s_batch_unless_the_flag_sets_one(tmp_path):
    from gors.config import EvaluateConfig
    from gors.evaluate import plan_benchmarks

    def batch(**flags) -> int:
        config = EvaluateConfig(output_dir=str(tmp_path), benchmarks="toy:train", pretrained_model_name_or_path=TOY_PIPELINE,
                                **flags)
        return plan_benchmarks(config)[0].benchmark.batch_size

    assert batch() == 32 and batch(generation_batch_size=2) == 2  # the toy benchmark's own, then the flag's


def test_validation_renders_halve_too_and_render_the_same_images(selected_run, tiny_sd, tmp_path, monkeypatch):
    import numpy as np

    import gors.train
    from gors.config import TrainConfig
    from gors.core.distributed import reset_process_state
    from gors.train import GORSTrainer

    def rendered(name: str) -> tuple[list, int]:
        run = tmp_path / name
        copy_selected_run(selected_run, run)
        trainer = GORSTrainer(TrainConfig(
            output_dir=str(run), pretrained_model_name_or_path=str(tiny_sd), resolution=32, max_train_steps=1,
            validation_prompts=["a red circle", "a blue square", "a green triangle"], validation_steps=1,
            report_to="tensorboard"))
        images = []
        log_validation = trainer.log_validation
        trainer.log_validation = lambda step: images.extend(log_validation(step))
        trainer.train()
        reset_process_state()
        return [np.asarray(image) for image in images], trainer._render_limit.size

    whole, size = rendered("whole")
    generators = gors.train.cpu_generators
    monkeypatch.setattr(gors.train, "cpu_generators", out_of_memory(lambda calls, args, kwargs: len(args[0]) > 1)(
        generators))
    halved, halved_size = rendered("halved")
    assert len(whole) == len(halved) == 3 and (size, halved_size) == (None, 1)  # the next validation starts at 1
    for a, b in zip(whole, halved):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1  # batching's float rounding, at most one level


def fits_two(tried: list[int]):
    """Work that records each batch's length in `tried` and runs out of memory above 2 items."""
    def work(batch):
        tried.append(len(batch))
        if len(batch) > 2:
            raise torch.OutOfMemoryError(TORCH_MESSAGE)
    return work


def test_a_short_batch_that_does_not_fit_is_not_tried_again_as_it_was(caplog):
    tried = []
    work = fits_two(tried)

    assert in_batches_that_fit([0, 1, 2], 8, work, "scoring", "images per reward call", None, "-") == 2
    assert tried == [3, 2, 1]  # 8 halved to 2, past the 4 that would have retried the same 3 items
    with pytest.raises(DeviceMemoryError, match="one at a time"):
        in_batches_that_fit([0], 4, lambda batch: work([0, 1, 2]), "scoring", "images per reward call", None, "-")


def test_a_limit_starts_the_next_call_at_the_size_that_fit(caplog):
    tried = []
    work = fits_two(tried)

    limit = BatchLimit()
    with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
        in_batches_that_fit(list(range(4)), 8, work, "scoring", "images per reward call", None, "-", limit)
        assert (tried, limit.size, len(caplog.records)) == ([4, 2, 2], 2, 1)
        tried.clear()
        assert in_batches_that_fit(list(range(4)), 8, work, "scoring", "images per reward call", None, "-", limit) == 2
    assert tried == [2, 2] and len(caplog.records) == 1  # no failed attempt and no warning the second time
    assert limit.start(1) == 1  # a call that asks for less runs at what it asks


def test_each_benchmark_validation_starts_at_the_batch_sizes_that_last_fit(make_run_config, tmp_path, monkeypatch,
                                                                           caplog):
    import gors.core.sampling
    import gors.core.scoring
    from gors.core.distributed import make_accelerator
    from gors.core.pipeline import load_pipeline
    from gors.validation import BenchmarkValidation

    failed = {"generation": 0, "scoring": 0}

    def over_one(stage: str, position: int):
        def when(calls, args, kwargs):
            too_large = len(args[position]) > 1
            failed[stage] += too_large
            return too_large
        return when

    monkeypatch.setattr(gors.core.sampling, "cpu_generators",
                        out_of_memory(over_one("generation", 0))(gors.core.sampling.cpu_generators))
    monkeypatch.setattr(gors.core.scoring, "score_rows",
                        out_of_memory(over_one("scoring", 1))(gors.core.scoring.score_rows))
    # The toy model at the toy protocol's 64 px and 20 steps, whose images score something to compare.
    protocol = dict(validation_num_inference_steps=None, validation_resolution=None)
    validation = BenchmarkValidation(make_run_config(output_dir=str(tmp_path), validation_benchmark="toy:train",
                                                     validation_num_prompts=2, **protocol), make_accelerator())
    validation.start(0, training="A")
    pipeline = load_pipeline(TOY_PIPELINE, torch.device("cpu"), torch.float32)
    values = []
    for step in (1, 2):
        with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
            summary = validation.run(step, pipeline, lambda folder: folder.mkdir(parents=True, exist_ok=True))
        values.append((summary["binding_accuracy"], summary["num_images"]))
        if step == 1:
            halvings = dict(failed)
            assert halvings["generation"] >= 1 and halvings["scoring"] >= 1 and len(caplog.records) >= 2
            caplog.clear()
    assert failed == halvings and caplog.records == []  # the second validation ran out of memory nowhere
    assert values[0] == values[1]  # the same pipeline validated twice: the same images and scores
