"""`gors status RUN [RUN ...]`: how far a run folder has come, from its files alone.

For each folder: the samples generated (per prompt), each reward's scores, the selection, the
training (the newest complete checkpoint and the step the training goes to, the final LoRA), the
best LoRA of validation, a --rounds run's finished rounds and its latest round, and which commands
write the folder now (the lock records, `gors.core.lock`). It takes no lock and writes nothing, so
it runs beside the run it reports on, from any machine that mounts the folder.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gors.core.backbones import LORA_WEIGHT_NAME
from gors.core.io import files_sha256, read_json_if_present
from gors.core.lock import describe_holder, lock_records
from gors.core.run_folder import (
    BEST_DIR,
    BEST_FILE,
    ROUNDS_FILE,
    SCORES_DIR,
    SELECTION_SUMMARY_FILE,
    best_folder,
    is_rounds_folder,
    samples_dir,
)
from gors.core.store import SETTINGS, SampleStore


@dataclass
class StatusConfig:
    """`gors status RUN [RUN ...]`: what each run folder holds so far, and what is writing it now."""

    folders: list[str] = field(metadata={"positional": True, "help": "Run folders (of `gors run`, a recipe or the "
                                                                     "stages; --rounds folders too)."})

    def __post_init__(self) -> None:
        self.folders = [os.path.expanduser(folder) for folder in self.folders]


def _per_prompt(counts: Counter, prompts: int) -> str:
    """How the images spread over `prompts` prompts (image counts by prompt index)."""
    if not counts:
        return "none yet"
    low, high = min(counts.values()), max(counts.values())
    missing = prompts - len(counts)
    if missing == 0 and low == high:
        return f"{high} each"
    return f"{low if not missing else 0} to {high} each" + (f", {missing} prompts without one" if missing else "")


def store_progress(store_root: Path) -> tuple[str, list[dict[str, Any]]] | None:
    """How far a sample store has come (its images per prompt) and its records; None before its prompts
    are recorded."""
    store = SampleStore(store_root)
    if not (store_root / "prompts.json").is_file():
        return None
    records = store.records()
    prompts = len(store.load_prompts()["prompts"])
    counts = Counter(record["prompt_index"] for record in records)
    return f"{len(records)} images of {prompts} prompts ({_per_prompt(counts, prompts)})", records


def scored(scores_folder: Path, records: list[dict[str, Any]]) -> int:
    """How many of `records` have a score of their own image in `scores_folder`."""
    from gors.core.scoring import read_score_rows

    return len(read_score_rows(scores_folder, records)) if scores_folder.is_dir() else 0


def sample_rows(folder: Path) -> list[tuple[str, str]]:
    """The rows of a run folder's samples and of each reward's scores."""
    progress = store_progress(samples_dir(folder))
    if progress is None:
        return [("samples", "none yet")]
    text, records = progress
    rows = [("samples", text)]
    for scores in sorted(path for path in (folder / SCORES_DIR).glob("*") if (path / SETTINGS).is_file()):
        reward = (read_json_if_present(scores / SETTINGS, "the settings of a reward's scores") or {}).get(
            "reward", scores.name)
        rows.append((f"scores {reward}", f"{scored(scores, records)} of {len(records)} images"))
    return rows


def training_rows(folder: Path) -> list[tuple[str, str]]:
    """The rows of the selection, the newest complete checkpoint (of how many steps) and the final LoRA."""
    from gors.checkpoints import complete_checkpoints

    rows = []
    selection = read_json_if_present(folder / SELECTION_SUMMARY_FILE, "the summary gors select writes")
    if isinstance(selection, dict):
        rows.append(("selection", f"{selection.get('num_selected')} of {selection.get('num_samples')} samples kept "
                                  f"({selection.get('threshold') or 'top fraction'})"))
    checkpoints = list(complete_checkpoints(folder))
    checkpoint, marker = checkpoints[0] if checkpoints else (None, None)
    final = folder / LORA_WEIGHT_NAME
    if marker is not None:
        target = marker.get("max_train_steps")
        of = f" of {target} ({100 * marker['step'] // target} %)" if target else ""  # 99 % until it is done
        left = _time_left([marker for _, marker in checkpoints], target)
        rows.append(("training", f"step {marker['step']}{of}: {checkpoint.name}, saved {marker.get('time', '?')}"
                                 + (f"; {left}" if left else "")))
        weights = ((marker.get("files") or {}).get(LORA_WEIGHT_NAME) or {}).get("sha256")
        if final.is_file():
            # A marker of an older gors records no hashes: the file is named, unmatched.
            same = None if weights is None else files_sha256([final]) == weights
            shown = {True: f" (step {marker['step']})", False: " (not the newest checkpoint's LoRA: of another "
                                                               "training, or a longer one's checkpoint is kept)"}
            rows.append(("final LoRA", final.name + shown.get(same, "")))
    elif final.is_file():
        rows.append(("final LoRA", final.name))
    elif selection is not None:
        rows.append(("training", "no checkpoint yet"))
    return rows


def _time_left(markers: list[dict[str, Any]], target: int | None) -> str | None:
    """The time a training needs to `target` at the pace between its two newest checkpoints (`markers`, newest
    first; of one training, each with its save time), in words; None where it cannot be told or nothing is left."""
    if not target or len(markers) < 2 or markers[0]["step"] >= target:
        return None
    newest, before = markers[:2]
    if before.get("fingerprint") != newest.get("fingerprint") or "time" not in before or "time" not in newest:
        return None
    seconds = (datetime.fromisoformat(newest["time"]) - datetime.fromisoformat(before["time"])).total_seconds()
    if seconds <= 0:
        return None
    hours = (target - newest["step"]) * seconds / (newest["step"] - before["step"]) / 3600
    return f"about {hours:.1f} h to go at the pace of steps {before['step']} to {newest['step']}"


def lock_rows(folder: Path) -> list[tuple[str, str]]:
    """A row per command that writes the folder, with the stages it holds (`gors run` holds four); a record
    whose command this machine knows is gone reads as stopped (its work resumes with the same command)."""
    holders: dict[tuple[Any, ...], tuple[dict, list[str]]] = {}
    for stage, record in lock_records(folder).items():
        if "-process-" in stage:  # another process's share of a stage: its main process's row says it
            continue
        key = (record["pid"], record["host"], record["command"])
        holders.setdefault(key, (record, []))[1].append(stage)
    rows = []
    for record, stages in holders.values():
        if record["host"] != socket.gethostname():
            rows.append((f"writing {', '.join(stages)}", f"{describe_holder(record)}, by its lock record (another "
                                                         "host: whether it still runs is not known here)"))
        elif _alive(record["pid"]):
            rows.append((f"writing {', '.join(stages)}", describe_holder(record)))
        else:
            rows.append((f"stopped {', '.join(stages)}", f"{describe_holder(record)} is gone: the same command "
                                                         "resumes it"))
    return rows


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_evaluation_folder(folder: Path) -> bool:
    """Whether `folder` is a `gors evaluate` output folder: its lock file, or its summary."""
    return (folder / ".lock-evaluate").exists() or (folder / "summary.json").is_file()


def evaluation_rows(folder: Path) -> list[tuple[str, str]]:
    """A row per benchmark of a `gors evaluate` folder (`<name>[/<subset>]`): its images and scores so far,
    and once it is finished its main metric (as the folder's summary.json lists it); one that scored an image
    folder (`--images`) has no images of its own."""
    from evaluators.results import metric_value
    from gors.report import read_summaries

    finished = {entry["label"]: entry for entry in read_summaries(folder) or [] if isinstance(entry, dict)}
    progress = {}
    for store_root in sorted([*folder.glob("*/samples"), *folder.glob("*/*/samples")]):
        found = store_progress(store_root)
        if found is not None:
            benchmark = store_root.parent
            progress[":".join(benchmark.relative_to(folder).parts)] = \
                f"{found[0]}, {scored(benchmark / SCORES_DIR, found[1])} scored"
    rows = []
    for label in sorted(progress.keys() | finished.keys()):
        entry = finished.get(label)
        shown = [progress[label]] if label in progress else []
        if entry is not None:
            if entry.get("images") is not None:
                shown.append(f"scored the images of {entry['images']}")
            metric = entry.get("primary_metric")
            number = metric_value(entry, metric) if isinstance(metric, str) else None
            shown.append(f"finished: {metric} " + (f"{number:.4f}" if isinstance(number, (int, float)) else "-"))
        rows.append((label, "; ".join(shown)))
    return rows


def folder_status(folder: Path) -> list[tuple[str, str]]:
    """(what, how far) rows of a run folder (a --rounds folder's latest round in rows of its own) or of a
    `gors evaluate` folder."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run folder")
    rounds = read_json_if_present(folder / ROUNDS_FILE, "the record of the finished rounds")
    started = sorted(path for path in folder.glob("round-*") if path.is_dir())
    if is_evaluation_folder(folder):
        return (evaluation_rows(folder) or [("benchmarks", "none started yet")]) + lock_rows(folder)
    if not is_rounds_folder(folder):
        rows = sample_rows(folder) + training_rows(folder) + _best_rows(folder) + lock_rows(folder)
        if rows == [("samples", "none yet")] and not any(folder.glob(".lock-*")):
            return [("run", "no gors run or evaluation in this folder yet")]
        return rows
    finished = (rounds or {}).get("rounds") or []
    planned = ((rounds or {}).get("settings") or {}).get("rounds")
    rows = [("rounds", f"{len(finished)}" + (f" of {planned}" if planned else "") + " finished")]
    if started:
        latest = started[-1]
        inner = sample_rows(latest) + training_rows(latest) + lock_rows(latest)
        rows += [(f"{latest.name} {what}", value) for what, value in inner]
    if (folder / LORA_WEIGHT_NAME).is_file() and finished:
        rows.append(("final LoRA", f"{LORA_WEIGHT_NAME} (round {len(finished) - 1}'s)"))
    return rows + _best_rows(folder) + lock_rows(folder)


def _best_rows(folder: Path) -> list[tuple[str, str]]:
    found = best_folder(folder)
    best = read_json_if_present(found / BEST_FILE, "the record of the best LoRA") if found is not None else None
    if not isinstance(best, dict):
        return []
    return [("best LoRA", f"step {best.get('step')}: {best.get('benchmark')} {best.get('metric')} "
                          f"{best.get('value'):.4f} ({BEST_DIR}/)")]


def status(config: StatusConfig) -> None:
    """`gors status`: print each folder's rows; a folder that does not exist is said in its place, and
    once all are printed, in the error."""
    missing = []
    for index, folder in enumerate(map(Path, config.folders)):
        print(("\n" if index else "") + f"{folder}")
        if not folder.is_dir():
            print("  no such folder")
            missing.append(str(folder))
            continue
        rows = folder_status(folder)
        width = max(len(what) for what, _ in rows)
        for what, value in rows:
            print(f"  {what:<{width}}  {value}")
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)}: no such run folder")
