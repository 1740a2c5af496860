"""What `gors train` (and `gors run`) refuse before anything in the run folder changes or any model loads:
an `--anchor_below` that leaves no timestep to learn, a tracker that is not installed, another model than
the samples', and selected images deleted since `gors select`."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from diffusers import DDPMScheduler

import gors.train
from gors.config import TrainConfig
from gors.core.distributed import reset_process_state
from gors.core.store import StoreError
from gors.run import check_run_inputs
from gors.select import load_selection
from gors.train import train, training_accelerator
from tests.run_copies import copy_selected_run


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained_folder(selected_run, tmp_path_factory) -> Path:
    """`selected_run` trained 1 step, a checkpoint saved (read-only: copy it)."""
    folder = tmp_path_factory.mktemp("trained") / "run"
    folder.mkdir()
    copy_selected_run(selected_run, folder)
    train(replace(selected_run, output_dir=str(folder), max_train_steps=1, checkpointing_steps=1, report_to="none"))
    reset_process_state()
    return folder


def _copy(trained_folder: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained_folder, tmp_path / "run")
    return tmp_path / "run"


def test_an_anchor_below_every_timestep_is_refused_before_the_checkpoints_move(trained_folder, selected_run,
                                                                               tmp_path, monkeypatch):
    run_dir = _copy(trained_folder, tmp_path)
    before = _hashes(run_dir / "checkpoints")
    timesteps = DDPMScheduler.from_pretrained(selected_run.pretrained_model_name_or_path,
                                              subfolder="scheduler").config.num_train_timesteps
    monkeypatch.setattr(gors.train.GORSTrainer, "_setup_models", lambda self: pytest.fail("weights loaded"))
    config = replace(selected_run, output_dir=str(run_dir), max_train_steps=1, report_to="none")
    for anchor in (timesteps, 2000):
        with pytest.raises(ValueError, match=rf"--anchor_below={anchor}: the model's noise schedule has {timesteps} "
                                             r"timesteps .*learn nothing.*or 0 for off"):
            train(replace(config, anchor_below=anchor))
        reset_process_state()
    assert _hashes(run_dir / "checkpoints") == before and not list(run_dir.glob("checkpoints.previous-*"))
    with pytest.raises(ValueError, match=r"--anchor_below=2000"):  # `gors run` refuses it before generating
        check_run_inputs(replace(config, anchor_below=2000))


def test_an_anchor_below_the_whole_timestep_range_is_refused_with_the_config(make_run_config):
    with pytest.raises(ValueError, match=r"--anchor_below=800: --timestep_range 500 800 trains timesteps 500 to 799, "
                                         r"all below it.*Give a timestep in \(500, 800\), e.g. --anchor_below 650"):
        make_run_config(timestep_range=[500, 800], anchor_below=800)
    assert make_run_config(timestep_range=[500, 800], anchor_below=799).anchor_below == 799
    # At or below the range's first timestep no drawn timestep is anchored: the flag would do nothing.
    with pytest.raises(ValueError, match=r"--anchor_below=500: --timestep_range 500 800 trains timesteps 500 to 799, "
                                         r"none below it, so no step would be anchored.*--anchor_below 650, or 0"):
        make_run_config(timestep_range=[500, 800], anchor_below=500)
    assert make_run_config(timestep_range=[500, 800], anchor_below=501).anchor_below == 501


def test_anchor_below_is_refused_on_flow_matching_families(tiny_sd3, tmp_path):
    config = TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(tiny_sd3),
                         anchor_below=500, report_to="none")
    with pytest.raises(ValueError, match=r"--anchor_below: .*trains a rectified flow"):
        gors.train.GORSTrainer(config)


@pytest.mark.parametrize("tracker, message", [
    ("wandb", r"--report_to=wandb: wandb is not installed, so the run would log nowhere\. `pip install wandb`, or "
              r"pass --report_to tensorboard"),
    ("tensorbord", r"--report_to='tensorbord'; choose one of none, all, .*tensorboard"),
])
def test_a_tracker_that_is_not_installed_is_refused(make_run_config, tracker, message):
    with pytest.raises(ValueError, match=message):
        make_run_config(report_to=tracker)


def test_the_samples_model_is_named_before_any_hub_call(selected_run, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(Path(selected_run.output_dir) / "samples", run_dir / "samples")
    monkeypatch.setattr(gors.train, "detect_backbone", lambda *args: pytest.fail("the model was looked up"))
    config = TrainConfig(output_dir=str(run_dir))  # --pretrained_model_name_or_path left at its default
    message = (rf"the samples in .* were generated by '{selected_run.pretrained_model_name_or_path}'.*"
               rf"--pretrained_model_name_or_path {selected_run.pretrained_model_name_or_path}")
    with pytest.raises(ValueError, match=message):
        training_accelerator(config)  # what `gors train` builds first
    with pytest.raises(ValueError, match=message):
        train(config)


def test_gors_train_without_a_model_flag_trains_the_model_that_generated_the_samples(selected_run, tmp_path):
    from gors.cli import command_config, main

    run_dir = tmp_path / "run"
    shutil.copytree(selected_run.output_dir, run_dir)
    config = command_config("train", ["--output_dir", str(run_dir)], "gors train")
    assert (config.pretrained_model_name_or_path, config.revision) == (selected_run.pretrained_model_name_or_path, None)
    given = command_config("train", ["--output_dir", str(run_dir), "--pretrained_model_name_or_path", "x/y"], "gors train")
    assert given.pretrained_model_name_or_path == "x/y"
    # A folder without samples: the paper's model, as before.
    assert command_config("train", ["--output_dir", str(tmp_path / "none")], "gors train"
                          ).pretrained_model_name_or_path == "stabilityai/stable-diffusion-2-base"
    main(["train", "--output_dir", str(run_dir), "--max_train_steps", "1", "--report_to", "none"])
    assert (run_dir / "pytorch_lora_weights.safetensors").is_file()


def test_a_deleted_selected_image_is_refused_before_the_checkpoints_move(trained_folder, selected_run, tmp_path):
    run_dir = _copy(trained_folder, tmp_path)
    before = _hashes(run_dir / "checkpoints")
    row = load_selection(run_dir)[1]
    (run_dir / "samples" / row["path"]).unlink()
    config = replace(selected_run, output_dir=str(run_dir), max_train_steps=1, report_to="none", rank=8)
    shutil.rmtree(run_dir / "latent_cache")
    with pytest.raises(StoreError, match=rf"1 of the {len(load_selection(run_dir))} selected images are missing "
                                         rf"\(.*{row['path']}\).*Rerun `gors generate` .*then `gors score` and "
                                         r"`gors select`"):
        train(config)
    reset_process_state()
    assert _hashes(run_dir / "checkpoints") == before and not list(run_dir.glob("checkpoints.previous-*"))
    shutil.copytree(trained_folder / "latent_cache", run_dir / "latent_cache")
    train(config)  # its latents are cached: the image is not read again


def test_one_config_file_drives_every_stage_and_names_itself_for_an_unknown_key():
    from gors.config import EvaluateConfig, GenerateConfig, config_file_values

    values = {"output_dir": "out", "images_per_prompt": 4, "reward": "b_vqa", "max_train_steps": 10}
    assert config_file_values(GenerateConfig, values, "all.yaml") == {"output_dir": "out", "images_per_prompt": 4}
    with pytest.raises(ValueError, match=r"--config all.yaml: unknown keys \['max_train_step'\] for GenerateConfig "
                                         r"\(nor any other stage of `gors run`\)"):
        config_file_values(GenerateConfig, {"max_train_step": 10}, "all.yaml")
    with pytest.raises(ValueError, match=r"--config eval.yaml: unknown keys \['reward'\] for EvaluateConfig;"):
        config_file_values(EvaluateConfig, {"reward": "b_vqa"}, "eval.yaml")


def test_a_base_model_that_moved_while_it_loaded_is_refused(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import gors.train
    from gors.core.hub import ModelLoadError
    from gors.train import GORSTrainer

    trainer = GORSTrainer.__new__(GORSTrainer)  # only what the check reads
    trainer.config = SimpleNamespace(pretrained_model_name_or_path="org/model", revision=None, output_dir=str(tmp_path))
    trainer.accelerator = SimpleNamespace(state=SimpleNamespace(num_processes=1))
    trainer.fingerprint = {"base_model_commit": "a" * 40}
    monkeypatch.setattr(gors.train, "model_version", lambda name, revision=None: "a" * 40)
    trainer._check_base_commit()  # loaded at the commit its checkpoints record
    monkeypatch.setattr(gors.train, "model_version", lambda name, revision=None: "b" * 40)  # a download meanwhile
    with pytest.raises(ModelLoadError, match=f"moved from commit {'a' * 40} to {'b' * 40} while it loaded.*"
                                             f"--revision {'a' * 40}"):
        trainer._check_base_commit()
    trainer.fingerprint = {}  # a version unknown at the start (a Hub id the cache lacked): nothing to compare
    trainer._check_base_commit()
    # A local folder written while it loaded: no --revision to offer.
    trainer.fingerprint = {"base_model_commit": "sha256:" + "a" * 64}
    monkeypatch.setattr(gors.train, "model_version", lambda name, revision=None: "sha256:" + "b" * 64)
    with pytest.raises(ModelLoadError, match=r"its files changed while it loaded \(fingerprint sha256:aaaaaaaaaaaa\.\.\., "
                                             r"now sha256:bbbbbbbbbbbb\.\.\.\)\. Rerun once nothing writes"):
        trainer._check_base_commit()


@pytest.mark.parametrize("known_at_start", [True, False], ids=["rewritten", "unknown_at_start"])
def test_a_training_whose_base_model_changed_before_it_loaded_is_refused_before_any_step(known_at_start, selected_run,
                                                                                       tmp_path, monkeypatch):
    """`train` checks the version the base model loaded at (`_check_base_commit`) against the samples' too, not only
    the one it found at the start: a local model folder rewritten in between, or a model whose version was not known
    when the training started (a Hub id the cache lacked), is refused before any step, checkpoint or LoRA."""
    import gors.checkpoints
    from gors.lora import LORA_WEIGHT_NAME
    from gors.train import GORSTrainer

    run_dir = tmp_path / "run"
    copy_selected_run(selected_run, run_dir)
    trainer = GORSTrainer(replace(selected_run, output_dir=str(run_dir), max_train_steps=1, report_to="none"))
    stepped, micro_batch_loss = [], GORSTrainer._micro_batch_loss
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss",
                        lambda self, micro_batch: (stepped.append(micro_batch), micro_batch_loss(self, micro_batch))[1])
    if not known_at_start:  # the checkpoints' fingerprint records no version
        monkeypatch.setattr(gors.checkpoints, "model_version", lambda name, revision=None: None)
    monkeypatch.setattr(gors.train, "model_version", lambda name, revision=None: "sha256:" + "b" * 64)
    with pytest.raises(ValueError, match=r"the samples in .* were generated by another version of it"):
        trainer.train()
    assert not stepped and not (run_dir / "checkpoints").exists() and not (run_dir / LORA_WEIGHT_NAME).exists()
