"""`gors status`: what a run folder holds at each stage, and which command writes it, without taking a lock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from gors.cli import main
from gors.core.distributed import reset_process_state
from gors.status import folder_status

REPO = Path(__file__).resolve().parents[1]
HOLDER = ("import sys, time; from pathlib import Path; from gors.core.lock import _acquire; "
          "[_acquire(Path(sys.argv[1]), stage, 'gors train --output_dir x') for stage in ('select', 'train')]; "
          "print('held', flush=True); time.sleep(300)")


def _gone_pid() -> int:
    """The pid of a process that has ended (as a killed holder's)."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def _record(stage: str = "train", command: str = "gors train --output_dir x", pid: int | None = None,
            started: float | None = None, host: str | None = None) -> dict:
    """A lock record of `stage`; by default this process's, on this host."""
    return {"stage": stage, "command": command, "pid": os.getpid() if pid is None else pid,
            "host": host or socket.gethostname(), "argv": [], "started": time.time() if started is None else started}


def test_each_stage_shows_as_it_is_reached(make_run_config):
    from gors.generate import generate
    from gors.run import run

    config = make_run_config(max_train_steps=2, checkpointing_steps=1)
    folder = Path(config.output_dir)
    generate(config)
    reset_process_state()
    metadata = folder / "samples" / "part-00000" / "metadata.jsonl"
    metadata.write_text("".join(metadata.read_text().splitlines(keepends=True)[:-1]))  # as a kill leaves it
    assert dict(folder_status(folder)) == {"samples": "5 images of 3 prompts (1 to 2 each)"}
    run(config)
    reset_process_state()
    rows = dict(folder_status(folder))
    assert rows["samples"] == "6 images of 3 prompts (2 each)"
    assert rows["scores b_vqa"] == "6 of 6 images"
    assert rows["selection"] == "6 of 6 samples kept (tau = 0)"
    assert rows["training"].startswith("step 2 of 2 (100 %): checkpoint-2, saved ")
    assert rows["final LoRA"] == "pytorch_lora_weights.safetensors (step 2)"
    assert not any(what.startswith(("writing", "stopped")) for what in rows)  # every lock released
    # A training that goes on (to step 20 here): the time it needs at its last checkpoints' pace.
    def edit_marker(step: int, **values) -> None:
        path = folder / "checkpoints" / f"checkpoint-{step}" / "checkpoint.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | values))

    assert json.loads((folder / "checkpoints" / "checkpoint-2" / "checkpoint.json").read_text())["since"]["step"] == 0
    edit_marker(1, time="2026-12-06T10:00:00+00:00", since={"step": 0, "time": "2026-12-06T09:50:00+00:00"})
    edit_marker(2, time="2026-12-06T10:03:00+00:00", since={"step": 0, "time": "2026-12-06T09:50:00+00:00"},
                max_train_steps=20)  # 180 s a step, 18 steps to go
    saved = datetime.fromisoformat("2026-12-06T10:03:00+00:00").astimezone().strftime("%Y-%m-%d %H:%M:%S")
    assert dict(folder_status(folder))["training"].endswith(f"saved {saved}; about 54 min to go at the pace of "
                                                            "steps 1 to 2")
    # Resumed at 12:00 from step 1 (the run was down for two hours): the pace from there, not from checkpoint 1.
    edit_marker(2, time="2026-12-06T12:03:00+00:00", since={"step": 1, "time": "2026-12-06T12:00:00+00:00"},
                max_train_steps=1000)
    assert dict(folder_status(folder))["training"].endswith("about 49.9 h to go at the pace of steps 1 to 2")
    # A checkpoint marker of an older gors records no file hashes: the final LoRA is named, unmatched.
    marker = folder / "checkpoints" / "checkpoint-2" / "checkpoint.json"
    recorded = marker.read_text()
    marker.write_text(json.dumps({k: v for k, v in json.loads(recorded).items() if k != "files"}))
    assert dict(folder_status(folder))["final LoRA"] == "pytorch_lora_weights.safetensors"
    marker.write_text(recorded)
    # Selected since (here the same rows in another order), the selection trained on kept twice: the newer copy is
    # named; a kept copy that cannot be read leaves the note out.
    selection = folder / "selection.jsonl"
    for number in (1, 2):
        shutil.copy(selection, folder / f"selection.previous-{number}.jsonl")
    selection.write_text("".join(selection.read_text().splitlines(keepends=True)[::-1]))
    assert dict(folder_status(folder))["selection"].endswith("; selected since the newest checkpoint was trained (on "
                                                             "selection.previous-2.jsonl)")
    (folder / "selection.previous-3.jsonl").write_text("not json\n{}\n")
    assert dict(folder_status(folder))["selection"] == "6 of 6 samples kept (tau = 0)"
    # The folder above the run holds none itself.
    assert folder_status(folder.parent) == [("run", f"no gors run or evaluation in this folder yet; it holds 1 run "
                                                    f"folder(s) ({folder.name}): gors status {folder.parent}/*")]
    assert folder_status(folder / "samples") == [("run", f"no gors run or evaluation in this folder yet; it lies in the "
                                                          f"run folder {folder.resolve()}: gors status {folder.resolve()}")]
    # A training with other settings sets the checkpoints aside as it starts: until its first checkpoint, the
    # final LoRA is the earlier training's.
    (folder / "checkpoints").rename(folder / "checkpoints.previous-1")
    rows = dict(folder_status(folder))
    assert rows["training"] == "no checkpoint yet"
    assert rows["final LoRA"] == "pytorch_lora_weights.safetensors (an earlier training's, checkpoints in " \
                                 "checkpoints.previous-1/)"
    # Set aside, only a checkpoint of other weights (step 1's), or one whose marker cannot be read: not its LoRA.
    shutil.rmtree(folder / "checkpoints.previous-1" / "checkpoint-2")
    assert dict(folder_status(folder))["final LoRA"] == "pytorch_lora_weights.safetensors"
    (folder / "checkpoints.previous-1" / "checkpoint-1" / "checkpoint.json").write_text("{")
    assert dict(folder_status(folder))["final LoRA"] == "pytorch_lora_weights.safetensors"
    # Checkpoints deleted after a training finished: its own LoRA, not an earlier training's.
    shutil.rmtree(folder / "checkpoints.previous-1")
    rows = dict(folder_status(folder))
    assert rows["final LoRA"] == "pytorch_lora_weights.safetensors" and "training" not in rows
    # A reward named `module:Class` by its name (not its folder's), with the images it scored so far; a score folder
    # without its settings (a scoring that has not started) is no reward's.
    shutil.copytree(folder / "scores" / "b_vqa", folder / "scores" / "my.rewards_Mine")
    settings = folder / "scores" / "my.rewards_Mine" / "settings.json"
    settings.write_text(json.dumps(json.loads(settings.read_text()) | {"reward": "my.rewards:Mine"}))
    part = folder / "scores" / "my.rewards_Mine" / "part-00000.jsonl"
    part.write_text("".join(part.read_text().splitlines(keepends=True)[1:]))
    (folder / "scores" / "not_started").mkdir()
    assert [row for row in folder_status(folder) if row[0].startswith("scores")] == [
        ("scores b_vqa", "6 of 6 images"), ("scores my.rewards:Mine", "5 of 6 images")]
    # A selection cut short since: still a status (training names the problem when it reads it).
    selection.write_text(selection.read_text()[:-10])
    assert dict(folder_status(folder))["selection"].startswith("6 of 6 samples kept")


def test_a_command_writing_the_folder_is_named_and_a_killed_one_reads_as_stopped(make_run_config, capsys):
    folder = Path(make_run_config().output_dir)
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        assert holder.stdout.readline() == "held\n"
        main(["status", str(folder)])
        out = capsys.readouterr().out
        assert f"writing select, train  `gors train --output_dir x` (pid {holder.pid} on host " in out
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    rows = dict(folder_status(folder))
    assert rows["stopped select, train"].endswith("is gone: the same command resumes it")


def test_a_lock_record_whose_pid_a_later_process_took_reads_as_stopped(tmp_path):
    # The holder was killed and the OS gave its pid to this process, which started after the record was written.
    from gors.core.lock import lock_path

    folder = tmp_path / "run"
    folder.mkdir()
    record = {"stage": "train", "command": "gors train --output_dir x", "pid": os.getpid(),
              "host": socket.gethostname(), "argv": [], "started": psutil.Process().create_time() - 60}
    lock_path(folder, "train").write_text(json.dumps(record))
    assert dict(folder_status(folder))["stopped train"].endswith("is gone: the same command resumes it")
    lock_path(folder, "train").write_text(json.dumps(record | {"started": time.time()}))
    assert dict(folder_status(folder))["writing train"].startswith(f"`gors train --output_dir x` (pid {os.getpid()}")


def test_a_folder_that_does_not_exist_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["status", str(tmp_path / "nothing")])
    captured = capsys.readouterr()
    assert captured.err.strip() == f"error: {tmp_path / 'nothing'}: no such run folder" and not captured.out


def test_a_gors_evaluate_folder_shows_each_benchmark_and_its_result_once_finished(tmp_path):
    from gors.core.toy import PRETRAINED_DIR

    main(["evaluate", "--pretrained_model_name_or_path", str(PRETRAINED_DIR / "pipeline"), "--benchmarks",
          "toy,toy:train", "--max_prompts", "2", "--images_per_prompt", "1", "--num_inference_steps", "2",
          "--resolution", "32", "--output_dir", str(tmp_path / "eval")])
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())["summaries"]
    rows = folder_status(tmp_path / "eval")
    assert rows == [(entry["label"], f"2 images of 2 prompts (1 each), 2 scored; finished: binding_accuracy "
                                     f"{entry['binding_accuracy']:.4f}") for entry in summary]
    # A benchmark of one's own (`module:Class`, unknown to this process) still being evaluated is listed too.
    shutil.copytree(tmp_path / "eval" / "toy" / "train" / "samples", tmp_path / "eval" / "mybench" / "samples")
    assert ("mybench", "2 images of 2 prompts (1 each), 0 scored") in folder_status(tmp_path / "eval")
    # Copied without its (emptied) lock file, its summary still says what it is; a folder in it is no run of its own.
    (tmp_path / "eval" / ".lock-evaluate").unlink()
    assert folder_status(tmp_path / "eval") == sorted([*rows, ("mybench", "2 images of 2 prompts (1 each), 0 scored")])
    assert folder_status(tmp_path / "eval" / "toy") == [
        ("run", f"no gors run or evaluation in this folder yet; it lies in the run folder {tmp_path / 'eval'}: gors "
                f"status {tmp_path / 'eval'}")]
    # One that scored an image folder (`--images`) names it.
    (tmp_path / "eval" / "summary.json").write_text(json.dumps({"summaries": [summary[0] | {"images": "pictures"}]}))
    assert dict(folder_status(tmp_path / "eval"))[summary[0]["label"]].endswith(
        f"2 scored; scored the images of pictures; finished: binding_accuracy {summary[0]['binding_accuracy']:.4f}")


def test_a_process_still_running_after_its_main_process_died_is_named_with_what_to_do(tmp_path):
    from gors.core.lock import lock_path

    folder = tmp_path / "run"
    folder.mkdir()
    lock_path(folder, "train").write_text(json.dumps(_record(pid=_gone_pid(), started=1.0e9)))  # a killed main's
    stray = ("import sys, time; from pathlib import Path; from gors.core.lock import _acquire, process_lock_stage; "
             "_acquire(Path(sys.argv[1]), process_lock_stage('train', 1), 'gors train --output_dir x'); "
             "print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", stray, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        assert holder.stdout.readline() == "held\n"
        rows = dict(folder_status(folder))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    assert rows["stopped train"].endswith(f"is gone: stop the processes of its launch that still run (pid "
                                          f"{holder.pid}), then the same command resumes it")
    assert rows["writing train-process-00001"].endswith("a process of a launch whose main process is gone")
    assert dict(folder_status(folder))["stopped train"].endswith("is gone: the same command resumes it")


def test_one_benchmarks_own_folder_and_an_evaluation_written_into_a_run_folder(make_run_config, tmp_path, capsys):
    from gors.run import run

    config = make_run_config(max_train_steps=1)
    folder = Path(config.output_dir)
    run(config)
    reset_process_state()
    main(["evaluate", "--pretrained_model_name_or_path", config.pretrained_model_name_or_path, "--benchmarks", "toy",
          "--max_prompts", "2", "--images_per_prompt", "1", "--num_inference_steps", "2", "--resolution", "32",
          "--output_dir", str(folder)])
    reset_process_state()
    # One benchmark's own folder, as the toy demo's eval_base/ is (beside the run's other folders of samples).
    shutil.copytree(folder / "toy" / "held_out", folder / "eval_base")
    (folder / "eval_base" / ".lock-evaluate").touch()
    shutil.copytree(folder / "samples", folder / "validation" / "step-1" / "samples")
    rows = dict(folder_status(folder))
    assert rows["samples"] == "6 images of 3 prompts (2 each)" and rows["final LoRA"].endswith("(step 1)")
    result = json.loads((folder / "toy" / "held_out" / "summary.json").read_text())["binding_accuracy"]
    finished = f"2 images of 2 prompts (1 each), 2 scored; finished: binding_accuracy {result:.4f}"
    assert [(what, value) for what, value in rows.items() if "images of" in value and what != "samples"] == \
        [("toy:held_out", finished)]
    assert folder_status(folder / "eval_base") == [("toy:held_out", finished)]
    # A benchmark the evaluation has started, before the summary lists it.
    shutil.copytree(folder / "toy" / "held_out" / "samples", folder / "toy" / "train" / "samples")
    assert dict(folder_status(folder))["toy:train"] == "2 images of 2 prompts (1 each), 0 scored"
    (folder / "eval_base" / "summary.json").unlink()  # still evaluating: the folder's name stands for its label
    assert folder_status(folder / "eval_base") == [("eval_base", "2 images of 2 prompts (1 each), 2 scored")]
    # A summary this process cannot read is a row; `gors status` reports the other folders, then fails.
    (folder / "eval_base" / "summary.json").write_text(json.dumps({"benchmark": "not_known_here"}))
    rows = dict(folder_status(folder / "eval_base"))
    assert rows["eval_base"] == "2 images of 2 prompts (1 each), 2 scored"
    assert "benchmark 'not_known_here', which is not known here" in rows["summary.json"]
    (tmp_path / "a_file").write_text("")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["status", str(tmp_path / "a_file"), str(folder)])
    captured = capsys.readouterr()
    assert f"{tmp_path / 'a_file'}\n  not a folder\n" in captured.out and "toy:held_out" in captured.out
    assert captured.err.strip() == f"error: {tmp_path / 'a_file'}: not a folder"


def test_a_rounds_run_resumed_with_more_rounds_does_not_count_them_against_the_old_plan(tmp_path):
    folder = tmp_path / "rounds"
    for index in range(3):
        (folder / f"round-{index:03d}").mkdir(parents=True)
    (folder / "rounds.json").write_text(json.dumps({"settings": {"rounds": 2}, "rounds": [{}, {}]}))
    assert dict(folder_status(folder))["rounds"] == "2 finished"
    (folder / "round-002").rmdir()
    assert dict(folder_status(folder))["rounds"] == "2 of 2 finished"


def _markers(folder: Path, *markers: dict) -> None:
    """Complete checkpoints of `folder` with these markers (each with its "step")."""
    for marker in markers:
        checkpoint = folder / "checkpoints" / f"checkpoint-{marker['step']}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "checkpoint.json").write_text(json.dumps({"fingerprint": {"rank": 4}} | marker))


def _local(utc: str) -> str:
    return datetime.fromisoformat(utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


@pytest.fixture
def ahead_of_utc(monkeypatch):
    """This machine's time zone 5:30 ahead of UTC (checkpoint markers record UTC)."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_training_progress_is_rounded_down_and_the_time_left_only_where_it_can_be_told(tmp_path, ahead_of_utc):
    """The share done is rounded down (99 % until the last step), a finished training has no time left, and
    the time left comes from two checkpoints of one process and one training only, in minutes (at least 1)
    under an hour."""
    since = {"step": 0, "time": "2026-12-06T09:00:00+00:00"}
    first = {"step": 998, "time": "2026-12-06T10:00:00+00:00", "since": since}
    last = {"step": 999, "time": "2026-12-06T10:00:20+00:00", "since": since, "max_train_steps": 1000}
    _markers(tmp_path / "pace", first, last)
    assert _local(last["time"]) == "2026-12-06 15:30:20"  # saved times are shown in this machine's time zone
    assert dict(folder_status(tmp_path / "pace"))["training"] == (
        f"step 999 of 1000 (99 %): checkpoint-999, saved {_local(last['time'])}; about 1 min to go at the pace of "
        "steps 998 to 999")
    # 3580 s to go reads as an hour, not as "60 min".
    _markers(tmp_path / "hour", first, last | {"max_train_steps": 999 + 179})
    assert dict(folder_status(tmp_path / "hour"))["training"].endswith("; about 1.0 h to go at the pace of steps 998 "
                                                                        "to 999")
    # Done: no time left, however the markers' times read.
    _markers(tmp_path / "done", first, last | {"max_train_steps": 999})
    assert dict(folder_status(tmp_path / "done"))["training"] == \
        f"step 999 of 999 (100 %): checkpoint-999, saved {_local(last['time'])}"
    # Two checkpoints saved at one time (a clock set back): no pace.
    _markers(tmp_path / "clock", first, last | {"time": first["time"]})
    assert "to go" not in dict(folder_status(tmp_path / "clock"))["training"]
    # The checkpoint before is another training's (other settings): the pace since the newest one's process started.
    _markers(tmp_path / "other", first | {"fingerprint": {"rank": 8}}, last)
    assert dict(folder_status(tmp_path / "other"))["training"].endswith("at the pace of steps 0 to 999")
    # The newest checkpoint's process started at the step it saved (nothing trained since): no pace.
    _markers(tmp_path / "resumed", last | {"since": {"step": 999, "time": "2026-12-06T10:00:00+00:00"}})
    assert "to go" not in dict(folder_status(tmp_path / "resumed"))["training"]


def test_images_per_prompt_count_the_prompts_without_one():
    """Prompts without an image are the low end of the spread, and say so; an even spread is "N each"."""
    from collections import Counter

    from gors.status import _per_prompt

    assert _per_prompt(Counter({0: 2, 1: 2}), 3) == "0 to 2 each, 1 prompts without one"
    assert _per_prompt(Counter({0: 2, 1: 1, 2: 2}), 3) == "1 to 2 each"
    assert _per_prompt(Counter({0: 2, 1: 2, 2: 2}), 3) == "2 each"
    assert _per_prompt(Counter(), 3) == "none yet"


def test_the_best_lora_is_read_from_the_copy_an_interrupted_publish_left_aside(tmp_path):
    """Between the two renames of publishing a new best LoRA, only `.best.old` holds it: status reads it there
    (without renaming it back); `best/` comes first where both are there."""
    aside = tmp_path / ".best.old"
    aside.mkdir()
    (aside / "best.json").write_text(json.dumps({"step": 2, "benchmark": "toy", "metric": "acc", "value": 0.5}))
    assert dict(folder_status(tmp_path))["best LoRA"] == "step 2: toy acc 0.5000 (best/)"
    assert aside.is_dir() and not (tmp_path / "best").exists()
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text(json.dumps({"step": 4, "benchmark": "toy", "metric": "acc",
                                                             "value": 0.75}))
    assert dict(folder_status(tmp_path))["best LoRA"] == "step 4: toy acc 0.7500 (best/)"


def test_a_share_of_a_launch_whose_main_process_is_on_another_host_is_no_stray(tmp_path):
    """A multi-node launch: the main process's lock record names another host, whose processes cannot be looked
    at from here, and a process of this host holds its share. The share is that launch's, not a stray of a
    launch whose main process is gone."""
    from gors.status import lock_rows

    other_host = socket.gethostname() + "-other-node"
    share = _record("train-process-00001")
    rows = lock_rows(tmp_path, {"train": _record(pid=_gone_pid(), host=other_host), "train-process-00001": share})
    assert [what for what, _ in rows] == ["writing train"]
    assert rows[0][1].endswith("by its lock record (another host: whether it still runs is not known here)")
    # A share of another host, whose main record is gone, is not looked for among this host's processes.
    assert lock_rows(tmp_path, {"train-process-00001": share | {"host": other_host}}) == []


def test_a_rounds_run_is_known_by_its_first_round_before_rounds_json_and_its_lora_by_the_last_round(tmp_path):
    """Stopped in round 0, a --rounds folder has no rounds.json yet: its `round-000/` says what it is. Once
    rounds finished, the final LoRA is the last finished round's (rounds count from 0)."""
    from gors.core.run_folder import round_dir

    folder = tmp_path / "rounds"
    assert round_dir(folder, 3) == folder / "round-003"
    from gors.core.lock import lock_path

    round_dir(folder, 0).mkdir(parents=True)
    for held in (folder, round_dir(folder, 0)):  # one `gors run --rounds` holds both: its row is the top folder's
        lock_path(held, "train").write_text(json.dumps(_record(command="gors run --rounds 2")))
    rows = dict(folder_status(folder))
    assert rows["rounds"] == "0 finished" and rows["round-000 samples"] == "none yet"
    assert [what for what in rows if "writing" in what] == ["writing train"]
    round_dir(folder, 1).mkdir()
    (folder / "round-001.log").write_text("")  # a file is no round
    (folder / "pytorch_lora_weights.safetensors").write_bytes(b"lora")
    rows = dict(folder_status(folder))
    assert "round-001 samples" in rows and "final LoRA" not in rows  # no round finished: not a round's LoRA
    (folder / "rounds.json").write_text(json.dumps({"settings": {"rounds": 2}, "rounds": [{}, {}]}))
    assert dict(folder_status(folder))["final LoRA"] == "pytorch_lora_weights.safetensors (round 1's)"


def test_lock_rows_leave_out_the_holders_shown_for_another_folder(tmp_path):
    """A --rounds folder's latest round shows the commands writing it, but not those its top folder's rows name
    already (`skip`): one `gors run --rounds` holds both."""
    from gors.status import lock_rows

    record = _record(command="gors run --rounds 2")
    assert [what for what, _ in lock_rows(tmp_path, {"train": record})] == ["writing train"]
    assert lock_rows(tmp_path, {"train": record}, skip=frozenset({(os.getpid(), socket.gethostname())})) == []


def test_a_selection_by_top_fraction_before_its_training(tmp_path):
    """Selected by --top_fraction (no threshold), nothing trained yet: no checkpoint, and no final LoRA."""
    (tmp_path / "selection_summary.json").write_text(json.dumps({"num_selected": 3, "num_samples": 6,
                                                                 "threshold": None}))
    assert dict(folder_status(tmp_path)) == {"samples": "none yet", "selection": "3 of 6 samples kept (top fraction)",
                                             "training": "no checkpoint yet"}


def test_two_holders_of_one_command_have_a_row_each_and_a_gone_share_still_marks_a_gors_folder(tmp_path):
    """A killed `gors run` left its lock of one stage, and the same command started again holds another: a row
    each. A folder whose only record is a gone process's share of a stage is still one a command wrote."""
    from gors.core.lock import lock_path
    from gors.status import lock_rows

    command = "gors run --output_dir x"
    records = {"score": _record("score", command, pid=_gone_pid(), started=1.0e9), "train": _record(command=command)}
    assert [what for what, _ in lock_rows(tmp_path, records)] == ["stopped score", "writing train"]
    lock_path(tmp_path, "train-process-00001").write_text(json.dumps(records["score"] | {"stage": "train-process-00001"}))
    assert folder_status(tmp_path) == [("samples", "none yet")]


def test_a_folder_above_run_folders_names_them_five_at_most(tmp_path):
    """A run folder is one with a stage's lock file, a --rounds run's first round, or a sample store."""
    for stage in ("generate", "score", "select", "train"):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / f".lock-{stage}").touch()
    (tmp_path / "rounds" / "round-000").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    start = "no gors run or evaluation in this folder yet; it holds"
    assert folder_status(tmp_path) == [("run", f"{start} 5 run folder(s) (generate, rounds, score, select, train): "
                                              f"gors status {tmp_path}/*")]
    (tmp_path / "a_store" / "samples").mkdir(parents=True)
    assert folder_status(tmp_path) == [("run", f"{start} 6 run folder(s) (a_store, generate, rounds, score, select, "
                                              f"...): gors status {tmp_path}/*")]


def test_a_folder_whose_records_cannot_be_read_is_said_in_its_place(tmp_path, capsys):
    (tmp_path / "cut" / "selection_summary.json").parent.mkdir()
    (tmp_path / "cut" / "selection_summary.json").write_text('{"num_selected": 3')
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main(["status", str(tmp_path / "cut"), str(tmp_path / "empty")])
    captured = capsys.readouterr()
    assert f"{tmp_path / 'cut'}\n  cannot be read: " in captured.out and f"{tmp_path / 'empty'}\n  run " in captured.out
    assert captured.err.startswith(f"error: {tmp_path / 'cut'}: cannot be read: ")
