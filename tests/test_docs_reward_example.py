"""The "Adding a reward" example of docs/extending.md is complete: it runs as written and scores as it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rewards.registry

EXTENDING = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def test_readme_reward_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    section = EXTENDING.read_text(encoding="utf-8").split("## Adding a reward", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert len(code.splitlines()) < 40
    monkeypatch.setattr(rewards.registry, "_REGISTERED", {})  # the example's registration stays in this test
    exec(compile(code, "docs/extending.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip() == "[1.0, 0.0]"
    assert "brightness" in rewards.available_rewards()
