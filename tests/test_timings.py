"""What each stage of a run cost (`timings.json`), and `gors estimate`'s scaling of it to a full run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import gors.timings
from gors.core.clock import StageMarks, listening, units_done, untimed, work_starts
from gors.core.distributed import reset_process_state
from gors.estimate import (
    CPU_MEASURED_SPEEDUPS,
    EstimateConfig,
    RunPlan,
    calibration_warnings,
    check_stages,
    estimate,
    estimate_command,
    gpu_seconds,
)
from gors.run import run
from gors.timings import StageTiming, format_timings, read_timings, warmup_and_wrapup


def test_gors_run_records_the_work_and_rate_of_each_stage_and_a_rerun_keeps_them(make_run_config, capsys):
    config = make_run_config(max_train_steps=2, checkpointing_steps=1)
    run(config)
    assert "[run] stage timings" in capsys.readouterr().out
    record = read_timings(config.output_dir)
    stages = record["stages"]
    assert {s: (e["work"], e["unit"]) for s, e in stages.items()} == {
        "generate": (6, "images"), "score": (6, "images"), "select": (6, "images"), "train": (2, "steps")}
    for entry in stages.values():
        assert entry["seconds"] > 0 and entry["rate"] == pytest.approx(entry["work"] / entry["seconds"])
        assert entry["main_work"] == (None if entry["stage"] == "select" else entry["work"])  # one process: all of it
        assert entry["num_processes"] == 1 and entry["device"] == "cpu" and entry["peak_gpu_memory_gib"] is None
    # Loading the pipeline, the reward model and the trainer is set-up, apart from the work; select has none.
    for stage in ("generate", "score", "train"):
        assert 0 < stages[stage]["setup_seconds"] < stages[stage]["seconds"], stage
    assert stages["select"]["setup_seconds"] == 0
    assert stages["generate"]["settings"]["generation"]["num_inference_steps"] == 2
    # What slows training without being training is recorded, and `gors estimate` says so: 2 checkpoints in 2 steps.
    train_settings = stages["train"]["settings"]
    assert {key: train_settings[key] for key in ("max_train_steps", "checkpointing_steps", "validation_benchmark",
                                                  "num_validation_prompts", "torch_compile")} == {
        "max_train_steps": 2, "checkpointing_steps": 1, "validation_benchmark": None, "num_validation_prompts": 0,
        "torch_compile": "no"}
    assert train_settings["validation_steps"] == config.validation_steps
    # The last step's checkpoint is wrap-up, counted once (the first batch's warm-up too): step 1's is scaled.
    assert stages["train"]["warmup_seconds"] >= 0 and stages["train"]["wrapup_seconds"] > 0
    assert calibration_warnings(stages) == [
        "the calibration's training saved 1 checkpoint before its last step in its 2 steps, timed as training and so "
        "scaled per step: the estimate is too high. Calibrate with validation off and --checkpointing_steps at or "
        "above --max_train_steps",
        "the calibration generated in batches of 2, but the generation ratio is gors' speed in batches of 8 over the "
        "official one image per call: the official column's generation is likely too high. Calibrate with "
        "--generation_batch_size 8"]
    run_dir = Path(config.output_dir)  # one round: the run folder as before online rounds
    assert not list(run_dir.glob("round-*")) and not (run_dir / "rounds.json").exists()

    # Everything is done: the rerun generates and scores nothing, and the measured rates stay those of the work.
    reset_process_state()
    run(config)
    again = read_timings(config.output_dir)
    assert again["stages"]["generate"] == stages["generate"] and again["stages"]["score"] == stages["score"]
    assert [e["work"] for e in again["history"][4:6]] == [0, 0]
    assert len(again["history"]) == 8


def test_a_run_stopped_in_training_keeps_the_timings_of_the_stages_before(make_run_config, monkeypatch):
    import gors.run

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("stopped in training")

    config = make_run_config(max_train_steps=2)
    monkeypatch.setattr(gors.run, "train", stopped)
    with pytest.raises(KeyboardInterrupt):
        run(config)
    reset_process_state()
    stages = read_timings(config.output_dir)["stages"]  # `gors estimate` can use them after the rerun trains
    assert {s: e["work"] for s, e in stages.items()} == {"generate": 6, "score": 6, "select": 6}


def _entry(stage: str, seconds: float, work: int, processes: int, setup: float = 0.0, **settings) -> dict:
    return {"stage": stage, "seconds": seconds, "work": work, "num_processes": processes, "device": "GPU X",
            "settings": settings, "setup_seconds": setup}


def test_another_training_in_the_folder_counts_all_its_steps(make_run_config):
    # The second training (another learning rate) sets the first one's checkpoints aside and starts at step 0:
    # its work is its 3 steps, not the 1 past the first training's latest checkpoint.
    config = make_run_config(max_train_steps=2, checkpointing_steps=1)
    run(config)
    reset_process_state()
    config = replace(config, learning_rate=config.learning_rate * 2, max_train_steps=3, checkpointing_steps=2)
    run(config)
    reset_process_state()
    # A shorter training of the same settings starts over below the folder's checkpoints 2 and 3, which stay:
    # its work is its 1 step, not the folder's latest checkpoint.
    run(replace(config, max_train_steps=1))
    history = read_timings(config.output_dir)["history"]
    assert [entry["work"] for entry in history if entry["stage"] == "train"] == [2, 3, 1]


def test_estimate_scales_measured_rates_to_the_plan():
    stages = {
        # 2 GPUs x 100 s for 400 images at 25 steps: 0.5 GPU-s per image, 1.0 at 50 steps.
        "generate": _entry("generate", 100, 400, 2, generation={"num_inference_steps": 25}),
        "score": _entry("score", 10, 100, 1),  # 0.1 GPU-s per image
        # 8 GPUs x 200 s for 100 steps of 2 x 1 x 8 = 16 samples: 1 GPU-s per sample.
        "train": _entry("train", 200, 100, 8, train_batch_size=2, gradient_accumulation_steps=1),
    }
    plan = RunPlan(num_prompts=10, images_per_prompt=36, num_inference_steps=50, max_train_steps=1800,
                   global_batch_size=4)
    rows = {r.stage: r for r in estimate(stages, plan, {"score": 8.0})}
    assert rows["generate"].gors_gpu_hours == pytest.approx(360 * 1.0 / 3600)
    assert rows["score"].gors_gpu_hours == pytest.approx(360 * 0.1 / 3600)
    assert rows["score"].official_gpu_hours == pytest.approx(8 * 360 * 0.1 / 3600)
    assert rows["train"].gors_gpu_hours == pytest.approx(1800 * 4 * 1.0 / 3600)
    assert rows["train"].official_gpu_hours == rows["train"].gors_gpu_hours  # no ratio given: 1


def test_estimate_counts_each_stages_set_up_once():
    # 30 s of the 130 s loaded the reward model: 1 s per image after it, and 30 s once in the plan.
    stages = {"generate": _entry("generate", 100, 400, 1, generation={"num_inference_steps": 25}),
              "score": _entry("score", 130, 100, 1, setup=30.0),
              "select": _entry("select", 2, 100, 1) | {"unit": "images"},
              "train": _entry("train", 200, 100, 8, setup=100.0, train_batch_size=2, gradient_accumulation_steps=1)}
    plan = RunPlan(num_prompts=10, images_per_prompt=36, num_inference_steps=25, max_train_steps=1800,
                   global_batch_size=16)
    rows = {r.stage: r for r in estimate(stages, plan, {})}
    assert rows["score"].gors_gpu_hours == pytest.approx((30 + 360 * 1.0) / 3600)
    assert rows["select"].gors_gpu_hours == pytest.approx(360 * 0.02 / 3600)  # per image it went through
    # 8 GPUs: 100 s of set-up, then 1 s per step of the same global batch of 16
    assert rows["train"].gors_gpu_hours == pytest.approx(8 * (100 + 1800 * 1.0) / 3600)


def test_a_select_timing_of_an_older_gors_counting_selected_samples_is_left_out_of_the_estimate():
    """A select entry not counted in images (an older gors counted the selected samples) gives no select row."""
    stages = {"generate": _entry("generate", 100, 400, 1, generation={"num_inference_steps": 25}),
              "score": _entry("score", 10, 100, 1),
              "select": _entry("select", 2, 10, 1) | {"unit": "samples"},
              "train": _entry("train", 200, 100, 1, train_batch_size=2, gradient_accumulation_steps=1)}
    plan = RunPlan(num_prompts=10, images_per_prompt=36, num_inference_steps=25, max_train_steps=100,
                   global_batch_size=2)
    assert [r.stage for r in estimate(stages, plan, {})] == ["generate", "score", "train"]
    stages["select"]["unit"] = "images"
    assert [r.stage for r in estimate(stages, plan, {})] == ["generate", "score", "select", "train"]


@pytest.mark.parametrize("marks, end, expected", [
    # Set-up ends at 10; batches of 8 images done at 30, 34, 38 (4 s each after the first, which took 20):
    # 16 s of warm-up beyond the pace, 5 s after the last batch.
    (StageMarks(10.0, None, (30.0, 8), (38.0, 24)), 43.0, (16.0, 5.0)),
    # A first batch at the later ones' pace has no warm-up (and never a negative one).
    (StageMarks(10.0, None, (14.0, 8), (22.0, 24)), 22.0, (0.0, 0.0)),
    (StageMarks(10.0, None, (13.0, 8), (21.0, 24)), 21.0, (0.0, 0.0)),
    # One batch, or none: no pace to tell the warm-up by.
    (StageMarks(10.0, None, (30.0, 8), (30.0, 8)), 31.0, (None, None)),
    (StageMarks(10.0, None, None, None), 31.0, (None, None)),
    (StageMarks(), 31.0, (None, None)),
])
def test_the_first_batchs_warm_up_is_its_time_beyond_the_later_batches_pace(marks, end, expected):
    assert warmup_and_wrapup(marks, end) == expected


def test_a_shorter_last_batch_is_wrap_up_not_the_pace():
    # Batches of 8 done at 30, 34, 38, then the share's remainder of 4 at 45 (a compiled model compiles again for
    # its shape): the pace is the full batches' 0.5 s an image, and the remainder falls in the wrap-up.
    marks = StageMarks(10.0, None, (30.0, 8), (45.0, 28), previous=(38.0, 24), previous_batch=8)
    assert warmup_and_wrapup(marks, 46.0) == (16.0, 8.0)
    with listening() as marks:
        work_starts()
        for done in (8, 16, 20):
            units_done(done)
    assert marks.steady_last()[1] == 16 and marks.last[1] == 20
    with listening() as marks:  # one full batch and the remainder: no pace to tell the first batch by
        work_starts()
        units_done(8)
        units_done(12)
    assert warmup_and_wrapup(marks, marks.last[0] + 1) == (None, None)
    # A batch halved for memory goes on at its new size: only a last batch shorter than the one before is set apart.
    with listening() as marks:
        work_starts()
        for done in (16, 32, 40, 48, 56):
            units_done(done)
    assert marks.steady_last()[1] == 56


def test_a_short_last_batchs_units_are_wrap_up_too():
    from accelerate import Accelerator

    from gors.timings import timed_stage

    timings, done = [], {"images": 0}
    with timed_stage("generate", "images", lambda: done["images"], Accelerator(cpu=True), timings):
        work_starts()
        for images in (8, 16, 20):
            done["images"] = images
            units_done(images)
    assert (timings[0].work, timings[0].main_work, timings[0].wrapup_work) == (20, 20, 4)
    # 8, 8 and 4 images at 1 s each: the last 4 s are wrap-up, counted once, and the pace is the 16 others' 1 s.
    entry = _entry("generate", 20, 20, 1) | {"unit": "images", "main_work": 20, "wrapup_work": 4,
                                            "warmup_seconds": 0.0, "wrapup_seconds": 4.0}
    assert gpu_seconds(entry, 1000) == pytest.approx((4.0, 1000.0))


def test_the_work_counts_from_what_the_stage_says_was_done_before_it_and_the_peak_rss_is_in_gib(monkeypatch):
    from accelerate import Accelerator

    from gors.timings import _peak_rss_gib, timed_stage

    # The folder holds 8 units before and after (a checkpoint kept from a longer run); the stage itself started
    # from its 5th: its own work is 3 units, not 0.
    timings = []
    with timed_stage("train", "steps", lambda: 8, Accelerator(cpu=True), timings):
        work_starts(done_before=5)
    assert timings[0].work == 3
    # Linux's ru_maxrss is in KiB.
    monkeypatch.setattr(gors.timings.sys, "platform", "linux")
    monkeypatch.setattr(gors.timings.resource, "getrusage", lambda who: type("Usage", (), {"ru_maxrss": 3 * 2**20}))
    assert _peak_rss_gib() == 3.0


def test_a_timings_file_whose_stages_are_not_records_is_refused(tmp_path):
    path = tmp_path / "timings.json"
    path.write_text(json.dumps({"stages": {"train": 12.5}, "history": []}))
    with pytest.raises(ValueError, match="not a timings file"):
        read_timings(path)


def test_a_stage_whose_first_batch_cannot_be_told_from_the_rest_is_warned_of():
    one_batch = _entry("score", 130, 16, 1, setup=10.0) | {"warmup_seconds": None, "wrapup_seconds": None}
    (warning,) = calibration_warnings({"score": one_batch})
    assert warning.startswith("the calibration's score timings do not tell the first batch or step from the rest")
    compiled = one_batch | {"stage": "train", "settings": {"torch_compile": "inductor"}}
    assert "compiling, in train" in calibration_warnings({"train": compiled})[-1]
    steady = one_batch | {"warmup_seconds": 3.0, "wrapup_seconds": 1.0}
    assert calibration_warnings({"score": steady}) == []


def test_a_stage_marks_its_batches_inside_a_timed_stage_only():
    units_done(5)  # outside a timed stage: nothing to record, no error
    with listening() as marks:
        units_done(3)  # before its set-up is over: not work yet
        work_starts()
        units_done(8)
        units_done(16)
        with untimed():  # validation's images inside training: not the stage's batches
            work_starts()
            units_done(40)
    assert marks.work_start is not None and marks.first[1] == 8 and marks.last[1] == 16
    assert marks.work_start <= marks.first[0] <= marks.last[0]


def test_a_stage_s_pace_starts_after_its_warm_up_units():
    with listening() as marks:
        work_starts(warmup_units=2)
        units_done(1)
        assert marks.first[1] == 1  # fewer units than the warm-up: the first still marks where work went on
        units_done(2)
        units_done(3)
    assert marks.first[1] == 2 and marks.last[1] == 3
    # Set-up ends at 10; steps done at 40 (compiling), 45 (recording), 46, 47: the pace is 1 s a step.
    assert warmup_and_wrapup(StageMarks(10.0, None, (45.0, 2), (47.0, 4), warmup_units=2), 48.0) == (33.0, 1.0)


def test_estimate_counts_the_warm_up_and_wrap_up_once_and_scales_the_pace_between():
    # 130 s: 10 of set-up, 15 of the first batch's warm-up, 5 of wrap-up; 100 images in the other 100 s.
    entry = _entry("score", 130, 100, 1, setup=10.0) | {"warmup_seconds": 15.0, "wrapup_seconds": 5.0}
    assert gpu_seconds(entry, 1000) == pytest.approx((30.0, 1000.0))
    two = entry | {"num_processes": 2}
    assert gpu_seconds(two, 1000) == pytest.approx((60.0, 2000.0))
    timing = StageTiming("score", 130.0, 100, "images", 1, None, 1.0, "cpu", setup_seconds=10.0, warmup_seconds=15.0,
                         wrapup_seconds=5.0)
    assert timing.one_off_seconds == 30.0 and timing.work_rate == pytest.approx(1.0)
    # A short last batch of 5 images on each of 2 processes is wrap-up: 2 x 5 units are left out of the pace.
    short_last = replace(timing, num_processes=2, wrapup_work=5)
    assert short_last.work_rate == pytest.approx(0.9)  # (100 - 2 x 5) images / 100 s
    # More wrap-up units than work (the main process's share larger than the others'): no pace, never a negative one.
    assert replace(timing, work=4, num_processes=2, wrapup_work=3).work_rate == 0.0
    # Unknown (one batch, or an older gors): none counted, the whole time after the set-up is work.
    assert gpu_seconds(entry | {"warmup_seconds": None, "wrapup_seconds": None}, 1000) == pytest.approx((10.0, 1200.0))
    # 9 images on 2 processes, 5 of them the main process's: the wall time is its 5 images' (20 s each on a GPU), not
    # 9 images' over 2 GPUs (22.2 s). Steps are every process's: priced per step of the launch.
    uneven = _entry("score", 100, 9, 2) | {"unit": "images", "main_work": 5}
    assert gpu_seconds(uneven, 1000) == pytest.approx((0.0, 20000.0))
    assert gpu_seconds({k: v for k, v in uneven.items() if k != "main_work"}, 1000)[1] == pytest.approx(22222.22)
    steps = _entry("train", 100, 10, 2) | {"unit": "steps", "main_work": 10}
    assert gpu_seconds(steps, 1000) == pytest.approx((0.0, 20000.0))
    with pytest.raises(ValueError, match="warmup_seconds=-1 is not a number >= 0"):
        check_stages({"score": entry | {"warmup_seconds": -1}}, {})
    with pytest.raises(ValueError, match="setup_seconds=10.0 \\+ warmup_seconds=116.0 \\+ wrapup_seconds=5.0 is not less"):
        check_stages({"score": entry | {"warmup_seconds": 116.0}}, {})


def test_a_main_process_share_outside_an_even_share_and_the_whole_is_not_priced_as_its_own():
    """`main_work` prices images only from an even share of the work to all of it; else the pace is work / processes."""
    uneven = _entry("score", 100, 9, 2) | {"unit": "images"}
    even_pace = gpu_seconds(uneven, 1000)[1]
    assert even_pace == pytest.approx(22222.22)
    for impossible in (12, 3):  # more than the launch's images, or less than an even share of them
        assert gpu_seconds(uneven | {"main_work": impossible}, 1000)[1] == pytest.approx(even_pace)
    assert gpu_seconds(uneven | {"main_work": 9}, 1000)[1] == pytest.approx(11111.11)  # all 9 on the main: its own


def test_estimate_command_prints_the_papers_colour_run_and_refuses_missing_stages(tmp_path, capsys):
    folder = tmp_path / "calibration"
    folder.mkdir()
    stages = {
        "generate": _entry("generate", 50, 100, 1, generation={"num_inference_steps": 50}),
        "score": _entry("score", 10, 100, 1),
        "train": _entry("train", 100, 100, 1, train_batch_size=2, gradient_accumulation_steps=8),
    }
    (folder / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    rows = estimate_command(EstimateConfig(timings=[str(folder)]))
    out = capsys.readouterr().out
    # The plan samples with 50 steps (gors.core.paper), as the calibration did: 63 000 x 0.5 s.
    assert "| generate | 63000 images x 50 steps | 8.75 |" in out
    assert "the calibration sampled with 50 denoising steps; generation time is scaled by 50 / 50" in out
    assert "num_inference_steps = 50 (source unclear:" in out and "num_prompts = 700 (each category's" in out
    assert "| train | 15000 steps x batch 16 | 4.17 |" in out  # 240 000 samples x 1/16 s
    assert "official / gors for generate, score, train: the ratios measured on 2 CPU cores" in out
    assert {r.stage: r.speedup for r in rows} == CPU_MEASURED_SPEEDUPS

    overlapped = {"generate+score": stages["generate"] | {"stage": "generate+score"}, "train": stages["train"]}
    (folder / "timings.json").write_text(json.dumps({"stages": overlapped, "history": []}))
    with pytest.raises(ValueError, match="calibrate without --overlap_scoring"):
        estimate_command(EstimateConfig(timings=[str(folder)]))
    # Without training too, every missing stage is named (a run that did every stage gives them all).
    (folder / "timings.json").write_text(json.dumps({"stages": {"generate+score": overlapped["generate+score"]},
                                                     "history": []}))
    with pytest.raises(ValueError, match="timings lack generate, score, train"):
        estimate_command(EstimateConfig(timings=[str(folder)]))
    del stages["train"]
    (folder / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    with pytest.raises(ValueError, match="timings lack train"):
        estimate_command(EstimateConfig(timings=[str(folder)]))
    with pytest.raises(FileNotFoundError, match="nowhere: no such run folder or file"):
        estimate_command(EstimateConfig(timings=[str(tmp_path / "nowhere")]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no timings.json"):
        estimate_command(EstimateConfig(timings=[str(tmp_path / "empty")]))
    with pytest.raises(ValueError, match="--reference_speedups"):
        EstimateConfig(timings=[str(folder)], reference_speedups='{"score": 0}')


def test_reference_speedups_merge_over_the_defaults_and_refuse_unknown_stages():
    config = EstimateConfig(timings=["x"], reference_speedups='{"train": 3}')
    assert config.reference_speedups == CPU_MEASURED_SPEEDUPS | {"train": 3}
    assert config.given_speedups == {"train"} and EstimateConfig(timings=["x"]).given_speedups == set()
    with pytest.raises(ValueError, match="unknown stage 'training'; the stages are generate, score, select, train"):
        EstimateConfig(timings=["x"], reference_speedups='{"training": 3}')
    for bad in ('{"train": true}', '{"train": NaN}'):  # JSON true is no ratio, and NaN is not > 0
        with pytest.raises(ValueError, match="each stage's ratio must be a number > 0"):
            EstimateConfig(timings=["x"], reference_speedups=bad)


@pytest.mark.parametrize("text, message", [
    ("{}", "not a timings file"), ("[1, 2]", "not a timings file"), ('{"stages": 3}', "not a timings file"),
    ('{"stages": {', r"not valid JSON \(Expecting"),
])
def test_estimate_and_report_name_a_file_that_is_no_timings_or_summary(tmp_path, text, message):
    from gors.report import report

    path = tmp_path / "timings.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}: {message}"):
        estimate_command(EstimateConfig(timings=[str(path)]))
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(ValueError, match=f"{tmp_path / 'summary.json'}:? (is )?not"):
        report([tmp_path], tmp_path / "report")


def test_an_unreadable_timings_file_is_moved_aside_when_a_run_writes_its_timings(tmp_path, capsys):
    from gors.timings import write_timings

    (tmp_path / "timings.json").write_text("{")
    write_timings(tmp_path, [], {})
    assert (tmp_path / "timings.json.bad").read_text() == "{"
    assert read_timings(tmp_path)["stages"] == {}
    assert "moved it to timings.json.bad" in capsys.readouterr().err


def test_the_official_column_scales_the_work_by_the_ratio_and_not_the_set_up():
    # 30 s loading the reward model, then 1 s per image: the official procedure loads its model too.
    stages = {"generate": _entry("generate", 100, 400, 1, generation={"num_inference_steps": 25}),
              "score": _entry("score", 130, 100, 1, setup=30.0),
              "train": _entry("train", 200, 100, 1, setup=100.0, train_batch_size=2, gradient_accumulation_steps=1)}
    plan = RunPlan(num_prompts=10, images_per_prompt=36, num_inference_steps=25, max_train_steps=10,
                   global_batch_size=2)
    rows = {r.stage: r for r in estimate(stages, plan, {"score": 8.0, "train": 2.0})}
    assert rows["score"].official_gpu_hours == pytest.approx((30 + 8 * 360 * 1.0) / 3600)
    assert rows["train"].official_gpu_hours == pytest.approx((100 + 2 * 10 * 1.0) / 3600)


def test_the_closing_note_names_only_the_default_ratios_and_not_selects_placeholder(tmp_path, capsys):
    stages = {"generate": _entry("generate", 50, 100, 1, generation={"num_inference_steps": 30}),
              "score": _entry("score", 10, 100, 1), "select": _entry("select", 1, 100, 1) | {"unit": "images"},
              "train": _entry("train", 100, 100, 1, train_batch_size=2, gradient_accumulation_steps=8)}
    (tmp_path / "timings.json").write_text(json.dumps({"stages": stages, "history": []}))
    # The user's train ratio equals the default: it is theirs, not "measured on 2 CPU cores".
    estimate_command(EstimateConfig(timings=[str(tmp_path)],
                                    reference_speedups=json.dumps({"train": CPU_MEASURED_SPEEDUPS["train"]})))
    out = capsys.readouterr().out
    assert "official / gors for generate, score: the ratios measured on 2 CPU cores" in out
    assert "select: 1.00x is a placeholder" in out
    estimate_command(EstimateConfig(timings=[str(tmp_path)],
                                    reference_speedups='{"generate": 2, "score": 3, "select": 1, "train": 4}'))
    out = capsys.readouterr().out
    assert "measured on 2 CPU cores" not in out and "placeholder" not in out


def test_the_stage_table_stays_aligned_with_generate_and_score_and_shows_the_rate_after_set_up():
    timings = [StageTiming("generate+score", 110.0, 400, "images", 1, None, 2.3, "cpu", setup_seconds=10.0),
               StageTiming("train", 12.5, 2, "steps", 8, 40.1, 12.0, "cuda", setup_seconds=2.5)]
    lines = format_timings(timings).splitlines()
    assert len({len(line) for line in lines}) == 1  # every column ends where its header does
    header = lines[0]
    assert "rate /s (incl. set-up)" in header and "work rate /s" in header
    end = header.index("work rate /s") + len("work rate /s")
    assert [line[:end].split()[-1] for line in lines[2:]] == ["4.00", "0.20"]  # 400 / 100 s and 2 / 10 s
    # The rate of one process (one GPU): the launch's, set-up included, over its processes.
    per_process = header.index("per process /s (incl. set-up)") + len("per process /s (incl. set-up)")
    assert [line[:per_process].split()[-1] for line in lines[2:]] == ["3.64", "0.02"]  # 400 / 110 s; 2 / 12.5 s / 8
    assert timings[1].rate_per_process == pytest.approx(0.02)
    # A stage that did nothing this time (a finished rerun) shows no rate rather than 0.00.
    idle = format_timings([StageTiming("train", 1.5, 0, "steps", 1, None, 1.0, "cpu")]).splitlines()[2]
    assert "0.00" not in idle and idle.split()[:5] == ["train", "1.5", "0.0", "0", "steps"]


def test_a_rounds_calibration_records_its_validation_and_counts_the_last_steps_once(make_run_config, monkeypatch):
    # Validation every 100 steps never falls in a round's 2 steps, but a round validates at its last step: in the
    # wrap-up after it, counted once, not scaled per step.
    # 3 validation prompts: their images' count (3) is no step count of a round (1, 2).
    config = make_run_config(rounds=2, max_train_steps=4, checkpointing_steps=100, validation_benchmark="toy:train",
                             validation_num_prompts=3, validation_steps=100, report_to="none")
    marks = []  # each timed stage's (first, last) batch marks: generate, score, select, train per round

    def recording(stage_marks, end):
        marks.append((stage_marks.first, stage_marks.last))
        return warmup_and_wrapup(stage_marks, end)

    monkeypatch.setattr(gors.timings, "warmup_and_wrapup", recording)
    run(config)
    # A round's training marks its 2 steps; its last step's validation (images generated and scored by the
    # toy benchmark's own stages) marks nothing: it is wrap-up.
    assert [(first[1], last[1]) for first, last in (marks[3], marks[7])] == [(1, 2), (1, 2)]
    stages = read_timings(Path(config.output_dir) / "round-001")["stages"]
    assert stages["train"]["work"] == 2 and stages["train"]["settings"]["validation_benchmark"] == "toy:train"
    assert stages["train"]["wrapup_seconds"] > 0
    assert calibration_warnings({"train": stages["train"]}) == []  # (its generation's batch of 2 is warned of)
    # Timings without the wrap-up (a gors before 0.2) scaled that validation as training: warned of.
    older = {"train": {key: value for key, value in stages["train"].items() if key != "wrapup_seconds"}}
    [warning] = calibration_warnings(older)
    assert warning.startswith("the calibration's training ran validation 1 time(s) in its 2 steps")
