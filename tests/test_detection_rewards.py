"""Zero-shot detector and the two detection rewards on tiny random detectors built in the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.tiny.detection import build_tiny_grounding_dino, build_tiny_owlv2
from rewards.detection import Detection, ZeroShotDetector, select_detections

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
    assert [(d.label, d.score) for d in found] == [("a", 0.6), ("b", 0.6)]


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


@pytest.mark.parametrize("kind", KINDS)
def test_detector_batched_equals_one_at_a_time(
    detector_dirs: dict[str, Path], detectors: dict[str, ZeroShotDetector], kind: str
) -> None:
    images = random_images(3, seed=1)
    labels = [["a cat", "a red car"], ["dog"], ["a man", "a cat", "dog"]]
    together = detectors[kind].detect(images, labels, threshold=0.0)
    alone = ZeroShotDetector(str(detector_dirs[kind]), device="cpu", batch_size=1)
    for image, image_labels, expected in zip(images, labels, together, strict=True):
        found = alone.detect([image], [image_labels], threshold=0.0)[0]
        assert [d.label for d in found] == [d.label for d in expected]
        np.testing.assert_allclose([d.score for d in found], [d.score for d in expected], atol=1e-4)
        np.testing.assert_allclose([d.box for d in found], [d.box for d in expected], atol=1e-3)


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


def test_grounding_dino_label_is_the_label_of_the_best_token(
    detectors: dict[str, ZeroShotDetector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Force the logits: box 0 peaks on a token of label 2, box 1 on label 1's second token."""
    detector = detectors["grounding-dino"]
    labels = ["a cat", "a red car", "dog"]
    _, spans = detector.grounding_text(labels)
    forward = detector.model.forward

    def fake_forward(**kwargs):
        outputs = forward(**kwargs)
        logits = torch.full_like(outputs.logits, -10.0)
        logits[0, 0, spans[2][0]] = 3.0
        logits[0, 1, spans[1][0] + 1] = 2.0
        logits[0, 1, spans[0][0]] = 1.0
        outputs.logits = logits
        return outputs

    monkeypatch.setattr(detector.model, "forward", fake_forward)
    found = detector.detect(random_images(1), [labels], threshold=0.5)[0]
    assert [(d.label, round(d.score, 4)) for d in found] == [
        ("dog", round(float(torch.sigmoid(torch.tensor(3.0))), 4)),
        ("a red car", round(float(torch.sigmoid(torch.tensor(2.0))), 4)),
    ]
    # With a text threshold the second box also names "a cat" (sigmoid(1) = 0.73).
    found = detector.detect(random_images(1), [labels], threshold=0.5, text_threshold=0.7)[0]
    assert [d.label for d in found] == ["dog", "a cat", "a red car"]  # label order


def test_detector_input_checks(detectors: dict[str, ZeroShotDetector]) -> None:
    detector = detectors["owlv2"]
    assert detector.detect(random_images(2), [[], ["dog"]], threshold=0.0)[0] == []
    with pytest.raises(ValueError, match="2 images but 1 label lists"):
        detector.detect(random_images(2), [["dog"]], threshold=0.5)
    with pytest.raises(ValueError, match="threshold must be in"):
        detector.detect(random_images(1), [["dog"]], threshold=1.5)
    with pytest.raises(ValueError, match="non-empty"):
        detector.detect(random_images(1), [[" . "]], threshold=0.5)


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
    from gors.tiny.blip import build_tiny_blip_vqa

    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        ZeroShotDetector(str(tmp_path / "missing"), device="cpu")
    blip = build_tiny_blip_vqa(tmp_path / "blip")
    with pytest.raises((OSError, ValueError), match="--detector"):
        ZeroShotDetector(str(blip), device="cpu", flag="--detector")
