"""GenEval reward on a tiny random Mask2Former + tiny open_clip, and the GenEval benchmark end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from evaluators import get_benchmark
from evaluators.geneval import (
    GENEVAL,
    METADATA_FILE,
    RESULTS_FILE,
    SUMMARY_TEXT_FILE,
    GenEvalBenchmark,
    format_summary,
    geneval_summary,
    load_geneval_metadata,
    official_row,
)
from gors.core.hub import ModelLoadError
from gors.core.store import SampleStore, StoreError
from gors.testing.geneval import build_tiny_geneval_models
from gors.testing.mask2former import coco_instance_labels
from rewards import get_reward_class, load
from rewards.geneval import (
    COLOR_TEMPLATES,
    MMDET_TEST_SIZE,
    ClipColorClassifier,
    GenEvalReward,
    Mask2FormerDetector,
    geneval_label_names,
    instance_predictions,
    mask_boxes,
    mmdet_resize,
)
from rewards.geneval_rules import COLORS, GENEVAL_CLASSES, TAGS, GenEvalObject

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"
needs_shared = pytest.mark.skipif(not (SHARED / "geneval").is_dir(), reason="needs ../shared/benchmarks")
TINY_CLIP = "gors-tiny-geneval-clip"
GRAY = (153, 153, 153)  # "#999"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny Mask2Former folder, and a tiny open_clip architecture registered with a local checkpoint."""
    return build_tiny_geneval_models(tmp_path_factory.mktemp("geneval_models"), TINY_CLIP)


@pytest.fixture(scope="module")
def reward(models: dict[str, str]) -> GenEvalReward:
    # Thresholds 0: a random detector's confidences are tiny; every detection then counts.
    return GenEvalReward(device="cpu", batch_size=2, threshold=0.0, counting_threshold=0.0,
                         detector_image_size=None, **models)


def random_images(count: int, size: tuple[int, int] = (48, 40), seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)]


# ---- detector pieces ----

def test_coco_labels_map_to_geneval_names() -> None:
    labels = coco_instance_labels()
    assert labels[64] == "mouse" and labels[65] == "remote" and labels[66] == "keyboard"
    assert geneval_label_names(labels) == dict(enumerate(GENEVAL_CLASSES))
    panoptic = {**labels, 80: "wall-other-merged", 81: "sky"}  # stuff classes are no GenEval class
    assert geneval_label_names(panoptic) == dict(enumerate(GENEVAL_CLASSES))
    with pytest.raises(ValueError, match="lack 1 of GenEval's 80 COCO classes"):
        geneval_label_names({k: v for k, v in labels.items() if v != "toaster"})


def test_mask_boxes_match_the_extent_of_each_mask() -> None:
    masks = torch.rand(20, 9, 13, generator=torch.Generator().manual_seed(0)) > 0.97
    masks[0] = False
    masks[1] = True
    masks[2] = False
    masks[2, 8, 12] = True  # one pixel in the last corner
    expected = []
    for mask in masks:
        ys, xs = torch.where(mask)
        expected.append([0, 0, 0, 0] if len(xs) == 0 else [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    assert mask_boxes(masks).tolist() == torch.tensor(expected, dtype=torch.float).tolist()
    assert mask_boxes(masks)[:3].tolist() == [[0, 0, 0, 0], [0, 0, 13, 9], [12, 8, 13, 9]]


def test_instance_post_processing_on_hand_made_logits() -> None:
    class_logits = torch.tensor([[0.0, 4.0, 0.0, 1.0], [0.0, 0.0, 5.0, 0.0]])  # 2 queries, 3 classes + no-object
    mask_logits = torch.full((2, 8, 8), -5.0)
    mask_logits[0, 2:5, 1:5] = 5.0  # rows 2-4, columns 1-4; query 1 has an empty mask
    out = instance_predictions(class_logits, mask_logits, (8, 8), (8, 8), (8, 8), max_per_image=2)
    probabilities = class_logits.softmax(-1)
    assert out.labels.tolist() == [2, 1]
    assert out.boxes[1].tolist() == [1.0, 2.0, 5.0, 5.0]  # max exclusive, as mmdetection's mask2bbox
    assert out.scores[1].item() == pytest.approx(probabilities[0, 1].item() * torch.sigmoid(torch.tensor(5.0)).item())
    assert out.scores[0].item() == 0.0 and out.boxes[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    # Upsampled bilinearly to an image twice as large: the mask (and box) doubles.
    out = instance_predictions(class_logits, mask_logits, (8, 8), (8, 8), (16, 16), max_per_image=2)
    assert out.boxes[1].tolist() == [2.0, 4.0, 10.0, 10.0]
    # Padding (columns 6-7 of the input) is cut away before resizing to the image.
    mask_logits[0, :, 6:] = 5.0
    out = instance_predictions(class_logits, mask_logits, (8, 8), (8, 6), (8, 6), max_per_image=2)
    assert out.boxes[1].tolist() == [1.0, 2.0, 5.0, 5.0] and out.masks.shape[-2:] == (8, 6)


# ---- colour classifier ----

def test_crop_pastes_through_the_mask_on_gray_then_crops_the_box(models: dict[str, str]) -> None:
    classifier = ClipColorClassifier(models["clip_model"], models["clip_pretrained"])
    image = Image.new("RGB", (20, 10), (255, 0, 0))
    mask = np.zeros((10, 20), dtype=bool)
    mask[2:8, 4:8] = True
    (crop,) = classifier.crops(image, [GenEvalObject((4, 2, 12, 8), 0.9, mask)])
    pixels = np.asarray(crop)
    assert crop.size == (8, 6)
    assert (pixels[:, :4] == (255, 0, 0)).all() and (pixels[:, 4:] == GRAY).all()
    (unmasked,) = classifier.crops(image, [GenEvalObject((4, 2, 12, 8), 0.9)])
    assert (np.asarray(unmasked) == (255, 0, 0)).all()


def test_colour_classifier_weights_that_do_not_load_are_a_model_load_error(models: dict[str, str], tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="clip_pretrained='.*missing.pt'.*open_clip could not load it"):
        ClipColorClassifier(models["clip_model"], str(tmp_path / "missing.pt"))
    # Weights of another architecture: open_clip asserts on the shapes.
    wrong = tmp_path / "wrong.pt"
    torch.save({"positional_embedding": torch.zeros(3, 5)}, wrong)
    with pytest.raises(ModelLoadError, match="open_clip could not load it"):
        ClipColorClassifier(models["clip_model"], str(wrong))


def test_text_classifier_averages_the_three_official_templates(models: dict[str, str]) -> None:
    classifier = ClipColorClassifier(models["clip_model"], models["clip_pretrained"])
    weights = classifier.text_classifier("fire hydrant")
    assert weights.shape == (16, len(COLORS))
    assert torch.allclose(weights.norm(dim=0), torch.ones(len(COLORS)), atol=1e-5)
    texts = ["a photo of a blue fire hydrant", "a photo of a blue-colored fire hydrant", "a photo of a blue object"]
    assert [t.format(c="blue", obj="fire hydrant") for t in COLOR_TEMPLATES] == texts
    with torch.no_grad():
        embeddings = F.normalize(classifier.model.encode_text(classifier.tokenizer(texts)), dim=-1)
    assert torch.allclose(weights[:, COLORS.index("blue")], F.normalize(embeddings.mean(0), dim=0), atol=1e-5)
    image = random_images(1)[0]
    objects = [GenEvalObject((0, 0, 24, 20), 0.9), GenEvalObject((10, 10, 40, 36), 0.8)]
    colours = classifier(image, "fire hydrant", objects)
    assert len(colours) == 2 and set(colours) <= set(COLORS)
    assert classifier(image, "fire hydrant", objects) == colours


def test_colour_check_autocasts_to_float16_on_cuda_only(models: dict[str, str], monkeypatch) -> None:
    """As the official evaluate_images.py: float32 weights under CLIP_benchmark's default autocast."""
    import contextlib

    classifier = ClipColorClassifier(models["clip_model"], models["clip_pretrained"])
    asked = []
    monkeypatch.setattr(torch, "autocast", lambda device, dtype, enabled: asked.append((device, dtype, enabled)))
    classifier.precision()
    classifier.device = torch.device("cuda")  # the context only; nothing runs
    classifier.precision()
    assert asked == [("cpu", torch.float16, False), ("cuda", torch.float16, True)]
    monkeypatch.undo()
    # Both the text embeddings and the crops' image embeddings are made inside it.
    classifier.device = torch.device("cpu")
    entered = []
    monkeypatch.setattr(classifier, "precision", lambda: entered.append(1) or contextlib.nullcontext())
    classifier(random_images(1)[0], "fire hydrant", [GenEvalObject((0, 0, 24, 20), 0.9)])
    assert len(entered) == 2


# ---- the reward ----

def test_registry_and_attributes() -> None:
    assert get_reward_class("geneval") is GenEvalReward
    assert GenEvalReward.default_model == "facebook/mask2former-swin-small-coco-instance"


def test_reward_scores_are_binary_with_reasons_and_detections(reward: GenEvalReward) -> None:
    images = random_images(2)
    found = reward.detector.detect(images, threshold=0.0)[0]
    assert found, "the tiny detector finds something at threshold 0"
    present = max(found, key=lambda name: found[name][0].score)
    absent = next(name for name in GENEVAL_CLASSES if name not in found)
    colour = reward.classify_colors(images[0], present, found[present][:1])[0]
    other = next(c for c in COLORS if c != colour)
    metadata = [
        {"tag": "single_object", "include": [{"class": present, "count": 1}], "prompt": f"a photo of a {present}"},
        {"tag": "single_object", "include": [{"class": absent, "count": 1}], "prompt": f"a photo of a {absent}"},
        {"tag": "colors", "include": [{"class": present, "count": 1, "color": colour}], "prompt": "p"},
        {"tag": "colors", "include": [{"class": present, "count": 1, "color": other}], "prompt": "p"},
    ]
    out = reward.score([images[0]] * 4, [m["prompt"] for m in metadata], metadata)
    assert out.scores == [1.0, 0.0, 1.0, 0.0]
    assert out.details[1]["reason"] == f"expected {absent}>=1, found 0"
    assert out.details[3]["reason"].startswith(f"expected {other} {present}>=1, found 0 {other}; and 1 {colour}")
    detections = out.details[0]["detections"]
    assert detections[present][0]["score"] == pytest.approx(found[present][0].score)
    for boxes in detections.values():
        assert [d["score"] for d in boxes] == sorted((d["score"] for d in boxes), reverse=True) and len(boxes) <= 16
        for d in boxes:
            x0, y0, x1, y1 = d["box"]
            assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 40 and 0 < d["score"] <= 1
    json.dumps(out.details)
    # An image's verdict does not depend on the batch it is scored in (up to float rounding).
    alone = reward.score(images[:1], ["p"], metadata[:1]).details[0]
    assert (alone["correct"], alone["reason"], list(alone["detections"])) == (True, "", list(detections))
    for name, boxes in detections.items():
        assert [d["score"] for d in alone["detections"][name]] == pytest.approx([d["score"] for d in boxes], rel=1e-4)


def test_default_thresholds_reject_a_random_detector(models: dict[str, str]) -> None:
    strict = load("geneval", device="cpu", detector_image_size=None, **models)
    meta = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
    out = strict.score(random_images(1), ["a photo of a dog"], [meta])
    assert out.scores == [0.0] and out.details[0]["detections"] == {} and out.details[0]["threshold"] == 0.3


def test_reward_without_clauses_is_a_clear_error(reward: GenEvalReward) -> None:
    with pytest.raises(ValueError, match="needs each prompt's GenEval clauses"):
        reward.score(random_images(1), ["a photo of a dog"])
    with pytest.raises(ValueError, match=r"prompt 0 \('a photo of a dog'\).*lacks include"):
        reward.score(random_images(1), ["a photo of a dog"], [{"tag": "single_object"}])


# ---- the benchmark ----

@pytest.fixture
def data_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    if not (SHARED / "geneval" / "evaluation_metadata.jsonl").is_file():
        pytest.skip("needs ../shared/benchmarks")
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))
    return SHARED / "geneval"


def test_prompts_protocol_and_object_names(data_dir: Path) -> None:
    assert tuple((data_dir / "object_names.txt").read_text().split("\n")[:80]) == GENEVAL_CLASSES
    benchmark = get_benchmark("geneval")
    assert isinstance(benchmark, GenEvalBenchmark)
    prompts = benchmark.prompts()
    assert len(prompts) == 553
    assert prompts[0].text == "a photo of a bench" and prompts[0].metadata["include"] == [{"class": "bench", "count": 1}]
    counts = {tag: sum(p.metadata["tag"] == tag for p in prompts) for tag in TAGS}
    assert counts == {"single_object": 80, "two_object": 99, "counting": 80, "colors": 94, "position": 100,
                      "color_attr": 100}
    protocol = benchmark.protocol()
    assert (protocol.images_per_prompt, protocol.num_inference_steps, protocol.guidance_scale) == (4, 50, 9.0)
    assert [protocol.seed_fn(protocol.seed, p, i) for p in (0, 7) for i in range(4)] == [42, 43, 44, 45] * 2
    quick = GenEvalBenchmark(max_prompts=6)
    spread = [0, 92, 184, 276, 368, 460]  # 553 x i // 6
    assert [p.text for p in quick.prompts()] == [prompts[i].text for i in spread]
    assert [n for n, _ in quick.selected()] == spread


def test_summary_on_hand_made_rows() -> None:
    rows = [
        # single_object: 3 of 4 correct; two_object: 0 of 2; counting: 1 of 2.
        {"prompt_index": 0, "tag": "single_object", "correct": True},
        {"prompt_index": 0, "tag": "single_object", "correct": False},
        {"prompt_index": 1, "tag": "single_object", "correct": True},
        {"prompt_index": 1, "tag": "single_object", "correct": True},
        {"prompt_index": 2, "tag": "two_object", "correct": False},
        {"prompt_index": 2, "tag": "two_object", "correct": False},
        {"prompt_index": 3, "tag": "counting", "correct": False},
        {"prompt_index": 3, "tag": "counting", "correct": True},
    ]
    summary = geneval_summary(rows)
    assert summary["tasks"] == {"single_object": 0.75, "two_object": 0.0, "counting": 0.5}
    assert summary["task_counts"] == {"single_object": [3, 4], "two_object": [0, 2], "counting": [1, 2]}
    assert summary["overall"] == pytest.approx((0.75 + 0.0 + 0.5) / 3)
    assert summary["correct_images"] == pytest.approx(4 / 8)  # not the overall: tasks weigh equally
    assert summary["correct_prompts"] == pytest.approx(3 / 4)
    assert (summary["num_images"], summary["num_prompts"]) == (8, 4)
    # Printed as summary_scores.py prints it (the overall to 5 decimals).
    assert format_summary(summary) == (
        "Summary\n=======\nTotal images: 8\nTotal prompts: 4\n% correct images: 50.00%\n% correct prompts: 75.00%\n\n"
        "Task breakdown\n==============\nsingle_object    = 75.00% (3 / 4)\ntwo_object       = 0.00% (0 / 2)\n"
        "counting         = 50.00% (1 / 2)\n\nOverall score (avg. over tasks): 0.41667\n")


def test_summary_of_no_rows_is_refused() -> None:
    """No judged image: a clear error, not an overall of NaN (numpy's mean of nothing) written to summary.json."""
    with pytest.raises(ValueError, match="no result rows to summarise"):
        geneval_summary([])


def test_official_row_names_a_generated_image_under_samples() -> None:
    """A generated image's row path is relative to <output_dir>/samples: the official results file names its
    absolute path there (summary_scores.py and evaluate_images.py's readers open it); a path from --images stays."""
    row = {"path": "part-00000/00003_001.png", "tag": "counting", "prompt": "a photo of two dogs", "correct": False,
           "reason": "expected dog==2, found 1", "details": {"detections": {}}}
    out = Path("/runs/geneval")
    assert official_row(row, "{}", out)["filename"] == str((out / "samples" / row["path"]).resolve())
    assert official_row({**row, "path": "/images/00003/samples/0001.png"}, "{}", out)["filename"] == (
        "/images/00003/samples/0001.png")


def write_official_folder(root: Path, benchmark: GenEvalBenchmark, images: int) -> Path:
    """GenEval's layout for the benchmark's prompts: <root>/<00000>/metadata.jsonl + samples/<0000>.png."""
    rng = np.random.default_rng(1)
    for number, row in benchmark.selected():
        samples = root / f"{number:05d}" / "samples"
        samples.mkdir(parents=True)
        (samples.parent / "metadata.jsonl").write_text(json.dumps(row))
        for i in range(images):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(samples / f"{i:04d}.png")
    (root / "notes").mkdir()  # non-numbered folders are ignored, as by the official evaluator
    return root


def test_images_folder_in_the_official_layout(data_dir: Path, tmp_path: Path, models: dict[str, str]) -> None:
    benchmark = GenEvalBenchmark(max_prompts=3, images_per_prompt=2)
    folder = write_official_folder(tmp_path / "images", benchmark, images=2)
    summary = benchmark.evaluate(None, tmp_path / "out", images=folder,
                                 scorer_options={**models, "detector_image_size": None}, scorer_batch_size=4)
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and summary["num_images"] == 6 and summary["num_prompts"] == 3
    assert all(row["score"] in (0.0, 1.0) and row["correct"] == (row["score"] == 1.0) for row in rows)
    assert [row["tag"] for row in rows[::2]] == [m["tag"] for _, m in benchmark.selected()]
    assert all(row["reason"].startswith("expected ") for row in rows if not row["correct"])
    assert summary["overall"] == pytest.approx(np.mean(list(summary["tasks"].values())))
    results = summary["results"]
    assert results["data"]["commit"] == GENEVAL.commit and METADATA_FILE in results["data"]["files"]
    assert results["samples"] == {"prompts": 3, "images": 6, "images_per_prompt": 2}
    assert results["config"]["seed_rule"] == "image_index_seed"
    assert {f"tasks.{tag}" for tag in summary["tasks"]} | {"overall", "correct_images", "correct_prompts"} == set(
        results["metrics"])
    # The official results file: the fields and JSON strings of evaluate_images.py.
    official = [json.loads(line) for line in (tmp_path / "out" / RESULTS_FILE).read_text().splitlines()]
    assert list(official[0]) == ["filename", "tag", "prompt", "correct", "reason", "metadata", "details"]
    assert official[0]["filename"] == str(folder / "00000" / "samples" / "0000.png")
    assert json.loads(official[0]["metadata"]) == benchmark.selected()[0][1]
    assert isinstance(json.loads(official[0]["details"]), dict)
    assert "Overall score (avg. over tasks):" in (tmp_path / "out" / SUMMARY_TEXT_FILE).read_text()


def test_official_results_read_like_summary_scores(data_dir: Path, tmp_path: Path) -> None:
    """What the official summary_scores.py computes from our file equals our summary."""
    import pandas as pd

    benchmark = GenEvalBenchmark(max_prompts=4, images_per_prompt=2)
    rows = []
    for p, (_, meta) in enumerate(benchmark.selected()):
        for i in range(2):
            correct = (p + i) % 3 == 0
            rows.append({"prompt_index": p, "image_index": i, "prompt": meta["prompt"], "path": f"/x/{p}_{i}.png",
                         "score": float(correct), "correct": correct, "reason": "" if correct else "expected",
                         "tag": meta["tag"], "details": {"detections": {"dog": [{"box": [1, 2, 3, 4], "score": 0.5}]}}})
    summary = geneval_summary(rows)
    benchmark.write_official(rows, summary, tmp_path)
    df = pd.read_json(tmp_path / RESULTS_FILE, orient="records", lines=True)
    assert df.groupby("metadata")["correct"].any().mean() == pytest.approx(summary["correct_prompts"])
    assert np.mean([g["correct"].mean() for _, g in df.groupby("tag", sort=False)]) == pytest.approx(summary["overall"])
    assert json.loads(df["details"][0]) == {"dog": [[1, 2, 3, 4, 0.5]]}


def test_images_folder_errors(data_dir: Path, tmp_path: Path, models: dict[str, str]) -> None:
    benchmark = GenEvalBenchmark(max_prompts=2, images_per_prompt=2)
    folder = write_official_folder(tmp_path / "images", benchmark, images=2)
    (number, _), (second, _) = benchmark.selected()
    options = {**models, "detector_image_size": None}

    (folder / f"{second:05d}" / "samples" / "0001.png").rename(folder / f"{second:05d}" / "samples" / "image1.png")
    with pytest.raises(ValueError, match=rf"1 missing \(first: prompt 1, image 1, .*{second:05d}/samples/00001.png\); "
                                         rf"2 not in the layout \(first: .*images/notes, .*{second:05d}/samples/image1.png\)"):
        benchmark.read_images(folder)
    (folder / f"{second:05d}" / "samples" / "image1.png").unlink()
    (folder / f"{second:05d}" / "metadata.jsonl").rename(folder / "metadata.jsonl")
    with pytest.raises(ValueError, match=rf"{second:05d} has no metadata.jsonl: GenEval's generator writes"):
        benchmark.read_images(folder)
    (folder / "metadata.jsonl").rename(folder / f"{second:05d}" / "metadata.jsonl")

    Image.new("RGB", (32, 32)).save(folder / f"{second:05d}" / "samples" / "0001.png")
    (folder / f"{second:05d}" / "samples" / "0000.png").write_bytes(b"not a png")
    with pytest.raises(StoreError, match="0000.png is not a readable image"):
        benchmark.evaluate(None, tmp_path / "out", images=folder, scorer_options=options)

    (folder / f"{number:05d}" / "metadata.jsonl").write_text(json.dumps({"tag": "single_object", "prompt": "a cat"}))
    with pytest.raises(ValueError, match=r"prompt 'a cat', but GenEval prompt 0 is 'a photo of a bench'"):
        benchmark.read_images(folder)

    # Without images_per_prompt, the official 4 images are required.
    shutil.rmtree(folder)
    write_official_folder(folder, benchmark, images=2)
    with pytest.raises(ValueError, match="expected 2 prompts x 4 images"):
        GenEvalBenchmark(max_prompts=2).read_images(folder)


def test_images_beyond_images_per_prompt_are_ignored_but_without_it_every_prompt_needs_exactly_4(
    data_dir: Path, tmp_path: Path
) -> None:
    """With images_per_prompt=2 a folder of 3 images per prompt gives images 0 and 1 of each prompt; without
    images_per_prompt (the official 4), a fifth image is not silently dropped: the folder is refused."""
    three = write_official_folder(tmp_path / "three", GenEvalBenchmark(max_prompts=2), images=3)
    entries = GenEvalBenchmark(max_prompts=2, images_per_prompt=2).read_images(three)
    assert sorted((e.prompt_index, e.image_index) for e in entries) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    five = write_official_folder(tmp_path / "five", GenEvalBenchmark(max_prompts=2), images=5)
    with pytest.raises(ValueError, match=r"expected 2 prompts x 4 images, found 10; .*; 2 not in the benchmark "
                                         r"\(first: prompt 0, image 4\)"):
        GenEvalBenchmark(max_prompts=2).read_images(five)


@needs_shared
def test_benchmark_end_to_end_on_tiny_sd(data_dir: Path, tmp_path: Path, tiny_sd: Path, models: dict[str, str]) -> None:
    benchmark = GenEvalBenchmark(max_prompts=2, images_per_prompt=2, num_inference_steps=2, resolution=32)
    options = {**models, "threshold": 0.0, "counting_threshold": 0.0, "detector_image_size": None}
    summary = benchmark.evaluate(str(tiny_sd), tmp_path / "run", scorer_options=options, scorer_batch_size=4)
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert [(r["prompt_index"], r["image_index"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["score"] in (0.0, 1.0) and isinstance(r["reason"], str) for r in rows)
    assert set(summary["tasks"]) == {r["tag"] for r in rows}
    assert summary["num_images"] == 4 and 0.0 <= summary["overall"] <= 1.0
    records = SampleStore(tmp_path / "run" / "samples").records()
    assert sorted(r["seed"] for r in records) == [42, 42, 43, 43]  # image i of every prompt: seed 42 + i
    assert len((tmp_path / "run" / RESULTS_FILE).read_text().splitlines()) == 4
    again = benchmark.evaluate(str(tiny_sd), tmp_path / "run", scorer_options=options)  # resumed: nothing redone
    assert again["overall"] == summary["overall"]


def _opencv_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """OpenCV's INTER_LINEAR as its documentation defines it: source coordinate (x + 0.5) * scale - 0.5,
    clamped to the image, two-tap linear weights, no widening when shrinking; rounded to uint8."""
    def taps(size_in: int, size_out: int):
        source = np.clip((np.arange(size_out) + 0.5) * size_in / size_out - 0.5, 0, size_in - 1)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, size_in - 1), source - low

    y0, y1, wy = taps(pixels.shape[0], height)
    x0, x1, wx = taps(pixels.shape[1], width)
    rows = pixels[y0] * (1 - wy)[:, None, None] + pixels[y1] * wy[:, None, None]
    out = rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def test_the_detector_resize_is_opencvs_bilinear_not_pils_smoothing_one() -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    for side in (50, 80):  # mmdetection shrinks GenEval's 1024-px images to 800 and enlarges 512-px ones
        ours = mmdet_resize(image, (side, 2 * side)).permute(1, 2, 0).numpy().astype(int)
        reference = _opencv_bilinear(pixels.astype(float), side, side).astype(int)
        assert np.abs(ours - reference).max() <= 1  # OpenCV's fixed-point weights round within one level
    pil = np.asarray(image.resize((50, 50), Image.BILINEAR)).astype(int)
    assert np.abs(pil - _opencv_bilinear(pixels.astype(float), 50, 50).astype(int)).max() > 8  # PIL smooths


def test_metadata_rows_are_checked(data_dir: Path) -> None:
    rows = load_geneval_metadata()
    assert len(rows) == 553 and all("prompt" in row and "tag" in row for row in rows)
    assert sum("exclude" in row for row in rows) == 80


def test_detector_resizes_and_pads_like_mmdetection_and_returns_masks_at_image_size(models: dict[str, str]) -> None:
    detector = Mask2FormerDetector(models["model_name_or_path"], torch.device("cpu"), image_size=(96, 160))
    image = random_images(1)[0]  # 48 x 40
    # mmcv's rescale: x min(160 / 48, 96 / 40) = 2.4, sides rounded half up: 96 x 115; then padded to 32s with
    # grey 128 before normalising (GenEval's mmdetection config: Pad(pad_val=128), then Normalize).
    assert tuple(mmdet_resize(image, (96, 160)).shape) == (3, 96, 115)
    pixel_values, pixel_mask = detector.inputs([image])
    assert tuple(pixel_values.shape[-2:]) == (96, 128)
    assert pixel_mask[0].sum(1).tolist() == [115] * 96
    grey = (torch.tensor([128.0] * 3) - torch.tensor([123.675, 116.28, 103.53])) / torch.tensor([58.395, 57.12, 57.375])
    assert torch.allclose(pixel_values[0, :, :, 115:], grey.view(3, 1, 1).expand(3, 96, 13), atol=1e-5)
    unpadded = detector.processor(images=[mmdet_resize(image, (96, 160))], do_resize=False,
                                  input_data_format="channels_first", return_tensors="pt")["pixel_values"]
    assert torch.equal(pixel_values[..., :115], unpadded)
    found = detector.detect([image], threshold=0.0)[0]
    assert found and all(o.mask.shape == (40, 48) for objects in found.values() for o in objects)
    assert MMDET_TEST_SIZE == (800, 1333)


def test_geneval_samples_with_the_checkpoints_own_scheduler(tmp_path: Path) -> None:
    """GenEval's diffusers_generate.py sets no scheduler; T2I-CompBench's protocol samples with DDIM."""
    from diffusers import DDIMScheduler, PNDMScheduler

    from gors.core.backbones import FAMILIES, detect_backbone
    from gors.core.pipeline import CHECKPOINT_SCHEDULER, load_pipeline, pipeline_settings
    from gors.testing.sd import build_tiny_sd_pipeline

    path = tmp_path / "sd"
    build_tiny_sd_pipeline(path)
    scheduler_dir = path / "scheduler"
    PNDMScheduler.from_config(DDIMScheduler.load_config(scheduler_dir)).save_pretrained(scheduler_dir)  # as SD 1.5's
    index = json.loads((path / "model_index.json").read_text())
    (path / "model_index.json").write_text(json.dumps({**index, "scheduler": ["diffusers", "PNDMScheduler"]}))
    backbone = detect_backbone(str(path))
    geneval, compbench = get_benchmark("geneval"), get_benchmark("t2i_compbench")
    for benchmark, expected in ((geneval, PNDMScheduler), (compbench, DDIMScheduler)):
        pipeline = load_pipeline(str(path), torch.device("cpu"), backbone=benchmark.sampling_backbone(backbone))
        assert type(pipeline.scheduler) is expected
    settings = pipeline_settings(str(path), torch.float32, backbone=geneval.sampling_backbone(backbone))
    assert settings["scheduler"] == CHECKPOINT_SCHEDULER
    sdxl = FAMILIES["StableDiffusionXLPipeline"]  # not the family GenEval's protocol was written for
    assert geneval.sampling_backbone(sdxl) == sdxl


def test_overall_is_undefined_in_a_bootstrap_resample_that_lacks_a_whole_task() -> None:
    def results(correct: dict[str, list[bool]]) -> dict:
        rows = [{"prompt_index": 10 * k + i, "image_index": 0, "tag": tag, "correct": ok}
                for k, (tag, values) in enumerate(correct.items()) for i, ok in enumerate(values)]
        benchmark = GenEvalBenchmark(max_prompts=len(rows), images_per_prompt=1)
        benchmark.__dict__["_prompts"] = []  # `results` hashes the prompt texts; none are read here
        return benchmark.results(rows, benchmark.aggregate(rows))["metrics"]

    # Two prompts a task: a resample of one task's prompts only would average one task, another quantity.
    rows = [{"prompt_index": i, "image_index": 0, "tag": tag, "correct": ok}
            for i, (tag, ok) in enumerate([("single_object", True), ("single_object", False),
                                           ("two_object", True), ("two_object", True)])]
    benchmark = GenEvalBenchmark(max_prompts=4, images_per_prompt=1)
    assert benchmark.resample_summary([rows[0], rows[0], rows[2], rows[3]], rows)["overall"] == 1.0
    assert benchmark.resample_summary([rows[0], rows[1], rows[0], rows[1]], rows)["overall"] is None
    metrics = results({"single_object": [True, False], "two_object": [True, True]})
    assert metrics["overall"]["value"] == 0.75 and metrics["overall"]["ci95"][0] >= 0.5  # never one task's 0.5 mean
    # One prompt a task: the resamples that keep every task are its permutations, all alike: no interval at all
    # rather than one of width 0.
    metrics = results({"single_object": [True], "two_object": [False]})
    assert metrics["overall"]["value"] == 0.5 and metrics["overall"]["stderr"] is None
    assert metrics["overall"]["ci95"] is None
    assert metrics["correct_images"]["stderr"] > 0.3  # the other metrics use every resample (values 1, 0, 0.5)
