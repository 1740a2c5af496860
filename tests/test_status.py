"""`gors status`: what a run folder holds at each stage, and which command writes it, without taking a lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gors.cli import main
from gors.core.distributed import reset_process_state
from gors.status import folder_status

REPO = Path(__file__).resolve().parents[1]
HOLDER = ("import sys, time; from pathlib import Path; from gors.core.lock import _acquire; "
          "[_acquire(Path(sys.argv[1]), stage, 'gors train --output_dir x') for stage in ('select', 'train')]; "
          "print('held', flush=True); time.sleep(300)")


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

    edit_marker(1, time="2026-12-06T10:00:00+00:00")
    edit_marker(2, time="2026-12-06T10:03:00+00:00", max_train_steps=20)  # 180 s a step, 18 steps to go
    assert dict(folder_status(folder))["training"].endswith("saved 2026-12-06T10:03:00+00:00; about 0.9 h to go "
                                                            "at the pace of steps 1 to 2")
    # A checkpoint marker of an older gors records no file hashes: the final LoRA is named, unmatched.
    marker = folder / "checkpoints" / "checkpoint-2" / "checkpoint.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "files"}))
    assert dict(folder_status(folder))["final LoRA"] == "pytorch_lora_weights.safetensors"
    # The folder above the run holds none itself.
    assert folder_status(folder.parent) == [("run", "no gors run or evaluation in this folder yet")]


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


def test_a_folder_that_does_not_exist_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["status", str(tmp_path / "nothing")])
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nothing'}: no such run folder"


def test_a_gors_evaluate_folder_shows_each_benchmark_and_its_result_once_finished(tmp_path):
    from gors.core.toy import PRETRAINED_DIR

    main(["evaluate", "--pretrained_model_name_or_path", str(PRETRAINED_DIR / "pipeline"), "--benchmarks",
          "toy,toy:train", "--max_prompts", "2", "--images_per_prompt", "1", "--output_dir", str(tmp_path / "eval")])
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())["summaries"]
    rows = folder_status(tmp_path / "eval")
    assert rows == [(entry["label"], f"2 images of 2 prompts (1 each), 2 scored; finished: binding_accuracy "
                                     f"{entry['binding_accuracy']:.4f}") for entry in summary]
