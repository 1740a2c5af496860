"""`gors estimate`: the GPU-hours of a full GORS run, from stage rates measured on your hardware.

A calibration `gors run` at the real sizes (the base model at its resolution, the real reward
model, a few prompts, a few hundred steps) writes each stage's rate to `timings.json`
(`gors.timings`). This module scales those rates to a planned run (by default the paper's colour
run: 700 prompts x 90 images, 50 DDIM steps, B-VQA, 15 000 steps of batch 16) and prints the
GPU-hours of each stage, for gors and for the official procedures at given speed ratios.

Scaling rules (pure functions below, tested without models):
- generation time per image is proportional to the denoising steps (fixed costs such as the VAE
  decode scale too, so scaling up from fewer steps slightly overestimates);
- scoring and selection time is per image;
- training time is per sample seen (steps x global batch), from the measured steps/s at the
  measured global batch (per-process batch x accumulation x processes);
- each stage's one-off set-up (loading the pipeline or the reward model, building the trainer and
  caching the calibration selection's latents: `setup_seconds`) is counted once, not scaled; a
  full selection's latents cost about one VAE encode per selected image more, and
  `--torch_compile`'s compiling, which happens in the first batch or step, is scaled as work, so
  calibrate without it;
- GPU-hours count every process: the measured wall time x processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gors.config import parse_mapping
from gors.timings import read_timings

# gors' speed over the official procedure per stage: the medians of the paired ratios that the
# scripts in benchmarks/ measured on 2 CPU cores at reduced sizes (benchmarks/README.md): B-VQA
# against T2I-CompBench's 8 passes, training (U-Net + text-encoder LoRA) against diffusers' LoRA
# loop, generation in batches of 8 against T2I-CompBench's one image per pipeline call. A GPU's
# own ratios (`python -m benchmarks --device cuda --full-size`) replace them through
# --reference_speedups.
CPU_MEASURED_SPEEDUPS = {"generate": 2.26, "score": 7.11, "select": 1.0, "train": 1.37}


@dataclass(frozen=True)
class RunPlan:
    """The run to estimate. Defaults: the paper's colour run."""

    num_prompts: int = 700
    images_per_prompt: int = 90
    num_inference_steps: int = 50
    max_train_steps: int = 15000
    global_batch_size: int = 16

    @property
    def images(self) -> int:
        return self.num_prompts * self.images_per_prompt


@dataclass(frozen=True)
class StageEstimate:
    stage: str
    work: str  # what the plan asks of the stage, in words
    gors_gpu_hours: float
    official_gpu_hours: float
    speedup: float  # official / gors


def gpu_seconds(entry: dict[str, Any], units: float, unit_scale: float = 1.0) -> float:
    """GPU-seconds (wall seconds x processes) of `units` units at a timings entry's pace: its set-up
    once (`setup_seconds`; absent in timings of gors before it was recorded), then each unit at the
    measured time per unit x `unit_scale` (e.g. the ratio of denoising steps)."""
    if entry["work"] <= 0:
        raise ValueError(f"the {entry['stage']} timing did no work; rerun the calibration with that stage to do")
    setup = entry.get("setup_seconds", 0.0)
    per_unit = (entry["seconds"] - setup) / entry["work"]
    return (setup + per_unit * unit_scale * units) * entry["num_processes"]


def estimate(stages: dict[str, dict[str, Any]], plan: RunPlan, speedups: dict[str, float]) -> list[StageEstimate]:
    """GPU-hours of each stage of `plan`, from `timings.json` entries by stage (see the module docstring).

    `speedups[stage]`: how many times faster gors is than the official procedure (1 where absent).
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
    return [StageEstimate(stage, work, s / 3600, s / 3600 * speedups.get(stage, 1.0), speedups.get(stage, 1.0))
            for stage, work, s in rows]


def merge_timings(paths: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The latest entry of each stage over several `timings.json` (later paths win), and the devices they ran on."""
    stages: dict[str, dict[str, Any]] = {}
    for path in paths:
        record = read_timings(path)
        if record is None:
            rounds = sorted(Path(path).glob("round-*/timings.json"))
            hint = (f"; a --rounds run keeps them per round, e.g. {rounds[0].parent}" if rounds else
                    "; pass a run folder of `gors run` or the file itself")
            raise FileNotFoundError(f"{path}: no timings.json{hint}")
        stages |= record["stages"]
    return stages, sorted({entry["device"] for entry in stages.values()})


def format_estimate(rows: list[StageEstimate], devices: list[str]) -> str:
    """A markdown table, with the totals and the ratio of the two."""
    lines = [f"GPU-hours on {', '.join(devices)} (rates measured there, scaled to the plan)", "",
             "| stage | work | gors GPU-h | official GPU-h | official / gors |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.stage} | {r.work} | {r.gors_gpu_hours:.2f} | {r.official_gpu_hours:.2f} | {r.speedup:.2f}x |")
    gors_total = sum(r.gors_gpu_hours for r in rows)
    official_total = sum(r.official_gpu_hours for r in rows)
    lines.append(f"| total | | {gors_total:.2f} | {official_total:.2f} | {official_total / gors_total:.2f}x |")
    return "\n".join(lines)


@dataclass
class EstimateConfig:
    """`gors estimate TIMINGS [TIMINGS ...]`: GPU-hours of a full run from measured stage rates."""

    timings: list[str] = field(metadata={"positional": True, "help": "timings.json files or run folders of "
                                                                      "calibration runs (later ones win per stage)"})
    num_prompts: int = field(default=700, metadata={"help": "Training prompts (paper, colour: 700)."})
    images_per_prompt: int = field(default=90, metadata={"help": "Images per prompt (paper: 90)."})
    num_inference_steps: int = field(
        default=50, metadata={"help": "Denoising steps per image (the paper's colour run: 50; `gors run` and the "
                                      "recipes sample SD 1/2 with 30, so pass 30 to price them)."})
    max_train_steps: int = field(default=15000, metadata={"help": "Optimizer steps (paper: 15 000)."})
    global_batch_size: int = field(default=16, metadata={"help": "Samples per step over all GPUs (paper: 2 x 8)."})
    reference_speedups: dict[str, Any] = field(
        default_factory=lambda: dict(CPU_MEASURED_SPEEDUPS),
        metadata={"help": "gors' speed over the official procedure per stage (JSON), e.g. from the scripts in "
                          "benchmarks/ run on your GPU; default: the ratios measured on 2 CPU cores."},
    )

    def __post_init__(self) -> None:
        given = parse_mapping(self.reference_speedups, "--reference_speedups")
        unknown = sorted(set(given) - set(CPU_MEASURED_SPEEDUPS))
        if unknown:
            raise ValueError(f"--reference_speedups: unknown stage {', '.join(map(repr, unknown))}; the stages are "
                             f"{', '.join(CPU_MEASURED_SPEEDUPS)}")
        self.reference_speedups = CPU_MEASURED_SPEEDUPS | given  # a stage left out keeps its default ratio
        for name in ("num_prompts", "images_per_prompt", "num_inference_steps", "max_train_steps", "global_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: must be >= 1")
        bad = {k: v for k, v in self.reference_speedups.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0}
        if bad:
            raise ValueError(f"--reference_speedups: {bad}: each stage's ratio must be a number > 0")


def estimate_command(config: EstimateConfig) -> list[StageEstimate]:
    """`gors estimate`: print the table."""
    stages, devices = merge_timings(config.timings)
    plan = RunPlan(config.num_prompts, config.images_per_prompt, config.num_inference_steps, config.max_train_steps,
                   config.global_batch_size)
    speedups = {k: float(v) for k, v in config.reference_speedups.items()}
    rows = estimate(stages, plan, speedups)
    print(format_estimate(rows, devices))
    defaults = [stage for stage, ratio in CPU_MEASURED_SPEEDUPS.items() if speedups[stage] == ratio]
    if defaults:
        print(f"\nofficial / gors for {', '.join(defaults)}: the ratios measured on 2 CPU cores; pass "
              "--reference_speedups with the benchmarks/ scripts' ratios on this GPU for its own.")
    return rows
