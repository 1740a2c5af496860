"""Reward models behind one protocol, and the registry that names them.

`rewards.load("b_vqa")` builds a reward by name; `@register_reward` adds one; a dotted path
(`my_module:MyReward`) loads a reward class that is not registered.
"""

from rewards.base import Reward, RewardOutput
from rewards.registry import available_rewards, get_reward_class, load, register_reward

__all__ = [
    "Reward",
    "RewardOutput",
    "available_rewards",
    "get_reward_class",
    "load",
    "register_reward",
]
