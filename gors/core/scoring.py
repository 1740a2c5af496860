"""Scoring a sample store with a reward: resumable score shards, one per process, with their settings.

Scores go to `<folder>/part-XXXXX.jsonl` (one line per image: the reward in [0, 1], its details
and the hash of the image file scored), appended batch by batch, so an interruption loses at most
the batch in flight. `settings.json` beside them records the scorer that made them, and `models.json` the
version of each model it loaded (its Hub commit, or a local folder's fingerprint); other settings, or another
version of a model, are refused once the folder holds scores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator
from PIL import Image

from gors.core.clock import units_done, work_starts
from gors.core.distributed import (
    NOT_VISIBLE,
    SAME_SNAPSHOT_FIX,
    batches,
    check_agreement,
    main_process_decides,
    progress_bar,
    wait_until_visible,
)
from gors.core.io import append_jsonl, atomic_write_json, filter_jsonl, read_json_if_present, repair_jsonl
from gors.core.io_threads import prefetched
from gors.core.logs import first_time
from gors.core.memory import MORE_MEMORY, BatchLimit, in_batches_that_fit
from gors.core.run_folder import reward_column, samples_dir, scores_dir
from gors.core.store import (
    IMAGE_HASH,
    SampleKey,
    SampleStore,
    StoreError,
    adopt_later_settings,
    check_cached_commits,
    check_model_commits,
    read_rows,
    same_image,
    sample_key,
    settings_changes,
)


class ScoreOutput(Protocol):
    """A scored batch: one score in [0, 1] and one JSON-serialisable details mapping per image, in order."""

    scores: list[float]
    details: list[dict[str, Any]]


class Scorer(Protocol):
    """What scoring needs of a reward (`rewards.Reward` is one): scores in [0, 1] and details per image."""

    def score(self, images: Sequence[Image.Image], prompts: Sequence[str],
              metadata: Sequence[dict[str, Any]] | None = None) -> ScoreOutput:
        """Score `images` against their `prompts` (same length); `metadata`: the store's record of each image."""


class RewardError(RuntimeError):
    """A reward's output breaks the protocol (a score missing, not a number or out of range, details
    that are not JSON): a bug of that reward, which the message names with the image and its prompt."""


def checked_scores(name: str, output: ScoreOutput, prompts: Sequence[str],
                   score_range: tuple[float, float] = (0.0, 1.0)) -> list[float]:
    """The scores of scorer `name`'s `output` on `prompts` as plain floats, after checking the protocol:
    one finite score in `score_range` and one JSON-writable details dict per image. Else a `RewardError`
    naming the image, its prompt and the value, so that nothing of the batch is written."""
    low, high = score_range
    try:  # a list, or a numpy array or tensor of scores
        scores, details = list(output.scores), list(output.details)
    except (AttributeError, TypeError):
        raise RewardError(f"{name} returned a {type(output).__name__}; return a RewardOutput(scores=..., "
                          "details=...), one score and one details dict per image") from None
    if len(scores) != len(prompts) or len(details) != len(prompts):
        raise RewardError(f"{name} returned {len(scores)} scores and {len(details)} details for {len(prompts)} "
                          "images; a reward returns one of each per image")
    checked = []
    for index, value in enumerate(scores):
        where = f"for image {index} ({prompts[index]!r})"
        try:
            value = float(value)  # a numpy or 0-d torch number is written as a plain float
        except (TypeError, ValueError):
            raise RewardError(f"{name} returned {value!r} {where}, not a number; each score is a float in "
                              f"[{low}, {high}]") from None
        if not math.isfinite(value):
            raise RewardError(f"{name} returned {value} {where}, not a finite number; each score is a float "
                              f"in [{low}, {high}]")
        if not low - 1e-6 <= value <= high + 1e-6:
            raise RewardError(f"{name} returned {value} {where}, outside [{low}, {high}]; clip or rescale its "
                              "scores into that range")
        checked.append(value)
    for index, entry in enumerate(details):
        if not isinstance(entry, dict):
            raise RewardError(f"{name} returned details of type {type(entry).__name__} for image {index} "
                              f"({prompts[index]!r}); each image's details are a dict")
        try:
            json.dumps(entry)
        except (TypeError, ValueError) as err:
            raise RewardError(f"{name}'s details for image {index} cannot be written as JSON ({err}) for prompt "
                              f"{prompts[index]!r}; give plain numbers, strings, lists and dicts (e.g. float(x), "
                              "array.tolist())") from None
    return checked


SETTINGS_FILE = "settings.json"  # the reward and options that filled a score folder
_PART = re.compile(r"part-\d{5,}\.jsonl")  # `score_part`'s names

logger = logging.getLogger(__name__)


def _score_parts(folder: Path) -> list[Path]:
    """The folder's score files as `score_part` names them: a copy set aside beside them
    (`part-00000.old.jsonl`) would otherwise mix its rows in."""
    return sorted(path for path in Path(folder).glob("part-*.jsonl") if _PART.fullmatch(path.name))


def _rows_by_key(folder: Path) -> dict[SampleKey, list[dict]]:
    rows: dict[SampleKey, list[dict]] = {}
    for row in read_rows(_score_parts(folder)):
        rows.setdefault(sample_key(row), []).append(row)
    return rows


def read_score_rows(folder: Path, records: Sequence[dict[str, Any]]) -> dict[SampleKey, dict]:
    """The score rows of `records` (a store's) in a folder of `part-*.jsonl` files, by sample key.

    Only a row of the record's own image file counts (`same_image`): a sample generated again
    since it was scored has no score until it is scored again.
    """
    return _current_rows(_rows_by_key(folder), records)


def _current_rows(rows: Mapping[SampleKey, list[dict]], records: Sequence[dict[str, Any]]) -> dict[SampleKey, dict]:
    """Of `rows` (by key), the one of each record's own image file, with the record's path."""
    return {
        sample_key(record): row | {"path": record["path"]}  # the image, made again with the same bytes, may have moved
        for record in records
        for row in rows.get(sample_key(record), ())
        if same_image(row, record)
    }


def load_scores(output_dir: str | Path, reward: str,
                records: Sequence[dict[str, Any]] | None = None) -> dict[SampleKey, dict]:
    """The score rows written so far for `reward` in a run folder, by sample key: of `records`, by
    default every record of the run's sample store (`read_score_rows`)."""
    if records is None:
        records = SampleStore(samples_dir(output_dir)).records()
    return read_score_rows(scores_dir(output_dir, reward), records)


# Settings keys a later gors added: a score folder recorded before it lacks them and is taken to
# have been scored with the current value (as a folder without settings is), with a warning.
LATER_SCORE_SETTINGS = ("dtype",)
# The sha256 of a plugin reward's source file (`rewards.combined.plugin_sources`): informational, never
# refusing (an edited docstring would refuse every score), so that an edit is warned of.
SOURCES_SETTING = "plugin_sources"


def check_settings(scores_folder: Path, wanted: Mapping[str, Any], scored: bool) -> bool:
    """Refuse a folder holding scores made with other scorer settings; returns whether to record `wanted`.

    A settings file without any score row (e.g. left by a reward that failed to build) blocks nothing:
    it is replaced. A folder with scores but no settings file, or one that lacks a key of
    `LATER_SCORE_SETTINGS` (an older gors), takes `wanted` with a warning.
    """
    path = Path(scores_folder) / SETTINGS_FILE
    fix = ("restore the file, or delete it and score again with the reward and options that made the scores, which "
           "records them again (unchecked: it cannot know they made them)")
    recorded = read_json_if_present(path, f"the scorer settings gors writes there: {fix}")
    if recorded is not None and not isinstance(recorded, dict):
        raise StoreError(f"{path} holds no settings mapping, which gors writes there: {fix}")
    if recorded == wanted:
        return False
    if not scored:
        return True
    if recorded is None:
        logger.warning("%s holds scores but no record of the scorer settings that made them (an older gors, or the "
                       "file deleted); they are taken to have been made with the current ones: %s. If they were not, "
                       "delete the folder to score again", scores_folder, json.dumps(wanted, sort_keys=True, default=str))
        return True
    recorded_sources, sources = recorded.get(SOURCES_SETTING), wanted.get(SOURCES_SETTING)
    compared = {key: value for key, value in wanted.items() if key != SOURCES_SETTING}
    completed, adopted = adopt_later_settings({key: value for key, value in recorded.items() if key != SOURCES_SETTING},
                                              compared, LATER_SCORE_SETTINGS)
    changes = settings_changes(completed, compared)
    if changes:
        raise StoreError(f"{scores_folder} holds scores made with other settings than asked for now "
                         f"({'; '.join(changes)}). Use a new output folder, or delete {scores_folder} to score again.")
    # Scores kept (the refusal above would say more): once per command, as overlapped scoring opens the folder twice.
    if isinstance(recorded_sources, dict) and recorded_sources != sources and first_time("edited plugin", scores_folder):
        edited = sorted(name for name, digest in (sources or {}).items() if recorded_sources.get(name) != digest)
        logger.warning("%s holds scores made when the source file of %s was another: the scores are kept as they "
                       "are; if the change changes them, raise the reward's scoring_version (the folder then refuses "
                       "them) or delete the folder to score again", scores_folder, ", ".join(edited) or "a reward")
    if not adopted:  # the same settings, a path spelled otherwise (`same_value`): the record stays as it is
        return recorded_sources is None and sources is not None  # but takes the sources it did not record
    logger.warning("%s was scored before gors recorded the scorer's %s; its scores are taken to have been made "
                   "with %s (if they were not, e.g. a Qwen3-VL reward scored in float16 by an older gors, delete "
                   "the folder to score again)", scores_folder, ", ".join(adopted),
                   ", ".join(f"{k}={wanted[k]}" for k in adopted))
    return True


def open_score_folder(
    scores_folder: Path,
    records: Sequence[dict[str, Any]],
    accelerator: Accelerator,
    settings: Mapping[str, Any] | None = None,
) -> dict[SampleKey, dict]:
    """Make a score folder ready for appending, on every process (a collective call); returns its rows.

    Refuses a folder whose scores were made with other `settings` (JSON-able: the reward and its
    options) or belong to other prompts; on the main process cuts torn rows and removes the rows of
    images generated again since they were scored (`same_image`): those samples are scored again.
    Records `settings`. The main process changes no file, and no process appends, before all of them
    have read the rows.
    """
    rows = _rows_by_key(scores_folder)
    as_json = json.loads(json.dumps(settings, sort_keys=True, default=str)) if settings is not None else None
    record_settings = as_json is not None and check_settings(scores_folder, as_json, scored=bool(rows))
    by_key = {sample_key(record): record for record in records}
    for key, record in by_key.items():
        for row in rows.get(key, ()):
            if row["prompt"] != record["prompt"]:
                raise StoreError(
                    f"{scores_folder} holds a score of prompt {row['prompt']!r} for sample {key}, whose prompt is "
                    f"now {record['prompt']!r}: it belongs to another run. Use a new output folder."
                )

    def current_or_other(row: dict) -> bool:  # a row of a sample asked for must be of its current image
        return sample_key(row) not in by_key or same_image(row, by_key[sample_key(row)])

    done = _current_rows(rows, records)
    stale = sum(not current_or_other(row) for found in rows.values() for row in found)
    accelerator.wait_for_everyone()  # every process has read the parts before the main process replaces them
    if accelerator.is_main_process:
        for part in _score_parts(scores_folder):
            repair_jsonl(part)
            if stale:
                filter_jsonl(part, current_or_other)
        if stale:
            logger.warning("%s held %d scores not of the samples' current image files (generated again since, or "
                           "scored by a gors that did not record image hashes); those samples are scored again",
                           scores_folder, stale)
        if record_settings:
            atomic_write_json(Path(scores_folder) / SETTINGS_FILE, as_json)
    accelerator.wait_for_everyone()
    return done


def scorer_commits(scorer: Scorer) -> dict[str, str | None]:
    """The version of each model `scorer` loaded (`Reward.model_commits`: Hub commit, local fingerprint; {} for a
    scorer that does not tell)."""
    return dict(getattr(scorer, "model_commits", None) or {})


def build_checked_reward(scores_folder: Path, make_reward: Callable[[], Scorer], scored: bool) -> Scorer:
    """`make_reward()`, with the folder's recorded model commits (`check_model_commits`) checked against
    the cache before it loads anything and against what it loaded after (`Reward.model_commits`, filled by
    `rewards.combined.build_reward`; a scorer that does not tell records nothing). `scored`: whether the
    folder holds scores."""
    check_cached_commits(scores_folder, scored, "scores")
    reward = make_reward()
    check_model_commits(scores_folder, scorer_commits(reward), scored, "scores")
    return reward


def score_part(scores_folder: Path, process_index: int) -> Path:
    """The file one process appends its score rows to."""
    return Path(scores_folder) / f"part-{process_index:05d}.jsonl"


def score_rows(
    reward: Scorer,
    records: Sequence[dict[str, Any]],
    images: Sequence[Image.Image],
    prompt_metadata: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Score one batch of store records (with their `path`) and their images; one row per sample.

    Each sample's metadata for the reward is its record, merged over `prompt_metadata[prompt_index]`
    when given (e.g. a benchmark's per-prompt clauses). A scorer that does not return one score and
    one details dict per image is an error, and nothing of the batch is returned.
    """
    metadata = list(records)
    if prompt_metadata is not None:
        metadata = [{**prompt_metadata[r["prompt_index"]], **r} for r in records]
    prompts = [r["prompt"] for r in records]
    output = reward.score(images, prompts, metadata=metadata)
    # Again here: a reward class may override `score`, which checks its own outputs (`Reward._checked`).
    scores = checked_scores(type(reward).__name__, output, prompts)
    return [
        {"prompt_index": r["prompt_index"], "image_index": r["image_index"], "path": r["path"],
         IMAGE_HASH: r.get(IMAGE_HASH), "prompt": r["prompt"], "reward": value, "details": details}
        for r, value, details in zip(records, scores, output.details)
    ]


def append_scores(reward: Scorer, records: Sequence[dict[str, Any]], images: Sequence[Image.Image], out_file: Path,
                  prompt_metadata: Sequence[dict[str, Any]] | None, size: int, batch_flag: str | None,
                  at_one: str = MORE_MEMORY, limit: BatchLimit | None = None) -> int:
    """Score `records` (their `images`) and append their rows to `out_file`, `size` images per reward call,
    halved while the device runs out of memory (`in_batches_that_fit`, with `limit`); returns the size that fit."""
    def score_batch(batch: list[tuple[dict[str, Any], Image.Image]]) -> None:
        rows = score_rows(reward, [record for record, _ in batch], [image for _, image in batch], prompt_metadata)
        append_jsonl(out_file, rows)

    return in_batches_that_fit(list(zip(records, images, strict=True)), size, score_batch, "scoring",
                               "images per reward call", batch_flag, at_one, limit)


def score_samples(
    store: SampleStore | Any,
    scores_folder: Path,
    make_reward: Callable[[], Scorer],
    batch_size: int,
    accelerator: Accelerator,
    desc: str = "score",
    prompt_metadata: Sequence[dict[str, Any]] | None = None,
    settings: Mapping[str, Any] | None = None,
    batch_flag: str | None = None,
    limit: BatchLimit | None = None,
) -> dict[SampleKey, dict]:
    """Score the store's unscored samples into `scores_folder/part-<rank>.jsonl`; returns all rows.

    Resumable: samples with a row of their current image file are skipped; rows are appended batch by batch. The reward is
    built (by `make_reward`) only on processes that have work. `prompt_metadata`: see
    `score_rows`. `store` is anything with `records()` and `open_image(record)`. `settings` are
    recorded in the folder (`open_score_folder`), so scores of two configurations never mix.
    `batch_flag`: the flag that sets `batch_size`, named when a batch does not fit the device (it is then
    halved: `append_scores`). `limit`: the size that fit in an earlier call, and where this one's halvings go.
    """
    records = store.records()
    # A reward scoring again (its score folder deleted) is not shown its own earlier scores, which the store's
    # records keep as a column: every other reward's are metadata it may read.
    own = reward_column(settings["reward"]) if settings and isinstance(settings.get("reward"), str) else None
    if own is not None and any(own in record for record in records):
        records = [{key: value for key, value in record.items() if key != own} for record in records]
    done = open_score_folder(scores_folder, records, accelerator, settings)

    def plan() -> list[dict[str, Any]]:
        todo = [record for record in records if sample_key(record) not in done]
        print(f"[{desc}] {len(done)} samples scored, {len(todo)} to score")
        return todo

    # The main process's reading for all: a node shown another process's new rows late would split another list.
    todo = main_process_decides(accelerator.state, plan)
    out_file = score_part(scores_folder, accelerator.process_index)
    with accelerator.split_between_processes(todo) as mine:  # contiguous shares, sizes differ by at most one
        reward = build_checked_reward(scores_folder, make_reward, bool(done)) if mine else None
        # Nodes whose own caches hold other snapshots of a model would mix two models' scores in one folder.
        check_agreement(accelerator.state, None if reward is None else scorer_commits(reward), "the models that score",
                        SAME_SNAPSHOT_FIX)
        if mine:
            work_starts()
            bar = progress_bar(len(mine), accelerator, desc)
            # The next batch's images are read (hash checked, PNG decoded) while the reward scores this one.
            read = prefetched(batches(mine, batch_size), lambda batch: [store.open_image(r) for r in batch],
                              name="gors-image-reader")
            with contextlib.closing(read):  # the reader stops with the loop, also when the reward fails
                size = batch_size  # halved while the device runs out of memory
                scored = 0
                for batch, images in read:
                    size = append_scores(reward, batch, images, out_file, prompt_metadata, size, batch_flag,
                                         limit=limit)
                    bar.update(len(batch))
                    scored += len(batch)
                    units_done(scored)
            bar.close()
    accelerator.wait_for_everyone()
    # Rows of samples no longer asked for stay on disk only.
    rows = wait_until_visible(lambda: read_score_rows(scores_folder, records), lambda rows: len(rows) == len(records))
    if len(rows) != len(records):
        raise StoreError(f"{len(records) - len(rows)} of {len(records)} samples have no score in {scores_folder} as "
                         f"{socket.gethostname()} sees it after scoring: {NOT_VISIBLE}")
    return rows
