"""Benchmark validation during training: metrics of the current LoRA, and the best LoRA kept.

Every `--validation_steps` the trainer hands the in-memory pipeline to `BenchmarkValidation.run`:
the benchmark generates its (few) validation images on every process (sharded), scores them,
logs every numeric summary value and an image grid, and saves the LoRA to `<output_dir>/best`
when `--validation_metric` improves. The training RNG streams are saved and restored around it,
so a run with validation trains exactly as one without.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from accelerate import Accelerator
from diffusers.utils import make_image_grid
from PIL import Image

from evaluators.results import metric_value
from gors.config import RunConfig, TrainConfig
from gors.core.backbones import Backbone
from gors.core.io import atomic_write_json, publish_folder, read_jsonl, recover_folder

if TYPE_CHECKING:
    from evaluators.base import Benchmark

BEST_DIR = "best"
BEST_FILE = "best.json"


@contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Restore the global RNG states on exit: torch's CPU state and that of `device` when it is a
    CUDA device (`torch.random.fork_rng`), and Python's and NumPy's, which fork_rng leaves alone."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda_devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda_devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def is_better(value: float, best: float | None, higher_is_better: bool) -> bool:
    return best is None or (value > best if higher_is_better else value < best)


def image_grid(paths: list[Path], columns: int = 8, side: int = 128) -> np.ndarray:
    """Up to `columns` x 2 images side by side, each resized to `side` px: an (H, W, 3) uint8 array."""
    paths = paths[: columns * 2]
    columns = min(columns, len(paths))
    rows = -(-len(paths) // columns)
    images = []
    for path in paths:
        with Image.open(path) as image:
            images.append(image.convert("RGB"))
    # make_image_grid wants a full grid: the last row is filled up with white.
    images += [Image.new("RGB", (side, side), "white")] * (rows * columns - len(images))
    return np.asarray(make_image_grid(images, rows, columns, resize=side))


@dataclass(frozen=True)
class ValidationTarget:
    """What `--validation_benchmark` measures: the benchmark, its label, the metric and its direction."""

    benchmark: Benchmark
    label: str
    metric: str
    higher_is_better: bool


def validation_target(config: TrainConfig | RunConfig) -> ValidationTarget:
    """The benchmark, metric and scorer options of `--validation_*`, checked: a metric the benchmark
    does not declare, or a scorer option its scorer does not take, is a ValueError before any weights
    load (`gors run` calls this before generating, the trainer before training)."""
    from evaluators import benchmark_label, build_benchmark, parse_benchmarks

    name, subset = parse_benchmarks(config.validation_benchmark)[0]
    benchmark = build_benchmark(name, subset, max_prompts=config.validation_num_prompts,
                                images_per_prompt=config.validation_images_per_prompt)
    label = benchmark_label(name, subset)
    metric = config.validation_metric or benchmark.primary_metric
    try:
        higher_is_better = benchmark.declared_metric(metric).higher_is_better
    except KeyError:
        declared = ", ".join(declared.key for declared in benchmark.metrics)
        raise ValueError(f"--validation_metric={metric!r} is not a metric of {label}; choose one of "
                         f"{declared}") from None
    benchmark.check_scorer_options(label, config.validation_scorer_options, with_columns=False,
                                   flag="--validation_scorer_options")
    return ValidationTarget(benchmark, label, metric, higher_is_better)


class BenchmarkValidation:
    """`--validation_benchmark` for one training run (see the module docstring)."""

    def __init__(self, config: TrainConfig | RunConfig, accelerator: Accelerator, backbone: Backbone | None = None,
                 output_dir: Path | None = None) -> None:
        """`backbone`: the family of the model being trained, whose sampling the benchmark takes where it
        fixes none for it (None: Stable Diffusion 1/2). `output_dir`: where `validation/` and `best/`
        go (default: the run folder)."""
        target = validation_target(config)
        self.benchmark, self.label = target.benchmark, target.label
        self.metric, self.higher_is_better = target.metric, target.higher_is_better
        self.options = config.validation_scorer_options
        self.accelerator = accelerator
        self.backbone = backbone
        self.output_dir = Path(output_dir or config.output_dir)
        self._scorer = None
        if accelerator.is_main_process:
            recover_folder(self.output_dir / BEST_DIR)
        best_file = self.output_dir / BEST_DIR / BEST_FILE
        best = json.loads(best_file.read_text()) if best_file.is_file() else None
        # A best LoRA of another benchmark or metric (an earlier run in this folder) does not compete.
        same = best is not None and (best.get("benchmark"), best.get("metric")) == (self.label, self.metric)
        self.best: dict[str, Any] | None = best if same else None

    def start(self, resumed: bool) -> None:
        """A run that starts at step 0 drops an earlier run's validation results in this folder,
        which would otherwise be resumed as if they were this run's (a resumed run keeps them)."""
        if resumed:
            return
        self.best = None
        if self.accelerator.is_main_process:
            shutil.rmtree(self.output_dir / "validation", ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def run(self, step: int, pipeline: Any, save_lora: Callable[[Path], Any]) -> dict[str, Any]:
        """Validate the pipeline at `step`; returns the benchmark summary (all processes call this)."""
        accelerator = self.accelerator
        folder = self.output_dir / "validation" / f"step-{step:06d}"
        with preserved_rng(accelerator.device):
            if self._scorer is None:
                self._scorer = self.benchmark.make_scorer(accelerator, self.options)
            summary = self.benchmark.evaluate(
                None, folder, accelerator=accelerator, pipeline_loader=lambda: pipeline,
                scorer=self._scorer, scorer_options=self.options, with_columns=False, backbone=self.backbone,
            )
        value = metric_value(summary, self.metric)
        if value is None:  # e.g. a share of relation images when no validation prompt has a relation
            raise ValueError(f"--validation_metric={self.metric!r} is undefined on these {self.label} validation "
                             "prompts; raise --validation_num_prompts or choose another metric")
        value = float(value)
        logs = {f"validation/{self.label}/{k}": v for k, v in summary.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        accelerator.log(logs, step=step)
        if accelerator.is_main_process:
            self._log_images(folder, step)
            if is_better(value, self.best and self.best["value"], self.higher_is_better):
                # The LoRA and its record are published together: a kill leaves the old pair or the new one.
                staging = self.output_dir / f".{BEST_DIR}.tmp"
                shutil.rmtree(staging, ignore_errors=True)
                save_lora(staging)
                self.best = {"step": step, "benchmark": self.label, "metric": self.metric, "value": value}
                atomic_write_json(staging / BEST_FILE, self.best)
                publish_folder(staging, self.output_dir / BEST_DIR)
                accelerator.print(f"[validation] step {step}: {self.metric} {value:.4f}, the best so far")
            else:
                accelerator.print(f"[validation] step {step}: {self.metric} {value:.4f} "
                                  f"(best {self.best['value']:.4f} at step {self.best['step']})")
        accelerator.wait_for_everyone()
        return summary

    def _log_images(self, folder: Path, step: int) -> None:
        writers = [tracker.writer for tracker in self.accelerator.trackers if tracker.name == "tensorboard"]
        if not writers:
            return
        paths = [folder / "samples" / row["path"] for row in read_jsonl(folder / "results.jsonl")]
        if paths:
            writers[0].add_image(f"validation/{self.label}", image_grid(paths), step, dataformats="HWC")
