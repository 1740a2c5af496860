"""The T2I-CompBench benchmark: prompts, protocol, official image folders, summary table, and
end-to-end runs of three categories on a tiny SD and tiny scorer models (offline)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gors.core.logs
from evaluators import build_benchmark, get_benchmark
from evaluators.base import image_index_seed
from evaluators.t2i_compbench import CATEGORIES, T2ICompBenchBenchmark
from gors.core.paper import ALL_CATEGORIES
from gors.core.prompts import T2I_COMPBENCH_COMMIT
from rewards.noun_phrases import OFFICIAL_PARSER, parser_record
from rewards.question_differences import builtin_differences

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"
pytestmark = pytest.mark.skipif(not (SHARED / "t2i_compbench").is_dir(), reason="needs ../shared/benchmarks")


@pytest.fixture(autouse=True)
def data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))


# --------------------------------------------------------------------------------------------
# Prompts, protocol and scorers.


def test_every_category_has_300_val_prompts_and_its_metric() -> None:
    assert set(CATEGORIES) == set(ALL_CATEGORIES)
    scorers = {}
    for category in ALL_CATEGORIES:
        bench = get_benchmark("t2i_compbench", category=category)
        assert len(bench.prompts()) == 300, category
        scorers[category] = bench.scorer
        assert set(bench.columns()) == {"B-CLIP", "CLIPScore"}
        assert bench.columns()["B-CLIP"][0] == "blip_clip" and bench.columns()["CLIPScore"][0] == "clip_score"
    assert scorers == {
        "color": "b_vqa", "shape": "b_vqa", "texture": "b_vqa", "spatial": "spatial_rule",
        "non_spatial": "clip_score", "complex": "three_in_one", "3d_spatial": "spatial_3d", "numeracy": "numeracy",
    }
    assert get_benchmark("t2i_compbench", category="color").prompts()[0].text == "a green bench and a blue bowl"


def test_official_protocol() -> None:
    protocol = T2ICompBenchBenchmark(category="spatial").protocol()
    assert (protocol.images_per_prompt, protocol.num_inference_steps, protocol.guidance_scale) == (10, 30, 7.5)
    assert protocol.resolution == 512
    # Image i of every prompt: seed 42 + i.
    assert [protocol.seed_fn(protocol.seed, p, i) for p, i in [(0, 0), (7, 0), (7, 9), (299, 3)]] == [42, 42, 51, 45]
    assert image_index_seed(42, 5, 2) == 44
    assert T2ICompBenchBenchmark(images_per_prompt=2).protocol().images_per_prompt == 2


def test_complex_prompts_carry_their_official_3_in_1_kind() -> None:
    bench = T2ICompBenchBenchmark(category="complex")
    kinds = [p.metadata["three_in_one"] for p in bench.prompts()]
    spatial = (SHARED / "t2i_compbench" / "complex_val_spatial.txt").read_text().split("\n")
    action = (SHARED / "t2i_compbench" / "complex_val_action.txt").read_text().split("\n")
    assert kinds.count("spatial") == len([p for p in spatial if p.strip()])
    assert kinds.count("action") == len([p for p in action if p.strip()])
    assert kinds.count("all") == 300 - kinds.count("spatial") - kinds.count("action") > 0
    assert bench.scorer_options() == {"subsplits": "none"}  # the metadata decides
    assert T2ICompBenchBenchmark(category="color").prompts()[0].metadata == {}


def test_max_prompts_subset_and_bad_arguments() -> None:
    bench = build_benchmark("t2i_compbench", "numeracy", max_prompts=3, images_per_prompt=None)
    assert bench.category == "numeracy" and [line for line, _ in bench.selection()] == [0, 100, 200]
    assert len(bench.prompts()) == 3
    with pytest.raises(ValueError, match="category='colour'"):
        T2ICompBenchBenchmark(category="colour")
    with pytest.raises(ValueError, match="images_per_prompt"):
        T2ICompBenchBenchmark(images_per_prompt=0)
    with pytest.raises(ValueError, match="column_options"):
        T2ICompBenchBenchmark(column_options={"BLIP": {}})


# --------------------------------------------------------------------------------------------
# Official image folders.


def write_png(path: Path, value: int = 0, size: int = 8) -> None:
    Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8)).save(path)


def official_folder(root: Path, bench: T2ICompBenchBenchmark) -> Path:
    """<root>/samples/<prompt>_<index:06d>.png for every image of the benchmark's prompts."""
    samples = root / "samples"
    samples.mkdir(parents=True)
    for line, prompt in bench.selection():
        for image in range(bench.num_images):
            write_png(samples / f"{prompt}_{line * bench.num_images + image:06d}.png", value=image)
    return root


def test_read_images_official_layout(tmp_path: Path) -> None:
    bench = T2ICompBenchBenchmark(category="spatial", max_prompts=2, images_per_prompt=2)
    folder = official_folder(tmp_path / "run", bench)
    # An image of a prompt that max_prompts leaves out is skipped, as are hidden files.
    other = bench.val_prompts()[1]
    write_png(folder / "samples" / f"{other}_{1 * 2 + 0:06d}.png")
    (folder / "samples" / ".DS_Store").write_text("")
    entries = bench.read_images(folder)
    assert sorted((e.prompt_index, e.image_index) for e in entries) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    line = bench.selection()[1][0]
    assert {e.path.name for e in entries if e.prompt_index == 1} == {
        f"{bench.selection()[1][1]}_{line * 2:06d}.png", f"{bench.selection()[1][1]}_{line * 2 + 1:06d}.png"
    }
    assert len(bench.read_images(folder / "samples")) == 4  # the samples folder itself also works


def test_read_images_errors(tmp_path: Path) -> None:
    bench = T2ICompBenchBenchmark(category="spatial", max_prompts=2, images_per_prompt=2)

    def fresh(name: str) -> Path:
        return official_folder(tmp_path / name, bench) / "samples"

    missing = fresh("missing")
    (line, prompt), image = bench.selection()[1], 1  # max_prompts=2 takes a later line of the val file
    (missing / f"{prompt}_{line * 2 + image:06d}.png").unlink()
    with pytest.raises(ValueError, match=rf"1 missing \(first: prompt 1, image 1, \S*missing/samples/{prompt}_"
                                         rf"{line * 2 + 1:06d}.png\)"):
        bench.read_images(missing.parent)
    past = fresh("past")
    write_png(past / f"a dog_{300 * 2:06d}.png")
    with pytest.raises(ValueError, match="past the 300 prompts"):
        bench.read_images(past.parent)
    stray = fresh("stray")
    (stray / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a T2I-CompBench image name"):
        bench.read_images(stray.parent)
    renamed = fresh("renamed")
    write_png(renamed / f"a cat on the moon_{1:06d}.png")  # index 1 belongs to prompt 0
    with pytest.raises(ValueError, match="image 1 of prompt 0"):
        bench.read_images(renamed.parent)
    corrupt = fresh("corrupt")
    target = max(corrupt.iterdir())
    target.write_bytes(target.read_bytes()[:30])
    with pytest.raises(ValueError, match="not a readable PNG"):
        bench.read_images(corrupt.parent)
    # Per-prompt numbering (index restarting at 0 for every prompt) is not the official layout.
    wrong = tmp_path / "per_prompt" / "samples"
    wrong.mkdir(parents=True)
    for _, prompt in bench.selection():
        for image in range(2):
            write_png(wrong / f"{prompt}_{image:06d}.png")
    with pytest.raises(ValueError, match="is images_per_prompt=2 right"):
        bench.read_images(wrong.parent)


# --------------------------------------------------------------------------------------------
# Summary and official output on hand-made rows.


def rows_of(scores: list[float], columns: dict[str, list[float]] | None = None) -> list[dict]:
    rows = []
    for k, score in enumerate(scores):
        row = {"prompt_index": k // 2, "image_index": k % 2, "prompt": f"p{k // 2}", "score": score, "details": {}}
        if columns:
            row["columns"] = {name: values[k] for name, values in columns.items()}
        rows.append(row)
    return rows


def test_summary_and_its_table_row_on_hand_made_rows() -> None:
    color = T2ICompBenchBenchmark(category="color", images_per_prompt=2)
    summary = color.summarize(rows_of([0.2, 0.4, 0.6, 0.8], {"B-CLIP": [0.7, 0.7, 0.8, 0.8], "CLIPScore": [0.3] * 4}))
    assert summary["score"] == pytest.approx(0.5) and summary["metric"] == "B-VQA"
    assert (summary["num_images"], summary["num_prompts"]) == (4, 2)
    assert summary["table"] == [
        {"category": "Color", "metric": "B-VQA", "score": pytest.approx(0.5), "B-CLIP": pytest.approx(0.75),
         "CLIPScore": pytest.approx(0.3)}
    ]
    numeracy = T2ICompBenchBenchmark(category="numeracy").summarize(rows_of([1.0, 0.5]))
    assert numeracy["table"][0]["B-CLIP"] is None  # columns not computed
    assert numeracy["table"][0] | {"score": 0.75} == {"category": "Numeracy", "metric": "UniDet", "score": 0.75,
                                                      "B-CLIP": None, "CLIPScore": None}
    with pytest.raises(ValueError, match="no scored images"):
        color.summarize([])


def test_a_column_computed_for_only_some_images_has_no_mean() -> None:
    # A mean over a subset of the images would not be the category's number: None, shown as "-".
    rows = rows_of([0.2, 0.4, 0.6, 0.8], {"CLIPScore": [0.3] * 4})
    rows[0]["columns"]["B-CLIP"] = 0.9
    rows[1]["columns"]["MLLM-CoT"] = 0.5
    table_row = T2ICompBenchBenchmark(category="color", images_per_prompt=2).summarize(rows)["table"][0]
    assert table_row["B-CLIP"] is None and table_row["CLIPScore"] == pytest.approx(0.3)
    assert "MLLM-CoT" not in table_row  # an optional column only where every image has it


def test_unofficial_questions_warn_once_and_name_the_known_differences(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gors.core.logs, "_said", set())  # each warning said anew  # as in a fresh process
    color = T2ICompBenchBenchmark(category="color", images_per_prompt=2)
    builtin = {"source": "parser", "parser": parser_record("builtin")}
    rows = [{**row, "details": {"question_source": builtin}} for row in rows_of([0.2, 0.4, 0.6, 0.8])]
    with caplog.at_level("WARNING"):
        first = color.provenance(rows)
        assert color.provenance(rows) == first == {"questions": [{**builtin, "images": 4}]}
    warnings = [r.getMessage() for r in caplog.records if "not all the official parser's" in r.getMessage()]
    assert len(warnings) == 1  # once per process and category, however often the summary is made
    assert f"known to ask differently on {builtin_differences('color')} of this category's val prompts" in warnings[0]
    assert "gors questions color_val" in warnings[0]
    assert T2ICompBenchBenchmark(category="spatial").provenance(rows) == {}


def test_complex_records_and_warns_of_the_parser_behind_3_in_1s_spatial_and_clip_terms(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question table makes B-VQA's questions official; 3-in-1's spatial object names and the adjectives its
    CLIP term removes still come from the parser on the machine, which the summary records and names."""
    monkeypatch.setattr(gors.core.logs, "_said", set())  # each warning said anew
    complex_ = T2ICompBenchBenchmark(category="complex", images_per_prompt=2)
    table = {"source": "table", "table_sha256": "ab" * 32, "parser": dict(OFFICIAL_PARSER)}
    builtin = parser_record("builtin")
    details = {"attribute": {"details": {"question_source": table}}, "spatial": {"details": {"parser": builtin}},
               "action": {"details": {"parser": builtin}}}
    rows = [{**row, "details": details} for row in rows_of([0.2, 0.4, 0.6])]
    with caplog.at_level("WARNING"):
        provenance = complex_.provenance(rows)
    assert provenance["term_parsers"] == [{"term": "action", "parser": builtin, "images": 3},
                                          {"term": "spatial", "parser": builtin, "images": 3}]
    warnings = [r.getMessage() for r in caplog.records if "3-in-1 parsed prompts" in r.getMessage()]
    assert len(warnings) == 1 and "the spatial object names of 3 images by the built-in chunker" in warnings[0]
    assert not [r for r in caplog.records if "not all the official parser's" in r.getMessage()]  # the table's
    official = {**details, "spatial": {"details": {"parser": dict(OFFICIAL_PARSER)}},
                "action": {"details": {"parser": dict(OFFICIAL_PARSER)}}}
    caplog.clear()
    with caplog.at_level("WARNING"):
        complex_.provenance([{**row, "details": official} for row in rows])
    assert not [r for r in caplog.records if "3-in-1 parsed prompts" in r.getMessage()]


def test_write_official_vqa_result(tmp_path: Path) -> None:
    color = T2ICompBenchBenchmark(category="color", max_prompts=2, images_per_prompt=2)
    rows = rows_of([0.12345, 0.5, 0.25, 1.0])
    color.write_official(rows, {}, tmp_path)
    result = json.loads((tmp_path / "annotation_blip" / "vqa_result.json").read_text())
    # Lines 0 and 150 of the file, 2 images each; B-VQA answers are "0.1234" strings.
    assert result == [{"question_id": 0, "answer": "0.1235"}, {"question_id": 1, "answer": "0.5000"},
                      {"question_id": 300, "answer": "0.2500"}, {"question_id": 301, "answer": "1.0000"}]
    three_d = T2ICompBenchBenchmark(category="3d_spatial", max_prompts=2, images_per_prompt=2)
    three_d.write_official(rows, {}, tmp_path)
    result = json.loads((tmp_path / "labels" / "annotation_obj_detection_3d" / "vqa_result.json").read_text())
    assert result[2] == {"question_id": 300, "answer": 0.25}


def test_write_official_puts_each_metrics_file_where_the_official_scripts_do(tmp_path: Path) -> None:
    """Each category's vqa_result.json lands where T2I-CompBench's own script writes it (and where 3_in_1.py
    reads the complex category's terms from): BLIPvqa_eval/BLIP_vqa.py annotation_blip/, UniDet_eval's
    2D_spatial_eval.py labels/annotation_obj_detection_2d/, 3D_spatial_eval.py labels/annotation_obj_detection_3d/,
    numeracy_eval.py annotation_num/, CLIPScore_eval/CLIP_similarity.py annotation_clip/, 3_in_1.py
    annotation_3_in_1/."""
    expected = {
        "color": "annotation_blip", "shape": "annotation_blip", "texture": "annotation_blip",
        "spatial": "labels/annotation_obj_detection_2d", "3d_spatial": "labels/annotation_obj_detection_3d",
        "numeracy": "annotation_num", "non_spatial": "annotation_clip", "complex": "annotation_3_in_1",
    }
    assert set(expected) == set(ALL_CATEGORIES)
    rows = rows_of([0.5, 0.25])
    for category, folder in expected.items():
        out = tmp_path / category
        T2ICompBenchBenchmark(category=category, max_prompts=1, images_per_prompt=2).write_official(rows, {}, out)
        written = [path.relative_to(out).as_posix() for path in out.rglob("*") if path.is_file()]
        assert written == [f"{folder}/vqa_result.json"], category
        answers = [r["answer"] for r in json.loads((out / folder / "vqa_result.json").read_text())]
        assert answers == (["0.5000", "0.2500"] if folder == "annotation_blip" else [0.5, 0.25]), category


def test_data_version_of_complex_names_the_val_sub_split_lists_that_decide_3_in_1() -> None:
    """complex's 3-in-1 kind per prompt comes from complex_val_spatial.txt and complex_val_action.txt: the
    summary's data record pins them beside complex_val.txt (other categories pin their val file only)."""
    from gors.core.prompts import T2I_COMPBENCH

    files = T2ICompBenchBenchmark(category="complex").data_version()["files"]
    names = ["complex_val.txt", "complex_val_spatial.txt", "complex_val_action.txt"]
    assert files == {name: T2I_COMPBENCH.sha256[name] for name in names}
    assert T2ICompBenchBenchmark(category="color").data_version()["files"] == {
        "color_val.txt": T2I_COMPBENCH.sha256["color_val.txt"]}


# --------------------------------------------------------------------------------------------
# End to end on tiny models.


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from gors.testing.blip import build_tiny_blip_captioner, build_tiny_blip_vqa
    from gors.testing.clip import build_tiny_clip
    from gors.testing.detection import build_tiny_owlv2
    from gors.testing.dpt import build_tiny_dpt

    root = tmp_path_factory.mktemp("t2i_compbench_models")
    return {
        "blip_vqa": str(build_tiny_blip_vqa(root / "blip_vqa", seed=0)),
        "blip_caption": str(build_tiny_blip_captioner(root / "blip_caption", seed=0)),
        "clip": str(build_tiny_clip(root / "clip", seed=0)),
        "owlv2": str(build_tiny_owlv2(root / "owl", seed=0)),
        "dpt": str(build_tiny_dpt(root / "dpt", seed=0)),
    }


def scorer_options(category: str, models: dict[str, str]) -> dict:
    if category == "color":
        return {"model_name_or_path": models["blip_vqa"], "noun_phrase_backend": "builtin"}
    if category == "numeracy":
        return {"model_name_or_path": models["owlv2"], "threshold": 0.0}
    return {"model_name_or_path": models["owlv2"], "depth_model_name_or_path": models["dpt"], "threshold": 0.0,
            "noun_phrase_backend": "builtin"}


@pytest.mark.parametrize("category", ["color", "numeracy", "3d_spatial"])
def test_end_to_end_generate_score_and_read_back(
    category: str, tmp_path: Path, tiny_sd: Path, tiny_models: dict[str, str], one_torch_thread
) -> None:
    columns = {"B-CLIP": {"model_name_or_path": tiny_models["blip_caption"],
                          "clip_model_name_or_path": tiny_models["clip"], "max_length": 12},
               "CLIPScore": {"model_name_or_path": tiny_models["clip"]}}
    bench = T2ICompBenchBenchmark(category=category, max_prompts=2, images_per_prompt=2, num_inference_steps=2,
                                  resolution=32, batch_size=4, column_options=columns)
    options = scorer_options(category, tiny_models)
    out = tmp_path / "run"
    summary = bench.evaluate(str(tiny_sd), out, scorer_options=options, scorer_batch_size=4)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and summary["num_images"] == 4 and summary["num_prompts"] == 2
    assert summary["score"] == pytest.approx(np.mean([row["score"] for row in rows]))
    assert all(0.0 <= row["score"] <= 1.0 for row in rows)
    table_row = summary["table"][0]
    assert table_row["category"] == CATEGORIES[category].label and table_row["score"] == summary["score"]
    for column in ("B-CLIP", "CLIPScore"):
        assert 0.0 <= table_row[column] <= 1.0
        assert summary["columns"][column] == pytest.approx(table_row[column])
    results = summary["results"]
    assert results["data"]["commit"] == T2I_COMPBENCH_COMMIT and f"{category}_val.txt" in results["data"]["files"]
    assert list(results["metrics"]) == ["score", "columns.B-CLIP", "columns.CLIPScore"]
    assert results["metrics"]["columns.B-CLIP"]["value"] == summary["columns"]["B-CLIP"]
    assert results["samples"] == {"prompts": 2, "images": 4, "images_per_prompt": 2}
    if category != "color":
        assert all(row["reason"] for row in rows)  # the detector rules explain each score
    # Which parser made B-VQA's questions, once in summary.json (the built-in one: spaCy's model is not here).
    written = json.loads((out / "summary.json").read_text())
    if category == "color":
        builtin = {"source": "parser", "parser": parser_record("builtin")}
        assert written["questions"] == summary["questions"] == [{**builtin, "images": 4}]
        assert all(row["details"]["question_source"] == builtin for row in rows)
    else:
        assert "questions" not in written
    # The official seeds: image i of each prompt with 42 + i.
    metadata = [json.loads(line) for p in (out / "samples").rglob("metadata*.jsonl") for line in p.read_text().splitlines()]
    assert sorted((m["image_index"], m["seed"]) for m in metadata) == [(0, 42), (0, 42), (1, 43), (1, 43)]
    official = json.loads((out / CATEGORIES[category].official_file).read_text())
    lines = [line for line, _ in bench.selection()]
    assert [r["question_id"] for r in official] == [lines[0] * 2, lines[0] * 2 + 1, lines[1] * 2, lines[1] * 2 + 1]

    # The same images in the official layout, read with images=: the same scores.
    folder = tmp_path / "official" / "samples"
    folder.mkdir(parents=True)
    for row in rows:
        index = lines[row["prompt_index"]] * 2 + row["image_index"]
        shutil.copy(out / "samples" / row["path"], folder / f"{row['prompt']}_{index:06d}.png")
    again = bench.evaluate(None, tmp_path / "read_back", scorer_options=options, images=folder.parent,
                           scorer_batch_size=4, with_columns=False)
    assert again["score"] == pytest.approx(summary["score"], abs=1e-5)
    assert again["table"][0]["B-CLIP"] is None
    # Made elsewhere: the results claim no sampling settings for them.
    assert again["results"]["config"]["images"] == "external"
    assert again["results"]["config"]["guidance_scale"] is None  # not given: not the protocol's 7.5
    assert summary["results"]["config"]["guidance_scale"] == 7.5 and "images" not in summary["results"]["config"]
    # What scored and the precision that generated, for `gors report` to compare; no precision for images made
    # elsewhere.
    assert summary["results"]["config"]["dtype"] == "float32" and "dtype" not in again["results"]["config"]
    recorded = json.loads((out / "scores" / "settings.json").read_text())
    assert summary["results"]["scorer"] == again["results"]["scorer"] == json.loads(json.dumps(recorded))
    assert summary["results"]["scorer"]["reward"] == CATEGORIES[category].scorer

    if category == "color":
        # Other images under the same names, evaluated into the same folder: scored anew, not given the old scores.
        changed = min(folder.iterdir())
        Image.new("RGB", (32, 32), (255, 255, 255)).save(changed)
        rescored = bench.evaluate(None, tmp_path / "read_back", scorer_options=options, images=folder.parent,
                                  scorer_batch_size=4, with_columns=False)
        fresh = bench.evaluate(None, tmp_path / "fresh", scorer_options=options, images=folder.parent,
                               scorer_batch_size=4, with_columns=False)
        assert rescored["score"] == pytest.approx(fresh["score"], abs=1e-6)
        assert rescored["score"] != pytest.approx(again["score"], abs=1e-6)

    # A corrupt PNG in the folder is refused before any scoring.
    target = min(folder.iterdir())
    target.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="not a readable PNG"):
        bench.evaluate(None, tmp_path / "corrupt", scorer_options=options, images=folder.parent)


# --------------------------------------------------------------------------------------------
# The optional MLLM-CoT column.


def test_mllm_cot_is_an_optional_column_of_every_category_with_its_questions() -> None:
    from evaluators.t2i_compbench import OPTIONAL_COLUMNS

    assert OPTIONAL_COLUMNS == {"MLLM-CoT": "mllm_cot"}
    for category in ALL_CATEGORIES:
        bench = T2ICompBenchBenchmark(category=category, column_options={"MLLM-CoT": {"max_new_tokens": 64}})
        assert bench.optional_columns() == {"MLLM-CoT": ("mllm_cot", {"category": category, "max_new_tokens": 64})}
        assert "MLLM-CoT" not in bench.columns()  # off by default
        assert bench.computed_columns() == ["B-CLIP", "CLIPScore"]
        assert bench.computed_columns(["MLLM-CoT"]) == ["B-CLIP", "CLIPScore", "MLLM-CoT"]
        assert bench.scorer_spec({"model_name_or_path": "x"}, "MLLM-CoT") == (
            "mllm_cot", {"category": category, "max_new_tokens": 64, "model_name_or_path": "x"})
    with pytest.raises(ValueError, match=r"extra columns \['MLLM'\].*MLLM-CoT"):
        T2ICompBenchBenchmark().computed_columns(["MLLM"])


def test_summary_shows_mllm_cot_only_where_computed() -> None:
    color = T2ICompBenchBenchmark(category="color", images_per_prompt=2)
    rows = rows_of([0.2, 0.4, 0.6, 0.8], {"B-CLIP": [0.5] * 4, "CLIPScore": [0.3] * 4, "MLLM-CoT": [0.1, 0.2, 0.3, 0.4]})
    summary = color.aggregate(rows)
    assert summary["table"][0]["MLLM-CoT"] == pytest.approx(0.25)
    assert summary["columns"]["MLLM-CoT"] == pytest.approx(0.25)
    plain = T2ICompBenchBenchmark(category="numeracy").summarize(rows_of([1.0, 0.5]))
    assert "MLLM-CoT" not in plain["table"][0]


def test_mllm_cot_column_end_to_end_on_an_official_folder(
    tmp_path: Path, tiny_models: dict[str, str], one_torch_thread
) -> None:
    from gors.testing.qwen3_vl import build_tiny_qwen3_vl

    judge = str(build_tiny_qwen3_vl(tmp_path / "qwen3_vl", seed=0))
    columns = {"B-CLIP": {"model_name_or_path": tiny_models["blip_caption"],
                          "clip_model_name_or_path": tiny_models["clip"], "max_length": 12},
               "CLIPScore": {"model_name_or_path": tiny_models["clip"]},
               "MLLM-CoT": {"model_name_or_path": judge, "max_new_tokens": 6}}
    bench = T2ICompBenchBenchmark(category="non_spatial", max_prompts=2, images_per_prompt=2, column_options=columns)
    folder = official_folder(tmp_path / "images", bench)
    options = {"model_name_or_path": tiny_models["clip"]}
    summary = bench.evaluate(None, tmp_path / "run", scorer_options=options, images=folder, scorer_batch_size=4,
                             extra_columns=["MLLM-CoT"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert all(set(row["columns"]) == {"B-CLIP", "CLIPScore", "MLLM-CoT"} for row in rows)
    assert all(0.0 <= row["columns"]["MLLM-CoT"] <= 1.0 for row in rows)
    assert summary["table"][0]["MLLM-CoT"] == pytest.approx(np.mean([row["columns"]["MLLM-CoT"] for row in rows]))
    assert list(summary["results"]["metrics"]) == ["score", "columns.B-CLIP", "columns.CLIPScore", "columns.MLLM-CoT"]
    scored = [json.loads(line) for line in (tmp_path / "run" / "columns" / "MLLM-CoT" / "part-00000.jsonl")
              .read_text().splitlines()]
    assert len(scored) == 4 and all(row["details"]["category"] == "non_spatial" for row in scored)
    assert all(len(row["details"]["answers"]) == 1 and row["details"]["reason"] for row in scored)
    # Without extra_columns (the default) and in validation (with_columns=False) it is not computed.
    default = bench.evaluate(None, tmp_path / "default", scorer_options=options, images=folder, scorer_batch_size=4)
    assert "MLLM-CoT" not in default["columns"] and "MLLM-CoT" not in default["table"][0]
    validation = bench.evaluate(None, tmp_path / "validation", scorer_options=options, images=folder,
                                scorer_batch_size=4, with_columns=False, extra_columns=["MLLM-CoT"])
    assert "columns" not in validation and not (tmp_path / "validation" / "columns").exists()
