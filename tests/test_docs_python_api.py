"""The "From Python" example of docs/stages.md runs as written, as a user's script, and prints what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_python_example_runs_the_loop_evaluates_and_scores(tmp_path):
    section = (REPO / "docs" / "stages.md").read_text(encoding="utf-8").split("## From Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    env = os.environ | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    metric, value = lines[-2].split()
    assert metric == "binding_accuracy" and 0.0 <= float(value) <= 1.0
    assert lines[-1] == "[1.0, 0.0]"
    run = tmp_path / "runs" / "toy"
    assert (run / "pytorch_lora_weights.safetensors").is_file()
    assert (run / "eval" / "summary.json").is_file()
