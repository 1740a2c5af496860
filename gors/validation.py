"""Benchmark validation during training: metrics of the current LoRA, and the best LoRA kept.

Every `--validation_steps`, and at the last step, the trainer hands the in-memory pipeline to
`BenchmarkValidation.run`: the benchmark generates its (few) validation images on every process
(sharded), scores them, logs every metric it declares and an image grid, and saves the LoRA to
`<output_dir>/best` when `--validation_metric` improves. The training RNG streams are saved and restored around it,
so a run with validation trains exactly as one without.

`best/best.json` records whose best it is: the training (`training_identity` of its checkpoint
fingerprint) and the validation settings (benchmark, metric, prompts, images, scorer options, sampler,
image side, the scorer's scoring version). A resumed run competes only with a record of its own
training and settings; a run that starts at step 0 discards the folder's `best/` and `validation/`
(`discard_validation_results`), and a resumed one the validation steps after its checkpoint, which a
killed run left; neither discards the results of a longer run of the same training past its end, whose
checkpoints stay (`kept_steps`).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from accelerate import Accelerator
from diffusers.utils import make_image_grid
from PIL import Image

from evaluators.base import FIXED_BATCH_FLAGS, SUMMARY_FILE
from evaluators.results import metric_value
from gors.checkpoints import BASE_MODEL_COMMIT, RECORDED_WHERE_KNOWN
from gors.config import RunConfig, TrainConfig, sampling_overrides
from gors.core.backbones import FAMILIES, Backbone, check_resolution
from gors.core.fingerprints import is_local_fingerprint
from gors.core.io import atomic_write_json, discard_folder, is_json_number, publish_folder, read_jsonl, recover_folder
from gors.core.memory import BatchLimits
from gors.core.pipeline import sampler_name
from gors.core.run_folder import BEST_DIR, BEST_FILE
from rewards.combined import scoring_versions

if TYPE_CHECKING:
    from evaluators.base import Benchmark

# The side every Stable Diffusion 1/2 protocol sampled at before the checkpoint's own side was the default.
EARLIER_SD_SIDE = 512
# Scorers whose scoring version rose since `best.json` began to record them: the version a record without them was
# scored at (GenEval's detector input resized as mmdetection's raised it to 3, for its graded reward too; B-VQA's
# BLIP transform to 2, and with it 3-in-1 to 5; numeracy's duplicate test to 4; the 3D rule's depth input to 5).
# Versions that rose earlier in 0.2's development (the detector rules') are taken as current: a record of those
# days competes as if scored now. Version 1 is what a record of no version means.
UNRECORDED_SCORING_VERSIONS = {"geneval": 2, "geneval_graded": 2, "b_vqa": 1, "three_in_one": 4, "numeracy": 3,
                               "spatial_3d": 4}
VALIDATION_DIR = "validation"
_STEP_FOLDER = "step-"
SETTINGS_FILE = "validation.json"  # in each step's folder: the validation settings its results are of
# The summary key under which a benchmark reports its further columns (`Metric.key` "columns.B-CLIP").
_COLUMNS = "columns"


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
    """Whether `value` beats `best` (None: nothing yet) in the metric's direction; a tie does not."""
    return best is None or (value > best if higher_is_better else value < best)


def training_identity(fingerprint: dict[str, Any], with_selection: bool = True, by_path: bool = False) -> str:
    """A hash (16 hex digits) of a training's checkpoint fingerprint (`gors.checkpoints.training_fingerprint`):
    which training a best LoRA belongs to. `with_selection=False` leaves the selection out, for online
    rounds: one LoRA trained on one selection per round, whose rounds' fingerprints differ only there.

    A local base model counts by its files' fingerprint, not its path, so that the training of a model
    moved elsewhere keeps its best LoRA; `by_path`: by its path, as best LoRAs recorded before were."""
    # The base model's commit and the precision are left out: a checkpoint of another is set aside with its best
    # LoRA, and a best LoRA recorded before they were stays that of its training.
    kept = {key: value for key, value in fingerprint.items()
            if (with_selection or not key.startswith("selection_")) and key not in RECORDED_WHERE_KNOWN}
    if not by_path and is_local_fingerprint(fingerprint.get(BASE_MODEL_COMMIT)):
        kept["pretrained_model_name_or_path"] = fingerprint[BASE_MODEL_COMMIT]
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def discard_validation_results(folder: Path, keep: range = range(0)) -> None:
    """Discard the validation results in `folder` (a run folder, or the top folder of online rounds):
    `best/` (and its staging folder) and `validation/`. A training that starts at step 0 calls this, with
    validation on or off, so that no earlier training's best LoRA or step results pass for its own.
    `keep`: steps whose results stay, with `best/` where it is of one of them (`kept_steps`)."""
    shutil.rmtree(folder / f".{BEST_DIR}.tmp", ignore_errors=True)
    if best_step(folder) not in keep:
        discard_folder(folder / BEST_DIR)
    if keep:
        discard_steps_after(folder, 0, keep)
    else:
        discard_folder(folder / VALIDATION_DIR)


def discard_steps_after(folder: Path, step: int, keep: range = range(0)) -> list[int]:
    """Discard `folder/validation/step-*` after `step`, the step a run resumes at: a killed run left them,
    and the resumed LoRA must be validated there anew, not credited with the killed one's results. Those of
    `keep` stay (`kept_steps`). Returns the steps discarded."""
    discarded = []
    root = folder / VALIDATION_DIR
    for path in sorted(root.glob(f"{_STEP_FOLDER}*")) if root.is_dir() else []:
        number = path.name[len(_STEP_FOLDER):]
        if number.isdigit() and int(number) > step and int(number) not in keep:
            discard_folder(path)
            discarded.append(int(number))
    return discarded


def kept_steps(max_train_steps: int, later_step: int | None) -> range:
    """The steps whose validation results a run to `max_train_steps` keeps: those of a longer run of the same
    training past it, up to `later_step`, that run's checkpoint that stays (`gors.checkpoints.later_checkpoint`;
    None: none). They are of LoRAs the folder still holds, which `--max_train_steps` with their step goes on
    from; the steps this run trains are validated anew."""
    return range(max_train_steps + 1, later_step + 1) if later_step is not None else range(0)


def best_step(folder: Path) -> int | None:
    """The step of `folder`'s best LoRA (`best/best.json`), None without a readable one."""
    try:
        step = json.loads((folder / BEST_DIR / BEST_FILE).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


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


def earlier_settings(benchmark: Benchmark, family: Backbone, resolution: int, scorer: str) -> dict[str, Any]:
    """The validation settings a `best.json` written before they were recorded was validated with, for a
    model of `family` validated now at `resolution` px by reward `scorer`: the family's own sampler; 512 px
    where the benchmark samples at the checkpoint's own side now (`official_sampling.resolution` None: until
    0.2 the Stable Diffusion 1/2 protocols sampled at 512, a 768-v model too); the scores of the scorers whose
    version rose since (`UNRECORDED_SCORING_VERSIONS`)."""
    own_side = family.name in benchmark.protocol_families and benchmark.official_sampling.resolution is None
    versions = scoring_versions(scorer)
    then = {**versions, **{name: version for name, version in UNRECORDED_SCORING_VERSIONS.items() if name in versions}}
    return {"sampler": sampler_name(family), "resolution": EARLIER_SD_SIDE if own_side else resolution,
            "scoring_versions": {name: version for name, version in then.items() if version > 1}}


def _is_column(key: str) -> bool:
    """Whether summary key `key` is a further column's (e.g. T2I-CompBench's "columns.B-CLIP")."""
    return key.partition(".")[0] == _COLUMNS


def validation_target(config: TrainConfig | RunConfig) -> ValidationTarget:
    """The benchmark, metric and scorer options of `--validation_*`, checked: a metric the benchmark
    does not declare or validation does not compute (a further column), or a scorer option its scorer
    does not take, is a ValueError before any weights load (`gors run` calls this before generating,
    the trainer before training)."""
    from evaluators import benchmark_label, build_benchmark_with_options, parse_benchmarks

    name, subset = parse_benchmarks(config.validation_benchmark)[0]
    benchmark = build_benchmark_with_options(
        name, subset, {name: config.validation_benchmark_options}, "--validation_benchmark_options",
        max_prompts=config.validation_num_prompts, images_per_prompt=config.validation_images_per_prompt,
        **sampling_overrides(config, "validation_"))
    label = benchmark_label(name, subset)
    metric = config.validation_metric or benchmark.primary_metric
    choices = ", ".join(declared.key for declared in benchmark.metrics if not _is_column(declared.key))
    if _is_column(metric):
        # Validation scores with the benchmark's main scorer only: a column's model would load beside the
        # one being trained, every --validation_steps.
        column = metric.partition(".")[2]
        optional = f" --columns {column}" if column in benchmark.optional_columns() else ""
        raise ValueError(f"--validation_metric={metric!r} is a further column of {label}, which validation during "
                         f"training does not compute; choose one of {choices} (and score the column afterwards: "
                         f"`gors evaluate --lora <output_dir>/best --benchmarks {config.validation_benchmark}"
                         f"{optional}`)")
    try:
        higher_is_better = benchmark.declared_metric(metric).higher_is_better
    except KeyError:
        raise ValueError(f"--validation_metric={metric!r} is not a metric of {label}; choose one of "
                         f"{choices}") from None
    benchmark.check_scorer_options(label, config.validation_scorer_options, with_columns=False,
                                   flag="--validation_scorer_options")
    return ValidationTarget(benchmark, label, metric, higher_is_better)


class BenchmarkValidation:
    """`--validation_benchmark` for one training run (see the module docstring)."""

    def __init__(self, config: TrainConfig | RunConfig, accelerator: Accelerator, backbone: Backbone | None = None,
                 output_dir: Path | None = None) -> None:
        """`backbone`: the family of the model being trained, whose sampling the benchmark takes where it
        fixes none for it (None: Stable Diffusion 1/2); `self.backbone` is it with the benchmark's sampler
        (`Benchmark.sampling_backbone`), the one the validation pipeline must sample with.
        `output_dir`: where `validation/` and `best/` go (default: the run folder). Only checks: the
        folder is read by `start`."""
        target = validation_target(config)
        self.benchmark, self.label = target.benchmark, target.label
        self.metric, self.higher_is_better = target.metric, target.higher_is_better
        self.options = config.validation_scorer_options
        family = backbone or FAMILIES["StableDiffusionPipeline"]
        self.backbone = self.benchmark.sampling_backbone(family)
        if config.validation_resolution is not None:
            check_resolution(family, config.validation_resolution, "--validation_resolution")
        resolution = self.benchmark.protocol(self.backbone).resolution
        scorer, merged = self.benchmark.scorer_spec(self.options)
        # What makes two validations' values comparable; a best LoRA is kept only against its like. Steps and
        # guidance only where given: the protocol's are the sampler's (and best LoRAs recorded before keep theirs).
        overrides = {key: value for key, value in sampling_overrides(config, "validation_").items() if key != "resolution"}
        # A VLM judge's procedure, the benchmark's default too (GenEval 2's `generate` since 0.2; the one pass
        # before, whose best.json records none and so does not compare).
        overrides |= {"procedure": merged["procedure"]} if "procedure" in merged else {}
        self.settings: dict[str, Any] = json.loads(json.dumps({
            "benchmark": self.label, "metric": self.metric, "num_prompts": config.validation_num_prompts,
            "images_per_prompt": config.validation_images_per_prompt, "scorer_options": self.options,
            "sampler": sampler_name(self.backbone), "resolution": resolution,
            "scoring_versions": scoring_versions(scorer), **overrides,
            # Only where given (other prompts, another judge...): settings recorded before it stay comparable.
            **({"benchmark_options": config.validation_benchmark_options} if config.validation_benchmark_options else {}),
        }, sort_keys=True))
        self._earlier = earlier_settings(self.benchmark, family, resolution, scorer)
        self.accelerator = accelerator
        self.output_dir = Path(output_dir or config.output_dir)
        self._scorer = None
        # Beside the models in training a batch may not fit: each validation starts at the sizes that last did.
        self._batch_limits = BatchLimits()
        self.training: str | None = None
        self.best: dict[str, Any] | None = None

    def start(self, step: int, training: str, recorded_as: Collection[str] = (), keep: range = range(0)) -> None:
        """Set up for a run at `step` (0: a fresh start; more: resumed or continued there) of the training
        `training` (`training_identity`; `recorded_as`: the identities an earlier gors gave it), on every
        process. A fresh start discards the folder's
        validation results (`discard_validation_results`); a resumed run discards those after `step`
        (`discard_steps_after`) and competes with the recorded best LoRA only when it is of this training,
        these validation settings and a step up to `step`: another's value does not compare, and the
        first validation replaces it. `keep`: the steps of a longer run of this training whose results stay
        (`kept_steps`), with a best LoRA of one of them, which this run competes with."""
        accelerator = self.accelerator
        self.training = training
        recover = step > 0 or bool(keep)
        if accelerator.is_main_process:
            if recover:
                recover_folder(self.output_dir / BEST_DIR)
            if step == 0:
                discard_validation_results(self.output_dir, keep)
            else:
                discarded = discard_steps_after(self.output_dir, step, keep)
                if discarded:
                    accelerator.print(f"[validation] discarded the results of steps {discarded}, after step {step}: "
                                      "a killed run's, of a LoRA this run trains again")
        accelerator.wait_for_everyone()
        best_file = self.output_dir / BEST_DIR / BEST_FILE
        best = json.loads(best_file.read_text()) if recover and best_file.is_file() else None
        recorded = best.get("validation") if best is not None else None
        if isinstance(recorded, dict):
            recorded = {**self._earlier, **recorded}
        same_training = best is not None and best.get("training") in (training, *recorded_as)
        if best is not None and not (same_training and recorded == self.settings):
            changed = ([] if same_training else ["training"]) + sorted(
                key for key in self.settings if not isinstance(recorded, dict) or recorded.get(key) != self.settings[key])
            accelerator.print(f"[validation] {best_file} differs from this run in {', '.join(changed)}: a value "
                              "validated otherwise does not compare, and this run's first validation replaces it")
            best = None
        elif best is not None and best.get("step", 0) > step and best.get("step") not in keep:
            # A killed run's LoRA after the checkpoint this run resumes from: not one this run trains.
            accelerator.print(f"[validation] {best_file} is of step {best['step']}, after step {step} that this run "
                              "resumes from: this run's first validation replaces it")
            best = None
        self.best = best
        # The scorer loads now, not at the first validation: a model that does not load or fit fails
        # before any training step, and it would stay in memory from that validation on anyway.
        with preserved_rng(accelerator.device):
            if self._scorer is None:
                self._scorer = self.benchmark.make_scorer(accelerator, self.options, flag="--validation_scorer_options")

    def step_folder(self, step: int) -> Path:
        return self.output_dir / VALIDATION_DIR / f"{_STEP_FOLDER}{step:06d}"

    def _of_these_settings(self, step: int) -> bool:
        """Whether `step`'s folder was validated (or begun) under these settings, as `run` records them there."""
        try:
            return json.loads((self.step_folder(step) / SETTINGS_FILE).read_text()) == self.settings
        except (OSError, ValueError):
            return False

    def validated(self, step: int) -> bool:
        """Whether `step` has its results under these settings and the best LoRA record is of this training and
        these settings (after `start`): a training resumed at its last step with validation newly on, or on
        other settings, has not."""
        return (self.best is not None and self._of_these_settings(step)
                and (self.step_folder(step) / SUMMARY_FILE).is_file())

    def discard_unrelated(self, step: int) -> None:
        """Before validating `step` again (`validated` false): discard its folder unless it was begun under these
        settings (a killed try that `run` goes on from): another validation's samples its store would refuse. All
        processes call it."""
        if self.accelerator.is_main_process and not self._of_these_settings(step):
            discard_folder(self.step_folder(step))
        self.accelerator.wait_for_everyone()

    def run(self, step: int, pipeline: Any, save_lora: Callable[[Path], Any]) -> dict[str, Any]:
        """Validate the pipeline at `step`; returns the benchmark summary (all processes call this)."""
        if self.training is None:
            raise RuntimeError("BenchmarkValidation.run before start(): call start(step, training) first")
        accelerator = self.accelerator
        folder = self.step_folder(step)
        if accelerator.is_main_process:  # what the folder's results are of (`validated`)
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(folder / SETTINGS_FILE, self.settings)
        accelerator.wait_for_everyone()
        with preserved_rng(accelerator.device):
            summary = self.benchmark.evaluate(
                None, folder, accelerator=accelerator, pipeline_loader=lambda: pipeline,
                scorer=self._scorer, scorer_options=self.options, with_columns=False, backbone=self.backbone,
                flags=FIXED_BATCH_FLAGS, scorer_batch_flag=None, batch_limits=self._batch_limits,
            )
        value = metric_value(summary, self.metric)
        if value is None:  # e.g. a share of relation images when no validation prompt has a relation
            raise ValueError(f"--validation_metric={self.metric!r} is undefined on these {self.label} validation "
                             "prompts; raise --validation_num_prompts or choose another metric")
        value = float(value)
        accelerator.log(self.metric_logs(summary), step=step)
        if accelerator.is_main_process:
            self._log_images(folder, step)
            if is_better(value, self.best and self.best["value"], self.higher_is_better):
                # The LoRA and its record are published together: a kill leaves the old pair or the new one.
                staging = self.output_dir / f".{BEST_DIR}.tmp"
                shutil.rmtree(staging, ignore_errors=True)
                save_lora(staging)
                self.best = {"step": step, "benchmark": self.label, "metric": self.metric, "value": value,
                             "training": self.training, "validation": self.settings}
                atomic_write_json(staging / BEST_FILE, self.best)
                publish_folder(staging, self.output_dir / BEST_DIR)
                accelerator.print(f"[validation] step {step}: {self.metric} {value:.4f}, the best so far")
            else:
                accelerator.print(f"[validation] step {step}: {self.metric} {value:.4f} "
                                  f"(best {self.best['value']:.4f} at step {self.best['step']})")
        accelerator.wait_for_everyone()
        return summary

    def metric_logs(self, summary: dict[str, Any]) -> dict[str, float]:
        """Every metric the benchmark declares that `summary` holds a number for (nested ones such as
        `binding_errors.exchanged` too; counts such as `num_images` are no metric), by tracker tag."""
        logs = {}
        for declared in self.benchmark.metrics:
            value = metric_value(summary, declared.key)
            if is_json_number(value):
                logs[f"validation/{self.label}/{declared.key}"] = float(value)
        return logs

    def _log_images(self, folder: Path, step: int) -> None:
        writers = [tracker.writer for tracker in self.accelerator.trackers if tracker.name == "tensorboard"]
        if not writers:
            return
        paths = [folder / "samples" / row["path"] for row in read_jsonl(folder / "results.jsonl")]
        if paths:
            writers[0].add_image(f"validation/{self.label}", image_grid(paths), step, dataformats="HWC")
