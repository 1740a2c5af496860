"""Scoring a sample store with a reward: resumable score shards, one per process, with their settings.

Scores go to `<folder>/part-XXXXX.jsonl` (one line per image: the reward in [0, 1] and its
details), appended batch by batch, so an interruption loses at most the batch in flight.
`settings.json` beside them records the scorer that made them; other settings are refused once
the folder holds scores.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator
from PIL import Image

from gors.core.distributed import batches, progress_bar
from gors.core.io import append_jsonl, atomic_write_json, repair_jsonl
from gors.core.run_folder import scores_dir
from gors.core.store import SampleKey, SampleStore, StoreError, read_rows, sample_key


class ScoreOutput(Protocol):
    scores: list[float]
    details: list[dict[str, Any]]


class Scorer(Protocol):
    """What scoring needs of a reward (`rewards.Reward` is one): scores in [0, 1] and details per image."""

    def score(self, images: Sequence[Image.Image], prompts: Sequence[str],
              metadata: Sequence[dict[str, Any]] | None = None) -> ScoreOutput: ...


SETTINGS_FILE = "settings.json"  # the reward and options that filled a score folder


def read_score_rows(folder: Path) -> dict[SampleKey, dict]:
    """Every score row in a folder of `part-*.jsonl` files, by sample key."""
    return {sample_key(row): row for row in read_rows(sorted(Path(folder).glob("part-*.jsonl")))}


def load_scores(output_dir: str | Path, reward: str) -> dict[SampleKey, dict]:
    """Every score row written so far for `reward` in a run folder, by sample key."""
    return read_score_rows(scores_dir(output_dir, reward))


def check_settings(scores_folder: Path, wanted: Mapping[str, Any], scored: bool) -> bool:
    """Refuse a folder holding scores made with other scorer settings; returns whether to record `wanted`.

    A settings file without any score row (e.g. left by a reward that failed to build) blocks nothing:
    it is replaced. A folder with scores but no settings file (an older gors) takes `wanted`.
    """
    path = Path(scores_folder) / SETTINGS_FILE
    recorded = json.loads(path.read_text()) if path.is_file() else None
    if recorded == wanted:
        return False
    if recorded is not None and scored:
        raise StoreError(
            f"{scores_folder} holds scores made with {json.dumps(recorded, sort_keys=True)}, not the "
            f"{json.dumps(wanted, sort_keys=True)} asked for now. Use a new output folder, or delete "
            f"{scores_folder} to score again."
        )
    return True


def score_samples(
    store: SampleStore | Any,
    scores_folder: Path,
    make_reward: Callable[[], Scorer],
    batch_size: int,
    accelerator: Accelerator,
    desc: str = "score",
    prompt_metadata: Sequence[dict[str, Any]] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[SampleKey, dict]:
    """Score the store's unscored samples into `scores_folder/part-<rank>.jsonl`; returns all rows.

    Resumable: samples with a row are skipped; rows are appended batch by batch. The reward is
    built (by `make_reward`) only on processes that have work. Each sample's metadata for the
    reward is its store record, merged over `prompt_metadata[prompt_index]` when given (e.g. a
    benchmark's per-prompt clauses). `store` is anything with `records()` and `open_image(record)`.
    `settings` (JSON-able: the reward and its options) are recorded in the folder; a folder that
    holds scores made with other settings is refused, so scores of two configurations never mix.
    """
    done = read_score_rows(scores_folder)
    as_json = json.loads(json.dumps(settings, sort_keys=True, default=str)) if settings is not None else None
    record_settings = as_json is not None and check_settings(scores_folder, as_json, scored=bool(done))
    records = store.records()
    for record in records:
        row = done.get(sample_key(record))
        if row is not None and row["prompt"] != record["prompt"]:
            raise StoreError(
                f"{scores_folder} holds a score of prompt {row['prompt']!r} for sample {sample_key(record)}, whose "
                f"prompt is now {record['prompt']!r}: it belongs to another run. Use a new output folder."
            )
    todo = [record for record in records if sample_key(record) not in done]
    out_file = Path(scores_folder) / f"part-{accelerator.process_index:05d}.jsonl"
    if accelerator.is_main_process:
        print(f"[{desc}] {len(done)} samples scored, {len(todo)} to score")
        for part in sorted(Path(scores_folder).glob("part-*.jsonl")):
            repair_jsonl(part)  # a torn row's sample is in `todo`: it is scored again
        if record_settings:
            atomic_write_json(Path(scores_folder) / SETTINGS_FILE, as_json)
    # Nothing is appended before every process has read the rows (they split the same `todo`)
    # and torn rows are cut.
    accelerator.wait_for_everyone()
    with accelerator.split_between_processes(todo) as mine:  # contiguous shares, sizes differ by at most one
        if mine:
            reward = make_reward()
            bar = progress_bar(len(mine), accelerator, desc)
            for batch in batches(mine, batch_size):
                images = [store.open_image(record) for record in batch]
                metadata = batch
                if prompt_metadata is not None:
                    metadata = [{**prompt_metadata[r["prompt_index"]], **r} for r in batch]
                output = reward.score(images, [r["prompt"] for r in batch], metadata=metadata)
                if not len(output.scores) == len(output.details) == len(batch):
                    raise RuntimeError(
                        f"{type(reward).__name__} returned {len(output.scores)} scores and {len(output.details)} "
                        f"details for {len(batch)} images; a scorer returns one score and one details dict per "
                        f"image. Nothing of this batch was written; fix the scorer and score again."
                    )
                rows = [
                    {"prompt_index": r["prompt_index"], "image_index": r["image_index"], "path": r["path"],
                     "prompt": r["prompt"], "reward": value, "details": details}
                    for r, value, details in zip(batch, output.scores, output.details)
                ]
                append_jsonl(out_file, rows)
                bar.update(len(batch))
            bar.close()
    accelerator.wait_for_everyone()
    wanted = {sample_key(record) for record in records}  # rows of samples no longer asked for stay on disk only
    return {key: row for key, row in read_score_rows(scores_folder).items() if key in wanted}
