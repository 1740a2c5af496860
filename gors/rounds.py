"""Online GORS, `--rounds N`: generate -> score -> select -> train, N times, on the LoRA so far.

The paper's GORS is one round: it selects only among the base model's samples. Iterated rejection
sampling (RAFT, ReST-style loops) draws each round's samples from the model being trained, so
every round selects among better samples. Round r (from 0):

1. generates `--images_per_prompt` new images per prompt with round r-1's LoRA loaded (round 0:
   the base model), image (p, i) seeded `sample_seed(round_seed(seed, r), p, i)`, a pure function
   of (seed, round, prompt, image);
2. scores them with the reward;
3. selects with round r's tau (`--tau_schedule`, else `--reward_threshold` or the paper's tau) or
   `--select_top_fraction`, and adds earlier rounds' selected samples (`--replay`);
4. trains the same LoRA on from round r-1's last checkpoint (its optimizer state too, unless
   `--reset_optimizer`) up to step (r + 1) x `--steps_per_round`. The LR schedule
   (`--lr_scheduler`) runs once over all rounds' steps, as in one round of as many steps; with
   `--reset_optimizer` it starts again, over `--steps_per_round`, with each round's fresh optimizer.

Each round is a run folder of its own, `<output_dir>/round-<r>/` (samples, scores, selection,
checkpoints, LoRA, timings), resumable as a one-round run is; `rounds.json` records each finished
round (reward of its samples, selected fraction, steps), and the final LoRA is copied to
`<output_dir>` after every round, so the run folder always holds the latest finished round's. A
run stopped in round r resumes in round r: the finished rounds are not run again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from gors.checkpoints import FINGERPRINT_FIELDS, FINGERPRINT_FIELDS_IF_SET, LENGTHLESS_SCHEDULES, read_marker
from gors.config import RunConfig
from gors.core.distributed import main_process_decides
from gors.core.io import atomic_write_bytes, atomic_write_json, read_json
from gors.core.lock import run_folder_lock
from gors.core.prompts import load_prompts
from gors.core.run_folder import CHECKPOINTS_DIR, ROUNDS_FILE, SELECTION_SUMMARY_FILE, round_dir, samples_dir
from gors.core.store import (
    SAMPLE_SEED_STRIDE,
    adopt_later_settings,
    moved_local_model,
    recorded_model_commits,
    same_value,
)
from gors.lora import LORA_WEIGHT_NAME
from gors.run import STAGES, RoundInputs, run_stages
from gors.select import load_selection
from rewards.combined import scoring_versions

logger = logging.getLogger(__name__)

# Round r's images start 10^9 seeds after round r-1's: `sample_seed` spaces prompts 100 000 apart,
# so rounds never share a seed for up to 10 000 prompts of up to 100 000 images.
ROUND_SEED_STRIDE = 10**9
# The settings a finished round was made with; a rerun that changes one is refused (`round_settings`)
# before the next round generates: the rounds' own, what each round generates with and scores with,
# and what its training's checkpoints are bound to (`gors.checkpoints`).
ROUND_SETTINGS = ("rounds", "images_per_prompt", "tau_schedule", "reward_threshold", "select_top_fraction",
                  "replay", "reset_optimizer", "num_inference_steps", "guidance_scale", "reward", "unbiased",
                  "category", "reward_model_name_or_path", "reward_options", *FINGERPRINT_FIELDS,
                  *FINGERPRINT_FIELDS_IF_SET, "auto_train_batch_size", "use_8bit_adam", "train_text_encoder_2",
                  "weighting_scheme", "logit_mean", "logit_std", "mode_scale", "max_sequence_length",
                  "timestep_range", "anchor_below")
# Under --auto_train_batch_size, train_batch_size and gradient_accumulation_steps hold each process's share of
# an update as one micro-batch, as tried first: the rounds' checkpoints record the size each trained at.
# Recorded settings whose absence (a rounds.json of an older gors) means this value, not "adopt the
# run's": rounds scored before scoring versions were recorded were scored by version 1 of every reward.
RECORDED_DEFAULTS: dict[str, Any] = {"scoring_versions": {}}


def round_settings(config: RunConfig, num_processes: int, prompts: list[str], reward: str,
                   mixed_precision: str = "no") -> dict[str, Any]:
    """`ROUND_SETTINGS` of `config`, its updates per round, the number of processes, the precision
    the launch resolved (`--mixed_precision`, the accelerate config's or the family's: the rounds'
    images are generated and their checkpoints trained in it), the sha256 of the training prompts
    (their text, not their file's path) and the scoring versions of `reward` (the resolved reward
    name), as JSON holds them."""
    settings = {name: getattr(config, name) for name in ROUND_SETTINGS} | {
        "steps_per_round": config.round_steps(), "num_processes": num_processes, "mixed_precision": mixed_precision,
        "prompts_sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest(),
        "scoring_versions": scoring_versions(reward)}
    return json.loads(json.dumps(settings))


# Settings that give each round its tau: compared by the taus of the finished rounds only.
TAU_SETTINGS = ("tau_schedule", "reward_threshold")


def finished_taus(settings: dict[str, Any], finished: int) -> list[float | None]:
    """The taus of the first `finished` rounds under recorded or wanted round `settings` (None: the
    paper's tau): a rerun may change the taus of the rounds still to come, e.g. lower the tau of a
    round that selected nothing."""
    schedule = settings.get("tau_schedule")
    return [schedule[i] if isinstance(schedule, list) and i < len(schedule) else settings.get("reward_threshold")
            for i in range(finished)]


def round_seed(seed: int, index: int) -> int:
    """The base seed of round `index`'s images (round 0: the run's own, as one-round GORS)."""
    return seed + ROUND_SEED_STRIDE * index


def check_round_seed_room(num_prompts: int) -> None:
    """Refuse more prompts than a round's image seeds have room for: prompt p's images take the seeds from
    p * SAMPLE_SEED_STRIDE on, and round r's start at r * ROUND_SEED_STRIDE, so past
    ROUND_SEED_STRIDE / SAMPLE_SEED_STRIDE prompts (10,000) two rounds would draw the same images."""
    if num_prompts * SAMPLE_SEED_STRIDE > ROUND_SEED_STRIDE:
        raise ValueError(f"--rounds with {num_prompts} prompts: rounds share image seeds beyond "
                         f"{ROUND_SEED_STRIDE // SAMPLE_SEED_STRIDE} prompts; pass --max_prompts or fewer prompts")


def round_config(config: RunConfig, index: int) -> RunConfig:
    """The one-round config of round `index`: its folder, its tau and its last training step."""
    return replace(config, output_dir=str(round_dir(config.output_dir, index)),
                   reward_threshold=config.round_tau(index), tau_schedule=None,
                   max_train_steps=(index + 1) * config.round_steps(), rounds=1, steps_per_round=None,
                   replay="none", reset_optimizer=False)


def replayed_rows(output_dir: str | Path, index: int, replay: str) -> list[dict[str, Any]]:
    """Earlier rounds' own selected rows for round `index`'s training pool (`replay`: none, last or
    all), each with `samples`, its store's path relative to round `index`'s folder, and `round`."""
    earlier = {"none": [], "last": [index - 1], "all": list(range(index))}[replay] if index > 0 else []
    rows = []
    for k in earlier:
        folder = round_dir(output_dir, k)
        rows += [{**row, "samples": f"../{folder.name}/samples", "round": k}
                 for row in load_selection(folder) if "samples" not in row]  # a replayed row joins from its own round
    return rows


_START_AGAIN = ("delete it: `gors run --rounds` then goes through the rounds again, each reusing its folder's "
                "finished samples, scores and checkpoints")


def finished_rounds(config: RunConfig, wanted: dict[str, Any]) -> list[dict[str, Any]]:
    """The rounds `rounds.json` records as finished, after checking they were made with this run's settings.

    `wanted`: this run's `round_settings`. A setting that file lacks (written by an older gors) is
    taken to be this run's, with a warning.
    """
    path = Path(config.output_dir) / ROUNDS_FILE
    record = read_json(path, f"the rounds gors recorded there; {_START_AGAIN}") if path.is_file() else {
        "settings": None, "rounds": []}
    if not (isinstance(record, dict) and isinstance(record.get("rounds"), list)
            and isinstance(record.get("settings"), (dict, type(None)))):
        raise ValueError(f"{path}: not a rounds file (no 'settings' and 'rounds'); {_START_AGAIN}")
    if record["settings"] is not None:
        _check_round_settings(config, path, record, wanted)
    return record["rounds"]


def _check_round_settings(config: RunConfig, path: Path, record: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to continue the finished rounds of `record` (read from `path`) with settings other than theirs: only
    --rounds may grow, and the taus of the rounds still to come may change."""
    recorded, missing = adopt_later_settings(RECORDED_DEFAULTS | record["settings"], wanted, wanted)
    finished = len(record["rounds"])
    if finished > config.rounds:
        raise ValueError(f"{path}: {finished} rounds are finished, more than --rounds={config.rounds}; "
                         f"rerun with --rounds={finished} or more, or use a new --output_dir")
    if missing:
        logger.warning("%s does not record %s (an older gors): its rounds are taken to have been made with this "
                       "run's", path, ", ".join(missing))
    # A local base model moved or copied elsewhere is the same model: round 0's samples record its files (a Hub
    # model's version is a commit, never a local folder's fingerprint, so a Hub id is not taken for a moved model).
    moved = {"pretrained_model_name_or_path"} if moved_local_model(
        recorded["pretrained_model_name_or_path"], wanted["pretrained_model_name_or_path"],
        recorded_model_commits(samples_dir(round_dir(config.output_dir, 0)))) else set()
    changed = [f"{name}: {recorded[name]!r} -> {value!r}" for name, value in wanted.items()
               if name not in ("rounds", *TAU_SETTINGS, *moved) and not same_value(recorded[name], value)]
    taus = [finished_taus(settings, finished) for settings in (recorded, wanted)]
    if not same_value(*taus):
        shown = [", ".join("the paper's" if tau is None else f"{tau:g}" for tau in each) for each in taus]
        changed.append(f"the taus of the {finished} finished round(s): {shown[0]} -> {shown[1]}")
    if changed:
        # Without --steps_per_round a round's updates are --max_train_steps / --rounds: growing --rounds shrinks them.
        derived = (config.steps_per_round is None and "steps_per_round" in wanted
                   and not same_value(recorded["steps_per_round"], wanted["steps_per_round"]))
        keep = (f"; to grow --rounds, pass --steps_per_round {recorded['steps_per_round']} (else a round's updates "
                "are --max_train_steps / --rounds)") if derived else ""
        raise ValueError(f"{path}: finished rounds were made with other settings ({'; '.join(changed)}); rerun with "
                         "theirs, or use a new --output_dir (only --rounds may grow, and the taus of the rounds "
                         f"still to come may change: pass --tau_schedule with the finished rounds' taus first){keep}")
    if recorded["rounds"] != config.rounds and config.lr_scheduler not in LENGTHLESS_SCHEDULES \
            and not config.reset_optimizer:
        raise ValueError(f"{path}: the finished rounds ran --lr_scheduler {config.lr_scheduler} laid out over "
                         f"--rounds={recorded['rounds']}; --rounds={config.rounds} would give their steps another LR. "
                         f"Rerun with --rounds={recorded['rounds']}, or use a new --output_dir")


def round_summary(config: RunConfig, index: int) -> dict[str, Any]:
    """What round `index` did: its samples' mean reward, the selected fraction, its pool and steps."""
    folder = round_dir(config.output_dir, index)
    selection = json.loads((folder / SELECTION_SUMMARY_FILE).read_text(encoding="utf-8"))
    pool = load_selection(folder)
    return {
        "round": index,
        "folder": folder.name,
        "lora": None if index == 0 else round_dir(config.output_dir, index - 1).name,
        "selection_rule": selection["threshold"],
        "num_samples": selection["num_samples"],
        "mean_reward": selection["all"]["mean"],
        "num_selected": selection["num_selected"],
        "selected_fraction": selection["num_selected"] / selection["num_samples"],
        "mean_reward_selected": selection["selected"]["mean"],
        "num_replayed": sum(1 for row in pool if "samples" in row),
        "last_step": (index + 1) * config.round_steps(),
    }


def log_round(output_dir: Path, summary: dict[str, Any]) -> None:
    """The round's reward and selection as TensorBoard scalars over rounds (`logs/rounds`)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(output_dir / "logs" / "rounds")) as writer:
        for name in ("mean_reward", "selected_fraction", "mean_reward_selected"):
            writer.add_scalar(f"rounds/{name}", summary[name], summary["round"])


def finished_message(output_dir: Path, rounds: list[dict[str, Any]]) -> str:
    """What a rerun of a finished online run says: that nothing is left, and where its results are."""
    return (f"[rounds] all {len(rounds)} rounds are finished ({output_dir / ROUNDS_FILE}), trained to step "
            f"{rounds[-1]['last_step']}: nothing to run. The last round's LoRA is {output_dir / LORA_WEIGHT_NAME}, each "
            f"round's folder {round_dir(output_dir, 0).name} to {rounds[-1]['folder']}; `gors report {output_dir}` "
            "tabulates the rounds. Pass a larger --rounds to run more")


def round_end_checkpoint(folder: Path, step: int) -> Path:
    """The complete checkpoint of round folder `folder` at `step`, where its round ended and the next goes on
    from: not merely its newest (a run of longer rounds killed before `rounds.json` recorded them leaves
    later ones, of the same training where the schedule's LR does not depend on the length)."""
    checkpoint = folder / CHECKPOINTS_DIR / f"checkpoint-{step}"
    if read_marker(checkpoint) is None:
        raise FileNotFoundError(f"{folder} has no complete checkpoint at step {step}, where its round ended and the "
                                f"next round goes on from ({checkpoint}): restore it, or start the rounds again in a "
                                "new --output_dir")
    return checkpoint


def run_rounds(config: RunConfig, accelerator: Accelerator, command: str = "gors run") -> list[dict[str, Any]]:
    """`--rounds N`: the rounds not yet finished, in order; returns every round's summary."""
    out = Path(config.output_dir)
    with run_folder_lock(out, STAGES, command):
        prompt_set = load_prompts(config.train_prompts)
        prompts = prompt_set.prompts[: config.max_prompts]
        reward = config.reward_name(prompt_set.category)
        check_round_seed_room(len(prompts))
        settings = round_settings(config, accelerator.num_processes, prompts, reward, accelerator.mixed_precision)
        rounds = main_process_decides(accelerator.state, lambda: finished_rounds(config, settings))  # one view for all
        if len(rounds) == config.rounds:
            accelerator.print(finished_message(out, rounds))
        for index in range(len(rounds), config.rounds):
            previous = round_dir(out, index - 1) if index > 0 else None
            accelerator.print(f"[rounds] round {index} of {config.rounds}"
                              + (f", generating with the LoRA of {previous}" if previous else ", from the base model"))
            inputs = RoundInputs(
                lora=str(previous) if previous else None,
                seed=round_seed(config.seed, index),
                replay=replayed_rows(out, index, config.replay),
                continue_from=(main_process_decides(accelerator.state,
                                                    lambda: round_end_checkpoint(previous, index * config.round_steps()))
                               if previous else None),
                reset_optimizer=config.reset_optimizer,
                validation_dir=out,
                schedule_steps=config.round_steps() * (1 if config.reset_optimizer else config.rounds),
            )
            run_stages(round_config(config, index), accelerator, command, inputs)
            accelerator.free_memory()  # the round's prepared models and optimizer: the next round prepares its own
            if accelerator.is_main_process:
                rounds.append(round_summary(config, index))
                summary = rounds[-1]
                # Logged before the round counts as finished: a kill in between logs the point again on the rerun (at
                # the same round), where after it the point would be lost (`gors report` reads rounds.json).
                if config.report_to in ("tensorboard", "all"):
                    log_round(out, summary)
                atomic_write_bytes(out / LORA_WEIGHT_NAME, (round_dir(out, index) / LORA_WEIGHT_NAME).read_bytes())
                atomic_write_json(out / ROUNDS_FILE, {"settings": settings, "rounds": rounds})
                accelerator.print(f"[rounds] round {index}: mean reward {summary['mean_reward']:.3f} over "
                                  f"{summary['num_samples']} samples, {summary['num_selected']} selected "
                                  f"({100 * summary['selected_fraction']:.0f} %), {summary['num_replayed']} replayed; "
                                  f"trained to step {summary['last_step']}")
            accelerator.wait_for_everyone()
    return rounds
