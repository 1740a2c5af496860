"""The reward protocol: every reward (and every benchmark metric) is a `Reward`."""

from __future__ import annotations

import inspect
import itertools
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch
from PIL import Image

from gors.core.scoring import RewardError, checked_scores

# The option that sets a reward's model on the command line, named in load errors.
MODEL_FLAG = "--reward_model_name_or_path"


def _interval(low: float, high: float, open_low: bool) -> str:
    """`[low, high]`, `(low, high]`, `>= low` or `> low` (`high` infinite), for messages."""
    if math.isinf(high):
        return f"{'>' if open_low else '>='} {low:g}"
    return f"{'(' if open_low else '['}{low:g}, {high:g}]"


def check_number(name: str, value: Any, low: float = 0.0, high: float = 1.0, *, open_low: bool = False,
                 optional: bool = False) -> None:
    """Raise ValueError unless option `name`'s `value` is a number in [low, high] ((low, high] with
    `open_low`; `high` may be `math.inf`), or None where `optional`. For `Reward.check_options`."""
    if value is None and optional:
        return
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number and (low < value if open_low else low <= value) and value <= high):  # NaN fails too
        raise ValueError(f"{name} must be {'in ' if not math.isinf(high) else ''}{_interval(low, high, open_low)}"
                         f"{' or None' if optional else ''}, got {value!r}")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ValueError unless option `name`'s `value` is one of `choices`. For `Reward.check_options`."""
    if value not in choices:
        raise ValueError(f"{name}={value!r}; choose {' or '.join(map(repr, choices))}")


def same_size_batches(images: Sequence[Image.Image], indices: Iterable[int], batch_size: int) -> list[list[int]]:
    """`indices` into `images` as batches of at most `batch_size` images of one size each, smallest size first.

    For models whose processor pads, stacks or keeps the aspect ratio of a batch's images (Grounding DINO pads
    to the largest, Depth Anything keeps each side): one size per forward pass keeps an image's output
    independent of its batch mates. Generated training images all share one size, so they batch as before."""
    ordered = sorted(indices, key=lambda i: images[i].size)
    return [group[start : start + batch_size]
            for _, same_size in itertools.groupby(ordered, key=lambda i: images[i].size)
            for group in [list(same_size)]
            for start in range(0, len(group), batch_size)]


class RewardBatchError(ValueError):
    """A ValueError a reward's `_score` raised, with the reward and its batch named."""


@dataclass
class RewardOutput:
    """Scores of a batch of (image, prompt) pairs.

    Attributes:
        scores: one float per image, in [0, 1]; higher means better aligned with the prompt.
        details: one JSON-serialisable dict per image that explains its score
            (sub-scores, questions and answer probabilities, boxes, reasons).
    """

    scores: list[float]
    details: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.details:
            self.details = [{} for _ in self.scores]
        if len(self.details) != len(self.scores):
            raise ValueError(f"RewardOutput of {len(self.scores)} scores but {len(self.details)} details; give one "
                             "details dict per score")


class Reward:
    """Base class of reward models.

    Subclasses load their models in `__init__` (never at import time) and implement `_score`.
    Class attributes describe the reward for `gors rewards` and the registry:

    - `name`: registry key, e.g. ``"b_vqa"``.
    - `default_model`: Hub id loaded when no `model_name_or_path` is given.
    - `categories`: the T2I-CompBench categories the reward suits.
    - `score_range`: the closed interval every score lies in: [0, 1] for every reward (selection's tau,
      weighted lists and benchmarks assume it; `rewards.registry.check_reward_class`).
    - `description`: one line for `gors rewards`: what is measured, and with which models.
    - `official_dtype`: the dtype the benchmark this reward implements runs its model in on a GPU
      (e.g. GenEval 2 loads Qwen3-VL in its checkpoint's bfloat16); a benchmark scores in it on CUDA
      instead of the generation precision (`evaluators.base.scorer_dtype`). None: the generation
      precision. On CPU every reward runs in float32.
    - `overflows_in_float16`: its default model was trained in bfloat16 and its activations can
      leave float16's range (Qwen3-VL): under `--mixed_precision fp16` it runs in bfloat16.
    - `scoring_version`: raised when a release changes the reward's scores for the same options;
      a score folder records it (when above 1) and refuses scores of another version
      (`rewards.combined.scoring_versions`).
    - `model_objects`: model option -> the keyword argument that passes a ready model instead (e.g.
      `{"model_name_or_path": "detector"}`), whose option's model is then not loaded (`models`).
    """

    name: ClassVar[str] = ""
    default_model: ClassVar[str | None] = None
    categories: ClassVar[tuple[str, ...]] = ()
    score_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    description: ClassVar[str] = ""
    official_dtype: ClassVar[torch.dtype | None] = None
    overflows_in_float16: ClassVar[bool] = False
    scoring_version: ClassVar[int] = 1
    model_objects: ClassVar[dict[str, str]] = {}

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[dict[str, Any]] | None) -> None:
        """Raise ValueError when this reward cannot judge `prompts` with their per-prompt `metadata`
        (None: the prompts carry none). Model-free, so that a run fails before it generates or loads
        anything; rewards that judge by metadata (e.g. GenEval's clauses) override it."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Raise ValueError, naming the option, when a value in `options` (keyword arguments of
        `__init__`, only those given) is one `__init__` would refuse. Model-free, so that a bad value
        fails before anything is generated or loaded; `__init__` calls the same check on its
        arguments, so the rule is written once. Nothing is checked by default."""

    @classmethod
    def models(cls, options: Mapping[str, Any]) -> dict[str, str]:
        """The models an instance built with `options` (keyword arguments of `__init__`, only those given)
        loads by Hub id or folder, keyed by the option that names each: `model_name_or_path` (default
        `default_model`) and every other `<x>_model_name_or_path` argument (default `default_<x>_model`, else
        the argument's own). Model-free, so that a run refuses a model it could not load before it
        generates anything (`rewards.combined.check_models_cached`). A reward that loads a model only under
        some options, or one named otherwise (or not from the Hub: return none), overrides it."""
        models = {}
        for option, parameter in inspect.signature(cls).parameters.items():
            instead = cls.model_objects.get(option)
            if option.endswith("model_name_or_path") and (instead is None or options.get(instead) is None):
                default = getattr(cls, f"default_{option.removesuffix('model_name_or_path')}model", None)
                value = options.get(option) or default or parameter.default
                if isinstance(value, str):
                    models[option] = value
        return models

    @classmethod
    def download_files(cls, options: Mapping[str, Any]) -> None:
        """Fetch into gors' cache the files besides its models that an instance built with `options`
        reads (pinned data such as T2I-CompBench's lists), as its `__init__` would: `gors download`
        calls it on a machine with internet. None by default."""

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
    ) -> None:
        self.model_name_or_path = model_name_or_path or self.default_model
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.torch_dtype = torch_dtype or torch.float32
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        # name -> version (`gors.core.hub.model_version`: Hub commit, local folder's fingerprint) of each model
        # loaded; `rewards.combined.build_reward` fills it, and score folders record it (`check_model_commits`)
        self.model_commits: dict[str, str | None] = {}

    @torch.no_grad()
    def score(
        self,
        images: Sequence[Image.Image],
        prompts: Sequence[str],
        metadata: Sequence[dict[str, Any]] | None = None,
    ) -> RewardOutput:
        """Score each image against its prompt; scores in [0, 1], one details dict per image.

        The output is checked: exactly one finite score in `score_range` and one details dict per
        image, so that a faulty reward fails here, with a `RewardError` naming the image, instead of
        leaving samples unscored.
        """
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
        if metadata is not None and len(metadata) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(metadata)} metadata entries")
        if not images:  # many models cannot run an empty batch; no image has no score
            return RewardOutput([], [])
        rgb = [image if image.mode == "RGB" else image.convert("RGB") for image in images]
        try:
            output = self._score(rgb, list(prompts), list(metadata) if metadata is not None else None)
        except ValueError as err:
            # The command prints it as one line: it names the reward that raised it. Its own ValueError types
            # pass as they are, as does a member reward's error in a composite one (named once, by the member).
            if type(err) is not ValueError:
                raise
            first = prompts[0] if len(prompts[0]) <= 80 else prompts[0][:77] + "..."
            raise RewardBatchError(f"{type(self).__name__} on a batch of {len(prompts)} from {first!r}: {err}") from err
        return self._checked(output, list(prompts))

    def _checked(self, output: RewardOutput, prompts: list[str]) -> RewardOutput:
        """`output` of `_score` on `prompts`, its scores as plain floats; a `RewardError` naming the
        image, its prompt and the value when it breaks the protocol (a bug of the reward, not of gors)."""
        name = type(self).__name__
        if not isinstance(output, RewardOutput):
            raise RewardError(f"{name}._score returned a {type(output).__name__}; return a RewardOutput(scores=..., "
                              "details=...)")
        return RewardOutput(scores=checked_scores(name, output, prompts, tuple(self.score_range)),
                            details=output.details)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        raise NotImplementedError
