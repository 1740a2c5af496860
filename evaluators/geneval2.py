"""GenEval 2: 800 compositional prompts (atomicity 3-10), one image each, scored with Soft-TIFA.

Data: ``geneval2_data.jsonl`` of `facebookresearch/GenEval2` at a pinned commit (CC BY-NC 4.0:
non-commercial use only; fetched at run time, never shipped): per prompt its ``atom_count``, a
``vqa_list`` of [question, expected answer] pairs and the ``skills`` of those questions (object,
attribute, count, position, verb), which the scorers read from the prompt metadata.

Scores: Soft-TIFA GM per image (`rewards.soft_tifa`, Qwen3-VL-8B-Instruct as GenEval 2's
judge; its details keep AM, GM and the atom scores). TIFA, the fraction of atoms whose most
probable answer is the expected one, is read from the same answers (equal to the `tifa` reward,
without asking the questions again); VQAScore is a further column.
The summary reports, x100 as the official tools print them (`evaluators.geneval2_tables`),
Soft-TIFA AM and GM, the per-skill AM table and the per-atomicity GM table.

Image folders (``--images``): GenEval 2's own input, a JSON map prompt -> image path (relative
paths are read from the folder of the map), as ``image_paths.json`` in the folder (or the
folder's only ``.json`` file). Every evaluated prompt needs an image and every key must be a
GenEval 2 prompt; with `max_prompts`, prompts outside the subset are ignored.
Each file is read upright as its EXIF orientation says, as the official script's transformers
``load_image`` reads it (`evaluators.image_files`; gors' own images carry no orientation).
Official output (`write_official`): ``score_lists.json`` (per prompt, its atom scores, in
benchmark order, as ``evaluation.py`` writes them), ``image_paths.json``,
``benchmark_data.jsonl`` (the evaluated prompts' data rows, so ``soft_tifa_analysis.py
--benchmark_data benchmark_data.jsonl --score_data score_lists.json`` reruns the official
analysis on any subset) and ``soft_tifa_analysis.txt``; beside them ``soft_tifa_tables.md``,
the same numbers as markdown tables with the x100 scale in every column header.

GenEval 2 fixes no sampler; the protocol here is the project's evaluation default (DDIM,
30 steps, guidance 7.5, the checkpoint's own side, seed 42 + 100000 * prompt + image).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluators.base import Benchmark, BenchmarkPrompt, ImageEntry, check_complete, pinned_data
from evaluators.geneval2_tables import (
    ATOMICITIES,
    SKILLS,
    format_analysis,
    markdown_tables,
    overall,
    per_atomicity_table,
    per_skill_table,
)
from evaluators.image_files import upright_rgb
from evaluators.results import PERCENT_SCALE, Metric
from gors.core.data import PinnedSource, fetch_pinned_file, sha256_of
from gors.core.io import atomic_write_bytes, atomic_write_json, atomic_write_jsonl
from rewards.atoms import answer_variants, tifa_correct

DATA_FILE = "geneval2_data.jsonl"
MAP_FILE = "image_paths.json"
# The official per-image files `write_official` writes: one set, or one per image index.
OFFICIAL_PER_IMAGE_FILE = re.compile(r"(score_lists|image_paths)(_image\d+)?\.json")
TABLES_FILE = "soft_tifa_tables.md"
LICENCE = "CC BY-NC 4.0 (GenEval 2 data, facebookresearch/GenEval2): non-commercial use only"
GENEVAL2 = PinnedSource(
    name="geneval2",
    repository="facebookresearch/GenEval2",
    commit="a6e82d2289e8d418f27f0adee77908b07060eea3",
    folder="",
    sha256={
        DATA_FILE: "09233adbc9f877fba205f1a20efa4a8640e7e62a91dfd55893562bed8a928e43",
        "LICENSE": "ee6c684e7f3c319ffed9964a27e334a469d7f01b32abf5530de067a488901f68",
    },
    offline_hint="(a copy of geneval2_data.jsonl from github.com/facebookresearch/GenEval2), or pass data_path",
)


def load_geneval2_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a GenEval-2-format jsonl, each checked before any image is scored: prompt,
    atom_count (3..10, the official analysis's range), vqa_list, and one of GenEval 2's skills per
    question."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {number}: not valid JSON ({err.msg}); each line must look like GenEval "
                             f"2's {DATA_FILE}") from None
        problem = None
        if not isinstance(row, dict):
            problem = f"a {type(row).__name__}, not an object"
        elif not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            problem = "no 'prompt' text"
        elif not isinstance(row.get("atom_count"), int) or row["atom_count"] not in ATOMICITIES:
            problem = f"'atom_count' {row.get('atom_count')!r} is not a whole number in 3..10"
        elif not isinstance(row.get("vqa_list"), list) or not row["vqa_list"]:
            problem = "no 'vqa_list' of [question, answer] pairs"
        elif not isinstance(row.get("skills"), list) or len(row["skills"]) != len(row["vqa_list"]):
            problem = "'skills' must list one skill per vqa_list entry"
        elif unknown := sorted({str(skill) for skill in row["skills"]} - set(SKILLS)):
            problem = f"unknown skill {unknown[0]!r}; GenEval 2's skills are {', '.join(SKILLS)}"
        if problem:
            raise ValueError(f"{path}, line {number}: {problem}; each line must look like GenEval 2's {DATA_FILE}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    prompts = [row["prompt"] for row in rows]
    if len(set(prompts)) != len(prompts):
        raise ValueError(f"{path} repeats a prompt; GenEval 2 maps each prompt to one image, so prompts must be unique")
    return rows


@dataclass
class GenEval2Benchmark(Benchmark):
    """GenEval 2 with Soft-TIFA (GM per image; AM, per-skill and per-atomicity tables).

    The protocol fields are `Benchmark`'s (1 image per prompt; GenEval 2 fixes no sampler, so
    the project's evaluation default: DDIM 30 steps, guidance 7.5, the checkpoint's own side, seed
    per image).

    Args:
        vlm_model_name_or_path: the Qwen3-VL judge of Soft-TIFA, TIFA and VQAScore (default
            `Qwen/Qwen3-VL-8B-Instruct`, GenEval 2's).
        data_path: a GenEval-2-format jsonl to use instead of the pinned official file.
    """

    vlm_model_name_or_path: str | None = None
    data_path: str | None = None

    name = "geneval2"
    scorer = "soft_tifa"
    primary_metric = "soft_tifa_gm"
    official_images_per_prompt = 1
    metrics = (
        Metric("soft_tifa_gm", scale=PERCENT_SCALE, help="Soft-TIFA GM: mean over images of the geometric mean of atom scores"),
        Metric("soft_tifa_am", scale=PERCENT_SCALE, help="Soft-TIFA AM: mean over images of the mean atom score"),
        Metric("tifa", scale=PERCENT_SCALE, help="TIFA: share of atoms answered as expected, mean over images"),
        Metric("vqascore", scale=PERCENT_SCALE, help="VQAScore: probability of 'Yes' to the whole prompt, mean over images"),
        Metric("all_atoms_correct", help="share of images with every atom answered as expected"),
    )

    def _rows(self) -> list[dict[str, Any]]:
        return load_geneval2_rows(self.data_path or fetch_pinned_file(GENEVAL2, DATA_FILE))

    def prompts(self) -> list[BenchmarkPrompt]:
        return [
            BenchmarkPrompt(row["prompt"], {key: value for key, value in row.items() if key != "prompt"})
            for row in self.subsample(self._rows())
        ]

    def data_version(self) -> dict[str, Any]:
        if self.data_path:
            return {"path": str(Path(self.data_path).resolve()), "sha256": sha256_of(Path(self.data_path).read_bytes())}
        return pinned_data(GENEVAL2, DATA_FILE)

    def _judge_options(self) -> dict[str, Any]:
        # GenEval 2's own procedure (a `generate` per question), whose bfloat16 numbers the one pass only approaches:
        # a benchmark's numbers must compare with its published tables.
        judge = {"model_name_or_path": self.vlm_model_name_or_path} if self.vlm_model_name_or_path else {}
        return {"procedure": "generate", **judge}

    def scorer_options(self) -> dict[str, Any]:
        return {"aggregation": "gm", **self._judge_options()}

    def columns(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return {"vqascore": ("vqascore", self._judge_options())}

    def column_defaults(self, column: str, main_options: Mapping[str, Any]) -> dict[str, Any]:
        """The VQAScore column asks the judge Soft-TIFA asks, as it asks it: a `model_name_or_path` or
        `procedure` given in the scorer options is the column's too (its own column options still override it)."""
        shared = ("model_name_or_path", "procedure")
        return {key: main_options[key] for key in shared if key in main_options} if column == "vqascore" else {}

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        """tifa: the fraction of atoms whose most probable answer is the expected one, in [0, 1]
        (1.0 without atoms), as the `tifa` reward scores them; correct: all of them are."""
        details = row["details"]
        failed = [
            f"{question} expected {answer!r}, answered {predicted.strip()!r} (p={score:.2f})"
            for question, answer, predicted, score in zip(
                details["questions"], details["expected_answers"], details["predicted"], details["atom_scores"]
            )
            if not tifa_correct(predicted, answer_variants(question, answer))
        ]
        atoms = len(details["questions"])
        tifa = (atoms - len(failed)) / atoms if atoms else 1.0
        return {"tifa": tifa, "correct": not failed, "reason": "; ".join(failed)}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Soft-TIFA GM (main) and AM, x100; per-skill AM and per-atomicity GM tables; TIFA and columns x100.

        ``columns`` holds TIFA and the scorer columns in [0, 1], as every benchmark's columns are
        (`gors evaluate`'s table shows them beside the main metric).
        """
        # By prompt text (GenEval 2's prompts are unique), not by index: the bootstrap renumbers prompts.
        atom_counts = {p.text: p.metadata["atom_count"] for p in self.cached_prompts()}
        score_lists = [row["details"]["atom_scores"] for row in rows]
        summary: dict[str, Any] = {
            **overall(score_lists),
            "per_skill_am": per_skill_table(score_lists, [row["details"]["skills"] for row in rows]),
            "per_atomicity_gm": {
                str(k): v
                for k, v in per_atomicity_table(score_lists, [atom_counts[row["prompt"]] for row in rows]).items()
            },
        }
        tifa = sum(row["tifa"] for row in rows) / len(rows)
        summary["tifa"] = 100.0 * tifa
        summary["columns"] = {"tifa": tifa}
        for column in self.columns():
            if all(column in row.get("columns", {}) for row in rows):
                summary[column] = 100.0 * sum(row["columns"][column] for row in rows) / len(rows)
        summary.update({
            "all_atoms_correct": sum(row["correct"] for row in rows) / len(rows),
            "num_images": len(rows), "num_prompts": len({row["prompt_index"] for row in rows}),
            "images_per_prompt": self.num_images, "scale": PERCENT_SCALE, "licence": LICENCE,
        })
        return summary

    # As the official script's transformers ``load_image`` reads images: upright by EXIF.
    image_file_rgb = staticmethod(upright_rgb)

    def read_images(self, folder: Path) -> list[ImageEntry]:
        """The images of GenEval 2's prompt -> path JSON map in `folder` (see the module docstring)."""
        map_path = _find_map(folder)
        try:
            mapping = json.loads(map_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{map_path} is not valid JSON ({err}); it must map each prompt to an image path") from err
        if not isinstance(mapping, dict):
            raise TypeError(f"{map_path} must hold a JSON object mapping each prompt to an image path")
        known = {row["prompt"] for row in self._rows()}
        unknown = [key for key in mapping if key not in known]
        if unknown:
            raise ValueError(
                f"{map_path}: {len(unknown)} keys are not GenEval 2 prompts (first: {unknown[0]!r}); "
                "the keys must be the benchmark's prompts, exactly as written in its data."
            )
        prompts = self.cached_prompts()
        missing = [p.text for p in prompts if p.text not in mapping]
        if missing:
            raise ValueError(
                f"{map_path}: {len(missing)} of the {len(prompts)} evaluated prompts have no image "
                f"(first: {missing[0]!r}); add them to the map or generate the images without --images."
            )
        entries = []
        for index, prompt in enumerate(prompts):
            value = mapping[prompt.text]
            paths = [value] if isinstance(value, str) else value
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise ValueError(f"{map_path}: the value of {prompt.text!r} must be an image path (or a list of paths)")
            for image_index, raw in enumerate(paths):
                path = Path(raw) if Path(raw).is_absolute() else map_path.parent / raw
                if not path.is_file():
                    raise FileNotFoundError(f"{map_path}: the image of {prompt.text!r}, {path}, does not exist")
                entries.append(ImageEntry(index, image_index, path))
        check_complete(entries, len(prompts), self.num_images, folder)
        return entries

    def write_official(self, rows: list[dict[str, Any]], summary: dict[str, Any], output_dir: Path) -> None:
        prompts = self.cached_prompts()
        written = set()
        for image_index in sorted({row["image_index"] for row in rows}):
            suffix = "" if self.num_images == 1 else f"_image{image_index}"
            mine = sorted((r for r in rows if r["image_index"] == image_index), key=lambda r: r["prompt_index"])
            atomic_write_json(output_dir / f"score_lists{suffix}.json", [r["details"]["atom_scores"] for r in mine])
            # In benchmark order (atomic_write_json would sort the prompts).
            image_map = json.dumps({r["prompt"]: _absolute(r["path"], output_dir) for r in mine}, indent=2)
            atomic_write_bytes(output_dir / f"image_paths{suffix}.json", (image_map + "\n").encode())
            written |= {f"score_lists{suffix}.json", f"image_paths{suffix}.json"}
        # An earlier run with another --images_per_prompt named its files otherwise; left, the official
        # tools would read its images and scores as this run's.
        for path in output_dir.iterdir():
            if OFFICIAL_PER_IMAGE_FILE.fullmatch(path.name) and path.name not in written:
                path.unlink()
        atomic_write_jsonl(output_dir / "benchmark_data.jsonl", [{"prompt": p.text, **p.metadata} for p in prompts])
        per_atomicity = {int(k): v for k, v in summary["per_atomicity_gm"].items()}
        atomic_write_bytes(output_dir / "soft_tifa_analysis.txt",
                           format_analysis(summary["per_skill_am"], per_atomicity).encode())
        atomic_write_bytes(output_dir / TABLES_FILE, markdown_tables(summary).encode())


def _absolute(path: str, output_dir: Path) -> str:
    """A result row's image path as an absolute path (generated images are relative to samples/)."""
    return str(Path(path) if Path(path).is_absolute() else (output_dir / "samples" / path).resolve())


def _find_map(folder: Path) -> Path:
    """`folder`/image_paths.json, else the folder's only .json file."""
    preferred = folder / MAP_FILE
    if preferred.is_file():
        return preferred
    candidates = sorted(folder.glob("*.json"))
    if len(candidates) == 1:
        return candidates[0]
    raise FileNotFoundError(
        f"{folder}: GenEval 2 images are read from a JSON map prompt -> image path; put it at {preferred} "
        f"(found {len(candidates)} .json files: {', '.join(c.name for c in candidates) or 'none'})."
    )
