"""Stage 2, `gors score`: one reward over every sample in the store.

Scores go to `scores/<reward>/part-XXXXX.jsonl` (one line per image: the reward in [0, 1] and
its details, e.g. B-VQA's questions and probabilities), appended batch by batch, so an
interruption loses at most the batch in flight. When every sample is scored, the reward is also
added as a column `reward_<reward>` to the store's metadata.
"""

from __future__ import annotations

import re
from pathlib import Path

from accelerate import Accelerator

import rewards
from gors.config import ScoreConfig
from gors.distributed import batches, make_accelerator, my_share, progress_bar
from gors.io import append_jsonl
from gors.pipeline import inference_dtype
from gors.store import SampleKey, SampleStore, read_rows, sample_key
from gors.generate import samples_dir


def reward_key(reward: str) -> str:
    """A file-name-safe name for a reward spec (e.g. 'my.module:MyReward' -> 'my.module_MyReward')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", reward).strip("_")


def scores_dir(output_dir: str | Path, reward: str) -> Path:
    return Path(output_dir) / "scores" / reward_key(reward)


def load_scores(output_dir: str | Path, reward: str) -> dict[SampleKey, dict]:
    """Every score row written so far for `reward`, by sample key."""
    return {sample_key(row): row for row in read_rows(sorted(scores_dir(output_dir, reward).glob("part-*.jsonl")))}


def score(config: ScoreConfig, accelerator: Accelerator | None = None) -> dict[SampleKey, dict]:
    """Score the unscored samples with `config.reward`; returns all scores of that reward.

    Resumable: samples with a score row are skipped.
    """
    accelerator = accelerator or make_accelerator()
    store = SampleStore(samples_dir(config.output_dir))
    store.load_prompts()  # fails clearly when nothing was generated
    records = store.records()
    done = load_scores(config.output_dir, config.reward)
    todo = [record for record in records if sample_key(record) not in done]
    mine = my_share(todo, accelerator)
    out_file = scores_dir(config.output_dir, config.reward) / f"part-{accelerator.process_index:05d}.jsonl"
    if accelerator.is_main_process:
        print(f"[score] {config.reward}: {len(done)} samples scored, {len(todo)} to score")
    reward_class = rewards.get_reward_class(config.reward)  # an unknown name fails before any work
    if mine:
        reward = reward_class(
            model_name_or_path=config.reward_model_name_or_path,
            device=accelerator.device,
            torch_dtype=inference_dtype(accelerator, config.mixed_precision),
            batch_size=config.reward_batch_size,
        )
    bar = progress_bar(len(mine), accelerator, f"score {config.reward}")
    for batch in batches(mine, config.reward_batch_size):
        images = [store.open_image(record) for record in batch]
        output = reward.score(images, [r["prompt"] for r in batch], metadata=batch)
        append_jsonl(
            out_file,
            [
                {
                    "prompt_index": r["prompt_index"],
                    "image_index": r["image_index"],
                    "path": r["path"],
                    "reward": value,
                    "details": details,
                }
                for r, value, details in zip(batch, output.scores, output.details)
            ],
        )
        bar.update(len(batch))
    bar.close()
    accelerator.wait_for_everyone()

    all_scores = load_scores(config.output_dir, config.reward)
    if accelerator.is_main_process:
        column = f"reward_{reward_key(config.reward)}"
        store.add_columns({key: {column: row["reward"]} for key, row in all_scores.items()})
    accelerator.wait_for_everyone()
    return all_scores
