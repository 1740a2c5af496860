"""Name -> reward class, in a plain dict, with a dotted import path as the fallback.

Three ways in: the built-in table below, the `@register_reward` decorator, and the
`gors.rewards` entry-point group of installed packages; a `module:Class` path is imported from the
Python path, else from the working directory. An entry point, e.g. in a plugin's pyproject.toml:

    [project.entry-points."gors.rewards"]
    my_reward = "my_package.rewards:MyReward"
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable, Collection
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from gors.core.logs import first_time
from rewards.base import Reward

# Built-in rewards are imported lazily: name -> "module:Class".
_BUILTIN: dict[str, str] = {
    "b_vqa": "rewards.b_vqa:BVQAReward",
    "blip_clip": "rewards.blip_clip:BlipClipReward",
    "clip_score": "rewards.clip_score:CLIPScoreReward",
    "geneval": "rewards.geneval:GenEvalReward",
    "geneval_graded": "rewards.geneval_graded:GenEvalGradedReward",
    "grounded_detection": "rewards.grounded_detection:GroundedDetectionReward",
    "grounded_sam": "rewards.grounded_sam:GroundedSAMReward",
    "mllm_cot": "rewards.mllm_cot:MLLMCoTReward",
    "numeracy": "rewards.numeracy:NumeracyReward",
    "soft_tifa": "rewards.soft_tifa:SoftTIFAReward",
    "spatial_3d": "rewards.spatial_3d:Spatial3DReward",
    "spatial_rule": "rewards.spatial:SpatialRuleReward",
    "three_in_one": "rewards.three_in_one:ThreeInOneReward",
    "tifa": "rewards.soft_tifa:TIFAReward",
    "tit_score": "rewards.tit_score:TITScoreReward",
    "unbiased_complex": "rewards.unbiased_complex:UnbiasedComplexReward",
    "vqascore": "rewards.soft_tifa:VQAScoreReward",
    "toy_oracle": "rewards.toy_oracle:ToyOracleReward",
    "toy_classifier": "rewards.toy_classifier:ToyClassifierReward",
}
_REGISTERED: dict[str, type[Reward]] = {}
ENTRY_POINT_GROUP = "gors.rewards"
logger = logging.getLogger(__name__)


def declared_entry_points(group: str = ENTRY_POINT_GROUP) -> dict[str, list[str]]:
    """What installed packages declare in an entry-point `group` (rewards: `gors.rewards`): name -> each
    distinct "module:Class" declared under it (two or more: packages that clash)."""
    return {name: list(paths) for name, paths in _declared(group, _path_state()).items()}


def _path_state() -> tuple[tuple[str, int | None], ...]:
    """Each `sys.path` entry with its modification time: installing or removing a package changes its folder's.

    Reading every installed package's entry points takes about 10 ms (more with more packages), and each reward
    or benchmark name looked up needs them; `importlib.metadata` keys its own directory cache the same way."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


@functools.lru_cache(maxsize=16)
def _declared(group: str, path_state: tuple[tuple[str, int | None], ...]) -> dict[str, tuple[str, ...]]:
    """`declared_entry_points` read from the installed packages, once per `sys.path` state (`_path_state`)."""
    declared: dict[str, list[str]] = {}
    for point in entry_points(group=group):
        paths = declared.setdefault(point.name, [])
        if point.value not in paths:
            paths.append(point.value)
    return {name: tuple(paths) for name, paths in declared.items()}


def entry_point_path(kind: str, name: str, group: str, builtin: Collection[str]) -> str | None:
    """The "module:Class" that installed packages declare as `kind` (reward, benchmark) `name` in entry-point
    `group`; None where none does, or where `name` is one of gors' own (`builtin`), which it keeps meaning
    (said once per name in a warning). Two packages declaring `name` as different classes are refused: there
    is no right one to pick."""
    paths = declared_entry_points(group).get(name, [])
    if not paths:
        return None
    if name in builtin:
        if first_time("shadowed entry point", group, name):
            logger.warning("the %s entry point %s = %s is ignored: %r is gors' own %s, which it keeps naming; give "
                           "the entry point another name", group, name, " and ".join(paths), name, kind)
        return None
    if len(paths) > 1:
        raise ValueError(f"{kind} {name!r} is declared by installed packages as {len(paths)} classes "
                         f"({', '.join(paths)}) in the {group} entry points: uninstall all but one, or rename "
                         "the others' entry points")
    return paths[0]


def check_entry_point_name(kind: str, name: str, cls: type, path: str) -> None:
    """Refuse a class reached as entry point `name` that registers itself (`@register_{kind}`) under another
    name: its results would be filed under two names."""
    own = vars(cls).get("name")
    if own and own != name:
        raise ValueError(f"{kind} entry point {name!r} ({path}) names a class registered as {own!r}: name the "
                         f"entry point {own!r}, or register the class as {name!r}")


def check_name(kind: str, name: str, cls: type, registered: type | None, builtin: bool) -> None:
    """Refuse registering `cls` as the `kind` ("reward", "benchmark") `name` where the name is a built-in one,
    is registered to another class (`registered`), or holds ":" or "," (which the command line's
    "module:Class", "name:subset" and lists split on). The same class registered again (a module imported
    twice) is allowed."""
    if not name or ":" in name or "," in name:
        raise ValueError(f"{kind} name {name!r}: give a non-empty name without ':' or ','")
    if builtin:
        raise ValueError(f"{kind} name {name!r} is gors' own; register {cls.__qualname__} under another name")
    if registered is not None and (registered.__module__, registered.__qualname__) != (cls.__module__,
                                                                                       cls.__qualname__):
        raise ValueError(f"{kind} name {name!r} is already registered to {registered.__module__}."
                         f"{registered.__qualname__}; register {cls.__module__}.{cls.__qualname__} under another "
                         "name")


def register_reward(name: str) -> Callable[[type[Reward]], type[Reward]]:
    """Class decorator that makes a `Reward` subclass available as `name` everywhere."""

    def decorator(cls: type[Reward]) -> type[Reward]:
        if not (isinstance(cls, type) and issubclass(cls, Reward)):
            raise ValueError(f"@register_reward({name!r}) expects a Reward subclass, got {cls!r}")
        check_name("reward", name, cls, _REGISTERED.get(name), name in _BUILTIN)
        check_reward_class(cls)
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return decorator


def available_rewards() -> list[str]:
    """Names of all registered and built-in rewards, sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTERED) | set(declared_entry_points()))


def is_missing(err: ModuleNotFoundError, module_name: str) -> bool:
    """Whether `err` says `module_name` itself (or a package above it) is not found, rather than a module it imports."""
    return err.name is not None and (module_name == err.name or module_name.startswith(err.name + "."))


def _import_module(module_name: str) -> ModuleType:
    """`module_name` imported from `sys.path`, else from the working directory, as `python -m` finds it.

    The `gors` console script and `accelerate launch`ed recipes put the script's folder, not the
    working directory, on `sys.path`. The working directory is on it only while this import runs,
    so that it shadows no other module later: what the module imports at its top level is found
    there too, a module it imports later (inside a function) is not.
    """
    cwd = os.getcwd()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if not is_missing(err, module_name) or cwd in sys.path or "" in sys.path:
            raise
    sys.path.append(cwd)  # last: only what no other path entry has is taken from here
    try:
        return importlib.import_module(module_name)
    finally:
        sys.path.remove(cwd)


def import_class(path: str) -> Any:
    """The attribute `Class` of the module `module` in a `module:Class` path (`_import_module`)."""
    module_name, _, attr = path.partition(":")
    return getattr(_import_module(module_name), attr)


def _described(name: str, path: str) -> str:
    """Reward `name` for a message: a `module:Class` path once, an entry point's name with its path."""
    return repr(name) if name == path else f"{name!r} (entry point {path})"


def import_error(name: str, path: str, err: Exception, kind: str = "reward") -> ValueError:
    """Why `kind` (reward, benchmark) `name` (a `module:Class` path or an entry point's name, at `path`) did
    not import, and for a module not found, the fix: its folder on PYTHONPATH."""
    what = _described(name, path)
    module_name = path.partition(":")[0]
    if isinstance(err, ModuleNotFoundError) and is_missing(err, module_name):
        return ValueError(f"Could not import {kind} {what}: {err}, neither on the Python path nor in the working "
                          f"directory ({os.getcwd()}). Add the folder that holds it to PYTHONPATH, e.g. "
                          f"`PYTHONPATH=/path/to/folder gors ...`, or install it.")
    return ValueError(f"Could not import {kind} {what}: {err}")


def check_reward_class(cls: type[Reward]) -> None:
    """Refuse a reward class that would fail only once scoring starts, or whose scores the stages would
    misread: one without its own `_score`, or one that declares scores outside [0, 1]."""
    if cls._score is Reward._score and cls.score is Reward.score:
        raise ValueError(f"reward class {cls.__qualname__} does not implement _score(images, prompts, metadata) -> "
                        "RewardOutput; see docs/extending.md, Adding a reward")
    if tuple(cls.score_range) != Reward.score_range:
        raise ValueError(f"reward class {cls.__qualname__} declares score_range {cls.score_range}: every reward scores "
                        "in [0, 1] (selection's tau, weighted lists and benchmarks assume it); rescale its scores in "
                        "_score and leave score_range as it is")


def get_reward_class(name: str) -> type[Reward]:
    """The class behind a reward name or a `module:Class` path (its module found as `_import_module` finds it)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    plugin = entry_point_path("reward", name, ENTRY_POINT_GROUP, _BUILTIN)  # None for gors' own
    if name in _BUILTIN:
        return import_class(_BUILTIN[name])
    if plugin is not None or ":" in name:
        path = plugin or name
        try:
            cls = import_class(path)
        except (ImportError, AttributeError) as err:
            raise import_error(name, path, err) from err
        if isinstance(cls, type) and issubclass(cls, Reward):
            check_reward_class(cls)
            if plugin is not None:
                check_entry_point_name("reward", name, cls, path)
            return cls
        raise ValueError(f"{_described(name, path)} is not a Reward subclass")
    close = difflib.get_close_matches(name, available_rewards(), n=1)
    raise ValueError(
        f"Unknown reward {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
        + f". Known rewards: {', '.join(available_rewards())}; "
        "or pass 'module:Class' for a Reward subclass of your own (a name it registers is known from Python once "
        "its module is imported, and on the command line as an entry point of the gors.rewards group)."
    )


def load(name: str, **kwargs: Any) -> Reward:
    """Build the reward `name` (registry key or `module:Class`) with its model loaded."""
    return get_reward_class(name)(**kwargs)
