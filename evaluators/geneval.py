"""GenEval: 553 object-focused prompts in six tasks, 4 images each, judged correct or not.

Data: ``evaluation_metadata.jsonl`` of djghosh13/geneval ``prompts/`` at a pinned commit (MIT;
fetched at run time, never shipped): per prompt its ``tag`` (the task: single_object, two_object,
counting, colors, position, color_attr), ``include`` and optional ``exclude`` clauses, and the
``prompt``. The clauses travel to the scorer as prompt metadata.

Scorer: the `geneval` reward (Mask2Former COCO instances + CLIP colours + GenEval's rules,
`rewards.geneval`, `rewards.geneval_rules`); an image scores 1 when correct, else 0.

Summary, as the official ``evaluation/summary_scores.py`` computes it: the mean correctness of
each task, ``overall`` = the mean of the task means, the share of correct images and the share
of prompts with at least one correct image.

Protocol (the official ``generation/diffusers_generate.py``): 4 images per prompt, 50 steps,
guidance 9.0, seed 42 re-set before every prompt, so image i of every prompt starts from the same
seed: here image i gets seed 42 + i for every prompt (one CPU generator per image, so the noise
is not bit-identical to the official script's sequential draws from the global CUDA generator).
The official script fixes neither the resolution (the model's default: 512 px for SD 1.x / 2-base,
768 px for SD 2.x 768-v) nor the scheduler: gors samples at the checkpoint's own side with its own
scheduler, as it does (not the DDIM of the other benchmarks), also when validating during training. The official script also keeps the pipeline's
safety checker (SD 1.x ships one), which blacks out the images it flags, and those count as
wrong; gors loads every pipeline without it, so a model whose images the checker would flag scores
a little higher here. Pass `--images` with the official script's images to compare exactly.

Image folders (``--images``): GenEval's layout, ``<root>/<00000>/metadata.jsonl`` (the prompt's
metadata row as one JSON object) and ``<root>/<00000>/samples/<00000>.png`` (any number of
digits), folders numbered by the prompt's line in ``evaluation_metadata.jsonl``. Each folder's
prompt must be the benchmark's prompt of that number. With `images_per_prompt` given, images
numbered beyond it are ignored; otherwise every prompt needs exactly 4 images. Stricter than the
official script, which scores whatever files a folder holds whose names start with digits: here
other files are not images of the benchmark, and a prompt short of images is an error, never a
mean over fewer.

Official output (`write_official`): ``geneval_results.jsonl`` with the fields the official
``evaluate_images.py`` writes (filename, tag, prompt, correct, reason, metadata and details as
JSON strings), which ``summary_scores.py`` reads, and ``geneval_summary.txt`` in its layout.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluators.base import Benchmark, BenchmarkPrompt, ImageEntry, check_complete, image_index_seed, pinned_data
from evaluators.image_files import upright_rgb
from evaluators.results import Metric
from gors.core.backbones import SamplingDefaults
from gors.core.data import PinnedSource, fetch_pinned_file
from gors.core.io import atomic_write_bytes
from rewards.geneval_rules import TAGS, check_metadata

METADATA_FILE = "evaluation_metadata.jsonl"
OBJECT_NAMES_FILE = "object_names.txt"
RESULTS_FILE = "geneval_results.jsonl"
SUMMARY_TEXT_FILE = "geneval_summary.txt"
GENEVAL = PinnedSource(
    name="geneval",
    repository="djghosh13/geneval",
    commit="af4902f24d3ca90ebbb446dd9891a59e0f82725f",
    folder="prompts/",
    sha256={
        METADATA_FILE: "5c48e0813e812e3c373fa5c8ed07a8f0a483be30272b4427b0559c8048e67c13",
        OBJECT_NAMES_FILE: "608f6a0e5c8ca1c7a92b818430141fe268c85b7930b50f4160f1d65893b5bacd",
        "generation_prompts.txt": "55b6e3650e980c13daf30569eb666e000faf19bfc2b7b4cbe999fcdb7aa9d680",
    },
    offline_hint="(a copy of the prompts/ folder of github.com/djghosh13/geneval)",
)
_IMAGE_NAME = re.compile(r"\d+\.png")
_FOLDER_NAME = re.compile(r"\d{5}")


def load_geneval_metadata() -> list[dict[str, Any]]:
    """The 553 rows of the pinned ``evaluation_metadata.jsonl``, in order, each checked."""
    path = fetch_pinned_file(GENEVAL, METADATA_FILE)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for number, row in enumerate(rows, start=1):
        try:
            if not isinstance(row.get("prompt"), str):
                raise TypeError("no 'prompt' text")
            check_metadata(row)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}, line {number}: {err}") from err
    return rows


@dataclass
class GenEvalBenchmark(Benchmark):
    """GenEval (Ghosh et al., 2023): per-task and overall correctness, official protocol.

    The protocol fields are `Benchmark`'s, with the official defaults: 4 images per prompt, 50
    steps, guidance 9.0, seed 42 + image index (see the module docstring); the checkpoint's own side
    (the official script passes no size); 4 images per generation batch.
    """

    batch_size: int = 4

    name = "geneval"
    scorer = "geneval"
    primary_metric = "overall"
    official_images_per_prompt = 4
    # diffusers_generate.py sets no scheduler: the checkpoint's own samples (SD 1.5's PNDM, for example).
    # No size either: `diffusers_generate.py` calls the pipeline without one (the checkpoint's own side).
    official_sampling = SamplingDefaults(50, 9.0, None, None)
    seed_fn = staticmethod(image_index_seed)
    metrics = (
        Metric("overall", help="mean of the task means of image correctness"),
        Metric("correct_images", help="share of correct images"),
        Metric("correct_prompts", help="share of prompts with at least one correct image"),
        *(Metric(f"tasks.{tag}", help=f"share of correct images of the {tag} prompts") for tag in TAGS),
    )

    def selected(self) -> list[tuple[int, dict[str, Any]]]:
        """(official prompt number, metadata row) of each evaluated prompt, in benchmark order."""
        rows = load_geneval_metadata()
        return [(index, rows[index]) for index in self.subsample(range(len(rows)))]

    def prompts(self) -> list[BenchmarkPrompt]:
        return [BenchmarkPrompt(row["prompt"], row) for _, row in self.selected()]

    def data_version(self) -> dict[str, Any]:
        return pinned_data(GENEVAL, METADATA_FILE)

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        """correct and reason (the official failure text, one line per failed clause), and the task."""
        details = row["details"]
        return {"correct": bool(details["correct"]), "reason": details["reason"], "tag": details["tag"]}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-task means, overall = mean of the task means, shares of correct images and prompts; in [0, 1]."""
        return geneval_summary(rows)

    def resample_summary(self, rows: list[dict[str, Any]], evaluated: list[dict[str, Any]]) -> dict[str, Any]:
        """`overall` undefined in a resample without a whole task of the evaluation: a mean over fewer tasks is
        another quantity (a quick run's resamples lack one often; the full 553 prompts' never). Where a task has
        a single prompt, no resample defines it: no standard error or interval, rather than one that ignores
        that task's uncertainty."""
        summary = self.aggregate(rows)
        prompts: dict[str, set[int]] = {}
        for row in evaluated:
            prompts.setdefault(row["tag"], set()).add(row["prompt_index"])
        if min(map(len, prompts.values())) < 2 or set(summary["tasks"]) != set(prompts):
            summary["overall"] = None
        return summary

    # As the official ``evaluate_images.py`` opens images (``ImageOps.exif_transpose``): upright by EXIF.
    image_file_rgb = staticmethod(upright_rgb)

    def read_images(self, folder: Path) -> list[ImageEntry]:
        """The images of `folder` in GenEval's layout (see the module docstring)."""
        selected, entries = self.selected(), []
        strays = [path for path in sorted(folder.iterdir()) if path.is_dir() and not _FOLDER_NAME.fullmatch(path.name)]
        for prompt_index, (number, row) in enumerate(selected):
            subfolder = folder / f"{number:05d}"
            metadata_path = subfolder / "metadata.jsonl"
            if subfolder.is_dir() and not metadata_path.is_file():
                raise ValueError(f"{subfolder} has no metadata.jsonl: GenEval's generator writes the prompt's metadata "
                                 "row there, which tells which prompt the images are of; add it")
            if not metadata_path.is_file():
                continue  # check_complete reports its images as missing
            try:
                found = json.loads(metadata_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{metadata_path} is not one JSON object ({err}); GenEval's generator writes the prompt's "
                    f"metadata row there."
                ) from err
            if not isinstance(found, dict) or found.get("prompt") != row["prompt"]:
                got = found.get("prompt") if isinstance(found, dict) else found
                raise ValueError(
                    f"{metadata_path}: prompt {got!r}, but GenEval prompt {number} is {row['prompt']!r}. Folders "
                    f"must be numbered by the prompt's line in {METADATA_FILE} (pinned commit {GENEVAL.commit})."
                )
            samples = subfolder / "samples"
            for path in sorted(samples.iterdir()) if samples.is_dir() else []:
                if not (path.is_file() and _IMAGE_NAME.fullmatch(path.name)):
                    strays.append(path)
                else:
                    image_index = int(path.stem)
                    if self.images_per_prompt is None or image_index < self.images_per_prompt:
                        entries.append(ImageEntry(prompt_index, image_index, path))
        check_complete(entries, len(selected), self.num_images, folder, strays=strays,
                       image_path=lambda p, i: folder / f"{selected[p][0]:05d}" / "samples" / f"{i:05d}.png")
        return entries

    def write_official(self, rows: list[dict[str, Any]], summary: dict[str, Any], output_dir: Path) -> None:
        metadata = {index: json.dumps(p.metadata) for index, p in enumerate(self.cached_prompts())}
        lines = [json.dumps(official_row(row, metadata[row["prompt_index"]], output_dir)) for row in rows]
        atomic_write_bytes(output_dir / RESULTS_FILE, "".join(line + "\n" for line in lines).encode())
        atomic_write_bytes(output_dir / SUMMARY_TEXT_FILE, format_summary(summary).encode())


def official_row(row: dict[str, Any], metadata_json: str, output_dir: Path) -> dict[str, Any]:
    """One line of the official results file: metadata and details (class -> [[x0, y0, x1, y1, score]])
    are JSON strings, as ``evaluate_images.py`` writes them."""
    path = Path(row["path"])
    filename = path if path.is_absolute() else (output_dir / "samples" / path).resolve()
    boxes = {name: [[*d["box"], d["score"]] for d in found] for name, found in row["details"]["detections"].items()}
    return {
        "filename": str(filename), "tag": row["tag"], "prompt": row["prompt"], "correct": bool(row["correct"]),
        "reason": row["reason"], "metadata": metadata_json, "details": json.dumps(boxes),
    }


def geneval_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate judged rows (each with tag, correct, prompt_index) as ``summary_scores.py`` does.

    Returns overall (mean of the task means over the tasks present), tasks (tag -> mean
    correctness, in GenEval's task order), task_counts (tag -> [correct, images]),
    correct_images, correct_prompts (share of prompts with at least one correct image),
    num_images, num_prompts; every score in [0, 1].
    """
    if not rows:
        raise ValueError("no result rows to summarise")
    correct = np.array([bool(row["correct"]) for row in rows])
    tags = [row["tag"] for row in rows]
    order = [t for t in TAGS if t in tags] + sorted({t for t in tags if t not in TAGS})
    tasks, counts = {}, {}
    for tag in order:
        mine = correct[[t == tag for t in tags]]
        tasks[tag], counts[tag] = float(mine.mean()), [int(mine.sum()), len(mine)]
    by_prompt: dict[int, bool] = {}
    for row, ok in zip(rows, correct):
        by_prompt[row["prompt_index"]] = by_prompt.get(row["prompt_index"], False) or bool(ok)
    return {
        "overall": float(np.mean(list(tasks.values()))),
        "tasks": tasks,
        "task_counts": counts,
        "correct_images": float(correct.mean()),
        "correct_prompts": float(np.mean(list(by_prompt.values()))),
        "num_images": len(rows),
        "num_prompts": len(by_prompt),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The summary in the layout ``summary_scores.py`` prints."""
    lines = [
        "Summary", "=======", f"Total images: {summary['num_images']}", f"Total prompts: {summary['num_prompts']}",
        f"% correct images: {summary['correct_images']:.2%}", f"% correct prompts: {summary['correct_prompts']:.2%}",
        "", "Task breakdown", "==============",
    ]
    for tag, score in summary["tasks"].items():
        right, total = summary["task_counts"][tag]
        lines.append(f"{tag:<16} = {score:.2%} ({right} / {total})")
    lines += ["", f"Overall score (avg. over tasks): {summary['overall']:.5f}"]
    return "\n".join(lines) + "\n"
