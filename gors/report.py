"""`gors report OUT_DIR [OUT_DIR ...]`: a markdown table of checkpoints x benchmarks, and plots.

Each OUT_DIR is a `gors evaluate` output folder (its `summary.json`) and/or a training run folder
(its TensorBoard logs under `logs/`). The report holds:

- `report.md`: one row per evaluated folder and one column per benchmark (its main metric), with
  the published SD-2-base and GORS numbers beside them where the paper gives them;
- `benchmarks.png`: grouped bars of the same table;
- `training_curves.png`: the training loss and every validation metric over steps, per run;
- for online runs (`--rounds`, their `rounds.json`): a table of each round (the mean reward of its
  samples, the share selected, the validation metrics at its last step) and `rounds.png`, the
  reward and the validation metrics against the round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from gors.core.io import atomic_write_bytes, make_folder, read_json
from gors.core.paper import PUBLISHED


def load_evaluation(folder: Path) -> dict[str, float] | None:
    """Benchmark label -> main metric value from a `gors evaluate` folder; None when it has no summary."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    data = read_json(path, "the summary.json of `gors evaluate`")
    if not isinstance(data, dict) or "summaries" not in data:
        raise ValueError(f"{path} is not a `gors evaluate` summary (no 'summaries' list)")
    return {
        s["label"]: float(s[s["primary_metric"]]) for s in data["summaries"] if s.get(s["primary_metric"]) is not None
    }


def load_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the TensorBoard logs under `folder/logs`: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, list[tuple[int, float]]] = {}
    for events in sorted((folder / "logs").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            series.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return {tag: sorted(points) for tag, points in series.items()}


def round_rows(folder: Path, scalars: dict[str, list[tuple[int, float]]]) -> list[dict[str, float]]:
    """One row per finished round of an online run: its `rounds.json` entry and every validation
    metric logged at the round's last step; [] for a one-round run."""
    path = folder / "rounds.json"
    if not path.is_file():
        return []
    rows = []
    record = read_json(path, "the rounds.json of an online `gors run`")
    if not isinstance(record, dict) or not isinstance(record.get("rounds"), list):
        raise ValueError(f"{path}: not a rounds file (no 'rounds' list); expected the rounds.json of an online run")
    for entry in record["rounds"]:
        row = {key: entry[key] for key in ("round", "mean_reward", "selected_fraction", "mean_reward_selected",
                                           "num_replayed", "last_step")}
        for tag, points in scalars.items():
            if tag.startswith("validation/"):
                row |= {tag: value for step, value in points if step == entry["last_step"]}
        rows.append(row)
    return rows


def _plot_rounds(runs: dict[str, list[dict[str, float]]], path: Path) -> None:
    tags = ["mean_reward", "mean_reward_selected"] + sorted(
        {t for rows in runs.values() for row in rows for t in row if t.startswith("validation/")})
    _plot_lines({tag: {name: [(row["round"], row[tag]) for row in rows if tag in row] for name, rows in runs.items()}
                 for tag in tags}, "round", path)


def _plot_lines(panels: dict[str, dict[str, list[tuple[float, float]]]], x_label: str, path: Path) -> None:
    """One panel per title, one line per run name: (x, y) points against `x_label`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(panels), 1, figsize=(7.0, 2.6 * len(panels)), squeeze=False)
    for axis, (title, lines) in zip(axes[:, 0], panels.items()):
        for name, points in lines.items():
            if points:
                xs, ys = zip(*points)
                axis.plot(xs, ys, marker="." if len(xs) < 30 else None, label=name)
        axis.set_title(title, fontsize="small")
        axis.set_xlabel(x_label)
        axis.legend(fontsize="x-small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def markdown_table(rows: dict[str, dict[str, float]], with_published: bool = True) -> str:
    """Checkpoints x benchmarks; published rows (in italics) for the benchmarks that appear."""
    columns = sorted({label for values in rows.values() for label in values})
    table = dict(rows)
    if with_published:
        for name, values in PUBLISHED.items():
            shown = {label: v for label, v in values.items() if label in columns}
            if shown:
                table[f"*{name}*"] = shown
    body = [[name, *(values.get(c) for c in columns)] for name, values in table.items()]
    return tabulate(body, headers=["checkpoint", *columns], tablefmt="github", floatfmt=".4f", missingval="-")


def _plot_bars(rows: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns = sorted({label for values in rows.values() for label in values})
    width = 0.8 / max(len(rows), 1)
    figure, axis = plt.subplots(figsize=(max(6.0, 1.2 * len(columns)), 4.0))
    for k, (name, values) in enumerate(rows.items()):
        axis.bar(np.arange(len(columns)) + k * width, [values.get(c, np.nan) for c in columns], width, label=name)
    axis.set_xticks(np.arange(len(columns)) + width * (len(rows) - 1) / 2, columns, rotation=30, ha="right")
    axis.set_ylabel("main metric")
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_curves(runs: dict[str, dict[str, list[tuple[int, float]]]], path: Path) -> None:
    tags = sorted({t for series in runs.values() for t in series if t == "train/loss" or t.startswith("validation/")})
    _plot_lines({tag: {name: series.get(tag, []) for name, series in runs.items()} for tag in tags}, "step", path)


def labels(folders: Sequence[Path]) -> list[str]:
    """A name per folder for tables and legends: the shortest tail of its path that no other folder
    shares (`runA/eval` and `runB/eval` stay apart); a folder given twice is an error."""
    parts = [folder.resolve().parts for folder in folders]
    if len(set(parts)) < len(parts):
        raise ValueError(f"a folder is given twice: {' '.join(map(str, folders))}")
    names = []
    for mine in parts:
        depth = 1
        while depth < len(mine) and sum(other[-depth:] == mine[-depth:] for other in parts) > 1:
            depth += 1
        names.append("/".join(mine[-depth:]))
    return names


def report(folders: Sequence[str | Path], output_dir: str | Path = "report") -> Path:
    """Write report.md (+ PNGs) for the given evaluation and run folders; returns report.md's path."""
    output_dir = Path(output_dir)
    evaluations: dict[str, dict[str, float]] = {}
    runs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    rounds: dict[str, list[dict[str, float]]] = {}
    paths = [Path(folder) for folder in folders]
    for folder, name in zip(paths, labels(paths)):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder (give `gors evaluate` or training output folders)")
        evaluation = load_evaluation(folder)
        if evaluation:
            evaluations[name] = evaluation
        if (folder / "logs").is_dir():
            scalars = load_scalars(folder)
            if scalars:
                runs[name] = scalars
        if round_rows(folder, runs.get(name, {})):
            rounds[name] = round_rows(folder, runs.get(name, {}))
        if evaluation is None and name not in runs:
            raise ValueError(f"{folder} has neither a summary.json from `gors evaluate` nor TensorBoard logs")
    make_folder(output_dir, "--output_dir")
    parts = ["# gors report", ""]
    if evaluations:
        parts += ["## Benchmarks (main metric of each; published numbers in italics)", "",
                  markdown_table(evaluations), "", "![benchmarks](benchmarks.png)", ""]
        _plot_bars(evaluations, output_dir / "benchmarks.png")
    if runs:
        parts += ["## Training", "", "![training curves](training_curves.png)", ""]
        _plot_curves(runs, output_dir / "training_curves.png")
    if rounds:
        parts += ["## Rounds", ""]
        for name, rows in rounds.items():
            columns = list(dict.fromkeys(key for row in rows for key in row))
            parts += [f"### {name}", "", tabulate([[row.get(c) for c in columns] for row in rows], headers=columns,
                                                    tablefmt="github", floatfmt=".4f", missingval="-"), ""]
        parts += ["![rounds](rounds.png)", ""]
        _plot_rounds(rounds, output_dir / "rounds.png")
    path = output_dir / "report.md"
    atomic_write_bytes(path, "\n".join(parts).encode("utf-8"))
    return path


@dataclass
class ReportConfig:
    """`gors report OUT_DIR [OUT_DIR ...]`: a markdown table of checkpoints x benchmarks, and plots."""

    folders: list[str] = field(
        metadata={"positional": True, "help": "`gors evaluate` output folders and/or training run folders"}
    )
    output_dir: str = field(default="report", metadata={"help": "Where report.md and the PNGs go."})

    def __post_init__(self) -> None:
        if not self.output_dir.strip():
            raise ValueError("--output_dir='': give the folder the report goes to, e.g. --output_dir report")


def write_report(config: ReportConfig) -> None:
    """`gors report`: write the report and say where it is."""
    print(f"[report] wrote {report(config.folders, config.output_dir)}")
