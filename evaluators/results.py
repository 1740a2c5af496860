"""The results schema of every benchmark's ``summary.json``, and its statistics as pure functions.

Each `summary.json` keeps the benchmark's own keys (``overall``, ``soft_tifa_gm``, ...) and adds a
``"results"`` block (`SCHEMA_VERSION` 1), as lm-evaluation-harness reports results::

    "results": {
      "schema_version": 1,
      "gors_version": "0.2.0",
      "libraries": {"torch": "2.14.1", "transformers": "5.25.0", ...},  # `LIBRARIES` installed when the
                                                     # summary was written (images and scores kept from an
                                                     # earlier run were made by the versions of that run): the
                                                     # models' and processors' code changes with them (GenEval
                                                     # 2's official code pins transformers 4.57)
      "benchmark": "geneval",
      "data": {"repository": "djghosh13/geneval", "commit": "af49...",
               "files": {"evaluation_metadata.jsonl": "<sha256>"}, "prompts_sha256": "<of the evaluated prompts>"},
      "config": {"max_prompts": null, "images_per_prompt": null, "num_inference_steps": 50, ...,
                 "seed_rule": "image_index_seed", "dtype": "float16"},  # images scored from a folder
                                                     # (--images): their sampling fields as given, no dtype,
                                                     # and "images": "external"
      "scorer": {"reward": "geneval", "options": {...}, "dtype": "float32", "scoring_versions": {...}},
      "samples": {"prompts": 553, "images": 2212, "images_per_prompt": 4},
      "metrics": {"overall": {"value": 0.52, "higher_is_better": true, "scale": "[0, 1]",
                              "stderr": 0.013, "ci95": [0.49, 0.55], "help": "..."}, ...},
      "bootstrap": {"unit": "prompt", "resamples": 1000, "seed": 0, "confidence": 0.95, "interval": "percentile"},
      "models": {"Salesforce/blip-vqa-capfilt-large": "<Hub commit>", ...}   # each scorer model's commit in
                                                     # the Hugging Face cache when it scored; for a local
                                                     # folder, "sha256:..." of its files
    }

Standard errors and confidence intervals come from a bootstrap over prompts: the prompts are
drawn with replacement (`BOOTSTRAP_RESAMPLES` times, a generator seeded with `BOOTSTRAP_SEED`),
each draw keeps all images of its prompt, and the benchmark's own aggregation (its `summarize`)
is recomputed on every resample. Metrics that are not plain means (GenEval's mean of task
means, GenEval 2's mean of per-image geometric means) are so treated as they are computed. The
standard error is the standard deviation (ddof=1) of the resampled values; the interval is
their 2.5 and 97.5 percentiles. Resamples in which a metric is undefined (None, e.g. no
relation prompt drawn) are left out of that metric's statistics. The cost is that of 1000
`summarize` calls: about 10 s for a full T2I-CompBench category or GenEval, 30 s for GenEval 2,
on one core; nothing beside the hours of generating and scoring.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

import numpy as np

SCHEMA_VERSION = 1
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
UNIT_SCALE = "[0, 1]"  # a share or a mean reward; every reward scores in [0, 1]
PERCENT_SCALE = "x100"  # the same in percent points, as some official tools print them
# The scales whose range a summary is checked against.
SCALE_RANGES = {UNIT_SCALE: (0.0, 1.0), PERCENT_SCALE: (0.0, 100.0)}

T = TypeVar("T")


@dataclass(frozen=True)
class Metric:
    """A reported number of a benchmark's summary.

    Attributes:
        key: its key in the summary; ``"columns.B-CLIP"`` reads ``summary["columns"]["B-CLIP"]``.
        higher_is_better: whether a larger value is a better model.
        scale: the range or unit of the stored value, e.g. "[0, 1]" or "x100" (percent points).
        help: what it measures, in a few words.
    """

    key: str
    higher_is_better: bool = True
    scale: str = UNIT_SCALE
    help: str = ""


_ABSENT = object()


def metric_value(summary: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The value of `key` in `summary` (a dot reads one level deeper); `default` when absent."""
    head, dot, tail = key.partition(".")
    value = summary.get(head, default)
    if not dot:
        return value
    return value.get(tail, default) if isinstance(value, Mapping) else default


def summary_problem(summary: Mapping[str, Any], metrics: Sequence[Metric]) -> str | None:
    """What is wrong with a benchmark's `summary` for its declared `metrics`, or None: a value JSON cannot
    hold (a numpy number), or a metric that is no number (None: undefined, allowed) or lies outside the range
    of its scale (`SCALE_RANGES`; 1e-6 of rounding allowed)."""
    try:
        json.dumps(summary)
    except (TypeError, ValueError) as err:
        return f"returned a value JSON cannot hold ({err}); return plain numbers (float(x), array.tolist())"
    for metric in metrics:
        value = metric_value(summary, metric.key)
        if value is None or metric.scale not in SCALE_RANGES:
            continue
        low, high = SCALE_RANGES[metric.scale]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"returned {value!r} for {metric.key!r}, not a finite number (or None where it is undefined)"
        if not low - 1e-6 <= value <= high + 1e-6:
            return (f"returned {value} for {metric.key!r}, outside its declared scale {metric.scale}; rescale it, or "
                    f"declare its scale (Metric({metric.key!r}, scale=...))")
    return None


def group_by_prompt(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Result rows grouped by ``prompt_index``, groups in order of first appearance."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["prompt_index"], []).append(row)
    return list(groups.values())


def resampled_rows(drawn: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of the drawn prompt groups, each group under a new ``prompt_index`` (its position
    in the draw), so that a prompt drawn twice counts as two prompts."""
    return [{**row, "prompt_index": position} for position, group in enumerate(drawn) for row in group]


def bootstrap_draws(num_groups: int, num_resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(num_resamples, num_groups) indices drawn with replacement; the same for the same arguments."""
    if num_groups < 1 or num_resamples < 1:
        raise ValueError(f"need at least one group and one resample, got {num_groups} and {num_resamples}")
    return np.random.default_rng(seed).integers(0, num_groups, size=(num_resamples, num_groups))


def bootstrap(groups: Sequence[T], statistic: Callable[[list[T]], Mapping[str, Any]],
              num_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> list[Mapping[str, Any]]:
    """`statistic` (named values) of each of `num_resamples` resamples of `groups`, drawn with replacement."""
    return [statistic([groups[i] for i in draw]) for draw in bootstrap_draws(len(groups), num_resamples, seed)]


def standard_error(values: Sequence[float | None]) -> float | None:
    """Standard deviation (ddof=1) of the resampled values that are defined; None below two."""
    defined = [v for v in values if v is not None]
    return float(np.std(defined, ddof=1)) if len(defined) >= 2 else None


def percentile_interval(values: Sequence[float | None], confidence: float = CONFIDENCE) -> list[float] | None:
    """[low, high]: the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of the defined values."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    defined = [v for v in values if v is not None]
    if len(defined) < 2:
        return None
    low, high = np.quantile(defined, [(1 - confidence) / 2, (1 + confidence) / 2])
    return [float(low), float(high)]


def metric_results(metrics: Sequence[Metric], summary: Mapping[str, Any],
                   replicates: Sequence[Mapping[str, Any]], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The ``metrics`` block: each metric of `summary` with its value, direction, scale, stderr and
    interval from the bootstrap `replicates` (summaries of resamples). Metrics the summary lacks
    (e.g. a column not computed) are left out; a None value has no statistics."""
    block = {}
    for metric in metrics:
        value = metric_value(summary, metric.key, _ABSENT)
        if value is _ABSENT:
            continue
        resampled = [metric_value(replicate, metric.key) for replicate in replicates] if value is not None else []
        block[metric.key] = {
            "value": value, "higher_is_better": metric.higher_is_better, "scale": metric.scale,
            "stderr": standard_error(resampled),
            f"ci{round(100 * confidence)}": percentile_interval(resampled, confidence),
            "help": metric.help,
        }
    return block


# The distributions whose code makes or scores the images: each model's forward and each processor (chat templates,
# image sizes) change with their releases.
LIBRARIES = ("torch", "diffusers", "transformers", "peft", "accelerate", "open_clip_torch")


def library_versions() -> dict[str, str | None]:
    """The installed version of each of `LIBRARIES` (None where one is not installed)."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def bootstrap_settings(num_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       confidence: float = CONFIDENCE) -> dict[str, Any]:
    """How the statistics of a ``metrics`` block were computed (see the module docstring)."""
    return {"unit": "prompt", "resamples": num_resamples, "seed": seed, "confidence": confidence,
            "interval": "percentile"}
