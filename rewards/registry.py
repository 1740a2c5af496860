"""Name -> reward class, in a plain dict, with a dotted import path as the fallback.

Three ways in: the built-in table below, the `@register_reward` decorator, and the
`gors.rewards` entry-point group of installed packages, e.g. in a plugin's pyproject.toml:

    [project.entry-points."gors.rewards"]
    my_reward = "my_package.rewards:MyReward"
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

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


def _entry_points() -> dict[str, str]:
    """Rewards that installed packages declare in the `gors.rewards` entry-point group: name -> path."""
    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


def register_reward(name: str) -> Callable[[type[Reward]], type[Reward]]:
    """Class decorator that makes a `Reward` subclass available as `name` everywhere."""

    def decorator(cls: type[Reward]) -> type[Reward]:
        if not (isinstance(cls, type) and issubclass(cls, Reward)):
            raise TypeError(f"@register_reward({name!r}) expects a Reward subclass, got {cls!r}")
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return decorator


def available_rewards() -> list[str]:
    """Names of all registered and built-in rewards, sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTERED) | set(_entry_points()))


def _import_class(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def get_reward_class(name: str) -> type[Reward]:
    """The class behind a reward name or a `module:Class` path."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        return _import_class(_BUILTIN[name])
    plugins = _entry_points()
    if name in plugins or ":" in name:
        path = plugins.get(name, name)
        try:
            cls = _import_class(path)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"Could not import reward {name!r} ({path}): {err}") from err
        if isinstance(cls, type) and issubclass(cls, Reward):
            return cls
        raise ValueError(f"{name!r} ({path}) is not a Reward subclass")
    raise ValueError(
        f"Unknown reward {name!r}. Known rewards: {', '.join(available_rewards())}; "
        "or pass 'module:Class' for a Reward subclass of your own."
    )


def load(name: str, **kwargs: Any) -> Reward:
    """Build the reward `name` (registry key or `module:Class`) with its model loaded."""
    return get_reward_class(name)(**kwargs)
