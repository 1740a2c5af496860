"""`gors` launched as users launch it on several GPUs, here as two CPU processes over gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def launch(target: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`accelerate launch` with `accelerate_configs/cpu.yaml` of `target` (a script and its arguments, or
    `-m module ...`); it must succeed."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "accelerate_configs" / "cpu.yaml"), "--main_process_port", "0", *target]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def launch_gors(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`gors <args>` under `accelerate launch` with `accelerate_configs/cpu.yaml`; it must succeed."""
    return launch(["-m", "gors.cli", *args], cwd)


def launch_gors_jobs(jobs: list[list[str] | str], cwd: Path) -> subprocess.CompletedProcess:
    """Several `gors` commands (each a list of its arguments) one after another in the same two launched
    processes, as a user's script calls `gors.cli.main`, with "reset_process_state" between two where the script
    calls it (Accelerate keeps one precision per process); all must succeed. The first command runs in fresh
    processes, as `launch_gors`'s does; the later ones share the processes' imports of torch, diffusers and
    transformers (about 10 s of CPU each on 2 slow cores)."""
    return launch([str(REPO / "tests" / "launched_jobs.py"), json.dumps(jobs)], cwd)
