"""The layering: every import (module level or inside a function) points down, never up.

    0 core        gors.core.* (and the `gors` package itself)
    1 rewards     rewards.*
    2 evaluators  evaluators.*
    3 trainer     every other gors.* module: stages, validation, report, CLI, toy demo, testing
    4 entry       recipes/*.py and the speed scripts in benchmarks/
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER_NAMES = ("core", "rewards", "evaluators", "trainer", "entry")


def layer(module: str) -> int | None:
    """The layer of a project module; None for modules outside the project (torch, stdlib, ...)."""
    top = module.split(".")[0]
    if module in ("gors", "gors._moved") or module.startswith("gors.core"):
        return 0
    if top == "rewards":
        return 1
    if top == "evaluators":
        return 2
    if top == "gors":
        return 3
    if top in ("recipes", "benchmarks"):
        return 4
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement in the file, wherever it stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` may name a sub-module: judge the deepest module it can be.
            found += [(node.lineno, f"{base}.{alias.name}" if layer(f"{base}.{alias.name}") is not None else base)
                      for alias in node.names]
    return found


def project_files() -> list[Path]:
    folders = ("gors", "rewards", "evaluators", "recipes", "benchmarks")
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_every_layer_has_modules() -> None:
    assert {layer(module_name(p)) for p in project_files()} == set(range(len(LAYER_NAMES)))


def upward_imports() -> list[str]:
    problems = []
    for path in project_files():
        own = layer(module_name(path))
        for line, target in imports(path):
            theirs = layer(target)
            if theirs is not None and theirs > own:
                problems.append(f"{path.relative_to(ROOT)}:{line} ({LAYER_NAMES[own]}) imports {target} "
                                f"({LAYER_NAMES[theirs]})")
    return problems


def test_imports_only_point_down() -> None:
    assert upward_imports() == []


def test_the_walker_sees_imports_inside_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is real: an import hidden in a function body of a core module is caught."""
    core = tmp_path / "gors" / "core"
    core.mkdir(parents=True)
    (core / "sneaky.py").write_text("def f():\n    from evaluators import base\n    return base\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert upward_imports() == ["gors/core/sneaky.py:2 (core) imports evaluators.base (evaluators)"]
