"""`gors report OUT_DIR [OUT_DIR ...]`: a markdown table of checkpoints x benchmarks, and plots.

Each OUT_DIR is a `gors evaluate` output folder (its `summary.json`) and/or a training run folder
(its TensorBoard logs under `logs/`). The report holds:

- `report.md`: one row per evaluated folder and one column per benchmark (its main metric), with
  the published SD-2-base and GORS numbers beside them where the paper gives them;
- `benchmarks.png`: grouped bars of the same table;
- `training_curves.png`: the training loss and every validation metric over steps, per run (one
  point per step: a resumed run's repeated steps keep the latest event); a run whose logs hold
  neither is named as such, without a plot;
- for online runs (`--rounds`, their `rounds.json`, with or without logs): a table of each round
  (the mean reward of its samples, the share selected, the validation metrics at its last step)
  and `rounds.png`, the reward and the validation metrics against the round.

PNGs are written atomically, and those of an earlier report in the folder that this one does not
write are removed.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from evaluators.results import UNIT_SCALE, metric_value
from gors.config import check_values
from gors.core.io import atomic_write_bytes, is_json_number, make_folder, not_a_folder, read_json
from gors.core.paper import PUBLISHED, PUBLISHED_PROMPTS
from gors.core.scoring import SOURCES_SETTING


def read_summaries(folder: Path) -> list[Any] | None:
    """The summaries of a `gors evaluate` folder's summary.json, each with the `lora_dropout` the file records
    once for all of them (the LoRA's samples were drawn with it); of one benchmark's folder (its own
    summary.json, as the toy demo's `eval_base/` has), that summary with the label and main metric its
    benchmark gives it. None when the folder holds no summary.json."""
    return [summary for summary, _ in summary_folders(folder)] if (folder / "summary.json").is_file() else None


def summary_folders(folder: Path) -> list[tuple[Any, Path]]:
    """(summary, the folder of its benchmark's images and scores) of each benchmark of a `gors evaluate` folder
    (`<folder>/<name>[/<subset>]`), or of one benchmark's own folder; [] without a summary.json."""
    path = folder / "summary.json"
    if not path.is_file():
        return []
    data = read_json(path, "the summary.json of `gors evaluate`")
    if isinstance(data, dict) and "benchmark" in data and "summaries" not in data:
        return [(_benchmark_entry(data, path), folder)]
    if not isinstance(data, dict) or not isinstance(data.get("summaries"), list):
        raise ValueError(f"{path} is not a `gors evaluate` summary (no 'summaries' list)")
    shared = {"lora_dropout": data["lora_dropout"]} if "lora_dropout" in data else {}
    found = []
    for summary in data["summaries"]:
        label = summary.get("label") if isinstance(summary, dict) else None
        name, _, subset = label.partition(":") if isinstance(label, str) else ("", "", "")
        found.append(({**shared, **summary} if isinstance(summary, dict) else summary, folder / name / subset))
    return found


def _benchmark_entry(summary: dict[str, Any], path: Path) -> dict[str, Any]:
    """One benchmark's summary as an entry of a `gors evaluate` summary: the label and main metric its benchmark
    (registered here) gives it."""
    from evaluators import available_benchmarks, benchmark_class, benchmark_label

    name = summary["benchmark"]
    if name not in available_benchmarks():
        raise ValueError(f"{path} is a summary of benchmark {name!r}, which is not known here; give the folder of "
                         "`gors evaluate` above it, whose summary.json names each benchmark's label")
    cls = benchmark_class(name)
    subset = summary.get(cls.subset_field) if cls.subset_field else None
    return {"label": benchmark_label(name, subset), "primary_metric": cls.primary_metric, **summary}


def column_scale(summary: dict[str, Any]) -> str:
    """The scale of a summary's main metric: as its results block records it, else as its benchmark declares it
    (summaries written before the block), else a top-level `scale`, else [0, 1]."""
    primary = summary["primary_metric"]
    recorded = (((summary.get("results") or {}).get("metrics") or {}).get(primary) or {}).get("scale")
    if recorded is not None:
        return recorded
    from evaluators import available_benchmarks, benchmark_class

    benchmark = str(summary.get("label", "")).split(":")[0]
    if benchmark in available_benchmarks():
        declared = [metric.scale for metric in benchmark_class(benchmark).metrics if metric.key == primary]
        if declared:
            return declared[0]
    return summary.get("scale") or UNIT_SCALE


def column_name(summary: dict[str, Any]) -> str:
    """A benchmark's report column: its label, with the scale of its main metric where that is not [0, 1]
    (GenEval 2's x100), so that values of two scales never share a column unsaid."""
    scale = column_scale(summary)
    return summary["label"] if scale == UNIT_SCALE else f"{summary['label']} ({scale})"


# What a benchmark's values were measured with, beyond the checkpoint: two checkpoints' values compare exactly
# only where all of these are one (`protocol_notes`).
PROTOCOL_KEYS = ("prompts", "images per prompt", "prompt set", "judge", "judge models", "scorer", "questions",
                 "sampling", "LoRA dropout")
# Shown by name only under the table (their values are long settings).
UNSHOWN_VALUES = ("prompt set", "judge models", "scorer", "questions", "sampling")
# The recorded sampling settings that change the images (not the batch size, the paths, the further columns'
# options); images made elsewhere (`--images`) record none of them, and are not compared on them.
SAMPLING_KEYS = ("num_inference_steps", "guidance_scale", "resolution", "seed", "seed_rule", "dtype")


def evaluation_protocols(summaries: list[Any]) -> dict[str, dict[str, Any]]:
    """Report column -> what its value was measured with (`PROTOCOL_KEYS`), from a `gors evaluate` folder's
    summaries; a key the summary does not record is left out."""
    protocols = {}
    for summary in summaries:
        if not isinstance(summary, dict) or not isinstance(summary.get("label"), str):
            continue
        results = summary.get("results") or {}
        samples, data, config = results.get("samples") or {}, results.get("data") or {}, results.get("config") or {}
        generated = config.get("images") != "external"
        sampling = {key: config[key] for key in SAMPLING_KEYS if key in config} if generated else {}
        # The dropout of a LoRA's own samples (0: none); nothing for a base model or images made elsewhere.
        dropout = float(summary.get("lora_dropout") or 0.0) if generated and summary.get("lora") else None
        recorded = {"prompts": samples.get("prompts"), "images per prompt": samples.get("images_per_prompt"),
                    "prompt set": data.get("prompts_sha256"), "judge": summary.get("metric"),
                    # The judges a benchmark's fields name, which summaries recorded before `scorer` hold too.
                    "judge models": {key: value for key, value in config.items()
                                     if key.endswith("model_name_or_path")} or None,
                    "scorer": _scorer(results.get("scorer")), "questions": _question_sources(summary),
                    "sampling": sampling or None, "LoRA dropout": dropout}
        protocols[column_name(summary)] = {key: value for key, value in recorded.items() if value is not None}
    return protocols


def _scorer(recorded: Any) -> dict[str, Any] | None:
    """A summary's `results.scorer` as compared: scoring versions all 1 when none are recorded (`versioned`
    leaves them out), without the question table's path (`questions` compares the tables' contents) and
    without a plugin reward's source hash (an edited comment changes it, not the scores)."""
    if not isinstance(recorded, dict):
        return None
    options = {key: value for key, value in (recorded.get("options") or {}).items() if key != "questions"}
    kept = {key: value for key, value in recorded.items() if key != SOURCES_SETTING}  # informational: a comment edit
    return {**kept, "options": options, "scoring_versions": recorded.get("scoring_versions") or {}}


def _question_sources(summary: dict[str, Any]) -> list[Any] | None:
    """Which parsers or question tables made T2I-CompBench's B-VQA questions and 3-in-1's terms (summary.json's
    `questions`, `term_parsers`), without their image counts; None where none are recorded."""
    sources = [{key: value for key, value in entry.items() if key != "images"}
               for entry in [*(summary.get("questions") or []), *(summary.get("term_parsers") or [])]
               if isinstance(entry, dict)]
    return sorted(sources, key=lambda entry: json.dumps(entry, sort_keys=True)) or None


def _differ(values: list[Any]) -> bool:
    """Whether recorded values differ; settings (dicts) on the keys all of them record (an older gors recorded
    fewer)."""
    if values and all(isinstance(value, dict) for value in values):
        common = set.intersection(*(set(value) for value in values))
        values = [{key: value[key] for key in common} for value in values]
    return len({json.dumps(value, sort_keys=True) for value in values}) > 1


def protocol_notes(protocols: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """A line per report column whose checkpoints (name -> column -> `evaluation_protocols`) were measured
    otherwise: other prompts, images per prompt, prompt set, judge or judge models, scorer (reward, options,
    dtype, versions), question parsers, sampling settings or the dropout of a LoRA's samples."""
    notes = []
    for column in sorted({column for measured in protocols.values() for column in measured}):
        measured = {name: each[column] for name, each in protocols.items() if column in each}
        differing = [key for key in PROTOCOL_KEYS if _differ([each[key] for each in measured.values() if key in each])]
        if differing:
            shown = [key if key in UNSHOWN_VALUES else
                     f"{key}: " + ", ".join(f"{name} {each.get(key, '-')}" for name, each in measured.items())
                     for key in differing]
            notes.append(f"note: {column} was measured otherwise for these checkpoints ({'; '.join(shown)}): those "
                         "values do not compare exactly")
    return notes


def evaluation_values(path: Path, summaries: list[Any]) -> dict[str, float | None]:
    """Report column (`column_name`) -> main metric value from the summaries of a `gors evaluate` folder's
    summary.json at `path` (None where a summary holds none); a summary without them is an error naming it."""
    values: dict[str, float | None] = {}
    for index, summary in enumerate(summaries):
        missing = [key for key in ("label", "primary_metric")
                   if not isinstance(summary, dict) or not isinstance(summary.get(key), str)]
        if missing:
            raise ValueError(f"{path}: summaries[{index}] has no {' or '.join(map(repr, missing))}; expected the "
                             "summary.json of `gors evaluate` (rerun it to write one)")
        value = metric_value(summary, summary["primary_metric"])  # a dotted key reads one level deeper
        if value is not None and not is_json_number(value):
            raise ValueError(f"{path}: summaries[{index}] ({summary['label']}): its main metric "
                             f"{summary['primary_metric']!r} is {value!r}, not a number")
        values[column_name(summary)] = None if value is None else float(value)
    return values


def load_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the TensorBoard logs under `folder/logs`: tag -> [(step, value)], one point
    per step. A resumed run logs the steps after its checkpoint again: the latest (by wall time) is kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    latest: dict[str, dict[int, tuple[float, float]]] = {}  # tag -> step -> (wall time, value)
    for events in sorted((folder / "logs").rglob("events.out.tfevents.*")):
        # Every point: by default TensorBoard keeps 10 000 per tag, a random sample of a 15 000-step run's.
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            points = latest.setdefault(tag, {})
            for event in accumulator.Scalars(tag):
                if event.step not in points or event.wall_time >= points[event.step][0]:
                    points[event.step] = (event.wall_time, event.value)
    return {tag: [(step, value) for step, (_, value) in sorted(points.items())] for tag, points in latest.items()}


ROUND_KEYS = ("round", "mean_reward", "selected_fraction", "mean_reward_selected", "num_replayed", "last_step")


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
    for index, entry in enumerate(record["rounds"]):
        _check_round(entry, index, path)
        row = {key: entry[key] for key in ROUND_KEYS}
        for tag, points in scalars.items():
            if tag.startswith("validation/"):
                row |= {tag: value for step, value in points if step == entry["last_step"]}
        rows.append(row)
    return rows


def _check_round(entry: Any, index: int, path: Path) -> None:
    """Refuse, naming the file, a rounds.json entry without the numbers the table and plot need."""
    missing = [key for key in ROUND_KEYS if key not in entry] if isinstance(entry, dict) else list(ROUND_KEYS)
    if missing:
        raise ValueError(f"{path}: rounds[{index}] lacks {', '.join(missing)}; expected the rounds.json that an "
                         "online `gors run --rounds N` writes")
    # mean_reward_selected is null for a round that selected nothing.
    bad = [key for key in ROUND_KEYS if not is_json_number(entry[key]) and not (key == "mean_reward_selected"
                                                                             and entry[key] is None)]
    if bad:
        raise ValueError(f"{path}: rounds[{index}]: {', '.join(f'{key}={entry[key]!r}' for key in bad)} "
                         "is not a number")


def _plot_rounds(runs: dict[str, list[dict[str, float]]], path: Path) -> None:
    tags = ["mean_reward", "mean_reward_selected"] + sorted(
        {t for rows in runs.values() for row in rows for t in row if t.startswith("validation/")})
    _plot_lines({tag: {name: [(row["round"], row[tag]) for row in rows if tag in row] for name, rows in runs.items()}
                 for tag in tags}, "round", path)


def _plot_lines(panels: dict[str, dict[str, list[tuple[float, float]]]], x_label: str, path: Path) -> None:
    """One panel per title, one line per run name: (x, y) points against `x_label`; `panels` not empty."""
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
    _save_figure(figure, path)


def _save_figure(figure: Any, path: Path) -> None:
    """Write a figure as PNG atomically (rendered in memory first): a report stopped while plotting
    leaves the earlier PNG, never a torn one."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=120)
    finally:
        plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())


def markdown_table(rows: dict[str, dict[str, float]]) -> str:
    """Checkpoints x benchmarks; published rows (in italics) for the benchmarks that appear."""
    columns = sorted({label for values in rows.values() for label in values})
    table = dict(rows)
    for name, values in PUBLISHED.items():
        shown = {label: v for label, v in values.items() if label in columns}
        if shown:
            table[f"*{name}*"] = shown
    body = [[name, *(values.get(c) for c in columns)] for name, values in table.items()]
    # Folder names such as `7.5` or `0500` stay as written (tabulate would format them as numbers).
    return tabulate(body, headers=["checkpoint", *columns], tablefmt="github", floatfmt=".4f", missingval="-",
                    disable_numparse=[0])


def _plot_bars(rows: dict[str, dict[str, float | None]], scales: dict[str, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns = sorted({label for values in rows.values() for label in values})
    # One panel per scale: GenEval 2's x100 values beside values in [0, 1] would flatten the latter.
    panels: dict[str, list[str]] = {}
    for column in columns:
        panels.setdefault(scales.get(column, UNIT_SCALE), []).append(column)
    width = 0.8 / max(len(rows), 1)
    figure, axes = plt.subplots(1, len(panels), squeeze=False, width_ratios=[len(c) for c in panels.values()],
                                figsize=(max(6.0, 1.2 * len(columns)), 4.0))
    for axis, (scale, shown) in zip(axes[0], panels.items()):
        for k, (name, values) in enumerate(rows.items()):
            heights = [np.nan if values.get(c) is None else values[c] for c in shown]
            axis.bar(np.arange(len(shown)) + k * width, heights, width, label=name)
        axis.set_xticks(np.arange(len(shown)) + width * (len(rows) - 1) / 2, shown, rotation=30, ha="right")
        axis.set_ylabel(f"main metric, {scale}")
    axes[0][0].legend(fontsize="small")
    figure.tight_layout()
    _save_figure(figure, path)


def curve_tags(runs: dict[str, dict[str, list[tuple[int, float]]]]) -> list[str]:
    """The tags `training_curves.png` plots: the loss and every validation metric that some run logged
    (none for a run stopped before its first step, or logs of rounds/* only)."""
    return sorted({t for series in runs.values() for t in series if t == "train/loss" or t.startswith("validation/")})


def _plot_curves(runs: dict[str, dict[str, list[tuple[int, float]]]], path: Path) -> None:
    _plot_lines({tag: {name: series.get(tag, []) for name, series in runs.items()} for tag in curve_tags(runs)},
                "step", path)


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


def quick_run_notes(summaries: list[Any], name: str) -> list[str]:
    """A line per benchmark of a `gors evaluate` folder that the report sets beside published numbers but that
    ran on fewer prompts (`--max_prompts`) or other images per prompt than the benchmark's protocol, or sampled
    with other steps, guidance or image side than its official sampling (`--num_inference_steps`, ..., or a
    model family the protocol was not written for, sampled with its own defaults)."""
    from evaluators import available_benchmarks, benchmark_class

    published = {label for values in PUBLISHED.values() for label in values}
    notes = []
    for summary in summaries:
        label = str(summary.get("label")) if isinstance(summary, dict) else ""
        benchmark = label.split(":")[0]
        if label not in published or benchmark not in available_benchmarks():
            continue
        results = summary.get("results") or {}
        config, samples = results.get("config") or {}, results.get("samples") or {}
        official = benchmark_class(benchmark).official_images_per_prompt
        per_prompt = config.get("images_per_prompt") or official
        prompts = samples.get("prompts")
        # A --max_prompts at or above the prompt count cuts nothing: the prompts measured say whether it did.
        if (config.get("max_prompts") is not None and prompts != PUBLISHED_PROMPTS) or per_prompt != official:
            notes.append(f"note: {name}'s {label} is a quick run ({prompts or '?'} prompts x {per_prompt} images; "
                         f"the protocol's: {PUBLISHED_PROMPTS} x {official}): it does not compare with the published "
                         "numbers")
        sampling = benchmark_class(benchmark).official_sampling
        protocol = {"num_inference_steps": sampling.num_inference_steps, "guidance_scale": sampling.guidance_scale,
                    "resolution": sampling.resolution}  # None: the checkpoint's own side, any
        other = [f"{key} {config[key]} (the protocol's {value})" for key, value in protocol.items()
                 if value is not None and config.get("images") != "external" and key in config
                 and config[key] != value]
        if other:
            notes.append(f"note: {name}'s {label} was sampled otherwise than the benchmark's protocol "
                         f"({', '.join(other)}): it does not compare with the published numbers")
    return notes


# Every PNG a report may write: those this report does not write are an earlier report's, and go.
PLOTS = ("benchmarks.png", "training_curves.png", "rounds.png")


@dataclass
class _ReportInputs:
    """What the report shows, read from its folders (each under its label)."""

    evaluations: dict[str, dict[str, float | None]] = field(default_factory=dict)
    protocols: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    quick: list[str] = field(default_factory=list)  # notes on evaluations too small to compare
    scales: dict[str, str] = field(default_factory=dict)  # benchmark column -> its unit
    runs: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)  # TensorBoard scalars
    rounds: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def read(self, folder: Path, name: str) -> None:
        """Add `folder`'s evaluation summary, training logs and rounds; refuse a folder with none of them."""
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: {not_a_folder(folder)} (give `gors evaluate` or training output "
                                    "folders)")
        summaries = read_summaries(folder)
        evaluation = None if summaries is None else evaluation_values(folder / "summary.json", summaries)
        if evaluation:  # a folder whose summaries hold no value is a row of "-"
            self.evaluations[name] = evaluation
            self.protocols[name] = evaluation_protocols(summaries)
            self.quick += quick_run_notes(summaries, name)
            self.scales |= {column_name(summary): column_scale(summary) for summary in summaries}
        scalars = load_scalars(folder) if (folder / "logs").is_dir() else {}
        if scalars:
            self.runs[name] = scalars
        rows = round_rows(folder, scalars)
        if rows:  # a --rounds run made with --report_to none has its rounds.json and no logs
            self.rounds[name] = rows
        if evaluation == {} and not scalars and not rows:
            raise ValueError(f"{folder / 'summary.json'} lists no benchmark (its 'summaries' list is empty): run "
                             "`gors evaluate` with this --output_dir again, or give another folder")
        if evaluation is None and not scalars and not rows:
            raise ValueError(f"{folder} has neither a summary.json from `gors evaluate` nor TensorBoard logs nor "
                             "the rounds.json of a --rounds run; give such folders")


def _benchmark_section(inputs: _ReportInputs, output_dir: Path) -> list[str]:
    _plot_bars(inputs.evaluations, inputs.scales, output_dir / "benchmarks.png")
    return ["## Benchmarks (main metric of each; published numbers in italics)", "", markdown_table(inputs.evaluations),
            "", *protocol_notes(inputs.protocols), *inputs.quick, "", "![benchmarks](benchmarks.png)", ""]


def _training_section(inputs: _ReportInputs, output_dir: Path) -> list[str]:
    # Logs without a loss or validation point (a run stopped before its first step, or rounds/* only)
    # have no curve: said in words, and no empty plot.
    lines = ["## Training", "", *(f"{name}: no training loss or validation metric in its logs"
                                  for name, series in inputs.runs.items() if not curve_tags({name: series}))]
    if curve_tags(inputs.runs):
        _plot_curves(inputs.runs, output_dir / "training_curves.png")
        lines += ["", "![training curves](training_curves.png)"]
    return [*lines, ""]


def _rounds_section(inputs: _ReportInputs, output_dir: Path) -> list[str]:
    lines = ["## Rounds", ""]
    for name, rows in inputs.rounds.items():
        columns = list(dict.fromkeys(key for row in rows for key in row))
        lines += [f"### {name}", "", tabulate([[row.get(c) for c in columns] for row in rows], headers=columns,
                                                tablefmt="github", floatfmt=".4f", missingval="-",
                                                disable_numparse=[0]), ""]
    _plot_rounds(inputs.rounds, output_dir / "rounds.png")
    return [*lines, "![rounds](rounds.png)", ""]


def report(folders: Sequence[str | Path], output_dir: str | Path = "report") -> Path:
    """Write report.md (+ PNGs) for the given evaluation and run folders; returns report.md's path."""
    output_dir = Path(output_dir)
    inputs = _ReportInputs()
    paths = [Path(folder) for folder in folders]
    for folder, name in zip(paths, labels(paths)):
        inputs.read(folder, name)
    make_folder(output_dir, "--output_dir")
    parts = ["# gors report", ""]
    if inputs.evaluations:
        parts += _benchmark_section(inputs, output_dir)
    if inputs.runs:
        parts += _training_section(inputs, output_dir)
    if inputs.rounds:
        parts += _rounds_section(inputs, output_dir)
    path = output_dir / "report.md"
    text = "\n".join(parts)
    earlier = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    atomic_write_bytes(path, text.encode("utf-8"))
    # A plot the earlier report.md showed and this one does not is that report's: removed once this one is written.
    # A file of the same name that no report showed is the user's, and stays.
    for plot in PLOTS:
        if f"]({plot})" in earlier and f"]({plot})" not in text:
            (output_dir / plot).unlink(missing_ok=True)
    return path


@dataclass
class ReportConfig:
    """`gors report OUT_DIR [OUT_DIR ...]`: a markdown table of checkpoints x benchmarks, and plots."""

    folders: list[str] = field(
        metadata={"positional": True, "help": "`gors evaluate` output folders and/or training run folders"}
    )
    output_dir: str = field(default="report", metadata={"help": "Where report.md and the PNGs go."})

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        if not self.output_dir.strip():
            raise ValueError("--output_dir='': give the folder the report goes to, e.g. --output_dir report")
        self.output_dir = os.path.expanduser(self.output_dir)  # `~` from a quoted flag, as a shell would
        self.folders = [os.path.expanduser(folder) for folder in self.folders]


def write_report(config: ReportConfig) -> None:
    """`gors report`: write the report and say where it is."""
    print(f"[report] wrote {report(config.folders, config.output_dir)}")
