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

from gors.config import check_values
from gors.core.backbones import LORA_WEIGHT_NAME
from gors.core.io import files_sha256, read_json_if_present, read_jsonl
from gors.core.lock import describe_holder, holder_runs, lock_records
from gors.core.run_folder import (
    BEST_DIR,
    BEST_FILE,
    ROUNDS_FILE,
    SCORES_DIR,
    SELECTION_SUMMARY_FILE,
    best_folder,
    in_numbered_order,
    is_rounds_folder,
    samples_dir,
)
from gors.core.store import SETTINGS, SampleStore, StoreError


@dataclass
class StatusConfig:
    """`gors status RUN [RUN ...]`: what each run folder holds so far, and what is writing it now."""

    folders: list[str] = field(metadata={"positional": True, "help": "Run folders (of `gors run`, a recipe or the "
                                                                     "stages; --rounds folders too)."})

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
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
    checkpoints = list(complete_checkpoints(folder, replaced=True))
    checkpoint, marker = checkpoints[0] if checkpoints else (None, None)
    if isinstance(selection, dict):
        rows.append(("selection", f"{selection.get('num_selected')} of {selection.get('num_samples')} samples kept "
                                  f"({selection.get('threshold') or 'top fraction'})"
                                  + _selected_since(folder, marker)))
    final = folder / LORA_WEIGHT_NAME
    if marker is not None:
        target = marker.get("max_train_steps")
        of = f" of {target} ({100 * marker['step'] // target} %)" if target else ""  # 99 % until it is done
        left = _time_left([marker for _, marker in checkpoints], target)
        name = checkpoint.name
        if name.startswith("."):
            name += f" (a killed save's; the next train or resume puts it back as checkpoint-{marker['step']})"
        rows.append(("training", f"step {marker['step']}{of}: {name}, saved {_local_time(marker)}"
                                 + (f"; {left}" if left else "")))
        weights = ((marker.get("files") or {}).get(LORA_WEIGHT_NAME) or {}).get("sha256")
        if final.is_file():
            # A marker of an older gors records no hashes: the file is named, unmatched.
            same = None if weights is None else files_sha256([final]) == weights
            shown = {True: f" (step {marker['step']})", False: " (not the newest checkpoint's LoRA: of another "
                                                               "training, or a longer one's checkpoint is kept)"}
            rows.append(("final LoRA", final.name + shown.get(same, "")))
        return rows
    # No checkpoint of this training yet: a final LoRA whose weights a set-aside checkpoint holds is an earlier
    # training's (set aside by one with other settings as it started).
    aside = _set_aside_with(folder, final) if final.is_file() else None
    if selection is not None and (aside is not None or not final.is_file()):
        rows.append(("training", "no checkpoint yet"))
    if final.is_file():
        rows.append(("final LoRA", final.name + (f" (an earlier training's, checkpoints in {aside}/)" if aside else "")))
    return rows


def _set_aside_with(folder: Path, lora: Path) -> str | None:
    """The name of the `checkpoints.previous-<n>/` of `folder` whose checkpoint holds `lora`'s weights, else None."""
    from gors.checkpoints import complete_checkpoints, set_aside_checkpoints

    weights = files_sha256([lora])
    for aside in set_aside_checkpoints(folder):
        try:  # a training may rename it meanwhile
            markers = [marker for _, marker in complete_checkpoints(folder, aside.name)]
        except (OSError, ValueError):
            continue
        if any((marker.get("files") or {}).get(LORA_WEIGHT_NAME, {}).get("sha256") == weights for marker in markers):
            return aside.name
    return None


def _selected_since(folder: Path, marker: dict[str, Any] | None) -> str:
    """A note where the newest checkpoint was trained on another selection than `selection.jsonl` (a `gors select`
    since), naming the kept copy it was trained on (`gors.select.keep_trained_selection`); else ""."""
    from gors.checkpoints import selection_fingerprint
    from gors.select import PREVIOUS_SELECTION, load_selection

    trained = (marker or {}).get("fingerprint", {}).get("selection_sha256")
    try:
        if trained is None or selection_fingerprint(load_selection(folder)) == trained:
            return ""
        kept = [path.name for path in in_numbered_order(folder.glob(PREVIOUS_SELECTION.format(number="*")))
                if selection_fingerprint(list(read_jsonl(path))) == trained]
    except (OSError, ValueError, StoreError):  # a selection cut short or edited: training names the problem
        return ""
    return "; selected since the newest checkpoint was trained" + (f" (on {kept[-1]})" if kept else "")


def _local_time(marker: dict[str, Any]) -> str:
    """A checkpoint's save time (UTC in its marker) in this machine's time zone, as lock records are shown."""
    if "time" not in marker:
        return "?"
    return datetime.fromisoformat(marker["time"]).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _time_left(markers: list[dict[str, Any]], target: int | None) -> str | None:
    """The time a training needs to `target` at its recent pace, in words; None where it cannot be told or nothing
    is left. `markers`: its checkpoints', newest first. The pace is that between the two newest checkpoints
    saved by one training process (the same `since`: a resume's down time is no training time), else between
    the step the newest one's process started from and it."""
    if not target or not markers or markers[0]["step"] >= target or "time" not in markers[0]:
        return None
    newest = markers[0]
    before = markers[1] if len(markers) > 1 else None
    if before is None or "time" not in before or before.get("since") != newest.get("since") \
            or before.get("fingerprint") != newest.get("fingerprint"):
        since = newest.get("since")
        before = since if since is not None and since["step"] < newest["step"] else None
    if before is None:
        return None
    seconds = (datetime.fromisoformat(newest["time"]) - datetime.fromisoformat(before["time"])).total_seconds()
    if seconds <= 0:
        return None
    left = (target - newest["step"]) * seconds / (newest["step"] - before["step"])
    return f"about {_duration(left)} to go at the pace of steps {before['step']} to {newest['step']}"


def _duration(seconds: float) -> str:
    """`seconds` in words: minutes under an hour, else hours to a tenth."""
    return f"{max(1, round(seconds / 60))} min" if seconds < 3570 else f"{seconds / 3600:.1f} h"


def lock_rows(folder: Path, records: dict[str, dict] | None = None, skip: frozenset = frozenset()
              ) -> list[tuple[str, str]]:
    """A row per command that writes the folder, with the stages it holds (`gors run` holds four); a record
    whose command this machine knows is gone reads as stopped (its work resumes with the same command),
    unless a process of its launch still runs here (a stray, which holds its share of the stage). `records`:
    the folder's (`lock_records`); holders (pid, host) in `skip` are left out (shown for another folder)."""
    records = lock_records(folder) if records is None else records
    holders: dict[tuple[Any, ...], tuple[dict, list[str]]] = {}
    shares = []
    for stage, record in records.items():
        if (record["pid"], record["host"]) in skip:
            continue
        if "-process-" in stage:  # another process's share of a stage: its main process's row says it
            shares.append((stage, record))
            continue
        key = (record["pid"], record["host"], record["command"])
        holders.setdefault(key, (record, []))[1].append(stage)
    here = socket.gethostname()
    live = {stage for record, stages in holders.values() if record["host"] != here or holder_runs(record)
            for stage in stages}
    strays: dict[int, tuple[dict, list[str]]] = {}
    for stage, record in shares:
        if stage.partition("-process-")[0] not in live and record["host"] == here and holder_runs(record):
            strays.setdefault(record["pid"], (record, []))[1].append(stage)
    rows = []
    for record, stages in holders.values():
        if record["host"] != here:
            rows.append((f"writing {', '.join(stages)}", f"{describe_holder(record)}, by its lock record (another "
                                                         "host: whether it still runs is not known here)"))
        elif holder_runs(record):
            rows.append((f"writing {', '.join(stages)}", describe_holder(record)))
        else:
            then = (f"stop the processes of its launch that still run (pid {', '.join(map(str, strays))}), then the "
                    "same command resumes it") if strays else "the same command resumes it"
            rows.append((f"stopped {', '.join(stages)}", f"{describe_holder(record)} is gone: {then}"))
    for record, stages in strays.values():
        rows.append((f"writing {', '.join(stages)}", f"{describe_holder(record)}: a process of a launch whose main "
                                                     "process is gone"))
    return rows


def holder_keys(records: dict[str, dict]) -> frozenset:
    """The (pid, host) of each lock record's holder."""
    return frozenset((record["pid"], record["host"]) for record in records.values())


def is_evaluation_folder(folder: Path) -> bool:
    """Whether `folder` is (or holds) a `gors evaluate` output: its lock file, or its summary."""
    return (folder / ".lock-evaluate").exists() or (folder / "summary.json").is_file()


# The lock files a run's stages leave (emptied, not removed, when a command ends).
RUN_LOCKS = tuple(f".lock-{stage}" for stage in ("generate", "score", "select", "train"))


def is_run_folder(folder: Path) -> bool:
    """Whether a run's stages (`gors run`, a recipe, the stage commands) have written `folder`."""
    return any((folder / name).exists() for name in RUN_LOCKS) or is_rounds_folder(folder)


def evaluation_rows(folder: Path, in_run_folder: bool = False) -> list[tuple[str, str]]:
    """A row per benchmark of a `gors evaluate` folder (`<name>[/<subset>]`), or of one benchmark's own folder
    (the toy demo's `eval_base/`): its images and scores so far, and once it is finished its main metric (as
    the folder's summary.json lists it); one that scored an image folder (`--images`) has no images of its own.
    `in_run_folder`: the evaluation was written into a run folder, whose own samples are not a benchmark's."""
    from evaluators import available_benchmarks
    from evaluators.results import metric_value
    from gors.report import summary_folders

    try:
        summaries, problem = summary_folders(folder), None
    except ValueError as err:  # a summary this process cannot read (a benchmark of a module not importable here)
        summaries, problem = [], str(err)
    finished = {entry["label"]: entry for entry, _ in summaries if isinstance(entry, dict) and "label" in entry}
    folders = {entry["label"]: where for entry, where in summaries if isinstance(entry, dict) and "label" in entry}
    if not in_run_folder and (folder / "samples").is_dir():
        folders = folders or {folder.name: folder}  # one benchmark's folder, before its summary names it
    else:
        known = set(available_benchmarks()) | {label.partition(":")[0] for label in folders}
        for store_root in sorted([*folder.glob("*/samples"), *folder.glob("*/*/samples")]):
            parts = store_root.parent.relative_to(folder).parts
            # In a run folder, not the folders of other kinds it holds (validation/, eval_base/); in an evaluation's
            # own, every benchmark's, a `module:Class` one this process does not know included.
            if parts[0] in known or not in_run_folder:
                folders.setdefault(":".join(parts), store_root.parent)
    rows = []
    for label in sorted(folders):
        found = store_progress(folders[label] / "samples")
        shown = [f"{found[0]}, {scored(folders[label] / SCORES_DIR, found[1])} scored"] if found is not None else []
        entry = finished.get(label)
        if entry is not None:
            if entry.get("images") is not None:
                shown.append(f"scored the images of {entry['images']}")
            metric = entry.get("primary_metric")
            number = metric_value(entry, metric) if isinstance(metric, str) else None
            shown.append(f"finished: {metric} " + (f"{number:.4f}" if isinstance(number, (int, float)) else "-"))
        rows.append((label, "; ".join(shown) or "none yet"))
    return rows + ([("summary.json", problem)] if problem else [])


def folder_status(folder: Path) -> list[tuple[str, str]]:
    """(what, how far) rows of a run folder (a --rounds folder's latest round in rows of its own) or of a
    `gors evaluate` folder (and of both where an evaluation was written into a run folder)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run folder")
    records = lock_records(folder)
    run = is_run_folder(folder)
    evaluated = evaluation_rows(folder, in_run_folder=run) if is_evaluation_folder(folder) else []
    if not run and is_evaluation_folder(folder):
        return (evaluated or [("benchmarks", "none started yet")]) + lock_rows(folder, records)
    if not is_rounds_folder(folder):
        rows = sample_rows(folder) + training_rows(folder) + _best_rows(folder) + evaluated + lock_rows(folder, records)
        if rows == [("samples", "none yet")] and not records:
            return [("run", "no gors run or evaluation in this folder yet" + _elsewhere(folder))]
        return rows
    rounds = read_json_if_present(folder / ROUNDS_FILE, "the record of the finished rounds")
    started = sorted(path for path in folder.glob("round-*") if path.is_dir())
    finished = (rounds or {}).get("rounds") or []
    planned = ((rounds or {}).get("settings") or {}).get("rounds")
    # The plan as the last finished round recorded it: a run resumed with more --rounds has started rounds past it.
    of = f" of {planned}" if planned and len(started) <= planned else ""
    rows = [("rounds", f"{len(finished)}{of} finished")]
    if started:
        latest = started[-1]
        inner = sample_rows(latest) + training_rows(latest) + lock_rows(latest, skip=holder_keys(records))
        rows += [(f"{latest.name} {what}", value) for what, value in inner]
    if (folder / LORA_WEIGHT_NAME).is_file() and finished:
        rows.append(("final LoRA", f"{LORA_WEIGHT_NAME} (round {len(finished) - 1}'s)"))
    return rows + _best_rows(folder) + evaluated + lock_rows(folder, records)


def _elsewhere(folder: Path) -> str:
    """Where the runs are, for a folder that holds none: the run folder it lies in, or the ones it holds."""
    above = next((parent for parent in folder.resolve().parents if is_run_folder(parent) or is_evaluation_folder(parent)),
                 None)
    if above is not None:
        return f"; it lies in the run folder {above}: gors status {above}"
    inside = sorted(child.name for child in folder.iterdir() if child.is_dir()
                    and (is_run_folder(child) or is_evaluation_folder(child) or (child / "samples").is_dir()))
    listed = ", ".join(inside[:5]) + (", ..." if len(inside) > 5 else "")
    return f"; it holds {len(inside)} run folder(s) ({listed}): gors status {folder}/*" if inside else ""


def _best_rows(folder: Path) -> list[tuple[str, str]]:
    found = best_folder(folder)
    best = read_json_if_present(found / BEST_FILE, "the record of the best LoRA") if found is not None else None
    if not isinstance(best, dict):
        return []
    return [("best LoRA", f"step {best.get('step')}: {best.get('benchmark')} {best.get('metric')} "
                          f"{best.get('value'):.4f} ({BEST_DIR}/)")]


def status(config: StatusConfig) -> None:
    """`gors status`: print each folder's rows; a folder that does not exist, or whose records cannot be read, is
    said in the error and, among several folders, in its place too (the others are still reported)."""
    failed = []
    for index, folder in enumerate(map(Path, config.folders)):
        heading = ("\n" if index else "") + f"{folder}"
        if not folder.is_dir():
            problem = "not a folder" if folder.exists() else "no such run folder"
        else:
            try:
                rows = folder_status(folder)
            except (ValueError, StoreError) as err:  # a record cut short or edited
                problem = f"cannot be read: {err}"
            else:
                print(heading)
                width = max(len(what) for what, _ in rows)
                for what, value in rows:
                    print(f"  {what:<{width}}  {value}")
                continue
        if len(config.folders) > 1:  # in its place among the others; a single folder's is the error alone
            print(f"{heading}\n  {problem}")
        failed.append(f"{folder}: {problem}")
    if failed:
        raise ValueError("; ".join(failed))
