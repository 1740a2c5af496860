"""GenEval 2: the official tables on hand-made scores, the data file, the JSON image map, and an
end-to-end run on a tiny Stable Diffusion with a tiny random Qwen3-VL judge."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal, Optional

import pytest
from PIL import Image

import rewards
from evaluators.geneval2 import GENEVAL2, GenEval2Benchmark, load_geneval2_rows
from evaluators.geneval2_tables import (
    ATOMICITIES,
    SKILLS,
    format_analysis,
    markdown_tables,
    overall,
    per_atomicity_table,
    per_skill_table,
)
from gors.core.data import fetch_pinned_file

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"

# Words of the tiny Qwen3-VL vocabulary, in GenEval 2's data format.
ROWS = [
    {"prompt": "two red cars", "atom_count": 3,
     "vqa_list": [["How many cars are in the image?", "two"], ["Are the cars red?", "Yes"],
                  ["Are there any cars in the image?", "Yes"]],
     "skills": ["count", "attribute", "object"]},
    {"prompt": "a dog and a cat", "atom_count": 3,
     "vqa_list": [["How many dogs are in the image?", "one"], ["Are there any dogs in the image?", "Yes"],
                  ["How many cats are in the image?", "one"], ["Are there any cats in the image?", "Yes"]],
     "skills": ["count", "object", "count", "object"]},
    {"prompt": "a cow on the left of a bench", "atom_count": 4,
     "vqa_list": [["How many cows are in the image?", "one"], ["Are there any cows in the image?", "Yes"],
                  ["Is the cow on the left of the bench?", "Yes"], ["Are there any benchs in the image?", "Yes"]],
     "skills": ["count", "object", "position", "object"]},
]


# ---------------------------------------------------------------------------------------------
# Tables, computed by hand.


def test_per_skill_pools_atoms_over_images():
    scores = [[1.0, 0.5, 0.0], [0.8, 0.4]]
    skills = [["object", "count", "attribute"], ["object", "object"]]
    table = per_skill_table(scores, skills)
    # object atoms: 1.0, 0.8, 0.4 -> 2.2 / 3 (a mean of per-image means would give 80).
    assert table["object"] == pytest.approx(100 * 2.2 / 3)
    assert table["count"] == pytest.approx(50.0)
    assert table["attribute"] == 0.0
    assert table["position"] is None and table["verb"] is None
    assert list(table) == list(SKILLS)


def test_per_skill_rejects_unknown_skill_and_mismatched_lengths():
    with pytest.raises(ValueError, match="unrecognized skill 'colour'"):
        per_skill_table([[0.5]], [["colour"]])
    with pytest.raises(ValueError, match="2 atom scores but 1 skills"):
        per_skill_table([[0.5, 0.5]], [["object"]])


def test_per_atomicity_averages_geometric_means_of_images():
    scores = [[0.25, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.0, 1.0, 1.0], [0.9, 0.9]]
    table = per_atomicity_table(scores, [3, 3, 4, 10])
    # 0.25 ** (1/4) = sqrt(0.5); the second image's GM is 0.5.
    assert table[3] == pytest.approx(100 * (math.sqrt(0.5) + 0.5) / 2)
    assert table[4] == 0.0  # any zero atom zeroes the geometric mean
    assert table[10] == pytest.approx(90.0)
    assert all(table[k] is None for k in (5, 6, 7, 8, 9))
    assert tuple(table) == ATOMICITIES
    with pytest.raises(ValueError, match="atom_count 11"):
        per_atomicity_table([[0.5]], [11])


def test_tables_refuse_lists_that_do_not_line_up_or_an_image_without_atoms():
    """One skill list and one atom count per score list, as the official script asserts, rather than zip
    silently dropping the images past the shorter list; an empty score list has no geometric mean."""
    with pytest.raises(ValueError, match="2 score lists but 1 skill lists"):
        per_skill_table([[0.5], [0.5]], [["object"]])
    with pytest.raises(ValueError, match="2 score lists but 1 atom counts"):
        per_atomicity_table([[0.5], [0.5]], [3])
    with pytest.raises(ValueError, match="score list 1 is empty"):
        overall([[0.5], []])


def test_overall_am_and_gm_and_analysis_text():
    result = overall([[0.25, 1.0], [0.5, 0.5]])
    assert result["soft_tifa_am"] == pytest.approx(100 * (0.625 + 0.5) / 2)
    assert result["soft_tifa_gm"] == pytest.approx(100 * (0.5 + 0.5) / 2)
    with pytest.raises(ValueError, match="outside"):
        overall([[1.5]])
    text = format_analysis({"object": 73.3333, "count": None}, {3: 60.3553})
    assert "Per Atom Type Analysis (Soft-TIFA AM)\nObject:\n73.33\n" in text
    assert "Count:\nn/a" in text
    assert "Results for Atomicity=3\n60.36" in text


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_markdown_tables_say_x100_in_every_header():
    summary = {"soft_tifa_gm": 60.3553, "soft_tifa_am": 70.0, "tifa": 50.0, "columns": {"tifa": 0.5},
               "per_skill_am": {"object": 73.3333, "count": None}, "per_atomicity_gm": {"3": 60.3553, "4": None}}
    overall_table, skills, atomicities = [t.splitlines() for t in markdown_tables(summary).strip().split("\n\n")]
    assert cells(overall_table[0]) == ["Soft-TIFA GM (x100)", "Soft-TIFA AM (x100)", "TIFA (x100)", "VQAScore (x100)"]
    assert cells(overall_table[2]) == ["60.36", "70.00", "50.00", "-"]  # VQAScore not scored
    assert cells(skills[0]) == ["skill", "Soft-TIFA AM (x100)"] and len(skills) == 2 + len(SKILLS)
    assert cells(skills[2]) == ["object", "73.33"] and cells(skills[4]) == ["count", "-"]
    assert cells(atomicities[0]) == ["atomicity", "Soft-TIFA GM (x100)"] and len(atomicities) == 2 + len(ATOMICITIES)
    assert cells(atomicities[2]) == ["3", "60.36"] and cells(atomicities[3]) == ["4", "-"]


def test_judge_reads_tifa_from_the_soft_tifa_answers():
    details = {"questions": ["Is there a cat?", "Is the cat black?", "How many dogs are there?"],
               "expected_answers": ["yes", "yes", "2"], "predicted": [" Yes", "no", "two"],
               "atom_scores": [0.9, 0.2, 0.7]}
    verdict = GenEval2Benchmark().judge({"details": details})
    assert verdict["tifa"] == pytest.approx(2 / 3) and verdict["correct"] is False
    assert verdict["reason"] == "Is the cat black? expected 'yes', answered 'no' (p=0.20)"
    empty = {"questions": [], "expected_answers": [], "predicted": [], "atom_scores": []}
    assert GenEval2Benchmark().judge({"details": empty}) == {"tifa": 1.0, "correct": True, "reason": ""}


# ---------------------------------------------------------------------------------------------
# Data.


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/benchmarks reference copies")
def test_official_data_pinned_and_subset_covers_atomicities(monkeypatch):
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))
    rows = load_geneval2_rows(fetch_pinned_file(GENEVAL2, "geneval2_data.jsonl"))
    assert len(rows) == 800
    assert {skill for row in rows for skill in row["skills"]} == set(SKILLS)
    prompts = GenEval2Benchmark(max_prompts=8).prompts()
    assert len(prompts) == 8
    assert sorted(p.metadata["atom_count"] for p in prompts) == list(ATOMICITIES)
    assert set(prompts[0].metadata) == {"atom_count", "vqa_list", "skills"}


@pytest.mark.parametrize("line, message", [
    (json.dumps({**ROWS[0], "skills": ["count"]}), "line 2: 'skills' must list one skill per vqa_list entry"),
    ('{"prompt": "a cat"', r"line 2: not valid JSON \(Expecting"),
    ("[1, 2]", "line 2: a list, not an object"),
    (json.dumps({**ROWS[0], "atom_count": 2}), "line 2: 'atom_count' 2 is not a whole number in 3..10"),
    (json.dumps({**ROWS[0], "skills": ["spatial"] * len(ROWS[0]["vqa_list"])}), "line 2: unknown skill 'spatial'"),
    (json.dumps({**ROWS[0], "vqa_list": [], "skills": []}), r"line 2: no 'vqa_list' of \[question, answer\] pairs"),
    (json.dumps({**ROWS[0], "prompt": "  "}), "line 2: no 'prompt' text"),
])
def test_bad_data_line_is_a_clear_error_before_any_scoring(tmp_path, line, message):
    # The official analysis would fail on these only after every image was judged.
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[1]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl, {message}"):
        load_geneval2_rows(path)


def test_a_data_file_that_repeats_a_prompt_is_refused(tmp_path):
    # GenEval 2 maps each prompt to one image (image_paths.json): a repeated prompt would score one image twice.
    path = tmp_path / "twice.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[0]) + "\n")
    with pytest.raises(ValueError, match="twice.jsonl repeats a prompt"):
        load_geneval2_rows(path)


def test_a_data_file_without_prompts_is_refused(tmp_path):
    """Blank lines only: a clear error naming the file, not an evaluation of nothing."""
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(ValueError, match="empty.jsonl holds no prompts"):
        load_geneval2_rows(path)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("geneval2_data") / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def _image_folder(root: Path, prompts: list[str], extra: dict[str, str] | None = None) -> Path:
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    mapping = {}
    for index, prompt in enumerate(prompts):
        Image.new("RGB", (16, 16), (40 * index, 0, 0)).save(root / f"{index}.png")
        mapping[prompt] = f"{index}.png"
    (root / "image_paths.json").write_text(json.dumps({**mapping, **(extra or {})}))
    return root


def test_read_images_from_the_json_map(tmp_path, data_file):
    bench = GenEval2Benchmark(data_path=str(data_file))
    folder = _image_folder(tmp_path / "ok", [row["prompt"] for row in ROWS])
    entries = bench.read_images(folder)
    assert [(e.prompt_index, e.image_index, e.path.name) for e in entries] == [(0, 0, "0.png"), (1, 0, "1.png"),
                                                                               (2, 0, "2.png")]


def test_data_version_of_a_data_path_records_its_sha256(data_file):
    """A data_path in place of the pinned file is recorded by its path and the sha256 of its bytes, so that
    two evaluations on different copies of it are told apart."""
    import hashlib

    version = GenEval2Benchmark(data_path=str(data_file)).data_version()
    assert version == {"path": str(data_file.resolve()), "sha256": hashlib.sha256(data_file.read_bytes()).hexdigest()}


def test_summary_on_hand_made_rows(data_file):
    """TIFA is reported x100 beside Soft-TIFA (and in [0, 1] under columns); all_atoms_correct is the share of
    images whose every atom was answered as expected, not a mean of TIFA; the atomicity table groups by the
    data's atom_count (3 for 'a dog and a cat', which has 4 questions)."""
    bench = GenEval2Benchmark(data_path=str(data_file))
    scores = [[1.0, 0.5, 0.5], [0.25, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]
    rows = [{"prompt_index": p, "image_index": 0, "prompt": row["prompt"], "tifa": tifa, "correct": tifa == 1.0,
             "columns": {"vqascore": vqa}, "details": {"atom_scores": s, "skills": row["skills"]}}
            for p, (row, s, tifa, vqa) in enumerate(zip(ROWS, scores, [1.0, 0.75, 0.5], [0.2, 0.4, 0.9]))]
    summary = bench.summarize(rows)
    assert summary["tifa"] == pytest.approx(100 * 0.75) and summary["columns"] == {"tifa": pytest.approx(0.75)}
    assert summary["all_atoms_correct"] == pytest.approx(1 / 3)
    assert summary["vqascore"] == pytest.approx(50.0)
    assert summary["soft_tifa_am"] == pytest.approx(100 * (2 / 3 + 3.25 / 4 + 0.75) / 3)
    assert summary["per_atomicity_gm"]["3"] == pytest.approx(100 * (0.25 ** (1 / 3) + 0.25 ** (1 / 4)) / 2)
    assert summary["per_atomicity_gm"]["4"] == 0.0
    assert (summary["num_images"], summary["num_prompts"], summary["scale"]) == (3, 3, "x100")


def test_a_folder_with_several_json_files_and_no_image_paths_json_is_refused(tmp_path, data_file):
    """Which of two JSON files is the image map is not guessed: the error names image_paths.json and the
    candidates; a single JSON file of another name is taken as the map."""
    folder = _image_folder(tmp_path / "two", [row["prompt"] for row in ROWS])
    (folder / "image_paths.json").rename(folder / "map.json")
    assert len(GenEval2Benchmark(data_path=str(data_file)).read_images(folder)) == 3
    (folder / "notes.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"put it at .*image_paths.json \(found 2 .json files: map.json, "
                                                r"notes.json\)"):
        GenEval2Benchmark(data_path=str(data_file)).read_images(folder)


def test_read_images_missing_prompt_or_extra_key_is_a_clear_error(tmp_path, data_file):
    bench = GenEval2Benchmark(data_path=str(data_file))
    missing = _image_folder(tmp_path / "missing", [row["prompt"] for row in ROWS[:2]])
    with pytest.raises(ValueError, match="1 of the 3 evaluated prompts have no image \\(first: 'a cow on the left"):
        bench.read_images(missing)
    extra = _image_folder(tmp_path / "extra", [row["prompt"] for row in ROWS], {"a purple dragon": "0.png"})
    with pytest.raises(ValueError, match="1 keys are not GenEval 2 prompts \\(first: 'a purple dragon'\\)"):
        bench.read_images(extra)
    # With max_prompts, prompts of the benchmark outside the subset are ignored, not errors.
    full = _image_folder(tmp_path / "full", [row["prompt"] for row in ROWS])
    entries = GenEval2Benchmark(data_path=str(data_file), max_prompts=2).read_images(full)
    assert [e.path.name for e in entries] == ["0.png", "1.png"]  # 2 of 3: prompts 3 x 0 // 2 and 3 x 1 // 2


def test_image_files_are_read_upright_as_the_official_load_image_reads_them(tmp_path, data_file):
    """A file with an EXIF orientation (a phone photo, an editor's export) is turned as GenEval 2's transformers
    `load_image` turns it; the benchmarks whose official code reads with PIL alone keep it as stored."""
    from PIL import Image

    from evaluators.base import ImageFolderSamples

    bench = GenEval2Benchmark(data_path=str(data_file))
    folder = _image_folder(tmp_path / "exif", [row["prompt"] for row in ROWS])
    stored = Image.new("RGB", (16, 8), (255, 0, 0))
    exif = stored.getexif()
    exif[0x0112] = 6  # orientation: shown rotated 90 degrees clockwise
    stored.save(folder / "0.png", exif=exif)
    samples, _ = bench._read_images(str(folder), bench.cached_prompts())
    record = samples.records()[0]
    assert samples.open_image(record).size == (8, 16)
    assert ImageFolderSamples(bench.read_images(folder), bench.cached_prompts()).open_image(record).size == (16, 8)


# ---------------------------------------------------------------------------------------------
# End to end on tiny models.


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> Path:
    from gors.testing.qwen3_vl import build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny_qwen3_vl"), seed=0)


def test_end_to_end_generate_score_tables_and_images_map(tmp_path, tiny_sd, tiny_vlm, data_file, one_torch_thread):
    bench = GenEval2Benchmark(data_path=str(data_file), vlm_model_name_or_path=str(tiny_vlm),
                              num_inference_steps=2, resolution=32, batch_size=3)
    out = tmp_path / "run"
    summary = bench.evaluate(str(tiny_sd), out, scorer_batch_size=4)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and summary["num_images"] == 3
    score_lists = [row["details"]["atom_scores"] for row in rows]
    assert [len(s) for s in score_lists] == [len(row["vqa_list"]) for row in ROWS]
    assert all(row["details"]["source"] == "vqa_list" for row in rows)
    # The main score is Soft-TIFA GM of each image; the summary is x100.
    assert [row["score"] for row in rows] == pytest.approx([row["details"]["gm"] for row in rows])
    assert summary["soft_tifa_gm"] == pytest.approx(100 * sum(r["details"]["gm"] for r in rows) / 3)
    assert summary["soft_tifa_am"] == pytest.approx(100 * sum(r["details"]["am"] for r in rows) / 3)
    skills = [row["skills"] for row in ROWS]
    assert summary["per_skill_am"] == pytest.approx(per_skill_table(score_lists, skills))
    assert summary["per_atomicity_gm"]["4"] == pytest.approx(100 * rows[2]["details"]["gm"])
    assert summary["per_atomicity_gm"]["5"] is None
    assert 0.0 <= summary["vqascore"] <= 100.0
    assert summary["vqascore"] == pytest.approx(100 * sum(r["columns"]["vqascore"] for r in rows) / 3)
    # TIFA read from the Soft-TIFA answers equals the tifa reward asking the questions itself.
    tifa = rewards.load("tifa", model_name_or_path=str(tiny_vlm), batch_size=4).score(
        [Image.open(out / "samples" / r["path"]) for r in rows], [r["prompt"] for r in rows],
        metadata=[{"vqa_list": row["vqa_list"], "skills": row["skills"]} for row in ROWS])
    assert [r["tifa"] for r in rows] == pytest.approx(tifa.scores)
    assert summary["tifa"] == pytest.approx(100 * sum(tifa.scores) / 3)
    assert set(summary["columns"]) == {"tifa", "vqascore"}  # both in gors evaluate's table
    assert summary["columns"]["tifa"] == pytest.approx(summary["tifa"] / 100)  # columns are in [0, 1]
    metrics = summary["results"]["metrics"]
    assert {key: m["scale"] for key, m in metrics.items()} == {"soft_tifa_gm": "x100", "soft_tifa_am": "x100",
                                                              "tifa": "x100", "vqascore": "x100",
                                                              "all_atoms_correct": "[0, 1]"}
    assert all(m["value"] == summary[key] for key, m in metrics.items())
    assert summary["results"]["data"]["path"] == str(data_file.resolve())
    assert summary["results"]["samples"] == {"prompts": 3, "images": 3, "images_per_prompt": 1}
    assert all(isinstance(row["correct"], bool) for row in rows)
    assert "CC BY-NC 4.0" in summary["licence"]
    # Official files: score lists in benchmark order, the image map and the data rows.
    assert json.loads((out / "score_lists.json").read_text()) == score_lists
    image_map = json.loads((out / "image_paths.json").read_text())
    assert list(image_map) == [row["prompt"] for row in ROWS]
    assert [json.loads(line) for line in (out / "benchmark_data.jsonl").read_text().splitlines()] == ROWS
    assert "Per Atomicity Analysis (Soft-TIFA GM)" in (out / "soft_tifa_analysis.txt").read_text()
    assert (out / "soft_tifa_tables.md").read_text() == markdown_tables(summary)

    # The written map read back with --images: the same images give the same scores.
    folder = tmp_path / "images"
    folder.mkdir()
    assert all(os.path.isabs(path) and os.path.isfile(path) for path in image_map.values())
    (folder / "image_paths.json").write_text(json.dumps(image_map))
    again = bench.evaluate(None, tmp_path / "from_map", images=folder, scorer_batch_size=4)
    assert again["soft_tifa_gm"] == pytest.approx(summary["soft_tifa_gm"], abs=1e-4)


def test_the_vqascore_column_asks_the_judge_the_scorer_options_name():
    bench = GenEval2Benchmark()
    judge = {"model_name_or_path": "my/qwen3-vl"}
    official = {"procedure": "generate"}
    assert bench.scorer_spec(judge) == ("soft_tifa", {"aggregation": "gm", **official, **judge})
    assert bench.scorer_spec(None, "vqascore", judge) == ("vqascore", {**official, **judge})
    # The column's own options still override it; without a judge option the default judge stays.
    assert bench.scorer_spec({"model_name_or_path": "other"}, "vqascore", judge) == (
        "vqascore", {**official, "model_name_or_path": "other"})
    assert bench.scorer_spec(None, "vqascore", {"aggregation": "am"}) == ("vqascore", official)


def test_the_benchmark_asks_as_geneval2_does_unless_told_to_take_the_one_pass():
    """GenEval 2's numbers come from its `generate` per question: the benchmark's scorers run that procedure by
    default, and one `procedure` option moves Soft-TIFA and the VQAScore column together to the faster pass."""
    bench = GenEval2Benchmark()
    assert bench.scorer_spec()[1]["procedure"] == bench.scorer_spec(None, "vqascore")[1]["procedure"] == "generate"
    fast = {"procedure": "one_pass"}
    assert bench.scorer_spec(fast)[1]["procedure"] == bench.scorer_spec(None, "vqascore", fast)[1]["procedure"] \
        == "one_pass"
    assert bench.scorer_spec({"procedure": "generate"}, "vqascore", fast) == ("vqascore", {"procedure": "generate"})


def test_the_judges_declare_geneval2s_bfloat16():
    import torch

    from rewards.soft_tifa import SoftTIFAReward, TIFAReward, VQAScoreReward

    assert SoftTIFAReward.official_dtype == TIFAReward.official_dtype == VQAScoreReward.official_dtype == torch.bfloat16


def test_official_files_of_an_earlier_images_per_prompt_are_not_left_beside_the_new(tmp_path, data_file):
    def rows(k: int) -> list[dict]:
        return [{"prompt_index": p, "image_index": i, "prompt": row["prompt"], "path": f"part-00000/{p:05d}_{i:03d}.png",
                 "details": {"atom_scores": [0.1 * (i + 1)]}} for p, row in enumerate(ROWS) for i in range(k)]

    def official() -> list[str]:
        return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("score_lists", "image_paths")))

    summary = {"per_atomicity_gm": {}, "per_skill_am": {}}
    (tmp_path / "image_paths_notes.json").write_text("{}")  # not a name write_official gives: kept
    GenEval2Benchmark(data_path=str(data_file), images_per_prompt=2).write_official(rows(2), summary, tmp_path)
    assert official() == ["image_paths_image0.json", "image_paths_image1.json", "image_paths_notes.json",
                          "score_lists_image0.json", "score_lists_image1.json"]
    GenEval2Benchmark(data_path=str(data_file), images_per_prompt=1).write_official(rows(1), summary, tmp_path)
    assert official() == ["image_paths.json", "image_paths_notes.json", "score_lists.json"]
    assert json.loads((tmp_path / "score_lists.json").read_text()) == [[0.1]] * len(ROWS)


def test_benchmark_options_set_a_benchmarks_fields_and_refuse_what_it_has_not(data_file, tiny_vlm, tmp_path):
    from evaluators import build_benchmark_with_options
    from gors.cli import parse_config
    from gors.config import EvaluateConfig
    from gors.evaluate import plan_benchmarks

    fields = {"data_path": str(data_file), "vlm_model_name_or_path": str(tiny_vlm)}
    argv = ["--benchmarks", "geneval2", "--output_dir", str(tmp_path / "eval"), "--benchmark_options",
            json.dumps({"geneval2": fields})]
    [plan] = plan_benchmarks(parse_config(EvaluateConfig, argv))
    assert plan.benchmark.data_path == str(data_file)
    assert plan.benchmark.scorer_spec()[1]["model_name_or_path"] == str(tiny_vlm)  # the judge the field names
    assert [p.text for p in plan.benchmark.prompts()] == [row["prompt"] for row in ROWS]
    for options, message in [
        ({"geneval2": {"data_pth": "x"}},
         r"^--benchmark_options: geneval2 has no field 'data_pth'; its fields: vlm_model_name_or_path, data_path$"),
        ({"geneval2": {"max_prompts": 3}}, "the protocol's fields are set by flags of their own"),
        ({"geneval2": {"data_path": 3}}, r"^--benchmark_options: geneval2: data_path=3: expected str or None$"),
        ({"geneval2": fields, "geneval": {"data_path": "x"}},
         r"--benchmark_options for \['geneval'\], which are not among the benchmarks"),
    ]:
        with pytest.raises(ValueError, match=message):
            plan_benchmarks(EvaluateConfig(benchmarks="geneval2", output_dir=str(tmp_path / "eval"),
                                           benchmark_options=options))
    assert not (tmp_path / "eval").exists()
    # A subset is named after the colon; the label's fields win over the name's.
    with pytest.raises(ValueError, match="its category is named after a colon: --benchmarks t2i_compbench:shape"):
        build_benchmark_with_options("t2i_compbench", None, {"t2i_compbench": {"category": "shape"}}, "--benchmark_options")
    with pytest.raises(ValueError, match="if geneval is a module of yours holding the class MyBench, rename the module"):
        build_benchmark_with_options("geneval", "MyBench", {}, "--benchmark_options")
    # The benchmark's own errors are its own, whether options are given or not.
    with pytest.raises(ValueError, match=r"^toy split 'held_ou'"):
        build_benchmark_with_options("toy", "held_ou", {}, "--benchmark_options")
    with pytest.raises(ValueError, match=r"^--benchmark_options: lpg_bench: metric must be"):
        build_benchmark_with_options("lpg_bench", None, {"lpg_bench": {"metric": "tit"}}, "--benchmark_options")
    # A plugin's fields, however typed (Optional, unions, Literal); a mapping is no option.
    from dataclasses import dataclass, field

    from evaluators import option_fields
    from evaluators.base import Benchmark

    @dataclass
    class Plugin(Benchmark):
        data_path: str | None = None
        mode: Literal["a", "b"] = "a"
        extra: Optional[int] = None  # noqa: UP045 (a plugin may spell it so)
        table: dict[str, int] = field(default_factory=dict)

    assert option_fields(Plugin) == ["data_path", "mode", "extra"]
    both = {"geneval2": {"data_path": "a.jsonl"}, "geneval2:x": {}}
    assert build_benchmark_with_options("geneval2", None, both, "--flag").data_path == "a.jsonl"


def test_the_validation_benchmark_takes_its_fields_and_records_them(make_run_config, data_file, tiny_vlm):
    from gors.validation import BenchmarkValidation

    with pytest.raises(ValueError, match="--validation_benchmark_options without --validation_benchmark"):
        make_run_config(validation_benchmark_options={"data_path": str(data_file)})
    fields = {"data_path": str(data_file), "vlm_model_name_or_path": str(tiny_vlm)}
    config = make_run_config(validation_benchmark="geneval2", validation_num_prompts=2,
                             validation_benchmark_options=json.dumps(fields))
    validation = BenchmarkValidation(config, accelerator=None)  # type: ignore[arg-type]
    assert validation.benchmark.data_path == str(data_file)
    assert validation.settings["benchmark_options"] == fields
    assert validation.settings["procedure"] == "generate"  # a best.json of the one pass (none recorded) is no like
    with pytest.raises(ValueError, match="^--validation_benchmark_options: geneval2 has no field 'path'"):
        BenchmarkValidation(make_run_config(validation_benchmark="geneval2", validation_benchmark_options={"path": "x"}),
                            accelerator=None)  # type: ignore[arg-type]
