"""A benchmark = prompts + generation protocol + scorer + aggregation, run on any checkpoint.

`Benchmark.evaluate` generates the benchmark's images with its own protocol (resumable, sharded
over Accelerate processes, with an optional LoRA) or reads images already laid out as the
benchmark's official tools expect (`images=`), scores them with the benchmark's scorer (a
reward from the `rewards` registry, given each prompt's metadata), and writes per-image rows
(`results.jsonl`), a summary (`summary.json`, with the `evaluators.results` schema beside the
benchmark's own keys) and any official-format files.

`Benchmark` is a dataclass holding the protocol fields every benchmark shares (max_prompts,
images_per_prompt, num_inference_steps, guidance_scale, resolution, seed, batch_size) with
their checks. A subclass is a dataclass too; it declares `name`, `scorer`, `primary_metric`,
`metrics`, `official_images_per_prompt` and, where its official protocol differs, its own field
defaults and `seed_fn`; it implements `prompts` (subsampled with `subsample`) and `summarize`.
`read_images`, `judge`, `scorer_options`, `columns` (further metrics reported beside the main
one, e.g. T2I-CompBench's B-CLIP and CLIPScore columns), `optional_columns` (further metrics
computed only when asked for, e.g. T2I-CompBench's slow MLLM-CoT judge), `data_version` and
`write_official` are optional.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from accelerate import Accelerator
from PIL import Image, UnidentifiedImageError

import gors
from evaluators.image_files import plain_rgb
from evaluators.results import (
    SCHEMA_VERSION,
    Metric,
    bootstrap,
    bootstrap_settings,
    group_by_prompt,
    library_versions,
    metric_results,
    metric_value,
    resampled_rows,
    summary_problem,
)
from gors.core.backbones import FAMILIES, Backbone, SamplingDefaults, detect_backbone, family_precision
from gors.core.data import PinnedSource
from gors.core.distributed import make_accelerator
from gors.core.io import atomic_write_json, atomic_write_jsonl, file_sha256
from gors.core.memory import BatchLimit, BatchLimits
from gors.core.pipeline import inference_dtype, load_pipeline, pipeline_settings
from gors.core.sampling import SamplingProtocol, StoreFlags, generate_samples
from gors.core.scoring import score_samples
from gors.core.store import IMAGE_HASH, SampleStore, StoreError, read_image, recorded_model_commits, sample_seed
from rewards import Reward
from rewards.combined import (
    build_reward,
    check_models_cached,
    check_options,
    dtype_setting,
    model_named_by,
    reward_dtype,
    versioned,
)
from rewards.registry import get_reward_class

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
T = TypeVar("T")


ScorerKey = tuple[str, str, int, str, str]


def scorer_dtype(reward: str, accelerator: Accelerator) -> torch.dtype:
    """The dtype a benchmark scores in (`rewards.combined.reward_dtype`): on CUDA the reward's
    `official_dtype` (the one its benchmark runs it in, e.g. GenEval 2's bfloat16 Qwen3-VL) where it
    declares one, else the generation precision; float32 on CPU."""
    return reward_dtype(reward, accelerator.device, inference_dtype(accelerator, None), benchmark=True)


def scorer_key(reward: str, options: Mapping[str, Any], batch_size: int, accelerator: Accelerator) -> ScorerKey:
    """What makes two scorers interchangeable: reward, options, batch size, device and dtype."""
    dtype = scorer_dtype(reward, accelerator)
    return reward, json.dumps(options, sort_keys=True, default=str), batch_size, str(accelerator.device), str(dtype)


def scorer_settings(reward: str, options: Mapping[str, Any], dtype: torch.dtype | None = None) -> dict[str, Any]:
    """What a score folder records about the scorer that filled it (see `gors.score.score_samples`):
    the reward, its options, the dtype it ran in (None: not recorded) and its scoring versions."""
    settings = {"reward": reward, "options": dict(options)}
    if dtype is not None:
        settings["dtype"] = dtype_setting(reward, dtype)
    return settings | versioned(reward)


@dataclass(frozen=True)
class BenchmarkPrompt:
    """One prompt of a benchmark and what its scorer needs to know about it (e.g. GenEval's clauses)."""

    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageEntry:
    """An image already on disk for image `image_index` of prompt `prompt_index`."""

    prompt_index: int
    image_index: int
    path: Path


class ImageFolderSamples:
    """Images in a benchmark's official layout, read in place like a `SampleStore` (no copies).

    Each record carries its file's sha256, as a store's does: an evaluation folder that scored other
    images (another `--images` folder, or this one's images made again) scores them anew instead of
    keeping the old images' scores.
    """

    def __init__(self, entries: Sequence[ImageEntry], prompts: Sequence[BenchmarkPrompt],
                 to_rgb: Callable[[Image.Image], Image.Image] = plain_rgb) -> None:
        self.to_rgb = to_rgb  # as the benchmark's official code reads a file (`evaluators.image_files`)
        keys = [(e.prompt_index, e.image_index) for e in entries]
        if len(set(keys)) != len(keys):
            raise StoreError("the image folder lists one (prompt, image) twice; each image must appear once")
        self._records = [
            {"prompt_index": e.prompt_index, "image_index": e.image_index, "prompt": prompts[e.prompt_index].text,
             "path": str(Path(e.path).resolve()), IMAGE_HASH: _file_sha256(Path(e.path))}
            for e in sorted(entries, key=lambda e: (e.prompt_index, e.image_index))
        ]

    def records(self) -> list[dict[str, Any]]:
        return [dict(record) for record in self._records]

    def open_image(self, record: Mapping[str, Any]) -> Image.Image:
        """The image as RGB; refused when its bytes are no longer those listed (replaced or rewritten since the
        folder was read), whose sha256 the scores are recorded under."""
        try:
            rgb, data = read_image(Path(record["path"]), self.to_rgb)
        except (OSError, UnidentifiedImageError) as err:
            raise StoreError(
                f"{record['path']} is not a readable image ({err}); regenerate or remove it and evaluate again "
                "(scores of the other images are kept)."
            ) from err
        if hashlib.sha256(data).hexdigest() != record[IMAGE_HASH]:
            raise StoreError(f"{record['path']} changed while it was being evaluated (its sha256 is no longer the "
                             "one listed): evaluate again once the folder is complete (scores of unchanged images "
                             "are kept).")
        return rgb


def _file_sha256(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError as err:
        raise StoreError(f"{path} cannot be read ({err.strerror or err}); fix its permissions or remove it") from err


def check_complete(entries: Sequence[ImageEntry], num_prompts: int, images_per_prompt: int, folder: Path,
                   image_path: Callable[[int, int], Path] | None = None, strays: Sequence[Path] = ()) -> None:
    """Refuse a folder with images missing or left over: either would silently change the numbers.

    `image_path(prompt, image)`: where the layout puts an image, named for the first one missing;
    `strays`: files and folders the layout does not name (misnamed images, most often), listed then.
    """
    found = {(e.prompt_index, e.image_index) for e in entries}
    expected = {(p, i) for p in range(num_prompts) for i in range(images_per_prompt)}
    missing, extra = sorted(expected - found), sorted(found - expected)
    if missing or extra:
        parts = []
        if missing:
            at = f", {image_path(*missing[0])}" if image_path is not None else ""
            parts.append(f"{len(missing)} missing (first: prompt {missing[0][0]}, image {missing[0][1]}{at})")
        if strays:
            shown = ", ".join(str(path) for path in strays[:3])
            parts.append(f"{len(strays)} not in the layout (first: {shown})")
        if extra:
            parts.append(f"{len(extra)} not in the benchmark (first: prompt {extra[0][0]}, image {extra[0][1]})")
        raise ValueError(
            f"{folder}: expected {num_prompts} prompts x {images_per_prompt} images, found {len(found)}; "
            f"{'; '.join(parts)}. Complete the folder, or generate the images with `gors evaluate` without --images."
        )


# A quick run's prompts are spread over the list (`spread_evenly`): another --max_prompts is another prompt set.
EVALUATION_FLAGS = StoreFlags(prompts="the --max_prompts that made it", may_change="--images_per_prompt",
                              extra_images="the evaluation scores the first --images_per_prompt of each prompt")
# Evaluations whose command has no flag for the batch sizes (validation during training, the toy recipe's).
FIXED_BATCH_FLAGS = replace(EVALUATION_FLAGS, batch_flag=None)


class FirstImages:
    """The first `count` images of each prompt in a sample store: what a benchmark scores, as its
    official scripts score a fixed number per prompt, when an earlier evaluation left more there."""

    def __init__(self, store: SampleStore, count: int) -> None:
        self.store, self.count = store, count

    def records(self) -> list[dict[str, Any]]:
        return [record for record in self.store.records() if record["image_index"] < self.count]

    def open_image(self, record: dict[str, Any]) -> Image.Image:
        return self.store.open_image(record)


def image_index_seed(base_seed: int, prompt_index: int, image_index: int) -> int:
    """Image i of every prompt uses `base_seed + i`: the official T2I-CompBench and GenEval
    scripts re-seed with the same seed before each prompt (T2I-CompBench: 42 ... 51)."""
    return base_seed + image_index


def spread_evenly(items: Sequence[T], max_prompts: int | None) -> list[T]:
    """`max_prompts` items spread evenly over `items`, in its order (item floor(i x len / max_prompts) for
    i < max_prompts, the first included); all of them when there are no more, or without a limit. A quick
    run over the whole prompt list, of exactly the size asked for."""
    if max_prompts and len(items) > max_prompts:
        return [items[i * len(items) // max_prompts] for i in range(max_prompts)]
    return list(items)


def pinned_data(source: PinnedSource, *files: str) -> dict[str, Any]:
    """The data version of files of a `PinnedSource`: repository, commit and each file's sha256."""
    return {"repository": source.repository, "commit": source.commit,
            "files": {name: source.sha256[name] for name in files}}


@dataclass
class Benchmark:
    """Base class of benchmarks: the shared protocol fields; see the module docstring.

    Args:
        max_prompts: evaluate this many prompts spread evenly over the benchmark's list (quick runs);
            None: all of them.
        images_per_prompt: images per prompt; None is the benchmark's official number.
        num_inference_steps, guidance_scale, resolution: sampling steps, classifier-free guidance
            and image side in pixels; None: the benchmark's `official_sampling` for the model
            families its protocol was written for (`protocol_families`, Stable Diffusion 1/2), the
            model family's own defaults for any other (`gors.core.backbones`).
        seed, batch_size: base seed of `seed_fn`, images per generation batch.
    """

    max_prompts: int | None = None
    images_per_prompt: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    resolution: int | None = None
    seed: int = 42
    batch_size: int = 8

    name: ClassVar[str] = ""
    scorer: ClassVar[str] = ""  # one reward from the rewards registry: a name or a module:Class path
    # The summary key that ranks checkpoints (validation keeps the best by it; reports lead with it).
    primary_metric: ClassVar[str] = "score"
    # Every number the summary reports, declared once: key, direction, scale (see evaluators.results).
    metrics: ClassVar[tuple[Metric, ...]] = ()
    # The constructor field that "name:value" sets in a benchmark spec, e.g. t2i_compbench:color.
    subset_field: ClassVar[str | None] = None
    official_images_per_prompt: ClassVar[int] = 1
    # The benchmark's sampling (steps, guidance, px, scheduler: None keeps the checkpoint's) and the model
    # families it was written for; by default the project's evaluation protocol, T2I-CompBench's (DDIM 30
    # steps, 7.5, and no size: `inference_eval.py` calls the pipeline without one, so each checkpoint
    # generates at its own side, 512 px for SD 1.x and SD-2-base, 768 px for SD 2.x 768-v).
    official_sampling: ClassVar[SamplingDefaults] = SamplingDefaults(30, 7.5, None, "DDIMScheduler")
    protocol_families: ClassVar[tuple[str, ...]] = ("sd",)
    # (base seed, prompt index, image index) -> seed of that image; by default a seed per image.
    # A staticmethod, so that `self.seed_fn` is the plain function, not a method bound to self.
    seed_fn: ClassVar[Callable[[int, int, int], int]] = staticmethod(sample_seed)

    def __post_init__(self) -> None:
        if self.images_per_prompt is not None and self.images_per_prompt < 1:
            raise ValueError(f"images_per_prompt must be >= 1 (or None for the official "
                             f"{self.official_images_per_prompt}), got {self.images_per_prompt}")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1 (or None for all prompts), got {self.max_prompts}")
        for key in ("num_inference_steps", "resolution", "batch_size"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")

    @property
    def num_images(self) -> int:
        """Images per prompt: `images_per_prompt`, or the official number when it is None."""
        return self.images_per_prompt or self.official_images_per_prompt

    @property
    def higher_is_better(self) -> bool:
        """The direction of the primary metric, as declared in `metrics`."""
        return self.declared_metric(self.primary_metric).higher_is_better

    def declared_metric(self, key: str) -> Metric:
        """The declared metric of summary key `key`."""
        for metric in self.metrics:
            if metric.key == key:
                return metric
        raise KeyError(f"{self.name} declares no metric {key!r}; it declares {[m.key for m in self.metrics]}")

    def subsample(self, items: Sequence[T]) -> list[T]:
        """`items` (the benchmark's prompts, in order) cut to `max_prompts` with `spread_evenly`."""
        return spread_evenly(items, self.max_prompts)

    def prompts(self) -> list[BenchmarkPrompt]:
        raise NotImplementedError

    def cached_prompts(self) -> list[BenchmarkPrompt]:
        """`prompts()`, read once per benchmark object: evaluation, summaries and every validation
        step reuse it instead of reading (or downloading) the data again."""
        if "_prompts" not in self.__dict__:
            prompts = self.prompts()
            wrong = next((p for p in prompts if not isinstance(p, BenchmarkPrompt)), None)
            if wrong is not None:
                raise ValueError(f"{type(self).__qualname__}.prompts() gave {wrong!r}; it returns BenchmarkPrompt "
                                "objects, e.g. BenchmarkPrompt(text, metadata)")
            self.__dict__["_prompts"] = prompts
        return self.__dict__["_prompts"]

    def protocol(self, backbone: Backbone | None = None) -> SamplingProtocol:
        """How the images are generated for a model of family `backbone` (None: Stable Diffusion 1/2):
        the protocol fields given, else the benchmark's official sampling where it was written for
        that family, else the family's defaults; `num_images` and `seed_fn`."""
        own = backbone is None or backbone.name in self.protocol_families
        defaults = self.official_sampling if own else backbone.sampling
        steps, guidance, resolution = defaults.resolve(self.num_inference_steps, self.guidance_scale, self.resolution)
        if resolution is None:  # the checkpoint's own side (a pipeline in memory: SD 1.x's and SD-2-base's)
            resolution = (backbone or FAMILIES["StableDiffusionPipeline"]).sampling.resolution
        return SamplingProtocol(
            self.num_images, steps, guidance, resolution=resolution, batch_size=self.batch_size, seed=self.seed, seed_fn=self.seed_fn,
            call_kwargs=backbone.call_kwargs if backbone is not None else {},
        )

    def sampling_backbone(self, backbone: Backbone) -> Backbone:
        """`backbone` with the benchmark's sampler where its protocol was written for the family
        (`official_sampling.scheduler`; None keeps the checkpoint's own, as GenEval's script does), the
        family's sampler for any other."""
        if backbone.name not in self.protocol_families:
            return backbone
        return replace(backbone, sampling=replace(backbone.sampling, scheduler=self.official_sampling.scheduler))

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Aggregate per-image result rows into the benchmark's reported numbers."""
        raise NotImplementedError

    def aggregate(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """`summarize`, plus the mean of every further column the rows carry under ``"columns"``
        (each a mean reward, in [0, 1]). The bootstrap recomputes exactly this on resampled rows."""
        summary = self.summarize(rows)
        computed = list(rows[0].get("columns", {})) if rows else []
        if computed:
            summary["columns"] = summary.get("columns", {}) | {
                column: sum(row["columns"][column] for row in rows) / len(rows) for column in computed
            }
        return summary

    def resample_summary(self, rows: list[dict[str, Any]], evaluated: list[dict[str, Any]]) -> dict[str, Any]:
        """The bootstrap's summary of resampled `rows` (drawn from the `evaluated` rows): `aggregate` by default.
        A benchmark whose metric means another quantity when a resample lacks part of the evaluation (a whole
        GenEval task) makes it undefined (None) there, which the bootstrap leaves out."""
        return self.aggregate(rows)

    def provenance(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """How the scores were made, beyond the protocol (e.g. which parser made B-VQA's questions):
        keys added to summary.json once, not recomputed by the bootstrap. None by default."""
        return {}

    def data_version(self) -> dict[str, Any]:
        """Which data the prompts come from (pinned commit and sha256, dataset revision, ...)."""
        return {}

    def results(self, rows: list[dict[str, Any]], summary: Mapping[str, Any],
                protocol: SamplingProtocol | None = None) -> dict[str, Any]:
        """The ``"results"`` block of summary.json (schema in `evaluators.results`), from the rows
        that `summary` aggregates: versions, config, sample counts, and each declared metric with
        its bootstrap standard error and 95% interval over prompts. `protocol`: how the images were
        generated; None for images made elsewhere, recorded as ``"images": "external"``."""
        groups = group_by_prompt(rows)
        replicates = bootstrap(groups, lambda drawn: self.resample_summary(resampled_rows(drawn), rows))
        prompt_texts = "\n".join(p.text for p in self.cached_prompts())
        # Through JSON so that an argument such as a Path in column_options is written as text.
        config = {f.name: getattr(self, f.name) for f in fields(self)}
        if protocol is not None:  # the values the images were made with, family defaults resolved
            config |= {key: getattr(protocol, key) for key in ("num_inference_steps", "guidance_scale", "resolution")}
        else:  # images made elsewhere (`images`): what made them is unknown, the fields stay as given
            config["images"] = "external"
        config = json.loads(json.dumps(config, default=str))
        return {
            "schema_version": SCHEMA_VERSION,
            "gors_version": gors.__version__,
            "libraries": library_versions(),
            "benchmark": self.name,
            "data": {**self.data_version(), "prompts_sha256": hashlib.sha256(prompt_texts.encode()).hexdigest()},
            "config": {**config, "seed_rule": self.seed_fn.__name__},
            "samples": {"prompts": len(groups), "images": len(rows), "images_per_prompt": self.num_images},
            "metrics": metric_results(self.metrics, summary, replicates),
            "bootstrap": bootstrap_settings(),
        }

    def scorer_options(self) -> dict[str, Any]:
        """Keyword arguments the protocol fixes for the scorer (user options are merged over them)."""
        return {}

    def columns(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Further metrics: column name -> (reward name, its keyword arguments). None by default."""
        return {}

    def optional_columns(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Further metrics computed only when `evaluate` names them in `extra_columns` (slow ones), as
        `columns`. None by default."""
        return {}

    def computed_columns(self, extra_columns: Sequence[str] = ()) -> list[str]:
        """The further columns `evaluate` computes: every one of `columns`, then those of `extra_columns`
        (each an optional column of this benchmark, else a ValueError)."""
        optional = self.optional_columns()
        unknown = [column for column in extra_columns if column not in optional]
        if unknown:
            raise ValueError(f"extra columns {unknown}: {self.name} has the optional columns "
                             f"{sorted(optional) or 'none'}")
        return [*self.columns(), *(column for column in optional if column in extra_columns)]

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        """Extra fields of one result row, e.g. ``{"correct": ..., "reason": ...}``; none by default."""
        return {}

    def read_images(self, folder: Path) -> list[ImageEntry]:
        """The images of `folder` in this benchmark's official layout."""
        raise NotImplementedError(f"{self.name} cannot read an image folder; generate its images instead")

    def image_file_rgb(self, image: Image.Image) -> Image.Image:
        """An image file of `read_images`' folder as RGB, as the official code reads it (`evaluators.image_files`:
        PIL's ``convert("RGB")`` by default); it matters only for files with transparency or an EXIF orientation."""
        return plain_rgb(image)

    @classmethod
    def reads_images(cls) -> bool:
        """Whether the benchmark reads an image folder (`evaluate(images=...)`): it has `read_images`."""
        return cls.read_images is not Benchmark.read_images

    def check_images_readable(self) -> None:
        """Refuse, before any work, `--images` on a benchmark that cannot read an image folder."""
        if not self.reads_images():
            from evaluators import available_benchmarks  # here: `evaluators` imports this module

            readers = [name for name in available_benchmarks() if _reads_images(name)]
            raise ValueError(f"--images: {self.name} cannot read an image folder; use --images with "
                             f"{', '.join(readers)}, or generate {self.name}'s images without --images")

    def write_official(self, rows: list[dict[str, Any]], summary: dict[str, Any], output_dir: Path) -> None:
        """Write files in the benchmark's own format beside results.jsonl (none by default)."""

    def column_defaults(self, column: str, main_options: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments `column`'s scorer takes from the main scorer's user options (e.g. GenEval 2's
        judge model), under the column's own options; none by default."""
        return {}

    def scorer_spec(self, options: Mapping[str, Any] | None = None, column: str | None = None,
                    main_options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """(reward, keyword arguments) of the main scorer or of `column`: user `options` over the benchmark's
        (for a column, over what it takes from the main scorer's user `main_options`: `column_defaults`)."""
        if column is None:
            return self.scorer, {**self.scorer_options(), **(options or {})}
        reward, fixed = {**self.columns(), **self.optional_columns()}[column]
        return reward, {**fixed, **self.column_defaults(column, main_options or {}), **(options or {})}

    def scorer_keys(self, accelerator: Accelerator, options: Mapping[str, Any] | None = None, batch_size: int = 16,
                    column_options: Mapping[str, Mapping[str, Any]] | None = None,
                    extra_columns: Sequence[str] = (), with_columns: bool = True) -> set[ScorerKey]:
        """The `make_scorer` cache keys of every scorer `evaluate` builds with these arguments."""
        specs = self.scorer_specs(options, column_options, extra_columns, with_columns)
        return {scorer_key(reward, merged, batch_size, accelerator) for _, reward, merged in specs}

    def scorer_specs(self, options: Mapping[str, Any] | None = None,
                     column_options: Mapping[str, Mapping[str, Any]] | None = None,
                     extra_columns: Sequence[str] = (), with_columns: bool = True,
                     ) -> list[tuple[str | None, str, dict[str, Any]]]:
        """(column, or None for the main scorer; reward; its merged options) of every scorer `evaluate`
        builds with these arguments."""
        specs: list[tuple[str | None, str, dict[str, Any]]] = [(None, *self.scorer_spec(options))]
        specs += [(column, *self.scorer_spec((column_options or {}).get(column), column, options))
                  for column in (self.computed_columns(extra_columns) if with_columns else [])]
        return specs

    def check_scorer_options(self, label: str, options: Mapping[str, Any] | None = None,
                             column_options: Mapping[str, Mapping[str, Any]] | None = None,
                             extra_columns: Sequence[str] = (), with_columns: bool = True,
                             flag: str = "--scorer_options") -> None:
        """Refuse, before any image is generated, an option that one of the scorers does not take
        (`flag`: the option that gave them), options of a column it does not compute and, offline, a scorer's
        model the local cache lacks."""
        self._check_column_options(label, column_options, extra_columns, with_columns, flag)
        specs = [(f"{label}'s scorer {reward!r}" if column is None else f"{label}'s {column} scorer {reward!r}",
                  reward, merged) for column, reward, merged in
                 self.scorer_specs(options, column_options, extra_columns, with_columns)]
        for what, reward, merged in specs:
            try:
                reward_class = get_reward_class(reward)
            except ValueError as err:  # the class's own `scorer` or `columns` name it, not the user's flags
                raise ValueError(f"benchmark class {type(self).__qualname__} ({what}): {err}") from err
            check_options(reward_class, merged, what, flag)
        for what, reward, merged in specs:  # a mistyped option first: it is the user's to fix
            check_models_cached(reward, None, merged, what, flag)

    def _check_column_options(self, label: str, column_options: Any, extra_columns: Sequence[str], with_columns: bool,
                              flag: str) -> None:
        """Refuse `columns` options that are no mapping of column name -> options, or name a column that this
        evaluation does not compute (unknown, optional and not asked for, or `--columns none`)."""
        if column_options is None:
            return
        example = f'{{"{label}": {{"columns": {{"COLUMN": {{"OPTION": ...}}}}}}}}'
        if not isinstance(column_options, Mapping):
            raise ValueError(f"{flag}: {label}'s columns options are {column_options!r}; give a mapping of column name "
                             f"to its options, e.g. '{example}'")
        computed = [column for column, _, _ in self.scorer_specs(None, None, extra_columns, with_columns) if column]
        for column, value in column_options.items():
            if column not in computed:
                known = [*self.columns(), *self.optional_columns()]
                why = ("it has no such column" if column not in known else
                       "--columns none computes no column" if not with_columns else
                       "it is optional and --columns does not ask for it")
                raise ValueError(f"{flag}: options for {label}'s column {column!r}, which this evaluation does not "
                                 f"compute ({why}; its columns: {', '.join(known) or 'none'})")
            if not isinstance(value, Mapping):
                raise ValueError(f"{flag}: the options of {label}'s column {column!r} are {value!r}; give a mapping, "
                                 f"e.g. '{example.replace('COLUMN', column)}'")

    def _column_settings(self, accelerator: Accelerator, column_options: Mapping[str, Mapping[str, Any]] | None,
                         column: str, main_options: Mapping[str, Any] | None) -> dict[str, Any]:
        """The settings `column`'s score folder records (`scorer_settings`)."""
        reward, merged = self.scorer_spec((column_options or {}).get(column), column, main_options)
        return scorer_settings(reward, merged, scorer_dtype(reward, accelerator))

    def make_scorer(self, accelerator: Accelerator, options: Mapping[str, Any] | None = None,
                    batch_size: int = 16, column: str | None = None,
                    cache: dict[ScorerKey, Reward] | None = None,
                    main_options: Mapping[str, Any] | None = None, flag: str = "--scorer_options") -> Reward:
        """The main scorer (or the scorer of `column`), user `options` merged over the benchmark's
        (a column's also over what it takes from the main scorer's user `main_options`). A model that
        cannot load is named by `flag`, the command's option that gave `options`.

        With `cache`, a scorer of the same reward, options, batch size, device and dtype built
        before (e.g. by another T2I-CompBench category) is reused instead of loading its models again.
        """
        reward, merged = self.scorer_spec(options, column, main_options)
        key = scorer_key(reward, merged, batch_size, accelerator)
        if cache is not None and key in cache:
            return cache[key]
        given = {**(self.column_defaults(column, main_options or {}) if column else {}), **(options or {})}
        with model_named_by(f"{flag} model_name_or_path", "model_name_or_path" in given):
            built = build_reward(reward, options=merged, device=accelerator.device,
                                 torch_dtype=scorer_dtype(reward, accelerator), batch_size=batch_size)
        if cache is not None:
            cache[key] = built
        return built

    def evaluate(
        self,
        pretrained_model_name_or_path: str | None,
        output_dir: str | Path,
        lora: str | None = None,
        accelerator: Accelerator | None = None,
        scorer_options: Mapping[str, Any] | None = None,
        images: str | Path | None = None,
        pipeline_loader: Callable[[], Any] | None = None,
        scorer_batch_size: int = 16,
        scorer: Reward | None = None,
        with_columns: bool = True,
        column_options: Mapping[str, Mapping[str, Any]] | None = None,
        scorer_cache: dict[ScorerKey, Reward] | None = None,
        backbone: Backbone | None = None,
        torch_compile: str = "no",
        extra_columns: Sequence[str] = (),
        lora_dropout: float = 0.0,
        flags: StoreFlags = EVALUATION_FLAGS,
        scorer_batch_flag: str | None = "--scorer_batch_size",
        batch_limits: BatchLimits | None = None,
    ) -> dict[str, Any]:
        """Generate (or read `images`), score and summarise; returns the summary.

        Resumable: generated images and scores already in `output_dir` are kept. For validation
        during training, `pipeline_loader` replaces loading `pretrained_model_name_or_path` (+ `lora`)
        with the pipeline in memory (of family `backbone`; None: Stable Diffusion 1/2), `scorer`
        reuses a loaded scorer, and `with_columns=False` skips the further metric columns. `column_options` gives a column's scorer keyword
        arguments by column name. `scorer_cache` shares loaded scorers between evaluations (see
        `make_scorer`). `torch_compile`: a `torch.compile` backend for the loaded pipeline's denoiser.
        `extra_columns`: optional columns (`optional_columns`) to compute too, unless `with_columns` is False.
        `lora_dropout`: sample with dropout on the LoRA's output (`gors.core.pipeline.LoraOutputDropout`), for
        the pipeline `evaluate` loads only.
        `flags` and `scorer_batch_flag`: the command's flags that messages name (`gors evaluate`'s by default;
        `FIXED_BATCH_FLAGS` and None where no flag sets the batch sizes). `batch_limits`: the generation and
        main scorer batch sizes that fit the device in earlier evaluations (halved ones are recorded there).
        A score folder made with other scorer settings is refused, not mixed in.
        """
        if lora_dropout and (pipeline_loader is not None or images is not None):
            raise ValueError("lora_dropout applies to the pipeline evaluate loads, not to one given by pipeline_loader "
                             "or to images read from a folder")
        if accelerator is None:
            generating = images is None and pipeline_loader is None and pretrained_model_name_or_path is not None
            precision = family_precision(detect_backbone(pretrained_model_name_or_path), None) if generating else None
            accelerator = make_accelerator(mixed_precision=precision)  # SD3/FLUX.1: bf16 under an fp16 config
        output_dir = Path(output_dir)
        known = {**self.columns(), **self.optional_columns()}
        unknown = sorted(set(column_options or {}) - set(known))
        if unknown:
            raise ValueError(f"options for columns {unknown} of {self.name}, which has {sorted(known)}")
        computed = self.computed_columns(extra_columns) if with_columns else []
        if scorer is None:  # a scorer that cannot be built stops the evaluation before any image is made
            self.check_scorer_options(self.name, scorer_options, column_options, extra_columns, with_columns,
                                      flag="--scorer_options")
        prompts = self.cached_prompts()
        if images is not None:
            samples, protocol = self._read_images(images, prompts)
        else:
            samples, protocol = self._generate(
                pretrained_model_name_or_path, lora, output_dir, prompts, accelerator, pipeline_loader, backbone,
                torch_compile, lora_dropout, flags, None if batch_limits is None else batch_limits.generation)
        main_spec = self.scorer_spec(scorer_options)
        main_dtype = scorer.torch_dtype if scorer is not None else scorer_dtype(main_spec[0], accelerator)
        scoring = _Scoring(samples, output_dir, accelerator, [dict(p.metadata) for p in prompts],
                           scorer_batch_size, scorer_batch_flag)
        scores = scoring.score(
            "scores", self.name,
            lambda: scorer or self.make_scorer(accelerator, scorer_options, scorer_batch_size, cache=scorer_cache),
            scorer_settings(*main_spec, main_dtype), limit=None if batch_limits is None else batch_limits.scoring,
        )
        column_scores = {
            column: scoring.score(
                f"columns/{column}", f"{self.name}: {column}",
                lambda column=column: self.make_scorer(
                    accelerator, (column_options or {}).get(column), scorer_batch_size, column, scorer_cache,
                    scorer_options,
                ),
                self._column_settings(accelerator, column_options, column, scorer_options),
            )
            for column in computed
        }
        rows = self._judged_rows(scores, column_scores)
        summary = self._summary(rows, output_dir, protocol, pretrained_model_name_or_path, lora, images)
        if lora_dropout:  # its samples' dropout, also where this folder is read alone
            summary["lora_dropout"] = lora_dropout
        # What scored (reward, options, dtype, scoring versions) and the precision that generated: two evaluations
        # compare exactly only where both are one (`gors report`'s protocol notes).
        summary["results"]["scorer"] = json.loads(json.dumps(scorer_settings(*main_spec, main_dtype), default=str))
        if images is None and pipeline_loader is None:
            summary["results"]["config"]["dtype"] = str(inference_dtype(accelerator, None)).removeprefix("torch.")
        # The versions (Hub commits, local fingerprints) of the models that generated (the pipeline's) and scored
        # (main scorer and columns).
        summary["results"]["models"] = {
            name: commit
            for folder in (*([output_dir / "samples"] if images is None else []), output_dir / "scores",
                           *(output_dir / "columns" / column for column in computed))
            for name, commit in recorded_model_commits(folder).items()
        }
        if accelerator.is_main_process:
            atomic_write_jsonl(output_dir / RESULTS_FILE, rows)
            atomic_write_json(output_dir / SUMMARY_FILE, summary)
            self.write_official(rows, summary, output_dir)
        accelerator.wait_for_everyone()
        return summary

    def _generate(self, model: str | None, lora: str | None, output_dir: Path, prompts: Sequence[BenchmarkPrompt],
                  accelerator: Accelerator, pipeline_loader: Callable[[], Any] | None, backbone: Backbone | None,
                  torch_compile: str, lora_dropout: float, flags: StoreFlags,
                  limit: BatchLimit | None) -> tuple[FirstImages, SamplingProtocol]:
        """The benchmark's images of `model` (+ `lora`, or the pipeline `pipeline_loader` gives, of family
        `backbone`) under its protocol, generated into `output_dir / samples` where missing, and the protocol."""
        if pipeline_loader is None and model is None:
            raise ValueError("give a model (pretrained_model_name_or_path) or an image folder (images)")
        # The family decides the defaults before any weights load (validation names its pipeline's family).
        if pipeline_loader is None:
            backbone = self.sampling_backbone(detect_backbone(model))
        protocol = self.protocol(backbone)
        dtype = inference_dtype(accelerator, None)

        def load():
            return load_pipeline(model, accelerator.device, dtype, lora=lora, backbone=backbone,
                                 torch_compile=torch_compile, lora_dropout=lora_dropout)

        store = generate_samples(
            SampleStore(output_dir / "samples"), [p.text for p in prompts], protocol, pipeline_loader or load,
            accelerator, prompt_info={"benchmark": self.name, "model": model, "lora": lora},
            settings=pipeline_settings(model, dtype, lora=lora, backbone=backbone, lora_dropout=lora_dropout),
            desc=f"{self.name}: generate", flags=flags, limit=limit,
        )
        return FirstImages(store, protocol.images_per_prompt), protocol

    def _read_images(self, images: str | Path, prompts: Sequence[BenchmarkPrompt]) -> tuple[Any, None]:
        """The samples of an image folder made elsewhere, and no protocol: the results record the fields as given."""
        self.check_images_readable()
        folder = Path(images)
        if not folder.is_dir():
            raise FileNotFoundError(f"--images {folder}: no such folder")
        return ImageFolderSamples(self.read_images(folder), prompts, self.image_file_rgb), None

    def _judged_rows(self, scores: dict[tuple[int, int], dict[str, Any]],
                     column_scores: dict[str, dict[tuple[int, int], dict[str, Any]]]) -> list[dict[str, Any]]:
        """One results row per scored image, in (prompt, image) order: its score, columns and `judge`'s fields."""
        rows = []
        for key in sorted(scores):
            score_row = scores[key]
            row = {"prompt_index": key[0], "image_index": key[1], "prompt": score_row["prompt"],
                   "path": score_row["path"], "score": score_row["reward"], "details": score_row["details"]}
            if column_scores:
                row["columns"] = {column: by_key[key]["reward"] for column, by_key in column_scores.items()}
            rows.append({**row, **self.judge(row)})
        return rows

    def _summary(self, rows: list[dict[str, Any]], output_dir: Path, protocol: SamplingProtocol | None,
                 model: str | None, lora: str | None, images: str | Path | None) -> dict[str, Any]:
        """The summary of `rows`: the metrics, their provenance and the results record (`results`)."""
        summary = {
            "benchmark": self.name, "model": model, "lora": lora,
            "images": str(images) if images is not None else None, "higher_is_better": self.higher_is_better,
            **self.aggregate(rows),
            **self.provenance(rows),
        }
        absent = object()
        if metric_value(summary, self.primary_metric, absent) is absent:
            raise ValueError(f"{type(self).__qualname__}.summarize returned no {self.primary_metric!r} (its "
                             f"primary_metric), only {sorted(self.summarize(rows))}; the images and scores in "
                             f"{output_dir} are kept for the next run")
        problem = summary_problem(summary, self.metrics)
        if problem is not None:
            raise ValueError(f"{type(self).__qualname__}.summarize {problem}; the images and scores in {output_dir} "
                             "are kept for the next run")
        summary["results"] = self.results(rows, summary, protocol)
        return summary


@dataclass(frozen=True)
class _Scoring:
    """What every score folder of one evaluation shares: its samples, folder, device, prompts' metadata
    (the rule scorers' inputs) and batch size."""

    samples: Any
    output_dir: Path
    accelerator: Accelerator
    prompt_metadata: list[dict[str, Any]]
    batch_size: int
    batch_flag: str | None

    def score(self, folder: str, desc: str, make: Callable[[], Reward], settings: dict[str, Any],
              limit: BatchLimit | None = None) -> dict[tuple[int, int], dict[str, Any]]:
        """Score the samples into `output_dir / folder` with the scorer `make` builds (when any is missing)."""
        return score_samples(self.samples, self.output_dir / folder, make, batch_size=self.batch_size,
                             accelerator=self.accelerator, desc=desc, batch_flag=self.batch_flag,
                             prompt_metadata=self.prompt_metadata, settings=settings, limit=limit)


def _reads_images(name: str) -> bool:
    """Whether benchmark `name` reads an image folder; False for an installed one that does not import
    (its own error belongs to a command that runs it, not to a message about another)."""
    from evaluators import benchmark_class  # here: `evaluators` imports this module

    try:
        return benchmark_class(name).reads_images()
    except ValueError:
        return False


def check_benchmark_class(cls: type[Benchmark]) -> None:
    """Refuse, when a benchmark class is registered or looked up, what would otherwise surface only after
    its images are generated and scored, or never: `prompts` or `summarize` not implemented, a
    `primary_metric` that `metrics` does not declare, protocol defaults redeclared in a class that is no
    dataclass (ignored: the base's `__init__` sets its own), a `seed_fn` that is no staticmethod."""
    what = f"benchmark class {cls.__qualname__}"
    missing = [hook for hook in ("prompts", "summarize") if getattr(cls, hook) is getattr(Benchmark, hook)]
    if missing:
        raise ValueError(f"{what} does not implement {' and '.join(missing)}; see docs/extending.md, Adding a benchmark")
    if isinstance(cls.scorer, str) and "," in cls.scorer:
        raise ValueError(f"{what}: scorer={cls.scorer!r} is a weighted list; a benchmark's scorer is one reward (a name "
                         "or a module:Class path): write a Reward subclass that combines them, or score the others as "
                         "columns")
    declared = [metric.key for metric in cls.metrics]
    if cls.primary_metric not in declared:
        raise ValueError(f"{what}: primary_metric={cls.primary_metric!r} is not among its metrics {declared}; declare "
                        f"it there (metrics = (Metric({cls.primary_metric!r}, ...), ...))")
    protocol_fields = {f.name for f in fields(Benchmark)}
    for klass in cls.__mro__[: cls.__mro__.index(Benchmark)]:
        redeclared = sorted(protocol_fields & set(vars(klass)))
        if redeclared and "__dataclass_fields__" not in vars(klass):
            raise ValueError(f"{klass.__qualname__} sets {', '.join(redeclared)} but is not a dataclass, so the "
                            "values would be ignored: put @dataclass on the class (under @register_benchmark)")
        if "seed_fn" in vars(klass) and not isinstance(vars(klass)["seed_fn"], staticmethod):
            raise ValueError(f"{klass.__qualname__}.seed_fn: wrap the function in staticmethod(...), so that it "
                            "is called as seed_fn(base_seed, prompt_index, image_index)")
