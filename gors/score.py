"""Stage 2, `gors score`: one reward over every sample in the store.

Scores go to `scores/<reward>/part-XXXXX.jsonl` (one line per image: the reward in [0, 1] and
its details, e.g. B-VQA's questions and probabilities), appended batch by batch, so an
interruption loses at most the batch in flight. When every sample is scored, the reward is also
added as a column `reward_<reward>` to the store's metadata. `settings.json` beside the scores
records the reward and its options; scoring the folder with others is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from gors.config import ScoreConfig
from gors.distributed import batches, make_accelerator, my_share, progress_bar
from gors.generate import samples_dir
from gors.io import append_jsonl, atomic_write_json
from gors.pipeline import inference_dtype
from gors.store import SampleKey, SampleStore, StoreError, read_rows, sample_key
from rewards import Reward
from rewards.combined import build_reward, check_reward

SETTINGS_FILE = "settings.json"  # the reward and options that filled a score folder


def reward_key(reward: str) -> str:
    """A file-name-safe name for a reward spec (e.g. 'my.module:MyReward' -> 'my.module_MyReward')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", reward).strip("_")


def scores_dir(output_dir: str | Path, reward: str) -> Path:
    return Path(output_dir) / "scores" / reward_key(reward)


def read_score_rows(folder: Path) -> dict[SampleKey, dict]:
    """Every score row in a folder of `part-*.jsonl` files, by sample key."""
    return {sample_key(row): row for row in read_rows(sorted(Path(folder).glob("part-*.jsonl")))}


def load_scores(output_dir: str | Path, reward: str) -> dict[SampleKey, dict]:
    """Every score row written so far for `reward` in a run folder, by sample key."""
    return read_score_rows(scores_dir(output_dir, reward))


def check_settings(scores_folder: Path, settings: Mapping[str, Any] | None, accelerator: Accelerator) -> None:
    """Refuse a score folder filled with other scorer settings; record them in a new folder."""
    if settings is None:
        return
    wanted = json.loads(json.dumps(settings, sort_keys=True, default=str))
    path = Path(scores_folder) / SETTINGS_FILE
    if path.is_file():
        recorded = json.loads(path.read_text())
        if recorded != wanted:
            raise StoreError(
                f"{scores_folder} holds scores made with {json.dumps(recorded, sort_keys=True)}, not the "
                f"{json.dumps(wanted, sort_keys=True)} asked for now. Use a new output folder, or delete "
                f"{scores_folder} to score again."
            )
    elif accelerator.is_main_process:
        atomic_write_json(path, wanted)


def score_samples(
    store: SampleStore | Any,
    scores_folder: Path,
    make_reward: Callable[[], Reward],
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
    records other settings is refused, so scores of two configurations never mix.
    """
    check_settings(scores_folder, settings, accelerator)
    records = store.records()
    done = read_score_rows(scores_folder)
    for record in records:
        row = done.get(sample_key(record))
        if row is not None and row["prompt"] != record["prompt"]:
            raise StoreError(
                f"{scores_folder} holds a score of prompt {row['prompt']!r} for sample {sample_key(record)}, whose "
                f"prompt is now {record['prompt']!r}: it belongs to another run. Use a new output folder."
            )
    todo = [record for record in records if sample_key(record) not in done]
    mine = my_share(todo, accelerator)
    out_file = Path(scores_folder) / f"part-{accelerator.process_index:05d}.jsonl"
    if accelerator.is_main_process:
        print(f"[{desc}] {len(done)} samples scored, {len(todo)} to score")
    if mine:
        reward = make_reward()
        bar = progress_bar(len(mine), accelerator, desc)
        for batch in batches(mine, batch_size):
            images = [store.open_image(record) for record in batch]
            metadata = batch if prompt_metadata is None else [{**prompt_metadata[r["prompt_index"]], **r} for r in batch]
            output = reward.score(images, [r["prompt"] for r in batch], metadata=metadata)
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


def score(config: ScoreConfig, accelerator: Accelerator | None = None) -> dict[SampleKey, dict]:
    """Stage 2: score every sample of the run with its reward; returns all its score rows.

    The reward is `config.reward_name(...)` for the store's prompt set: a name, a `module:Class`
    path or a weighted list; its scores go to `scores/<reward_key>/`.
    """
    accelerator = accelerator or make_accelerator()
    store = SampleStore(samples_dir(config.output_dir))
    prompt_info = store.load_prompts()  # fails clearly when nothing was generated
    reward = config.reward_name(prompt_info.get("category"))
    check_reward(reward)  # an unknown name fails before any work

    def make_reward() -> Reward:
        return build_reward(
            reward,
            model_name_or_path=config.reward_model_name_or_path,
            options=config.reward_options,
            device=accelerator.device,
            torch_dtype=inference_dtype(accelerator, config.mixed_precision),
            batch_size=config.reward_batch_size,
        )

    all_scores = score_samples(
        store, scores_dir(config.output_dir, reward), make_reward, config.reward_batch_size, accelerator,
        desc=f"score {reward}",
        settings={"reward": reward, "model_name_or_path": config.reward_model_name_or_path,
                  "options": config.reward_options or {}},
    )
    if accelerator.is_main_process:
        column = f"reward_{reward_key(reward)}"
        store.add_columns({key: {column: row["reward"]} for key, row in all_scores.items()})
    accelerator.wait_for_everyone()
    return all_scores
