"""`--auto_train_batch_size`: each process's share of an update as the largest micro-batch that fits.

torch's out-of-memory error is raised where the device would raise it (a micro-batch's loss, after its
random draws) on the CPU; the trial steps, the agreement and the resumes around it are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gors.checkpoints import read_marker, recorded_micro_batch
from gors.cli import main
from gors.config import RunConfig, TrainConfig
from gors.core.distributed import reset_process_state
from gors.core.memory import largest_that_fits, micro_batch_sizes
from gors.core.run_folder import CHECKPOINT_MARKER, round_dir, samples_dir
from gors.core.store import SampleStore
from gors.lora import LORA_WEIGHT_NAME
from gors.run import timing_settings
from gors.train import GORSTrainer
from tests.run_copies import copy_selected_run
from tests.two_processes import launch

TORCH_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB."


def test_micro_batch_sizes_divide_the_share_and_halve_at_least():
    assert micro_batch_sizes(16) == [16, 8, 4, 2, 1]
    assert micro_batch_sizes(12) == [12, 6, 3, 1]
    assert micro_batch_sizes(10) == [10, 5, 2, 1]
    assert micro_batch_sizes(7) == [7, 1]
    assert micro_batch_sizes(1) == [1]


def test_the_largest_size_that_fits_is_the_first_that_does_not_run_out_of_memory(caplog):
    tried = []

    def attempt(size):
        tried.append(size)
        if size > 4:
            raise torch.OutOfMemoryError(TORCH_MESSAGE)

    assert largest_that_fits([16, 8, 4, 2, 1], attempt, "trying") == 4
    assert tried == [16, 8, 4]
    assert [r.getMessage() for r in caplog.records] == ["out of device memory while trying at 16",
                                                       "out of device memory while trying at 8"]
    assert largest_that_fits([16, 8], attempt, "trying") is None
    with pytest.raises(ValueError):  # other errors are no answer
        largest_that_fits([2], lambda size: (_ for _ in ()).throw(ValueError("bad")), "trying")



def test_a_runtime_error_other_than_out_of_memory_is_no_answer_either():
    # A broken step (a dtype mismatch) must stop the trial, not be taken for a size that does not fit.
    tried = []

    def attempt(size):
        tried.append(size)
        raise RuntimeError("mat1 and mat2 must have the same dtype")

    with pytest.raises(RuntimeError, match="same dtype"):
        largest_that_fits([4, 2, 1], attempt, "trying")
    assert tried == [4]

@pytest.mark.parametrize("flags, message", [
    ({}, "--auto_train_batch_size without --global_batch_size"),
    ({"global_batch_size": 4, "gradient_accumulation_steps": 2},
     "--gradient_accumulation_steps=2 with --auto_train_batch_size, which sets it"),
])
def test_the_flag_needs_the_update_s_samples_and_sets_the_accumulation(flags, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(output_dir="run", auto_train_batch_size=True, **flags)



def _fits_at_most(limit: int | None, sizes: list[int]):
    """`GORSTrainer._micro_batch_loss` that records each micro-batch's size and, past `limit` samples, raises
    torch's out-of-memory error after its random draws and its gradients (as late as a device could)."""
    original = GORSTrainer._micro_batch_loss

    def loss(self, micro_batch):
        sizes.append(self.schedule.batch_size)
        assert all(module.training for module in self.trained_modules().values())  # trials too: dropout, checkpointing
        value = original(self, micro_batch)
        if limit is not None and self.schedule.batch_size > limit:
            value.backward()
            raise torch.OutOfMemoryError(TORCH_MESSAGE)
        return value

    return loss


def _train(run: Path, tiny_sd: Path, *flags: str) -> list[str]:
    main(["train", "--output_dir", str(run), "--pretrained_model_name_or_path", str(tiny_sd), "--resolution", "32",
          "--report_to", "none", "--checkpointing_steps", "1", "--global_batch_size", "4", *flags])
    reset_process_state()
    return sorted(load_file(str(run / LORA_WEIGHT_NAME)).items())


def _micro_batch_fields(checkpoint: Path) -> tuple[int, int]:
    fingerprint = read_marker(checkpoint)["fingerprint"]
    return fingerprint["train_batch_size"], fingerprint["gradient_accumulation_steps"]


def _same(a, b) -> bool:
    return [k for k, _ in a] == [k for k, _ in b] and all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))


def test_the_same_command_after_a_slip_goes_on_from_its_set_aside_checkpoints_at_their_micro_batch(
        selected_run, tiny_sd, tmp_path, monkeypatch, capsys):
    run = copy_selected_run(selected_run, tmp_path / "run")
    sizes: list[int] = []
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(2, sizes))
    _train(run, tiny_sd, "--max_train_steps", "2", "--auto_train_batch_size")
    trained = sorted(p.name for p in (run / "checkpoints").iterdir())
    _train(run, tiny_sd, "--max_train_steps", "1", "--auto_train_batch_size", "--rank", "8")  # a slip: sets them aside
    assert sorted(p.name for p in (run / "checkpoints.previous-1").iterdir()) == trained
    capsys.readouterr()
    sizes.clear()
    _train(run, tiny_sd, "--max_train_steps", "3", "--auto_train_batch_size")  # the first command, one step longer
    out = capsys.readouterr().out
    assert "2 samples per micro-batch, as this training's checkpoints record" in out  # no trial: the size it found
    assert "checkpoints.previous-1 held checkpoints of this same training, set aside by a training with other " \
           "settings since: moved back to checkpoints/" in out
    assert f"resumed from {run / 'checkpoints' / 'checkpoint-2'} at step 2" in out
    assert sizes == [2, 2]  # step 3 alone, two micro-batches of 2
    assert _micro_batch_fields(run / "checkpoints" / "checkpoint-3") == (2, 2)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_a_micro_batch_that_does_not_fit_is_halved_before_the_first_step_and_the_trial_leaves_no_trace(
        precision, selected_run, tiny_sd, tmp_path, monkeypatch, capsys):
    # The trial steps' random draws and gradients leave nothing behind: the LoRA is the one trained at that
    # micro-batch from the start.
    reference = _train(copy_selected_run(selected_run, tmp_path / "reference"), tiny_sd, "--max_train_steps", "3",
                       "--train_batch_size", "2", "--mixed_precision", precision)
    run = copy_selected_run(selected_run, tmp_path / "run")
    sizes: list[int] = []
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(2, sizes))
    capsys.readouterr()
    auto = _train(run, tiny_sd, "--max_train_steps", "3", "--auto_train_batch_size", "--mixed_precision", precision)
    out = capsys.readouterr().out
    assert sizes == [4, 2] + [2] * 6  # the trials, then 3 updates of 2 micro-batches (6 samples: past an epoch)
    assert "[train] --auto_train_batch_size: 2 samples per micro-batch on each process, 2 accumulated per update " \
           "(tried 4, 2)" in out
    assert _same(auto, reference)
    assert _micro_batch_fields(run / "checkpoints" / "checkpoint-3") == (2, 2)

    # Going on, the run keeps the size its checkpoints record, where a trial would now fit 4.
    sizes.clear()
    monkeypatch.undo()
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(None, sizes))
    _train(run, tiny_sd, "--max_train_steps", "4", "--auto_train_batch_size", "--mixed_precision", precision)
    out = capsys.readouterr().out
    assert sizes == [2, 2]
    assert "note: each update accumulates" not in out  # the size that fits, found
    assert "2 samples per micro-batch, as this training's checkpoints record" in out
    assert "checkpoint-3 is a checkpoint of this same training" in out
    assert _micro_batch_fields(run / "checkpoints" / "checkpoint-4") == (2, 2)

    # The stage's timings record the size it trained at, not the share tried first.
    config = RunConfig(output_dir=str(run), global_batch_size=4, auto_train_batch_size=True)
    settings = timing_settings(config, SampleStore(samples_dir(run)))
    assert (settings["train_batch_size"], settings["gradient_accumulation_steps"]) == (2, 2)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_a_share_that_fits_trains_as_one_micro_batch(precision, selected_run, tiny_sd, tmp_path, capsys):
    flags = ("--max_train_steps", "1", "--mixed_precision", precision)
    reference = _train(copy_selected_run(selected_run, tmp_path / "reference"), tiny_sd, *flags, "--train_batch_size", "4")
    run = copy_selected_run(selected_run, tmp_path / "run")
    capsys.readouterr()
    assert _same(_train(run, tiny_sd, *flags, "--auto_train_batch_size"), reference)
    assert "--auto_train_batch_size: 4 samples per micro-batch on each process (tried 4)" in capsys.readouterr().out
    assert _micro_batch_fields(run / "checkpoints" / "checkpoint-1") == (4, 1)


def test_no_size_that_fits_is_one_error_line_with_what_to_change(selected_run, tiny_sd, tmp_path, monkeypatch,
                                                                  capsys):
    run = copy_selected_run(selected_run, tmp_path / "run")
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(0, []))
    with pytest.raises(SystemExit):
        _train(run, tiny_sd, "--max_train_steps", "1", "--auto_train_batch_size")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: out of device memory while training a micro-batch of 1 on each process "
                      "(--auto_train_batch_size tried 4, 2, 1): pass --gradient_checkpointing (the training resumes "
                      "from its last checkpoint), or run the same command again on a device with more memory or with "
                      "its other processes stopped"]
    assert not (run / "checkpoints").exists()


def test_a_training_step_that_does_not_fit_after_the_trial_names_the_next_size(selected_run, tiny_sd, tmp_path,
                                                                              monkeypatch, capsys):
    run = copy_selected_run(selected_run, tmp_path / "run")
    original = GORSTrainer._micro_batch_loss
    calls = []

    def loss(self, micro_batch):  # the trial fits; the first training step does not
        calls.append(micro_batch)
        if len(calls) == 2:
            raise torch.OutOfMemoryError(TORCH_MESSAGE)
        return original(self, micro_batch)

    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", loss)
    with pytest.raises(SystemExit):
        _train(run, tiny_sd, "--max_train_steps", "1", "--auto_train_batch_size")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: out of device memory while training, 4 samples per micro-batch on each "
                                "process: drop --auto_train_batch_size for --train_batch_size 2 (the training's steps "
                                "at 4 do not fit; the training starts again from step 0")


def test_under_cuda_graphs_only_the_whole_share_is_tried(selected_run, tiny_sd, tmp_path, monkeypatch, capsys):
    import gors.train

    monkeypatch.setattr(gors.train, "compile_module", lambda module, how: None)  # the sizes, not the compiling
    sizes: list[int] = []
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(2, sizes))
    with pytest.raises(SystemExit):
        _train(copy_selected_run(selected_run, tmp_path / "run"), tiny_sd, "--max_train_steps", "1", "--auto_train_batch_size",
               "--torch_compile", "inductor:reduce-overhead")
    assert sizes == [4]
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: out of device memory while training 4 samples as one micro-batch on each process "
                      "(under CUDA graphs --auto_train_batch_size tries no other size): compile without "
                      "CUDA graphs (--torch_compile inductor), so that --auto_train_batch_size may accumulate smaller "
                      "micro-batches, or pass --gradient_checkpointing (the training resumes from its last checkpoint), "
                      "or run the same command again on a device with more memory or with its other processes stopped"]


def test_a_size_recorded_with_accumulation_is_refused_under_cuda_graphs(selected_run, tiny_sd, tmp_path, monkeypatch,
                                                                      capsys):
    import gors.train

    monkeypatch.setattr(gors.train, "compile_module", lambda module, how: None)  # the settings, not the compiling
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(2, []))
    run = copy_selected_run(selected_run, tmp_path / "run")
    _train(run, tiny_sd, "--max_train_steps", "1", "--auto_train_batch_size", "--torch_compile", "inductor")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        _train(run, tiny_sd, "--max_train_steps", "2", "--auto_train_batch_size", "--torch_compile",
               "inductor:reduce-overhead")
    assert "error: this training's checkpoints record micro-batches of 2, 2 accumulated per update " \
           "(--auto_train_batch_size), which --torch_compile=inductor:reduce-overhead does not do" in capsys.readouterr().err
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["checkpoint-1"]  # left as they were


@pytest.fixture
def counting_backend():
    """A compile backend that counts the graphs dynamo hands it and runs them as traced (no AOT autograd: which
    sizes compile is dynamo's choice, whatever the backend, and the tracing of a backward pass would only cost time)."""
    from torch._dynamo import register_backend

    compiled: list[int] = []

    def counting(graph_module, example_inputs):
        compiled.append(len(graph_module.graph.nodes))
        return graph_module.forward

    name = "gors_test_auto_batch_counting"
    register_backend(counting, name=name)
    torch._dynamo.reset()
    yield name, compiled
    torch._dynamo.reset()


def test_a_compiled_model_s_trial_compiles_it_for_the_size_it_trains_at(selected_run, tiny_sd, tmp_path, monkeypatch,
                                                                       counting_backend):
    backend, compiled = counting_backend
    reference = _train(copy_selected_run(selected_run, tmp_path / "reference"), tiny_sd, "--max_train_steps", "1",
                       "--train_batch_size", "4")
    auto = _train(copy_selected_run(selected_run, tmp_path / "run"), tiny_sd, "--max_train_steps", "1",
                  "--auto_train_batch_size", "--torch_compile", backend)
    assert _same(auto, reference)  # the traced graphs run the uncompiled model's operations
    # One graph each for the U-Net and the trained text encoder, at the trial's size of 4: the trial's graphs serve
    # the steps, none compiled again.
    assert len(compiled) == 2


TWO_PROCESS_SCRIPT = """
import os
import sys

import torch

from gors.cli import main
from gors.train import GORSTrainer

original = GORSTrainer._micro_batch_loss
limit = {"0": 2, "1": 1}[os.environ["RANK"]]  # the second process's device fits less


def loss(self, micro_batch):
    value = original(self, micro_batch)
    if self.schedule.batch_size > limit:
        raise torch.OutOfMemoryError("CUDA out of memory.")
    return value


GORSTrainer._micro_batch_loss = loss
main(sys.argv[1:])
"""


def test_processes_agree_on_the_smallest_size_that_fit_anywhere(selected_run, tiny_sd, tmp_path):
    run = copy_selected_run(selected_run, tmp_path / "run")
    script = tmp_path / "train_fitting.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    result = launch([str(script), "train", "--output_dir", str(run), "--pretrained_model_name_or_path", str(tiny_sd),
                     "--resolution", "32", "--report_to", "none", "--max_train_steps", "1", "--global_batch_size", "4",
                     "--auto_train_batch_size"], tmp_path)
    assert "--auto_train_batch_size: 1 sample per micro-batch on each process, 2 accumulated per update " \
           "(tried 2, 1)" in result.stdout
    assert _micro_batch_fields(run / "checkpoints" / "checkpoint-1") == (1, 2)
    assert read_marker(run / "checkpoints" / "checkpoint-1")["fingerprint"]["num_processes"] == 2


def _checkpoint(folder: Path, fingerprint: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / CHECKPOINT_MARKER).write_text(json.dumps({"fingerprint": fingerprint}))
    return folder


def test_the_recorded_micro_batch_is_that_of_a_checkpoint_of_this_training_with_as_many_samples_per_update(tmp_path):
    # This training's fingerprint as it starts: the share of 4 as one micro-batch.
    this = {"selection_sha256": "a", "seed": 0, "train_batch_size": 4, "gradient_accumulation_steps": 1}
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    assert recorded_micro_batch(this, run) is None
    _checkpoint(checkpoints / "checkpoint-1", this | {"train_batch_size": 2, "gradient_accumulation_steps": 2})
    _checkpoint(checkpoints / "checkpoint-2", this | {"train_batch_size": 1, "gradient_accumulation_steps": 2})  # 2
    _checkpoint(checkpoints / "checkpoint-3", this | {"seed": 1, "train_batch_size": 1, "gradient_accumulation_steps": 4})
    (checkpoints / "checkpoint-4").mkdir()  # an interrupted save: no marker
    assert recorded_micro_batch(this, run) == 2
    assert recorded_micro_batch(this, run, resume_from="checkpoint-2") is None
    assert recorded_micro_batch(this, run, resume_from="latest") is None  # checkpoint-3, of another seed

    # Online GORS: the previous round's checkpoint, on another selection.
    previous = _checkpoint(tmp_path / "round_1" / "checkpoint-5",
                           this | {"selection_sha256": "b", "train_batch_size": 1, "gradient_accumulation_steps": 4})
    assert recorded_micro_batch(this, tmp_path / "round_2", continue_from=previous) == 1
    assert recorded_micro_batch(this, run, continue_from=previous) == 2  # the folder's own first

    # Set aside by a training with other settings (`checkpoints.previous-<n>/`): read after checkpoints/, the
    # furthest first, and only at or before --max_train_steps, where `restore_own_training` takes them from.
    aside = tmp_path / "aside"
    _checkpoint(aside / "checkpoints.previous-1" / "checkpoint-20", this | {"train_batch_size": 1,
                                                                           "gradient_accumulation_steps": 4})
    _checkpoint(aside / "checkpoints.previous-2" / "checkpoint-10", this | {"train_batch_size": 2,
                                                                           "gradient_accumulation_steps": 2})
    assert recorded_micro_batch(this, aside) == 1
    assert recorded_micro_batch(this, aside, max_train_steps=15) == 2
    assert recorded_micro_batch(this, aside, max_train_steps=5) is None
    _checkpoint(aside / "checkpoints" / "checkpoint-1", this)  # the folder's own checkpoints come first
    assert recorded_micro_batch(this, aside) == 4


def test_the_next_online_round_trains_at_the_size_the_first_found(make_run_config, tmp_path, monkeypatch, capsys):
    from gors.run import run

    sizes: list[int] = []
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", _fits_at_most(2, sizes))
    config = make_run_config(output_dir=str(tmp_path / "run"), rounds=2, max_train_steps=2, checkpointing_steps=1,
                             global_batch_size=4, auto_train_batch_size=True, report_to="none")
    run(config)
    assert sizes == [4, 2, 2, 2] + [2, 2]  # round 0's trials and step, round 1's step on one Accelerator
    assert "2 samples per micro-batch, as this training's checkpoints record" in capsys.readouterr().out
    for index, step in [(0, 1), (1, 2)]:
        assert _micro_batch_fields(round_dir(config.output_dir, index) / "checkpoints" / f"checkpoint-{step}") == (2, 2)
