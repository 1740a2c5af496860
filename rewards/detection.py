"""Open-vocabulary object detection with `transformers`: Grounding DINO, MM-Grounding-DINO, OWLv2.

`ZeroShotDetector` wraps any checkpoint that `AutoModelForZeroShotObjectDetection` loads with one
of these model types and returns, per image, `Detection`s whose `label` is exactly one of the
query strings passed for that image.

How a box gets its label and score, per model family:

- Grounding DINO / MM-Grounding-DINO score every box against every *token* of one text
  "label one. label two." We build that text ourselves and record which tokens belong to which
  label, so a box maps back to the query label by token position, never by decoding and
  re-matching text. A box's probability for a label is the mean sigmoid probability over the
  label's tokens, as GLIP's and MM-Grounding-DINO's heads turn token scores into class scores
  (mmdetection's `convert_grounding_to_cls_scores`): with the maximum, "pizza cutter" would fire
  on any pizza. (transformers' and IDEA's box score is the maximum over all tokens.)
- OWLv2 / OWL-ViT score every box against every query separately: one sigmoid probability per
  (box, label).

`select_detections` then applies the thresholds to the (boxes x labels) probability table:
without `text_threshold` each box keeps its best label (OWL's rule); with it, a box whose best
probability reaches `threshold` is reported for every label whose probability reaches
`text_threshold` (Grounding DINO's phrase rule, where one box can name several phrases), each
with its own probability as its score (IDEA's pipeline gives every phrase the box's best, which
would let a box of one colour count as every colour above `text_threshold`). `per_class_detections` is detectron2's rule, which
the T2I-CompBench UniDet metrics run: every (box, label) pair above the threshold, scored by its
own probability, then non-maximum suppression per label (`detect(..., nms_iou=...)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import MODEL_FLAG, Reward, same_size_batches

GROUNDING_DINO_TYPES = ("grounding-dino", "mm-grounding-dino")
OWL_TYPES = ("owlv2", "owlvit")
# Grounding DINO splits its text into phrases at these characters (BERT ids 1012 and 1029).
_PHRASE_DELIMITERS = (".", "?")


@dataclass(frozen=True)
class Detection:
    """One detected object.

    Attributes:
        label: the query label it matched, exactly one of the strings passed for its image.
        score: detector confidence in [0, 1].
        box: (x_min, y_min, x_max, y_max) in pixels of the input image, clipped to the image.
    """

    label: str
    score: float
    box: tuple[float, float, float, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: label, score, box (a list of 4 pixel coordinates)."""
        return {"label": self.label, "score": self.score, "box": list(self.box)}


def detection_dict(detection: Detection | None) -> dict[str, Any] | None:
    """`Detection.to_dict`, or None for an object that was not found."""
    return None if detection is None else detection.to_dict()


class Detector(Protocol):
    """Anything that detects like `ZeroShotDetector.detect` (rewards accept one ready-built)."""

    def detect(
        self,
        images: list[Image.Image],
        labels: list[list[str]],
        threshold: float,
        text_threshold: float | None = None,
        nms_iou: float | None = None,
    ) -> list[list[Detection]]:
        """Per image, the detections of its `labels` with confidence >= `threshold` (in [0, 1]), most
        confident first, each box (x_min, y_min, x_max, y_max) in pixels of that image."""


def select_detections(
    probabilities: np.ndarray,
    boxes: np.ndarray,
    labels: Sequence[str],
    threshold: float,
    text_threshold: float | None = None,
) -> list[Detection]:
    """Detections from a (boxes x labels) probability table, most confident first.

    Args:
        probabilities: shape (num_boxes, num_labels), values in [0, 1].
        boxes: shape (num_boxes, 4), (x_min, y_min, x_max, y_max) in pixels.
        labels: the label of each column.
        threshold: a box is kept when its best probability is >= threshold; that probability is
            its score.
        text_threshold: None: a kept box is reported once, for its best label. A number: a kept
            box is reported for every label whose probability is >= text_threshold, each scored by
            its own probability.

    Ties in score keep the box order; several labels of one box keep the label order.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.shape != (len(boxes), len(labels)):
        raise ValueError(
            f"probabilities has shape {probabilities.shape}, expected ({len(boxes)}, {len(labels)})"
        )
    if not labels:
        return []
    found: list[Detection] = []
    best = probabilities.argmax(axis=1)
    # Only the few boxes above the threshold are looked at one by one (there are hundreds).
    for index in np.flatnonzero(probabilities[np.arange(len(best)), best] >= threshold):
        row = probabilities[index]
        chosen = [best[index]] if text_threshold is None else np.flatnonzero(row >= text_threshold)
        box_tuple = tuple(float(v) for v in boxes[index])
        found += [Detection(labels[k], float(row[k]), box_tuple) for k in chosen]  # type: ignore[arg-type]
    return sorted(found, key=lambda d: -d.score)


def per_class_detections(
    probabilities: np.ndarray,
    boxes: np.ndarray,
    labels: Sequence[str],
    threshold: float,
    nms_iou: float,
) -> list[Detection]:
    """detectron2's `fast_rcnn_inference` on a (boxes x labels) probability table, most confident first.

    Every (box, label) pair whose probability is above `threshold` (strictly, as detectron2) is a
    detection scored by that probability, so one box may name several labels; then, per label,
    a detection overlapping a more confident one by IoU above `nms_iou` is dropped
    (`torchvision.ops.batched_nms`, as detectron2). Shapes as in `select_detections`.
    """
    from torchvision.ops import batched_nms

    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.shape != (len(boxes), len(labels)):
        raise ValueError(
            f"probabilities has shape {probabilities.shape}, expected ({len(boxes)}, {len(labels)})"
        )
    rows, columns = np.nonzero(probabilities > threshold)
    if not len(rows):
        return []
    scores = torch.from_numpy(probabilities[rows, columns])
    kept = batched_nms(torch.as_tensor(np.asarray(boxes, dtype=np.float64)[rows]), scores,
                       torch.from_numpy(columns), nms_iou)
    return [Detection(labels[columns[k]], float(scores[k]), tuple(float(v) for v in boxes[rows[k]]))
            for k in kept.tolist()]  # batched_nms returns them by decreasing score


def _clip_boxes(corners: torch.Tensor, width: int, height: int) -> np.ndarray:
    limits = torch.tensor([width, height, width, height], dtype=corners.dtype)
    return torch.minimum(corners.clamp(min=0), limits).numpy()


def _corners(center_boxes: torch.Tensor) -> torch.Tensor:
    """(cx, cy, w, h) -> (x_min, y_min, x_max, y_max), same units."""
    cx, cy, w, h = center_boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


class ZeroShotDetector:
    """Open-vocabulary detector from transformers: Grounding DINO, MM-Grounding-DINO or OWLv2.

    The family is chosen by the checkpoint's config `model_type`, loaded through
    `AutoModelForZeroShotObjectDetection` + `AutoProcessor`.

    Args:
        model_name_or_path: Hub id (e.g. `IDEA-Research/grounding-dino-base`,
            `google/owlv2-base-patch16-ensemble`) or local folder.
        device: where the model runs.
        torch_dtype: dtype of the weights and pixel values.
        batch_size: images per forward pass.
        flag: the command-line flag named in load errors.
    """

    def __init__(
        self,
        model_name_or_path: str,
        device: str | torch.device,
        torch_dtype: torch.dtype = torch.float32,
        batch_size: int = 8,
        flag: str = MODEL_FLAG,
    ) -> None:
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_name_or_path = str(model_name_or_path)
        self.device = torch.device(device)
        self.torch_dtype = torch_dtype
        self.batch_size = batch_size
        self.processor = from_pretrained(AutoProcessor.from_pretrained, self.model_name_or_path, flag)
        model = from_pretrained(
            AutoModelForZeroShotObjectDetection.from_pretrained,
            self.model_name_or_path,
            flag,
            dtype=torch_dtype,
        )
        self.model_type: str = model.config.model_type
        if self.model_type not in GROUNDING_DINO_TYPES + OWL_TYPES:
            raise ValueError(
                f"{flag}={self.model_name_or_path!r} is a {self.model_type!r} model; the detector "
                f"supports {', '.join(GROUNDING_DINO_TYPES + OWL_TYPES)} checkpoints."
            )
        self.model = model.to(self.device).eval().requires_grad_(False)

    @torch.no_grad()
    def detect(
        self,
        images: list[Image.Image],
        labels: list[list[str]],
        threshold: float,
        text_threshold: float | None = None,
        nms_iou: float | None = None,
    ) -> list[list[Detection]]:
        """Per image: detections of its labels with score >= threshold, most confident first.

        Args:
            images: PIL images (converted to RGB here).
            labels: the query labels of each image; a detection's `label` is one of these exact
                strings. Duplicates are queried once; an empty list gives no detections.
            threshold: minimum confidence in [0, 1].
            text_threshold: see `select_detections`; None reports each box once.
            nms_iou: detectron2's rule instead (`per_class_detections`): every (box, label) pair
                above `threshold`, suppressed per label above this IoU. Not with `text_threshold`.
        """
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} label lists")
        for name, value in (("threshold", threshold), ("text_threshold", text_threshold), ("nms_iou", nms_iou)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if nms_iou is not None and text_threshold is not None:
            raise ValueError("nms_iou (detectron2's per-class rule) and text_threshold (Grounding DINO's phrase "
                             "rule) are two ways to label boxes: give one of them")
        queries = [list(dict.fromkeys(image_labels)) for image_labels in labels]
        for image_labels in queries:
            for label in image_labels:
                if not isinstance(label, str) or not label.strip(" .?"):
                    raise ValueError(f"Detection labels must be non-empty words, got {label!r}")
        rgb = [image if image.mode == "RGB" else image.convert("RGB") for image in images]
        results: list[list[Detection]] = [[] for _ in rgb]
        # Only images of one size share a forward pass: Grounding DINO pads a batch to its
        # largest image and its Swin backbone sees the padding, which would make an image's
        # detections depend on its batch mates. (Generated training images all share one size.)
        for chunk in same_size_batches(rgb, (i for i, q in enumerate(queries) if q), self.batch_size):
            chunk_images = [rgb[i] for i in chunk]
            chunk_labels = [queries[i] for i in chunk]
            if self.model_type in GROUNDING_DINO_TYPES:
                tables = self._grounding_dino_tables(chunk_images, chunk_labels)
            else:
                tables = self._owl_tables(chunk_images, chunk_labels)
            for i, image_labels, (probs, boxes) in zip(chunk, chunk_labels, tables, strict=True):
                results[i] = (select_detections(probs, boxes, image_labels, threshold, text_threshold)
                              if nms_iou is None else per_class_detections(probs, boxes, image_labels, threshold,
                                                                           nms_iou))
        return results

    # ----------------------------------------------------------------------------------------
    # Grounding DINO and MM-Grounding-DINO

    def grounding_text(self, labels: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of "label one. label two." and each label's [start, end) token span.

        Labels are lower-cased (the checkpoints use uncased BERT) and their "." and "?" become
        spaces, since the model splits the text into phrases at those tokens.
        """
        tokenizer = self.processor.tokenizer
        dot = tokenizer.convert_tokens_to_ids(".")
        ids = [tokenizer.cls_token_id]
        spans = []
        for label in labels:
            text = label.lower()
            for char in _PHRASE_DELIMITERS:
                text = text.replace(char, " ")
            tokens = tokenizer(text.strip(), add_special_tokens=False).input_ids
            spans.append((len(ids), len(ids) + len(tokens)))
            ids += tokens + [dot]
        ids.append(tokenizer.sep_token_id)
        max_len = self.model.config.max_text_len
        if len(ids) > max_len:
            raise ValueError(
                f"{len(labels)} labels take {len(ids)} tokens; {self.model_name_or_path} reads at "
                f"most {max_len}. Pass fewer or shorter labels per image."
            )
        return ids, spans

    def _grounding_dino_tables(
        self, images: list[Image.Image], labels: list[list[str]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        texts = [self.grounding_text(image_labels) for image_labels in labels]
        length = max(len(ids) for ids, _ in texts)
        input_ids = torch.zeros((len(texts), length), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, (ids, _) in enumerate(texts):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
        pixels = self.processor.image_processor(images, return_tensors="pt")
        outputs = self.model(
            pixel_values=pixels.pixel_values.to(self.device, self.torch_dtype),
            pixel_mask=pixels.pixel_mask.to(self.device),
            input_ids=input_ids.to(self.device),
            token_type_ids=torch.zeros_like(input_ids).to(self.device),
            attention_mask=attention_mask.to(self.device),
        )
        token_probs = outputs.logits.float().sigmoid().cpu()  # (batch, queries, max_text_len)
        # Boxes are relative to each image's own (unpadded) size, as in DETR.
        center_boxes = outputs.pred_boxes.float().cpu()
        tables = []
        for row, (image, (_, spans)) in enumerate(zip(images, texts, strict=True)):
            probs = torch.stack(
                [token_probs[row, :, start:end].mean(dim=-1) for start, end in spans], dim=-1
            )
            width, height = image.size
            scale = torch.tensor([width, height, width, height], dtype=torch.float32)
            boxes = _clip_boxes(_corners(center_boxes[row]) * scale, width, height)
            tables.append((probs.numpy(), boxes))
        return tables

    # ----------------------------------------------------------------------------------------
    # OWLv2 and OWL-ViT

    def _owl_tables(
        self, images: list[Image.Image], labels: list[list[str]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        # Every image gets the same number of queries; the padding columns are ignored below.
        count = max(len(image_labels) for image_labels in labels)
        padded = [image_labels + [" "] * (count - len(image_labels)) for image_labels in labels]
        text = self.processor.tokenizer(
            [q for image_labels in padded for q in image_labels],
            padding="max_length",
            truncation=True,
            return_tensors="pt",
        )
        pixels = self.processor.image_processor(images, return_tensors="pt")
        outputs = self.model(
            pixel_values=pixels.pixel_values.to(self.device, self.torch_dtype),
            input_ids=text.input_ids.to(self.device),
            attention_mask=text.attention_mask.to(self.device),
        )
        probs = outputs.logits.float().sigmoid().cpu()  # (batch, boxes, queries)
        center_boxes = outputs.pred_boxes.float().cpu()
        tables = []
        for row, (image, image_labels) in enumerate(zip(images, labels, strict=True)):
            width, height = image.size
            # OWLv2 pads each image to a square at the bottom and right before resizing, so its
            # boxes are fractions of the longer side; OWL-ViT resizes without padding.
            if self.model_type == "owlv2":
                scale = torch.tensor([max(width, height)] * 4, dtype=torch.float32)
            else:
                scale = torch.tensor([width, height, width, height], dtype=torch.float32)
            boxes = _clip_boxes(_corners(center_boxes[row]) * scale, width, height)
            tables.append((probs[row, :, : len(image_labels)].numpy(), boxes))
        return tables


def reward_detector(reward: Reward, detector: Detector | None) -> Detector:
    """The detector of a detector-based reward: `detector` when given (the reward's
    `model_name_or_path` then names it), else a `ZeroShotDetector` of `reward.model_name_or_path`
    on the reward's device, dtype and batch size."""
    if detector is None:
        return ZeroShotDetector(str(reward.model_name_or_path), reward.device, reward.torch_dtype, reward.batch_size)
    reward.model_name_or_path = getattr(detector, "model_name_or_path", "custom detector")
    return detector
