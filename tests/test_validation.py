"""Validation during training (`gors.validation`): whose best LoRA `best/` holds, what killed and
earlier trainings leave behind, the metrics logged, the flags refused, and validation leaving the
training exactly as it was."""

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from gors.core.distributed import make_accelerator, reset_process_state
from gors.core.io import recover_folder
from gors.lora import LORA_WEIGHT_NAME
from gors.train import GORSTrainer, train
from gors.validation import BenchmarkValidation, discard_validation_results, training_identity, validation_target
from tests.run_copies import copy_selected_run


def _best(folder: Path) -> dict:
    return json.loads((folder / "best" / "best.json").read_text())


def _summary(folder: Path, step: int) -> dict:
    return json.loads((folder / "validation" / f"step-{step:06d}" / "summary.json").read_text())


def _stubbed(make_run_config, folder: Path, monkeypatch, values: list[float], **overrides) -> BenchmarkValidation:
    """toy:train validation in `folder` whose benchmark 'scores' `values` (binding_accuracy) in turn, under the toy
    protocol's sampling settings (it samples nothing)."""
    protocol = dict(validation_num_inference_steps=None, validation_resolution=None)
    config = make_run_config(output_dir=str(folder), validation_benchmark="toy:train", **(protocol | overrides))
    validation = BenchmarkValidation(config, make_accelerator())
    validation._scorer = object()  # the stubbed benchmark scores nothing
    summaries = iter([{"binding_accuracy": v} for v in values])
    monkeypatch.setattr(validation.benchmark, "evaluate", lambda *args, **kwargs: next(summaries))
    return validation


def _validate(validation: BenchmarkValidation, steps: range) -> None:
    """Run `validation` at `steps`; the LoRA it saves is a file holding its step."""
    for step in steps:
        validation.run(step, None, lambda folder, step=step: (folder.mkdir(parents=True, exist_ok=True),
                                                              (folder / "lora").write_text(str(step))))


def test_a_resumed_run_competes_only_with_the_best_of_its_own_training_and_validation_settings(
        make_run_config, tmp_path, monkeypatch):
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9, 0.5])
    validation.start(0, training="A")
    _validate(validation, range(1, 3))
    assert (_best(tmp_path)["step"], _best(tmp_path)["training"]) == (1, "A")
    # Training B resumed at step 2 (best/ is A's, as it was before a fresh start discarded it): A's 0.9 does
    # not compare, B's first value replaces it, however low.
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.1])
    validation.start(2, training="B")
    _validate(validation, range(3, 4))
    assert (_best(tmp_path)["step"], _best(tmp_path)["value"], (tmp_path / "best" / "lora").read_text()) == (
        3, 0.1, "3")
    # B resumed with other validation prompts: values on other prompts do not compare either.
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.05], validation_num_prompts=8)
    validation.start(3, training="B")
    _validate(validation, range(4, 5))
    assert (_best(tmp_path)["step"], _best(tmp_path)["validation"]["num_prompts"]) == (4, 8)
    # B resumed with the same settings competes with its best: 0.01 is no better than 0.05.
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.01], validation_num_prompts=8)
    validation.start(4, training="B")
    _validate(validation, range(5, 6))
    assert _best(tmp_path)["step"] == 4 and (tmp_path / "best" / "lora").read_text() == "4"


def test_a_best_lora_is_bound_to_the_validation_sampler_one_recorded_before_to_the_familys(
        make_run_config, tmp_path, monkeypatch):
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="A")
    _validate(validation, range(1, 2))
    assert _best(tmp_path)["validation"]["sampler"] == "DDIMScheduler"  # the toy benchmark's, SD's own
    # A best.json written before the sampler was recorded validated with the family's own (DDIM): it competes.
    best = _best(tmp_path)
    del best["validation"]["sampler"]
    (tmp_path / "best" / "best.json").write_text(json.dumps(best))
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    validation.start(1, training="A")
    _validate(validation, range(2, 3))
    assert _best(tmp_path)["step"] == 1
    # Validated with another sampler (GenEval's protocol samples with the checkpoint's scheduler): it does not.
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.1])
    validation.settings["sampler"] = "the checkpoint's"
    validation.start(2, training="A")
    _validate(validation, range(3, 4))
    assert (_best(tmp_path)["step"], _best(tmp_path)["value"]) == (3, 0.1)


def test_a_best_lora_is_bound_to_the_image_side_and_scoring_version_one_recorded_before_to_those_of_then(
        make_run_config, tmp_path, monkeypatch):
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="A")
    _validate(validation, range(1, 2))
    recorded = _best(tmp_path)["validation"]
    assert (recorded["resolution"], recorded["scoring_versions"]) == (64, {})  # the toy protocol's side
    # Written before they were recorded: the toy benchmark sampled at 64 px then too, its scorer unversioned.
    best = _best(tmp_path)
    del best["validation"]["resolution"], best["validation"]["scoring_versions"]
    (tmp_path / "best" / "best.json").write_text(json.dumps(best))
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    validation.start(1, training="A")
    _validate(validation, range(2, 3))
    assert _best(tmp_path)["step"] == 1
    # Validated at another side, or by another version of the scorer: it does not compare.
    for key, value in (("resolution", 128), ("scoring_versions", {"toy_oracle": 2})):
        best = _best(tmp_path)
        best["validation"][key] = value
        (tmp_path / "best" / "best.json").write_text(json.dumps(best))
        validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.1])
        validation.start(best["step"], training="A")
        _validate(validation, range(best["step"] + 1, best["step"] + 2))
        assert (_best(tmp_path)["step"], _best(tmp_path)["value"]) == (best["step"] + 1, 0.1), key


@pytest.mark.parametrize("benchmark, family, resolution, earlier", [
    # SD 1/2 protocols sample at the checkpoint's own side now, at 512 px before (a 768-v model too).
    ("t2i_compbench", "sd", 768, {"resolution": 512, "scoring_versions": {}}),
    ("t2i_compbench", "sdxl", 1024, {"resolution": 1024, "scoring_versions": {}}),  # another family: its own, then too
    # GenEval's scores before its detector input was resized as mmdetection's: version 2.
    ("geneval", "sd", 512, {"resolution": 512, "scoring_versions": {"geneval": 2}}),
    ("lpg_bench", "sd", 512, {"resolution": 512, "scoring_versions": {"tit_score": 2}}),
])
def test_the_settings_an_unrecorded_best_was_validated_with(benchmark, family, resolution, earlier):
    from evaluators import build_benchmark
    from gors.core.backbones import FAMILIES
    from gors.validation import earlier_settings

    backbone = next(b for b in FAMILIES.values() if b.name == family)
    built = build_benchmark(benchmark, "color" if benchmark == "t2i_compbench" else None)
    settings = earlier_settings(built, backbone, resolution, built.scorer_spec()[0])
    assert {key: settings[key] for key in earlier} == earlier


def test_online_rounds_are_one_training_across_their_selections():
    # Round r continues round r-1's checkpoint on its own selection (the rest of the fingerprint must match):
    # their best LoRAs compete. A single training's identity includes its selection.
    round_0 = {"selection_rows": 6, "selection_sha256": "aaa", "rank": 4, "learning_rate": 1e-4}
    round_1 = round_0 | {"selection_rows": 5, "selection_sha256": "bbb"}
    assert training_identity(round_0, with_selection=False) == training_identity(round_1, with_selection=False)
    assert training_identity(round_0) != training_identity(round_1)
    assert training_identity(round_0, False) != training_identity(round_0 | {"rank": 8}, False)


def test_discarding_validation_results_leaves_nothing_half_deleted_or_to_put_back(tmp_path, monkeypatch,
                                                                                   killed_while_deleting):
    for folder in ("best", ".best.old", ".best.tmp", "validation/step-000001/samples"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "file").write_text(folder)
    with pytest.raises(KeyboardInterrupt):
        discard_validation_results(tmp_path)
    monkeypatch.undo()
    # Killed while deleting the copy a kill mid-publish left aside: best/ is whole, the copy will not come back.
    assert (tmp_path / "best" / "file").read_text() == "best" and not (tmp_path / ".best.old").exists()
    discard_validation_results(tmp_path)
    recover_folder(tmp_path / "best")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_fresh_training_sets_an_earlier_trainings_best_lora_aside_with_validation_on_or_off(
        selected_run, make_run_config, tmp_path):
    run = copy_selected_run(selected_run, tmp_path / "run")
    common = dict(output_dir=str(run), validation_num_prompts=2, report_to="none")
    validated = dict(common, validation_benchmark="toy:train")
    train(make_run_config(**validated, max_train_steps=2, checkpointing_steps=2, validation_steps=1))
    reset_process_state()
    assert (run / "best").is_dir()
    a_best = load_file(run / "best" / LORA_WEIGHT_NAME)
    # Training B (another learning rate) starts at step 0 without validation, and is stopped after step 1.
    train(make_run_config(output_dir=str(run), report_to="none", learning_rate=1e-2, max_train_steps=1,
                          checkpointing_steps=1))
    reset_process_state()
    assert not (run / "best").exists() and not (run / "validation").exists()
    # A's best LoRA and validation results are kept with its checkpoints, not deleted.
    aside = run / "checkpoints.previous-1"
    assert (aside / "checkpoint-2").is_dir() and (aside / "validation" / "step-000001").is_dir()
    kept = load_file(aside / "best" / LORA_WEIGHT_NAME)
    assert kept.keys() == a_best.keys() and all(torch.equal(kept[k], a_best[k]) for k in kept)
    # B resumed with validation: best/ is B's LoRA at step 2, its last.
    train(make_run_config(**validated, learning_rate=1e-2, max_train_steps=2, checkpointing_steps=1,
                          validation_steps=2))
    reset_process_state()
    assert _best(run)["step"] == 2
    best, final = load_file(run / "best" / LORA_WEIGHT_NAME), load_file(run / LORA_WEIGHT_NAME)
    assert best.keys() == final.keys() and all(torch.equal(best[k], final[k]) for k in best)


RESUMED = dict(validation_benchmark="toy:train", validation_steps=1, checkpointing_steps=2, report_to="none")


@pytest.fixture(scope="module")
def validated_three_steps(selected_run, make_module_run_config, tmp_path_factory) -> Path:
    """A training of 3 steps validated on 2 prompts after each, checkpointed at step 2 (read-only: copy it)."""
    run = copy_selected_run(selected_run, tmp_path_factory.mktemp("validated") / "run")
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=3, validation_num_prompts=2))
    reset_process_state()
    return run


@pytest.mark.parametrize("num_prompts", [2, 3], ids=["same_settings", "other_num_prompts"])
def test_a_resumed_run_validates_again_the_steps_a_killed_run_validated_after_its_checkpoint(
        validated_three_steps, make_module_run_config, tmp_path, num_prompts):
    run = tmp_path / "run"
    shutil.copytree(validated_three_steps, run)
    # As if killed after step 3's validation, before its checkpoint: a rerun resumes at step 2.
    shutil.rmtree(run / "checkpoints" / "checkpoint-3")
    (run / "validation" / "step-000003" / "killed_runs").write_text("")
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=4, validation_num_prompts=num_prompts))
    reset_process_state()
    assert not (run / "validation" / "step-000003" / "killed_runs").exists()
    assert [_summary(run, step)["num_prompts"] for step in (1, 2, 3, 4)] == [2, 2, num_prompts, num_prompts]
    assert _best(run)["validation"]["num_prompts"] == num_prompts
    if num_prompts != 2:  # another validation: the best of the steps before does not compare
        assert _best(run)["step"] in (3, 4)


@pytest.mark.parametrize("num_prompts", [2, 3], ids=["same_settings", "other_num_prompts"])
def test_a_finished_training_rerun_validates_its_last_step_unless_validated_so_already(
        validated_three_steps, make_module_run_config, tmp_path, capsys, num_prompts):
    run = tmp_path / "run"
    shutil.copytree(validated_three_steps, run)
    before = (run / "validation" / "step-000003" / "summary.json").read_bytes()
    capsys.readouterr()
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=3, validation_num_prompts=num_prompts))
    reset_process_state()
    out = capsys.readouterr().out
    assert "nothing to train" in out
    if num_prompts == 2:
        assert "validating it" not in out
        assert (run / "validation" / "step-000003" / "summary.json").read_bytes() == before
    else:  # other settings: step 3's folder (2 prompts) is replaced, and its LoRA is the best of these settings
        assert "[validation] step 3, the last, has no validation of these settings: validating it" in out
        assert _summary(run, 3)["num_prompts"] == 3
        assert _best(run)["step"] == 3 and _best(run)["validation"]["num_prompts"] == 3


def test_a_finished_training_goes_back_to_its_validation_after_a_killed_try_of_other_settings(
        validated_three_steps, make_module_run_config, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(validated_three_steps, run)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    # Other settings: step 3 validated anew on 3 prompts, killed once scored (before best/ moved on).
    monkeypatch.setattr("gors.validation.metric_value", killed)
    with pytest.raises(KeyboardInterrupt):
        train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=3, validation_num_prompts=3))
    reset_process_state()
    monkeypatch.undo()
    assert _best(run)["validation"]["num_prompts"] == 2 and _summary(run, 3)["num_prompts"] == 3
    # The first settings again: step 3's folder is the killed try's, of other prompts: validated anew.
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=3, validation_num_prompts=2))
    reset_process_state()
    assert _summary(run, 3)["num_prompts"] == 2 and _best(run)["validation"]["num_prompts"] == 2


def test_a_finished_training_whose_best_lora_is_gone_validates_its_last_step_again(
        validated_three_steps, make_module_run_config, tmp_path, capsys):
    # Step 3's folder holds its results under these settings, but best/ was deleted (or is another training's):
    # the rerun validates step 3 again, so that the folder has a best LoRA of these settings.
    run = tmp_path / "run"
    shutil.copytree(validated_three_steps, run)
    shutil.rmtree(run / "best")
    capsys.readouterr()
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=3, validation_num_prompts=2))
    reset_process_state()
    assert "[validation] step 3, the last, has no validation of these settings: validating it" in capsys.readouterr().out
    assert _best(run)["step"] == 3


def test_a_best_lora_recorded_under_an_earlier_gors_identity_of_the_training_is_kept(make_run_config, tmp_path,
                                                                                      monkeypatch):
    # An earlier gors named the training otherwise (`recorded_as`): its best LoRA is this training's and competes.
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="old name")
    _validate(validation, range(2, 3))
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    validation.start(2, training="new name", recorded_as=["old name"])
    _validate(validation, range(3, 4))
    assert (_best(tmp_path)["step"], (tmp_path / "best" / "lora").read_text()) == (2, "2")


def test_validation_newly_on_for_a_finished_training_validates_its_last_step(selected_run, make_run_config,
                                                                             tmp_path):
    run = copy_selected_run(selected_run, tmp_path / "run")
    flags = dict(output_dir=str(run), max_train_steps=1, checkpointing_steps=1, report_to="none")
    train(make_run_config(**flags))
    reset_process_state()
    assert not (run / "validation").exists()
    train(make_run_config(**flags, validation_benchmark="toy:train", validation_num_prompts=2))
    reset_process_state()
    assert _summary(run, 1)["num_prompts"] == 2 and _best(run)["step"] == 1


def test_a_shorter_run_of_the_same_training_keeps_the_longer_runs_results_past_its_end(
        validated_three_steps, make_module_run_config, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(validated_three_steps, run)
    shutil.rmtree(run / "checkpoints" / "checkpoint-2")  # pruned: the shorter run starts at step 0
    longer = {step: (run / "validation" / f"step-{step:06d}" / "summary.json").read_bytes() for step in (2, 3)}
    best = _best(run)
    capsys.readouterr()
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=1, validation_num_prompts=2))
    reset_process_state()
    assert "checkpoint-3 of this same training is past --max_train_steps=1: it stays" in capsys.readouterr().out
    # Steps 2 and 3 are the kept checkpoint's LoRAs: their results stay, and the best of all steps with them.
    assert {step: (run / "validation" / f"step-{step:06d}" / "summary.json").read_bytes() for step in (2, 3)} == longer
    assert _summary(run, 1)["num_prompts"] == 2 and _best(run)["value"] == best["value"]
    # The longer run's command again: nothing to train, and its best LoRA is still the folder's.
    train(make_module_run_config(**RESUMED, output_dir=str(run), max_train_steps=3, validation_num_prompts=2))
    reset_process_state()
    assert _best(run)["value"] == best["value"]


def test_the_last_step_is_validated_off_the_validation_steps_grid(selected_run, make_run_config, tmp_path):
    run = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(make_run_config(output_dir=str(run), max_train_steps=3, checkpointing_steps=3,
                                          validation_steps=2, validation_benchmark="toy:train",
                                          validation_num_prompts=2, validation_prompts=["a red circle"],
                                          report_to="tensorboard"))
    rendered = []
    log_validation = trainer.log_validation
    trainer.log_validation = lambda step: rendered.append(step) or log_validation(step)
    trainer.train()
    reset_process_state()
    assert sorted(p.name for p in (run / "validation").iterdir()) == ["step-000002", "step-000003"]
    assert rendered == [2, 3] and _best(run)["step"] in (2, 3)


def test_validation_logs_every_declared_metric_nested_ones_too_and_no_counts(make_run_config, tmp_path,
                                                                             monkeypatch):
    config = make_run_config(output_dir=str(tmp_path), validation_benchmark="toy:train",
                             validation_metric="binding_errors.exchanged")
    validation = BenchmarkValidation(config, make_accelerator())
    validation.start(0, training="A")
    validation._scorer = object()
    summary = {"binding_accuracy": 0.5, "binding_errors": {"exchanged": 0.25, "missing": 0.0},
               "relation_accuracy": None, "num_images": 2, "num_prompts": 2, "higher_is_better": True}
    monkeypatch.setattr(validation.benchmark, "evaluate", lambda *args, **kwargs: summary)
    logged = []
    monkeypatch.setattr(validation.accelerator, "log", lambda values, step: logged.append(values))
    _validate(validation, range(1, 2))
    assert logged == [{"validation/toy:train/binding_accuracy": 0.5,
                       "validation/toy:train/binding_errors.exchanged": 0.25,
                       "validation/toy:train/binding_errors.missing": 0.0}]


def test_a_column_metric_is_refused_before_any_weights_load(make_run_config, tmp_path):
    # Validation scores with the main scorer only: a column (T2I-CompBench's B-CLIP) would never be computed.
    config = make_run_config(output_dir=str(tmp_path), pretrained_model_name_or_path=str(tmp_path / "no model"),
                             validation_benchmark="t2i_compbench:color", validation_metric="columns.B-CLIP")
    with pytest.raises(ValueError, match=r"--validation_metric='columns.B-CLIP' is a further column of "
                                         r"t2i_compbench:color, which validation during training does not compute; "
                                         r"choose one of score \(and score the column afterwards: `gors evaluate"):
        validation_target(config)


@pytest.mark.parametrize("flags, named", [
    (dict(validation_metric="binding_accuracy"), "--validation_metric"),
    (dict(validation_num_prompts=4), "--validation_num_prompts"),
    (dict(validation_images_per_prompt=2), "--validation_images_per_prompt"),
    (dict(validation_scorer_options={"threshold": 0.5}), "--validation_scorer_options"),
    (dict(validation_metric="binding_accuracy", validation_num_prompts=4),
     "--validation_metric, --validation_num_prompts"),
    (dict(validation_num_inference_steps=4, validation_resolution=32),
     "--validation_num_inference_steps, --validation_resolution"),
], ids=["metric", "num_prompts", "images_per_prompt", "scorer_options", "two", "sampling"])
def test_benchmark_validation_flags_without_a_benchmark_are_refused(make_run_config, flags, named):
    with pytest.raises(ValueError, match=rf"^{named} without --validation_benchmark: .* Name the benchmark "
                                         r"\(e\.g\. --validation_benchmark t2i_compbench:color\), or drop"):
        make_run_config(**flags)
    make_run_config(**flags, validation_benchmark="toy:train")  # with one, they are taken


def test_rendering_the_validation_prompts_runs_in_eval_mode_and_leaves_the_rngs_as_they_were(
        selected_run, make_run_config, tmp_path, monkeypatch):
    run = copy_selected_run(selected_run, tmp_path / "run")
    trainer = GORSTrainer(make_run_config(output_dir=str(run), validation_prompts=["a red circle", "a green triangle"],
                                          report_to="none"))
    trainer._setup_models()
    modules = [trainer.denoiser, *trainer.text_encoders.values()]
    for module in modules:
        module.train()
    modes_while_rendering = []

    def pipeline(prompt, **kwargs):
        modes_while_rendering.extend(module.training for module in modules)
        torch.rand(1), random.random(), np.random.rand()  # e.g. dropout, or a sampler drawing from the global RNG
        return SimpleNamespace(images=[Image.new("RGB", (32, 32))] * len(prompt))

    monkeypatch.setattr(trainer, "_pipeline", lambda scheduler: pipeline)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    assert len(trainer.log_validation(1)) == 2
    assert modes_while_rendering and not any(modes_while_rendering)
    assert all(module.training for module in modules)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])


def test_a_killed_runs_best_after_the_resumed_checkpoint_is_not_kept(make_run_config, tmp_path, monkeypatch):
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.1, 0.2, 0.9])
    validation.start(0, training="A")
    _validate(validation, range(1, 4))  # killed after step 3's validation; its newest checkpoint is step 2
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5, 0.6])
    validation.start(2, training="A")
    _validate(validation, range(3, 5))
    # Step 3's 0.9 was a LoRA this run never trained: the run's own steps 3 and 4 compete, and 4 wins.
    assert (_best(tmp_path)["step"], _best(tmp_path)["value"]) == (4, 0.6)
    assert (tmp_path / "best" / "lora").read_text() == "4"


def test_a_run_killed_while_validating_a_checkpoint_step_validates_it_on_the_rerun(
        selected_run, make_run_config, tmp_path, monkeypatch):
    run = copy_selected_run(selected_run, tmp_path / "run")
    common = dict(output_dir=str(run), validation_benchmark="toy:train", validation_steps=1, checkpointing_steps=2,
                  validation_num_prompts=2, report_to="none", max_train_steps=2)
    validate = BenchmarkValidation.run

    def killed_at_step_2(self, step, pipeline, save_lora):
        if step == 2:
            raise KeyboardInterrupt  # a kill while validating the last step, a checkpoint step
        return validate(self, step, pipeline, save_lora)

    monkeypatch.setattr(BenchmarkValidation, "run", killed_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        train(make_run_config(**common))
    reset_process_state()
    monkeypatch.undo()
    # Validation comes before the checkpoint: the rerun resumes before step 2 and validates it.
    assert not (run / "checkpoints" / "checkpoint-2").exists()
    train(make_run_config(**common))
    reset_process_state()
    assert sorted(p.name for p in (run / "validation").iterdir()) == ["step-000001", "step-000002"]
    assert _summary(run, 2)["num_prompts"] == 2


def test_round_1_competes_with_round_0s_best(make_run_config, tmp_path, monkeypatch):
    from gors.run import run

    validate = BenchmarkValidation.run

    def stubbed(self, step, pipeline, save_lora):
        value = 0.9 if step == 1 else 0.1
        monkeypatch.setattr(self.benchmark, "evaluate", lambda *args, **kwargs: {"binding_accuracy": value})
        return validate(self, step, pipeline, save_lora)

    monkeypatch.setattr(BenchmarkValidation, "run", stubbed)
    out = tmp_path / "rounds"
    run(make_run_config(output_dir=str(out), rounds=2, max_train_steps=4, checkpointing_steps=2, replay="last",
                        report_to="none", validation_benchmark="toy:train", validation_num_prompts=2,
                        validation_steps=1))
    reset_process_state()
    # One training across the rounds: round 1's 0.1 at steps 3 and 4 does not replace round 0's 0.9 at step 1.
    assert (_best(out)["step"], _best(out)["value"]) == (1, 0.9)
    # `gors push --lora best` gives it with round 0's training and selection (no checkpoint holds step 1: the
    # first one after it, round 0's step 2, is of its round), also in a copy stopped in round 0 (no rounds.json
    # yet, as while a round runs).
    import json
    import shutil

    from gors.push import RECORD_FILE, PushConfig, push

    record = json.loads((push(PushConfig(output_dir=str(out), repo_id="me/x", lora="best", dry_run=True))
                         / RECORD_FILE).read_text())
    assert record["trained_in"] == "round-000" and record["step"] == 1
    assert record["selection"] == json.loads((out / "round-000" / "selection_summary.json").read_text())
    stopped = tmp_path / "stopped"
    shutil.copytree(out, stopped, ignore=shutil.ignore_patterns("round-001", "rounds.json", "hub_upload"))
    record = json.loads((push(PushConfig(output_dir=str(stopped), repo_id="me/x", lora="best", dry_run=True))
                         / RECORD_FILE).read_text())
    assert record["trained_in"] == "round-000" and record["rounds"] == 0
    # The final LoRA of the finished run: both rounds counted; with no checkpoint left, the card's training is
    # the last round's (its selection), and the card says the settings are gone.
    record = json.loads((push(PushConfig(output_dir=str(out), repo_id="me/x", dry_run=True)) / RECORD_FILE).read_text())
    assert record["rounds"] == 2 and record["trained_in"] == "round-001" and record["step"] == 4
    bare = tmp_path / "bare"
    shutil.copytree(out, bare, ignore=shutil.ignore_patterns("checkpoints", "hub_upload"))
    record = json.loads((push(PushConfig(output_dir=str(bare), repo_id="me/x", dry_run=True)) / RECORD_FILE).read_text())
    assert record["trained_in"] == "round-001" and record["training"] is None
    assert record["selection"] == json.loads((out / "round-001" / "selection_summary.json").read_text())
    assert any("no checkpoint of this LoRA's training is left" in note for note in record["notes"])


def test_a_best_lora_between_checkpoints_is_pushed_with_its_own_step_and_the_training_after_it(
        selected_run, make_run_config, tmp_path, monkeypatch):
    """The best LoRA of step 1, checkpoints every 2 steps: no checkpoint holds its weights, so its training is
    the first checkpoint's after it (step 2); the card still gives the best's own step."""
    from gors.push import RECORD_FILE, PushConfig, push

    values = iter([0.9, 0.1])
    validate = BenchmarkValidation.run

    def stubbed(self, step, pipeline, save_lora):
        monkeypatch.setattr(self.benchmark, "evaluate", lambda *args, **kwargs: {"binding_accuracy": next(values)})
        return validate(self, step, pipeline, save_lora)

    monkeypatch.setattr(BenchmarkValidation, "run", stubbed)
    run = copy_selected_run(selected_run, tmp_path / "run")
    train(make_run_config(output_dir=str(run), max_train_steps=2, checkpointing_steps=2, report_to="none",
                          validation_benchmark="toy:train", validation_num_prompts=2, validation_steps=1))
    reset_process_state()
    assert _best(run)["step"] == 1 and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]
    record = json.loads((push(PushConfig(output_dir=str(run), repo_id="me/x", lora="best", dry_run=True))
                         / RECORD_FILE).read_text())
    assert record["step"] == 1 and record["trained_in"] == "." and record["rounds"] is None
    assert record["training"]["rank"] == 4 and record["notes"] == []


def test_a_validation_scorer_that_does_not_load_fails_before_any_training_step(
        selected_run, make_run_config, tmp_path, monkeypatch):
    run = copy_selected_run(selected_run, tmp_path / "run")
    steps = []
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", lambda self, m: steps.append(m))

    def unloadable(self, accelerator, options, **kwargs):
        raise OSError("the scorer's weights are not there")

    monkeypatch.setattr(type(BenchmarkValidation(make_run_config(output_dir=str(run), validation_benchmark="toy:train"),
                                                 make_accelerator()).benchmark), "make_scorer", unloadable)
    with pytest.raises(OSError, match="weights are not there"):
        train(make_run_config(output_dir=str(run), validation_benchmark="toy:train", validation_num_prompts=2,
                              max_train_steps=2, report_to="none"))
    reset_process_state()
    assert steps == []


def test_validation_samples_with_the_sampling_given_in_place_of_the_protocol_and_a_best_lora_is_bound_to_it(
        make_run_config, tmp_path, monkeypatch):
    from gors.core.backbones import FAMILIES

    # As `gors evaluate`'s flags, for a distilled checkpoint that wants a few steps without guidance.
    sampling = dict(validation_num_inference_steps=2, validation_guidance_scale=0.0, validation_resolution=32)
    target = validation_target(make_run_config(validation_benchmark="toy:train", **sampling))
    assert (target.benchmark.num_inference_steps, target.benchmark.guidance_scale, target.benchmark.resolution) == (
        2, 0.0, 32)
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="A")
    _validate(validation, range(1, 2))
    # The same training validated otherwise: its best does not compare, and this run's first value replaces it.
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.1], **sampling)
    assert {key: validation.settings[key] for key in ("num_inference_steps", "guidance_scale", "resolution")} == {
        "num_inference_steps": 2, "guidance_scale": 0.0, "resolution": 32}
    validation.start(1, training="A")
    _validate(validation, range(2, 3))
    assert (_best(tmp_path)["step"], _best(tmp_path)["value"]) == (2, 0.1)
    for flags, message in ((dict(validation_num_inference_steps=0), r"--validation_num_inference_steps=0: must be >= 1"),
                           (dict(validation_guidance_scale=-1.0), r"--validation_guidance_scale=-1.0: must be >= 0"),
                           (dict(validation_resolution=36), r"--validation_resolution=36: use a multiple of 8")):
        with pytest.raises(ValueError, match=message):
            make_run_config(validation_benchmark="toy:train", **flags)
    config = make_run_config(output_dir=str(tmp_path / "flux"), validation_benchmark="toy:train",
                             validation_resolution=40)
    with pytest.raises(ValueError, match=r"^--validation_resolution=40: a FluxPipeline needs a multiple of 16"):
        BenchmarkValidation(config, make_accelerator(), backbone=FAMILIES["FluxPipeline"])


def test_a_validation_resolution_the_family_cannot_take_stops_a_run_before_any_image(make_run_config, tiny_sd3,
                                                                                     tmp_path):
    from gors.run import check_run_inputs

    config = make_run_config(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(tiny_sd3),
                             validation_benchmark="toy:train", validation_resolution=24)
    with pytest.raises(ValueError, match=r"^--validation_resolution=24: a StableDiffusion3Pipeline needs a multiple "
                                         r"of 16"):
        check_run_inputs(config)


def test_a_tie_is_no_better_and_the_steps_kept_and_discarded_are_exact(tmp_path):
    """A tie keeps the earlier best LoRA (in either direction); a resume at step 2 keeps step 2's results (its
    own checkpoint's) and discards those after it but the kept steps of a longer run, which `kept_steps` gives
    up to that run's checkpoint included; a best.json whose step is no integer has no step."""
    from gors.validation import best_step, discard_steps_after, is_better, kept_steps

    assert is_better(0.5, None, True) and is_better(0.5, None, False)
    assert not is_better(0.5, 0.5, True) and not is_better(0.5, 0.5, False)
    assert is_better(0.6, 0.5, True) and is_better(0.4, 0.5, False)
    assert not is_better(0.4, 0.5, True) and not is_better(0.6, 0.5, False)
    assert kept_steps(4, 6) == range(5, 7) and kept_steps(4, None) == range(0)
    for step in (1, 2, 3, 5, 6):
        (tmp_path / "validation" / f"step-{step:06d}").mkdir(parents=True)
    assert discard_steps_after(tmp_path, 2, keep=kept_steps(4, 6)) == [3]
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == [
        "step-000001", "step-000002", "step-000005", "step-000006"]
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text(json.dumps({"step": 6}))
    assert best_step(tmp_path) == 6
    (tmp_path / "best" / "best.json").write_text(json.dumps({"step": "6"}))
    assert best_step(tmp_path) is None


def test_the_image_grid_shows_two_rows_at_most_filled_up_with_white(tmp_path):
    """Up to 2 rows of `columns` images; fewer images than columns make one row of as many."""
    from gors.validation import image_grid

    paths = []
    for index in range(20):
        paths.append(tmp_path / f"{index}.png")
        Image.new("RGB", (8, 8), (index, 0, 0)).save(paths[-1])
    assert image_grid(paths, columns=8, side=4).shape == (8, 32, 3)  # 16 of the 20 images
    assert image_grid(paths[:3], columns=8, side=4).shape == (4, 12, 3)
    grid = image_grid(paths[:5], columns=4, side=4)
    assert grid.shape == (8, 16, 3) and (grid[4:, 4:] == 255).all()  # the second row: 1 image, then white


def test_a_fresh_start_keeps_the_best_lora_of_a_longer_runs_kept_step(tmp_path):
    """A run from step 0 that keeps a longer run's steps (`kept_steps`) keeps `best/` where it is of one of them,
    and discards it otherwise."""
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text(json.dumps({"step": 6}))
    for step in (2, 6):
        (tmp_path / "validation" / f"step-{step:06d}").mkdir(parents=True)
    discard_validation_results(tmp_path, keep=range(5, 7))
    assert (tmp_path / "best" / "best.json").is_file()
    assert [p.name for p in (tmp_path / "validation").iterdir()] == ["step-000006"]
    discard_validation_results(tmp_path, keep=range(7, 9))
    assert not (tmp_path / "best").exists() and not list((tmp_path / "validation").iterdir())


def test_a_shorter_run_from_step_0_competes_with_the_kept_best_lora_even_one_a_kill_left_aside(
        make_run_config, tmp_path, monkeypatch):
    """A run from step 0 that keeps a longer run's steps (`keep`) puts back the best LoRA a kill mid-publish left
    as `.best.old` and competes with it: a lower value of its own does not replace the longer run's best."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="A")
    _validate(validation, range(3, 4))
    (tmp_path / "best").rename(tmp_path / ".best.old")  # killed between publish_folder's two renames
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    validation.start(0, training="A", keep=range(2, 4))
    _validate(validation, range(1, 2))
    assert (_best(tmp_path)["step"], (tmp_path / "best" / "lora").read_text()) == (3, "3")


def test_a_validation_metric_undefined_on_the_validation_prompts_is_a_clear_error(make_run_config, tmp_path,
                                                                                 monkeypatch):
    """A summary whose validation metric is None (undefined on these prompts, e.g. no relation prompt) stops the
    run with a ValueError naming the flag and the remedy, and keeps no best LoRA."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [None])
    validation.start(0, training="A")
    with pytest.raises(ValueError, match=r"^--validation_metric='binding_accuracy' is undefined on these toy:train "
                                         r"validation prompts; raise --validation_num_prompts"):
        _validate(validation, range(1, 2))
    assert not (tmp_path / "best").exists()


def test_a_leftover_staging_folder_of_a_killed_save_does_not_reach_best(make_run_config, tmp_path, monkeypatch):
    """A kill while saving a best LoRA leaves `.best.tmp`; the resumed run's next best LoRA is saved into a fresh
    staging folder, so `best/` holds only that LoRA and its record, none of the killed save's files."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    (tmp_path / ".best.tmp").mkdir()
    (tmp_path / ".best.tmp" / "half_written.safetensors").write_text("killed")
    validation.start(2, training="A")
    _validate(validation, range(3, 4))
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["best.json", "lora"]
    assert not (tmp_path / ".best.tmp").exists()


def test_a_stray_step_named_folder_in_validation_is_left_alone(tmp_path):
    """`discard_steps_after` discards only `step-<number>` folders after the step: another folder whose name begins
    with `step-` (a user's notes) is neither parsed as a step nor discarded."""
    from gors.validation import discard_steps_after

    for name in ("step-000001", "step-000003", "step-notes"):
        (tmp_path / "validation" / name).mkdir(parents=True)
    assert discard_steps_after(tmp_path, 1) == [3]
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == ["step-000001", "step-notes"]


def test_a_step_whose_validation_was_killed_before_its_summary_is_not_validated(make_run_config, tmp_path,
                                                                                 monkeypatch):
    """`validated` needs the step's summary: a step folder that `run` began under these settings (its
    validation.json written) but whose benchmark was killed before summary.json is validated again, while a
    step with its summary is not."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    validation.start(0, training="A")
    _validate(validation, range(1, 2))
    (tmp_path / "validation" / "step-000001" / "summary.json").write_text("{}")  # the stubbed benchmark wrote none
    begun = tmp_path / "validation" / "step-000002"
    begun.mkdir()
    shutil.copy(tmp_path / "validation" / "step-000001" / "validation.json", begun / "validation.json")
    assert validation.validated(1) and not validation.validated(2)


def test_a_killed_validation_of_these_settings_is_gone_on_from_and_one_of_other_settings_discarded(
        make_run_config, tmp_path, monkeypatch):
    """`discard_unrelated` keeps a step folder begun under these validation settings (the benchmark goes on from its
    samples, not redoing them) and discards one begun under other settings (or none recorded)."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [])
    validation.start(0, training="A")
    for step, settings in ((1, validation.settings), (2, validation.settings | {"num_prompts": 99}), (3, None)):
        folder = tmp_path / "validation" / f"step-{step:06d}"
        (folder / "samples").mkdir(parents=True)
        (folder / "samples" / "0.png").write_text("sampled")
        if settings is not None:
            (folder / "validation.json").write_text(json.dumps(settings))
        validation.discard_unrelated(step)
    assert (tmp_path / "validation" / "step-000001" / "samples" / "0.png").read_text() == "sampled"
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == ["step-000001"]


def test_a_best_lora_of_another_validation_metric_does_not_compare(make_run_config, tmp_path, monkeypatch):
    """The metric is one of the validation settings a best LoRA is bound to: a run resumed with another
    `--validation_metric` replaces the best of the earlier metric with its first value, even one that its own
    direction (the lower, the better) would rank below the recorded value."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="A")
    _validate(validation, range(1, 2))
    config = make_run_config(output_dir=str(tmp_path), validation_benchmark="toy:train",
                             validation_metric="binding_errors.exchanged", validation_num_inference_steps=None,
                             validation_resolution=None)
    validation = BenchmarkValidation(config, make_accelerator())
    validation._scorer = object()
    monkeypatch.setattr(validation.benchmark, "evaluate",
                        lambda *args, **kwargs: {"binding_accuracy": 0.1, "binding_errors": {"exchanged": 0.95}})
    validation.start(1, training="A")
    _validate(validation, range(2, 3))
    best = _best(tmp_path)
    assert (best["step"], best["metric"], best["value"]) == (2, "binding_errors.exchanged", 0.95)


def test_a_best_lora_recorded_before_benchmark_options_were_recorded_still_competes(make_run_config, tmp_path,
                                                                                    monkeypatch):
    """Benchmark options enter the validation settings only where given: a best.json whose settings have no
    `benchmark_options` (recorded before they were) stays comparable with a run that gives none, and a lower
    value does not replace it."""
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.9])
    validation.start(0, training="A")
    _validate(validation, range(1, 2))
    record = _best(tmp_path)
    record["validation"].pop("benchmark_options", None)
    (tmp_path / "best" / "best.json").write_text(json.dumps(record))
    validation = _stubbed(make_run_config, tmp_path, monkeypatch, [0.5])
    validation.start(1, training="A")
    _validate(validation, range(2, 3))
    assert (_best(tmp_path)["step"], (tmp_path / "best" / "lora").read_text()) == (1, "1")
