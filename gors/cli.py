"""The `gors` command: one subcommand per stage, `run` for all four, `rewards` to list rewards.

Every stage takes its config's flags, or `--config FILE.yaml` whose keys are the same names
(flags given on the command line override the file). Run any stage under
`accelerate launch -m gors.cli <stage> ...` (or `accelerate launch $(which gors) ...`) to use
several processes.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from typing import Any, Callable, Sequence, TypeVar

import yaml
from transformers import HfArgumentParser

from gors.config import (
    EvaluateConfig,
    GenerateConfig,
    RunConfig,
    ScoreConfig,
    SelectConfig,
    TrainConfig,
)

C = TypeVar("C")


def parse_config(cls: type[C], argv: Sequence[str] | None = None, defaults: dict[str, Any] | None = None,
                 prog: str | None = None) -> C:
    """Parse a config dataclass from flags and an optional `--config FILE.yaml`.

    Precedence: command-line flags > YAML file > `defaults` (e.g. a recipe's) > the dataclass defaults.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(cls, prog=prog)
    parser.add_argument("--config", default=None, help="YAML file of flag values (flags on the command line win).")
    merged = dict(defaults or {})
    if "--config" in argv:
        position = argv.index("--config")
        if position + 1 >= len(argv):
            raise SystemExit("--config needs a YAML file path")
        merged |= _read_yaml(argv[position + 1], cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise SystemExit(f"Unknown config keys {unknown} for {cls.__name__}; see --help for the valid names.")
    parser.set_defaults(**merged)
    namespace = parser.parse_args(argv)
    values = {name: getattr(namespace, name) for name in known}
    try:
        return cls(**values)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from err


def _read_yaml(path: str, cls: type) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            values = yaml.safe_load(handle) or {}
    except FileNotFoundError:
        raise SystemExit(f"--config {path}: no such file") from None
    if not isinstance(values, dict):
        raise SystemExit(f"--config {path}: expected a mapping of {cls.__name__} fields, got {type(values).__name__}")
    return values


def _run(config: RunConfig) -> None:
    from gors.run import run

    run(config)


def _generate(config: GenerateConfig) -> None:
    from gors.generate import generate

    generate(config)


def _score(config: ScoreConfig) -> None:
    from gors.score import score

    score(config)


def _select(config: SelectConfig) -> None:
    from gors.core.distributed import process_state
    from gors.select import select

    state = process_state()
    select(config, write=state.is_main_process)
    state.wait_for_everyone()


def _train(config: TrainConfig) -> None:
    from gors.train import train, training_accelerator

    accelerator = training_accelerator(config)
    train(config, accelerator)
    accelerator.end_training()


def _evaluate(config: EvaluateConfig) -> None:
    from gors.evaluate import evaluate

    evaluate(config)


def _toy(argv: list[str]) -> None:
    """`gors toy pretrain [flags]`: train the packaged toy model and classifier from scratch."""
    from gors.toy.pretrain import ToyPretrainConfig, pretrain

    if not argv or argv[0] != "pretrain":
        raise SystemExit("usage: gors toy pretrain [--output_dir DIR] [--seed N] ... (gors toy pretrain --help)")
    config = parse_config(ToyPretrainConfig, argv[1:], prog="gors toy pretrain")
    print(f"[toy pretrain] wrote {pretrain(config)}")


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
        except (ImportError, ValueError) as err:  # a plugin that fails to import must not hide the others
            rows.append({"name": name, "model": "-", "range": "-", "categories": "-", "role": "; ".join(role) or "-",
                         "description": f"cannot be imported: {err}"})
            continue
        low, high = cls.score_range
        rows.append({
            "name": name, "model": cls.default_model or "-", "range": f"[{low:g}, {high:g}]",
            "categories": ", ".join(cls.categories) or "-", "role": "; ".join(role) or "-",
            "description": cls.description or (cls.__doc__ or "").strip().split("\n")[0],
        })
    return rows


def list_rewards() -> None:
    """Print the registered rewards (`gors rewards`)."""
    rows = reward_table()
    columns = [("name", "name"), ("model", "default model"), ("range", "range"), ("categories", "categories"),
               ("role", "paper's GORS reward for")]
    widths = {key: max(len(title), *(len(row[key]) for row in rows)) for key, title in columns}
    print("  ".join(f"{title:<{widths[key]}}" for key, title in columns))
    for row in rows:
        print("  ".join(f"{row[key]:<{widths[key]}}" for key, _ in columns))
        print(f"    {row['description']}")
    print("\nUse one with --reward NAME, mix them with --reward b_vqa:0.7,blip_clip:0.3, or pick the paper's unbiased "
          "reward with --unbiased. Your own: @rewards.register_reward('name'), a 'gors.rewards' entry point, or "
          "--reward my_module:MyReward.")


COMMANDS: dict[str, tuple[type, Callable[[Any], None], str]] = {
    "generate": (GenerateConfig, _generate, "k images per training prompt into the sample store"),
    "score": (ScoreConfig, _score, "score every sample with a reward"),
    "select": (SelectConfig, _select, "keep samples with reward > tau"),
    "train": (TrainConfig, _train, "reward-weighted LoRA fine-tuning on the selection"),
    "run": (RunConfig, _run, "generate, score, select and train in one go"),
    "evaluate": (EvaluateConfig, _evaluate, "run benchmarks on a checkpoint, a LoRA or an image folder"),
}


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = ",".join([*COMMANDS, "rewards", "report", "convert-lora", "toy"])
    usage = "usage: gors {" + names + "} [flags]  (gors COMMAND --help for its flags)\n\n"
    usage += "\n".join(f"  {name:<9} {help_}" for name, (_, _, help_) in COMMANDS.items())
    usage += "\n  rewards   list the registered rewards"
    usage += "\n  report    markdown table and plots of evaluation and training folders"
    usage += "\n  convert-lora  official GORS (lora_diffusion) checkpoint -> diffusers LoRA folder"
    usage += "\n  toy       toy world: `gors toy pretrain` trains the packaged toy model"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return
    command, rest = argv[0], argv[1:]
    if command == "rewards":
        list_rewards()
        return
    if command == "toy":
        _toy(rest)
        return
    if command == "report":
        from gors.report import main as report_main

        report_main(rest)
        return
    if command == "convert-lora":
        from gors.official_lora import main as convert_main

        convert_main(rest)
        return
    if command not in COMMANDS:
        raise SystemExit(f"gors: unknown command {command!r}\n{usage}")
    cls, function, _ = COMMANDS[command]
    function(parse_config(cls, rest, prog=f"gors {command}"))


if __name__ == "__main__":
    main()
