"""Zero-shot detector and the two detection rewards on tiny random detectors built in the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.detection import build_tiny_grounding_dino, build_tiny_owlv2
from rewards.detection import Detection, ZeroShotDetector, select_detections
from rewards.spatial_rule import position_score, to_official_frame

KINDS = ("grounding-dino", "mm-grounding-dino", "owlv2")


@pytest.fixture(scope="module")
def detector_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_detectors")
    return {
        "grounding-dino": build_tiny_grounding_dino(root / "gd", seed=0),
        "mm-grounding-dino": build_tiny_grounding_dino(root / "mm", seed=0, mm=True),
        "owlv2": build_tiny_owlv2(root / "owl", seed=0),
    }


@pytest.fixture(scope="module")
def detectors(detector_dirs: dict[str, Path]) -> dict[str, ZeroShotDetector]:
    return {
        kind: ZeroShotDetector(str(path), device="cpu", batch_size=2)
        for kind, path in detector_dirs.items()
    }


def random_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (32 + 8 * i, 48, 3), dtype=np.uint8))
        for i in range(count)
    ]


# --------------------------------------------------------------------------------------------
# select_detections: the thresholds on a (boxes x labels) table.


def test_select_detections_best_label_and_order() -> None:
    probs = np.array([[0.2, 0.7], [0.9, 0.1], [0.3, 0.4]])
    boxes = np.arange(12, dtype=float).reshape(3, 4)
    found = select_detections(probs, boxes, ["cat", "dog"], threshold=0.5)
    assert found == [
        Detection("cat", 0.9, (4.0, 5.0, 6.0, 7.0)),
        Detection("dog", 0.7, (0.0, 1.0, 2.0, 3.0)),
    ]
    assert select_detections(probs, boxes, ["cat", "dog"], threshold=0.95) == []
    assert len(select_detections(probs, boxes, ["cat", "dog"], threshold=0.4)) == 3  # >= keeps 0.4


def test_select_detections_text_threshold_reports_every_label_above_it() -> None:
    probs = np.array([[0.6, 0.5, 0.1]])
    found = select_detections(probs, np.zeros((1, 4)), ["a", "b", "c"], 0.55, text_threshold=0.3)
    # Each label at its own probability: a red box is not as "blue" as it is red because blue passed 0.3.
    assert [(d.label, d.score) for d in found] == [("a", 0.6), ("b", 0.5)]


def test_per_class_detections_follow_detectron2() -> None:
    from rewards.detection import per_class_detections

    # Box 0 and box 1 overlap (IoU 0.6); box 2 lies apart. Every (box, label) pair above the
    # threshold is a detection with its own probability; per label, NMS at IoU 0.5.
    boxes = np.array([[0, 0, 10, 10], [0, 2, 10, 12], [50, 50, 60, 60]], dtype=float)
    probs = np.array([[0.8, 0.3], [0.6, 0.05], [0.1, 0.7]])
    found = per_class_detections(probs, boxes, ["dog", "cat"], threshold=0.1, nms_iou=0.5)
    assert [(d.label, d.score, d.box[0]) for d in found] == [("dog", 0.8, 0.0), ("cat", 0.7, 50.0),
                                                             ("cat", 0.3, 0.0)]
    # Box 1's dog (0.6) is suppressed by box 0's; box 2's dog at exactly 0.1 is not above it;
    # box 0 names both labels, each with its own score. Without suppression both dogs stay.
    kept = per_class_detections(probs, boxes, ["dog", "cat"], threshold=0.1, nms_iou=1.0)
    assert [(d.label, d.score) for d in kept if d.label == "dog"] == [("dog", 0.8), ("dog", 0.6)]
    assert per_class_detections(np.zeros((0, 2)), np.zeros((0, 4)), ["dog", "cat"], 0.1, 0.5) == []


def test_the_unidet_rule_is_the_detector_rewards_default_and_excludes_text_threshold() -> None:
    from rewards.numeracy import NumeracyReward
    from rewards.spatial import SpatialRuleReward

    fake = FakeDetector({})
    assert SpatialRuleReward(detector=fake, device="cpu").nms_iou == 0.5
    assert SpatialRuleReward(detector=fake, device="cpu", text_threshold=0.25).nms_iou is None
    with pytest.raises(ValueError, match="nms_iou and text_threshold are two ways to label boxes"):
        NumeracyReward(detector=fake, device="cpu", text_threshold=0.25, nms_iou=0.5, noun_file=None)


def test_select_detections_text_threshold_is_inclusive_and_no_labels_give_nothing() -> None:
    """A label whose probability equals `text_threshold` is reported (as a box at `threshold` is kept);
    an image queried for no label has no detection (rather than an argmax over no column)."""
    probs = np.array([[0.6, 0.3, 0.1]])
    found = select_detections(probs, np.zeros((1, 4)), ["a", "b", "c"], 0.6, text_threshold=0.3)
    assert [(d.label, d.score) for d in found] == [("a", 0.6), ("b", 0.3)]
    assert select_detections(np.zeros((3, 0)), np.zeros((3, 4)), [], 0.0) == []


def test_select_detections_checks_shape() -> None:
    with pytest.raises(ValueError, match="expected"):
        select_detections(np.zeros((2, 2)), np.zeros((3, 4)), ["a", "b"], 0.5)


# --------------------------------------------------------------------------------------------
# ZeroShotDetector on the tiny models.


@pytest.mark.parametrize("kind", KINDS)
def test_detector_labels_scores_boxes(detectors: dict[str, ZeroShotDetector], kind: str) -> None:
    detector = detectors[kind]
    assert detector.model_type == kind
    images = random_images(3)
    labels = [["a cat", "A Red car."], ["dog"], ["a cat", "dog", "a man", "a cat"]]
    results = detector.detect(images, labels, threshold=0.0)
    assert len(results) == 3
    for image, image_labels, found in zip(images, labels, results, strict=True):
        assert found, "threshold 0 keeps every box"
        assert [d.score for d in found] == sorted((d.score for d in found), reverse=True)
        width, height = image.size
        for d in found:
            assert d.label in image_labels  # exactly a query string, case and dot included
            assert 0.0 <= d.score <= 1.0
            x0, y0, x1, y1 = d.box
            assert 0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height
    high = detector.detect(images, labels, threshold=0.5)
    assert all(d.score >= 0.5 for found in high for d in found)


def _assert_each_alone_gives(detector_dir: Path, images: list, labels: list[list[str]], together: list) -> None:
    """Each image detected alone (batch_size 1) gives the detections it got in the batch `together`."""
    alone = ZeroShotDetector(str(detector_dir), device="cpu", batch_size=1)
    for image, image_labels, expected in zip(images, labels, together, strict=True):
        found = alone.detect([image], [image_labels], threshold=0.0)[0]
        assert [d.label for d in found] == [d.label for d in expected]
        np.testing.assert_allclose([d.score for d in found], [d.score for d in expected], atol=1e-4)
        np.testing.assert_allclose([d.box for d in found], [d.box for d in expected], atol=1e-3)


@pytest.mark.parametrize("kind", KINDS)
def test_detector_batched_equals_one_at_a_time(
    detector_dirs: dict[str, Path], detectors: dict[str, ZeroShotDetector], kind: str
) -> None:
    images = random_images(3, seed=1)
    labels = [["a cat", "a red car"], ["dog"], ["a man", "a cat", "dog"]]
    together = detectors[kind].detect(images, labels, threshold=0.0)
    _assert_each_alone_gives(detector_dirs[kind], images, labels, together)


@pytest.mark.parametrize("kind", ["grounding-dino", "mm-grounding-dino"])
def test_grounding_text_matches_the_processor_and_maps_tokens_to_labels(
    detectors: dict[str, ZeroShotDetector], kind: str
) -> None:
    detector = detectors[kind]
    labels = ["a cat", "A Red car.", "dog?"]
    ids, spans = detector.grounding_text(labels)
    # The same ids as transformers' processor builds from its own "a cat. a red car. dog." text.
    assert ids == detector.processor(text="a cat. a red car . dog .").input_ids
    tokenizer = detector.processor.tokenizer
    assert [tokenizer.decode(ids[s:e]) for s, e in spans] == ["a cat", "a red car", "dog"]
    assert ids[spans[0][1]] == ids[spans[1][1]] == tokenizer.convert_tokens_to_ids(".")


def test_grounding_dino_scores_a_label_by_the_mean_over_its_tokens(
    detectors: dict[str, ZeroShotDetector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Force the logits: box 0 fires on every token of label 2, box 1 on every token of label 1 and,
    less, of label 0; box 2 on one token of label 1 only ("car" of "a red car", as on a car of another colour)."""
    detector = detectors["grounding-dino"]
    labels = ["a cat", "a red car", "dog"]
    _, spans = detector.grounding_text(labels)
    forward = detector.model.forward

    def fake_forward(**kwargs):
        outputs = forward(**kwargs)
        logits = torch.full_like(outputs.logits, -10.0)
        logits[0, 0, slice(*spans[2])] = 3.0
        logits[0, 1, slice(*spans[1])] = 2.0
        logits[0, 1, slice(*spans[0])] = 1.0
        logits[0, 2, spans[1][1] - 1] = 4.0
        outputs.logits = logits
        return outputs

    monkeypatch.setattr(detector.model, "forward", fake_forward)
    sigmoid = lambda x: round(float(torch.sigmoid(torch.tensor(x))), 4)  # noqa: E731
    found = detector.detect(random_images(1), [labels], threshold=0.5)[0]
    # Box 2's one token (mean over 3 tokens about 0.33) is no "a red car" (GLIP's rule; the maximum would say 0.98).
    assert [(d.label, round(d.score, 4)) for d in found] == [("dog", sigmoid(3.0)), ("a red car", sigmoid(2.0))]
    # With a text threshold the second box also names "a cat" (sigmoid(1) = 0.73), at its own probability.
    found = detector.detect(random_images(1), [labels], threshold=0.5, text_threshold=0.7)[0]
    assert [(d.label, round(d.score, 4)) for d in found] == [
        ("dog", sigmoid(3.0)), ("a red car", sigmoid(2.0)), ("a cat", sigmoid(1.0))]


def test_detector_input_checks(detectors: dict[str, ZeroShotDetector]) -> None:
    detector = detectors["owlv2"]
    assert detector.detect(random_images(2), [[], ["dog"]], threshold=0.0)[0] == []
    with pytest.raises(ValueError, match="2 images but 1 label lists"):
        detector.detect(random_images(2), [["dog"]], threshold=0.5)
    with pytest.raises(ValueError, match="threshold must be in"):
        detector.detect(random_images(1), [["dog"]], threshold=1.5)
    with pytest.raises(ValueError, match="non-empty"):
        detector.detect(random_images(1), [[" . "]], threshold=0.5)
    with pytest.raises(ValueError, match="give one of them"):
        detector.detect(random_images(1), [["dog"]], threshold=0.1, text_threshold=0.2, nms_iou=0.5)


def test_detector_batch_size_must_be_positive() -> None:
    """batch_size 0 is refused before any model loads, naming the option."""
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        ZeroShotDetector("no-model-needed", device="cpu", batch_size=0)


@pytest.mark.parametrize("kind", ["grounding-dino", "owlv2"])
def test_duplicate_labels_are_queried_once(detectors: dict[str, ZeroShotDetector], kind: str) -> None:
    """A label repeated in an image's list is one query: the same detections as without the repeat
    (Grounding DINO reads the same text; no box is reported twice for one label)."""
    images = random_images(1, seed=3)
    repeated = detectors[kind].detect(images, [["dog", "a cat", "dog"]], threshold=0.0, text_threshold=0.0)
    once = detectors[kind].detect(images, [["dog", "a cat"]], threshold=0.0, text_threshold=0.0)
    assert repeated == once


@pytest.mark.parametrize("kind", ["grounding-dino", "mm-grounding-dino"])
def test_grounding_text_may_fill_max_text_len(
    detectors: dict[str, ZeroShotDetector], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text of exactly the model's `max_text_len` tokens is accepted; one token more is refused."""
    detector = detectors[kind]
    labels = ["a cat", "a red car", "dog"]
    ids, spans = detector.grounding_text(labels)
    monkeypatch.setattr(detector.model.config, "max_text_len", len(ids))
    assert detector.grounding_text(labels) == (ids, spans)
    monkeypatch.setattr(detector.model.config, "max_text_len", len(ids) - 1)
    with pytest.raises(ValueError, match=f"3 labels take {len(ids)} tokens.*at most {len(ids) - 1}"):
        detector.grounding_text(labels)


@pytest.mark.parametrize("kind", ["grounding-dino", "mm-grounding-dino"])
def test_grounding_texts_of_different_lengths_share_a_batch(
    detector_dirs: dict[str, Path], detectors: dict[str, ZeroShotDetector], kind: str
) -> None:
    """Same-size images (one forward pass) with texts of different token lengths: the shorter text's
    padding is masked out, so each image gets the detections it gets alone."""
    rng = np.random.default_rng(4)
    images = [Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)) for _ in range(2)]
    labels = [["a cat", "a red car", "a man"], ["dog"]]
    together = detectors[kind].detect(images, labels, threshold=0.0)  # batch_size 2: one pass
    _assert_each_alone_gives(detector_dirs[kind], images, labels, together)


def test_detector_per_class_rule_keeps_no_overlapping_pair_of_one_label(
        detectors: dict[str, ZeroShotDetector]) -> None:
    from torchvision.ops import box_iou

    found = detectors["owlv2"].detect(random_images(1), [["dog", "cat"]], threshold=0.0, nms_iou=0.5)[0]
    every = detectors["owlv2"].detect(random_images(1), [["dog", "cat"]], threshold=0.0, nms_iou=1.0)[0]  # no IoU > 1
    assert found and [d.score for d in found] == sorted((d.score for d in found), reverse=True)
    assert len(found) < len(every) and set(found) <= set(every)  # some pairs suppressed, none made up
    kept = 0
    for label in ("dog", "cat"):
        boxes = torch.tensor([d.box for d in found if d.label == label])
        kept += len(boxes)
        if len(boxes) > 1:
            overlaps = box_iou(boxes, boxes).nan_to_num(0.0).fill_diagonal_(0)  # zero-area boxes: no IoU
            assert overlaps.max() <= 0.5
    assert kept > 2  # the overlap check above compared boxes of one label


def test_detector_grayscale_and_rgba(detectors: dict[str, ZeroShotDetector]) -> None:
    rgb = random_images(1, seed=4)[0]
    for kind in KINDS:
        detector = detectors[kind]
        expected = detector.detect([rgb.convert("L").convert("RGB")], [["dog"]], 0.0)[0]
        assert detector.detect([rgb.convert("L")], [["dog"]], 0.0)[0] == expected
        assert detector.detect([rgb.convert("RGBA")], [["dog"]], 0.0)[0] == detector.detect(
            [rgb], [["dog"]], 0.0
        )[0]


def test_detector_rejects_other_models_and_missing_paths(tmp_path: Path) -> None:
    from gors.testing.blip import build_tiny_blip_vqa

    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        ZeroShotDetector(str(tmp_path / "missing"), device="cpu")
    blip = build_tiny_blip_vqa(tmp_path / "blip")
    with pytest.raises((OSError, ValueError), match="--detector"):
        ZeroShotDetector(str(blip), device="cpu", flag="--detector")


# --------------------------------------------------------------------------------------------
# The two rewards.

LEFT = (0.0, 200.0, 100.0, 300.0)
RIGHT = (300.0, 220.0, 400.0, 320.0)
TOP = (200.0, 0.0, 300.0, 100.0)
BOTTOM = (220.0, 300.0, 320.0, 400.0)
SPATIAL_PROMPTS = [
    "a cat on the left of a dog",
    "a girl on the top of a frog",
    "a giraffe next to a lamp",
    "a mouse on side of a key",
]


class FakeDetector:
    """Known detections per label (most confident first); records what it was asked."""

    model_name_or_path = "fake"

    def __init__(self, detections: dict[str, list[Detection]]) -> None:
        self.detections = detections
        self.calls: list[tuple[int, list[list[str]], float]] = []

    def detect(self, images, labels, threshold, text_threshold=None, nms_iou=None):
        self.calls.append((len(images), labels, threshold))
        return [
            sorted(
                (d for label in image_labels for d in self.detections.get(label, [])
                 if d.score >= threshold),
                key=lambda d: -d.score,
            )
            for image_labels in labels
        ]


def rewards_on(detector) -> dict[str, object]:
    from rewards.grounded_detection import GroundedDetectionReward
    from rewards.spatial import SpatialRuleReward

    return {
        "spatial_rule": SpatialRuleReward(detector=detector, device="cpu"),
        "grounded_detection": GroundedDetectionReward(detector=detector, device="cpu"),
    }


def test_registry_and_metadata() -> None:
    from rewards import get_reward_class
    from rewards.grounded_detection import GroundedDetectionReward
    from rewards.spatial import SpatialRuleReward

    assert get_reward_class("spatial_rule") is SpatialRuleReward
    assert get_reward_class("grounded_detection") is GroundedDetectionReward
    assert SpatialRuleReward.default_model == "google/owlv2-base-patch16-ensemble"
    assert GroundedDetectionReward.default_model == (
        "openmmlab-community/mm_grounding_dino_base_o365v1_goldg_v3det"
    )
    assert SpatialRuleReward.categories == GroundedDetectionReward.categories == ("spatial",)


def test_rewards_with_known_detections() -> None:
    fake = FakeDetector(
        {"cat": [Detection("cat", 0.9, LEFT)], "dog": [Detection("dog", 0.8, RIGHT)]}
    )
    images = random_images(2)
    prompts = ["a cat on the left of a dog", "a cat on the right of a dog"]
    metric, reward = rewards_on(fake).values()
    out = metric.score(images, prompts)
    assert out.scores == pytest.approx([0.25 * 0.9 + 0.25 * 0.8 + 0.5, 0.0])
    assert fake.calls[-1] == (2, [["cat", "dog"], ["cat", "dog"]], 0.1)  # UniDet's, hard-coded in its ROI heads
    details = out.details[0]
    assert details["relation"] == "on the left of" and details["objects"] == ["cat", "dog"]
    assert details["first"] == {"label": "cat", "score": 0.9, "box": list(LEFT)}
    assert details["second"]["box"] == list(RIGHT)
    assert details["position"] == 1.0 and "both objects found" in details["reason"]
    assert "floor" in out.details[1]["reason"] and out.details[1]["position"] == 0.0
    # The unbiased reward: no floor, its own threshold.
    out = reward.score(images, prompts)
    assert out.scores == pytest.approx([0.925, 0.425])
    assert fake.calls[-1][2] == 0.35


def test_near_is_judged_in_the_official_detection_frame() -> None:
    # Centres 155 px apart on both axes of a 512-px image: 145 px of the official 479-px frame,
    # so near (the image's own pixels would give 150 / 155); on a 1024-px image 300 px are 140.
    for side, offset in ((512, 155.0), (1024, 300.0)):
        fake = FakeDetector({"cat": [Detection("cat", 0.9, (0.0, 0.0, 20.0, 20.0))],
                             "dog": [Detection("dog", 0.8, (offset, offset, offset + 20, offset + 20))]})
        metric = rewards_on(fake)["spatial_rule"]
        out = metric.score([Image.new("RGB", (side, side))], ["a cat near a dog"])
        assert out.details[0]["position"] == 1.0, side
        assert out.scores == pytest.approx([0.25 * 0.9 + 0.25 * 0.8 + 0.5])
        assert out.details[0]["second"]["box"] == [offset, offset, offset + 20, offset + 20]  # the image's pixels


def test_rewards_one_object_and_on_top_of() -> None:
    fake = FakeDetector(
        {"hat": [Detection("hat", 1.0, TOP)], "bench": [Detection("bench", 0.6, BOTTOM)]}
    )
    metric, reward = rewards_on(fake).values()
    prompts = ["a hat on top of a bench", "a hat near a bird"]
    out = metric.score(random_images(2), prompts)
    # Official: no position branch for "on top of": 0.25 + 0.15 < 0.5.
    assert out.scores == [0.0, 0.0]
    assert out.details[0]["position"] == 0.0
    assert "only the first object ('hat')" in out.details[1]["reason"]
    out = reward.score(random_images(2), prompts)
    assert out.scores == pytest.approx([0.25 + 0.15 + 0.5, 0.25])


def test_person_mapping_and_same_name() -> None:
    fake = FakeDetector(
        {
            "person": [Detection("person", 0.9, TOP)],
            "dog": [Detection("dog", 0.9, LEFT), Detection("dog", 0.7, RIGHT)],
        }
    )
    metric, reward = rewards_on(fake).values()
    prompts = ["a girl on the top of a dog", "a dog on the left of a dog"]
    out = metric.score(random_images(2), prompts)
    assert fake.calls[-1][1] == [["person", "dog"], ["dog"]]  # each label asked once
    assert out.details[0]["objects"] == ["person", "dog"]
    # TOP (250, 50) vs LEFT (50, 250): |dx| = |dy| = 200, no axis dominates: position 0.
    assert out.details[0]["position"] == 0.0
    # Officially both dogs take the same box (position 0); the unbiased reward takes two.
    assert out.details[1]["first"] == out.details[1]["second"]
    assert out.scores[1] == 0.0
    out = reward.score(random_images(2), prompts)
    assert out.details[1]["second"]["score"] == 0.7
    assert out.scores[1] == pytest.approx(0.25 * 0.9 + 0.25 * 0.7 + 0.5)


def test_prompt_without_relation_or_objects() -> None:
    fake = FakeDetector({"cat": [Detection("cat", 0.9, LEFT)]})
    for reward in rewards_on(fake).values():
        out = reward.score(random_images(3), ["a cat and a dog", "", "a cat on the left of a dog"])
        assert out.scores[0] == out.scores[1] == 0.0
        assert out.details[0]["reason"] == "no spatial relation word in the prompt"
        assert out.details[0]["relation"] is None and out.details[1]["objects"] is None
        # Only the image with a relation and two objects reached the detector.
        assert fake.calls[-1][0] == 1
    out = rewards_on(fake)["spatial_rule"].score(random_images(1), ["it is near them"])
    assert out.scores == [0.0] and "two objects" in out.details[0]["reason"]


def test_complex_parsing_option() -> None:
    from rewards.grounded_detection import GroundedDetectionReward
    from rewards.spatial import SpatialRuleReward

    fake = FakeDetector({})
    prompt = "The red hat was on top of the brown coat rack."
    SpatialRuleReward(detector=fake, complex=True).score(random_images(1), [prompt])
    assert fake.calls[-1][1] == [["hat", "coat"]]  # the first NOUN after the preposition, as officially
    GroundedDetectionReward(detector=fake, complex=True).score(random_images(1), [prompt])
    assert fake.calls[-1][1] == [["hat", "rack"]]  # an open-vocabulary detector is asked for the head
    SpatialRuleReward(detector=fake, complex=True, noun_rule="head", label_space="open").score(random_images(1),
                                                                                          [prompt])
    assert fake.calls[-1][1] == [["hat", "rack"]]
    with pytest.raises(ValueError, match="noun_rule"):
        SpatialRuleReward.check_options({"noun_rule": "first"})
    out = SpatialRuleReward(detector=fake, complex=True).score(
        random_images(1), ["a bowl sits on top of a table, and a cat is near the window"]
    )
    assert out.scores == [0.0] and out.details[0]["objects"] is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reward_name", ["spatial_rule", "grounded_detection"])
def test_rewards_on_tiny_models(detector_dirs: dict[str, Path], kind: str, reward_name: str) -> None:
    from rewards import load

    reward = load(
        reward_name, model_name_or_path=str(detector_dirs[kind]), device="cpu", batch_size=2,
        threshold=0.0, floor=0.0, noun_phrase_backend="builtin", label_space="open",  # "mouse" is no UniDet class
    )
    assert reward.detector.model_type == kind
    images = random_images(len(SPATIAL_PROMPTS), seed=2)
    images[1] = images[1].convert("L")
    images[2] = images[2].convert("RGBA")
    out = reward.score(images, SPATIAL_PROMPTS)
    assert len(out.scores) == len(out.details) == len(SPATIAL_PROMPTS)
    for score, details in zip(out.scores, out.details, strict=True):
        assert 0.0 <= score <= 1.0 and details["score"] == score
        assert set(details) == {
            "relation", "objects", "parser", "not_in_label_space", "first", "second", "position", "score", "reason",
        }
        assert details["not_in_label_space"] == []
        assert details["parser"] == {"name": "builtin", "version": "1"}  # which tagger found the names
        # Threshold 0: every object is found; its detection carries its own label.
        assert details["first"]["label"] == details["objects"][0]
        assert details["second"]["label"] == details["objects"][1]
        assert 0.0 <= details["position"] <= 1.0
        expected = 0.25 * (details["first"]["score"] + details["second"]["score"])
        assert score == pytest.approx(expected + 0.5 * details["position"])
    # UniDet's "person" for the metric; an open-vocabulary detector is asked for the girl herself.
    assert out.details[1]["objects"] == (["girl", "frog"] if reward_name == "grounded_detection" else ["person", "frog"])
    # Proximity is judged in the official 479-px detection frame, whatever the image's size.
    for i in (2, 3):
        first, second = (out.details[i][k] for k in ("first", "second"))
        boxes = [to_official_frame(Detection(d["label"], d["score"], tuple(d["box"])), *images[i].size).box
                 for d in (first, second)]
        assert out.details[i]["position"] == pytest.approx(position_score(out.details[i]["relation"], *boxes))


def test_reward_missing_model_path(tmp_path: Path) -> None:
    from rewards import load

    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        load("grounded_detection", model_name_or_path=str(tmp_path / "missing"), device="cpu")


def test_reward_option_checks() -> None:
    from rewards.spatial import SpatialRuleReward

    with pytest.raises(ValueError, match="threshold must be in"):
        SpatialRuleReward(detector=FakeDetector({}), threshold=2.0)
    with pytest.raises(ValueError, match="distance_threshold"):
        SpatialRuleReward(detector=FakeDetector({}), distance_threshold=0)
