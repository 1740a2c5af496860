"""Several rewards as one: weighted lists such as ``b_vqa:0.7,blip_clip:0.3``.

`parse_reward_list` and `weighted_mean` are the pure logic; `WeightedReward` runs each member
reward on the batch and mixes their scores; `build_reward` turns any `--reward` value (one name,
a `module:Class` path or a weighted list) into a ready `Reward`.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy
import torch
from PIL import Image

from gors.core.hub import ModelLoadError, check_cached, check_model_path, note_load, recording_loads
from gors.core.io import file_sha256
from gors.core.scoring import SOURCES_SETTING
from rewards.base import MODEL_FLAG, Reward, RewardOutput
from rewards.registry import available_rewards, get_reward_class


@dataclass(frozen=True)
class RewardSpec:
    """One member of a reward list: a reward name (or `module:Class`) and its weight (> 0)."""

    name: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"weight of {self.name!r} is {self.weight}; weights must be > 0 and finite")


def _split_weight(item: str) -> tuple[str, float | None]:
    """'b_vqa:0.7' -> ('b_vqa', 0.7); 'pkg.mod:Class' -> ('pkg.mod:Class', None)."""
    name, sep, tail = item.rpartition(":")
    if not sep:
        return item, None
    try:
        return name, float(tail)
    except ValueError:
        pass
    # The colon belongs to a `module:Class` path, unless what precedes it is a whole name already.
    if ":" in name or name in available_rewards() or not tail.isidentifier():
        raise ValueError(f"weight {tail!r} of {name!r} is not a number; expected 'name:weight', e.g. '{name}:0.5'")
    return item, None


def parse_reward_list(text: str) -> list[RewardSpec]:
    """Parse ``name[:weight][,name[:weight]...]``; a missing weight is 1.

    Names may be `module:Class` paths (``my.mod:MyReward:0.5``). Weights must be finite and > 0,
    and a name may appear once. Raises ValueError with the offending item otherwise.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"--reward={text!r}: give a reward name or a list such as 'b_vqa:0.7,blip_clip:0.3'")
    specs: list[RewardSpec] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"--reward={text!r}: empty item (stray comma?); expected 'name[:weight],...'")
        try:
            name, weight = _split_weight(item)
        except ValueError as err:
            raise ValueError(f"--reward={text!r}: {err}") from None
        if not name or name.endswith(":"):
            raise ValueError(f"--reward={text!r}: {item!r} has no reward name; expected 'name:weight'")
        if any(spec.name == name for spec in specs):
            raise ValueError(f"--reward={text!r}: {name!r} appears twice")
        try:
            specs.append(RewardSpec(name, 1.0 if weight is None else weight))
        except ValueError as err:
            raise ValueError(f"--reward={text!r}: {err}") from err
    return specs


def scoring_versions(reward: str) -> dict[str, int]:
    """The `Reward.scoring_version` of each reward `reward` names (a name or a weighted list) whose
    version is above 1: what a score folder records so that scores of two versions never mix."""
    versions = {spec.name: get_reward_class(spec.name).scoring_version for spec in parse_reward_list(reward)}
    return {name: version for name, version in versions.items() if version > 1}


# The packages whose rewards change their scores only with a release (and their `scoring_version`).
OWN_PACKAGES = ("rewards", "gors", "evaluators")


def plugin_sources(reward: str) -> dict[str, str]:
    """The sha256 of the source file of each reward `reward` names that is not gors' own (a plugin, a
    `module:Class`): an edited plugin is noticed where its old scores are read (`SOURCES_SETTING`)."""
    sources = {}
    for spec in parse_reward_list(reward):
        cls = get_reward_class(spec.name)
        if cls.__module__.split(".")[0] in OWN_PACKAGES:
            continue
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):  # defined where no file holds it (a notebook, `python -c`)
            path = None
        if path is not None and os.path.isfile(path):
            sources[spec.name] = file_sha256(path)
    return sources


def versioned(reward: str) -> dict[str, Any]:
    """`{"scoring_versions": ...}` for a score folder's settings, or nothing when every version is 1
    (so that folders made before versions were recorded keep resuming); with `SOURCES_SETTING` for a
    reward that is not gors' own."""
    versions, sources = scoring_versions(reward), plugin_sources(reward)
    return {**({"scoring_versions": versions} if versions else {}), **({SOURCES_SETTING: sources} if sources else {})}


def is_single(specs: Sequence[RewardSpec], text: str) -> bool:
    """True when `text` names one reward without a weight (it is then built as itself)."""
    return len(specs) == 1 and _split_weight(text.strip())[1] is None


def member_dtype(cls: type[Reward], dtype: torch.dtype) -> torch.dtype:
    """The dtype reward class `cls` runs in when given `dtype`: `dtype`, except that a model trained in
    bfloat16 (`overflows_in_float16`) never runs in float16, where its activations can overflow:
    bfloat16 instead."""
    return torch.bfloat16 if dtype == torch.float16 and cls.overflows_in_float16 else dtype


def reward_dtype(reward: str, device: torch.device, generation_dtype: torch.dtype, benchmark: bool) -> torch.dtype:
    """The dtype `build_reward` is given for `reward` (a name, `module:Class` or weighted list) on `device`.

    On the CPU float32. On CUDA, scoring a benchmark, the reward's `official_dtype` where it declares
    one, so that its numbers compare with the published ones; as a training reward, the generation
    precision `generation_dtype` (half precision pays, and selection needs no published number), by
    `member_dtype`'s rule. A weighted list is given the generation precision, and each member applies
    `member_dtype` to it (`member_dtypes` says which dtype each runs in).
    """
    if device.type != "cuda":
        return torch.float32
    specs = parse_reward_list(reward)
    if not is_single(specs, reward):
        return generation_dtype
    cls = get_reward_class(specs[0].name)
    if benchmark and cls.official_dtype is not None:
        return cls.official_dtype
    return member_dtype(cls, generation_dtype)


def member_dtypes(reward: str, dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype each reward of `reward` runs in when `build_reward` is given `dtype`: one entry for a
    single reward, one per member for a weighted list."""
    specs = parse_reward_list(reward)
    if is_single(specs, reward):
        return {specs[0].name: dtype}
    return {spec.name: member_dtype(get_reward_class(spec.name), dtype) for spec in specs}


def dtype_setting(reward: str, dtype: torch.dtype) -> str | dict[str, str]:
    """What a score folder records of the dtype `reward` runs in when given `dtype`: its name
    ("float16"), or each member's where a list's members run in different ones."""
    names = {name: str(d).removeprefix("torch.") for name, d in member_dtypes(reward, dtype).items()}
    return next(iter(names.values())) if len(set(names.values())) == 1 else names


def weighted_mean(scores: Sequence[float], weights: Sequence[float]) -> float:
    """sum(w_i * s_i) / sum(w_i): scores in [0, 1] give a score in [0, 1]."""
    if len(scores) != len(weights) or not scores:
        raise ValueError(f"{len(scores)} scores and {len(weights)} weights; need the same, non-zero count")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights {list(weights)} sum to {total}; they must be positive")
    return float(sum(w * s for w, s in zip(weights, scores)) / total)


class WeightedReward(Reward):
    """The weighted mean of several rewards, each image's score in [0, 1].

    Args:
        specs: the members and their weights (weights are normalised to sum to 1).
        device, batch_size: passed to every member.
        torch_dtype: each member runs in it, by `member_dtype`'s rule (a bfloat16-trained member runs
            in bfloat16 where the others run in float16).
        options: per-member keyword arguments by member name, e.g.
            ``{"grounded_sam": {"sam_model_name_or_path": "..."}}``.

    Details per image: each member's score, normalised weight and own details.
    """

    name = "weighted"
    description = "weighted mean of other rewards, e.g. --reward b_vqa:0.7,blip_clip:0.3"

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(None, device, torch_dtype, batch_size)
        options = dict(options or {})
        unknown = sorted(set(options) - {spec.name for spec in specs})
        if unknown:
            raise ValueError(
                f"reward options for {unknown}, which are not in the reward list "
                f"{[spec.name for spec in specs]}; key the options by member name"
            )
        for spec in specs:  # before any member loads its model
            check_options(get_reward_class(spec.name), options.get(spec.name, {}), f"reward {spec.name!r}",
                          "--reward_options")
        total = sum(spec.weight for spec in specs)
        self.weights = {spec.name: spec.weight / total for spec in specs}
        self.members = {spec.name: self._member(spec.name, options.get(spec.name, {}), batch_size) for spec in specs}

    def _member(self, name: str, options: Mapping[str, Any], batch_size: int) -> Reward:
        """One member, built; a model it cannot load is named by the option that sets it (a member's model is
        given by --reward_options, never by --reward_model_name_or_path, which a list refuses)."""
        cls = get_reward_class(name)
        with model_named_by(f"--reward_options {name} model_name_or_path", "model_name_or_path" in options):
            return built(cls, options, device=self.device, torch_dtype=member_dtype(cls, self.torch_dtype),
                         batch_size=batch_size)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        outputs = {name: member.score(images, prompts, metadata) for name, member in self.members.items()}
        scores, details = [], []
        for i in range(len(images)):
            image_weights = self.image_weights(outputs, i)
            names = list(image_weights)
            weights = [image_weights[name] for name in names]
            member_scores = [outputs[name].scores[i] for name in names]
            score = weighted_mean(member_scores, weights)
            scores.append(score)
            details.append(
                {
                    "score": score,
                    "members": {
                        name: {"score": s, "weight": w, "details": outputs[name].details[i]}
                        for name, s, w in zip(names, member_scores, weights)
                    },
                }
            )
        return RewardOutput(scores=scores, details=details)

    def image_weights(self, outputs: Mapping[str, RewardOutput], index: int) -> dict[str, float]:
        """The members that score image `index` and their weights; by default all, as configured."""
        return self.weights


# Keyword arguments gors itself passes (from --mixed_precision, --reward_batch_size, the process's device).
SET_BY_GORS = ("device", "torch_dtype", "batch_size")


def accepted_options(cls: type) -> list[str] | None:
    """The keyword arguments `cls(...)` takes, from its `__init__` and the bases it passes `**kwargs`
    on to; None when it takes any."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]  # not self
        names += [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return sorted(set(names))
    return None


def check_member_options(name: str, member: Any, settings: Mapping[str, Any] | None = None) -> None:
    """Refuse, before any model loads, the options `member` of a composite reward's member `name` when they
    are no mapping, name an option its class does not take, or hold a value it would refuse (its
    `check_options`, over `settings`: what the composite itself sets in it)."""
    if not isinstance(member, Mapping):
        raise ValueError(f"{name}: its options are {member!r}; give a mapping of its keyword arguments")
    member_class = get_reward_class(name)
    accepted = accepted_options(member_class)
    unknown = [] if accepted is None else sorted(set(member) - set(accepted) - set(SET_BY_GORS))
    if unknown:
        raise ValueError(f"{name} has no option {', '.join(map(repr, unknown))}")
    try:
        member_class.check_options({**(settings or {}), **member})
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


# Annotations whose values a command line or YAML file can get wrong, and the Python types each admits
# (a path object for a text option, as Python callers pass model folders; numpy's numbers for numbers).
_PLAIN_TYPES = {"int": (numbers.Integral,), "float": (numbers.Real,), "str": (str, os.PathLike),
                "bool": (bool, numpy.bool_)}


def option_type_problem(cls: type[Reward], options: Mapping[str, Any]) -> str | None:
    """The first option whose value is not of its `__init__` annotation, where that is a plain type (`int`,
    `float`, `str`, `bool`, or one of them `| None`), in words; None when all are (others are not checked
    here: `Reward.check_options` checks what it knows)."""
    for name, parameter in inspect.signature(cls).parameters.items():
        if name not in options:
            continue
        annotation = parameter.annotation if isinstance(parameter.annotation, str) else \
            getattr(parameter.annotation, "__name__", "")
        kinds = [part.strip() for part in annotation.split("|")]
        plain = [kind for kind in kinds if kind in _PLAIN_TYPES]
        if not plain or len(plain) + kinds.count("None") != len(kinds):
            continue
        value = options[name]
        allowed = tuple(t for kind in plain for t in _PLAIN_TYPES[kind])
        if (value is None and "None" in kinds) or (isinstance(value, allowed)
                                                   and not (isinstance(value, bool) and bool not in allowed)):
            continue
        return f"{name}={value!r}: expected {' or '.join(kinds)}"
    return None


def check_options(cls: type[Reward], options: Mapping[str, Any], what: str, flag: str) -> None:
    """Refuse, before anything loads, an option `cls` does not take (listing the ones it does) or a
    value it would refuse (`Reward.check_options`). `what` names the class in the message (e.g.
    "reward 'b_vqa'"), `flag` the option that gave it (e.g. "--scorer_options")."""
    accepted = accepted_options(cls)
    lacking = [name for name in SET_BY_GORS if accepted is not None and name not in accepted]
    if lacking:
        raise ValueError(f"{what}: {cls.__name__}.__init__ does not take {', '.join(lacking)}; gors passes "
                         f"{', '.join(SET_BY_GORS)} to every reward: take them (or **kwargs) and pass them on to "
                         "super().__init__")
    accepted = None if accepted is None else [name for name in accepted if name not in SET_BY_GORS]
    unknown = sorted(set(options) - set(options if accepted is None else accepted))
    if unknown:
        raise ValueError(f"{flag}: {what} has no option {', '.join(map(repr, unknown))}; its options: "
                         f"{', '.join(accepted) or 'none'}")
    problem = option_type_problem(cls, options)
    if problem is not None:
        raise ValueError(f"{flag}: {what}: {problem}")
    try:
        cls.check_options(options)
    except ValueError as err:
        raise ValueError(f"{flag}: {what}: {err}") from None
    check_model_paths(cls, options, flag)


def check_model_paths(cls: type[Reward], options: Mapping[str, Any], flag: str) -> None:
    """Refuse a local model folder that does not exist among the options of `cls` (any
    `*model_name_or_path`, also in a member's options, e.g. 3-in-1's `{"b_vqa": {...}}`), so that a
    mistyped path stops a run before its images are generated, not after."""
    for key, value in options.items():
        if key.endswith("model_name_or_path") and isinstance(value, str):
            default = cls.default_model if key == "model_name_or_path" else _default_of(cls, key)
            check_model_path(value, f"{flag} {key}", example=default if isinstance(default, str) else None)
        elif isinstance(value, Mapping) and key in available_rewards():
            check_model_paths(get_reward_class(key), value, flag)


def member_models(members: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The models (`Reward.models`) of several member rewards, given as name -> keyword arguments,
    keyed `<member>.<option>`."""
    return {f"{name}.{option}": model for name, options in members.items()
            for option, model in get_reward_class(name).models(options).items()}


def reward_models(text: str, model_name_or_path: str | None = None,
                  options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The models `build_reward(text, model_name_or_path, options)` loads, by the option that names each
    (`Reward.models`; a list's keyed `<member>.<option>`). Model-free."""
    specs = check_reward(text)
    options = dict(options or {})
    if is_single(specs, text):
        if model_name_or_path is not None:
            options["model_name_or_path"] = model_name_or_path
        return get_reward_class(specs[0].name).models(options)
    return member_models({spec.name: options.get(spec.name) or {} for spec in specs})


def download_reward_files(text: str, model_name_or_path: str | None = None,
                          options: Mapping[str, Any] | None = None) -> None:
    """Fetch the files besides models that `build_reward(text, model_name_or_path, options)` reads
    (`Reward.download_files` of it, or of each member of a list)."""
    specs = check_reward(text)
    options = dict(options or {})
    if is_single(specs, text):
        if model_name_or_path is not None:
            options["model_name_or_path"] = model_name_or_path
        get_reward_class(specs[0].name).download_files(options)
        return
    for spec in specs:
        get_reward_class(spec.name).download_files(options.get(spec.name) or {})


def check_models_cached(text: str, model_name_or_path: str | None, options: Mapping[str, Any] | None,
                        what: str, flag: str = "--reward_options", model_flag: str | None = None) -> None:
    """Offline (HF_HUB_OFFLINE), refuse a model of reward `text` that the local Hugging Face cache does not
    hold, before anything is generated rather than when the reward first loads (`gors.core.hub.check_cached`).
    The message names the reward (`what`) and the flag that sets the model: `model_flag` for a single
    reward's main model where the command has one (`--reward_model_name_or_path`), else `flag` (the
    options' flag) and the option's key."""
    single = is_single(check_reward(text), text)
    for option, model in reward_models(text, model_name_or_path, options).items():
        setting = model_flag if option == "model_name_or_path" and model_flag else f"{flag} {option}"
        if single:
            given = option in (options or {}) or (option == "model_name_or_path" and model_name_or_path is not None)
        else:
            member, _, key = option.partition(".")
            given = key in ((options or {}).get(member) or {})
        check_cached(model, f"{what}: {setting}" if given else f"{what}: the default of {setting}")


def _default_of(cls: type, option: str) -> Any:
    """The default of keyword argument `option` of `cls(...)` (its `__init__` or a base's), or None."""
    for klass in cls.__mro__:
        parameter = inspect.signature(vars(klass)["__init__"]).parameters.get(option) \
            if "__init__" in vars(klass) else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return None


def check_reward_options(text: str, options: Mapping[str, Any] | None, flag: str = "--reward_options",
                         model_name_or_path: str | None = None) -> None:
    """Refuse, before any work, options that no member of the `--reward` value `text` takes or values they
    would refuse (`--reward_options`), and a `--reward_model_name_or_path` (`model_name_or_path`) that
    `build_reward` would refuse."""
    specs = check_reward(text)
    options = dict(options or {})
    if is_single(specs, text):
        cls = get_reward_class(specs[0].name)
        check_options(cls, options, f"reward {specs[0].name!r}", flag)
        if model_name_or_path is not None:
            _check_model_flag(cls, options, model_name_or_path)
        return
    if model_name_or_path is not None:
        raise ValueError(_ambiguous_model(model_name_or_path, text))
    names = {spec.name for spec in specs}
    stray = sorted(set(options) - names)
    if stray:
        # A member's name mistyped (or a `module:Class` member named by its class alone), or a member's option
        # given at the top level.
        meant = next((name for name in sorted(names) if _spelled_alike(name.rpartition(":")[2], stray[0])), None) \
            or next(iter(difflib.get_close_matches(stray[0], sorted(names), n=1)), None)
        example = (f"'{{\"{meant}\": {{...}}}}'" if meant is not None
                   else f"'{{\"{specs[0].name}\": {{\"{stray[0]}\": ...}}}}'")
        raise ValueError(f"{flag}: {', '.join(map(repr, stray))} names no member of the reward list {text!r} "
                         f"({', '.join(map(repr, [spec.name for spec in specs]))}): its options are keyed by member, "
                         f"e.g. {example}")
    for spec in specs:
        member = options.get(spec.name, {})
        if not isinstance(member, Mapping):
            raise ValueError(f"{flag}: the options of {spec.name!r} are {member!r}; give a mapping, e.g. "
                             f"'{{\"{spec.name}\": {{\"model_name_or_path\": \"...\"}}}}'")
        check_options(get_reward_class(spec.name), member, f"reward {spec.name!r}", flag)


def _spelled_alike(class_name: str, key: str) -> bool:
    """Whether an options key names a `module:Class` member by its class alone, however cased
    (`RedFraction`, `redfraction`, `red_fraction`)."""
    return class_name.lower() == key.replace("_", "").lower()


def check_reward(text: str) -> list[RewardSpec]:
    """Parse `text` and import every member class, so a bad name fails before any work."""
    specs = parse_reward_list(text)
    for spec in specs:
        get_reward_class(spec.name)
    return specs


def build_reward(
    text: str,
    model_name_or_path: str | None = None,
    options: Mapping[str, Any] | None = None,
    device: str | torch.device | None = None,
    torch_dtype: torch.dtype | None = None,
    batch_size: int = 8,
) -> Reward:
    """The reward named by a `--reward` value, with its models loaded and their versions (Hub commits,
    local folders' fingerprints: `gors.core.hub.model_version`) in its `model_commits`.

    One name: `options` are its keyword arguments and `model_name_or_path` its model. A weighted
    list: `options` maps member names to their keyword arguments, and `model_name_or_path` must be
    None (it would be ambiguous).
    """
    with recording_loads() as loads:
        reward = _build_reward(text, model_name_or_path, options, device, torch_dtype, batch_size)
    reward.model_commits = dict(sorted(loads.items()))
    return reward


def _build_reward(
    text: str,
    model_name_or_path: str | None,
    options: Mapping[str, Any] | None,
    device: str | torch.device | None,
    torch_dtype: torch.dtype | None,
    batch_size: int,
) -> Reward:
    specs = check_reward(text)
    options = dict(options or {})
    if is_single(specs, text):
        cls = get_reward_class(specs[0].name)
        check_options(cls, options, f"reward {specs[0].name!r}", "--reward_options")
        if model_name_or_path is not None:
            _check_model_flag(cls, options, model_name_or_path)
            options["model_name_or_path"] = model_name_or_path
        return built(cls, options, device=device, torch_dtype=torch_dtype, batch_size=batch_size)
    if model_name_or_path is not None:
        raise ValueError(_ambiguous_model(model_name_or_path, text))
    return WeightedReward(specs, device, torch_dtype, batch_size, options=options)


# The packages whose rewards load every model through `gors.core.hub.from_pretrained` (or `note_load`).
GORS_PACKAGES = ("rewards", "evaluators", "gors")


def built(cls: type[Reward], options: Mapping[str, Any], **kwargs: Any) -> Reward:
    """`cls(**kwargs, **options)`. A reward class of one's own may load its models with a plain
    `from_pretrained`, which records no version: the models it declares (`Reward.models`) are recorded as
    loaded too, so that its score folders are bound to their versions as gors' own rewards' are."""
    with recording_loads() as loads:
        reward = cls(**kwargs, **options)
    if cls.__module__.partition(".")[0] not in GORS_PACKAGES:
        for name in cls.models(options).values():
            expanded = os.path.expanduser(name)
            spelled = expanded if os.path.exists(expanded) else name  # as `from_pretrained` records it
            if spelled not in loads:
                note_load(spelled)
    return reward


@contextmanager
def model_named_by(setting: str, given: bool) -> Iterator[None]:
    """A reward's main model that fails to load inside is named by `setting` (the flag or option that sets it)
    in the error, and called its default where the user gave none: the message must not read as if the
    user had typed a Hub id they never saw."""
    try:
        yield
    except ModelLoadError as err:
        message = str(err)
        if message.startswith(f"{MODEL_FLAG}="):
            message = ("" if given else "the default of ") + message.replace(MODEL_FLAG, setting, 1)
        raise ModelLoadError(message) from err


def _check_model_flag(cls: type[Reward], options: Mapping[str, Any], model_name_or_path: str) -> None:
    """Refuse a `--reward_model_name_or_path` that disagrees with the options', that the reward would refuse
    (`Reward.check_options`, e.g. a reward without a model) or a folder that does not exist."""
    flag = f"--reward_model_name_or_path={model_name_or_path!r}"
    if options.get("model_name_or_path", model_name_or_path) != model_name_or_path:
        raise ValueError(f"{flag} and --reward_options model_name_or_path={options['model_name_or_path']!r} "
                         "disagree; give one")
    try:
        cls.check_options({**options, "model_name_or_path": model_name_or_path})
    except ValueError as err:
        raise ValueError(f"{flag}: {err}") from None
    check_model_path(model_name_or_path, MODEL_FLAG, cls.default_model)


def _ambiguous_model(model_name_or_path: str, text: str) -> str:
    return (f"--reward_model_name_or_path={model_name_or_path!r} is ambiguous for the reward list {text!r}; give each "
            "member's model in --reward_options, e.g. '{\"b_vqa\": {\"model_name_or_path\": \"...\"}}'")
