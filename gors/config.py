"""One config dataclass per command, with the paper's defaults and help text.

Flags follow diffusers' training scripts wherever one exists. Every config parses from the
command line or a YAML file (see `gors.cli.parse_config`); `__post_init__` rejects bad values with
a message that quotes them. Defaults come from the official T2I-CompBench GORS training script
and paper (see the README's "Defaults and their sources").

The stage configs are built from small field groups (`RunFolderFields`, `ModelFields`, ...) that
share no base class: each config lists the groups it needs once, and checks each group's fields
with the group's own `_check_*` method. `RunConfig` lists all of them, so `gors run` and the
recipes take every stage's flags, and each stage function accepts it as it reads attributes only.
"""

from __future__ import annotations

import difflib
import functools
import math
import numbers
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import yaml

from gors.core.compiling import torch_compile_error

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")


# Seeds lie in [0, SEED_LIMIT): training seeds numpy with seed + process index (`accelerate.utils.set_seed`),
# which takes [0, 2^32); 2^31 leaves room for any number of processes.
SEED_LIMIT = 2**31


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


# What a scalar field takes, in words for the error (also of a YAML file's values: `gors.cli`).
KIND_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def of_kind(value: Any, kind: Any) -> bool:
    """Whether `value` is of the scalar field type `kind` (any other type: not checked here)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):  # a whole number is a number too (NumPy's too); a boolean is neither
        return isinstance(value, numbers.Integral if kind is int else numbers.Real) and not isinstance(value, bool)
    return kind is not str or isinstance(value, str)


def check_field_types(config: Any) -> None:
    """Each field of the config dataclass holds its annotated type (None only where the field takes it), as the
    flags and a YAML file are checked: made from Python with another type, a value would otherwise fail later
    without naming its field. A path is taken as its text and a tuple as a list."""
    hints = _field_hints(type(config))
    for spec in fields(config):
        value, hint = getattr(config, spec.name), hints[spec.name]
        args = typing.get_args(hint)
        optional = type(None) in args
        kind = next(arg for arg in args if arg is not type(None)) if optional else hint
        if value is None:
            # A mapping's None is no options (`parse_mapping`).
            _check(optional or hint is Any or typing.get_origin(kind) is dict,
                   f"--{spec.name}=None: give {_words(hint)}, or leave it out for its default")
            continue
        if typing.get_origin(kind) is list:
            if isinstance(value, tuple):
                value = list(value)
            _check(isinstance(value, list), f"--{spec.name}={value!r} is not a list: give a list, e.g. [{value!r}]")
            item = typing.get_args(kind)[0]
            value = [os.fspath(v) if item is str and isinstance(v, os.PathLike) else v for v in value]
            bad = next((v for v in value if not of_kind(v, item)), None)
            _check(bad is None, f"--{spec.name}: item {bad!r} is not {KIND_WORDS.get(item, item)}")
        elif kind in KIND_WORDS:
            if kind is str and isinstance(value, os.PathLike):
                value = os.fspath(value)
            elif kind in (int, float) and of_kind(value, kind):
                value = kind(value)  # a NumPy number as Python's
            _check(of_kind(value, kind), f"--{spec.name}={value!r} is not {KIND_WORDS[kind]}: give "
                                          f"{KIND_WORDS[kind]}" + (" (a string)" if kind is str else ""))
        setattr(config, spec.name, value)


def _words(hint: Any) -> str:
    return KIND_WORDS.get(hint, "a list" if typing.get_origin(hint) is list else "a value")


def check_values(config: Any) -> None:
    """Every field of its annotated type (`check_field_types`) and, with `choices`, one of them (None: unset).
    argparse checks them only for flags typed on the command line, not for values from a YAML file, a recipe
    or Python."""
    check_field_types(config)
    for spec in fields(config):
        choices = spec.metadata.get("choices")
        value = getattr(config, spec.name)
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"--{spec.name}={value!r}; choose one of {', '.join(map(str, choices))}")


def _check_mixed_precision(value: str | None) -> None:
    _check(value is None or value in MIXED_PRECISION_CHOICES,
           f"--mixed_precision={value!r}; choose one of {MIXED_PRECISION_CHOICES}")


def _check_torch_compile(value: str) -> None:
    error = torch_compile_error(value)
    _check(error is None, error or "")


def check_anchor_below(anchor_below: int, timestep_range: list[int] | None, num_train_timesteps: int | None) -> None:
    """Refuse an `--anchor_below` (a DDPM timestep) at or above every timestep training draws, those of
    `--timestep_range` [BEGIN, END), else [0, `num_train_timesteps`) (None: the schedule is not known
    yet, and only `timestep_range` bounds it): every step would then train the adapters to reproduce
    the base model, and the LoRA would learn nothing (a loss of 0). Refuse one at or below BEGIN too:
    no drawn timestep would be anchored, and the flag would do nothing."""
    begin, end = timestep_range if timestep_range is not None else (0, num_train_timesteps)
    if end is None:  # neither bound known yet
        return
    drawn = (f"--timestep_range {begin} {end} trains timesteps {begin} to {end - 1}" if timestep_range is not None
             else f"the model's noise schedule has {end} timesteps (0 to {end - 1})")
    fix = f"Give a timestep in ({begin}, {end}), e.g. --anchor_below {(begin + end) // 2}, or 0 for off"
    if timestep_range is not None and anchor_below <= begin:
        raise ValueError(f"--anchor_below={anchor_below}: {drawn}, none below it, so no step would be anchored to the "
                         f"base model and the flag would do nothing. {fix}")
    if anchor_below < end:
        return
    raise ValueError(f"--anchor_below={anchor_below}: {drawn}, all below it, so every step would train the LoRA to "
                     f"reproduce the base model and it would learn nothing. {fix}")


def accumulation_steps(global_batch_size: int, train_batch_size: int, num_processes: int,
                       given: int | None = None) -> int:
    """The micro-batches per update that make `global_batch_size` samples per update from `train_batch_size` on
    each of `num_processes`; `given`, the --gradient_accumulation_steps the user gave (None: not given), must
    already be that number."""
    per_pass = train_batch_size * num_processes
    if global_batch_size % per_pass:
        fix = (f"give a --train_batch_size that divides {global_batch_size // num_processes}"
               if global_batch_size % num_processes == 0 else
               f"launch a number of processes that divides {global_batch_size}")
        raise ValueError(f"--global_batch_size={global_batch_size} is not a multiple of --train_batch_size="
                         f"{train_batch_size} x {num_processes} process(es) = {per_pass}: {fix}, or give a "
                         f"--global_batch_size that {per_pass} divides (0: {per_pass} x "
                         "--gradient_accumulation_steps)")
    steps = global_batch_size // per_pass
    if given not in (None, steps):
        raise ValueError(f"--gradient_accumulation_steps={given} with --global_batch_size={global_batch_size}: that "
                         f"batch takes {steps} micro-batch(es) of {train_batch_size} on {num_processes} process(es); "
                         "give one of the two flags (--global_batch_size 0 is off)")
    return steps


def _check_report_to(value: str) -> None:
    """Refuse a tracker that accelerate does not know or that is not installed: accelerate would only warn
    and log nowhere."""
    if value == "none":
        return
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    _check(value in LoggerType.list(), f"--report_to={value!r}; choose one of none, {', '.join(LoggerType.list())}")
    installed = [str(tracker.value) for tracker in get_available_trackers()]
    if value == "all":
        _check(bool(installed), "--report_to=all: no tracker is installed (`pip install tensorboard`), so the run "
                                "would log nowhere; install one, or pass --report_to none")
        return
    _check(value in installed, f"--report_to={value}: {value} is not installed, so the run would log nowhere. "
                               f"`pip install {value}`, or pass --report_to "
                               f"{installed[0] if installed else 'none'}")


# The largest --mode_scale for which the mode density is defined: 2 / (pi - 2) (SD3 paper, section 3.1).
MODE_SCALE_MAX = 2 / (math.pi - 2)


class _NumberLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers as the command line does (below), and refusing a key given
    twice in one mapping (PyYAML keeps the last, so a setting written twice in a config file would silently
    lose its first value)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be given again, to override
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (first on line {first[key].start_mark.line + 1}); keep one",
                    key_node.start_mark)
            if isinstance(key, str):
                first[key] = key_node
        return super().construct_mapping(node, deep=deep)


# Numbers as the command line reads them (Python's int and float, `1_000` and `1e-4` too): YAML 1.1, PyYAML's,
# reads `1e-4` as text, `seed: 0042` as octal 34, `1:30` as 90 (base 60) and `0x1F` as 31, which the same text as
# a flag is not. Every other implicit type (booleans, null, ...) stays as PyYAML reads it.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_NumberLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_DIGITS = r"[0-9]+(?:_[0-9]+)*"
_NumberLoader.add_implicit_resolver(_INT, re.compile(rf"^[-+]?{_DIGITS}$"), list("-+0123456789"))
_NumberLoader.add_implicit_resolver(
    _FLOAT, re.compile(rf"^[-+]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?(?:[eE][-+]?{_DIGITS})?|\.{_DIGITS}(?:[eE][-+]?{_DIGITS})?"
                       r"|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def _yaml_number(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    text = loader.construct_scalar(node)
    special = {".inf": math.inf, ".nan": math.nan}.get(text.lstrip("+-").lower())
    if special is not None:
        return -special if text.startswith("-") else special
    return int(text) if node.tag == _INT else float(text)


_NumberLoader.add_constructor(_INT, _yaml_number)
_NumberLoader.add_constructor(_FLOAT, _yaml_number)


def load_yaml(text: str | IO[str]) -> Any:
    """YAML (or JSON) text as Python values, `1e-4` a number wherever it stands (see `_NumberLoader`)."""
    return yaml.load(text, Loader=_NumberLoader)  # noqa: S506 (a SafeLoader)


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error on one line: where (line and column, when known) and what, without its caret drawing."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{getattr(err, 'problem', None) or str(err).splitlines()[0]}"


def parse_mapping(value: Mapping[str, Any] | str | None, flag: str) -> dict[str, Any]:
    """A mapping option: JSON/YAML text (the command line) or a mapping (a YAML config file, Python)."""
    if value is None:
        return {}
    given = value
    if isinstance(value, str):
        try:
            value = load_yaml(value)
        except yaml.YAMLError as err:
            raise ValueError(f"{flag}={value!r} is not valid JSON/YAML: {yaml_problem(err)}") from None
    _check(isinstance(value, Mapping), f"{flag}={given!r}: expected a mapping such as '{{\"key\": \"value\"}}'")
    keys = [key for key in value if not isinstance(key, str)]
    _check(not keys, f"{flag}={given!r}: keys must be text, got {', '.join(repr(key) for key in keys)}; quote them")
    return dict(value)


# ---- field groups -------------------------------------------------------------------------------


@dataclass
class RunFolderFields:
    """Where the run lives and how it is reproduced: every stage."""

    output_dir: str = field(
        default="gors_output",
        metadata={"help": "Run folder: samples/, scores/, selection.jsonl, checkpoints/, logs/ and the final LoRA."},
    )
    seed: int = field(default=42, metadata={"help": "Base seed in [0, 2^31) (official GORS: 42)."})
    mixed_precision: str | None = field(
        default=None,
        metadata={
            "help": "'no', 'fp16' or 'bf16'; default: the accelerate config's (SD3/3.5 and FLUX.1 take bf16 where it "
            "says fp16, which their activations overflow). Generation and scoring use this dtype on GPU (a reward whose model runs in bf16 officially, such as Qwen3-VL's, in bf16 "
            "under 'fp16', where it overflows); on CPU everything runs in fp32."
        },
    )

    def _check_run_folder(self) -> None:
        _check(bool(self.output_dir.strip()), "--output_dir='': give the run folder, e.g. --output_dir gors_output")
        self.output_dir = os.path.expanduser(self.output_dir)  # `~` from a YAML file or a quoted flag, as a shell would
        _check(0 <= self.seed < SEED_LIMIT, f"--seed={self.seed}: must be in [0, {SEED_LIMIT - 1}]")
        _check_mixed_precision(self.mixed_precision)


@dataclass
class ModelFields:
    """The text-to-image pipeline that generates and is trained: generate, train."""

    pretrained_model_name_or_path: str = field(
        default="stabilityai/stable-diffusion-2-base",
        metadata={"help": "A diffusers pipeline: Hub id or local folder with model_index.json (GORS paper: SD-2-base). "
                          "Every pipeline generates and evaluates; training supports SD 1.x/2.x, SDXL, SD3/3.5 and FLUX.1."},
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision of the base model."})
    resolution: int | None = field(
        default=None,
        metadata={"help": "Image side in pixels for generation and training; default: the model family's "
                          "(SD 1/2: the checkpoint's own, 512 for SD-2-base as in the GORS paper, 768 for SD 2.x "
                          "768-v; SDXL, SD3, FLUX.1: 1024). Training defaults to the side the samples were "
                          "generated at and refuses another."},
    )

    torch_compile: str = field(
        default="no",
        metadata={"help": "torch.compile backend for the denoiser in generation and training (and the text encoders "
                          "that run every training step): 'no' (as the official "
                          "scripts) or 'inductor', which pays on GPUs over long runs (compiling takes minutes; samples "
                          "and losses match the plain path up to float rounding). 'inductor:reduce-overhead' also "
                          "replays the compiled denoiser as CUDA graphs (text encoders compile without them), for "
                          "small batches whose steps wait on kernel launches (more memory; no gradient accumulation; "
                          "not yet measured on a GPU). 'aot_eager' and 'eager' debug it."},
    )

    def _check_model(self) -> None:
        # diffusers ignores a revision for a local folder: the run would record one it did not load.
        _check(self.revision is None or not Path(self.pretrained_model_name_or_path).expanduser().is_dir(),
               f"--revision={self.revision!r} with the local folder --pretrained_model_name_or_path="
               f"{self.pretrained_model_name_or_path!r}: a revision picks a Hub commit, and a folder loads the files "
               "it holds; drop --revision, or pass the Hub id")
        _check(self.resolution is None or (self.resolution >= 8 and self.resolution % 8 == 0),
               f"--resolution={self.resolution}: use a multiple of 8")
        _check_torch_compile(self.torch_compile)


@dataclass
class GenerationFields:
    """The training prompts and how their samples are drawn: generate."""

    train_prompts: str = field(
        default="color",
        metadata={
            "help": "A T2I-CompBench category or file stem (color, shape, texture, spatial, non_spatial, complex, "
            "color_val, ...; downloaded and checksummed), toy:train / toy:held_out (the toy world; toy:fit / toy:val and the folds toy:fit_square / toy:val_square, toy:fit_triangle / toy:val_triangle split the train prompts for choosing settings), or a text "
            "file with one prompt per line."
        },
    )
    max_prompts: int | None = field(default=None, metadata={"help": "Use only the first N prompts (quick runs)."})
    images_per_prompt: int = field(default=90, metadata={"help": "k images per prompt (GORS paper: 90)."})
    num_inference_steps: int | None = field(
        default=None, metadata={"help": "Sampling steps; default: the model family's (SD 1/2: DDIM 30, the "
                                        "T2I-CompBench protocol)."}
    )
    guidance_scale: float | None = field(
        default=None, metadata={"help": "Classifier-free guidance; default: the model family's (SD 1/2: 7.5)."}
    )
    generation_batch_size: int = field(default=8, metadata={"help": "Images per pipeline call on each process."})

    def _check_generation(self) -> None:
        _check(bool(self.train_prompts.strip()), f"--train_prompts={self.train_prompts!r}: give a T2I-CompBench "
               "category or file stem (e.g. color), toy:train, or a text file with one prompt per line")
        # Image i of prompt p is seeded seed + 100 000 p + i (`gors.core.store.sample_seed`).
        _check(1 <= self.images_per_prompt < 100_000,
               f"--images_per_prompt={self.images_per_prompt}: must be in [1, 99 999] (each image has its own seed)")
        _check_sampling(self.num_inference_steps, self.guidance_scale)
        _check(self.generation_batch_size >= 1, f"--generation_batch_size={self.generation_batch_size}: must be >= 1")
        _check(self.max_prompts is None or self.max_prompts >= 1, f"--max_prompts={self.max_prompts}: must be >= 1")


def _check_sampling(steps: int | None, guidance: float | None, resolution: int | None = None,
                    prefix: str = "") -> None:
    """Refuse sampling values out of range (`--<prefix>num_inference_steps`, ...); None is each's default."""
    _check(steps is None or steps >= 1, f"--{prefix}num_inference_steps={steps}: must be >= 1")
    _check(guidance is None or 0 <= guidance < math.inf,
           f"--{prefix}guidance_scale={guidance}: must be >= 0 and finite (1 or less turns "
           "classifier-free guidance off; FLUX.1 [dev] takes the value as an input)")
    _check(resolution is None or (resolution >= 8 and resolution % 8 == 0),
           f"--{prefix}resolution={resolution}: use a multiple of 8 (e.g. 512)")


# The sampling values `gors evaluate` (and, prefixed `validation_`, validation during training) may give in
# place of a benchmark's protocol: the benchmark fields they set.
SAMPLING_FLAGS = ("num_inference_steps", "guidance_scale", "resolution")


def sampling_overrides(config: Any, prefix: str = "") -> dict[str, Any]:
    """The sampling values `config` gives in place of a benchmark's protocol (benchmark field -> value),
    from its fields `<prefix><field>`."""
    return {flag: getattr(config, prefix + flag) for flag in SAMPLING_FLAGS if getattr(config, prefix + flag) is not None}


@dataclass
class RewardFields:
    """Which reward judges the samples: score, select."""

    reward: str | None = field(
        default=None,
        metadata={
            "help": "Reward from `gors rewards`, 'module:Class' for your own Reward subclass, or a weighted list "
            "'b_vqa:0.7,blip_clip:0.3'. Default: the --category's T2I-CompBench metric (b_vqa, spatial_rule, "
            "clip_score, three_in_one), b_vqa without a category."
        },
    )
    unbiased: bool = field(
        default=False,
        metadata={
            "help": "Reward the paper's unbiased model for the --category instead of its metric: grounded_sam "
            "(color, shape, texture), grounded_detection (spatial), blip_clip (non_spatial), unbiased_complex; "
            "toy_classifier for the toy world's prompts."
        },
    )
    category: str | None = field(
        default=None,
        metadata={"help": "T2I-CompBench category (or toy) whose reward and tau apply; default: the prompt set's. "
                          "Prompts of a category with its own reward and tau refuse another unless --reward and "
                          "--reward_threshold are given."},
    )

    def _check_reward(self) -> None:
        _check(
            not (self.reward is not None and self.unbiased),
            f"--reward={self.reward!r} (given, or set by a recipe or a --config file) and --unbiased both choose the "
            "reward; give one of them",
        )
        if self.category is not None:
            from gors.core.paper import ALL_CATEGORIES
            from gors.core.prompts import TOY_CATEGORY

            known = (*ALL_CATEGORIES, TOY_CATEGORY)
            close = difflib.get_close_matches(self.category, known, n=1)
            _check(self.category in known, f"--category={self.category!r} (given, or set by a recipe or a --config "
                   f"file) is no category: give one of {', '.join(known)}"
                   + (f" (did you mean {close[0]!r}?)" if close else ""))
        if self.reward is not None:
            from rewards.combined import parse_reward_list

            parse_reward_list(self.reward)  # syntax errors surface here; names are checked when scoring

    def reward_name(self, prompt_set_category: str | None = None) -> str:
        """The reward (or weighted list) this run uses; see `rewards.paper.resolve_reward`."""
        from rewards.paper import resolve_reward

        return resolve_reward(self.reward, self.unbiased, self.category or prompt_set_category)


@dataclass
class ScoringFields:
    """How the reward model is loaded and run: score."""

    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Model of the reward (Hub id or folder); default: the reward's own."}
    )
    reward_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Keyword arguments of the reward as a JSON/YAML mapping, e.g. "
            "'{\"sam_model_name_or_path\": \"facebook/sam-vit-base\"}'; for a weighted list, keyed by member: "
            "'{\"blip_clip\": {\"clip_model_name_or_path\": \"...\"}}'."
        },
    )
    reward_batch_size: int = field(default=16, metadata={"help": "Images per reward call on each process."})

    def _check_scoring(self) -> None:
        _check(self.reward_batch_size >= 1, f"--reward_batch_size={self.reward_batch_size}: must be >= 1")
        self.reward_options = parse_mapping(self.reward_options, "--reward_options")


@dataclass
class SelectionFields:
    """Which samples are kept: select."""

    reward_threshold: float | None = field(
        default=None,
        metadata={
            "help": "tau for every prompt. Default: the paper's per-category tau (template prompts = first 560 lines "
            "of the category's train file / natural prompts): color 0.92/0.7, shape 0.85/0.6, texture 0.9/0.65, "
            "spatial 0.8, non_spatial 0.75, complex 0.4; toy 0.99 with toy_oracle, 0.9 with toy_classifier; "
            "recipes/gors_geneval.py 0.7 unless --select_top_fraction or --tau_schedule is given."
        },
    )

    select_top_fraction: float | None = field(
        default=None,
        metadata={"help": "Instead of a threshold, keep each prompt's best samples: the top fraction (0, 1] of its "
                          "images by reward (at least one; ties go to the lower image index), e.g. 0.1."},
    )

    def _check_selection(self) -> None:
        _check(
            self.reward_threshold is None or 0.0 <= self.reward_threshold < 1.0,
            f"--reward_threshold={self.reward_threshold}: use a tau in [0, 1) (rewards lie in [0, 1] and a sample "
            "is kept when its reward is above tau)",
        )
        if self.select_top_fraction is not None:
            _check(0.0 < self.select_top_fraction <= 1.0,
                   f"--select_top_fraction={self.select_top_fraction}: use a fraction in (0, 1], e.g. 0.1")
            _check(self.reward_threshold is None,
                   f"--select_top_fraction={self.select_top_fraction} and --reward_threshold="
                   f"{self.reward_threshold}: select by one of them")


@dataclass
class TrainingFields:
    """Reward-weighted LoRA fine-tuning, its checkpoints and validation: train."""

    train_batch_size: int = field(default=2, metadata={"help": "Batch size per process (official: 2 x 8 GPUs)."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Steps to accumulate before an update."})
    global_batch_size: int | None = field(
        default=None,
        metadata={"help": "Samples per update over all processes (the recipes: 16, the paper's 2 x 8 GPUs). Sets "
                          "--gradient_accumulation_steps to it / (--train_batch_size x processes), which must divide "
                          "it: the same samples per update on 1 GPU as on 8. 0 or unset: --train_batch_size x processes x "
                          "--gradient_accumulation_steps."},
    )
    auto_train_batch_size: bool = field(
        default=False,
        metadata={"help": "With --global_batch_size: train each process's share of an update (--global_batch_size / "
                          "processes) as one micro-batch where it fits the device, else at the largest of its "
                          "halvings that does (16: 16, 8, 4, 2, 1), accumulating the rest. Sets --train_batch_size "
                          "and --gradient_accumulation_steps: tried at the first step, agreed by all processes and "
                          "recorded in the checkpoints, which a resume and later rounds keep. The same samples per "
                          "update; the noise draws differ as for any other --train_batch_size."},
    )
    max_train_steps: int = field(default=15000, metadata={"help": "Optimizer updates (official: 15 000)."})
    learning_rate: float = field(
        default=1e-4, metadata={"help": "Denoiser (U-Net or transformer) LoRA learning rate (official: 1e-4; diffusers' "
                                        "LoRA scripts use it for every family)."})
    text_encoder_learning_rate: float = field(
        default=5e-6, metadata={"help": "Text-encoder LoRA learning rate (official: 5e-6)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_weight_decay: float = field(default=1e-2, metadata={"help": "AdamW weight decay."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    fused_adam: bool = field(
        default=True,
        metadata={"help": "AdamW's fused kernel (one kernel over all adapters, on GPUs and CPUs; the same update up "
                          "to float rounding); --no_fused_adam steps parameter by parameter, as the official script."},
    )
    use_8bit_adam: bool = field(
        default=False, metadata={"help": "bitsandbytes' 8-bit AdamW (GPU; `pip install gors[bnb]`): optimizer state in "
                                         "a quarter of the memory."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient-norm clip."})
    lr_scheduler: str = field(default="constant", metadata={
        "help": "diffusers' get_scheduler name (constant, linear, cosine, ...). With --rounds it runs once over all "
                "rounds' steps (with --reset_optimizer, again over each round's)."})
    lr_warmup_steps: int = field(default=0, metadata={"help": "Warm-up steps of the LR schedule."})
    rank: int = field(default=4, metadata={"help": "LoRA rank (official: 4; alpha = rank, scale 1)."})
    train_unet: bool = field(
        default=True, metadata={"help": "LoRA on the denoiser: the U-Net's to_q, to_k, to_v, to_out.0 (SD, SDXL) or "
                                        "the transformer's attention projections (SD3, FLUX.1)."})
    train_text_encoder: bool | None = field(
        default=None,
        metadata={"help": "LoRA on the CLIP text encoder's q_proj, k_proj, v_proj, out_proj; default: the family's "
                          "(SD 1/2 and SDXL: on, as GORS; SD3: off, as diffusers; FLUX.1: not supported)."},
    )
    train_text_encoder_2: bool | None = field(
        default=None, metadata={"help": "LoRA on the second CLIP encoder (SDXL, SD3: OpenCLIP bigG); default: as "
                                        "--train_text_encoder."})
    cache_text_embeddings: bool = field(
        default=True,
        metadata={"help": "Encode the prompts once with every frozen text encoder and train on the cached outputs "
                          "(T5 is then never loaded during training); --no_cache_text_embeddings runs them each step."},
    )
    max_sequence_length: int | None = field(
        default=None, metadata={"help": "T5 tokens per prompt (SD3, FLUX.1): the pipeline's, which "
                                        "generated the samples (SD3 256, FLUX.1 512); another is refused."})
    weighting_scheme: str | None = field(
        default=None,
        metadata={"help": "Flow-matching timestep density / loss weighting (SD3, FLUX.1): logit_normal, mode, "
                          "uniform (none), sigma_sqrt or cosmap; default: diffusers' script's (SD3 logit_normal, "
                          "FLUX.1 none).",
                  "choices": ["none", "uniform", "sigma_sqrt", "logit_normal", "mode", "cosmap"]},
    )
    logit_mean: float = field(default=0.0, metadata={"help": "Mean of the logit_normal density."})
    logit_std: float = field(default=1.0, metadata={"help": "Standard deviation of the logit_normal density."})
    mode_scale: float = field(default=1.29, metadata={"help": "Scale of the mode density."})
    timestep_range: list[int] | None = field(
        default=None,
        metadata={"help": "Train only at DDPM timesteps in [BEGIN, END) (SD 1/2, SDXL), e.g. 500 1000 for the noisier "
                          "half, where the layout and the binding of attributes are decided; default: all (official)."},
    )
    anchor_below: int | None = field(
        default=None,
        metadata={"help": "Below this DDPM timestep (SD 1/2, SDXL), train the adapters to reproduce the base model's "
                          "prediction (adapters off) instead of the sample's target, so that the LoRA changes the "
                          "noisier steps only, e.g. 500; default: off (official), and 0 turns off a recipe's default "
                          "(the toy demo's). Costs a forward of the base model on those samples."},
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Trade compute for memory."})
    center_crop: bool = field(default=True, metadata={"help": "Centre crop after resizing (official: yes)."})
    caption_dropout: float = field(
        default=0.0,
        metadata={"help": "Share of training captions replaced by the empty prompt, which keeps the unconditional "
                          "branch of classifier-free guidance anchored (official GORS: 0). SDXL with "
                          "force_zeros_for_empty_prompt trains a dropped caption on zero embeddings, as it samples."},
    )
    sample_latents: bool = field(
        default=True,
        metadata={"help": "Draw each step's latent from the VAE posterior (official); --no_sample_latents uses its "
                          "mean, for models pretrained on posterior means such as the toy model."},
    )
    checkpointing_steps: int = field(default=500, metadata={"help": "Save the full training state every N updates."})
    checkpoints_total_limit: int | None = field(default=None, metadata={"help": "Keep at most N checkpoints."})
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "'latest' or a checkpoint folder: restores optimizer, scheduler, RNG and step, "
                                        "and fails if it was made with other settings. Without it a rerun goes on "
                                        "from the newest checkpoint of the same training anyway."}
    )
    validation_prompts: list[str] | None = field(
        default=None, metadata={"help": "Prompts rendered with the current LoRA and logged every --validation_steps."}
    )
    validation_steps: int = field(
        default=500, metadata={"help": "Run validation every N updates, and after the last one (with "
                                        "--validation_benchmark and/or --validation_prompts)."})
    validation_benchmark: str | None = field(
        default=None,
        metadata={"help": "Benchmark run with the current LoRA every --validation_steps (any one of `gors evaluate "
                          "--benchmarks`, e.g. t2i_compbench:color, geneval, toy, module:Class): metrics and an image grid go "
                          "to TensorBoard, and the best LoRA by --validation_metric to <output_dir>/best."},
    )
    validation_num_prompts: int = field(default=16, metadata={"help": "Validation prompts (spread over the benchmark)."})
    validation_images_per_prompt: int = field(default=1, metadata={"help": "Validation images per prompt."})
    validation_num_inference_steps: int | None = field(
        default=None, metadata={"help": "Sampling steps of benchmark validation; default: the benchmark's protocol for "
                                        "the model's family, as `gors evaluate` (a distilled checkpoint needs its own)."})
    validation_guidance_scale: float | None = field(
        default=None, metadata={"help": "Classifier-free guidance of benchmark validation; default: the benchmark's "
                                        "protocol for the model's family (e.g. 0 for SDXL-Turbo)."})
    validation_resolution: int | None = field(
        default=None, metadata={"help": "Image side (pixels) of benchmark validation; default: the benchmark's "
                                        "protocol for the model's family (SDXL-Turbo wants 512)."})
    validation_metric: str | None = field(
        default=None, metadata={"help": "Summary key that picks the best checkpoint (a metric the benchmark declares, "
                                        "not a further column such as columns.B-CLIP); default: the benchmark's main "
                                        "metric."}
    )
    validation_scorer_options: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Keyword arguments of the validation scorer (JSON/YAML mapping)."}
    )
    validation_benchmark_options: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Fields of the validation benchmark (JSON/YAML mapping), as "
                                                "`gors evaluate --benchmark_options` gives one benchmark's, e.g. "
                                                "'{\"data_path\": \"my.jsonl\"}' for geneval2."})
    report_to: str = field(default="tensorboard", metadata={"help": "One Accelerate tracker (tensorboard, wandb, mlflow, ...: "
                                                           "accelerate's LoggerType names), all (every installed "
                                                           "one) or none."})

    def check_optimizer(self) -> None:
        """AdamW's and the LR schedule's values, which torch and diffusers would take silently or refuse
        only after the models load (a negative --max_grad_norm would even climb the loss). The trainer
        checks again before it may set checkpoints aside: a config changed after it was made."""
        for flag in ("adam_beta1", "adam_beta2"):
            value = getattr(self, flag)
            _check(0.0 <= value < 1.0, f"--{flag}={value}: use a value in [0, 1), e.g. 0.9")
        _check(0 < self.adam_epsilon < math.inf, f"--adam_epsilon={self.adam_epsilon}: must be > 0 and finite, e.g. 1e-8")
        _check(0 <= self.adam_weight_decay < math.inf,
               f"--adam_weight_decay={self.adam_weight_decay}: must be >= 0 and finite, e.g. 1e-2")
        _check(self.lr_warmup_steps >= 0, f"--lr_warmup_steps={self.lr_warmup_steps}: must be >= 0")
        # diffusers' `constant` schedule ignores the warm-up (the official script's 500 with it does nothing).
        _check(self.lr_scheduler == "constant" or self.lr_warmup_steps < self.max_train_steps,
               f"--lr_warmup_steps={self.lr_warmup_steps} with --lr_scheduler={self.lr_scheduler} and "
               f"--max_train_steps={self.max_train_steps}: the learning rate would never leave its warm-up; give "
               "fewer warm-up steps than updates")
        _check(self.max_grad_norm > 0, f"--max_grad_norm={self.max_grad_norm}: must be > 0, e.g. 1.0")
        from diffusers.optimization import SchedulerType

        # piecewise_constant needs step rules that no flag gives.
        names = [kind.value for kind in SchedulerType if kind != SchedulerType.PIECEWISE_CONSTANT]
        _check(self.lr_scheduler in names, f"--lr_scheduler={self.lr_scheduler!r}; choose one of {', '.join(names)}")
        # diffusers' polynomial schedule decays the optimizer's rate (--learning_rate) to 1e-7, every group's in
        # proportion, and refuses a rate at or below it.
        _check(self.lr_scheduler != "polynomial" or self.learning_rate > 1e-7,
               "--lr_scheduler=polynomial decays --learning_rate to 1e-7 (and the text encoder's rate in proportion): "
               "give a --learning_rate above it")

    def check_given(self, given: set[str]) -> None:
        """Refuse, once parsed, flags the user gave (`given`: their field names, from the command line or a
        config file) that another flag overrides. Not in `__post_init__`: training sets `train_batch_size`
        itself under --auto_train_batch_size, and copies of the config are made after."""
        _check(not (self.auto_train_batch_size and "train_batch_size" in given),
               f"--train_batch_size={self.train_batch_size} with --auto_train_batch_size, which sets it (each "
               "process's share of an update, halved until it fits): drop one of the two")
        if "gradient_accumulation_steps" in given and self.global_batch_size is not None:
            # An explicit 1 looks like the default once parsed: checked here, where it is known to be the user's,
            # against the processes the launcher started (the recipes' --global_batch_size 16 is 8 on one GPU).
            _check(not self.auto_train_batch_size,
                   f"--gradient_accumulation_steps={self.gradient_accumulation_steps} with --auto_train_batch_size, "
                   "which sets it: drop one of the two")
            from accelerate.utils import get_int_from_env

            # What Accelerate will count (torchrun's WORLD_SIZE, or an MPI launcher's), before it starts.
            processes = get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1)
            try:
                accumulation_steps(self.global_batch_size, self.train_batch_size, processes,
                                   given=self.gradient_accumulation_steps)
            except ValueError as err:
                if "global_batch_size" in given:
                    raise
                raise ValueError(f"{err}; --global_batch_size={self.global_batch_size} is the recipe's: "
                                 "--global_batch_size 0 sets the accumulation by hand") from None
        _check(not ("validation_steps" in given and self.validation_benchmark is None and not self.validation_prompts),
               f"--validation_steps={self.validation_steps} without --validation_benchmark or --validation_prompts: "
               "there is no validation to run; name what to validate, or drop it")

    def _check_benchmark_validation_flags(self) -> None:
        """Refuse flags of benchmark validation without `--validation_benchmark`: they would be taken and
        do nothing (a value differing from its default counts as given)."""
        if self.validation_benchmark is not None:
            return
        defaults = {f.name: f.default for f in fields(TrainingFields)}
        given = [name for name in ("validation_metric", "validation_num_prompts", "validation_images_per_prompt",
                                   *(f"validation_{flag}" for flag in SAMPLING_FLAGS))
                 if getattr(self, name) != defaults[name]]
        given += [name for name in ("validation_scorer_options", "validation_benchmark_options") if getattr(self, name)]
        _check(not given, f"{', '.join(f'--{name}' for name in given)} without --validation_benchmark: "
                          f"{'it sets' if len(given) == 1 else 'they set'} up benchmark validation, which is off. "
                          "Name the benchmark (e.g. --validation_benchmark t2i_compbench:color), or drop "
                          f"{'it' if len(given) == 1 else 'them'}")

    def _check_training(self) -> None:
        for flag in ("train_batch_size", "gradient_accumulation_steps", "max_train_steps", "rank", "checkpointing_steps",
                     "validation_steps"):
            value = getattr(self, flag)
            _check(value >= 1, f"--{flag}={value}: must be >= 1")
        if self.global_batch_size == 0:  # a recipe's 16 turned off
            self.global_batch_size = None
        _check(self.global_batch_size is None or self.global_batch_size >= 1,
               f"--global_batch_size={self.global_batch_size}: must be >= 1, or 0 for off")
        if self.auto_train_batch_size:
            _check(self.global_batch_size is not None,
                   "--auto_train_batch_size without --global_batch_size: it fits the samples of an update into micro-"
                   "batches, and needs their number: give it (the recipes' 16, the paper's)")
            _check(self.gradient_accumulation_steps == 1,
                   f"--gradient_accumulation_steps={self.gradient_accumulation_steps} with --auto_train_batch_size, "
                   "which sets it: drop one of the two")
        _check(self.checkpoints_total_limit is None or self.checkpoints_total_limit >= 1,
               f"--checkpoints_total_limit={self.checkpoints_total_limit}: keep at least 1 (or omit it to keep all)")
        _check(self.train_unet or self.train_text_encoder is not False or self.train_text_encoder_2,
               "--no_train_unet and --no_train_text_encoder together leave nothing to train")
        _check(self.max_sequence_length is None or self.max_sequence_length >= 1,
               f"--max_sequence_length={self.max_sequence_length}: must be >= 1")
        for name in ("learning_rate", "text_encoder_learning_rate"):
            _check(0 < getattr(self, name) < math.inf, f"--{name}={getattr(self, name)}: must be > 0 and finite, e.g. 1e-4")
        for name in ("logit_mean", "logit_std", "mode_scale"):  # a NaN or infinite density draws no timestep
            _check(math.isfinite(getattr(self, name)), f"--{name}={getattr(self, name)}: must be finite")
        _check(self.logit_std > 0, f"--logit_std={self.logit_std}: must be > 0 (a standard deviation), e.g. 1.0")
        # The mode density is defined for [-1, 2 / (pi - 2)] (SD3 paper, section 3.1): there its map of a uniform
        # draw is monotone; below -1 its timesteps leave [0, 1] and would fall off the schedule.
        _check(-1.0 <= self.mode_scale <= MODE_SCALE_MAX,
               f"--mode_scale={self.mode_scale}: must lie in [-1, {MODE_SCALE_MAX:.3f}], where the mode density is "
               "defined (SD3 paper, section 3.1); the default is 1.29")
        self.check_optimizer()
        _check(0.0 <= self.caption_dropout < 1.0, f"--caption_dropout={self.caption_dropout}: use a value in [0, 1)")
        _check(self.anchor_below is None or self.anchor_below >= 0,
               f"--anchor_below={self.anchor_below}: give a timestep >= 1, e.g. --anchor_below 500, or 0 for off")
        if self.anchor_below == 0:
            self.anchor_below = None  # no timestep lies below 0: the official loss, and no fingerprint key
        if self.timestep_range is not None:
            _check(len(self.timestep_range) == 2 and 0 <= self.timestep_range[0] < self.timestep_range[1],
                   f"--timestep_range={' '.join(map(str, self.timestep_range))}: give BEGIN END with 0 <= BEGIN < END, "
                   "e.g. --timestep_range 500 1000")
            if self.anchor_below is not None:
                check_anchor_below(self.anchor_below, self.timestep_range, None)
        _check_report_to(self.report_to)
        _check(self.validation_num_prompts >= 1 and self.validation_images_per_prompt >= 1,
               "--validation_num_prompts and --validation_images_per_prompt must be >= 1")
        _check_sampling(self.validation_num_inference_steps, self.validation_guidance_scale,
                        self.validation_resolution, prefix="validation_")
        self.validation_scorer_options = parse_mapping(self.validation_scorer_options, "--validation_scorer_options")
        self.validation_benchmark_options = parse_mapping(self.validation_benchmark_options,
                                                          "--validation_benchmark_options")
        self._check_benchmark_validation_flags()
        if self.validation_benchmark is not None:
            from evaluators import parse_benchmarks

            specs = parse_benchmarks(self.validation_benchmark, "--validation_benchmark")
            _check(len(specs) == 1, f"--validation_benchmark={self.validation_benchmark!r}: name one benchmark or "
                                    "category (e.g. t2i_compbench:color)")


@dataclass
class PipelineFields:
    """How `gors run` chains its stages (the stage commands run one stage each)."""

    overlap_scoring: bool = field(
        default=False,
        metadata={"help": "Score each generated batch on a second thread while the next one generates (on a GPU on "
                          "its own CUDA stream): the reward model's work overlaps the denoiser's, with both models in "
                          "memory. Same scores as scoring afterwards. Timed as one stage, generate+score."},
    )
    push_to_hub: str | None = field(
        default=None,
        metadata={"help": "A Hugging Face Hub model repository, ORG/NAME: once trained, the final LoRA goes there "
                          "with a model card of the run, as `gors push` does (a token and the network are checked "
                          "before any work)."},
    )

    def _check_push(self) -> None:
        if self.push_to_hub is not None:
            from gors.core.hub import is_repo_id

            _check(is_repo_id(self.push_to_hub),
                   f"--push_to_hub={self.push_to_hub!r}: give a Hugging Face Hub model repository, ORG/NAME")


@dataclass
class RoundFields:
    """Online GORS: several rounds of generate -> score -> select -> train (`gors run`, the recipes)."""

    rounds: int = field(
        default=1,
        metadata={"help": "Rounds of generate -> score -> select -> train (1: the paper's GORS). Round r generates "
                          "--images_per_prompt new images per prompt with round r-1's LoRA and trains the same LoRA "
                          "on, each round in <output_dir>/round-<r>/."},
    )
    steps_per_round: int | None = field(
        default=None, metadata={"help": "Optimizer updates per round; default: --max_train_steps / --rounds. Given, "
                                        "the run trains --rounds x --steps_per_round updates in all and "
                                        "--max_train_steps is not used."})
    tau_schedule: list[float] | None = field(
        default=None, metadata={"help": "One tau per round (e.g. 0.6 0.7 0.8), instead of --reward_threshold."})
    replay: str = field(
        default="none",
        metadata={"help": "Earlier rounds' selected samples in round r's training pool: none, last (round r-1's) or "
                          "all.", "choices": ["none", "last", "all"]},
    )
    reset_optimizer: bool = field(
        default=False,
        metadata={"help": "Start each round's training with a fresh AdamW state and LR schedule (the LoRA carries "
                          "on); default: the optimizer state carries on too."},
    )

    def _check_rounds(self) -> None:
        _check(self.rounds >= 1, f"--rounds={self.rounds}: must be >= 1 (1 is the paper's one-round GORS)")
        if self.rounds == 1:
            _check(self.replay == "none" and not self.reset_optimizer,
                   "--replay and --reset_optimizer act between rounds: they need --rounds >= 2")
            _check(self.tau_schedule is None and self.steps_per_round is None,
                   "--tau_schedule and --steps_per_round set each round's tau and updates: they need --rounds >= 2 "
                   "(one round: --reward_threshold and --max_train_steps)")
        else:
            _check(self.resume_from_checkpoint in (None, "latest"),
                   f"--resume_from_checkpoint={self.resume_from_checkpoint!r}: with --rounds each round resumes from "
                   "its own checkpoints; pass 'latest'")
        if self.steps_per_round is not None:
            _check(self.steps_per_round >= 1, f"--steps_per_round={self.steps_per_round}: must be >= 1")
        else:
            _check(self.max_train_steps % self.rounds == 0,
                   f"--max_train_steps={self.max_train_steps} does not split into --rounds={self.rounds} equal "
                   "rounds: give --steps_per_round, or a --max_train_steps that --rounds divides")
        if self.tau_schedule is not None:
            _check(len(self.tau_schedule) == self.rounds,
                   f"--tau_schedule has {len(self.tau_schedule)} values for --rounds={self.rounds}: give one tau per "
                   "round")
            _check(all(0.0 <= tau < 1.0 for tau in self.tau_schedule),
                   f"--tau_schedule={self.tau_schedule}: use taus in [0, 1) (rewards lie in [0, 1] and a sample is "
                   "kept when its reward is above tau)")
            _check(self.reward_threshold is None and self.select_top_fraction is None,
                   "--tau_schedule and --reward_threshold or --select_top_fraction: select by one of them")

    def round_steps(self) -> int:
        """Optimizer updates of each round."""
        return self.steps_per_round or self.max_train_steps // self.rounds

    def round_tau(self, index: int) -> float | None:
        """Round `index`'s tau from --tau_schedule, else --reward_threshold (None: the paper's tau)."""
        return self.tau_schedule[index] if self.tau_schedule is not None else self.reward_threshold


# ---- the commands' configs -----------------------------------------------------------------------
# Bases are listed last-group-first: a dataclass orders its fields from the last base to the first,
# so flags read run folder, model, then the stage's own.


@dataclass
class GenerateConfig(GenerationFields, ModelFields, RunFolderFields):
    """`gors generate`: k images per training prompt into the sample store."""

    def __post_init__(self) -> None:
        check_values(self)
        self._check_run_folder()
        self._check_model()
        self._check_generation()


@dataclass
class ScoreConfig(ScoringFields, RewardFields, RunFolderFields):
    """`gors score`: one reward over every sample in the store."""

    def __post_init__(self) -> None:
        check_values(self)
        self._check_run_folder()
        self._check_reward()
        self._check_scoring()


@dataclass
class SelectConfig(SelectionFields, RewardFields, RunFolderFields):
    """`gors select`: keep the samples whose reward exceeds tau."""

    def __post_init__(self) -> None:
        check_values(self)
        self._check_run_folder()
        self._check_reward()
        self._check_selection()


@dataclass
class TrainConfig(TrainingFields, ModelFields, RunFolderFields):
    """`gors train`: reward-weighted LoRA fine-tuning on the selected samples."""

    def __post_init__(self) -> None:
        check_values(self)
        self._check_run_folder()
        self._check_model()
        self._check_training()


@dataclass
class RunConfig(RoundFields, PipelineFields, GenerationFields, ScoringFields, SelectionFields, RewardFields,
                TrainingFields, ModelFields, RunFolderFields):
    """`gors run` and the recipes: generate -> score -> select -> train in one run folder (per round)."""

    # Every stage config's field groups, so that each stage function takes a RunConfig as it is.
    def __post_init__(self) -> None:
        check_values(self)
        self._check_run_folder()
        self._check_model()
        self._check_training()
        self._check_reward()
        self._check_selection()
        self._check_scoring()
        self._check_generation()
        self._check_rounds()
        self._check_push()

    def check_given(self, given: set[str]) -> None:
        """`TrainingFields.check_given`, and --max_train_steps beside --steps_per_round, which sets the updates."""
        super().check_given(given)
        if "max_train_steps" in given and self.steps_per_round is not None:
            raise ValueError(f"--max_train_steps={self.max_train_steps} with --steps_per_round={self.steps_per_round}, "
                             f"which sets the updates (--rounds x --steps_per_round = "
                             f"{self.rounds * self.steps_per_round}): drop one of the two")


@dataclass
class EvaluateConfig:
    """`gors evaluate`: benchmarks on any checkpoint, or on images already in an official layout.

    There is no seed: each benchmark's protocol fixes its seeds (T2I-CompBench: 42 + image index).
    """

    output_dir: str = field(
        default="eval_output", metadata={"help": "Results: one folder per benchmark (and category), summary.json."}
    )
    mixed_precision: str | None = field(
        default=None,
        metadata={"help": "'no', 'fp16' or 'bf16' for generation on GPU, and for the scorers whose benchmark "
                          "fixes no dtype (on GPU Soft-TIFA, TIFA, VQAScore and TIT-Score score in bf16, "
                          "CLIPScore in fp16, B-VQA, GenEval and the UniDet rules in fp32 whatever this says, as "
                          "their official code does); default: the "
                          "accelerate config's. On CPU everything runs in fp32."},
    )
    pretrained_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Any diffusers text-to-image pipeline to evaluate (Hub id or folder); default: the base "
                          "model that a gors run folder given as --lora was trained on, else "
                          "stabilityai/stable-diffusion-2-base, or the toy pipeline that ships with gors where every "
                          "benchmark is toy. With --images nothing loads: it is recorded as the model that made "
                          "them, as a label for gors report."},
    )
    lora: str | None = field(
        default=None,
        metadata={"help": "LoRA folder (diffusers format, e.g. a gors run folder) or its weights file, hub:<org>/<name> "
                          "for a diffusers-format LoRA on the Hugging Face Hub (downloaded into its cache), or "
                          "official:<category> "
                          "for the GORS checkpoints released with T2I-CompBench (downloaded and converted once)."},
    )
    lora_dropout: float = field(
        default=0.0,
        metadata={"help": "Sample with dropout of this rate on the LoRA's output, in [0, 1), as T2I-CompBench's "
                          "inference_eval.py samples the official checkpoints (0.1: lora_diffusion's layers keep "
                          "their dropout active there); default 0, the LoRA as trained."},
    )
    benchmarks: str = field(
        default="all",
        metadata={"help": "all | t2i_compbench[:color,shape,...] | geneval | geneval2 | lpg_bench | toy[:train], "
                          "comma-separated. all = every T2I-CompBench category, GenEval, GenEval 2, LPG-Bench. "
                          "Your own: an installed entry point's name, or module:Class[:subset] "
                          "(docs/extending.md)."},
    )
    images: str | None = field(
        default=None,
        metadata={"help": "Score images already laid out as the benchmark's official tools expect instead of "
                          "generating (one benchmark or category only)."},
    )
    max_prompts: int | None = field(default=None, metadata={"help": "Evaluate N prompts spread evenly over each benchmark's list (quick runs)."})
    images_per_prompt: int | None = field(
        default=None, metadata={"help": "Images per prompt; default: each benchmark's official number."}
    )
    num_inference_steps: int | None = field(
        default=None, metadata={"help": "Sampling steps; default: each benchmark's protocol for the model's family "
                                        "(docs/model_families.md). Another value is another protocol: the results "
                                        "record it, and the numbers do not compare with published ones."})
    guidance_scale: float | None = field(
        default=None, metadata={"help": "Classifier-free guidance (>= 0; 1 or less turns it off, except for FLUX.1 "
                                        "[dev], which takes the value as an input); default: each benchmark's "
                                        "protocol for the model's family (docs/model_families.md); a distilled "
                                        "checkpoint needs its own, e.g. 0 for SDXL-Turbo."})
    resolution: int | None = field(
        default=None, metadata={"help": "Image side in pixels; default: each benchmark's protocol for the model's "
                                        "family (SD 1/2: the checkpoint's own side; SDXL, SD3, FLUX.1: 1024); "
                                        "SDXL-Turbo wants 512: pass it."})
    scorer_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "Keyword arguments of the scorers as a JSON/YAML mapping keyed by benchmark (or "
                          "benchmark:subset), e.g. '{\"geneval\": {\"model_name_or_path\": \"...\"}}'; a \"columns\" "
                          "entry gives the further metric columns' scorers theirs, keyed by column."},
    )
    benchmark_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "Fields of the benchmarks as a JSON/YAML mapping keyed by benchmark (or benchmark:subset), "
                          "e.g. '{\"lpg_bench\": {\"dataset\": \"LPG-Bench\"}}' for a local copy of its prompts, or "
                          "'{\"geneval2\": {\"data_path\": \"my.jsonl\"}}'; `gors benchmarks` lists each one's."},
    )
    generation_batch_size: int | None = field(
        default=None, metadata={"help": "Images per pipeline call on each process (each image keeps its own seed); "
                                        "default: each benchmark's own (GenEval and LPG-Bench 4, as their scripts; toy 32; 8 "
                                        "for the others)."})
    scorer_batch_size: int = field(default=16, metadata={"help": "Images per scorer call on each process."})
    torch_compile: str = field(
        default="no", metadata={"help": "torch.compile backend for the denoiser that generates: 'no', 'inductor' or "
                                        "'inductor:MODE' (see `gors generate --help`)."})
    columns: str = field(
        default="default",
        metadata={"help": "Further metric columns: 'default' (each benchmark's own, e.g. T2I-CompBench's B-CLIP and "
                          "CLIPScore), 'none', 'all' (also the slow optional ones), or optional columns to add to "
                          "the defaults, comma-separated, e.g. 'MLLM-CoT' (T2I-CompBench's MLLM judge on Qwen3-VL)."},
    )

    def __post_init__(self) -> None:
        check_values(self)
        _check(bool(self.output_dir.strip()), "--output_dir='': give the evaluation folder, e.g. --output_dir eval_output")
        self.output_dir = os.path.expanduser(self.output_dir)  # `~` from a YAML file or a quoted flag, as a shell would
        self.images = None if self.images is None else os.path.expanduser(self.images)
        _check(bool(self.extra_columns) or self.columns in ("default", "none", "all"),
               f"--columns={self.columns!r}: give default, none, all or comma-separated column names, e.g. MLLM-CoT")
        _check_mixed_precision(self.mixed_precision)
        _check_torch_compile(self.torch_compile)
        _check(self.max_prompts is None or self.max_prompts >= 1, f"--max_prompts={self.max_prompts}: must be >= 1")
        _check(self.images_per_prompt is None or self.images_per_prompt >= 1,
               f"--images_per_prompt={self.images_per_prompt}: must be >= 1")
        _check(self.generation_batch_size is None or self.generation_batch_size >= 1,
               f"--generation_batch_size={self.generation_batch_size}: must be >= 1")
        _check_sampling(self.num_inference_steps, self.guidance_scale, self.resolution)
        _check(self.scorer_batch_size >= 1, f"--scorer_batch_size={self.scorer_batch_size}: must be >= 1")
        _check(0.0 <= self.lora_dropout < 1.0, f"--lora_dropout={self.lora_dropout}: must be in [0, 1), e.g. 0.1")
        _check(self.lora_dropout == 0.0 or self.lora is not None,
               f"--lora_dropout={self.lora_dropout} without --lora: there is no LoRA to drop; give --lora too")
        _check(self.lora_dropout == 0.0 or self.torch_compile == "no",
               f"--lora_dropout with --torch_compile={self.torch_compile}: the dropout's random draws break the "
               "compiled graph at every LoRA layer, so compiling would not pay; drop one of them")
        self.scorer_options = parse_mapping(self.scorer_options, "--scorer_options")
        for key, value in self.scorer_options.items():
            _check(isinstance(value, Mapping),
                   f"--scorer_options: {key!r} maps to {value!r}; give that benchmark's scorer options as a mapping, "
                   f"e.g. '{{\"{key}\": {{\"model_name_or_path\": \"...\"}}}}'")
        self.benchmark_options = parse_mapping(self.benchmark_options, "--benchmark_options")
        for key, value in self.benchmark_options.items():
            _check(isinstance(value, Mapping),
                   f"--benchmark_options: {key!r} maps to {value!r}; give that benchmark's fields as a mapping, "
                   f"e.g. '{{\"lpg_bench\": {{\"dataset\": \"LPG-Bench\"}}}}'")

    @property
    def extra_columns(self) -> list[str]:
        """The optional column names `columns` lists (empty for default, none and all)."""
        if self.columns in ("default", "none", "all"):
            return []
        return [name.strip() for name in self.columns.split(",") if name.strip()]


STAGE_CONFIGS = (GenerateConfig, ScoreConfig, SelectConfig, TrainConfig, RunConfig)


def config_file_values(cls: type, values: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The values of the YAML config file `path` that `cls` takes.

    One file may drive every stage of a `gors run`: for a stage's config, the keys of another stage
    (`RunConfig`'s fields) are left out; a key that none of them has is refused, naming the file.
    """
    own = {spec.name for spec in fields(cls)}
    known = own | ({spec.name for spec in fields(RunConfig)} if cls in STAGE_CONFIGS else set())
    unknown = sorted(set(values) - known)
    # `--no_train_unet` is argparse's spelling of a boolean field; the file names the field itself.
    booleans = {name for config in {cls, RunConfig} for name, kind in typing.get_type_hints(config).items()
                if kind in (bool, bool | None)}
    hints = [f"; {name} is the command line's flag: write {name.removeprefix('no_')}: "
             f"{str(not values[name]).lower() if isinstance(values[name], bool) else 'false'}"
             for name in unknown if name.startswith("no_") and name.removeprefix("no_") in booleans & known]
    # A training key in an evaluation's (or the status's) file: the key is right, the command is not.
    elsewhere = [] if cls in STAGE_CONFIGS else [name for name in unknown if name in {spec.name for spec in fields(RunConfig)}]
    if elsewhere:
        hints.append(f"; {', '.join(elsewhere)}: {'settings' if len(elsewhere) > 1 else 'a setting'} of `gors run` "
                     f"and its stages, which {cls.__name__} does not take")
    hints += [f"; {name}: did you mean {match[0]}?" for name in unknown if not name.startswith("no_")
              and name not in elsewhere
              for match in [difflib.get_close_matches(name.replace("-", "_"), sorted(known), n=1)] if match]
    _check(not unknown, f"--config {path}: unknown keys {unknown} for {cls.__name__}"
                        + (" (nor any other stage of `gors run`)" if cls in STAGE_CONFIGS else "")
                        + "".join(hints) + "; see --help for the valid names")
    return {name: value for name, value in values.items() if name in own}


@dataclass(frozen=True)
class Derived:
    """A default computed from the other parsed values (e.g. a recipe's output folder from its category
    and `--unbiased`) where neither a flag nor the config file gives it; `shown` is what --help prints.
    Defined here, not in `gors.cli`, so that `python -m gors.cli` (whose module runs as `__main__`) knows the
    class the commands' defaults are made of."""

    shown: str
    compute: Callable[[dict[str, Any]], Any]


def sampling_defaults() -> dict[str, Derived]:
    """`gors generate`'s and `gors run`'s base model where neither a flag nor a config file names one: the toy
    pipeline that ships with gors for the toy world's prompts (`--train_prompts toy:<split>`, which no other
    model was made for), else the paper's."""
    from gors.core.prompts import TOY_PREFIX
    from gors.core.toy import PRETRAINED_DIR

    paper_model = next(f.default for f in fields(GenerateConfig) if f.name == "pretrained_model_name_or_path")
    toy_model = str(PRETRAINED_DIR / "pipeline")
    return {"pretrained_model_name_or_path": Derived(
        f"the toy pipeline that ships with gors for --train_prompts {TOY_PREFIX}<split>, else {paper_model}",
        lambda values: toy_model if str(values["train_prompts"]).startswith(TOY_PREFIX) else paper_model)}


def train_defaults() -> dict[str, Derived]:
    """`gors train`'s base model where neither a flag nor a config file names one: the model that generated the
    samples of its --output_dir, at their revision (as its --resolution is theirs), else the paper's."""
    paper_model = next(f.default for f in fields(TrainConfig) if f.name == "pretrained_model_name_or_path")
    shown = f"the model that generated the samples in --output_dir, else {paper_model}"

    @functools.lru_cache(maxsize=1)  # read once for both defaults
    def settings(output_dir: str) -> dict[str, Any]:
        from gors.core.run_folder import samples_dir
        from gors.core.store import SampleStore

        return SampleStore(samples_dir(output_dir)).load_settings() or {}

    def generated(values: dict[str, Any]) -> dict[str, Any]:
        return settings(values["output_dir"])

    return {"pretrained_model_name_or_path": Derived(shown, lambda values: generated(values).get("model") or paper_model),
            # The samples' revision goes with their model only: a model given is taken at its own --revision.
            "revision": Derived("the samples' revision, where the model is theirs",
                                lambda values: generated(values).get("revision")
                                if values["pretrained_model_name_or_path"] == shown else None)}
