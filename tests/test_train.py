"""Training on tiny models: only LoRA learns, the LoRA loads in diffusers, resume is exact."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionPipeline
from safetensors.torch import load_file

from gors.config import TrainConfig
from gors.core.distributed import reset_process_state
from gors.lora import LORA_WEIGHT_NAME
from gors.select import load_selection, select
from gors.train import (
    AutocastPipeline,
    GORSTrainer,
    TrainingDiverged,
    accumulation_steps,
    find_checkpoint,
    resolve_accumulation,
    train,
)
from tests.run_copies import copy_selected_run


def _file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _config(make_run_config, run_dir, **overrides):
    return make_run_config(output_dir=str(run_dir), **overrides)


def test_only_lora_parameters_receive_gradients(selected_run, make_run_config, tmp_path):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(_config(make_run_config, run_dir, report_to="none"))
    trainer.selection = load_selection(run_dir)
    trainer._setup_models()
    trainer._load_data()
    trainer._micro_batch_loss(0).backward()
    with_grad = {name for module in (trainer.denoiser, trainer.text_encoders["text_encoder"])
                 for name, p in module.named_parameters() if p.grad is not None}
    assert with_grad and all("lora_" in name for name in with_grad)
    assert any(n.startswith("down_blocks") or n.startswith("up_blocks") for n in with_grad)  # U-Net side
    assert any("self_attn.q_proj" in n for n in with_grad)  # text-encoder side
    trained_targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in with_grad}
    assert trained_targets == {"to_q", "to_k", "to_v", "0", "q_proj", "k_proj", "v_proj", "out_proj"}


def test_caption_dropout_and_posterior_mean_latents(selected_run, make_run_config, tmp_path, monkeypatch):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(_config(make_run_config, run_dir, report_to="none", caption_dropout=0.999,
                                  sample_latents=False))
    trainer.selection = load_selection(run_dir)
    trainer._setup_models()
    trainer._load_data()
    seen = []
    monkeypatch.setattr(trainer.denoiser, "forward", lambda sample, t, states, **kw: (seen.append(sample), (sample,))[1])
    monkeypatch.setattr(trainer.noise_scheduler, "add_noise", lambda latents, noise, t: latents)
    captured = []
    encoder = trainer.text_encoders["text_encoder"]
    original_encoder = encoder.forward
    monkeypatch.setattr(encoder, "forward", lambda ids, **kw: (captured.append(ids), original_encoder(ids, **kw))[1])
    trainer._micro_batch_loss(0)
    empty_ids = trainer.tokens["text_encoder"][trainer.empty_index]
    assert trainer.prompts[trainer.empty_index] == ""
    assert torch.equal(captured[0], empty_ids.expand_as(captured[0]))  # every caption dropped
    index = torch.tensor(trainer.schedule.indices(0))
    expected = trainer.latents["mean"][index] * trainer.vae.config.scaling_factor
    assert torch.allclose(seen[0], expected)  # the posterior mean, no sampling noise


def test_flags_turn_each_side_off(selected_run, make_run_config, tmp_path):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(_config(make_run_config, run_dir, train_text_encoder=False, report_to="none"))
    trainer._setup_models()
    assert trainer.trained == ["unet"]
    assert trainer.text_encoders == {}  # frozen: its outputs are cached instead of running every step
    assert any("lora_" in n for n, _ in trainer.denoiser.named_parameters())
    trainer = GORSTrainer(_config(make_run_config, run_dir, train_unet=False, report_to="none"))
    trainer._setup_models()
    assert trainer.trained == ["text_encoder"]
    assert not any("lora_" in n for n, _ in trainer.denoiser.named_parameters())


def test_both_sides_adapters_take_the_rank_asked_for(selected_run, make_run_config, tmp_path):
    """--rank sizes the adapters of the U-Net and of the text encoder alike: every down-projection has `rank` rows
    and every up-projection `rank` columns."""
    trainer = GORSTrainer(_config(make_run_config, copy_selected_run(selected_run, tmp_path / "run"), rank=2,
                                  report_to="none"))
    trainer._setup_models()
    for component, module in trainer.trained_modules().items():
        shapes = {name: tuple(p.shape) for name, p in module.named_parameters() if "lora_" in name}
        assert any("lora_A" in name for name in shapes), component
        assert all(shape[0] == 2 for name, shape in shapes.items() if "lora_A" in name), component
        assert all(shape[1] == 2 for name, shape in shapes.items() if "lora_B" in name), component


def test_an_accelerator_that_accumulates_otherwise_than_the_training_is_refused(selected_run, make_run_config,
                                                                               tmp_path):
    """An Accelerator handed in must accumulate as many micro-batches per update as the training does: with fewer
    it would step the optimizer at every micro-batch, with more it would never sync."""
    from gors.core.distributed import make_accelerator

    config = _config(make_run_config, copy_selected_run(selected_run, tmp_path / "run"), gradient_accumulation_steps=2,
                     report_to="none")
    with pytest.raises(ValueError, match=r"the Accelerator given accumulates 1 micro-batch\(es\) per update and the "
                                         r"training 2: make it with gors.train.training_accelerator\(config\)"):
        GORSTrainer(config, make_accelerator())
    reset_process_state()
    GORSTrainer(config, make_accelerator(gradient_accumulation_steps=2))  # the same accumulation: taken


def test_saved_lora_loads_in_diffusers_and_changes_the_output(selected_run, make_run_config, tmp_path, tiny_sd):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    base_files = _file_hashes(tiny_sd)
    assert any(name.endswith("diffusion_pytorch_model.safetensors") for name in base_files)
    # A large learning rate so that two steps visibly move the tiny model.
    lora_file = train(_config(make_run_config, run_dir, learning_rate=1e-1, text_encoder_learning_rate=1e-1))
    weights = load_file(str(lora_file))
    assert any(k.startswith("unet.") for k in weights) and any(k.startswith("text_encoder.") for k in weights)
    assert all(".lora" in k for k in weights)  # adapters only (lora.down, lora.up, ...), no base weight
    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd), safety_checker=None)
    pipeline.set_progress_bar_config(disable=True)

    def render():
        return pipeline("a red circle", num_inference_steps=3, height=32, width=32, output_type="np",
                        generator=torch.Generator().manual_seed(0)).images

    before = render()
    pipeline.load_lora_weights(str(run_dir))
    after = render()
    assert np.abs(before - after).max() > 1e-3
    # The base model folder is byte for byte what it was before training: only adapters were saved.
    assert _file_hashes(tiny_sd) == base_files
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-2"]
    assert any((run_dir / "logs").rglob("events.out.tfevents*"))


def test_resume_after_interruption_continues_from_the_saved_step(selected_run, make_run_config, tmp_path, monkeypatch):
    reference_dir = copy_selected_run(selected_run, tmp_path / "reference")
    reference = load_file(str(train(_config(make_run_config, reference_dir, max_train_steps=4, checkpointing_steps=2))))

    reset_process_state()
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    original = GORSTrainer._micro_batch_loss

    def crash_at_step_3(self, micro_batch):
        if micro_batch == 2:
            raise KeyboardInterrupt("simulated crash")
        return original(self, micro_batch)

    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", crash_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(_config(make_run_config, run_dir, max_train_steps=4, checkpointing_steps=2))
    assert find_checkpoint(run_dir, "latest").name == "checkpoint-2"
    monkeypatch.undo()
    reset_process_state()

    seen_steps = []
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss",
                        lambda self, m: (seen_steps.append(m), original(self, m))[1])
    resumed = load_file(str(train(_config(make_run_config, run_dir, max_train_steps=4, checkpointing_steps=2,
                                          resume_from_checkpoint="latest"))))
    assert seen_steps == [2, 3]  # continues at step 3, nothing repeated
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.allclose(reference[key], resumed[key], atol=1e-6), key


def test_the_seed_draws_the_adapters_initialisation(selected_run, make_run_config, tmp_path):
    """`--seed` seeds the training's own random draws (here the adapters' initial down-projections), not only the
    batch order: the same seed starts from the same adapters, another seed from others."""
    def initial_adapters(name: str, seed: int) -> dict[str, torch.Tensor]:
        trainer = GORSTrainer(_config(make_run_config, copy_selected_run(selected_run, tmp_path / name), seed=seed,
                                      report_to="none"))
        trainer._set_up()
        reset_process_state()
        return {key: p.detach().clone() for key, p in trainer.denoiser.named_parameters() if "lora_A" in key}

    first, again, other = initial_adapters("first", 1), initial_adapters("again", 1), initial_adapters("other", 2)
    assert first and all(torch.equal(first[key], again[key]) for key in first)
    assert all(not torch.equal(first[key], other[key]) for key in first)


def test_bf16_trains_fp32_adapters_over_bf16_frozen_weights(selected_run, make_run_config, tmp_path, monkeypatch):
    from gors.lora import lora_parameters

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(_config(make_run_config, run_dir, max_train_steps=2, checkpointing_steps=2,
                                  mixed_precision="bf16", report_to="none"))
    loads, load = [], type(trainer.family).load
    monkeypatch.setattr(type(trainer.family), "load",
                        lambda family, component, dtype=torch.float32: (loads.append((component, dtype)),
                                                                        load(family, component, dtype))[1])
    weights = load_file(str(trainer.train()))
    reset_process_state()
    assert trainer.weight_dtype == torch.bfloat16
    # Base weights load in bf16 (no whole fp32 copy on the CPU or the GPU first); the VAE, encoding once, in fp32.
    models = {component: dtype for component, dtype in loads if not component.startswith(("tokenizer", "scheduler"))}
    assert models == {"vae": torch.float32, "unet": torch.bfloat16, "text_encoder": torch.bfloat16}
    modules = trainer._bare_trained_modules()
    frozen = [p for m in modules.values() for p in m.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert all(p.dtype == torch.float32 for m in modules.values() for p in lora_parameters(m))
    assert weights and all(torch.isfinite(w).all() for w in weights.values())


def test_validation_prompts_render_under_bf16_with_only_the_text_encoder_trained(selected_run, make_run_config,
                                                                                   tmp_path):
    # The untrained U-Net is bf16 beside the fp32 VAE: the pipeline runs under autocast, as diffusers' scripts.
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(_config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1,
                                  mixed_precision="bf16", train_unet=False, validation_prompts=["a red circle"],
                                  validation_steps=1, report_to="tensorboard"))
    rendered = []
    log_validation = trainer.log_validation
    trainer.log_validation = lambda step: rendered.extend(log_validation(step))
    trainer.train()
    reset_process_state()
    assert trainer.trained == ["text_encoder"] and len(rendered) == 1
    assert rendered[0].size == (32, 32)
    # Rendered with the samples' steps (the store's), not the family's default 30.
    assert trainer.sampling_steps == json.loads((run_dir / "samples" / "settings.json").read_text())[
        "num_inference_steps"] != 30


def test_gradient_accumulation_counts_updates_not_micro_batches(selected_run, make_run_config, tmp_path):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    config = _config(make_run_config, run_dir, max_train_steps=2, checkpointing_steps=1, gradient_accumulation_steps=2,
                     lr_scheduler="linear", report_to="none")
    train(config)
    reset_process_state()
    # Two updates of two micro-batches each: checkpoints at updates 1 and 2, and a linear decay over 2
    # updates at half its start after the first.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-2"]
    state = torch.load(run_dir / "checkpoints" / "checkpoint-1" / "scheduler.bin", weights_only=False)
    assert state["_last_lr"][0] / state["base_lrs"][0] == pytest.approx(0.5)


def test_a_global_batch_is_made_of_accumulated_micro_batches_on_any_number_of_processes():
    assert accumulation_steps(16, 2, 1) == 8  # the paper's 2 x 8 GPUs on one
    assert accumulation_steps(16, 2, 8) == 1
    assert accumulation_steps(16, 16, 1) == 1
    assert accumulation_steps(16, 2, 1, given=8) == 8  # the same, said twice
    with pytest.raises(ValueError, match=r"--global_batch_size=16 is not a multiple of --train_batch_size=3 x 1 "
                                         r"process\(es\) = 3: give a --train_batch_size that divides 16"):
        accumulation_steps(16, 3, 1)
    with pytest.raises(ValueError, match="launch a number of processes that divides 16"):
        accumulation_steps(16, 2, 3)
    with pytest.raises(ValueError, match=r"--gradient_accumulation_steps=4 with --global_batch_size=16: that batch "
                                         r"takes 8 micro-batch\(es\) of 2 on 1 process\(es\); give one of the two"):
        accumulation_steps(16, 2, 1, given=4)


def test_an_accumulation_given_beside_a_global_batch_is_checked_by_the_trainer_too():
    """A config made in Python skips the flags' parse-time check (`check_given`): the trainer itself refuses a
    --gradient_accumulation_steps that does not make the --global_batch_size, rather than replace it silently."""
    config = TrainConfig(output_dir="run", global_batch_size=16, train_batch_size=2, gradient_accumulation_steps=4)
    with pytest.raises(ValueError, match=r"--gradient_accumulation_steps=4 with --global_batch_size=16: that batch "
                                         r"takes 8 micro-batch\(es\) of 2 on 1 process\(es\)"):
        resolve_accumulation(config, 1)
    config = TrainConfig(output_dir="run", global_batch_size=16, train_batch_size=2, gradient_accumulation_steps=8)
    with pytest.raises(ValueError, match=r"takes 4 micro-batch\(es\) of 2 on 2 process\(es\)"):
        resolve_accumulation(config, 2)  # right on one process, not on the two launched


def test_an_auto_batch_that_does_not_split_over_the_processes_names_the_processes_not_a_batch_size():
    """--auto_train_batch_size sets each process's share itself: a --global_batch_size the processes do not divide
    is refused as such, not as a --train_batch_size the user never gave."""
    config = TrainConfig(output_dir="run", global_batch_size=16, auto_train_batch_size=True)
    with pytest.raises(ValueError, match=r"^--global_batch_size=16 does not split evenly over 3 processes: launch a "
                                         r"number of processes that divides it$"):
        resolve_accumulation(config, 3)
    resolve_accumulation(config, 2)
    assert (config.train_batch_size, config.gradient_accumulation_steps) == (8, 1)


def test_a_global_batch_trains_as_the_same_accumulation_given_by_hand(selected_run, make_run_config, tmp_path,
                                                                      capsys):
    weights = {}
    for name, overrides in (("global", {"global_batch_size": 4}), ("by_hand", {"gradient_accumulation_steps": 2})):
        run_dir = copy_selected_run(selected_run, tmp_path / name)
        config = _config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="none",
                         train_batch_size=2, learning_rate=1e-2, **overrides)
        weights[name] = load_file(str(train(config)))
        reset_process_state()
        assert config.gradient_accumulation_steps == 2  # resolved, so the run's settings record it
        out = capsys.readouterr().out
        assert "fewer than an update's" not in out  # 6 selected samples fill an update of 4
        # The run says how to train the same updates in fewer, larger steps.
        assert ("[train] note: each update accumulates 2 micro-batches of 2; where memory allows, --train_batch_size "
                "4 trains as many samples per update in one step, in less time per sample") in out
    assert weights["global"].keys() == weights["by_hand"].keys()
    for key, value in weights["by_hand"].items():
        assert torch.equal(weights["global"][key], value), key


def test_each_update_trains_the_same_samples_however_it_is_split_into_micro_batches(selected_run, make_run_config,
                                                                                    tmp_path, monkeypatch):
    trained = []  # per micro-batch: the selection rows it trained on
    micro_batch_loss = GORSTrainer._micro_batch_loss

    def recording(self, micro_batch):
        trained.append(sorted(self.schedule.indices(micro_batch)))
        return micro_batch_loss(self, micro_batch)

    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", recording)
    updates = {}
    for name, batch, accumulation in (("accumulated", 2, 2), ("whole", 4, 1)):
        trained.clear()
        run_dir = copy_selected_run(selected_run, tmp_path / name)
        train(_config(make_run_config, run_dir, max_train_steps=3, checkpointing_steps=3, report_to="none",
                      train_batch_size=batch, gradient_accumulation_steps=accumulation))
        reset_process_state()
        assert len(trained) == 3 * accumulation
        updates[name] = [sorted(sum(trained[k * accumulation:(k + 1) * accumulation], [])) for k in range(3)]
    assert updates["accumulated"] == updates["whole"]
    # An epoch of the 6 selected samples is two updates of 4 (the second wraps to the permutation's start):
    # every sample is trained in it, none twice but the 2 wrapped.
    epoch = updates["whole"][0] + updates["whole"][1]
    assert sorted(set(epoch)) == list(range(6)) and len(epoch) == 8


def test_a_resume_finds_a_checkpoint_a_killed_save_had_renamed_or_a_slip_had_set_aside(selected_run, make_run_config,
                                                                                       tmp_path, capsys):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    flags = dict(max_train_steps=2, checkpointing_steps=1, report_to="none")
    train(_config(make_run_config, run_dir, **flags))
    reset_process_state()
    checkpoints = run_dir / "checkpoints"
    # Killed between publish_folder's renames while a save replaced checkpoint-2: the complete one is hidden.
    (checkpoints / "checkpoint-2").rename(checkpoints / ".checkpoint-2.old")
    (checkpoints / ".checkpoint-2.tmp").mkdir()
    capsys.readouterr()
    train(_config(make_run_config, run_dir, **flags))
    reset_process_state()
    assert f"resumed from {checkpoints / 'checkpoint-2'} at step 2" in capsys.readouterr().out
    # A run with a mistyped flag set the training aside and was killed before its first checkpoint: `latest`
    # brings it back, as a rerun without the flag does.
    checkpoints.rename(run_dir / "checkpoints.previous-1")
    train(_config(make_run_config, run_dir, **flags, resume_from_checkpoint="latest"))
    reset_process_state()
    out = capsys.readouterr().out
    assert "checkpoints.previous-1 held checkpoints of this same training" in out
    assert f"resumed from {checkpoints / 'checkpoint-2'} at step 2" in out


def test_a_selection_smaller_than_one_update_is_trained_and_the_run_says_samples_repeat(selected_run, make_run_config,
                                                                                       tmp_path, capsys):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    config = _config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="none",
                     train_batch_size=4, gradient_accumulation_steps=2)
    capsys.readouterr()
    assert train(config).is_file()
    reset_process_state()
    assert ("[train] note: the 6 selected samples are fewer than an update's 8: each update takes some of them more "
            "than once") in capsys.readouterr().out


@pytest.mark.parametrize("fused", [True, False])
def test_an_update_the_fp16_loss_scaler_skips_does_not_advance_the_lr_schedule(fused):
    """fp16's GradScaler skips an update whose gradients overflowed; the LR schedule must wait with it (or
    warm-up and decay end early). Accelerate's own check misses it for fused AdamW, whose `step` the scaler
    still calls. A real scaler (on the CPU), optimizer and Accelerate's wrappers."""
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler
    from diffusers.optimization import get_scheduler

    from gors.core.distributed import make_accelerator
    from gors.train import Updates

    make_accelerator()  # the process state Accelerate's wrappers read
    model = torch.nn.Linear(2, 2)
    scaler = torch.amp.GradScaler("cpu")
    inner = torch.optim.AdamW(model.parameters(), lr=1.0, fused=fused)
    optimizer = AcceleratedOptimizer(inner, scaler=scaler)
    scheduler = AcceleratedScheduler(get_scheduler("linear", optimizer=inner, num_warmup_steps=0,
                                                   num_training_steps=10), optimizer)
    updates = Updates(optimizer, scheduler)
    used, changed = [], []
    for overflow in (False, True, False, False):
        loss = model(torch.ones(1, 2)).sum() * (float("inf") if overflow else 1.0)
        scaler.scale(loss).backward()
        before = model.weight.detach().clone()
        updates.step(scaler, update=True)
        optimizer.zero_grad()
        used.append(updates.lrs[0])
        changed.append(not torch.equal(before, model.weight))
    # The scaler's verdict is read one update late, yet each update ran at the learning rate the schedule
    # gives it: the skipped second update left the schedule where it was.
    assert changed == [True, False, True, True]
    assert used == pytest.approx([1.0, 0.9, 0.9, 0.8])
    assert scheduler.get_last_lr()[0] == pytest.approx(0.8)  # the last verdict still pending
    updates.settle()
    reset_process_state()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.7)


def test_the_last_step_is_checkpointed_off_the_checkpointing_grid(selected_run, make_run_config, tmp_path, capsys):
    """A --max_train_steps that --checkpointing_steps does not divide still ends with a checkpoint of the last step:
    a rerun of the finished training has it to go on from, with nothing left to train."""
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    flags = dict(max_train_steps=3, checkpointing_steps=2, report_to="none")
    train(_config(make_run_config, run_dir, **flags))
    reset_process_state()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    capsys.readouterr()
    train(_config(make_run_config, run_dir, **flags))
    assert "at --max_train_steps=3: nothing to train" in capsys.readouterr().out


def test_an_updates_logged_loss_is_the_mean_over_its_micro_batches_logged_one_update_late():
    """`LossLog` logs each update's loss as the mean of its accumulated micro-batches' losses (not their sum, which
    would grow with --gradient_accumulation_steps), with each group's rate, at the update's own step."""
    from gors.core.distributed import make_accelerator
    from gors.train import LossLog

    accelerator = make_accelerator()
    logged = []
    accelerator.log = lambda values, step: logged.append((step, values))
    log = LossLog(accelerator, ["unet", "text_encoder"])
    log.add(1, [torch.tensor(1.0), torch.tensor(3.0)], [1e-4, 5e-6])
    assert logged == []  # read back at the next update, or at a flush
    log.add(2, [torch.tensor(0.5), torch.tensor(1.5)], [2e-4, 6e-6])
    log.flush()
    reset_process_state()
    assert logged == [(1, {"train/loss": 2.0, "train/lr_unet": 1e-4, "train/lr_text_encoder": 5e-6}),
                      (2, {"train/loss": 1.0, "train/lr_unet": 2e-4, "train/lr_text_encoder": 6e-6})]


def test_checkpoints_total_limit_keeps_the_newest(selected_run, make_run_config, tmp_path):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    train(_config(make_run_config, run_dir, max_train_steps=3, checkpointing_steps=1, checkpoints_total_limit=2,
                  report_to="none"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    # A run killed between publishing checkpoint-3 and pruning left checkpoint-1 too: the rerun, with nothing
    # left to train, prunes it on resuming.
    shutil.copytree(run_dir / "checkpoints" / "checkpoint-2", run_dir / "checkpoints" / "checkpoint-1")
    train(_config(make_run_config, run_dir, max_train_steps=3, checkpointing_steps=1, checkpoints_total_limit=2,
                  report_to="none"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    # Resumed from another run folder's checkpoint (--resume_from_checkpoint takes any): that folder is not pruned.
    other = copy_selected_run(selected_run, tmp_path / "other")
    train(_config(make_run_config, other, max_train_steps=4, checkpointing_steps=1, checkpoints_total_limit=1,
                  report_to="none", resume_from_checkpoint=str(run_dir / "checkpoints" / "checkpoint-3")))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == ["checkpoint-4"]


def test_a_training_that_diverges_stops_with_what_to_change_and_saves_nothing_of_it(selected_run, make_run_config,
                                                                                    tmp_path):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    # A learning rate of 1e30 moves the weights to about 1e30 at the first update (finite: checkpoint-1 is saved),
    # and the loss is NaN from the second.
    with pytest.raises(TrainingDiverged, match=r"training diverged: the loss of step 2 is nan; nothing of this step was "
                                               r"saved\. Rerun with a lower --learning_rate \(now 1e\+30\) and "
                                               r"--text_encoder_learning_rate \(now 5e-06\) and without "
                                               r"--resume_from_checkpoint: the training starts over from step 0"):
        train(_config(make_run_config, run_dir, max_train_steps=4, checkpointing_steps=1, learning_rate=1e30,
                      report_to="none"))
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["checkpoint-1"]  # saved before the NaN loss read
    assert not (run_dir / LORA_WEIGHT_NAME).exists()

    # Weights that are not finite are never saved, whatever the loss said (fp16's scaler lets a NaN loss pass).
    trainer = GORSTrainer(_config(make_run_config, run_dir, report_to="none"))
    trainer.selection = load_selection(run_dir)
    trainer._setup_models()
    trainer.check_finite(7)
    weight = next(p for name, p in trainer.denoiser.named_parameters() if "lora_B" in name)
    with torch.no_grad():
        weight[0, 0] = float("inf")
    with pytest.raises(TrainingDiverged, match=r"the LoRA's weights are not finite at step 7 \(NaN or infinite, first "
                                               r"unet\..*lora_B"):
        trainer.save_checkpoint(7)
    assert not (run_dir / "checkpoints" / "checkpoint-7").exists()


def test_a_lora_whose_weights_are_not_finite_is_not_validated(selected_run, make_run_config, tmp_path):
    """Weights that overflow at an update whose loss was still finite stop the training at that step's validation,
    before anything renders or scores them (a diverged LoRA must never become best/)."""
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    # 1e39 overflows float32: the first update sends the up-projections to infinity; the loss before it was finite.
    trainer = GORSTrainer(_config(make_run_config, run_dir, max_train_steps=2, checkpointing_steps=2,
                                  learning_rate=1e39, validation_prompts=["a red circle"], validation_steps=1,
                                  report_to="tensorboard"))
    rendered = []
    trainer.log_validation = lambda step: rendered.append(step)
    with pytest.raises(TrainingDiverged, match=r"the LoRA's weights are not finite at step 1 "):
        trainer.train()
    assert rendered == [] and not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("flags, rates", [
    ({}, "--learning_rate (now 0.0001) and --text_encoder_learning_rate (now 5e-06)"),
    ({"train_text_encoder": False}, "--learning_rate (now 0.0001)"),
    ({"train_unet": False}, "--text_encoder_learning_rate (now 5e-06)"),  # the denoiser's rate trains nothing
])
def test_a_diverged_training_names_the_rates_that_train(flags, rates, selected_run, make_run_config, tmp_path):
    trainer = GORSTrainer(_config(make_run_config, copy_selected_run(selected_run, tmp_path / "run"), report_to="none",
                                  **flags))
    assert trainer.learning_rate_flags() == rates
    assert f"Rerun with a lower {rates} and without --resume_from_checkpoint" in str(TrainingDiverged("x", rates))


def test_the_polynomial_schedule_decays_each_rate_as_diffusers_scripts_do(selected_run, make_run_config, tmp_path):
    # diffusers' schedule decays from the optimizer's default rate to 1e-7: its scripts give AdamW lr=--learning_rate,
    # so the denoiser's rate ends at 1e-7 (without it AdamW's default 1e-3 made the end 1e-4 of every rate).
    trainer = GORSTrainer(_config(make_run_config, copy_selected_run(selected_run, tmp_path / "run"), report_to="none",
                                  lr_scheduler="polynomial", max_train_steps=10))
    trainer.selection = load_selection(Path(trainer.config.output_dir))
    trainer._setup_models()
    trainer.schedule_steps = 10
    trainer._setup_optimizer()
    for _ in range(10):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert trainer.lr_scheduler.get_last_lr() == pytest.approx([1e-7, 5e-6 * 1e-7 / 1e-4])


def test_the_optimizer_takes_every_adam_flag_and_the_schedule_warms_up_over_the_steps_asked_for(
        selected_run, make_run_config, tmp_path):
    """AdamW gets --adam_beta1, --adam_beta2, --adam_weight_decay and --adam_epsilon in every group, and the LR
    schedule rises from 0 over --lr_warmup_steps updates before it holds each group's rate."""
    trainer = GORSTrainer(_config(make_run_config, copy_selected_run(selected_run, tmp_path / "run"), report_to="none",
                                  adam_beta1=0.8, adam_beta2=0.95, adam_weight_decay=0.05, adam_epsilon=1e-6,
                                  lr_scheduler="constant_with_warmup", lr_warmup_steps=2, max_train_steps=4))
    trainer.selection = load_selection(Path(trainer.config.output_dir))
    trainer._setup_models()
    trainer._setup_optimizer()
    assert len(trainer.optimizer.param_groups) == 2
    for group in trainer.optimizer.param_groups:
        assert (group["betas"], group["weight_decay"], group["eps"]) == ((0.8, 0.95), 0.05, 1e-6)
    rates = [trainer.lr_scheduler.get_last_lr()]
    for _ in range(3):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        rates.append(trainer.lr_scheduler.get_last_lr())
    assert [unet for unet, _ in rates] == pytest.approx([0.0, 5e-5, 1e-4, 1e-4])
    assert [encoder for _, encoder in rates] == pytest.approx([0.0, 2.5e-6, 5e-6, 5e-6])


def test_train_without_selection_says_what_to_run(make_run_config, tmp_path):
    with pytest.raises(FileNotFoundError, match="gors select"):
        train(_config(make_run_config, tmp_path / "empty", report_to="none"))


@pytest.mark.parametrize("sharding", ["DEEPSPEED", "FSDP"])
def test_a_sharded_launch_is_refused_before_any_model_loads(selected_run, make_run_config, tmp_path, monkeypatch,
                                                            sharding):
    """DeepSpeed takes one model per Accelerator and LoRA saving does not gather FSDP shards: refused up front."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    import gors.train

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    loaded = []
    monkeypatch.setattr(gors.train.GORSTrainer, "_setup_models", lambda self: loaded.append(True))
    launch = SimpleNamespace(distributed_type=getattr(DistributedType, sharding))
    with pytest.raises(ValueError, match=r"DDP\) only.*accelerate_configs/multi_gpu.yaml"):
        train(_config(make_run_config, run_dir, report_to="none"), accelerator=launch)
    assert not loaded and not (run_dir / "checkpoints").exists()


def test_vae_encodes_each_image_once_and_the_cache_is_reused(selected_run, make_run_config, tmp_path, monkeypatch):
    from diffusers import AutoencoderKL

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    calls = []
    original = AutoencoderKL.encode
    monkeypatch.setattr(AutoencoderKL, "encode", lambda self, x, *a, **k: (calls.append(len(x)), original(self, x, *a, **k))[1])
    train(_config(make_run_config, run_dir, max_train_steps=3, report_to="none"))
    assert sum(calls) == 6  # the six selected images, once, whatever the number of steps

    reset_process_state()
    calls.clear()
    train(_config(make_run_config, run_dir, max_train_steps=4, report_to="none", resume_from_checkpoint="latest"))
    assert calls == []  # the cache on disk is reused


def test_gradient_checkpointing_recomputes_and_trains_the_same_lora(selected_run, make_run_config, tmp_path,
                                                                    monkeypatch):
    import torch.utils.checkpoint

    def lora_of(name: str, checkpointing: bool) -> dict:
        run_dir = copy_selected_run(selected_run, tmp_path / name)
        path = train(_config(make_run_config, run_dir, max_train_steps=2, gradient_checkpointing=checkpointing,
                             report_to="none", learning_rate=1e-2))
        reset_process_state()
        return load_file(str(path))

    plain = lora_of("plain", False)
    recomputed = []
    checkpoint = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint",
                        lambda *args, **kwargs: recomputed.append(1) or checkpoint(*args, **kwargs))
    checkpointed = lora_of("checkpointed", True)
    assert recomputed  # the U-Net's blocks ran under activation checkpointing
    assert plain.keys() == checkpointed.keys() and any(v.abs().max() > 0 for k, v in plain.items() if ".up." in k)
    for key, value in plain.items():  # recomputing activations changes no gradient
        assert torch.allclose(value, checkpointed[key], atol=1e-6), key


def test_benchmark_validation_logs_keeps_the_best_and_leaves_training_unchanged(selected_run, make_run_config,
                                                                                tmp_path):
    import json

    plain_dir = copy_selected_run(selected_run, tmp_path / "plain")
    train(_config(make_run_config, plain_dir, max_train_steps=2, checkpointing_steps=2, report_to="none"))
    reset_process_state()
    validated_dir = copy_selected_run(selected_run, tmp_path / "validated")
    train(_config(make_run_config, validated_dir, max_train_steps=2, checkpointing_steps=2,
                  validation_benchmark="toy:train", validation_num_prompts=2, validation_images_per_prompt=1,
                  validation_steps=1))

    for step in (1, 2):
        summary = json.loads((validated_dir / "validation" / f"step-{step:06d}" / "summary.json").read_text())
        assert summary["num_images"] == 2 and 0.0 <= summary["binding_accuracy"] <= 1.0
        assert "dtype" not in summary["results"]["config"]  # the training's pipeline: no precision of its own claimed
    best = json.loads((validated_dir / "best" / "best.json").read_text())
    assert best["benchmark"] == "toy:train" and best["metric"] == "binding_accuracy" and best["step"] in (1, 2)
    assert (validated_dir / "best" / "pytorch_lora_weights.safetensors").is_file()
    # `gors push --lora best` gives the best LoRA with its step and the training it belongs to.
    from gors.push import RECORD_FILE, PushConfig, push

    staged = push(PushConfig(output_dir=str(validated_dir), repo_id="me/best", lora="best", dry_run=True))
    record = json.loads((staged / RECORD_FILE).read_text())
    assert record["step"] == best["step"] and record["best"] == best and record["training"]["rank"] == 4
    assert (staged / "pytorch_lora_weights.safetensors").read_bytes() == \
        (validated_dir / "best" / "pytorch_lora_weights.safetensors").read_bytes()
    events = list((validated_dir / "logs").rglob("events.out.tfevents.*"))
    logged = b"".join(e.read_bytes() for e in events)
    # Every declared metric, nested ones too; counts are no metric.
    assert b"validation/toy:train/binding_accuracy" in logged and b"validation/toy:train/binding_errors." in logged
    assert b"validation/toy:train/num_images" not in logged
    # Validation samples and scores with its own generators and restores the RNG: same training.
    plain = load_file(plain_dir / "pytorch_lora_weights.safetensors")
    validated = load_file(validated_dir / "pytorch_lora_weights.safetensors")
    assert plain.keys() == validated.keys()
    assert all(torch.equal(plain[k], validated[k]) for k in plain)


def test_a_fresh_training_without_validation_discards_an_earlier_trainings_validation_results(
        selected_run, make_run_config, tmp_path):
    """A training that starts at step 0 without --validation_benchmark still discards the best LoRA and step results
    an earlier training left (one killed before its first checkpoint): a later resume of this training with
    validation on must not take them for its own."""
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    (run_dir / "validation" / "step-000001").mkdir(parents=True)
    (run_dir / "validation" / "step-000001" / "summary.json").write_text('{"binding_accuracy": 1.0}')
    (run_dir / "best").mkdir()
    (run_dir / "best" / "best.json").write_text('{"step": 1, "value": 1.0}')
    train(_config(make_run_config, run_dir, max_train_steps=1, report_to="none"))
    assert not (run_dir / "best").exists() and not (run_dir / "validation").exists()


def test_the_validation_metric_is_a_declared_one_with_its_own_direction(make_run_config, tmp_path):
    from gors.core.distributed import make_accelerator
    from gors.validation import BenchmarkValidation

    def validation(metric):
        config = make_run_config(output_dir=str(tmp_path), validation_benchmark="toy:train", validation_metric=metric)
        return BenchmarkValidation(config, make_accelerator())

    assert validation(None).higher_is_better and validation(None).metric == "binding_accuracy"
    exchanged = validation("binding_errors.exchanged")  # a share of bad images: the lowest is the best
    assert exchanged.higher_is_better is False
    with pytest.raises(ValueError, match=r"--validation_metric='binding_acuracy' is not a metric of toy:train; "
                                         r"choose one of binding_accuracy, "):
        validation("binding_acuracy")


def test_validation_scorer_options_are_checked_before_training(make_run_config, tmp_path):
    from gors.core.distributed import make_accelerator
    from gors.validation import BenchmarkValidation

    config = make_run_config(output_dir=str(tmp_path), validation_benchmark="toy:train",
                             validation_scorer_options={"treshold": 0.5})
    with pytest.raises(ValueError, match=r"--validation_scorer_options: toy:train's scorer 'toy_oracle' has no "
                                         r"option 'treshold'; its options: "):
        BenchmarkValidation(config, make_accelerator())


def test_the_best_lora_is_the_best_value_by_the_metrics_direction_and_survives_a_resume(make_run_config, tmp_path,
                                                                                       monkeypatch):
    from gors.core.distributed import make_accelerator
    from gors.validation import BenchmarkValidation

    def validate(metric, values, resumed=False, training="one training", recorded_as=()):
        """Validate at steps 1, 2, ... (resumed: after the recorded best's step) with the benchmark's
        summaries giving `values`; the saved LoRA file holds its step."""
        config = make_run_config(output_dir=str(tmp_path), validation_benchmark="toy:train", validation_metric=metric)
        validation = BenchmarkValidation(config, make_accelerator())
        resumed_at = json.loads((tmp_path / "best" / "best.json").read_text())["step"] if resumed else 0
        validation.start(resumed_at, training=training, recorded_as=recorded_as)
        validation._scorer = object()  # the stubbed benchmark scores nothing
        key, _, sub = metric.partition(".")
        summaries = iter([{key: {sub: v}} if sub else {key: v} for v in values])
        monkeypatch.setattr(validation.benchmark, "evaluate", lambda *args, **kwargs: next(summaries))
        for step in range(resumed_at + 1, resumed_at + 1 + len(values)):
            validation.run(step, None, lambda folder, step=step: (folder.mkdir(parents=True, exist_ok=True),
                                                                  (folder / "lora").write_text(str(step))))
        return json.loads((tmp_path / "best" / "best.json").read_text()), (tmp_path / "best" / "lora").read_text()

    best, lora = validate("binding_accuracy", [0.3, 0.5, 0.4])
    assert (best["step"], best["value"], lora) == (2, 0.5, "2")  # the highest, its LoRA with it
    best, lora = validate("binding_accuracy", [0.45], resumed=True)  # a resumed run competes with the earlier best
    assert (best["step"], lora) == (2, "2")
    # The training under the identity an earlier gors gave it (a local base model by its path): still its best.
    best, lora = validate("binding_accuracy", [0.45], resumed=True, training="by files", recorded_as=["one training"])
    assert (best["step"], lora, best["training"]) == (2, "2", "one training")
    best, lora = validate("binding_accuracy", [0.45], resumed=True, training="another training")
    assert (best["step"], lora, best["training"]) == (3, "3", "another training")  # another's value does not compare
    best, lora = validate("binding_errors.exchanged", [0.3, 0.1, 0.2])  # a share of errors: the lowest
    assert (best["step"], best["value"], best["metric"], lora) == (2, 0.1, "binding_errors.exchanged", "2")


def test_unknown_validation_benchmark_is_a_clear_error(make_run_config):
    with pytest.raises(ValueError, match=r"^--validation_benchmark='genevel': unknown benchmark 'genevel'; known: "
                                         r"geneval, .*; one of your own: 'module:Class' \(a Benchmark subclass\), "
                                         r"or an entry point of the gors.benchmarks group \(docs/extending.md\)") \
            as refused:
        make_run_config(validation_benchmark="genevel")
    assert "all" not in str(refused.value).split("known: ")[1].split(", ")  # validation measures one benchmark


# `gors` that SIGKILLs itself while saving checkpoint-<step> (argv[1]): after the LoRA file, before the
# optimizer's; a kill from inside hits the same instant on every run, where a timed one from outside may not.
KILL_DURING_SAVE = '''
import os
import signal
import sys

import accelerate.accelerator

from gors.cli import main

step, argv = sys.argv[1], sys.argv[2:]
save = accelerate.accelerator.save_accelerator_state


def save_and_die(output_dir, *args, **kwargs):
    if f"checkpoint-{step}" in os.path.basename(output_dir):
        os.kill(os.getpid(), signal.SIGKILL)
    return save(output_dir, *args, **kwargs)


accelerate.accelerator.save_accelerator_state = save_and_die
main(argv)
'''


@pytest.mark.slow
def test_a_kill_while_saving_a_checkpoint_resumes_from_the_previous_one(selected_run, make_run_config, tmp_path,
                                                                       tiny_sd, monkeypatch):
    settings = dict(max_train_steps=4, checkpointing_steps=2, checkpoints_total_limit=1, report_to="none")
    reference = load_file(str(train(_config(make_run_config, copy_selected_run(selected_run, tmp_path / "reference"),
                                            **settings))))
    reset_process_state()

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE)
    flags = ["--output_dir", str(run_dir), "--pretrained_model_name_or_path", str(tiny_sd), "--resolution", "32",
             "--train_batch_size", "2", "--seed", "0", *[f"--{k}={v}" for k, v in settings.items()]]
    killed = subprocess.run([sys.executable, str(script), "4", "train", *flags], capture_output=True, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-4000:]
    # The limit of one did not delete checkpoint-2 before checkpoint-4 was complete, and the torn save
    # is only a hidden temporary folder.
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["checkpoint-2"]
    assert (root / "checkpoint-2" / "checkpoint.json").is_file()

    seen_steps = []
    original = GORSTrainer._micro_batch_loss
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", lambda self, m: (seen_steps.append(m), original(self, m))[1])
    resumed = load_file(str(train(_config(make_run_config, run_dir, resume_from_checkpoint="latest", **settings))))
    assert seen_steps == [2, 3]
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.allclose(reference[key], resumed[key], atol=1e-6), key
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-4"]


def test_resume_latest_passes_over_an_incomplete_checkpoint(selected_run, make_run_config, tmp_path, monkeypatch,
                                                            capsys):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    train(_config(make_run_config, run_dir, report_to="none"))  # checkpoint-1 and checkpoint-2
    (run_dir / "checkpoints" / "checkpoint-3").mkdir()  # what a kill mid-save left before checkpoints were atomic
    reset_process_state()
    capsys.readouterr()

    seen_steps = []
    original = GORSTrainer._micro_batch_loss
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", lambda self, m: (seen_steps.append(m), original(self, m))[1])
    train(_config(make_run_config, run_dir, max_train_steps=3, resume_from_checkpoint="latest", report_to="none"))
    out = capsys.readouterr().out
    assert "warning: ignoring incomplete checkpoints" in out and str(run_dir / "checkpoints" / "checkpoint-3") in out
    assert seen_steps == [2]  # resumed from checkpoint-2
    assert json.loads((run_dir / "checkpoints" / "checkpoint-3" / "checkpoint.json").read_text())["step"] == 3


def test_checkpoints_total_limit_keeps_the_previous_checkpoint_until_the_new_one_is_complete(
        selected_run, make_run_config, tmp_path, monkeypatch):
    import accelerate.accelerator

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    root = run_dir / "checkpoints"
    during_saves = []
    original = accelerate.accelerator.save_accelerator_state
    monkeypatch.setattr(accelerate.accelerator, "save_accelerator_state",
                        lambda *args, **kwargs: (during_saves.append(sorted(p.name for p in root.iterdir())),
                                                 original(*args, **kwargs))[1])
    train(_config(make_run_config, run_dir, max_train_steps=3, checkpointing_steps=1, checkpoints_total_limit=1,
                  report_to="none"))
    assert [[n for n in names if not n.startswith(".")] for names in during_saves] == [
        [], ["checkpoint-1"], ["checkpoint-2"]]
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-3"]


@pytest.fixture(scope="module")
def trained_run(selected_run, tmp_path_factory):
    """`selected_run` trained for 2 steps with a checkpoint after each (shared: resume a copy)."""
    config = replace(selected_run, output_dir=str(copy_selected_run(selected_run, tmp_path_factory.mktemp("trained"))),
                     max_train_steps=2, checkpointing_steps=1, report_to="none")
    train(config)
    reset_process_state()
    return config


def _resume(trained_run, run_dir, **overrides):
    shutil.copytree(trained_run.output_dir, run_dir)
    return train(replace(trained_run, output_dir=str(run_dir), **{"resume_from_checkpoint": "latest"} | overrides))


def test_a_checkpoint_holds_the_adapters_and_training_state_but_no_base_weights(trained_run):
    """The save hook keeps only the LoRA in a checkpoint: accelerate's own copy of each prepared model (its frozen
    base weights too) is never written beside it."""
    for checkpoint in sorted((Path(trained_run.output_dir) / "checkpoints").iterdir()):
        names = sorted(p.name for p in checkpoint.iterdir())
        assert LORA_WEIGHT_NAME in names and "optimizer.bin" in names, names
        assert not [name for name in names if name.startswith(("model", "pytorch_model"))], names
        assert [name for name in names if name.endswith((".safetensors", ".bin"))] == sorted(
            [LORA_WEIGHT_NAME, "optimizer.bin", "scheduler.bin"]), names


@pytest.mark.parametrize("overrides, error", [
    # Caught before the adapters' shapes clash in `load_state`.
    (dict(rank=8), r"checkpoint-2: it belongs to a run with other settings: rank 4 in the checkpoint, 8 now\. "
                   r"Resume with the original settings, or .*new --output_dir"),
    (dict(train_text_encoder=False), r"train_text_encoder True in the checkpoint, False now"),
    (dict(max_train_steps=1), r"checkpoint-2: it is at step 2, past --max_train_steps=1\. "
                              r"Pass --max_train_steps 2 or more"),
    (dict(resume_from_checkpoint="run/latent_cache"), r"'run/latent_cache': run/latent_cache is not a checkpoint "
                                                       r"folder: their names are checkpoint-<step>"),
], ids=["rank", "train_text_encoder", "max_train_steps", "folder_name"])
def test_resume_refuses_other_settings_a_later_checkpoint_and_other_folders(trained_run, tmp_path, overrides, error,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # a folder relative to the working directory, as typed on a command line
    with pytest.raises(ValueError, match=error):
        _resume(trained_run, tmp_path / "run", **overrides)


def test_another_run_folders_checkpoint_of_other_settings_is_said_to_be_that_folders(trained_run, tmp_path):
    other = Path(trained_run.output_dir) / "checkpoints" / "checkpoint-2"
    with pytest.raises(ValueError, match=rf"cannot resume from {other}: it is a checkpoint of another run folder "
                                         rf"\({other.parent.parent}\), trained on its selection and settings \(rank 4 in "
                                         rf"the checkpoint, 8 now\)\. Resume this folder from one of its own"):
        _resume(trained_run, tmp_path / "run", rank=8, resume_from_checkpoint=str(other))


def test_a_damaged_checkpoint_is_refused_before_any_model_loads_and_the_one_before_resumes(trained_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    damaged = run_dir / "checkpoints" / "checkpoint-2"
    (damaged / "optimizer.bin").write_bytes((damaged / "optimizer.bin").read_bytes()[:100])  # a torch.load traceback
    for resume in ("latest", None):  # asked for, or gone on from as this same training's
        with pytest.raises(ValueError, match=r"checkpoint-2 is damaged since it was saved: optimizer.bin holds 100 "
                                             r"bytes, \d+ were saved\. Delete that folder \(training goes on from "
                                             r".*checkpoint-1\)"):
            train(replace(trained_run, output_dir=str(run_dir), resume_from_checkpoint=resume))
    shutil.rmtree(damaged)
    resumed = load_file(str(train(replace(trained_run, output_dir=str(run_dir), resume_from_checkpoint="latest"))))
    reset_process_state()
    expected = load_file(str(Path(trained_run.output_dir) / "pytorch_lora_weights.safetensors"))
    assert resumed.keys() == expected.keys()
    assert all(torch.equal(resumed[key], expected[key]) for key in expected)


def test_resume_after_a_reselection_is_refused(trained_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    lowest = min(row["reward"] for row in load_selection(run_dir))
    reselected = replace(trained_run, output_dir=str(run_dir), reward_threshold=lowest)  # keeps reward > tau
    select(reselected)
    kept = len(load_selection(run_dir))
    with pytest.raises(ValueError, match=rf"selection.jsonl changed since.*selection_rows 6 in the checkpoint, "
                                         rf"{kept} now"):
        train(replace(reselected, resume_from_checkpoint="latest"))


def test_a_selection_the_checkpoints_were_trained_on_is_kept_when_another_replaces_it(trained_run, tmp_path, capsys):
    from gors.status import folder_status

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    trained_on = (run_dir / "selection.jsonl").read_text()
    select(replace(trained_run, output_dir=str(run_dir)))  # the same selection again: nothing to keep
    assert not list(run_dir.glob("selection.previous-*")) and "kept as" not in capsys.readouterr().out
    lowest = min(row["reward"] for row in load_selection(run_dir))
    select(replace(trained_run, output_dir=str(run_dir), reward_threshold=lowest))
    assert "were trained on the selection this one replaces: it is kept as selection.previous-1.jsonl" in \
        capsys.readouterr().out
    assert (run_dir / "selection.previous-1.jsonl").read_text() == trained_on
    assert (run_dir / "selection_summary.previous-1.json").is_file()
    assert dict(folder_status(run_dir))["selection"].endswith(
        "; selected since the newest checkpoint was trained (on selection.previous-1.jsonl)")
    select(replace(trained_run, output_dir=str(run_dir), reward_threshold=lowest / 2))  # not what was trained on
    assert not (run_dir / "selection.previous-2.jsonl").exists()


def test_a_selection_edited_into_no_selection_is_replaced_without_a_copy(trained_run, tmp_path):
    """No checkpoint was trained on a file edited since into lines that are no rows: nothing of it to keep."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    (run_dir / "selection.jsonl").write_text("[1, 2]\n")
    select(replace(trained_run, output_dir=str(run_dir)))
    assert len(load_selection(run_dir)) == 6 and not list(run_dir.glob("selection.previous-*"))


def test_a_checkpoint_a_killed_save_left_renamed_counts_for_status_and_select(trained_run, tmp_path):
    """A save killed between its two renames leaves only `.checkpoint-<step>.old`, which the next training puts
    back: `gors status` (which moves nothing) shows it, and a reselection keeps the selection it was trained on."""
    from gors.checkpoints import checkpoint_step
    from gors.status import folder_status

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    checkpoints = run_dir / "checkpoints"
    newest = max((p for p in checkpoints.iterdir() if p.name.startswith("checkpoint-")), key=checkpoint_step)
    for folder in [p for p in checkpoints.iterdir() if p.name.startswith("checkpoint-")]:
        folder.rename(checkpoints / f".{folder.name}.old")
    aside = sorted(p.name for p in checkpoints.iterdir())
    step = checkpoint_step(newest)
    assert dict(folder_status(run_dir))["training"].startswith(
        f"step {step} of {step} (100 %): .{newest.name}.old (a killed save's; the next train or resume puts it "
        f"back as {newest.name}), saved ")
    lowest = min(row["reward"] for row in load_selection(run_dir))
    trained_on = (run_dir / "selection.jsonl").read_text()
    select(replace(trained_run, output_dir=str(run_dir), reward_threshold=lowest))
    assert (run_dir / "selection.previous-1.jsonl").read_text() == trained_on
    assert sorted(p.name for p in checkpoints.iterdir()) == aside  # neither moved it


def test_a_training_with_other_settings_sets_the_folders_checkpoints_aside(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    capsys.readouterr()
    train(replace(trained_run, output_dir=str(run_dir), rank=8))
    reset_process_state()
    assert "held checkpoints of a training with other settings (rank 4 in the checkpoint, 8 now): moved to" in (
        capsys.readouterr().out)
    assert sorted(p.name for p in (run_dir / "checkpoints.previous-1").iterdir()) == before  # kept whole
    markers = [json.loads((p / "checkpoint.json").read_text()) for p in (run_dir / "checkpoints").iterdir()]
    assert markers and all(m["fingerprint"]["rank"] == 8 for m in markers)  # only this training's
    # The first command again (the rank was a slip): it goes on from its own checkpoints, not from step 0.
    lora = train(replace(trained_run, output_dir=str(run_dir)))
    reset_process_state()
    assert "checkpoints.previous-1 held checkpoints of this same training, set aside by a training with other " \
           "settings since: moved back to checkpoints/" in capsys.readouterr().out
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    assert (run_dir / "checkpoints.previous-2").is_dir() and not (run_dir / "checkpoints.previous-1").exists()
    expected = load_file(str(Path(trained_run.output_dir) / "pytorch_lora_weights.safetensors"))
    assert all(torch.equal(load_file(str(lora))[key], expected[key]) for key in expected)


def test_resuming_from_a_set_aside_checkpoint_brings_its_training_back_and_keeps_the_other(trained_run, tmp_path,
                                                                                            capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    train(replace(trained_run, output_dir=str(run_dir), rank=8))  # sets the rank-4 training aside
    reset_process_state()
    other = {name: digest for name, digest in _file_hashes(run_dir / "checkpoints").items()
             if name.startswith("checkpoint-")}
    capsys.readouterr()
    # The rank-4 training from its step 1, named where it was set aside: it saves its step 2 beside its own
    # steps, and the rank-8 training's step 2, which had the same name, stays whole.
    train(replace(trained_run, output_dir=str(run_dir),
                  resume_from_checkpoint=str(run_dir / "checkpoints.previous-1" / "checkpoint-1")))
    reset_process_state()
    assert (f"{run_dir / 'checkpoints.previous-1'} (this training's, set aside by one with other settings) is "
            f"checkpoints/ again; what checkpoints/ held moved to {run_dir / 'checkpoints.previous-2'}"
            ) in capsys.readouterr().out
    assert {name: digest for name, digest in _file_hashes(run_dir / "checkpoints.previous-2").items()
            if name.startswith("checkpoint-")} == other
    markers = [json.loads((p / "checkpoint.json").read_text()) for p in (run_dir / "checkpoints").glob("checkpoint-*")]
    assert len(markers) == 2 and all(m["fingerprint"]["rank"] == 4 for m in markers)
    assert not (run_dir / "checkpoints.previous-1").exists()


@pytest.mark.parametrize("setting, value, error", [
    ("lr_scheduler", "cosin", r"--lr_scheduler='cosin'; choose one of linear, "),
    ("adam_beta1", 2.0, r"--adam_beta1=2.0: use a value in \[0, 1\)"),
    ("adam_epsilon", 0.0, r"--adam_epsilon=0.0: must be > 0"),
])
def test_a_training_refused_for_a_bad_optimizer_setting_leaves_the_checkpoints_where_they_were(
        trained_run, tmp_path, setting, value, error):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    before = _file_hashes(run_dir / "checkpoints")
    config = replace(trained_run, output_dir=str(run_dir))
    setattr(config, setting, value)  # past the config's own checks: the trainer refuses it too
    with pytest.raises(ValueError, match=error):
        train(config)
    reset_process_state()
    assert _file_hashes(run_dir / "checkpoints") == before and not list(run_dir.glob("checkpoints.previous-*"))
    # The corrected rerun (here: the same settings) finds its checkpoints: nothing left to train.
    train(replace(trained_run, output_dir=str(run_dir)))
    assert _file_hashes(run_dir / "checkpoints") == before


def test_a_continue_from_a_checkpoint_at_the_trainings_end_is_refused(trained_run, selected_run, tmp_path):
    """Online GORS goes on from the round before's checkpoint to a later --max_train_steps: one already at this
    training's end (it would train nothing and pass its LoRA off as this round's) is refused before any model loads."""
    end = Path(trained_run.output_dir) / "checkpoints" / "checkpoint-2"
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    with pytest.raises(ValueError, match=r"checkpoint-2 is at step 2, not before this training's end at step 2"):
        train(replace(trained_run, output_dir=str(run_dir)), continue_from=end)
    assert not (run_dir / "checkpoints").exists() and not (run_dir / LORA_WEIGHT_NAME).exists()


def test_a_fresh_optimizer_continuing_from_each_step_draws_its_own_random_stream(trained_run, selected_run, tmp_path):
    """Continuing with only the adapters (`reset_optimizer`, a round's fresh optimizer) reseeds from --seed and the
    step gone on from: rounds that go on from different steps do not repeat each other's noise and timesteps."""
    def draws_after_continuing(step: int) -> torch.Tensor:
        run_dir = copy_selected_run(selected_run, tmp_path / f"from-{step}")
        trainer = GORSTrainer(replace(trained_run, output_dir=str(run_dir), max_train_steps=3),
                              continue_from=Path(trained_run.output_dir) / "checkpoints" / f"checkpoint-{step}",
                              reset_optimizer=True)
        checkpoint = trainer._set_up()
        assert checkpoint is None and trainer._resume(checkpoint) == step
        reset_process_state()
        return torch.randn(16)  # what the first step's draws come from

    assert not torch.equal(draws_after_continuing(1), draws_after_continuing(2))


def test_an_optimizer_setting_changed_on_the_trainer_is_refused_before_the_checkpoints_move(trained_run, tmp_path):
    """The trainer checks the optimizer settings again as training starts (`check_optimizer`): one changed on its
    config after it was made is refused with the flag's own message, and the folder's checkpoints stay where they
    were, not set aside as another training's."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    before = _file_hashes(run_dir / "checkpoints")
    trainer = GORSTrainer(replace(trained_run, output_dir=str(run_dir)))
    trainer.config.lr_scheduler = "cosin"
    with pytest.raises(ValueError, match=r"--lr_scheduler='cosin'; choose one of linear, "):
        trainer.train()
    assert _file_hashes(run_dir / "checkpoints") == before and not list(run_dir.glob("checkpoints.previous-*"))


def test_a_checkpoint_whose_weights_are_not_finite_is_not_saved_as_the_final_lora(trained_run, tmp_path):
    """A resume with nothing left to train saves the checkpoint's adapters as the LoRA only if they are finite: a
    checkpoint that recorded no file digests (an older gors') may hold a diverged LoRA."""
    from safetensors.torch import save_file

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    (run_dir / LORA_WEIGHT_NAME).unlink()
    checkpoint = run_dir / "checkpoints" / "checkpoint-2"
    marker = json.loads((checkpoint / "checkpoint.json").read_text())
    del marker["files"]
    (checkpoint / "checkpoint.json").write_text(json.dumps(marker))
    weights = load_file(str(checkpoint / LORA_WEIGHT_NAME))
    weights = {key: value.fill_(float("nan")) if "lora.up" in key or "lora_B" in key else value
               for key, value in weights.items()}
    save_file(weights, str(checkpoint / LORA_WEIGHT_NAME))
    with pytest.raises(TrainingDiverged, match=r"the LoRA's weights are not finite at step 2 "):
        train(replace(trained_run, output_dir=str(run_dir), resume_from_checkpoint="latest"))
    assert not (run_dir / LORA_WEIGHT_NAME).exists()


def test_the_lora_file_is_replaced_whole_or_not_at_all(trained_run, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, run_dir)
    lora = (run_dir / LORA_WEIGHT_NAME).read_bytes()

    def killed_mid_write(save_directory, **layers):
        (Path(save_directory) / LORA_WEIGHT_NAME).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(StableDiffusionPipeline, "save_lora_weights", staticmethod(killed_mid_write))
    with pytest.raises(KeyboardInterrupt):
        train(replace(trained_run, output_dir=str(run_dir), resume_from_checkpoint="latest"))
    reset_process_state()
    assert (run_dir / LORA_WEIGHT_NAME).read_bytes() == lora
    assert not list(run_dir.glob(".lora-*"))


def test_resume_at_max_train_steps_saves_the_checkpoint_lora(trained_run, tmp_path, capsys):
    trained = load_file(str(Path(trained_run.output_dir) / "pytorch_lora_weights.safetensors"))
    capsys.readouterr()
    resumed = load_file(str(_resume(trained_run, tmp_path / "run")))
    out = capsys.readouterr().out
    assert "nothing to train" in out and "selected samples" not in out  # no steps announced that it does not train
    assert trained.keys() == resumed.keys() and all(torch.equal(trained[k], resumed[k]) for k in trained)


def test_validation_autocasts_generation_only():
    # The trainer hands the benchmark this wrapper: the pipeline call autocasts, the scorer after it does not.
    class Pipeline:
        scheduler = "the pipeline's own"

        def __call__(self, prompt):
            return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")

    wrapped = AutocastPipeline(Pipeline(), lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert wrapped(prompt=["a red circle"]) == (True, torch.bfloat16)
    assert wrapped.scheduler == "the pipeline's own"
    assert not torch.is_autocast_enabled("cpu")


def test_validation_samples_with_the_benchmarks_own_sampler(make_run_config, tmp_path, hub_cache):
    """GenEval's protocol keeps the checkpoint's scheduler; the trainer's validation pipeline takes it."""
    from gors.core.distributed import make_accelerator
    from gors.validation import BenchmarkValidation
    from rewards.combined import reward_models

    hub_cache(*reward_models("geneval").values())  # as a user's cache holds them

    def scheduler(benchmark):
        config = make_run_config(output_dir=str(tmp_path), validation_benchmark=benchmark)
        return BenchmarkValidation(config, make_accelerator()).backbone.sampling.scheduler

    assert scheduler("geneval") is None and scheduler("toy:train") == "DDIMScheduler"


def test_8bit_adam_trains_with_bitsandbytes_optimizer_and_binds_its_checkpoints(selected_run, make_run_config, tmp_path,
                                                                                monkeypatch):
    import types

    made = []

    class AdamW8bit(torch.optim.AdamW):  # stands in for bitsandbytes' (not installable without CUDA here)
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            super().__init__(*args, **kwargs)

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    config = _config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="none",
                     use_8bit_adam=True)
    with monkeypatch.context() as patch:  # only while the trainer picks its optimizer (peft probes the module too)
        patch.setitem(sys.modules, "bitsandbytes", types.SimpleNamespace(optim=types.SimpleNamespace(
            AdamW8bit=AdamW8bit)))
        trainer = GORSTrainer(config)
    trainer.train()
    assert isinstance(trainer.optimizer.optimizer, AdamW8bit) and made and "fused" not in made[0]
    assert trainer.fingerprint["use_8bit_adam"] is True  # a checkpoint of plain AdamW state is not resumed with it


def test_a_training_from_step_0_sets_an_earlier_trainings_logs_aside(selected_run, make_run_config, tmp_path, capsys):
    def events(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.rglob("events.*"))

    # A training with checkpoints: another training's (other settings) moves them aside with its logs.
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    train(_config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="tensorboard"))
    reset_process_state()
    first = events(run_dir / "logs")
    assert first
    train(_config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="tensorboard",
                  learning_rate=2e-4))
    reset_process_state()
    assert "moved to" in capsys.readouterr().out and events(run_dir / "checkpoints.previous-1" / "logs") == first
    # Without a checkpoint (as a run killed before its first leaves it), the logs alone are set aside at step 0 (by
    # a third training: the first one's own command would go on from its checkpoints set aside).
    shutil.rmtree(run_dir / "checkpoints")
    first = events(run_dir / "logs")
    train(_config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="tensorboard",
                  learning_rate=3e-4))
    assert "held the logs of an earlier training: moved to" in capsys.readouterr().out
    assert first and events(run_dir / "logs.previous-1") == first and set(events(run_dir / "logs")).isdisjoint(first)


def test_a_finished_training_leaves_no_save_or_load_hook_on_its_accelerator(selected_run, make_run_config, tmp_path):
    """The next online round trains on the same Accelerator: the hooks of a finished training (save its LoRA, load
    its adapters) are gone, so that a later `save_state` writes no LoRA of the modules it trained."""
    from gors.train import training_accelerator

    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    config = _config(make_run_config, run_dir, max_train_steps=1, report_to="none")
    accelerator = training_accelerator(config)
    train(config, accelerator=accelerator)
    accelerator.save_state(str(tmp_path / "later"))
    reset_process_state()
    assert not (tmp_path / "later" / LORA_WEIGHT_NAME).exists()


def test_a_resumed_training_keeps_its_logs_in_place(selected_run, make_run_config, tmp_path):
    """Only a training that starts at step 0 sets the logging folder aside: a resumed one goes on writing beside its
    earlier steps' logs, so that `gors report` draws the whole training."""
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    train(_config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1, report_to="tensorboard"))
    reset_process_state()
    first = sorted(p.relative_to(run_dir) for p in (run_dir / "logs").rglob("events.*"))
    train(_config(make_run_config, run_dir, max_train_steps=2, checkpointing_steps=1, report_to="tensorboard",
                  resume_from_checkpoint="latest"))
    after = sorted(p.relative_to(run_dir) for p in (run_dir / "logs").rglob("events.*"))
    assert first and set(first) < set(after) and not list(run_dir.glob("logs.previous-*"))


def test_validation_prompts_are_not_rendered_where_no_tensorboard_keeps_them(selected_run, make_run_config, tmp_path,
                                                                              capsys):
    run_dir = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(_config(make_run_config, run_dir, max_train_steps=1, checkpointing_steps=1,
                                  validation_prompts=["a red circle"], validation_steps=1, report_to="none"))
    trainer.log_validation = lambda step: pytest.fail("rendered for no one")
    trainer.train()
    assert "--validation_prompts renders go to TensorBoard, which --report_to=none does not write: not rendered" \
        in capsys.readouterr().out
