"""The `gors` command: one subcommand per stage, `run` for all four, and the tools around them.

Every subcommand is a config dataclass parsed by `parse_config`: its flags, or `--config FILE.yaml`
whose keys are the same names (flags given on the command line override the file). `COMMANDS`
declares them all. Run any stage under `accelerate launch -m gors.cli <stage> ...` (or
`accelerate launch $(which gors) ...`) to use several processes.

Expected errors (a bad flag, file or value, a run folder in use, an empty selection, a user's reward
that breaks the reward protocol, Ctrl-C) end a command with one line `error: ...` from the main
process, on a line of its own, and exit status 2 (`expected_errors`); anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import difflib
import errno
import importlib
import inspect
import os
import re
import signal
import sys
import threading
import time
import warnings
from argparse import SUPPRESS, ArgumentParser
from contextlib import contextmanager, nullcontext
from dataclasses import Field, dataclass, fields
from types import UnionType
from typing import Any, Callable, Iterator, NoReturn, Sequence, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from gors._moved import moved_names
from gors.config import (
    KIND_WORDS,
    Derived,
    SelectConfig,
    TrainConfig,
    config_file_values,
    load_yaml,
    of_kind,
    yaml_problem,
)
from gors.core.data import ChecksumError, DownloadError
from gors.core.hub import ModelLoadError
from gors.core.io import PathError
from gors.core.lock import LockError, check_run_folder, run_folder_lock
from gors.core.store import StoreError

# 0.1 names that moved in 0.2 (CHANGELOG.md); they warn and forward until 0.3.
__getattr__ = moved_names(__name__, {
    "run_stages": "gors.run:run_stages",
    "run": "gors.run:run",
})

C = TypeVar("C")


class ConfigParser(HfArgumentParser):
    """HfArgumentParser for gors configs, with two kinds of field it cannot express by itself.

    - `metadata={"positional": True, ...}`: a positional argument (`gors report FOLDER...`); a list
      field takes one or more values.
    - a `dict[str, Any]` field: JSON/YAML text on the command line, which the config's
      `__post_init__` parses into the mapping (a YAML config file gives the mapping itself).
    - a `bool | None` field whose None means "the model family's default": `--flag` and
      `--no_flag` as for a plain bool (HfArgumentParser adds `--no_flag` only for default True).
    - a number, text or list that may be None: `--flag none` sets None, so that a value of a YAML file
      or a recipe can be unset from the command line (`--reward_threshold none --select_top_fraction 0.1`,
      `--validation_benchmark none`), except where "none" is one of the field's choices
      (`--weighting_scheme none`, uniform weighting).
    """

    @staticmethod
    def _parse_dataclass_field(parser: ArgumentParser, field: Field) -> None:
        options = dict(field.metadata)
        if options.pop("positional", False):
            parser.add_argument(field.name, nargs="+" if get_origin(field.type) is list else None, **options)
        elif get_origin(field.type) is dict:
            # HfArgumentParser would call dict(text) on the value.
            parser.add_argument(f"--{field.name}", f"--{field.name.replace('_', '-')}",
                                default=field.default_factory(), **options)
        elif field.type == (bool | None) and field.default is None:
            # HfArgumentParser would want a value after the flag.
            parser.add_argument(f"--{field.name}", f"--{field.name.replace('_', '-')}", type=string_to_bool, nargs="?",
                                const=True, default=None, **options)
            parser.add_argument(f"--no_{field.name}", f"--no-{field.name.replace('_', '-')}", action="store_false",
                                dest=field.name, help=f"--{field.name} off.")
        elif _unsettable(field.type):
            HfArgumentParser._parse_dataclass_field(parser, field)
            action = next(action for action in parser._actions if action.dest == field.name)
            if not set(action.choices or ()) & set(NONE_WORDS):  # a field that takes "none" as its value keeps it
                action.type = _or_none(action.type)
                action.help = f"{action.help or ''} `none`: unset.".strip()
        else:
            HfArgumentParser._parse_dataclass_field(parser, field)
            if field.default is True:  # HfArgumentParser's `--no_flag` repeats the flag's help
                negation = next(action for action in parser._actions if f"--no_{field.name}" in action.option_strings)
                negation.help = f"--{field.name} off."

    def error(self, message: str) -> NoReturn:
        """A bad flag: a SystemExit with one line (argparse would print the whole usage on every process), with, for
        each unknown flag, the one it is called by here (the paper's `--tau`), the commands that take it (a flag of
        another stage), or the flags close to it (a mistyped one)."""
        options = [option for action in self._actions for option in action.option_strings]
        hints = []
        for flag in re.findall(r"(--[\w-]+)", message.partition("unrecognized arguments:")[2]):
            meant = PAPER_WORDS.get(flag)
            owners = [name for name in _commands_taking(meant or flag) if f"gors {name}" != self.prog]
            elsewhere = ", ".join(f"gors {name}" for name in owners)
            if meant in options:
                hints.append(f"{flag} is {meant} here")
            elif meant and owners:
                hints.append(f"{flag} is {meant}, a flag of {elsewhere}")
            elif owners:  # a flag of another stage; a very close one of this command may be meant instead
                near = difflib.get_close_matches(flag, options, n=1, cutoff=0.8)
                hints.append(f"{flag} is a flag of {elsewhere}" + (f"; here, did you mean {near[0]}?" if near else ""))
            elif close := difflib.get_close_matches(flag, options, n=1):
                hints.append(f"did you mean {close[0]}?")
        hint = f"; {'; '.join(hints)}" if hints else ""
        raise SystemExit(f"{self.prog}: {message}{hint} (see {self.prog} --help)")


# Flags by the names the paper and the field give their values.
PAPER_WORDS = {"--tau": "--reward_threshold", "--k": "--images_per_prompt", "--lr": "--learning_rate",
               "--model_name_or_path": "--pretrained_model_name_or_path"}


def _commands_taking(flag: str) -> list[str]:
    """The `gors` commands whose config takes `flag` (`--name`) as a flag (not as a positional argument), for a flag
    given to another one."""
    name = flag.removeprefix("--")
    return [command for command, entry in COMMANDS.items()
            if name in {field.name for field in fields(_load(entry.config)) if not field.metadata.get("positional")}]


NONE_WORDS = ("none", "None", "null")  # what `--flag none` may spell for an optional field's None


def _unsettable(hint: Any) -> bool:
    """Whether a field's type is `int | None`, `float | None`, `str | None` or a list of one of them that may be
    None: `--flag none` unsets what a YAML file or a recipe set (the GenEval recipe's `--validation_benchmark`)."""
    args = get_args(hint)
    if type(None) not in args or len(args) != 2:
        return False
    other = next(arg for arg in args if arg is not type(None))
    if get_origin(other) is list:
        other = (get_args(other) or (None,))[0]
    return other in (int, float, str)


def _or_none(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text in NONE_WORDS else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its error message
    return parse


def _unset_lists(values: dict[str, Any]) -> dict[str, Any]:
    """`--timestep_range none` parses as [None]: None; a None among numbers is refused."""
    for name, value in values.items():
        if isinstance(value, list) and None in value:
            if value != [None]:
                raise SystemExit(f"error: --{name}: `none` unsets the field; give it alone, not among values")
            values[name] = None
    return values


def parse_config(cls: type[C], argv: Sequence[str] | None = None, defaults: dict[str, Any] | None = None,
                 prog: str | None = None) -> C:
    """Parse a config dataclass from flags and an optional `--config FILE.yaml`.

    Precedence: command-line flags > YAML file > `defaults` (e.g. a recipe's; a `Derived` one is computed
    from the values parsed) > the dataclass defaults.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if ("-h" in argv or "--help" in argv) and os.environ.get("LOCAL_RANK", "0") != "0":
        raise SystemExit(0)  # under a launcher each machine's first process prints the help, not every process
    # No abbreviations: `--conf FILE` would otherwise parse as --config without being read as one.
    parser = ConfigParser(cls, prog=prog, description=inspect.getdoc(cls), allow_abbrev=False)
    parser.add_argument("--config", default=None, help="YAML file of flag values (flags on the command line win).")
    merged = dict(defaults or {})
    config_file = _config_file(argv)
    counts = _flag_counts(parser, argv)
    given = {dest for dest, count in counts.items() if count}
    _refuse_repeated_lists(parser, counts)
    from_file: set[str] = set()
    if config_file is not None:
        try:  # one file may drive every stage: another stage's keys are left out (`config_file_values`)
            file_values = config_file_values(cls, _read_yaml(config_file, cls), config_file)
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None
        # A flag wins over the file's value: that value is not checked.
        from_file = set(file_values) - given
        merged |= _check_yaml_values({k: v for k, v in file_values.items() if k in from_file}, cls, config_file)
        given |= set(file_values)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise SystemExit(f"Unknown config keys {unknown} for {cls.__name__}; see --help for the valid names.")
    derived = {name: value for name, value in merged.items() if isinstance(value, Derived)}
    merged |= {name: value.shown for name, value in derived.items()}
    _given_elsewhere_optional(parser, merged)
    parser.set_defaults(**merged)
    for action in parser._actions:  # a negation's default, its dest's value, would read in --help as its own
        if any(option.startswith("--no_") for option in action.option_strings):
            action.default = SUPPRESS
    namespace = parser.parse_args(argv)
    values = _unset_lists({name: getattr(namespace, name) for name in known})
    values |= {name: value.compute(values) for name, value in derived.items() if name not in given}
    try:
        config = cls(**values)
        if hasattr(config, "check_given"):
            config.check_given(given)
    except ValueError as err:
        raise SystemExit(f"error: {err}{_file_source(str(err), from_file, config_file)}") from err
    return config


def _file_source(message: str, from_file: set[str], config_file: str | None) -> str:
    """Where the flags a refusal names came from when the YAML file, not the command line, set them: the user
    looks for them in the file."""
    named = [name for name in sorted(from_file) if re.search(rf"--(?:no_)?{re.escape(name)}(?![A-Za-z0-9_])", message)]
    return f" ({', '.join(f'--{name}' for name in named)} set in {config_file})" if named else ""


def _flag_counts(parser: ArgumentParser, argv: Sequence[str]) -> dict[str, int]:
    """How many times each field's flag (any spelling: `--name`, `--name=value`, `--no_name`) is on the command
    line, by field name."""
    counts: dict[str, int] = {}
    for action in parser._actions:
        count = sum(arg == option or arg.startswith(option + "=") for option in action.option_strings for arg in argv)
        counts[action.dest] = counts.get(action.dest, 0) + count
    return counts


def _refuse_repeated_lists(parser: ArgumentParser, counts: dict[str, int]) -> None:
    """A flag of several values given twice (`--validation_prompts a --validation_prompts b`; `counts`:
    `_flag_counts`): argparse would keep the last values alone, where the user meant them all."""
    for action in parser._actions:
        if action.option_strings and action.nargs in ("+", "*") and counts.get(action.dest, 0) > 1:
            raise SystemExit(f"error: --{action.dest} given {counts[action.dest]} times: give all its values after "
                             f"one --{action.dest} (e.g. --{action.dest} A B)")


def _config_file(argv: Sequence[str]) -> str | None:
    """The file that `--config FILE` or `--config=FILE` names (the last one wins, as for any flag)."""
    found = None
    for position, arg in enumerate(argv):
        if arg == "--config":
            if position + 1 >= len(argv) or argv[position + 1].startswith("--"):
                raise SystemExit("--config needs a YAML file path")
            found = argv[position + 1]
        elif arg.startswith("--config="):
            found = arg.removeprefix("--config=")
    return found


def _read_yaml(path: str, cls: type) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            values = load_yaml(handle)
    except FileNotFoundError:
        raise SystemExit(f"--config {path}: no such file") from None
    except (IsADirectoryError, PermissionError) as err:
        raise SystemExit(f"--config {path}: {(err.strerror or str(err)).lower()}; pass a YAML file you can read") from None
    except UnicodeDecodeError:
        raise SystemExit(f"--config {path}: not a UTF-8 text file; pass a YAML file") from None
    except yaml.YAMLError as err:
        raise SystemExit(f"--config {path}: YAML syntax error at {yaml_problem(err)}") from None
    if values is None:  # an empty file, or comments only
        return {}
    if not isinstance(values, dict):
        raise SystemExit(f"--config {path}: expected a mapping of {cls.__name__} fields, got {type(values).__name__}")
    keys = [key for key in values if not isinstance(key, str)]
    if keys:  # YAML 1.1 reads `on:`, `yes:` or `1:` as other values than text
        raise SystemExit(f"--config {path}: keys must be field names, got {', '.join(repr(key) for key in keys)}: "
                         "quote a key YAML reads as a boolean or number (e.g. 'on': ...)")
    return values


def _given_elsewhere_optional(parser: ArgumentParser, values: dict[str, Any]) -> None:
    """An argument the YAML file (or a recipe) gives, positional or a required flag (`gors push --repo_id`): the
    command line may leave it out."""
    for action in parser._actions:
        if action.dest in values:
            if not action.option_strings:
                action.nargs = "*" if action.nargs == "+" else "?"
            action.required = False


def _check_yaml_values(values: dict[str, Any], cls: type, path: str) -> dict[str, Any]:
    """The YAML file's values, each of its field's type: argparse converts only the flags typed on the
    command line, so `images_per_prompt: 2.5` or a string for a list would reach the config as they are."""
    hints = get_type_hints(cls)
    specs = {spec.name: spec for spec in fields(cls)}
    return {name: _yaml_value(value, hints[name], specs[name], path) if name in specs else value
            for name, value in values.items()}


def _yaml_value(value: Any, hint: Any, spec: Field, path: str) -> Any:
    """`value` of field `spec` (typed `hint`), checked; YAML 1.1's `no` (False) back to "no" for a
    string field that takes "no" (`mixed_precision: no`)."""
    where = f"--config {path}: {spec.name}: {value!r}"
    args = get_args(hint)
    if value is None:
        if type(None) in args or hint is Any:
            return None
        raise SystemExit(f"{where} (null) is not allowed: give a value or leave the key out")
    kind = next(arg for arg in args if arg is not type(None)) if get_origin(hint) in (Union, UnionType) else hint
    if get_origin(kind) is list:
        if not isinstance(value, list):
            raise SystemExit(f"{where} is not a list: use a YAML list, e.g. [{value!r}] or one '- item' per line")
        return [_yaml_scalar(item, get_args(kind)[0], spec, f"{where}, item {item!r}") for item in value]
    if get_origin(kind) is dict or kind is Any:
        return value  # a mapping (or its JSON text): the config's __post_init__ checks it
    return _yaml_scalar(value, kind, spec, where)


def _yaml_scalar(value: Any, kind: Any, spec: Field, where: str) -> Any:
    """`value` as field type `kind`. Number text is a number: PyYAML (YAML 1.1) reads `1e-4` (no dot)
    as the string '1e-4', and argparse would take it from the command line."""
    if kind in (int, float) and isinstance(value, str):
        value = _number_text(value, kind)
    if kind is str and isinstance(value, bool):
        takes_no = "no" in (spec.metadata.get("choices") or ()) or "'no'" in spec.metadata.get("help", "")
        if value is False and takes_no:
            return "no"
        choices = spec.metadata.get("choices")
        takes = (f"one of {', '.join(map(str, choices))}" if choices
                 else spec.metadata.get("help", "").split(". ")[0].rstrip("."))
        raise SystemExit(f"{where} reads as the YAML boolean {str(value).lower()} (YAML 1.1 reads yes, no, on and off "
                         f"so): quote the text you meant" + (f"; {spec.name}: {takes}" if takes else ""))
    if not of_kind(value, kind):
        raise SystemExit(f"{where} is not {KIND_WORDS[kind]}: give {KIND_WORDS[kind]}"
                         + (" (quote text)" if kind is str else "") + ", or leave the key out for its default")
    return float(value) if kind is float else value


def _number_text(text: str, kind: type) -> Any:
    """`text` as a `kind` (int or float) where it reads as one, else `text` unchanged (refused after)."""
    try:
        return kind(text)
    except ValueError:
        return text


def run_select(config: SelectConfig) -> None:
    """`gors select`: the main process writes the selection; every process waits for it."""
    from gors.core.distributed import process_state
    from gors.select import select

    state = process_state()
    select(config, write=state.is_main_process)
    state.wait_for_everyone()


def run_train(config: TrainConfig) -> None:
    """`gors train`: training on an Accelerator set up for it, its trackers closed at the end."""
    from gors.core.distributed import end_training
    from gors.select import load_selection
    from gors.train import train, training_accelerator

    load_selection(config.output_dir)  # a missing or damaged selection is named before the model is looked up
    accelerator = training_accelerator(config)
    train(config, accelerator)
    end_training(accelerator)


@dataclass
class RewardsConfig:
    """`gors rewards`: the registered rewards, their default models, score ranges and roles in the paper."""


def first_line(doc: str | None) -> str:
    """The first line of a docstring, for a listing; "" without one."""
    return (doc or "").strip().split("\n")[0]


def reward_table() -> list[dict[str, str]]:
    """One row per registered reward: name, default model, score range, categories, paper role, description."""
    import rewards
    from rewards.paper import METRIC_REWARD, UNBIASED_REWARD

    rows = []
    for name in rewards.available_rewards():
        role = [
            f"{kind}: {', '.join(c for c, r in table.items() if r == name)}"
            for kind, table in (("metric", METRIC_REWARD), ("unbiased", UNBIASED_REWARD))
            if name in table.values()
        ]
        try:
            cls = rewards.get_reward_class(name)
        except Exception as err:  # a plugin that fails to import, however, must not hide the others
            rows.append({"name": name, "model": "-", "range": "-", "categories": "-", "role": "; ".join(role) or "-",
                         "description": f"cannot be imported: {err}"})
            continue
        low, high = cls.score_range
        rows.append({
            "name": name, "model": cls.default_model or "-", "range": f"[{low:g}, {high:g}]",
            "categories": ", ".join(cls.categories) or "-", "role": "; ".join(role) or "-",
            "description": cls.description or first_line(cls.__doc__),
        })
    return rows


def print_listing(rows: list[dict[str, str]], columns: dict[str, str], footer: str) -> None:
    """Print `rows` as a table of `columns` (row key -> header), each row's description on a line under it,
    then `footer`."""
    from tabulate import tabulate

    header, *lines = tabulate([[row[key] for key in columns] for row in rows], headers=list(columns.values()),
                              tablefmt="plain", disable_numparse=True).splitlines()
    print(header)
    for line, row in zip(lines, rows):  # one line per row: no cell holds a line break
        print(line)
        print(f"    {row['description']}")
    print(f"\n{footer}")


def list_rewards(config: RewardsConfig) -> None:
    """Print the registered rewards (`gors rewards`), each with its description under it."""
    print_listing(reward_table(), {"name": "name", "model": "default model", "range": "range",
                                   "categories": "categories", "role": "paper's GORS reward for"},
                  "Use one with --reward NAME, mix them with --reward b_vqa:0.7,blip_clip:0.3, or pick the paper's "
                  "unbiased reward with --unbiased. Your own: @rewards.register_reward('name'), a 'gors.rewards' entry "
                  "point, or --reward my_module:MyReward.")


@dataclass
class BenchmarksConfig:
    """`gors benchmarks`: the registered benchmarks, their scorers, main metrics and subsets."""


def benchmark_table() -> list[dict[str, str]]:
    """One row per registered benchmark (gors' own, registered, installed): name, how a subset is named,
    scorer, main metric and its scale, description."""
    import evaluators

    rows = []
    for name in evaluators.available_benchmarks():
        try:
            cls = evaluators.benchmark_class(name)
        except Exception as err:  # a plugin that fails to import, however, must not hide the others
            rows.append({"name": name, "subset": "-", "scorer": "-", "metric": "-",
                         "description": f"cannot be imported: {err}"})
            continue
        metric = next(m for m in cls.metrics if m.key == cls.primary_metric)
        rows.append({"name": name, "subset": f"{name}:<{cls.subset_field}>" if cls.subset_field else "-",
                     # A scorer that depends on the subset (T2I-CompBench's category) is a property of the instance.
                     "scorer": cls.scorer if isinstance(cls.scorer, str) else "by subset",
                     "metric": f"{metric.key} {metric.scale}",
                     "description": first_line(cls.__doc__) + _fields_line(cls)})
    return rows


def _fields_line(cls: type) -> str:
    """The fields `--benchmark_options` sets on benchmark class `cls`, as a sentence ('' where none)."""
    from evaluators import option_fields

    fields_ = option_fields(cls)
    return f" Fields (--benchmark_options): {', '.join(fields_)}." if fields_ else ""


def list_benchmarks(config: BenchmarksConfig) -> None:
    """Print the registered benchmarks (`gors benchmarks`), each with its description under it."""
    print_listing(benchmark_table(), {"name": "name", "subset": "subset", "scorer": "scorer",
                                      "metric": "main metric"},
                  "Evaluate with gors evaluate --benchmarks NAME[:SUBSET],... (all: every T2I-CompBench category, "
                  "GenEval, GenEval 2, LPG-Bench), validate with --validation_benchmark NAME[:SUBSET]. Your own: "
                  "@evaluators.register_benchmark('name') or a 'gors.benchmarks' entry point (docs/extending.md).")


# Every stage keeps its finished work (images, score rows, checkpoints) and skips it when rerun.
INTERRUPTED = "interrupted; run the same command again to resume where it stopped"
TRAINING_INTERRUPTED = f"{INTERRUPTED} (finished images and scores are kept; training goes on from its last checkpoint)"


@dataclass(frozen=True)
class Command:
    """A `gors` subcommand: its config dataclass and the function run on the parsed config.

    Both are 'module:name' paths, imported only when the command runs, so that `gors --help` and
    each command load only what they use (the toy pretraining and LoRA conversion import torch).
    `locks`: the stages of `--output_dir` the command holds for its whole run (`run_folder_lock`);
    `gors run` takes its four in `run_stages`, which recipes share. `reads_run`: the command works on
    a run folder an earlier stage wrote, so a missing `--output_dir` (a typo) is refused before the
    lock would create it. `interrupted`: the error line of a Ctrl-C or SIGTERM.
    """

    config: str
    function: str
    help: str
    locks: tuple[str, ...] = ()
    reads_run: bool = False
    interrupted: str = INTERRUPTED
    defaults: str | None = None  # 'module:name' of a function giving the command's own defaults (`Derived` ones)


COMMANDS: dict[str, Command] = {
    "generate": Command("gors.config:GenerateConfig", "gors.generate:generate",
                        "k images per training prompt into the sample store", locks=("generate",),
                        defaults="gors.config:sampling_defaults"),
    # score rewrites the store's metadata files (its reward column), which generate appends to
    "score": Command("gors.config:ScoreConfig", "gors.score:score", "score every sample with a reward",
                     locks=("generate", "score"), reads_run=True),
    "select": Command("gors.config:SelectConfig", "gors.cli:run_select", "keep samples with reward > tau",
                      locks=("select",), reads_run=True),
    # train reads selection.jsonl on every process while it runs, which select rewrites
    "train": Command("gors.config:TrainConfig", "gors.cli:run_train",
                     "reward-weighted LoRA fine-tuning on the selection", locks=("select", "train"), reads_run=True,
                     interrupted=TRAINING_INTERRUPTED, defaults="gors.config:train_defaults"),
    "run": Command("gors.config:RunConfig", "gors.run:run", "generate, score, select and train in one go",
                   interrupted=TRAINING_INTERRUPTED, defaults="gors.config:sampling_defaults"),
    # evaluate locks its folder itself, once the benchmarks and the LoRA are checked (`EVALUATE_LOCKS`)
    "evaluate": Command("gors.config:EvaluateConfig", "gors.evaluate:evaluate",
                        "run benchmarks on a checkpoint, a LoRA or an image folder"),
    "rewards": Command("gors.cli:RewardsConfig", "gors.cli:list_rewards", "list the registered rewards"),
    "benchmarks": Command("gors.cli:BenchmarksConfig", "gors.cli:list_benchmarks", "list the registered benchmarks"),
    "estimate": Command("gors.estimate:EstimateConfig", "gors.estimate:estimate_command",
                        "GPU-hours of a full run (default: the paper's colour run) from a run's timings.json"),
    "report": Command("gors.report:ReportConfig", "gors.report:write_report",
                      "markdown table and plots of evaluation and training folders"),
    "status": Command("gors.status:StatusConfig", "gors.status:status",
                      "how far run folders have come, and what writes them now"),
    "push": Command("gors.push:PushConfig", "gors.push:push",
                    "a run's LoRA and a model card of how it was made -> the Hugging Face Hub", reads_run=True),
    "convert-lora": Command("gors.official_lora:ConvertLoraConfig", "gors.official_lora:convert",
                            "official GORS (lora_diffusion) checkpoint -> diffusers LoRA folder"),
    "convert-detector": Command("gors.convert_detector:ConvertDetectorConfig", "gors.convert_detector:convert",
                                "a benchmark's official detector checkpoint (GenEval: mmdetection Mask2Former) -> "
                                "transformers folder"),
    "questions": Command("gors.questions:QuestionsConfig", "gors.questions:questions_command",
                         "B-VQA questions of a prompt set -> a question table for questions=TABLE.json"),
    "toy pretrain": Command("gors.toy.pretrain:ToyPretrainConfig", "gors.toy.pretrain:pretrain_and_report",
                            "toy world: train the packaged toy model and its classifier from scratch",
                            interrupted="interrupted; --output_dir is as it was. The pretraining keeps no checkpoints: "
                                        "run the same command again to start it over"),
}


def command_config(name: str, argv: Sequence[str], prog: str) -> Any:
    """The config of command `name` (a key of `COMMANDS`) parsed from `argv`, over the command's own defaults."""
    command = COMMANDS[name]
    return parse_config(_load(command.config), argv, defaults=_load(command.defaults)() if command.defaults else None,
                        prog=prog)


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# `gors download COMMAND [flags]` takes another command's flags, so it is no entry of COMMANDS.
DOWNLOAD_HELP = "fetch what `gors COMMAND [flags]` loads, to run it offline: gors download COMMAND [flags]"


def usage() -> str:
    """`gors --help`: the subcommands and what each does."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    lines.append(f"  {'download':<{width}}  {DOWNLOAD_HELP}")
    return "usage: gors COMMAND [flags]  (gors COMMAND --help for its flags)\n\n" + "\n".join(lines)


def download_command(argv: Sequence[str]) -> None:
    """`gors download COMMAND [flags of COMMAND]` (`gors.download`)."""
    from gors.download import DOWNLOADABLE, download

    usage_line = (f"usage: gors download {{{','.join(DOWNLOADABLE)}}} [flags of that command]\n\n"
                  "Fetches the models and data files that command would load with those flags into the Hugging "
                  "Face and gors caches, so that it runs with HF_HUB_OFFLINE=1 where the caches are shared.")
    if argv and argv[0] in ("-h", "--help"):
        print(usage_line)
        return
    if not argv:
        raise SystemExit(f"gors download: give the command to download for\n{usage_line}")
    if argv[0] not in DOWNLOADABLE:
        raise SystemExit(f"gors download: it downloads for {', '.join(DOWNLOADABLE)}, not {argv[0]!r}\n{usage_line}")
    name = argv[0]
    download(name, command_config(name, argv[1:], f"gors download {name}"))


# What users cause and can fix from the message alone; anything else is a bug and keeps its traceback.
EXPECTED_ERRORS = (ValueError, FileNotFoundError, StoreError, LockError, ChecksumError, DownloadError, ModelLoadError,
                   PathError)
# The same, of modules that import torch ('module:Class'), named here so that `gors --help` imports none of
# them: such an error can only have been raised once its module was imported. `RewardError`: a user's
# reward returned a score out of range, no score or details that are not JSON. `DeviceMemoryError`: a stage
# ran out of device memory, and its message names the flag that lowers it.
LAZY_EXPECTED_ERRORS = ("gors.core.scoring:RewardError", "gors.core.memory:DeviceMemoryError")


# How long a failing process other than the main one waits before it reports: when the main process
# meets the same error, it says it, exits, and the launcher stops this process before it would repeat it.
# 3 s was too short on 2 busy cores (the launcher took longer to stop it); an error of this process
# alone is reported this much later.
REPORT_GRACE_S = 10.0


def _process_index() -> int:
    # Not imported here: a Ctrl-C during a first import of accelerate would meet it half-imported.
    # Not yet imported, it has set up no process group either.
    accelerate = sys.modules.get("accelerate")
    state = getattr(accelerate, "PartialState", None)
    if state is not None and state._shared_state:  # the process group is up: it knows
        return state().process_index
    return int(os.environ.get("RANK", "0"))  # before it: what the launcher said


def _expected_types() -> tuple[type[BaseException], ...]:
    """`EXPECTED_ERRORS` and those of `LAZY_EXPECTED_ERRORS` whose module is imported."""
    lazy = (getattr(sys.modules.get(module), name, None)
            for module, _, name in (path.partition(":") for path in LAZY_EXPECTED_ERRORS))
    return EXPECTED_ERRORS + tuple(cls for cls in lazy if cls is not None)


# Filesystem errors that no flag causes and that the user fixes outside gors; every stage writes atomically
# and resumes, so the same command goes on once they are fixed.
DISK_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}


# torch.save's zip writer reports a write that failed (a full disk, a quota) only as errors of its own.
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed", "unexpected pos")


def _disk_problem(err: BaseException) -> str | None:
    """The one-line message for a full, over-quota or read-only filesystem met while writing, or a file or
    folder this user may not access (e.g. part of a run folder made read-only), else None.
    Libraries that write through their own code (safetensors) report ENOSPC only in their message."""
    failed_write = next((str(e).splitlines()[0] for e in (err, err.__context__) if isinstance(e, RuntimeError)
                         and any(text in str(e) for text in TORCH_WRITE_FAILURES)), None)
    if failed_write is not None:
        return (f"a file could not be written whole (torch.save: {failed_write}): the disk is probably full or over "
                "quota; free some space and run the same command again; what was finished is kept (each file is "
                "written whole or not at all)")
    # The error itself, or the one it was raised from (overlapped scoring re-raises its thread's with context).
    failed = next((e for e in (err, err.__cause__) if isinstance(e, OSError) and e.errno in DISK_ERRNOS), None)
    if failed is not None:
        code = failed.errno
        where = f" {'on' if code == errno.EACCES else 'writing'} {failed.filename}" if failed.filename else ""
    elif "No space left on device" in str(err):
        code, where = errno.ENOSPC, ""
    else:
        return None
    if code == errno.EROFS:
        return f"{DISK_ERRNOS[code]}{where}: pass a folder on a filesystem you can write to"
    if code == errno.EACCES:
        return (f"{DISK_ERRNOS[code]}{where}: give this user access to it (chmod, chown) and run the same command "
                "again, or use another folder; what was finished is kept")
    return (f"{DISK_ERRNOS[code]}{where}: free some space and run the same command again; what was finished is kept "
            "(each file is written whole or not at all)")


# How gloo reports, in the processes waiting in a collective, that another process of the launch has exited
# (its transport's source file, then the cause).
PEER_LOST = re.compile(r"gloo/transport/.*Connection (?:closed|reset) by peer")


def _peer_lost(err: BaseException) -> str | None:
    """The one-line message for a collective that failed because another process of a multi-process launch
    stopped (its own error line, or the launcher's report of its exit, says why), else None. Only gloo's own
    error: a download's "connection reset by peer" is another matter."""
    collective = type(err) is RuntimeError or any(cls.__name__.startswith("Dist") for cls in type(err).__mro__)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not collective or not PEER_LOST.search(str(err)):
        return None
    return ("another process of this launch stopped while this one waited for it: its error (above), or the "
            "launcher's report of its exit, says why")


def _open_bars() -> list[Any]:
    """The tqdm bars open now (a bar redraws its line with "\r" and ends it only when it closes); none
    when tqdm is not imported (`gors --help` stays light)."""
    bar = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    return list(getattr(bar, "_instances", ()))


def _fail(message: str, bars_before: set[int] = frozenset()) -> NoReturn:
    """Print `error: message` and exit 2. On a line of its own, so that `grep ^error` finds it: after a
    newline when stderr is a terminal or a bar this command opened (not one of `bars_before`) is
    still open, which leaves a log file mid-line too."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a launcher stopping this process now ends it silently
    index = _process_index()
    if index != 0:
        time.sleep(REPORT_GRACE_S)
        message = f"process {index}: {message}"  # still running: the error is this process's own
    # This command's bars, closed first: a bar closed later (as the stack unwinds) would redraw its line
    # below the error, which must be the last line.
    own = [bar for bar in _open_bars() if id(bar) not in bars_before]
    for instance in own:
        instance.close()
    start = "\n" if sys.stderr.isatty() or own else ""  # a bar closed without leaving its line ends mid-line
    print(f"{start}error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


@contextmanager
def expected_errors(interrupted: str = INTERRUPTED) -> Iterator[None]:
    """End an expected error (`EXPECTED_ERRORS`, a SystemExit with a message, Ctrl-C: `interrupted`) with one
    line `error: <message>` on stderr and exit status 2, without a traceback: one line per launch, from the
    main process (another process speaks only if the main one has not stopped within `REPORT_GRACE_S`; of
    Ctrl-C, which the launcher passes to every process, never).

    `GORS_TRACEBACK=1` lets them through with their traceback, for debugging.
    """
    if os.environ.get("GORS_TRACEBACK") == "1":
        yield
        return
    bars = {id(bar) for bar in _open_bars()}  # open before the command (another command's in this process): not its own
    restore_sigterm = _interrupt_on_sigterm()
    try:
        yield
    except KeyboardInterrupt:
        if _process_index() != 0:  # a launcher passes Ctrl-C to every process: the main one says it for the launch
            raise SystemExit(2) from None
        _fail(interrupted, bars)
    except Exception as err:
        known = _disk_problem(err) or _peer_lost(err)
        if known is not None:
            _fail(known, bars)
        if not isinstance(err, _expected_types()):
            raise
        _fail(str(err), bars)
    except SystemExit as err:
        if isinstance(err.code, str):  # SystemExit("message"), which Python would print on every process
            _fail(err.code.removeprefix("error: "), bars)
        raise
    finally:
        restore_sigterm()


def _interrupt_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM (`kill`, `timeout`, Slurm's `scancel` and its time limit) stop a single-process
    command as Ctrl-C does, with its `error: interrupted` line, instead of silently; returns what undoes
    it. Not under a multi-process launch, whose launcher sends SIGTERM to the other processes when one
    fails: they end silently, leaving that one's error as the launch's message. Nor off the main thread."""
    if threading.current_thread() is not threading.main_thread() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return lambda: None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def quiet_dependency_warnings() -> None:
    """Silence the dependencies' warnings that say nothing to a gors user, once per command."""
    # diffusers' load_config passes huggingface_hub >= 1.0 an argument it ignores, for every Hub model.
    warnings.filterwarnings("ignore", message="The `local_dir_use_symlinks` argument is deprecated",
                            category=UserWarning)


def main(argv: Sequence[str] | None = None) -> None:
    """`gors COMMAND [flags]`: parse the command's config and run its function on it."""
    quiet_dependency_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] == "--version":
        from importlib.metadata import version

        print(f"gors {version('gors')}")
        return
    try:
        _run(argv)
        sys.stdout.flush()  # a reader that has gone is met here rather than at the interpreter's exit
    except BrokenPipeError:  # `gors rewards | head`: the rest of the output is not wanted
        _silence_stdout()
        raise SystemExit(1) from None


def _silence_stdout() -> None:
    """Point stdout at the null device: the interpreter's last flush at exit would fail on the closed pipe."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (io.UnsupportedOperation is a ValueError)
        pass


def _run(argv: list[str]) -> None:
    """The command `argv` names, run on its parsed config."""
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in COMMANDS else argv[0]  # two words: `gors toy pretrain`
    command = COMMANDS.get(name)
    with expected_errors(command.interrupted if command else INTERRUPTED):
        if argv[0] == "download":
            download_command(argv[1:])
            return
        if command is None:
            words = [other for other in COMMANDS if other.startswith(f"{argv[0]} ")]
            if words and argv[1:2] in (["-h"], ["--help"]):  # the first word of a two-word command
                print("\n".join([f"usage: gors {argv[0]} SUBCOMMAND [flags]", "", "subcommands:",
                                  *(f"  {word.split()[1]:<12} {COMMANDS[word].help}" for word in words)]))
                return
            if words:
                subcommands = ", ".join(f"gors {word}" for word in words)
                raise SystemExit(f"gors {argv[0]}: unknown subcommand {argv[1]!r}; give one of {subcommands}"
                                 if argv[1:] else f"gors {argv[0]}: give its subcommand: {subcommands}")
            close = difflib.get_close_matches(argv[0], sorted({other.split()[0] for other in COMMANDS}), n=1)
            meant = f"; did you mean gors {close[0]}?" if close else ""
            raise SystemExit(f"gors: unknown command {argv[0]!r}{meant}\n{usage()}")
        config = command_config(name, argv[len(name.split()):], f"gors {name}")
        if command.reads_run:
            check_run_folder(config.output_dir, f"gors {name}")
        locked = run_folder_lock(config.output_dir, command.locks, f"gors {name}") if command.locks else nullcontext()
        with locked:
            _load(command.function)(config)


if __name__ == "__main__":
    main()
