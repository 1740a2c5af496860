"""Old import paths of the modules that moved into layers in gors 0.2, kept for one release.

`import gors.store` (and the other paths in `MOVED`) still works and warns with a
DeprecationWarning naming the new path; CHANGELOG.md lists the moves. Real modules always win:
this finder is asked only after Python found no module under the old name. Names that moved out
of a module that stays (`from gors.score import load_scores`) are forwarded by that module's
`__getattr__`, made by `moved_names`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

# old module -> the modules that now hold its names, first match wins.
MOVED: dict[str, tuple[str, ...]] = {
    "gors.io": ("gors.core.io",),
    "gors.hub": ("gors.core.hub",),
    "gors.distributed": ("gors.core.distributed",),
    "gors.data": ("gors.core.data",),
    "gors.store": ("gors.core.store",),
    "gors.pipeline": ("gors.core.pipeline",),
    "gors.prompts": ("gors.core.prompts", "gors.core.paper"),
    "gors.reference_numbers": ("gors.core.paper",),
    "gors.toy.world": ("gors.core.toy.world",),
    "gors.toy.oracle": ("rewards.toy_rules",),
    "gors.toy.classifier": ("rewards.toy_cnn",),
    "gors.tiny": ("gors.testing",),
}
REMOVED_IN = "0.3"


def _targets(name: str) -> tuple[str, ...] | None:
    if name in MOVED:
        return MOVED[name]
    package, _, leaf = name.rpartition(".")
    if package in MOVED and len(MOVED[package]) == 1:  # a sub-module of a moved package, e.g. gors.tiny.sd
        return (f"{MOVED[package][0]}.{leaf}",)
    return None


class _Alias(types.ModuleType):
    """Stands for an old module: attribute look-ups go to the new modules."""

    def __init__(self, name: str, targets: tuple[str, ...]) -> None:
        super().__init__(name, f"Moved to {', '.join(targets)}; this path goes in gors {REMOVED_IN}.")
        self.__targets = targets
        if name in MOVED and len(targets) == 1 and hasattr(importlib.import_module(targets[0]), "__path__"):
            self.__path__: list[str] = []  # a package: its sub-modules resolve through the finder too

    def __getattr__(self, attribute: str):
        for target in self.__targets:
            module = importlib.import_module(target)
            if hasattr(module, attribute):
                return getattr(module, attribute)
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self.__targets)}) has no {attribute!r}")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        return importlib.util.spec_from_loader(fullname, self) if _targets(fullname) else None

    def create_module(self, spec):
        targets = _targets(spec.name)
        warnings.warn(f"{spec.name} moved to {targets[0]}; the old path goes in gors {REMOVED_IN}",
                      DeprecationWarning, stacklevel=3)
        return _Alias(spec.name, targets)

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Append the finder once (after Python's own finders, so existing modules are never shadowed)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


def moved_names(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) for the names that moved out of `module`, which stays:
    `names` maps each old name to its new home, ``"package.module:NAME"``; an old name warns with a
    DeprecationWarning naming it and returns the new object."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, _, new = names[name].partition(":")
        warnings.warn(f"{module}.{name} moved to {target}.{new}; the old path goes in gors {REMOVED_IN}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(target), new)

    return __getattr__
