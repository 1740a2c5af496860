"""`gors run`: generate -> score -> select -> train in one run folder, on one Accelerator
(`--rounds N`: N times, see `gors.rounds`)."""

from __future__ import annotations

import shlex
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from gors.checkpoints import MICRO_BATCH_FIELDS, find_checkpoint, read_marker
from gors.config import RunConfig
from gors.core.backbones import check_resolution, check_trainable, detect_backbone
from gors.core.distributed import end_training, main_process_decides
from gors.core.lock import run_folder_lock
from gors.core.prompts import check_category, load_prompts, recorded_category
from gors.core.run_folder import CHECKPOINTS_DIR, ROUNDS_FILE, SELECTION_FILE, round_dir, samples_dir
from gors.core.scoring import load_scores
from gors.core.store import SampleStore, StoreError, has_bytes
from gors.families import resolve_training
from gors.generate import generate
from gors.push import PushConfig, check_push_access, push
from gors.score import check_prompt_metadata, score, scoring_while_generating
from gors.select import select, threshold_fn
from gors.timings import StageTiming, format_timings, timed_stage, write_timings
from gors.train import (
    _optimizer_class,
    check_data_parallel,
    check_samples_model,
    load_training_scheduler,
    train,
    training_accelerator,
)
from gors.validation import validation_target
from rewards.base import MODEL_FLAG
from rewards.combined import check_models_cached, check_reward_options, download_reward_files
from rewards.paper import check_tau_on_scale

STAGES = ("generate", "score", "select", "train")


@dataclass(frozen=True)
class RoundInputs:
    """What a round takes from the rounds before it; the defaults (nothing) are the paper's one round."""

    lora: str | None = None  # the LoRA folder the samples are generated with
    seed: int | None = None  # the images' base seed (None: the config's)
    replay: list[dict[str, Any]] = field(default_factory=list)  # earlier selected rows added to the pool
    continue_from: Path | None = None  # the checkpoint training goes on from
    reset_optimizer: bool = False  # take only its adapters, not its optimizer state
    validation_dir: Path | None = None  # where validation results and best/ go (None: the run folder)
    schedule_steps: int | None = None  # the LR schedule's length (None: the config's --max_train_steps)


def run_stages(config: RunConfig, accelerator: Accelerator, command: str = "gors run",
               inputs: RoundInputs = RoundInputs()) -> list[StageTiming]:
    """generate -> score -> select -> train in one run folder, on the given Accelerator.

    The folder's four stage locks are held throughout, so that no `gors <stage>` on the same folder
    interleaves with the run; `command` names this run in the refusal such a command gets. Each
    stage is timed (`gors.timings`); the timings go to `timings.json` and are returned. `inputs`:
    what an online round adds (`gors.rounds`).
    """
    out = config.output_dir
    store = SampleStore(samples_dir(out))
    timings: list[StageTiming] = []

    def scored() -> int:
        prompts = store.root / "prompts.json"
        return len(load_scores(out, config.reward_name(recorded_category(store.load_prompts())))) \
            if prompts.is_file() else 0

    def record(timing: StageTiming) -> None:
        # Each stage's timing is kept as soon as it ends: a run stopped in training still has its generation's.
        if accelerator.is_main_process:
            write_timings(out, [timing], timing_settings(config, store))

    with run_folder_lock(out, STAGES, command):
        # Overlapped, scoring runs inside generation: one stage in time, its rate that of both together.
        overlapped = scoring_while_generating(config, accelerator) if config.overlap_scoring else nullcontext()
        with timed_stage("generate+score" if config.overlap_scoring else "generate", "images",
                         lambda: len(store.records()), accelerator, timings, on_finish=record), overlapped as sink:
            generate(config, accelerator, lora=inputs.lora, seed=inputs.seed, sink=sink)
        with timed_stage("score", "images", scored, accelerator, timings, on_finish=record):
            score(config, accelerator)
        # select reads every image's score: its work is the images it went through
        with timed_stage("select", "images", lambda: len(store.records()), accelerator, timings, resumable=False,
                         on_finish=record):
            select(config, write=accelerator.is_main_process, extra_rows=inputs.replay)
        with timed_stage("train", "steps", None, accelerator, timings, on_finish=record):
            train(config, accelerator, continue_from=inputs.continue_from, reset_optimizer=inputs.reset_optimizer,
                  validation_dir=inputs.validation_dir, schedule_steps=inputs.schedule_steps)
        accelerator.print("[run] stage timings (timings.json):\n" + format_timings(timings))
    return timings


def timing_settings(config: RunConfig, store: SampleStore) -> dict[str, Any]:
    """What the stages' rates depend on, recorded beside them: the generation settings the store
    recorded (steps, guidance, resolution with the family's defaults filled in) and the rest.

    Training's time includes its validation and checkpoint saving, so their settings are recorded for
    `gors estimate` to say when a calibration's training was slowed by them; and `--torch_compile`,
    whose compiling is timed as work. Under `--auto_train_batch_size` the micro-batch is the one the
    training found, as its newest checkpoint records it.
    """
    names = ("pretrained_model_name_or_path", "generation_batch_size", "reward", "reward_model_name_or_path",
             "reward_batch_size", "train_batch_size", "gradient_accumulation_steps", "auto_train_batch_size",
             "mixed_precision", "gradient_checkpointing", "train_text_encoder", "rank", "overlap_scoring",
             "torch_compile", "max_train_steps", "checkpointing_steps", "validation_benchmark", "validation_steps",
             "report_to")
    settings = {name: getattr(config, name) for name in names}
    if config.auto_train_batch_size:
        checkpoint = find_checkpoint(config.output_dir, "latest", warn=lambda message: None)
        if checkpoint is not None:
            settings |= {name: read_marker(checkpoint)["fingerprint"][name] for name in MICRO_BATCH_FIELDS}
    return {"generation": store.load_settings()} | settings | {
        "num_validation_prompts": len(config.validation_prompts or [])}


def check_run_inputs(config: RunConfig) -> None:
    """What can fail on the prompts, the reward and training, checked before any image is generated:
    the training prompts load, the reward exists and gets the metadata it judges by (GenEval's
    clauses for `geneval` and `geneval_graded`: a `.jsonl` prompt set), training would take the
    model's family and the flags given for it (as `gors train` checks them, hours later), offline the
    local cache holds the reward's models, and the reward's data files are there (fetched now)."""
    # Local files first, then the model's config (which may need the Hub).
    prompt_set = load_prompts(config.train_prompts)
    check_category(config, prompt_set.category, f"--train_prompts {config.train_prompts}")
    prompts = prompt_set.prompts[: config.max_prompts]
    metadata = prompt_set.metadata[: config.max_prompts] if prompt_set.metadata is not None else None
    reward = config.reward_name(prompt_set.category)
    check_prompt_metadata(reward, prompts, metadata)
    check_reward_options(reward, config.reward_options, model_name_or_path=config.reward_model_name_or_path)
    if config.select_top_fraction is None and config.tau_schedule is None:
        threshold_fn(config, prompt_set.category)  # no tau, or an unknown --category
        if config.reward_threshold is None:
            check_tau_on_scale(config.category or prompt_set.category, reward)
    _optimizer_class(config.use_8bit_adam)
    if config.resume_from_checkpoint and config.resume_from_checkpoint != "latest":  # mistyped: now, not hours on
        find_checkpoint(config.output_dir, config.resume_from_checkpoint)
    # A --rounds run keeps its samples in its rounds' folders: each generated by the base model (with a LoRA).
    for folder in ([config.output_dir] if config.rounds == 1 else
                   [round_dir(config.output_dir, index) for index in range(config.rounds)]):
        check_samples_model(config, output_dir=folder)
    backbone = detect_backbone(config.pretrained_model_name_or_path, config.revision)
    check_trainable(backbone, config.pretrained_model_name_or_path)
    _, family = resolve_training(config, backbone, config.guidance_scale)  # the samples get this guidance
    load_training_scheduler(family)  # --anchor_below against the schedule's timesteps
    if config.validation_benchmark:
        validation_target(config)  # offline, its scorer's models in the cache too
        if config.validation_resolution is not None:
            check_resolution(backbone, config.validation_resolution, "--validation_resolution")
    if config.rounds == 1 and scored_already(config, len(prompts), reward):
        return  # a rerun after scoring (training stopped): the reward is not built, its files not needed
    # Last: a mistake in the flags above is the user's to fix before fetching anything.
    check_models_cached(reward, config.reward_model_name_or_path, config.reward_options, f"--reward {reward}",
                        model_flag=MODEL_FLAG)
    # The reward's data files (3-in-1's prompt lists, ...), which it would fetch only once generation is done.
    download_reward_files(reward, config.reward_model_name_or_path, config.reward_options)


def run_plan(config: RunConfig, num_processes: int) -> str:
    """What the run does, in one line, as a recipe, a config file and the flags resolved it (after
    `check_run_inputs`): prompts, images, reward, selection rule, updates and the run folder."""
    prompt_set = load_prompts(config.train_prompts)
    prompts = len(prompt_set.prompts[: config.max_prompts])
    if config.select_top_fraction is not None:
        selection = f"each prompt's top {config.select_top_fraction:g} by reward"
    elif config.tau_schedule is not None:
        selection = f"reward > tau per round {', '.join(f'{tau:g}' for tau in config.tau_schedule)} (--tau_schedule)"
    else:
        selection = f"reward > tau ({threshold_fn(config, prompt_set.category)[1]})"
    micro = ("found before the first step" if config.auto_train_batch_size
             else f"{config.train_batch_size} per process x {num_processes} x {config.gradient_accumulation_steps}")
    per_update = config.global_batch_size or config.train_batch_size * num_processes * config.gradient_accumulation_steps
    updates = config.round_steps() * config.rounds if config.steps_per_round else config.max_train_steps
    rounds = f", {config.rounds} rounds" if config.rounds > 1 else ""
    return (f"[run] {config.pretrained_model_name_or_path} on {config.train_prompts}: {prompts} prompts x "
            f"{config.images_per_prompt} images, reward {config.reward_name(prompt_set.category)}, kept: "
            f"{selection}; {updates} updates of {per_update} samples ({micro}){rounds} -> "
            f"{config.output_dir}")


def scored_already(config: RunConfig, num_prompts: int, reward: str) -> bool:
    """Whether the run folder holds a score row of `reward` for every image this run would generate
    (`num_prompts` x `--images_per_prompt`), so that scoring loads no model."""
    store = SampleStore(samples_dir(config.output_dir))
    if not store.root.is_dir():
        return False
    planned = {(p, i) for p in range(num_prompts) for i in range(config.images_per_prompt)}
    # An image lost or left empty is generated again, and its new bytes need scoring.
    present = [record for record in store.records() if has_bytes(store.image_path(record))]
    return planned <= set(load_scores(config.output_dir, reward, present))


def run(config: RunConfig, command: str = "gors run") -> None:
    """`gors run`: all four stages on one Accelerator set up for training, once or `--rounds` times."""
    from gors.rounds import run_rounds

    check_run_inputs(config)
    # Its first round's folder too: a --rounds run stopped in round 0 has no rounds file yet.
    rounds_run = [path.name for path in (Path(config.output_dir) / ROUNDS_FILE, round_dir(config.output_dir, 0))
                  if path.exists()]
    if config.rounds == 1 and rounds_run:
        raise ValueError(f"{config.output_dir} holds a --rounds run ({', '.join(rounds_run)}); one round there would "
                         "train over its rounds' LoRA. Rerun with its --rounds, or use a new --output_dir")
    one_round = [name for name in ("samples", SELECTION_FILE, CHECKPOINTS_DIR) if (Path(config.output_dir) / name).exists()]
    if config.rounds > 1 and one_round and not (Path(config.output_dir) / ROUNDS_FILE).is_file():
        raise ValueError(f"{config.output_dir} holds a run of one round ({', '.join(one_round)}); --rounds "
                         f"{config.rounds} there would replace its LoRA. Rerun it without --rounds, or use a new "
                         "--output_dir")
    accelerator = training_accelerator(config)
    check_data_parallel(accelerator)
    if config.push_to_hub:  # asked of the Hub once, by the process that pushes
        main_process_decides(accelerator.state, lambda: check_push_access("nothing has started", verify=True))
    accelerator.print(run_plan(config, accelerator.num_processes))
    if config.rounds == 1:
        run_stages(config, accelerator, command)
    else:
        run_rounds(config, accelerator, command)
    end_training(accelerator)
    if config.push_to_hub and accelerator.is_main_process:
        push_finished_run(config)


def push_finished_run(config: RunConfig) -> None:
    """`--push_to_hub`: the final LoRA and its card to the Hub (`gors push`); a failure leaves the finished run
    as it is and names the command that pushes it."""
    again = f"gors push --output_dir {shlex.quote(config.output_dir)} --repo_id {config.push_to_hub}"
    try:
        push(PushConfig(output_dir=config.output_dir, repo_id=config.push_to_hub))
    except (ValueError, OSError, StoreError) as err:
        raise ValueError(f"the run is finished, its push was not ({err}). Push it with `{again}`") from err
