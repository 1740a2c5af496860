"""Faults under `accelerate launch` with two CPU processes: a launcher killed alone leaves nothing
writing, and an expected error is one line for the whole launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gors.cli import main
from gors.core.store import SampleStore

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
HOLDER = ("import sys, time; from pathlib import Path; from gors.core.lock import _acquire; "
          "_acquire(Path(sys.argv[1]), 'generate', 'gors generate'); print('held', flush=True); time.sleep(300)")


def launch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(REPO / "accelerate_configs" / "cpu.yaml"), "--main_process_port", "0", "-m", "gors.cli", *args]


def generate_flags(run: Path, tiny_sd: Path, prompts_file: Path, images_per_prompt: int) -> list[str]:
    return ["--output_dir", str(run), "--pretrained_model_name_or_path", str(tiny_sd), "--train_prompts",
            str(prompts_file), "--images_per_prompt", str(images_per_prompt), "--num_inference_steps", "2",
            "--resolution", "32", "--generation_batch_size", "2", "--seed", "0"]


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (torchrun's workers: each in its own session)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie that no one has reaped yet."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_only_the_launcher_stops_its_workers(tmp_path, tiny_sd, prompts_file, capsys):
    run = tmp_path / "run"
    flags = generate_flags(run, tiny_sd, prompts_file, images_per_prompt=15)
    with open(tmp_path / "launch.log", "w") as log:
        launcher = subprocess.Popen(launch_command("generate", *flags), cwd=tmp_path, env=ENV, stdout=log, stderr=log)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not list(run.glob("samples/part-*/*.png")):  # the workers are writing
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "launch.log").read_text()
            time.sleep(0.05)
        workers = children(launcher.pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 30  # the kernel's SIGKILL is at once; a loaded machine may reap late
        while any(map(alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(alive, workers)), "the workers outlived their launcher"
        before = snapshot(run)
        time.sleep(1.5)
        assert snapshot(run) == before  # nothing writes any more
        recorded = len(SampleStore(run / "samples").records())
        assert recorded < 45  # killed mid-run
    finally:  # never leak a process, whatever failed above
        launcher.kill()
        for pid in filter(alive, workers):
            os.killpg(pid, signal.SIGKILL)  # each worker leads its own session and group

    # The rerun takes over the dead worker's lock and completes the store, each image once.
    main(["generate", *flags])
    assert "taking over the lock of `gors generate`" in capsys.readouterr().err
    keys = [(r["prompt_index"], r["image_index"]) for r in SampleStore(run / "samples").records()]
    assert sorted(keys) == [(p, i) for p in range(3) for i in range(15)]


@pytest.mark.slow
def test_folder_in_use_stops_every_process_with_one_line(tmp_path, tiny_sd, prompts_file):
    """Both processes of the launch are refused; the main process alone says why, in one line, and
    the launch fails (torchrun then adds its own summary of the failed workers)."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        result = subprocess.run(launch_command("generate", *generate_flags(run, tiny_sd, prompts_file, 2)),
                                cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-6000:]
    assert errors[0].startswith(f"error: {run} is being written by `gors generate` (pid {holder.pid} on host ")
    # The launch fails. torchrun's summary names the first worker to end: usually one that exited with 2,
    # sometimes one that gloo aborted (SIGABRT) while its peer's process group was being torn down.
    assert result.returncode != 0 and ("exitcode  : 2" in result.stderr or "SIGABRT" in result.stderr)
    assert f"{REPO / 'gors'}/" not in result.stderr  # no traceback through gors (torchrun's own is not ours)
    assert not (run / "samples").exists()
