"""`gors estimate`: the GPU-hours of a full GORS run, from stage rates measured on your hardware.

A calibration `gors run` at the real sizes (the base model at its resolution, the real reward
model, a few prompts, a few hundred steps) writes each stage's rate to `timings.json`
(`gors.timings`). This module scales those rates to a planned run (by default the paper's colour
run, `gors.core.paper`: 700 prompts x 90 images, 50 DDIM steps, B-VQA, 15 000 steps of batch 16)
and prints the GPU-hours of each stage, for gors and for the official procedures at given speed
ratios.

Scaling rules (pure functions below, tested without models):
- generation time per image is proportional to the denoising steps (fixed costs such as the VAE
  decode scale too, so scaling up from fewer steps slightly overestimates);
- scoring and selection time is per image;
- training time is per sample seen (steps x global batch), from the measured steps/s at the
  measured global batch (per-process batch x accumulation x processes);
- each stage's one-off seconds are counted once, not scaled, and not multiplied by the speed ratio
  either (the official procedures load their models and warm up too): its set-up (loading the
  pipeline or the reward model, building the trainer and caching the calibration selection's
  latents: `setup_seconds`; a full selection's latents cost about one VAE encode per selected image
  more), its first batch's or step's time beyond the pace of the later ones (kernels loaded on first
  use, autotuning, `--torch_compile`'s compiling: `warmup_seconds`) and the time after its last
  (the final checkpoint, validation and LoRA: `wrapup_seconds`). Timings of a gors before 0.2, or
  of a stage of one batch, have no warm-up or wrap-up: their first batch is scaled as work;
- training's time includes the validation and checkpoints before its last step, which are scaled
  as steps too: calibrate with validation off and one checkpoint, at the end (a warning says when
  the calibration did not);
- GPU-hours count every process: the measured wall time x processes.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gors.config import check_values, parse_mapping
from gors.core.io import is_json_number
from gors.core.paper import (
    GORS_GLOBAL_BATCH,
    GORS_IMAGES_PER_PROMPT,
    GORS_RUN_SOURCES,
    GORS_SAMPLING_STEPS,
    GORS_TRAIN_BATCH_PER_GPU,
    GORS_TRAIN_PROMPTS,
    GORS_TRAIN_STEPS,
    RELEASED_CHECKPOINT_STEPS,
)
from gors.timings import TIMINGS_FILE, read_timings

# gors' speed over the official procedure per stage: the medians of the paired ratios that
# `python -m benchmarks` measured on 2 CPU cores at reduced sizes (benchmarks/results/2026-12-05-cpu/speed.json,
# rounded; a test holds them to it): B-VQA against T2I-CompBench's 8 passes, training (U-Net + text-encoder
# LoRA) against diffusers' LoRA loop, generation in batches of 8 against T2I-CompBench's one image per pipeline
# call. A GPU's own ratios (`python -m benchmarks --device cuda --full-size`) replace them through
# --reference_speedups. Selection has no official counterpart that was measured: its ratio is 1.
CPU_MEASURED_SPEEDUPS = {"generate": 1.92, "score": 7.28, "train": 1.42}
# The speed table those defaults come from, relative to the repository root.
CPU_MEASURED_TABLE = "benchmarks/results/2026-12-05-cpu/speed.json"
# gors' batch in `benchmarks/generation.py`, whose ratio over the official one image per call prices generation.
GENERATION_RATIO_BATCH = 8
SPEEDUP_STAGES = ("generate", "score", "select", "train")


@dataclass(frozen=True)
class RunPlan:
    """The run to estimate. Defaults: the paper's colour run (`gors.core.paper`)."""

    num_prompts: int = GORS_TRAIN_PROMPTS
    images_per_prompt: int = GORS_IMAGES_PER_PROMPT
    num_inference_steps: int = GORS_SAMPLING_STEPS
    max_train_steps: int = GORS_TRAIN_STEPS
    global_batch_size: int = GORS_GLOBAL_BATCH

    @property
    def images(self) -> int:
        return self.num_prompts * self.images_per_prompt


@dataclass(frozen=True)
class StageEstimate:
    stage: str
    work: str  # what the plan asks of the stage, in words
    gors_gpu_hours: float
    official_gpu_hours: float
    speedup: float  # gors' speed over the official procedure, applied to the per-unit work (not the set-up)


# The stages whose models `--torch_compile` compiles (scoring and selection compile nothing).
COMPILING_STAGES = ("generate", "generate+score", "train")
# The stages that mark their batches or steps, so that their warm-up and wrap-up are told from their pace.
TIMED_STAGES = ("generate", "score", "generate+score", "train")
# A timings entry's seconds spent once per stage (gors.timings.StageTiming), not per unit of work.
ONE_OFF_KEYS = ("setup_seconds", "warmup_seconds", "wrapup_seconds")


def _number(value: Any) -> bool:
    """A finite JSON number (true and false are no numbers)."""
    return is_json_number(value) and math.isfinite(value)


def _one_off(entry: dict[str, Any]) -> dict[str, Any]:
    """A timings entry's one-off seconds by key, 0 where absent or unknown (None)."""
    return {key: entry.get(key) or 0.0 for key in ONE_OFF_KEYS}


def _entry_problems(stage: str, entry: dict[str, Any]) -> list[str]:
    """What makes a timings entry unusable for the estimate, in words; [] when it is usable."""
    problems = [f"'{key}' is missing" for key in ("seconds", "work", "num_processes", "device") if key not in entry]
    seconds = entry.get("seconds")
    seconds_ok = _number(seconds) and seconds > 0
    if "seconds" in entry and not seconds_ok:
        problems.append(f"seconds={seconds!r} is not a number > 0")
    one_off = _one_off(entry)
    bad = [f"{key}={value!r} is not a number >= 0" for key, value in one_off.items() if not _number(value) or value < 0]
    problems += bad
    # One-off seconds as long as the stage leave no time for its work, whose pace would read as 0 s a unit.
    if not bad and seconds_ok and sum(one_off.values()) >= seconds:
        problems.append(f"{' + '.join(f'{key}={value}' for key, value in one_off.items() if value)} is not less "
                        f"than seconds={seconds}")
    for key in ("work", "num_processes"):
        if key in entry and not (_number(entry[key]) and entry[key] >= 1):
            problems.append(f"{key}={entry[key]!r} is not a number >= 1")
    if "device" in entry and not isinstance(entry["device"], str):
        problems.append(f"device={entry['device']!r} is not a device name")
    settings = entry.get("settings")
    needed = {"generate": [("generation", "num_inference_steps")],
              "train": [("train_batch_size",), ("gradient_accumulation_steps",)]}.get(stage, [])
    for keys in needed:
        value: Any = settings
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if not (_number(value) and value >= 1):
            problems.append(f"settings.{'.'.join(keys)}={value!r} is not a number >= 1")
    return problems


def check_stages(stages: dict[str, dict[str, Any]], sources: dict[str, str]) -> None:
    """Refuse, naming the file and the stage, a timings entry the estimate cannot use (a missing or
    non-numeric field, no work, one-off seconds as long as the stage or longer, no processes, a needed setting < 1)."""
    for stage, entry in stages.items():
        problems = _entry_problems(stage, entry)
        if problems:
            raise ValueError(f"{sources.get(stage, 'timings')}: the {stage!r} timing is unusable: "
                             f"{'; '.join(problems)}. Give the timings.json that a calibration `gors run` wrote, "
                             "or rerun the calibration to write it again")


def gpu_seconds(entry: dict[str, Any], units: float, unit_scale: float = 1.0) -> tuple[float, float]:
    """GPU-seconds (wall seconds x processes) of `units` units at a timings entry's pace, as (one-off,
    work): its one-off seconds once (`ONE_OFF_KEYS`, each absent in timings of gors before it was
    recorded), then each unit at the measured time per unit x `unit_scale` (e.g. the ratio of
    denoising steps). Images shared over processes are priced at the main process's pace over its own
    share (`main_work`): the wall time is its, and a share larger than the others' (9 images on 2 GPUs)
    would otherwise read as a slower pace."""
    if entry["work"] <= 0:
        raise ValueError(f"the {entry['stage']} timing did no work; rerun the calibration so that it does "
                         f"{entry['stage']} work (a stage it found already done is not timed)")
    one_off = sum(_one_off(entry).values())
    processes = entry["num_processes"]
    own = entry.get("main_work")
    shared = entry.get("unit") == "images" and _number(own) and entry["work"] / processes <= own <= entry["work"]
    # A short last batch is wrap-up, its time one-off: its units are not in the pace either.
    wrapped = entry.get("wrapup_work") if _number(entry.get("wrapup_work")) else 0
    steady = (own if shared else entry["work"] / processes) - wrapped
    per_gpu_unit = (entry["seconds"] - one_off) / steady if steady > 0 else 0.0
    return one_off * processes, per_gpu_unit * unit_scale * units


def estimate(stages: dict[str, dict[str, Any]], plan: RunPlan, speedups: dict[str, float]) -> list[StageEstimate]:
    """GPU-hours of each stage of `plan`, from `timings.json` entries by stage (see the module docstring).

    `speedups[stage]`: how many times faster gors is than the official procedure (1 where absent);
    it multiplies the per-unit work only, as the official procedure has a set-up of its own.
    """
    missing = [stage for stage in ("generate", "score", "train") if stage not in stages]
    if missing and "generate+score" in stages and "train" in stages:
        raise ValueError("timings hold generate+score, one rate for both stages of a run with --overlap_scoring; "
                         "the comparison with the official procedures needs each stage's own rate: calibrate "
                         "without --overlap_scoring")
    if missing:
        raise ValueError(f"timings lack {', '.join(missing)}: give timings.json files of runs that did every "
                         "stage (a calibration `gors run` writes all four)")
    rows = []
    generate = stages["generate"]
    measured_steps = generate["settings"]["generation"]["num_inference_steps"]
    rows.append(("generate", f"{plan.images} images x {plan.num_inference_steps} steps",
                 gpu_seconds(generate, plan.images, plan.num_inference_steps / measured_steps)))
    rows.append(("score", f"{plan.images} images", gpu_seconds(stages["score"], plan.images)))
    if "select" in stages and stages["select"].get("unit") == "images":  # older timings counted selected samples
        rows.append(("select", f"{plan.images} images", gpu_seconds(stages["select"], plan.images)))
    train = stages["train"]
    settings = train["settings"]
    measured_batch = settings["train_batch_size"] * settings["gradient_accumulation_steps"] * train["num_processes"]
    # Per sample seen: a step of the measured global batch, scaled to the plan's.
    rows.append(("train", f"{plan.max_train_steps} steps x batch {plan.global_batch_size}",
                 gpu_seconds(train, plan.max_train_steps, plan.global_batch_size / measured_batch)))
    return [StageEstimate(stage, work, (setup + per_unit) / 3600,
                          (setup + per_unit * speedups.get(stage, 1.0)) / 3600, speedups.get(stage, 1.0))
            for stage, work, (setup, per_unit) in rows]


def merge_timings(paths: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The latest entry of each stage over several `timings.json` (later paths win), and the devices they
    ran on; an entry the estimate cannot use is refused, naming its file and stage (`check_stages`)."""
    stages: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for path in paths:
        if not Path(path).exists():
            raise FileNotFoundError(f"{path}: no such run folder or file; pass the --output_dir of a `gors run` (or its "
                                    "timings.json)")
        record = read_timings(path)
        if record is None:
            rounds = sorted(Path(path).glob("round-*/timings.json"))
            hint = (f"; a --rounds run keeps them per round, e.g. {rounds[0].parent}" if rounds else
                    "; pass a run folder of `gors run` or the file itself (`gors run` writes it: the stage commands "
                    "run one by one do not)")
            raise FileNotFoundError(f"{path}: no timings.json{hint}")
        stages |= record["stages"]
        file = Path(path) / TIMINGS_FILE if Path(path).is_dir() else Path(path)
        sources |= dict.fromkeys(record["stages"], str(file))
    check_stages(stages, sources)
    check_one_kind_of_device(stages, sources)
    return stages, sorted({entry["device"] for entry in stages.values()})


def check_one_kind_of_device(stages: dict[str, dict[str, Any]], sources: dict[str, str]) -> None:
    """Refuse stages timed on the CPU beside stages timed on a GPU: their hours price different hardware, and
    the sum would read as GPU-hours of a run that never ran so."""
    on_cpu = sorted(stage for stage, entry in stages.items() if entry["device"] == "cpu")
    if on_cpu and len(on_cpu) < len(stages):
        elsewhere = ", ".join(f"{stage} on {entry['device']} ({sources.get(stage, 'timings')})"
                              for stage, entry in stages.items() if entry["device"] != "cpu")
        raise ValueError(f"{', '.join(on_cpu)} timed on the CPU, {elsewhere}: CPU-hours and GPU-hours do not add "
                         "up to one run's cost; give timings of a calibration run on the GPU you want priced")


def _events_in(work: int, last_step: int, every: int) -> int:
    """How many multiples of `every` the steps (last_step - work, last_step] hold."""
    return last_step // every - (last_step - work) // every


def _training_warning(train: dict[str, Any]) -> str | None:
    """Whether the calibration's training validated or saved checkpoints in its timed steps, timed as training
    and so scaled per step; None when it did neither. Where the wrap-up after the last step is timed
    (`wrapup_seconds`), that step's validation and checkpoint are counted once; before, one checkpoint
    (the last step's) was taken as part of training."""
    settings = train.get("settings") if isinstance(train.get("settings"), dict) else {}
    if not all(_number(settings.get(key)) and settings[key] >= 1
               for key in ("validation_steps", "checkpointing_steps", "max_train_steps")):
        return ("the calibration's training timings do not record its validation and checkpoint settings (a gors "
                "before they were recorded): check that it ran with validation off and --checkpointing_steps above "
                "--max_train_steps, or the estimate counts validation and checkpoint saving as training")
    # The timed steps end at --max_train_steps (a training is timed only when it finishes).
    last = int(settings["max_train_steps"])
    work = min(int(train["work"]), last)
    wrapped = train.get("wrapup_seconds") is not None

    def scaled(every: int) -> int:  # events at the multiples of `every` and at the last step, that were scaled
        return _events_in(work - 1, last - 1, every) if wrapped else _events_in(work, last, every) + bool(last % every)

    done = []
    # Validation prompts render only into TensorBoard (`log_validation`); timings before `report_to` was recorded
    # are taken to have rendered them.
    rendered = settings.get("num_validation_prompts") and settings.get("report_to") in (None, "tensorboard", "all")
    if settings.get("validation_benchmark") or rendered:
        validations = scaled(settings["validation_steps"])
        if validations:
            done.append(f"ran validation {validations} time(s)")
    saves = scaled(settings["checkpointing_steps"])
    if saves > (0 if wrapped else 1):
        done.append(f"saved {saves} checkpoint{'s' if saves > 1 else ''}")
    if not done:
        return None
    before, fix = (" before its last step", "at or above") if wrapped else ("", "above")
    return (f"the calibration's training {' and '.join(done)}{before} in its {work} steps, timed as training and so "
            f"scaled per step: the estimate is too high. Calibrate with validation off and --checkpointing_steps "
            f"{fix} --max_train_steps")


def _generation_warning(generate: dict[str, Any]) -> str | None:
    """Whether the calibration generated in batches other than those the generation ratio was measured at (gors at
    `GENERATION_RATIO_BATCH` against one image per call): the official column then scales another batch's speed."""
    settings = generate.get("settings") if isinstance(generate.get("settings"), dict) else {}
    batch = settings.get("generation_batch_size")
    if not _number(batch) or batch == GENERATION_RATIO_BATCH:
        return None
    direction = "too high" if batch < GENERATION_RATIO_BATCH else "too low"
    return (f"the calibration generated in batches of {batch}, but the generation ratio is gors' speed in batches of "
            f"{GENERATION_RATIO_BATCH} over the official one image per call: the official column's generation is "
            f"likely {direction}. Calibrate with --generation_batch_size {GENERATION_RATIO_BATCH}")


def calibration_warnings(stages: dict[str, dict[str, Any]]) -> list[str]:
    """What in the calibration makes the estimate wrong: training that validated or saved a checkpoint before
    its last step, a stage whose first batch or step could not be told from the others (too few full batches or
    steps per process, or timings of a gors before 0.2: its warm-up, compiling under `--torch_compile`, and
    its wrap-up are then timed as work), and generation in batches the generation ratio was not measured at."""
    warnings = [_training_warning(stages["train"])] if "train" in stages else []
    warnings += [_generation_warning(stages[stage]) for stage in ("generate", "generate+score") if stage in stages]
    if len({entry["device"] for entry in stages.values()}) > 1:  # CPU beside GPU is refused (`check_one_kind_of_device`)
        timed = ", ".join(f"{stage} on {entry['device']}" for stage, entry in stages.items())
        warnings.append(f"the stages were timed on different GPUs ({timed}): the total adds hours of GPUs of "
                        "different speeds; calibrate on the GPU you want priced")
    compiled = {stage for stage, entry in stages.items() if stage in COMPILING_STAGES
                and isinstance(entry.get("settings"), dict) and entry["settings"].get("torch_compile") not in (None, "no")}
    # Timings of a gors before 0.2 record no warm-up at all: only their compiling is worth a warning of its own.
    unsteady = sorted(stage for stage, entry in stages.items() if stage in TIMED_STAGES
                      and entry.get("warmup_seconds") is None and ("warmup_seconds" in entry or stage in compiled))
    if unsteady:
        compiled = sorted(compiled & set(unsteady))
        warnings.append(
            f"the calibration's {', '.join(unsteady)} timings do not tell the first batch or step from the rest: "
            "its warm-up (CUDA kernels loaded on first use" + (f"; compiling, in {', '.join(compiled)}" if compiled
                                                               else "") + ") and its wrap-up are scaled as work. "
            "Calibrate with this gors, each process generating and scoring at least two full batches "
            "(--generation_batch_size, --reward_batch_size) and training at least two steps (three under CUDA "
            "graphs)")
    return [warning for warning in warnings if warning]


def format_estimate(rows: list[StageEstimate], devices: list[str]) -> str:
    """A markdown table, with the totals and the ratio of the two. Hours of a calibration timed on the CPU alone
    (a toy or smoke run) are called CPU-hours: they price no GPU."""
    unit = "CPU" if devices == ["cpu"] else "GPU"
    lines = [f"{unit}-hours on {', '.join(devices)} (rates measured there, scaled to the plan)", "",
             f"| stage | work | gors {unit}-h | official {unit}-h | official / gors, per unit |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.stage} | {r.work} | {r.gors_gpu_hours:.2f} | {r.official_gpu_hours:.2f} | {r.speedup:.2f}x |")
    gors_total = sum(r.gors_gpu_hours for r in rows)
    official_total = sum(r.official_gpu_hours for r in rows)
    lines.append(f"| total | | {gors_total:.2f} | {official_total:.2f} | {official_total / gors_total:.2f}x overall |")
    return "\n".join(lines)


def format_plan(plan: RunPlan, stages: dict[str, dict[str, Any]]) -> str:
    """The plan's values with where each comes from (the paper's run, or given), and the calibration's
    denoising steps beside the plan's."""
    defaults = RunPlan()
    lines = ["plan:"]
    for name, value in vars(plan).items():
        source = GORS_RUN_SOURCES[name] if value == getattr(defaults, name) else "given"
        lines.append(f"  {name} = {value} ({source})")
    generation = stages["generate"]["settings"]["generation"]
    measured = generation["num_inference_steps"]
    lines.append(f"  the calibration sampled with {measured} denoising steps; generation time is scaled by "
                 f"{plan.num_inference_steps} / {measured}")
    # Not scaled: a calibration at another side or of another model prices that run, not the paper's 512 px SD 2.
    if generation.get("model") is not None:
        lines.append(f"  the calibration's model and side, priced as they are: {generation['model']} at "
                     f"{generation.get('resolution', '?')} px")
    return "\n".join(lines)


def speedup_note(rows: list[StageEstimate], given: set[str], devices: list[str]) -> str | None:
    """Which ratios in the table are the 2-CPU-core defaults (those the user did not give), and that
    selection's is a placeholder; None when every ratio was given. `devices` are the calibration's: one
    timed on the CPU is told how to price a GPU."""
    shown = [r.stage for r in rows if r.stage not in given]
    measured = [stage for stage in shown if stage in CPU_MEASURED_SPEEDUPS]
    parts = []
    if measured:
        where = ("on this GPU, for its own" if devices != ["cpu"] else
                 "on the GPU you want priced, for its own (with a calibration `gors run` there: this one ran on "
                 "the CPU and prices no GPU)")
        parts.append(f"official / gors for {', '.join(measured)}: the ratios measured on 2 CPU cores; pass "
                     "--reference_speedups speed.json, written by `python -m benchmarks --device cuda --full-size "
                     f"--output speed.md` {where}.")
    if "select" in shown:
        parts.append("select: 1.00x is a placeholder, no official selection was measured.")
    return "\n".join(parts) or None


def speed_table_ratios(path: str | Path) -> dict[str, float]:
    """Per stage, gors' speed over the official procedure that a speed table prices it with: the median
    ratio of each row naming the stage in `prices`, in the JSON that `python -m benchmarks --output
    X.md` writes beside its table (X.json). Rows that price no stage are left out."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
        if not (isinstance(table, dict) and isinstance(table.get("rows"), list)
                and all(isinstance(row, dict) for row in table["rows"])):
            raise ValueError("no 'rows' list of rows" + (" (for ratios by stage, give them as text: "
                                                         "--reference_speedups '{\"score\": 6.1}')"
                                                         if isinstance(table, dict) else ""))
        return {row["prices"]: float(row["median"]) for row in table["rows"] if row.get("prices")}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not the JSON of a speed table (`python -m benchmarks --output X.md` writes "
                         f"X.json): {error}") from None


def speed_table_train_batch(path: str | Path) -> int | None:
    """gors' per-process batch in the row of a speed table's JSON that prices training (2, GORS' own, in tables
    written before rows recorded it); None when no row prices training. Its ratio is per sample against the
    official loop at 2, so it prices only a calibration that trained at that batch."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))["rows"]
    batches = [row.get("batch") or 2 for row in rows if row.get("prices") == "train"]
    return batches[-1] if batches else None


def check_train_batch(priced_batch: int | None, stages: dict[str, dict[str, Any]], source: str) -> None:
    """Refuse pricing the calibration's training with a ratio measured with gors at another per-process batch."""
    calibrated = stages.get("train", {}).get("settings", {}).get("train_batch_size")
    if priced_batch is not None and calibrated is not None and calibrated != priced_batch:
        raise ValueError(f"{source} prices training with gors at batch {priced_batch}, but the calibration trained at "
                         f"--train_batch_size {calibrated}: measure the ratio with `python -m benchmarks --only "
                         f"train_step --gors_batch_size {calibrated}` (and pass its speed.json), give the ratio you "
                         "know as text (--reference_speedups '{\"train\": R}'), or calibrate at "
                         f"{priced_batch}")


def _given_speedups(value: dict[str, Any] | str) -> dict[str, Any]:
    """`--reference_speedups`: a mapping (JSON/YAML text) or the path of a speed table's JSON."""
    if isinstance(value, str) and value.endswith(".json"):
        if not Path(value).is_file():
            raise FileNotFoundError(f"--reference_speedups {value}: no such file (write it with `python -m benchmarks "
                                    "--output speed.md`, which writes speed.json beside the table)")
        return speed_table_ratios(value)
    return parse_mapping(value, "--reference_speedups")


@dataclass
class EstimateConfig:
    """`gors estimate TIMINGS [TIMINGS ...]`: GPU-hours of a full run from measured stage rates."""

    timings: list[str] = field(metadata={"positional": True, "help": "timings.json files or run folders of "
                                                                      "calibration runs (later ones win per stage)"})
    num_prompts: int = field(default=GORS_TRAIN_PROMPTS,
                             metadata={"help": f"Training prompts (paper, per category: {GORS_TRAIN_PROMPTS})."})
    images_per_prompt: int = field(default=GORS_IMAGES_PER_PROMPT,
                                   metadata={"help": f"Images per prompt (paper: {GORS_IMAGES_PER_PROMPT})."})
    num_inference_steps: int = field(
        default=GORS_SAMPLING_STEPS,
        metadata={"help": f"Denoising steps per image (default {GORS_SAMPLING_STEPS}, the official sampling script's "
                          "default; the official repository does not say how many its training samples took). Pass "
                          "30 to price what `gors run` samples SD 1/2 with."})
    max_train_steps: int = field(default=GORS_TRAIN_STEPS,
                                 metadata={"help": f"Optimizer steps (the official script's default: {GORS_TRAIN_STEPS}; "
                                                   "the released colour, shape and texture checkpoints were saved at "
                                                   + ", ".join(f"{steps:,}" for steps in RELEASED_CHECKPOINT_STEPS.values())
                                                   + ")."})
    global_batch_size: int = field(default=GORS_GLOBAL_BATCH,
                                   metadata={"help": "Samples per step over all GPUs (official: 2 x 8)."})
    reference_speedups: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "gors' speed over the official procedure per stage: JSON, or the speed table's JSON that "
                          "`python -m benchmarks --output X.md` writes (X.json), run on your GPU, whose training row "
                          "must be of the calibration's --train_batch_size (`--gors_batch_size`); a stage left out "
                          "keeps its default, the ratio measured on 2 CPU cores (select: 1)."},
    )

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        # A speed table's training ratio holds for one calibration batch (checked against the timings).
        table = self.reference_speedups if isinstance(self.reference_speedups, str) and \
            self.reference_speedups.endswith(".json") else None
        given = _given_speedups(self.reference_speedups)
        # The default training ratio was measured with gors at GORS' batch; one given as text is the user's word.
        self.priced_train_batch = (GORS_TRAIN_BATCH_PER_GPU if "train" not in given else
                                   speed_table_train_batch(table) if table is not None else None)
        self.speed_table = table
        unknown = sorted(set(given) - set(SPEEDUP_STAGES))
        if unknown:
            raise ValueError(f"--reference_speedups: unknown stage {', '.join(map(repr, unknown))}; the stages are "
                             f"{', '.join(SPEEDUP_STAGES)}")
        # Remembered so that the closing note names only the ratios that are defaults.
        self.given_speedups = set(given)
        self.reference_speedups = CPU_MEASURED_SPEEDUPS | given  # a stage left out keeps its default ratio
        for name in ("num_prompts", "images_per_prompt", "num_inference_steps", "max_train_steps", "global_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: must be >= 1")
        bad = {k: v for k, v in self.reference_speedups.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0}
        if bad:
            raise ValueError(f"--reference_speedups: {bad}: each stage's ratio must be a number > 0")


def estimate_command(config: EstimateConfig) -> list[StageEstimate]:
    """`gors estimate`: print the table, the plan and its sources; warnings about the calibration on stderr."""
    stages, devices = merge_timings(config.timings)
    check_train_batch(config.priced_train_batch, stages,
                      f"--reference_speedups {config.speed_table}" if "train" in config.given_speedups else
                      "the default training ratio (measured on 2 CPU cores)")
    plan = RunPlan(config.num_prompts, config.images_per_prompt, config.num_inference_steps, config.max_train_steps,
                   config.global_batch_size)
    speedups = {k: float(v) for k, v in config.reference_speedups.items()}
    rows = estimate(stages, plan, speedups)
    print(format_estimate(rows, devices))
    print("\n" + format_plan(plan, stages))
    note = speedup_note(rows, config.given_speedups, devices)
    if note:
        print("\n" + note)
    for warning in calibration_warnings(stages):
        print(f"warning: {warning}", file=sys.stderr)
    return rows
