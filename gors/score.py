"""Stage 2, `gors score`: one reward over every sample in the store.

Scores go to `scores/<reward>/part-XXXXX.jsonl` (one line per image: the reward in [0, 1], its
details, e.g. B-VQA's questions and probabilities, and the image's `image_sha256` from its
record, so that an image generated again is scored again), appended batch by batch, so an
interruption loses at most the batch in flight. When every sample is scored, the reward is also
added as a column `reward_<reward>` to the store's metadata. `settings.json` beside the scores
records the reward and its options; scoring a folder that holds scores with others is refused.

Per-prompt metadata (a `.jsonl` prompt set's rows, recorded in the store's `prompts.json`) reaches
the reward with each image; a reward judged by GenEval's clauses (`geneval`, `geneval_graded`)
refuses prompts without them here, before any model loads.

`gors run --overlap_scoring` scores each generated batch while the next one generates
(`scoring_while_generating`, `gors.core.background_scoring`); this stage then scores what is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator

from gors._moved import moved_names
from gors.config import RunConfig, ScoreConfig
from gors.core.background_scoring import BackgroundScorer
from gors.core.distributed import make_accelerator
from gors.core.lock import holds_stages
from gors.core.pipeline import inference_dtype
from gors.core.prompts import check_category, load_prompts, recorded_category
from gors.core.run_folder import reward_column, samples_dir, scores_dir
from gors.core.scoring import open_score_folder, score_samples
from gors.core.store import SampleKey, SampleStore
from rewards import Reward, get_reward_class
from rewards.base import MODEL_FLAG
from rewards.combined import (
    build_reward,
    check_reward,
    check_reward_options,
    dtype_setting,
    model_named_by,
    reward_dtype,
    versioned,
)

# 0.1 names that moved in 0.2 (CHANGELOG.md); they warn and forward until 0.3.
__getattr__ = moved_names(__name__, {
    "load_scores": "gors.core.scoring:load_scores",
    "read_score_rows": "gors.core.scoring:read_score_rows",
    "check_settings": "gors.core.scoring:check_settings",
    "SETTINGS_FILE": "gors.core.scoring:SETTINGS_FILE",
})


def check_prompt_metadata(reward: str, prompts: Sequence[str], metadata: Sequence[dict[str, Any]] | None) -> None:
    """Fail before any work when `reward` (a name, `module:Class` or weighted list) cannot judge
    the prompts: an unknown reward, or a member whose `Reward.check_prompts` refuses them (e.g. a
    GenEval-judged one without each prompt's clauses)."""
    for spec in check_reward(reward):
        get_reward_class(spec.name).check_prompts(prompts, metadata)


# The sample store's recorded generation dtypes (`gors.core.pipeline.pipeline_settings`).
GENERATION_DTYPES = ("float16", "bfloat16", "float32")


def training_reward_dtype(config: ScoreConfig | RunConfig, accelerator: Accelerator, reward: str) -> torch.dtype:
    """The dtype `reward` is built with to score a run's samples (`rewards.combined.reward_dtype`): the
    generation precision, but never float16 for a model trained in bfloat16 (a list's such member runs
    in bfloat16 alone); float32 on the CPU.

    The generation precision is `--mixed_precision`, else the dtype the samples were generated in (an
    SD3 or FLUX.1 run generates in bf16 under an fp16 accelerate config: `gors score` after `gors run`
    then scores as the run did), else the accelerate config's."""
    generation = inference_dtype(accelerator, config.mixed_precision)
    if config.mixed_precision is None and accelerator.device.type == "cuda":
        recorded = (SampleStore(samples_dir(config.output_dir)).load_settings() or {}).get("dtype")
        if recorded in GENERATION_DTYPES:
            generation = getattr(torch, recorded)
    return reward_dtype(reward, accelerator.device, generation, benchmark=False)


def reward_builder(config: ScoreConfig | RunConfig, accelerator: Accelerator, reward: str) -> Callable[[], Reward]:
    """What builds `reward` (a name, `module:Class` or weighted list) on this process's device; a model that cannot
    load is named by the flag or option that gave it, or called the default of the flag."""
    in_options = config.reward_model_name_or_path is None and "model_name_or_path" in (config.reward_options or {})
    setting = "--reward_options model_name_or_path" if in_options else MODEL_FLAG
    given = in_options or config.reward_model_name_or_path is not None

    def make_reward() -> Reward:
        with model_named_by(setting, given):
            return build_reward(
                reward,
                model_name_or_path=config.reward_model_name_or_path,
                options=config.reward_options,
                device=accelerator.device,
                torch_dtype=training_reward_dtype(config, accelerator, reward),
                batch_size=config.reward_batch_size,
            )

    return make_reward


def score_settings(config: ScoreConfig | RunConfig, accelerator: Accelerator, reward: str) -> dict[str, Any]:
    """What a score folder records about the scorer that fills it (the dtype too: scores in another
    precision differ, so they are refused rather than mixed)."""
    return {"reward": reward, "model_name_or_path": config.reward_model_name_or_path,
            "options": config.reward_options or {},
            "dtype": dtype_setting(reward, training_reward_dtype(config, accelerator, reward))} \
        | versioned(reward)


@holds_stages("generate", "score", reads_run=True)
def score(config: ScoreConfig | RunConfig, accelerator: Accelerator | None = None) -> dict[SampleKey, dict]:
    """Stage 2: score every sample of the run with its reward; returns all its score rows.

    The reward is `config.reward_name(...)` for the store's prompt set: a name, a `module:Class`
    path or a weighted list; its scores go to `scores/<reward_key>/`. Each image's metadata for
    the reward is its store record over its prompt's metadata row, when the prompt set has any.
    """
    accelerator = accelerator or make_accelerator()
    store = SampleStore(samples_dir(config.output_dir))
    prompt_info = store.load_prompts()  # fails clearly when nothing was generated
    check_category(config, recorded_category(prompt_info), f"the samples in {store.root}", tau=False)
    reward = config.reward_name(recorded_category(prompt_info))
    metadata = prompt_info.get("metadata")
    check_prompt_metadata(reward, prompt_info["prompts"], metadata)  # before any work
    # A mistyped option is named as such, not as a mismatch with the folder's earlier scores.
    check_reward_options(reward, config.reward_options, model_name_or_path=config.reward_model_name_or_path)
    all_scores = score_samples(
        store, scores_dir(config.output_dir, reward), reward_builder(config, accelerator, reward),
        config.reward_batch_size, accelerator,
        desc=f"score {reward}",
        prompt_metadata=metadata,
        settings=score_settings(config, accelerator, reward),
        batch_flag="--reward_batch_size",
    )
    if accelerator.is_main_process:
        column = reward_column(reward)
        store.add_columns({key: {column: row["reward"]} for key, row in all_scores.items()})
    accelerator.wait_for_everyone()
    return all_scores


@contextmanager
def scoring_while_generating(config: RunConfig, accelerator: Accelerator) -> Iterator[BackgroundScorer]:
    """`gors run --overlap_scoring`: a sink for `generate` that scores each batch as it lands.

    Every process makes the score folder ready first (a collective call, as `score` does); on
    leaving, what is queued is scored and the worker stops. When generation failed or was
    interrupted, the queue is dropped and the worker stopped at once, generation's error raised (a
    scorer error beside it is logged). The score stage that follows finds the rows written and
    scores only what is left.
    """
    prompt_set = load_prompts(config.train_prompts)
    reward = config.reward_name(prompt_set.category)
    metadata = prompt_set.metadata[: config.max_prompts] if prompt_set.metadata is not None else None
    folder = scores_dir(config.output_dir, reward)
    store = SampleStore(samples_dir(config.output_dir))
    done = open_score_folder(folder, store.records(), accelerator, score_settings(config, accelerator, reward))
    scorer = BackgroundScorer(folder, reward_builder(config, accelerator, reward), config.reward_batch_size,
                              accelerator.process_index, accelerator.device, prompt_metadata=metadata, done=done,
                              batch_flag="--reward_batch_size")
    try:
        yield scorer
    except BaseException:
        scorer.abandon()  # generation's error (or Ctrl-C) is the one to see, at once
        raise
    scorer.close()
