"""ZeroShotDetector's pixel boxes equal transformers' own post-processing of the same model outputs.

Spatial rewards read `Detection.box` in pixels, so a wrong scale (OWLv2's boxes are fractions of the
longer side of the image padded to a square; Grounding DINO's and OWL-ViT v1's are fractions of
width and height) or a swapped x/y axis would silently move every box. On non-square images
(48 x 32, 32 x 48, and a batch of two different sizes) each model's outputs are caught with a
forward hook and post-processed by transformers with the target size it documents, (height, width)
of the original image:

- Grounding DINO: `GroundingDinoProcessor.post_process_grounded_object_detection`, which scales by
  (width, height, width, height).
- OWLv2: `Owlv2ImageProcessor.post_process_object_detection`, which scales by max(height, width)
  ("for owlv2 image is padded to max size unlike owlvit").
- OWL-ViT v1: `OwlViTImageProcessor.post_process_object_detection`, which scales by
  (width, height, width, height).

Random tiny detectors predict boxes that mostly reach past the image, where the clamp to the image
would hide a wrong scale; so the main test replaces the predicted boxes (in the hook, before either
side reads them) by seeded random boxes well inside the image (corners at 5% to 60% of each side,
inside the unpadded part of OWLv2's square for the aspect ratios used), where no clamp applies and
the comparison is exact. A second test keeps the genuine predictions and compares against
transformers' boxes clamped to the image as gors does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.detection import build_tiny_grounding_dino, build_tiny_owlv2, build_tiny_owlvit
from rewards.detection import ZeroShotDetector

KINDS = ("grounding-dino", "owlv2", "owlvit")
LABELS = ["cat", "red dog"]
ATOL = 1e-4  # pixels
# (width, height) of the images: landscape, portrait, and a batch of two different sizes.
SIZES = {"48x32": [(48, 32)], "32x48": [(32, 48)], "batch": [(48, 32), (36, 56)]}


@pytest.fixture(scope="module")
def detectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ZeroShotDetector]:
    root = tmp_path_factory.mktemp("tiny_box_detectors")
    folders = {
        "grounding-dino": build_tiny_grounding_dino(root / "gd", seed=0),
        "owlv2": build_tiny_owlv2(root / "owlv2", seed=0),
        "owlvit": build_tiny_owlvit(root / "owlvit", seed=0),
    }
    found = {kind: ZeroShotDetector(str(path), device="cpu") for kind, path in folders.items()}
    assert {kind: d.model_type for kind, d in found.items()} == {k: k for k in KINDS}
    return found


def images_of(sizes: list[tuple[int, int]], seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


@contextmanager
def caught_outputs(detector: ZeroShotDetector, replace_boxes: bool, seed: int = 0) -> Iterator[list]:
    """Collect the outputs of each forward pass of `detector.model`; with `replace_boxes`, their
    `pred_boxes` (cx, cy, w, h, relative) become seeded random boxes with corners in [0.05, 0.6]."""
    caught: list = []
    generator = torch.Generator().manual_seed(seed)

    def hook(module: torch.nn.Module, args: tuple, output):
        if replace_boxes:
            shape = output.pred_boxes.shape[:-1]
            centre = 0.2 + 0.25 * torch.rand(*shape, 2, generator=generator)
            size = 0.05 + 0.25 * torch.rand(*shape, 2, generator=generator)
            output.pred_boxes = torch.cat([centre, size], dim=-1).to(output.pred_boxes)
        caught.append(output)
        return output

    handle = detector.model.register_forward_hook(hook)
    try:
        yield caught
    finally:
        handle.remove()


def transformers_boxes(detector: ZeroShotDetector, outputs, images: list[Image.Image]) -> list[np.ndarray]:
    """Every predicted box of each image in pixels, by transformers' post-processing of `outputs`
    (threshold -1 keeps all of them, in query order), with the target size (height, width)."""
    target_sizes = [(image.height, image.width) for image in images]
    if detector.model_type == "grounding-dino":
        results = detector.processor.post_process_grounded_object_detection(
            outputs, threshold=-1.0, text_threshold=0.25, target_sizes=target_sizes
        )
    else:
        results = detector.processor.image_processor.post_process_object_detection(
            outputs, threshold=-1.0, target_sizes=target_sizes
        )
    boxes = [result["boxes"].float().numpy() for result in results]
    for image_boxes in boxes:
        assert len(image_boxes) == outputs.pred_boxes.shape[1]  # none dropped: boxes stay in query order
    return boxes


def clamped(boxes: np.ndarray, image: Image.Image) -> np.ndarray:
    return np.clip(boxes, 0.0, np.array([image.width, image.height] * 2, dtype=boxes.dtype))


def tables(detector: ZeroShotDetector, images: list[Image.Image]) -> list[tuple[np.ndarray, np.ndarray]]:
    labels = [list(LABELS) for _ in images]
    if detector.model_type == "grounding-dino":
        return detector._grounding_dino_tables(images, labels)
    return detector._owl_tables(images, labels)


@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("kind", KINDS)
def test_boxes_equal_transformers_post_processing(
    detectors: dict[str, ZeroShotDetector], kind: str, sizes: list[tuple[int, int]]
) -> None:
    detector = detectors[kind]
    images = images_of(sizes)
    # One forward pass of all the images (different sizes in one batch for "batch"): the table
    # of every box, in query order.
    with caught_outputs(detector, replace_boxes=True) as caught:
        got = tables(detector, images)
    assert len(caught) == 1
    expected = transformers_boxes(detector, caught[0], images)
    for image, (_, boxes), want in zip(images, got, expected, strict=True):
        # The replaced boxes lie well inside the image (no clamp applies), yet span it.
        assert (want > 1.0).all()
        assert (want[:, [0, 2]] < image.width - 1.0).all() and (want[:, [1, 3]] < image.height - 1.0).all()
        assert want[:, [2, 3]].max(axis=0).min() > 0.4 * min(image.size)
        np.testing.assert_allclose(boxes, want, rtol=0, atol=ATOL)

    # The public path: detect() (which runs each image size in its own forward pass) reports every
    # box once at threshold 0, with the same pixel boxes.
    for image in images:
        with caught_outputs(detector, replace_boxes=True, seed=1) as caught:
            (found,) = detector.detect([image], [list(LABELS)], threshold=0.0)
        if kind == "grounding-dino":
            (want,) = transformers_boxes(detector, caught[0], [image])
            their_labels = their_scores = None
        else:
            (result,) = detector.processor.image_processor.post_process_object_detection(
                caught[0], threshold=-1.0, target_sizes=[(image.height, image.width)]
            )
            want = result["boxes"].float().numpy()
            their_labels = [LABELS[k] for k in result["labels"].tolist()]
            their_scores = result["scores"].tolist()
        assert len(found) == len(want) == caught[0].pred_boxes.shape[1]
        # Each detection's box is one of transformers' boxes (a different one each time).
        distances = np.abs(np.array([d.box for d in found])[:, None, :] - want[None, :, :]).max(axis=-1)
        matched = distances.argmin(axis=1)
        assert sorted(matched.tolist()) == list(range(len(want)))
        np.testing.assert_allclose(distances.min(axis=1), 0.0, rtol=0, atol=ATOL)
        if their_labels is not None:
            # OWL: transformers' label and score of a box are its best query, as gors' (Grounding
            # DINO differs on purpose: gors averages a label's tokens, transformers takes the max).
            # A random model's logits are large: where both labels' probabilities round to the same
            # float (often 1.0), gors keeps the first label and transformers the larger logit.
            top_two = caught[0].logits[0].float().sigmoid().topk(2, dim=-1).values
            clear = (top_two[:, 0] - top_two[:, 1] > 1e-6).numpy()[matched]
            assert clear.sum() >= 4
            assert [d.label for d, c in zip(found, clear) if c] == [their_labels[j] for j, c in zip(matched, clear) if c]
            np.testing.assert_allclose([d.score for d in found], [their_scores[j] for j in matched], rtol=0, atol=1e-6)


@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("kind", KINDS)
def test_genuine_boxes_equal_clamped_transformers_boxes(
    detectors: dict[str, ZeroShotDetector], kind: str, sizes: list[tuple[int, int]]
) -> None:
    """The model's own predictions (most reach past a random model's image): gors' boxes are
    transformers' boxes clamped to the image."""
    detector = detectors[kind]
    images = images_of(sizes, seed=2)
    with caught_outputs(detector, replace_boxes=False) as caught:
        got = tables(detector, images)
    expected = transformers_boxes(detector, caught[0], images)
    for image, (_, boxes), want in zip(images, got, expected, strict=True):
        np.testing.assert_allclose(boxes, clamped(want, image), rtol=0, atol=ATOL)
