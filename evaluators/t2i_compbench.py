"""T2I-CompBench (and T2I-CompBench++'s 3d_spatial and numeracy): one benchmark per category.

Protocol, as the official ``GORS_finetune/inference_eval.py`` of ``Karine-Huang/T2I-CompBench``:
the category's ``<category>_val.txt`` (300 prompts), 10 images per prompt, DDIM 30 steps,
guidance 7.5, the checkpoint's own side (no size is passed: 512 px for the SD-2-base it loads and
for SD 1.x, 768 px for SD 2.x 768-v), and image i of *every* prompt drawn with seed 42 + i (the script reseeds
its generator with 42 + n before the n-th image). The official tools read images from
``<folder>/samples/<prompt>_<index:06d>.png`` where the index runs over the whole file
(prompt p, image i -> p * 10 + i); `read_images` reads that layout, and `write_official` writes
each metric's ``vqa_result.json`` where the official scripts put it.

Sampling differs from the official script in two ways (docs/benchmarks.md, "Sampling differences"): the
initial noise comes from a CPU generator (the script seeds a CUDA one, whose noise for a seed is
another), and generation runs in the precision of `--mixed_precision` or the accelerate config (fp16 in
the shipped GPU configs, as the script samples; fp32 on the CPU).

Metric per category (a metric is a reward from `rewards`):

| category | metric | reward |
|---|---|---|
| color, shape, texture | B-VQA | `b_vqa` |
| spatial | UniDet rule (2D) | `spatial_rule` |
| non_spatial | CLIPScore | `clip_score` |
| complex | 3-in-1 | `three_in_one` (kinds from the official val sub-split lists) |
| 3d_spatial | UniDet rule (3D) | `spatial_3d` |
| numeracy | UniDet rule (numeracy) | `numeracy` |

Every category also reports B-CLIP (`blip_clip`) and CLIPScore (`clip_score`) columns, as the
paper's table does (its B-CLIP has no official code: `rewards.blip_clip`'s settings are ours, so
that column compares in kind), and, only when asked for (``extra_columns=["MLLM-CoT"]``, ``gors evaluate
--columns MLLM-CoT``: it generates two or more answers per image), the paper's MLLM
chain-of-thought score (`mllm_cot`, the category's official questions, on Qwen3-VL). The detector-based metrics run on an open-vocabulary detector instead of
UniDet (see `rewards.spatial`, `rewards.spatial_3d`, `rewards.numeracy`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from evaluators.base import Benchmark, BenchmarkPrompt, ImageEntry, check_complete, image_index_seed, pinned_data
from evaluators.results import Metric
from gors.core import paper
from gors.core.distributed import process_state
from gors.core.io import atomic_write_bytes
from gors.core.prompts import T2I_COMPBENCH, fetch_t2i_compbench_file, read_prompt_file
from rewards.question_differences import (
    BVQA_CATEGORIES,
    term_parsers,
    warn_unofficial_questions,
    warn_unofficial_term_parsers,
)
from rewards.question_table import question_provenance
from rewards.three_in_one import SUBSPLIT_FILES, normalise_prompt, prompt_kind


@dataclass(frozen=True)
class CategorySpec:
    """How one category is scored and reported.

    Attributes:
        label: the category as the paper's table names it.
        metric: the metric's name in the table.
        scorer: the reward that computes it.
        official_file: where the official script writes its per-image scores, relative to the
            output folder.
        answer_as_text: the official file stores answers as "0.1234" strings (BLIP-VQA does).
    """

    label: str
    metric: str
    scorer: str
    official_file: str
    answer_as_text: bool = False


_BLIP = "annotation_blip/vqa_result.json"
# Where the official scripts write each metric's per-image scores, relative to the output folder.
OFFICIAL_FILES: dict[str, str] = {
    "color": _BLIP,
    "shape": _BLIP,
    "texture": _BLIP,
    "spatial": "labels/annotation_obj_detection_2d/vqa_result.json",
    "3d_spatial": "labels/annotation_obj_detection_3d/vqa_result.json",
    "numeracy": "annotation_num/vqa_result.json",
    "non_spatial": "annotation_clip/vqa_result.json",
    "complex": "annotation_3_in_1/vqa_result.json",
}
CATEGORIES: dict[str, CategorySpec] = {
    category: CategorySpec(*paper.TABLE_LABELS[category], paper.METRIC_REWARD[category], OFFICIAL_FILES[category],
                           answer_as_text=OFFICIAL_FILES[category] == _BLIP)
    for category in paper.ALL_CATEGORIES
}
# Further metric columns of the paper's table: column name -> reward.
COLUMNS: dict[str, str] = {"B-CLIP": "blip_clip", "CLIPScore": "clip_score"}
# Columns computed only on request (slow): column name -> reward, given the category's questions.
OPTIONAL_COLUMNS: dict[str, str] = {"MLLM-CoT": "mllm_cot"}
# The official file names: "<prompt>_<index>.png" (the index is zero-padded to 6 digits).
_FILE_NAME = re.compile(r"^(?P<prompt>.*)_(?P<index>\d+)\.png$")
_FILE_HINT = "<prompt>_<index:06d>.png, index = prompt * images_per_prompt + image"


@dataclass
class T2ICompBenchBenchmark(Benchmark):
    """T2I-CompBench (Huang et al., 2023): one category, scored with its official metric.

    The protocol fields (max_prompts, images_per_prompt, num_inference_steps, guidance_scale,
    resolution, seed, batch_size) are `Benchmark`'s, with the official defaults: 10 images per
    prompt, DDIM 30 steps, guidance 7.5, the checkpoint's own side, seeds 42 + image index.
    images_per_prompt is
    also the index stride of an official folder for `read_images` (index = prompt *
    images_per_prompt + image).

    Args:
        category: one of color, shape, texture, spatial, non_spatial, complex, 3d_spatial, numeracy.
        column_options: keyword arguments of each further column's reward, e.g.
            ``{"B-CLIP": {"model_name_or_path": ...}, "CLIPScore": {...}, "MLLM-CoT": {...}}``.
    """

    category: str = "color"
    column_options: Mapping[str, Mapping[str, Any]] | None = None

    name = "t2i_compbench"
    subset_field = "category"
    official_images_per_prompt = 10
    seed_fn = staticmethod(image_index_seed)
    metrics = (
        Metric("score", help="the category's metric (B-VQA, UniDet, CLIPScore or 3-in-1), mean over images"),
        Metric("columns.B-CLIP", help="BLIP caption vs prompt CLIP similarity, mean over images"),
        Metric("columns.CLIPScore", help="CLIP image-prompt similarity, mean over images"),
        Metric("columns.MLLM-CoT", help="MLLM chain-of-thought judge's 0-100 rating / 100, mean over images "
                                        "(only when asked for)"),
    )

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category={self.category!r}; choose one of {', '.join(paper.ALL_CATEGORIES)}")
        super().__post_init__()
        unknown = set(self.column_options or {}) - set(COLUMNS) - set(OPTIONAL_COLUMNS)
        if unknown:
            raise ValueError(f"column_options for {sorted(unknown)}; the columns are "
                             f"{', '.join([*COLUMNS, *OPTIONAL_COLUMNS])}")

    @property
    def spec(self) -> CategorySpec:
        return CATEGORIES[self.category]

    @property
    def scorer(self) -> str:  # type: ignore[override]  # per category, not per class
        return self.spec.scorer

    # ------------------------------------------------------------------------------------------
    # Prompts, protocol, scorers.

    def val_prompts(self) -> list[str]:
        """Every prompt of the category's val file, in file order."""
        lines = read_prompt_file(fetch_t2i_compbench_file(f"{self.category}_val.txt"))
        return [line.split("\t")[0] for line in lines]  # the official script keeps the text before a tab

    def selection(self) -> list[tuple[int, str]]:
        """(line index in the val file, prompt) of each prompt evaluated, in file order."""
        return self.subsample(list(enumerate(self.val_prompts())))

    def prompts(self) -> list[BenchmarkPrompt]:
        chosen = [text for _, text in self.selection()]
        if self.category != "complex":
            return [BenchmarkPrompt(text) for text in chosen]
        # 3-in-1 averages different terms per prompt; the official script decides by the val lists.
        keys = {
            kind: {normalise_prompt(p) for p in read_prompt_file(fetch_t2i_compbench_file(files[0]))}
            for kind, files in SUBSPLIT_FILES.items()
        }
        return [BenchmarkPrompt(text, {"three_in_one": prompt_kind(text, keys["spatial"], keys["action"])})
                for text in chosen]

    def data_version(self) -> dict[str, Any]:
        files = [f"{self.category}_val.txt"]
        if self.category == "complex":
            files += [names[0] for names in SUBSPLIT_FILES.values()]
        return pinned_data(T2I_COMPBENCH, *files)

    def scorer_options(self) -> dict[str, Any]:
        # The prompts' metadata carries each complex prompt's 3-in-1 kind (the official val lists).
        return {"subsplits": "none"} if self.category == "complex" else {}

    def columns(self) -> dict[str, tuple[str, dict[str, Any]]]:
        options = self.column_options or {}
        return {column: (reward, dict(options.get(column, {}))) for column, reward in COLUMNS.items()}

    def optional_columns(self) -> dict[str, tuple[str, dict[str, Any]]]:
        # The judge asks the questions of this category.
        options = self.column_options or {}
        return {column: (reward, {"category": self.category, **options.get(column, {})})
                for column, reward in OPTIONAL_COLUMNS.items()}

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        """The scorer's reason, when it gives one (the detector rules do)."""
        reason = row["details"].get("reason")
        return {"reason": reason} if reason is not None else {}

    # ------------------------------------------------------------------------------------------
    # Results.

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """score: mean metric over all images, in [0, 1]; table: the paper's row of this category."""
        if not rows:
            raise ValueError(f"t2i_compbench:{self.category} has no scored images to summarise")
        score = float(np.mean([row["score"] for row in rows]))
        table_row: dict[str, Any] = {"category": self.spec.label, "metric": self.spec.metric, "score": score}
        for column in COLUMNS:
            values = [row["columns"][column] for row in rows if column in row.get("columns", {})]
            table_row[column] = float(np.mean(values)) if len(values) == len(rows) else None
        for column in OPTIONAL_COLUMNS:  # in the row only where computed
            if all(column in row.get("columns", {}) for row in rows):
                table_row[column] = float(np.mean([row["columns"][column] for row in rows]))
        return {
            "category": self.category,
            "metric": self.spec.metric,
            "score": score,
            "num_images": len(rows),
            "num_prompts": len({row["prompt_index"] for row in rows}),
            "table": [table_row],
        }

    def provenance(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """B-VQA categories (color, shape, texture, complex): `questions`, which parser (name and
        version, or question table by sha256) made the questions, with its number of images; complex also
        `term_parsers`, which parser found 3-in-1's spatial object names and CLIP adjectives. The main
        process warns once when they are not the official parser's (see `rewards.question_differences`)."""
        if self.category not in BVQA_CATEGORIES:
            return {}
        questions = question_provenance(row["details"] for row in rows)
        parsers = term_parsers(row["details"] for row in rows) if self.category == "complex" else []
        if process_state().is_main_process:
            warn_unofficial_questions(self.category, questions)
            warn_unofficial_term_parsers(parsers)
        return {"questions": questions} | ({"term_parsers": parsers} if parsers else {})

    def write_official(self, rows: list[dict[str, Any]], summary: dict[str, Any], output_dir: Path) -> None:
        """The official script's ``vqa_result.json``: [{"question_id": index, "answer": score}, ...].

        The index is the official file index (prompt line * images_per_prompt + image); B-VQA
        answers are "0.1234" strings as the official BLIP script writes them.
        """
        lines = [line for line, _ in self.selection()]
        results = []
        for row in sorted(rows, key=lambda r: (lines[r["prompt_index"]], r["image_index"])):
            index = lines[row["prompt_index"]] * self.num_images + row["image_index"]
            answer = f"{row['score']:.4f}" if self.spec.answer_as_text else row["score"]
            results.append({"question_id": index, "answer": answer})
        # The official compact JSON (atomic_write_json would indent it).
        atomic_write_bytes(Path(output_dir) / self.spec.official_file, json.dumps(results).encode())

    # ------------------------------------------------------------------------------------------
    # Official image folders.

    def read_images(self, folder: Path) -> list[ImageEntry]:
        """Images of `folder` (or of its ``samples/`` sub-folder) named as the official scripts do.

        With `max_prompts`, images of the prompts left out are skipped. Any other file that does
        not belong to the benchmark, a missing image, a name whose prompt does not match its
        index, or an unreadable PNG is a clear error.
        """
        folder = Path(folder)
        samples = folder / "samples" if (folder / "samples").is_dir() else folder
        all_lines = self.val_prompts()
        chosen = self.selection()
        position = {line: p for p, (line, _) in enumerate(chosen)}
        entries = []
        for path in sorted(samples.iterdir()):
            if path.name.startswith("."):
                continue
            match = _FILE_NAME.match(path.name)
            if not match or not path.is_file():
                raise ValueError(f"{path}: not a T2I-CompBench image name ({_FILE_HINT}); move it out of {samples}")
            line, image = divmod(int(match["index"]), self.num_images)
            expected = all_lines[line] if line < len(all_lines) else None
            if expected is None:
                raise ValueError(
                    f"{path}: index {match['index']} is past the {len(all_lines)} prompts x {self.num_images} "
                    f"images of {self.category}_val.txt; is images_per_prompt={self.num_images} right?"
                )
            if match["prompt"] != expected:
                raise ValueError(
                    f"{path}: index {match['index']} is image {image} of prompt {line} ({expected!r}), but the file "
                    f"names {match['prompt']!r}; is images_per_prompt={self.num_images} right ({_FILE_HINT})?"
                )
            if line not in position:
                continue  # a prompt that max_prompts leaves out
            _check_png(path)
            entries.append(ImageEntry(position[line], image, path))
        check_complete(entries, len(chosen), self.num_images, samples,
                       image_path=lambda p, i: samples / f"{chosen[p][1]}_{chosen[p][0] * self.num_images + i:06d}.png")
        return entries


def _check_png(path: Path) -> None:
    """Refuse an unreadable image before any model is loaded."""
    try:
        with Image.open(path) as image:
            image.verify()
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError) as err:
        raise ValueError(f"{path} is not a readable PNG ({err}); regenerate it or replace it") from err
