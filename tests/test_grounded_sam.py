"""Grounded-SAM reward on tiny random Grounding DINO + SAM, and on injected detections (offline)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.detection import build_tiny_grounding_dino
from gors.testing.sam import build_tiny_sam
from rewards import get_reward_class, load
from rewards.binding import box_mask
from rewards.detection import Detection
from rewards.grounded_sam import GroundedSAMReward, SamSegmenter

PROMPTS = [
    "a green bench and a blue bowl",
    "a triangular slice of pizza and a cylindrical pizza cutter",
    "a balloon on the top of a giraffe",
    "it is",
]


@pytest.fixture(scope="module")
def grounding_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_grounding_dino(tmp_path_factory.mktemp("tiny_grounding_dino"), seed=0)


@pytest.fixture(scope="module")
def sam_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sam(tmp_path_factory.mktemp("tiny_sam"), seed=0)


@pytest.fixture(scope="module")
def reward(grounding_dir: Path, sam_dir: Path) -> GroundedSAMReward:
    # The random detector's confidences are arbitrary: a zero threshold keeps every box.
    return GroundedSAMReward(
        model_name_or_path=str(grounding_dir),
        sam_model_name_or_path=str(sam_dir),
        device="cpu",
        batch_size=2,
        box_threshold=0.0,
        noun_phrase_backend="builtin",
    )


def random_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (24 + 8 * i, 40, 3), dtype=np.uint8))
        for i in range(count)
    ]


class FakeDetector:
    """Known detections per label; records each call's labels and thresholds."""

    def __init__(self, found: dict[str, list[tuple[float, tuple[float, float, float, float]]]]):
        self.found = found
        self.calls: list[tuple[list[list[str]], float, float | None]] = []

    def detect(self, images, labels, threshold, text_threshold=None, nms_iou=None):
        self.calls.append((labels, threshold, text_threshold))
        results = []
        for image_labels in labels:
            found = [
                Detection(label, score, box)
                for label in image_labels
                for score, box in self.found.get(label, [])
                if score >= threshold
            ]
            results.append(sorted(found, key=lambda d: -d.score))
        return results


def box_segmenter(images, boxes):
    """Masks that are exactly the boxes: the reward then scores box IoUs, known in advance."""
    return [
        [box_mask(b, image.width, image.height) for b in image_boxes]
        for image, image_boxes in zip(images, boxes, strict=True)
    ]


def test_registry_and_metadata() -> None:
    assert get_reward_class("grounded_sam") is GroundedSAMReward
    assert GroundedSAMReward.name == "grounded_sam"
    assert GroundedSAMReward.default_model == "IDEA-Research/grounding-dino-base"
    assert GroundedSAMReward.default_sam_model == "facebook/sam-vit-huge"
    assert GroundedSAMReward.categories == ("color", "shape", "texture")
    assert "IoU" in GroundedSAMReward.description


def test_tiny_models_scores_and_details(reward: GroundedSAMReward) -> None:
    images = random_images(len(PROMPTS))
    output = reward.score(images, PROMPTS)
    assert len(output.scores) == len(output.details) == len(PROMPTS)
    for image, score, details in zip(images, output.scores, output.details, strict=True):
        assert 0.0 <= score <= 1.0 and details["score"] == score
        json.dumps(details)
        objects = details["detections"]["objects"]
        attributes = details["detections"]["attributes"]
        object_labels = {p["object"] for p in details["phrases"]}
        attribute_labels = {p["attribute"] for p in details["phrases"]} - {""}
        assert {d["label"] for d in objects} <= object_labels
        assert {d["label"] for d in attributes} <= attribute_labels
        for detection in objects + attributes:
            x0, y0, x1, y1 = detection["box"]
            assert 0 <= x0 <= x1 <= image.width and 0 <= y0 <= y1 <= image.height
        for pair in details["pairs"]:
            assert 0.0 <= pair["iou"] <= 1.0
            if pair["object_segment"] is not None and pair["attribute_segment"] is not None:
                obj, attr = objects[pair["object_segment"]], attributes[pair["attribute_segment"]]
                assert (obj["label"], attr["label"]) == (pair["object"], pair["attribute"])
                expected = pair["iou"] * math.sqrt(obj["score"] * attr["score"])
                assert pair["score"] == pytest.approx(expected)
    first, second, third, last = output.details
    assert [(p["attribute"], p["object"]) for p in first["pairs"]] == [
        ("green", "bench"),
        ("blue", "bowl"),
    ]
    assert first["detections"]["objects"] and first["detections"]["attributes"]
    assert output.scores[0] == pytest.approx(np.mean([p["score"] for p in first["pairs"]]))
    assert [(p["attribute"], p["object"]) for p in second["pairs"]] == [
        ("triangular", "slice"),
        ("cylindrical", "pizza cutter"),
    ]
    # No attribute: object presence; no object: nothing to check.
    assert [p["object"] for p in third["presence"]] == ["balloon", "giraffe"]
    assert third["detections"]["attributes"] == []
    assert output.scores[3] == 0.0 and last["detections"] == {"objects": [], "attributes": []}


def test_deterministic(reward: GroundedSAMReward) -> None:
    images = random_images(2, seed=5)
    first = reward.score(images, PROMPTS[:2])
    second = reward.score(images, PROMPTS[:2])
    assert first.scores == second.scores
    assert first.details == second.details


def test_injected_detections_give_known_pair_scores() -> None:
    detector = FakeDetector(
        {
            "bench": [(0.9, (0.0, 0.0, 20.0, 20.0))],
            "bowl": [(0.64, (20.0, 20.0, 40.0, 40.0))],
            "green": [(0.4, (0.0, 0.0, 20.0, 20.0)), (0.81, (0.0, 10.0, 20.0, 20.0))],
            "blue": [(1.0, (20.0, 0.0, 40.0, 20.0))],  # not on the bowl
            "balloon": [(0.7, (0.0, 0.0, 5.0, 5.0))],
            "giraffe": [(0.2, (0.0, 0.0, 5.0, 5.0))],  # below the box threshold
        }
    )
    reward = GroundedSAMReward(
        detector=detector, segmenter=box_segmenter, box_threshold=0.3, text_threshold=0.2,
        noun_phrase_backend="builtin", device="cpu",
    )
    output = reward.score(
        random_images(2), ["a green bench and a blue bowl", "a balloon on the top of a giraffe"]
    )
    # Two detection passes: objects, then attributes, each with the reward's thresholds.
    assert detector.calls == [
        ([["bench", "bowl"], ["balloon", "giraffe"]], 0.3, 0.2),
        ([["green", "blue"], []], 0.3, 0.2),
    ]
    bench_pair, bowl_pair = output.details[0]["pairs"]
    # green: the full box (IoU 1, sqrt(0.9 * 0.4) = 0.6) beats the half box (0.5 * 0.9 = 0.45).
    assert bench_pair["score"] == pytest.approx(0.6)
    assert bench_pair["iou"] == pytest.approx(1.0)
    assert bench_pair["attribute_confidence"] == 0.4
    assert bowl_pair["score"] == 0.0 and bowl_pair["iou"] == 0.0
    assert output.scores[0] == pytest.approx(0.3)
    assert output.details[1]["presence"][0]["score"] == 0.7
    assert output.details[1]["presence"][1]["reason"] == "no 'giraffe' detected"
    assert output.scores[1] == pytest.approx(0.35)


def test_no_attribute_pass_without_attributes() -> None:
    detector = FakeDetector({"balloon": [(0.5, (0.0, 0.0, 5.0, 5.0))]})
    reward = GroundedSAMReward(detector=detector, segmenter=box_segmenter, device="cpu",
                               noun_phrase_backend="builtin")
    assert reward.score(random_images(1), ["a balloon"]).scores == [0.5]
    assert len(detector.calls) == 1


def test_sam_segments_each_box_once(sam_dir: Path) -> None:
    box = (0.0, 0.0, 20.0, 20.0)
    detector = FakeDetector({"bench": [(0.9, box)], "green": [(0.8, box)], "blue": [(0.8, box)]})
    segmenter = SamSegmenter(str(sam_dir), device="cpu")
    seen: list[list[list]] = []

    def counting(images, boxes):
        seen.append(boxes)
        return segmenter(images, boxes)

    reward = GroundedSAMReward(detector=detector, segmenter=counting, box_threshold=0.3,
                               noun_phrase_backend="builtin", device="cpu")
    output = reward.score(random_images(1), ["a green bench and a blue bowl"])
    assert seen == [[[box]]]
    pair = output.details[0]["pairs"][0]
    # One box for "bench" and "green": the same SAM mask, IoU 1 unless SAM's mask is empty.
    assert pair["score"] == pytest.approx(pair["iou"] * math.sqrt(0.9 * 0.8))
    assert pair["iou"] in (0.0, 1.0)


def test_sam_segmenter_masks_and_batching(sam_dir: Path) -> None:
    images = random_images(3, seed=2)
    boxes = [[(0.0, 0.0, 20.0, 12.0), (5.0, 5.0, 40.0, 30.0)], [], [(10.0, 2.0, 30.0, 30.0)]]
    batched = SamSegmenter(str(sam_dir), device="cpu", batch_size=3)(images, boxes)
    assert [len(m) for m in batched] == [2, 0, 1]
    for image, image_masks in zip(images, batched, strict=True):
        for mask in image_masks:
            assert mask.dtype == bool and mask.shape == (image.height, image.width)
    # Padding the second image's box list (to two boxes) must not change its mask.
    alone = SamSegmenter(str(sam_dir), device="cpu", batch_size=1)(images, boxes)
    for together, single in zip(batched, alone, strict=True):
        for a, b in zip(together, single, strict=True):
            assert (a != b).mean() < 0.01
    # A random SAM still gives different masks for different boxes.
    assert not np.array_equal(batched[0][0], batched[0][1])


def test_sam_segmenter_gives_sams_single_mask_output(sam_dir: Path) -> None:
    """Each box's mask is SAM's single-mask output (`multimask_output=False`, as Grounded-SAM prompts
    boxes), recomputed here with transformers' SAM and its post-processing."""
    from transformers import SamModel, SamProcessor

    image, box = random_images(1, seed=5)[0], (4.0, 2.0, 30.0, 20.0)
    ours = SamSegmenter(str(sam_dir), device="cpu")([image], [[box]])[0][0]
    processor, model = SamProcessor.from_pretrained(sam_dir), SamModel.from_pretrained(sam_dir).eval()
    inputs = processor(images=[image], input_boxes=[[list(box)]], return_tensors="pt")
    with torch.no_grad():
        outputs = model(pixel_values=inputs["pixel_values"], input_boxes=inputs["input_boxes"],
                        multimask_output=False)
    assert outputs.pred_masks.shape[2] == 1
    expected = processor.image_processor.post_process_masks(
        list(outputs.pred_masks), inputs["original_sizes"], inputs["reshaped_input_sizes"])[0][0][0].numpy()
    assert (ours != expected).mean() < 0.01


def test_sam_segmenter_input_checks(sam_dir: Path) -> None:
    """batch_size 0 is refused before SAM loads; as many box lists as images are required."""
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        SamSegmenter("no-model-needed", device="cpu", batch_size=0)
    with pytest.raises(ValueError, match="2 images but 1 box lists"):
        SamSegmenter(str(sam_dir), device="cpu")(random_images(2), [[(0.0, 0.0, 10.0, 10.0)]])


def test_a_segmenter_must_give_one_mask_per_box() -> None:
    """A custom segmenter that returns fewer masks than boxes is reported as such."""
    detector = FakeDetector({"bench": [(0.9, (0.0, 0.0, 20.0, 20.0))], "green": [(0.8, (0.0, 0.0, 10.0, 10.0))]})
    reward = GroundedSAMReward(detector=detector, segmenter=lambda images, boxes: [[] for _ in images],
                               noun_phrase_backend="builtin", device="cpu")
    with pytest.raises(RuntimeError, match="the segmenter gave 0 masks for 2 boxes"):
        reward.score(random_images(1), ["a green bench"])


def test_default_thresholds_are_grounding_dinos() -> None:
    """Grounding DINO's demo thresholds by default: box 0.35, text 0.25, passed to the detector."""
    detector = FakeDetector({})
    reward = GroundedSAMReward(detector=detector, segmenter=box_segmenter, noun_phrase_backend="builtin",
                               device="cpu")
    assert (reward.box_threshold, reward.text_threshold) == (0.35, 0.25)
    reward.score(random_images(1), ["a green bench"])
    assert [call[1:] for call in detector.calls] == [(0.35, 0.25), (0.35, 0.25)]


def test_tiny_sam_build_is_deterministic_by_seed(tmp_path: Path, sam_dir: Path) -> None:
    from safetensors.torch import load_file

    reference = load_file(sam_dir / "model.safetensors")
    same = load_file(build_tiny_sam(tmp_path / "same", seed=0) / "model.safetensors")
    other = load_file(build_tiny_sam(tmp_path / "other", seed=1) / "model.safetensors")
    assert all(torch.equal(reference[k], same[k]) for k in reference)
    assert not all(torch.equal(reference[k], other[k]) for k in reference)


def test_non_rgb_images(reward: GroundedSAMReward) -> None:
    rgb = random_images(1, seed=7)[0]
    gray, rgba = rgb.convert("L"), rgb.convert("RGBA")
    prompt = PROMPTS[0]
    output = reward.score([gray, rgba], [prompt, prompt])
    for details, converted in zip(output.details, [gray.convert("RGB"), rgb], strict=True):
        alone = reward.score([converted], [prompt]).details[0]
        assert details["score"] == pytest.approx(alone["score"], abs=1e-5)
        for kind in ("objects", "attributes"):
            ours, theirs = details["detections"][kind], alone["detections"][kind]
            assert [d["label"] for d in ours] == [d["label"] for d in theirs]
            # Batched and single forward passes differ only by float rounding.
            np.testing.assert_allclose([d["box"] for d in ours], [d["box"] for d in theirs], atol=1e-3)


def test_bad_arguments(sam_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="box_threshold"):
        GroundedSAMReward(detector=FakeDetector({}), segmenter=box_segmenter, box_threshold=1.5)
    with pytest.raises(FileNotFoundError, match="sam_model_name_or_path"):
        GroundedSAMReward(detector=FakeDetector({}), sam_model_name_or_path=str(tmp_path / "nope"),
                          device="cpu")
    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        load("grounded_sam", model_name_or_path=str(tmp_path / "nope"),
             sam_model_name_or_path=str(sam_dir), device="cpu")


def test_swapped_colours_score_below_the_right_ones_when_colour_words_co_activate():
    # A blue bench and a green bowl for "a green bench and a blue bowl": each box's other colour reaches
    # text_threshold 0.25 (colour words co-activate), and must count at its own 0.27, not at the box's 0.70.
    from rewards.binding import Segment, binding_phrases, binding_score
    from rewards.detection import select_detections

    phrases = binding_phrases("a green bench and a blue bowl", "builtin")
    boxes = np.array([[20, 200, 240, 480], [300, 300, 480, 460]], float)  # bench, bowl

    def score(colours: np.ndarray) -> float:
        def segments(probabilities, labels):
            found = select_detections(probabilities, boxes, labels, 0.35, text_threshold=0.25)
            return [Segment(d.label, d.score, box_mask(d.box, 512, 512)) for d in found]

        objects = segments(np.array([[0.8, 0.05], [0.05, 0.8]]), ["bench", "bowl"])
        return binding_score(phrases, objects, segments(colours, ["green", "blue"]))[0]

    swapped, right = score(np.array([[0.27, 0.70], [0.70, 0.27]])), score(np.array([[0.70, 0.27], [0.27, 0.70]]))
    assert right > 0.7 and swapped < 0.7 * right  # before: equal, each colour at its box's 0.70
