"""`gors estimate` on the timings it is given: malformed entries refused by file and stage, and warnings
about what in a calibration makes the estimate too high. Pure functions; no model runs."""

from __future__ import annotations

import json

import pytest

from gors.core.paper import GORS_RUN_SOURCES, RELEASED_CHECKPOINT_STEPS
from gors.estimate import (
    EstimateConfig,
    RunPlan,
    StageEstimate,
    calibration_warnings,
    estimate,
    estimate_command,
    format_estimate,
    format_plan,
)


def _entry(stage: str, seconds: float, work: int, processes: int = 1, setup: float = 0.0, **settings) -> dict:
    return {"stage": stage, "seconds": seconds, "work": work, "unit": "images", "num_processes": processes,
            "device": "GPU X", "settings": settings, "setup_seconds": setup}


def _stages() -> dict[str, dict]:
    return {
        "generate": _entry("generate", 100, 400, setup=10, generation={"num_inference_steps": 30}),
        "score": _entry("score", 50, 400, setup=5),
        "select": _entry("select", 1, 400),
        "train": _entry("train", 200, 100, setup=20, train_batch_size=2, gradient_accumulation_steps=1) | {
            "unit": "steps"},
    }


def _set(path: tuple[str, ...], value):
    def change(stages):
        target = stages
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _drop(path: tuple[str, ...]):
    def change(stages):
        target = stages
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return change


def _all_seconds_zero(stages):
    for entry in stages.values():
        entry.update(seconds=0, setup_seconds=0)


@pytest.mark.parametrize("change, stage, problem", [
    (_drop(("score", "work")), "score", "'work' is missing"),
    (_drop(("train", "settings", "train_batch_size")), "train", "settings.train_batch_size=None is not a number >= 1"),
    (_set(("train", "settings", "gradient_accumulation_steps"), 0), "train",
     "settings.gradient_accumulation_steps=0 is not a number >= 1"),
    (_drop(("generate", "device")), "generate", "'device' is missing"),
    (_set(("train", "device"), 0), "train", "device=0 is not a device name"),
    (_set(("score", "work"), "400"), "score", "work='400' is not a number >= 1"),
    (_set(("train", "work"), 0), "train", "work=0 is not a number >= 1"),
    (_set(("generate", "settings", "generation", "num_inference_steps"), 0), "generate",
     "settings.generation.num_inference_steps=0 is not a number >= 1"),
    (_set(("train", "num_processes"), 0), "train", "num_processes=0 is not a number >= 1"),
    (_all_seconds_zero, "generate", "seconds=0 is not a number > 0"),
    (_set(("train", "seconds"), -5), "train", "seconds=-5 is not a number > 0"),
    (_set(("score", "setup_seconds"), 80), "score", "setup_seconds=80 is not less than seconds=50"),
    (_set(("score", "setup_seconds"), 50), "score", "setup_seconds=50 is not less than seconds=50"),
    (_set(("score", "setup_seconds"), -1), "score", "setup_seconds=-1 is not a number >= 0"),
    (_set(("score", "seconds"), float("nan")), "score", "seconds=nan is not a number > 0"),
])
def test_an_unusable_timing_is_refused_naming_its_file_and_stage(tmp_path, change, stage, problem):
    stages = _stages()
    change(stages)
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    with pytest.raises(ValueError) as caught:
        estimate_command(EstimateConfig(timings=[str(tmp_path)]))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'timings.json'}: the {stage!r} timing is unusable: ")
    assert problem in message


def test_a_later_file_replaces_an_unusable_entry_of_an_earlier_one(tmp_path, capsys):
    broken, fixed = tmp_path / "broken", tmp_path / "fixed"
    for folder in (broken, fixed):
        folder.mkdir()
    stages = _stages()
    (fixed / "timings.json").write_text(json.dumps({"stages": {"score": stages["score"]}, "history": []}))
    stages["score"]["work"] = 0
    (broken / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    estimate_command(EstimateConfig(timings=[str(broken), str(fixed)]))  # the earlier file's score is not used
    assert "| score | 63000 images |" in capsys.readouterr().out


@pytest.mark.parametrize("device, unit", [("GPU X", "GPU"), ("cpu", "CPU")])
def test_the_hours_are_named_after_the_device_the_calibration_ran_on(device, unit, tmp_path, capsys):
    stages = {name: entry | {"device": device} for name, entry in _stages().items()}
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    estimate_command(EstimateConfig(timings=[str(tmp_path)]))
    table, plan = capsys.readouterr().out.split("plan:")
    assert table.startswith(f"{unit}-hours on {device} (rates measured there")
    assert f"| stage | work | gors {unit}-h | official {unit}-h |" in table
    assert unit == "GPU" or "GPU" not in table  # a CPU calibration prices no GPU
    # The note on the default ratios asks for a speed table of the GPU the calibration ran on, or, for a CPU
    # calibration, for a calibration on a GPU as well.
    assert ("on this GPU, for its own." in plan) == (unit == "GPU")
    assert ("this one ran on the CPU and prices no GPU" in plan) == (unit == "CPU")


@pytest.mark.parametrize("name", ["num_prompts", "images_per_prompt", "num_inference_steps", "max_train_steps",
                                  "global_batch_size"])
def test_a_plan_of_no_work_is_refused(name):
    """Each of the plan's sizes must be at least 1: 0 prices nothing and would read as a free run."""
    with pytest.raises(ValueError, match=rf"^--{name}=0: must be >= 1$"):
        EstimateConfig(timings=["calibration"], **{name: 0})


def test_the_total_row_adds_each_column_and_gives_the_official_hours_over_gors():
    """The table's total row sums each column and its overall ratio is official / gors, not gors / official."""
    rows = [StageEstimate("generate", "100 images", 1.0, 3.0, 3.0), StageEstimate("train", "10 steps", 1.0, 1.0, 1.0)]
    assert format_estimate(rows, ["GPU X"]).splitlines()[-1] == "| total | | 2.00 | 4.00 | 2.00x overall |"


def test_stages_timed_on_the_cpu_and_on_a_gpu_are_refused(tmp_path):
    stages = _stages()
    stages["score"]["device"] = "cpu"
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    with pytest.raises(ValueError, match=r"^score timed on the CPU, generate on GPU X \(.*timings.json\), train on "
                                         r"GPU X .*CPU-hours and GPU-hours do not add up"):
        estimate_command(EstimateConfig(timings=[str(tmp_path)]))


def test_one_stage_timed_on_a_gpu_beside_the_others_on_the_cpu_is_refused(tmp_path):
    """CPU and GPU timings are refused together however few stages ran on the GPU (here only training)."""
    stages = {name: entry | {"device": "cpu"} for name, entry in _stages().items()}
    stages["train"]["device"] = "GPU X"
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    with pytest.raises(ValueError, match=r"^generate, score, select timed on the CPU, train on GPU X "
                                         r"\(.*timings.json\): CPU-hours and GPU-hours do not add up"):
        estimate_command(EstimateConfig(timings=[str(tmp_path)]))


def test_stages_timed_on_different_gpus_are_warned_of(tmp_path, capsys):
    stages = _stages()
    stages["train"]["device"] = "GPU Y"
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    estimate_command(EstimateConfig(timings=[str(tmp_path)]))
    assert ("warning: the stages were timed on different GPUs (generate on GPU X, score on GPU X, select on GPU X, "
            "train on GPU Y): the total adds hours of GPUs of different speeds") in capsys.readouterr().err


def _train(work: int, **settings) -> dict[str, dict]:
    defaults = dict(max_train_steps=work, checkpointing_steps=1000, validation_steps=500, validation_benchmark=None,
                    num_validation_prompts=0, torch_compile="no")
    return {"train": _entry("train", 100, work, **(defaults | settings))}


def test_no_warning_for_a_calibration_without_validation_and_with_one_checkpoint():
    assert calibration_warnings(_train(200, checkpointing_steps=1000)) == []
    assert calibration_warnings(_train(200, checkpointing_steps=200)) == []  # the end's only
    # Validation prompts render only into TensorBoard: without it, no validation ran.
    assert calibration_warnings(_train(200, num_validation_prompts=2, validation_steps=60, report_to="none")) == []
    for rendered in ("tensorboard", "all", None):  # None: timings before `report_to` was recorded
        assert calibration_warnings(_train(200, num_validation_prompts=2, validation_steps=60, report_to=rendered))


@pytest.mark.parametrize("stage, batch, said", [
    ("generate", 8, None),  # the batch the ratio was measured at
    ("generate", 1, "generated in batches of 1, but the generation ratio is gors' speed in batches of 8 over the "
                    "official one image per call: the official column's generation is likely too high. Calibrate with "
                    "--generation_batch_size 8"),
    ("generate+score", 16, "generated in batches of 16, but .* likely too low"),
])
def test_a_calibration_generating_in_other_batches_than_the_ratio_is_warned_of(stage, batch, said):
    import re

    warnings = calibration_warnings({stage: _entry(stage, 100, 400, generation_batch_size=batch)})
    assert (warnings == []) if said is None else (len(warnings) == 1 and re.search(said, warnings[0]))


@pytest.mark.parametrize("settings, work, said", [
    (dict(checkpointing_steps=50), 200, "saved 4 checkpoints in its 200 steps"),
    (dict(checkpointing_steps=60), 200, "saved 4 checkpoints in its 200 steps"),  # 60, 120, 180 and the end
    (dict(validation_benchmark="toy:train", validation_steps=100), 200, "ran validation 2 time(s) in its 200 steps"),
    (dict(num_validation_prompts=2, validation_steps=60), 200, "ran validation 4 time(s)"),  # 60, 120, 180, the end
    (dict(validation_benchmark="toy:train"), 200, "ran validation 1 time(s)"),  # every 500: at the last step only
    (dict(validation_benchmark="toy:train", validation_steps=100, checkpointing_steps=100), 200,
     "ran validation 2 time(s) and saved 2 checkpoints"),
])
def test_validation_and_checkpoints_in_the_calibrations_training_are_warned_of(settings, work, said):
    warnings = calibration_warnings(_train(work, **settings))
    assert len(warnings) == 1 and said in warnings[0]
    assert "Calibrate with validation off and --checkpointing_steps above --max_train_steps" in warnings[0]


@pytest.mark.parametrize("settings, work, said", [
    (dict(checkpointing_steps=200), 200, None),  # at the last step only: wrap-up
    (dict(checkpointing_steps=100), 200, "saved 1 checkpoint before its last step in its 200 steps"),
    (dict(checkpointing_steps=60), 200, "saved 3 checkpoints before its last step"),  # 60, 120, 180
    (dict(validation_benchmark="toy:train"), 200, None),  # every 500: at the last step only
    (dict(num_validation_prompts=2, validation_steps=60), 200, "ran validation 3 time(s) before its last step"),
])
def test_with_the_wrap_up_timed_only_what_comes_before_the_last_step_is_warned_of(settings, work, said):
    stages = _train(work, **settings)
    stages["train"] |= {"warmup_seconds": 1.0, "wrapup_seconds": 2.0}
    warnings = calibration_warnings(stages)
    if said is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and said in warnings[0]
        assert "Calibrate with validation off and --checkpointing_steps at or above --max_train_steps" in warnings[0]


def test_a_resumed_training_counts_only_the_checkpoints_of_its_own_steps():
    # Steps 151-200 of 200 (resumed at 150), a checkpoint every 100: 200 only.
    stages = _train(50, max_train_steps=200, checkpointing_steps=100)
    assert calibration_warnings(stages) == []


def test_old_timings_and_compiled_calibrations_are_warned_of():
    old = {"train": _entry("train", 100, 200, train_batch_size=2, gradient_accumulation_steps=1)}
    assert "do not record its validation and checkpoint settings" in calibration_warnings(old)[0]
    compiled = _train(200) | {"generate": _entry("generate", 10, 4, torch_compile="inductor")}
    compiled["train"]["settings"]["torch_compile"] = "inductor"
    assert calibration_warnings(compiled) == [
        "the calibration's generate, train timings do not tell the first batch or step from the rest: its warm-up "
        "(CUDA kernels loaded on first use; compiling, in generate, train) and its wrap-up are scaled as work. "
        "Calibrate with this gors, each process generating and scoring at least two full batches "
        "(--generation_batch_size, --reward_batch_size) and training at least two steps (three under CUDA graphs)"]
    # With its first batch's warm-up timed, compiling is counted once: only the stage without one is warned of.
    compiled["train"] |= {"warmup_seconds": 30.0, "wrapup_seconds": 1.0}
    assert "the calibration's generate timings do not tell" in calibration_warnings(compiled)[0]
    # Scoring and selection compile nothing: their settings record the flag, but no warning is due for them.
    compiled["generate"] |= {"warmup_seconds": 20.0, "wrapup_seconds": 1.0}
    compiled |= {stage: _entry(stage, 10, 4, torch_compile="inductor") for stage in ("score", "select")}
    assert calibration_warnings(compiled) == []
    # Timings of this gors that could not tell the first batch (one batch per process) are warned of, compiled or not.
    compiled["score"] |= {"warmup_seconds": None, "wrapup_seconds": None}
    assert calibration_warnings(compiled) == [calibration_warnings(compiled)[0]]
    assert calibration_warnings(compiled)[0].startswith("the calibration's score timings do not tell the first batch")


def test_the_warnings_go_to_stderr_apart_from_the_table(tmp_path, capsys):
    stages = _stages()
    stages["train"]["settings"] |= dict(max_train_steps=100, checkpointing_steps=10, validation_steps=500,
                                        validation_benchmark=None, num_validation_prompts=0, torch_compile="no")
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    estimate_command(EstimateConfig(timings=[str(tmp_path)]))
    captured = capsys.readouterr()
    assert "warning: the calibration's training saved 10 checkpoints" in captured.err
    assert "warning" not in captured.out


def test_the_plan_says_where_each_value_comes_from_and_which_were_given():
    stages = {"generate": _entry("generate", 10, 4, generation={"num_inference_steps": 30})}
    text = format_plan(RunPlan(max_train_steps=3000), stages)
    assert f"images_per_prompt = 90 ({GORS_RUN_SOURCES['images_per_prompt']})" in text
    assert "max_train_steps = 3000 (given)" in text
    assert "num_inference_steps = 50 (source unclear" in text
    assert "the calibration sampled with 30 denoising steps; generation time is scaled by 50 / 30" in text
    assert "priced as they are" not in text  # a calibration that records no model
    stages["generate"]["settings"]["generation"] |= {"model": "stabilityai/stable-diffusion-2-base", "resolution": 256}
    assert "the calibration's model and side, priced as they are: stabilityai/stable-diffusion-2-base at 256 px" in \
        format_plan(RunPlan(), stages)


def test_a_stage_that_did_no_work_says_what_to_rerun():
    stages = _stages()
    stages["train"]["work"] = 0  # estimate() called on entries no file check has seen
    with pytest.raises(ValueError, match="the train timing did no work; rerun the calibration so that it does train "
                                         "work"):
        estimate(stages, RunPlan(), {})


def test_the_help_names_the_released_checkpoints_steps_beside_the_scripts_default(capsys):
    """The released LoRAs' names carry the step they were saved at; the plan's default is the script's."""
    assert RELEASED_CHECKPOINT_STEPS == {"color": 124500, "shape": 49000, "texture": 63000}
    from gors.cli import main

    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    assert "were saved at 124,500, 49,000, 63,000" in " ".join(capsys.readouterr().out.split())


def test_the_default_training_ratio_prices_only_a_calibration_at_gors_batch_of_2(tmp_path, capsys):
    # The default ratio is gors at GORS' 2 against the official loop at 2: a calibration at 16 trains a step of 16.
    stages = _stages()
    stages["train"]["settings"]["train_batch_size"] = 16
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    for speedups in ({}, {"score": 6.0}):  # a table or text without a training ratio keeps the default one
        with pytest.raises(ValueError, match=r"the default training ratio \(measured on 2 CPU cores\) prices training "
                                             r"with gors at batch 2, but the calibration trained at --train_batch_size "
                                             r"16: measure the ratio with `python -m benchmarks --only train_step "
                                             r"--gors_batch_size 16` \(and pass its speed.json\), give the ratio "
                                             r"you know as text \(--reference_speedups '\{\"train\": R\}'\)"):
            estimate_command(EstimateConfig(timings=[str(tmp_path)], reference_speedups=speedups))
    estimate_command(EstimateConfig(timings=[str(tmp_path)], reference_speedups={"train": 3.0}))  # the user's word
    assert "| train | 15000 steps x batch 16 |" in capsys.readouterr().out


def test_a_speed_tables_training_ratio_prices_only_a_calibration_at_its_gors_batch(tmp_path, capsys):
    # The per-sample row of gors at batch 16 against the official loop at 2 would inflate the official column of a
    # calibration that trained at 2 (whose own ratio is the equal-batch row's).
    stages = _stages()  # trained at --train_batch_size 2
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    table = tmp_path / "speed.json"
    rows = [{"prices": None, "median": 1.2, "batch": 2}, {"prices": "train", "median": 4.0, "batch": 16}]
    table.write_text(json.dumps({"rows": rows}))
    with pytest.raises(ValueError, match=r"--reference_speedups .*speed\.json prices training with gors at batch 16, "
                                         r"but the calibration trained at --train_batch_size 2: measure the ratio "
                                         r"with `python -m benchmarks --only train_step --gors_batch_size 2`"):
        estimate_command(EstimateConfig(timings=[str(tmp_path)], reference_speedups=str(table)))
    rows[1]["batch"] = 2
    table.write_text(json.dumps({"rows": rows}))
    estimate_command(EstimateConfig(timings=[str(tmp_path)], reference_speedups=str(table)))
    assert "| train | 15000 steps x batch 16 |" in capsys.readouterr().out
    del rows[1]["batch"]  # a table from before rows recorded it: gors at 2, GORS' own
    table.write_text(json.dumps({"rows": rows}))
    estimate_command(EstimateConfig(timings=[str(tmp_path)], reference_speedups=str(table)))
