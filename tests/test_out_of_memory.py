"""Out of device memory is one `error:` line naming the flag that lowers the stage's memory, and the
work finished before it stays: the same command with a smaller value goes on from there.

torch's own `OutOfMemoryError` is raised where the device would raise it (a pipeline call, a reward
call, a training micro-batch) on the CPU; everything around it is the real stage."""

from __future__ import annotations

import shutil

import pytest
import torch

from gors.cli import main
from gors.core.memory import DeviceMemoryError, out_of_memory_advice
from gors.core.run_folder import samples_dir, scores_dir
from gors.core.store import SampleStore
from gors.core.toy import PRETRAINED_DIR

TORCH_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB"
TOY_PIPELINE = str(PRETRAINED_DIR / "pipeline")


def fail_at_call(function, failing: int):
    """`function`, raising torch's out-of-memory error at its `failing`-th call (1-based)."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == failing:
            raise torch.OutOfMemoryError(f"{TORCH_MESSAGE}\nOf the allocated memory 20.1 GiB is allocated by PyTorch")
        return function(*args, **kwargs)

    return wrapped


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def generate_args(run: str, *extra: str) -> list[str]:
    return ["generate", "--output_dir", run, "--pretrained_model_name_or_path", TOY_PIPELINE, "--train_prompts",
            "toy:train", "--max_prompts", "1", "--images_per_prompt", "4", "--num_inference_steps", "2", *extra]


def test_the_advice_keeps_torch_s_first_line_and_other_errors_pass_through():
    with pytest.raises(DeviceMemoryError) as err:
        with out_of_memory_advice("scoring, 16 images per reward call", "lower --reward_batch_size"):
            raise torch.OutOfMemoryError(f"{TORCH_MESSAGE}\nmore detail")
    assert str(err.value) == ("out of device memory while scoring, 16 images per reward call: lower --reward_batch_size, "
                              f"and run the same command again; what was finished is kept (torch: {TORCH_MESSAGE})")
    with pytest.raises(torch.OutOfMemoryError):  # no flag to name: torch's error as it is
        with out_of_memory_advice("validating", None):
            raise torch.OutOfMemoryError(TORCH_MESSAGE)
    with pytest.raises(ValueError, match="other"):
        with out_of_memory_advice("scoring", "lower --reward_batch_size"):
            raise ValueError("other")


def test_generation_out_of_memory_names_the_batch_flag_and_keeps_the_batches_before(tmp_path, monkeypatch, capsys):
    import gors.generate

    run = str(tmp_path / "run")
    load = gors.generate.load_pipeline
    monkeypatch.setattr(gors.generate, "load_pipeline", lambda *a, **k: fail_at_call(load(*a, **k), failing=2))
    with pytest.raises(SystemExit) as exit_info:
        main(generate_args(run, "--generation_batch_size", "2"))
    assert exit_info.value.code == 2
    assert error_lines(capsys) == [
        "error: out of device memory while generating 64 px images, 2 per pipeline call: lower "
        f"--generation_batch_size, and run the same command again; what was finished is kept (torch: {TORCH_MESSAGE})"]
    assert len(SampleStore(samples_dir(run)).records()) == 2  # the first batch, written whole

    monkeypatch.setattr(gors.generate, "load_pipeline", load)
    main(generate_args(run, "--generation_batch_size", "1"))  # the advice taken: the rest is generated
    assert sorted(r["image_index"] for r in SampleStore(samples_dir(run)).records()) == [0, 1, 2, 3]


def test_scoring_out_of_memory_names_the_reward_batch_flag(tmp_path, monkeypatch, capsys):
    import gors.core.scoring

    run = str(tmp_path / "run")
    main(generate_args(run))
    monkeypatch.setattr(gors.core.scoring, "score_rows", fail_at_call(gors.core.scoring.score_rows, failing=2))
    with pytest.raises(SystemExit):
        main(["score", "--output_dir", run, "--reward", "toy_oracle", "--reward_batch_size", "2"])
    assert error_lines(capsys) == [
        "error: out of device memory while scoring, 2 images per reward call: lower --reward_batch_size, and run the "
        f"same command again; what was finished is kept (torch: {TORCH_MESSAGE})"]
    assert sum(1 for part in scores_dir(run, "toy_oracle").glob("part-*.jsonl")
               for _ in part.read_text().splitlines()) == 2


def test_evaluation_names_its_own_flags(tmp_path, monkeypatch, capsys):
    import gors.core.sampling
    import gors.core.scoring

    args = ["evaluate", "--benchmarks", "toy:train", "--pretrained_model_name_or_path", TOY_PIPELINE,
            "--max_prompts", "2", "--columns", "none", "--generation_batch_size", "1", "--output_dir"]
    generators = gors.core.sampling.cpu_generators
    monkeypatch.setattr(gors.core.sampling, "cpu_generators", fail_at_call(generators, failing=2))
    with pytest.raises(SystemExit):
        main([*args, str(tmp_path / "eval")])
    assert error_lines(capsys)[0].startswith("error: out of device memory while generating 64 px images, 1 per "
                                             "pipeline call: lower --generation_batch_size, and run")
    monkeypatch.setattr(gors.core.sampling, "cpu_generators", generators)
    monkeypatch.setattr(gors.core.scoring, "score_rows", fail_at_call(gors.core.scoring.score_rows, failing=1))
    with pytest.raises(SystemExit):
        main([*args, str(tmp_path / "eval")])
    assert error_lines(capsys)[0].startswith("error: out of device memory while scoring, 16 images per reward call: "
                                             "lower --scorer_batch_size, and run")


def test_training_out_of_memory_names_the_micro_batch_flags(selected_run, tiny_sd, tmp_path, monkeypatch, capsys):
    from gors.train import GORSTrainer

    run = tmp_path / "run"
    for name in ("samples", "scores", "selection.jsonl"):
        (shutil.copytree if name != "selection.jsonl" else shutil.copy)(f"{selected_run.output_dir}/{name}", run / name)
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", fail_at_call(GORSTrainer._micro_batch_loss, failing=1))
    with pytest.raises(SystemExit):
        main(["train", "--output_dir", str(run), "--pretrained_model_name_or_path", str(tiny_sd), "--resolution", "32",
              "--max_train_steps", "2", "--report_to", "none"])
    assert error_lines(capsys) == [
        "error: out of device memory while training, 2 samples per micro-batch on each process: lower "
        "--train_batch_size and raise --gradient_accumulation_steps as much (the same samples per update), or pass "
        f"--gradient_checkpointing, and run the same command again; what was finished is kept (torch: {TORCH_MESSAGE})"]
