"""Training checkpoints that survive a kill at any instant, and resumes that refuse other settings.

A checkpoint is saved into `checkpoints/.checkpoint-<step>.tmp` by every process (Accelerate's
`save_state`: adapters, optimizer, LR scheduler, one RNG file per process). The main process then
writes the marker `checkpoint.json` last and renames the folder to `checkpoint-<step>`, so a folder
of that name is complete exactly when it holds the marker: a kill leaves at most the temporary
folder, which the next save replaces. Older checkpoints are pruned only after the rename.

The marker records the run's fingerprint (`training_fingerprint`): the selection and the settings
a checkpoint only makes sense with. Resuming under another fingerprint is refused
(`check_resumable`) instead of continuing a run on a mix of two.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Sequence

from accelerate import Accelerator

import gors
from gors.config import RunConfig, TrainConfig
from gors.core.fingerprints import is_local_fingerprint
from gors.core.hub import model_version
from gors.core.io import (
    atomic_write_json,
    discard_folder,
    file_sha256,
    left_aside,
    publish_folder,
    read_json,
    recover_folder,
)
from gors.core.run_folder import CHECKPOINT_MARKER, CHECKPOINTS_DIR, in_numbered_order
from gors.core.store import same_value, selection_identity

logger = logging.getLogger(__name__)

_NAME = re.compile(r"checkpoint-(\d+)")
INCOMPLETE_CHECKPOINT = f"no {CHECKPOINT_MARKER}: an interrupted save, or one by gors 0.1"

# Settings that a checkpoint is bound to: they shape the adapters and the optimizer state it holds
# (a changed learning rate or Adam setting would be silently overwritten by the loaded optimizer),
# or the data, batches and RNG streams of the steps it stands for.
FINGERPRINT_FIELDS = (
    "pretrained_model_name_or_path", "revision", "resolution", "center_crop", "rank", "train_unet",
    "train_text_encoder", "train_batch_size", "gradient_accumulation_steps", "seed", "learning_rate",
    "text_encoder_learning_rate", "adam_beta1", "adam_beta2", "adam_weight_decay", "adam_epsilon", "lr_scheduler",
    "lr_warmup_steps",
)
# Bound too, but recorded only where they differ from the default, as checkpoints made before they
# were recorded hold them at their defaults: the objective and its RNG draws (caption dropout, drawn
# or mean latents) and the update (the gradient clip).
FINGERPRINT_FIELDS_IF_SET = {"caption_dropout": 0.0, "sample_latents": True, "max_grad_norm": 1.0}
# What a fingerprint without such a key holds (the 8-bit optimizer too is recorded only where on).
_ABSENT_MEANS = {**FINGERPRINT_FIELDS_IF_SET, "use_8bit_adam": False}
# The base model's version (`gors.core.hub.model_version`): the Hub commit the cache resolves it to, or a
# local folder's fingerprint: a LoRA goes on only on the weights it was trained on. Unknown on either side
# (a Hub id the cache lacks, a checkpoint made before it was recorded) is no difference.
BASE_MODEL_COMMIT = "base_model_commit"
# The precision the training runs in (`Accelerator.mixed_precision`: "no", "fp16", "bf16"): fp16 keeps a
# loss scaler in the checkpoint that the others lack, and each computes other gradients.
MIXED_PRECISION = "mixed_precision"
# How an update's samples split into micro-batches: `--auto_train_batch_size` finds them at the first step.
MICRO_BATCH_FIELDS = ("train_batch_size", "gradient_accumulation_steps")
# Recorded since some release: a checkpoint made before lacks them, and one side's unknown is no difference.
RECORDED_WHERE_KNOWN = (BASE_MODEL_COMMIT, MIXED_PRECISION)
# Schedules whose LR does not depend on the run's length.
LENGTHLESS_SCHEDULES = ("constant", "constant_with_warmup")


def checkpoint_step(path: str | Path) -> int:
    """The step of a `checkpoint-<step>` folder; a ValueError for any other name."""
    match = _NAME.fullmatch(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint folder: their names are checkpoint-<step>, e.g. checkpoint-500")
    return int(match.group(1))


def read_marker(checkpoint: str | Path) -> dict[str, Any] | None:
    """The marker of a complete checkpoint; None when the folder lacks one (an incomplete save)."""
    try:
        return read_json(Path(checkpoint) / CHECKPOINT_MARKER, "the marker gors writes last into a complete "
                         f"checkpoint; delete {checkpoint} (training goes on from the checkpoint before it)")
    except FileNotFoundError:
        return None


def _checkpoint_folders(root: Path, replaced: bool = False) -> list[Path]:
    """The `checkpoint-<step>` folders under `root`, complete or not, by step. `replaced`: with, in place of a
    missing `checkpoint-<step>`, the `.checkpoint-<step>.old` that a killed save had renamed it to (which
    `recover_replaced_checkpoints` puts back before a training looks), for reading without writing."""
    found = {checkpoint_step(p): p for p in root.glob("checkpoint-*") if p.is_dir() and _NAME.fullmatch(p.name)}
    if replaced:
        found |= {checkpoint_step(final): aside for final, aside in left_aside(root, "checkpoint-*")
                  if _NAME.fullmatch(final.name)}
    return [found[step] for step in sorted(found)]


def find_checkpoint(output_dir: str | Path, resume_from: str,
                    warn: Callable[[str], None] = logger.warning) -> Path | None:
    """The complete checkpoint to resume from: 'latest' (None when there is none yet) or a folder.

    'latest' passes over folders without a marker, naming them through `warn`; an explicit folder
    without one is an error.
    """
    root = Path(output_dir) / CHECKPOINTS_DIR
    if resume_from == "latest":
        folders = _checkpoint_folders(root)
        incomplete = [p for p in folders if read_marker(p) is None]
        if incomplete:
            warn(f"ignoring incomplete checkpoints ({INCOMPLETE_CHECKPOINT}): {', '.join(str(p) for p in incomplete)}")
        complete = [p for p in folders if p not in incomplete]
        return complete[-1] if complete else None
    flag = f"--resume_from_checkpoint={resume_from!r}"
    path = Path(resume_from)
    path = path if path.is_dir() else root / resume_from
    if not path.is_dir():
        raise FileNotFoundError(f"{flag}: no such checkpoint folder; pass 'latest' or a folder such as "
                                f"{root / 'checkpoint-500'}")
    try:
        checkpoint_step(path)
    except ValueError as err:
        raise ValueError(f"{flag}: {err}; pass 'latest' or such a folder") from None
    if read_marker(path) is None:
        raise ValueError(f"{flag}: {path} is incomplete ({INCOMPLETE_CHECKPOINT}); pass 'latest' to resume from the newest "
                         "complete checkpoint")
    return path


def selection_fingerprint(selection: list[dict[str, Any]]) -> str:
    """A hash of the selection's rows (`selection_identity`, in order): what the run trains on."""
    payload = json.dumps(selection_identity(selection))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def training_fingerprint(config: TrainConfig | RunConfig, selection: list[dict[str, Any]],
                         num_processes: int, family: dict[str, Any], schedule_steps: int | None = None,
                         mixed_precision: str | None = None) -> dict[str, Any]:
    """What a checkpoint of this run is bound to: the selection, `FINGERPRINT_FIELDS` (of the config
    with the family's defaults filled in) and `FINGERPRINT_FIELDS_IF_SET`, the family's own
    (`TrainingFamily.fingerprint`: LoRA targets, loss options), the number of processes (it sets the
    batches, and each process has its own RNG state), for a decaying LR schedule its length in
    updates (`schedule_steps`, default `max_train_steps`: the saved scheduler holds only its step, so
    a resume under another length would jump to another LR), and, where known, the base model's Hub
    commit and the training's `mixed_precision` (the Accelerator's, which the launch config may set)."""
    fingerprint = {
        "selection_rows": len(selection),
        "selection_sha256": selection_fingerprint(selection),
        **{name: getattr(config, name) for name in FINGERPRINT_FIELDS},
        **{name: getattr(config, name) for name, default in FINGERPRINT_FIELDS_IF_SET.items()
           if getattr(config, name) != default},
        **family,
        "num_processes": num_processes,
    }
    if config.lr_scheduler not in LENGTHLESS_SCHEDULES:
        fingerprint["lr_schedule_steps"] = schedule_steps or config.max_train_steps
    if config.use_8bit_adam:  # another optimizer state; absent otherwise, as in checkpoints made before the flag
        fingerprint["use_8bit_adam"] = True
    commit = model_version(config.pretrained_model_name_or_path, config.revision)
    if commit is not None:
        fingerprint[BASE_MODEL_COMMIT] = commit
    if mixed_precision is not None:
        fingerprint[MIXED_PRECISION] = mixed_precision
    return json.loads(json.dumps(fingerprint))  # as the marker holds it, to compare like with like


def fingerprint_differences(recorded: dict[str, Any], fingerprint: dict[str, Any], there: str = "in the checkpoint",
                            with_selection: bool = True, ignore: Collection[str] = ()) -> list[str]:
    """Each setting that differs between a checkpoint's fingerprint and this run's, as "name old there, new now";
    those named in `ignore` left out."""
    # A local base model moved or copied elsewhere is the same model: its files' fingerprint says so.
    commit = recorded.get(BASE_MODEL_COMMIT)
    moved = {"pretrained_model_name_or_path"} if is_local_fingerprint(commit) and \
        commit == fingerprint.get(BASE_MODEL_COMMIT) else set()
    recorded, fingerprint = _ABSENT_MEANS | recorded, _ABSENT_MEANS | fingerprint
    return [f"{key} {recorded.get(key)!r} {there}, {fingerprint.get(key)!r} now"
            for key in sorted(recorded.keys() | fingerprint.keys())
            if not same_value(recorded.get(key), fingerprint.get(key))
            and (with_selection or not key.startswith("selection_")) and key not in ignore and key not in moved
            and not (key in RECORDED_WHERE_KNOWN and (key not in recorded or key not in fingerprint))]


def recorded_micro_batch(fingerprint: dict[str, Any], output_dir: str | Path, resume_from: str | None = None,
                         continue_from: Path | None = None, max_train_steps: int | None = None) -> int | None:
    """The micro-batch size (`train_batch_size`) that `--auto_train_batch_size` found for this training before,
    as its checkpoints record it; None where none of them is this training's.

    `fingerprint` is this training's with each process's share of an update as one micro-batch. Looked
    at: the checkpoint `resume_from` names, else every complete checkpoint of `output_dir`, newest first,
    then those set aside in `checkpoints.previous-<n>/` at or before `max_train_steps`, furthest first
    (`restore_own_training` brings this training's furthest such one back); then `continue_from` (another
    folder's, online GORS: the previous round's). A checkpoint is this training's when it differs from
    `fingerprint` in the micro-batch alone, as many samples per update.
    """
    share = fingerprint["train_batch_size"] * fingerprint["gradient_accumulation_steps"]
    if resume_from:
        found = find_checkpoint(output_dir, resume_from, warn=lambda message: None)
        candidates = [(found, read_marker(found)["fingerprint"])] if found is not None else []
    else:
        candidates = [(folder, marker["fingerprint"]) for folder, marker in complete_checkpoints(output_dir)]
        set_aside = [(folder, marker["fingerprint"]) for aside in set_aside_checkpoints(output_dir)
                     for folder, marker in complete_checkpoints(output_dir, aside.name)
                     if max_train_steps is None or checkpoint_step(folder) <= max_train_steps]
        candidates += sorted(set_aside, key=lambda candidate: checkpoint_step(candidate[0]), reverse=True)
    own = [(recorded, True) for _, recorded in candidates]
    marker = read_marker(continue_from) if continue_from is not None else None  # None: refused later, as incomplete
    other = [(marker["fingerprint"], False)] if marker is not None else []
    for recorded, with_selection in own + other:
        if (not fingerprint_differences(recorded, fingerprint, with_selection=with_selection, ignore=MICRO_BATCH_FIELDS)
                and recorded["train_batch_size"] * recorded["gradient_accumulation_steps"] == share):
            return recorded["train_batch_size"]
    return None


def utc_now() -> str:
    """The time now in UTC, ISO 8601 to the second: as checkpoint markers record it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def complete_checkpoints(output_dir: str | Path, folder: str = CHECKPOINTS_DIR, replaced: bool = False
                         ) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(folder, marker) of each complete checkpoint of a run folder, newest first; `folder`: the folder of the
    run's checkpoints they are in (`checkpoints.previous-<n>` for a training set aside). `replaced`: with the
    checkpoints a killed save left renamed `.checkpoint-<step>.old`, for readers that must not move them."""
    for checkpoint in reversed(_checkpoint_folders(Path(output_dir) / folder, replaced)):
        marker = read_marker(checkpoint)
        if marker is not None:
            yield checkpoint, marker


def previous_name(folder: Path) -> Path:
    """The first free `<folder>.previous-<n>` (n from 1): where a folder of an earlier training is set aside."""
    number = 1
    while (aside := folder.with_name(f"{folder.name}.previous-{number}")).exists():
        number += 1
    return aside


def set_aside_checkpoints(output_dir: str | Path) -> list[Path]:
    """The `checkpoints.previous-<n>/` folders of `output_dir`: checkpoints that trainings with other settings set
    aside (`previous_name`), in the order they were set aside (previous-2 before previous-10)."""
    return in_numbered_order(Path(output_dir).glob(f"{CHECKPOINTS_DIR}.previous-*"))


def set_aside_logs(logs: Path) -> Path | None:
    """Rename a logging folder that holds any file to `previous_name(logs)`; returns where, else None.

    For a training that starts at step 0: the TensorBoard events already there are another training's (or
    those of an attempt stopped before its first checkpoint, whose steps this one trains again), and a
    report that keeps the latest event per step would join their steps to this training's.
    """
    if not logs.is_dir() or not any(path.is_file() for path in logs.rglob("*")):
        return None
    aside = previous_name(logs)
    logs.rename(aside)
    return aside


def set_aside_other_trainings(output_dir: str | Path, fingerprint: dict[str, Any],
                              with_folders: Sequence[str] = ()) -> tuple[Path, list[str]] | None:
    """Rename `checkpoints/` to `checkpoints.previous-<n>/` when it holds complete checkpoints of
    another training (other settings or selection); returns (where, the differences), else None.

    `with_folders`: folders of the run folder that belong to that training too (its `best/` LoRA and
    `validation/` results); they go into `checkpoints/` first, so that a kill between the renames
    leaves them with the checkpoints, and the next run sets them aside together, or, a run of that
    training, puts them back.

    A run that was not asked to resume then starts beside nothing of another training's: their
    steps would otherwise stand next to its own, and `latest` would later pick one of theirs. They
    are kept, not deleted (main process only, before any other process looks).
    """
    root = Path(output_dir) / CHECKPOINTS_DIR
    for _, marker in complete_checkpoints(output_dir):
        recorded = marker["fingerprint"]
        differences = fingerprint_differences(recorded, fingerprint)
        if differences:
            aside = previous_name(root)
            for name in with_folders:
                if (Path(output_dir) / name).is_dir() and not (root / name).exists():
                    (Path(output_dir) / name).rename(root / name)
            root.rename(aside)
            return aside, differences
    # A kill between those renames, then a rerun of the checkpoints' own training: its folders go back.
    _return_folders(output_dir, with_folders)
    return None


def _return_folders(output_dir: str | Path, with_folders: Sequence[str]) -> None:
    """Move the folders of `with_folders` that `checkpoints/` holds back into the run folder, where it has none."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    for name in with_folders:
        if (root / name).is_dir() and not (Path(output_dir) / name).exists():
            (root / name).rename(Path(output_dir) / name)


def restore_own_training(output_dir: str | Path, fingerprint: dict[str, Any], max_train_steps: int,
                         with_folders: Sequence[str] = ()) -> Path | None:
    """Where `checkpoints/` holds no complete checkpoint, rename back to it the `checkpoints.previous-<n>/` that
    holds the furthest checkpoint of this very training (same fingerprint, at or before `max_train_steps`), with
    its `with_folders` (`set_aside_other_trainings`); returns the folder it was, else None.

    A run with other settings in between (a mistyped flag) set this training's checkpoints aside: the same
    command as before then goes on from them, as it was told it would, instead of from step 0. A `checkpoints/`
    without a complete checkpoint (a training killed before its first) is set aside in its place: nothing is
    deleted (main process only, before any other process looks).
    """
    if next(complete_checkpoints(output_dir), None) is not None:
        return None
    furthest = set_aside_own_checkpoint(output_dir, fingerprint, max_train_steps)
    if furthest is None:
        return None
    found = furthest.parent
    bring_back(output_dir, found, with_folders)
    return found


def set_aside_own_checkpoint(output_dir: str | Path, fingerprint: dict[str, Any], max_train_steps: int
                             ) -> Path | None:
    """The furthest checkpoint of this very training (`own_checkpoint`) in the `checkpoints.previous-<n>/` of
    `output_dir`, else None."""
    own = [checkpoint for aside in set_aside_checkpoints(output_dir)
           if (checkpoint := own_checkpoint(output_dir, fingerprint, max_train_steps, aside.name)) is not None]
    return max(own, key=checkpoint_step, default=None)


def bring_back(output_dir: str | Path, aside: Path, with_folders: Sequence[str] = ()) -> Path | None:
    """Make the set-aside `aside` (a `checkpoints.previous-<n>/`) `checkpoints/` again, its `with_folders` back in
    the run folder; what `checkpoints/` and those folders held (another training's, or one stopped before its
    first checkpoint) goes aside in its place, as `set_aside_other_trainings` sets a training aside. Returns where
    that went, None where there was nothing. Nothing is deleted (main process only, before any other looks)."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    between = [name for name in with_folders if (Path(output_dir) / name).exists()]
    if between:
        root.mkdir(exist_ok=True)
        for name in between:
            if not (root / name).exists():
                (Path(output_dir) / name).rename(root / name)
    moved = None
    if root.exists():
        moved = previous_name(root)
        root.rename(moved)
    aside.rename(root)
    _return_folders(output_dir, with_folders)
    return moved


def own_checkpoint(output_dir: str | Path, fingerprint: dict[str, Any], max_train_steps: int,
                   folder: str = CHECKPOINTS_DIR) -> Path | None:
    """The checkpoint a run without `--resume_from_checkpoint` goes on from: the newest complete one of
    this very training (same fingerprint) at or before `max_train_steps` (in `folder`, as `complete_checkpoints`);
    None when there is none.

    Training is a function of the seed and the step, so going on from it gives what starting again
    would, without redoing its steps.
    """
    return next((checkpoint for checkpoint, marker in complete_checkpoints(output_dir, folder)
                 if not fingerprint_differences(marker["fingerprint"], fingerprint)
                 and checkpoint_step(checkpoint) <= max_train_steps),
                None)


def later_checkpoint(output_dir: str | Path, fingerprint: dict[str, Any], max_train_steps: int) -> Path | None:
    """The newest complete checkpoint of this very training past `max_train_steps` (a longer run's), else None."""
    return next((folder for folder, marker in complete_checkpoints(output_dir)
                 if not fingerprint_differences(marker["fingerprint"], fingerprint)
                 and checkpoint_step(folder) > max_train_steps),
                None)


def check_resumable(checkpoint: Path, fingerprint: dict[str, Any], max_train_steps: int,
                    output_dir: str | Path | None = None) -> int:
    """The step of `checkpoint`, after checking that this run (of `output_dir`) may continue from it.

    Refused, with each difference named: a checkpoint made under another fingerprint (its adapters
    or optimizer would not load, or the run would continue on other data or settings), and one past
    `max_train_steps` (its weights are already trained further than asked). One of another run folder
    is said to be so, as its selection is that folder's.
    """
    step = checkpoint_step(checkpoint)
    differences = fingerprint_differences(read_marker(checkpoint)["fingerprint"], fingerprint)
    # This folder's `checkpoints.previous-<n>/` are its own too.
    if differences and output_dir is not None and checkpoint.resolve().parent.parent != Path(output_dir).resolve():
        raise ValueError(
            f"cannot resume from {checkpoint}: it is a checkpoint of another run folder ({checkpoint.parent.parent}), "
            f"trained on its selection and settings ({'; '.join(differences)}). Resume this folder from one of its own "
            f"(--resume_from_checkpoint latest, or a folder under {Path(output_dir) / CHECKPOINTS_DIR}), or run the "
            f"training of that folder (--output_dir {checkpoint.parent.parent})."
        )
    if differences:
        hint = " (selection.jsonl changed since, e.g. by another `gors select`)" if any(
            d.startswith("selection_") for d in differences) else ""
        # The schedule's length matters where the schedule itself is the same; otherwise that is the difference.
        if any(d.startswith("lr_schedule_steps ") for d in differences) and \
                not any(d.startswith("lr_scheduler ") for d in differences):
            hint += (f" (--lr_scheduler {fingerprint.get('lr_scheduler')} decays over the run's --max_train_steps: "
                     "resume with the number the run started with)")
        furthest = set_aside_own_checkpoint(output_dir, fingerprint, max_train_steps) if output_dir else None
        if furthest is not None:  # a run with other settings (a mistyped flag) set these settings' training aside
            raise ValueError(
                f"cannot resume from {checkpoint}: it belongs to a run with other settings{hint}: "
                f"{'; '.join(differences)}. {furthest} is a checkpoint of these settings, set aside by that run: "
                f"rerun without --resume_from_checkpoint to go on from it (what {CHECKPOINTS_DIR}/ holds is set aside "
                f"in its place), or pass --resume_from_checkpoint {furthest}."
            )
        raise ValueError(
            f"cannot resume from {checkpoint}: it belongs to a run with other settings{hint}: {'; '.join(differences)}. "
            f"Resume with the original settings, or train these ones from scratch: without --resume_from_checkpoint "
            f"in a new --output_dir (or after moving {checkpoint.parent} away)."
        )
    if step > max_train_steps:
        raise ValueError(
            f"cannot resume from {checkpoint}: it is at step {step}, past --max_train_steps={max_train_steps}. "
            f"Pass --max_train_steps {step} or more, or train the shorter run from scratch in a new --output_dir."
        )
    return step


def file_digests(folder: Path) -> dict[str, dict[str, Any]]:
    """{path relative to `folder`: {"bytes", "sha256"}} of each file in it but the marker: what a checkpoint's
    marker records, so that a resume notices a file damaged since (cut short, overwritten)."""
    return {file.relative_to(folder).as_posix(): {"bytes": file.stat().st_size, "sha256": file_sha256(file)}
            for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKPOINT_MARKER)}


def checkpoint_damage(checkpoint: Path, names: Sequence[str] | None = None) -> str | None:
    """The first file of a complete checkpoint (of `names`, default all) that does not hold what was saved,
    in words; None when all do (or for a checkpoint made before the marker recorded its files)."""
    recorded = read_marker(checkpoint).get("files")
    if recorded is None:
        return None
    for name, saved in recorded.items():
        if names is not None and name not in names:
            continue
        file = checkpoint / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != saved["bytes"]:
            return f"{name} holds {file.stat().st_size} bytes, {saved['bytes']} were saved"
        if file_sha256(file) != saved["sha256"]:
            return f"{name} holds other bytes than were saved"
    return None


def check_intact(checkpoint: Path, resume_from: str | None = None, names: Sequence[str] | None = None) -> None:
    """Refuse a checkpoint whose files (of `names`, default all) changed since they were saved: accelerate
    would stop on a file cut short with a traceback, and pass over a damaged RNG state without a word.

    `resume_from`: how the run came to it, for the fix the error gives: None (a run going on from its own
    checkpoint), 'latest', a folder named by `--resume_from_checkpoint`, or 'continue' (the previous round's
    checkpoint, which an online round trains on from).
    """
    problem = checkpoint_damage(checkpoint, names)
    if problem is None:
        return
    damaged = f"{checkpoint} is damaged since it was saved: {problem}"
    if resume_from == "continue":
        raise ValueError(f"{damaged}. The next round trains on from it: restore it from a backup, or run the rounds "
                         "again in a new --output_dir")
    before = [p for p in _checkpoint_folders(checkpoint.parent)
              if checkpoint_step(p) < checkpoint_step(checkpoint) and read_marker(p) is not None]
    if resume_from not in (None, "latest"):
        fix = f"pass --resume_from_checkpoint {before[-1]}" if before else "train without --resume_from_checkpoint"
        raise ValueError(f"{damaged}. Delete that folder and {fix}, or restore it from a backup")
    then = f"training goes on from {before[-1]}" if before else "training starts again from step 0"
    raise ValueError(f"{damaged}. Delete that folder ({then}), or restore it from a backup")


def prune_checkpoints(keep: Path, limit: int | None) -> None:
    """Delete the oldest complete checkpoints beside `keep` so that, with it, at most `limit` remain. Those
    after `keep` (a longer run's, which a shorter run of the same training went on before) are not counted
    and stay: `--max_train_steps` with their step goes on from them. Called after each save and on resuming
    (a run killed between publishing a checkpoint and pruning left one too many)."""
    if limit is None:
        return
    root = keep.parent
    step = checkpoint_step(keep)
    others = [p for p in _checkpoint_folders(root)
              if p != keep and checkpoint_step(p) < step and read_marker(p) is not None]
    for old in others[: max(0, len(others) - limit + 1)]:
        discard_folder(old)  # whole or gone: a kill must not leave a checkpoint whose marker outlived its files


def recover_replaced_checkpoints(output_dir: str | Path) -> None:
    """Put back each checkpoint that a save replacing it (`publish_folder`) had renamed `.checkpoint-<step>.old`
    when it was killed, before the new one took its name: complete, it is one to resume from (main process)."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    for final, _ in left_aside(root, "checkpoint-*"):
        recover_folder(final)


def write_checkpoint(accelerator: Accelerator, output_dir: str | Path, step: int, fingerprint: dict[str, Any],
                     total_limit: int | None, max_train_steps: int | None = None,
                     since: dict[str, Any] | None = None) -> Path:
    """Save the full training state as `checkpoints/checkpoint-<step>`, atomically; call on every process.
    Recorded for `gors status` (no resume reads them): `max_train_steps`, the step the training goes to, and
    `since`, the step and UTC time (`utc_now`) this process's training loop started from, so that the pace
    is read without the time a run was down between a kill and its resume."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    final = root / f"checkpoint-{step}"
    # A deterministic name, so that every process writes into the same folder.
    staging = root / f".{final.name}.tmp"
    if accelerator.is_main_process:
        recover_replaced_checkpoints(output_dir)
        for stale in root.glob(".checkpoint-*"):  # left by a run killed while saving
            shutil.rmtree(stale)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()  # every process has written its RNG state
    if accelerator.is_main_process:
        atomic_write_json(staging / CHECKPOINT_MARKER, {
            "step": step,
            **({"max_train_steps": max_train_steps} if max_train_steps is not None else {}),
            **({"since": since} if since is not None else {}),
            "time": utc_now(),
            "gors_version": gors.__version__,
            "fingerprint": fingerprint,
            "files": file_digests(staging),
        })
        publish_folder(staging, final)
        prune_checkpoints(final, total_limit)
    accelerator.wait_for_everyone()
    return final
