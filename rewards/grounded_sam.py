"""Grounded-SAM attribute binding (GORS-unbiased reward for colour, shape and texture prompts).

Grounding DINO finds the prompt's objects and attributes, SAM segments each detected box, and
each (attribute, object) pair of the prompt scores how well an attribute region coincides with
an object region; the rules are the pure functions of `rewards.binding`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import MODEL_FLAG, Reward, RewardOutput, check_choice, check_number
from rewards.binding import (
    BindingPhrase,
    Segment,
    binding_phrases,
    binding_score,
    query_labels,
)
from rewards.detection import Detection, Detector, ZeroShotDetector
from rewards.noun_phrases import BACKENDS, Backend

SAM_FLAG = "sam_model_name_or_path"
Box = tuple[float, float, float, float]
# images, and per image its boxes (x0, y0, x1, y1 pixels) -> per image one boolean
# (height x width) mask per box, in box order.
Segmenter = Callable[[list[Image.Image], list[list[Box]]], list[list[np.ndarray]]]


class SamSegmenter:
    """Box-prompted SAM masks (`SamModel` + `SamProcessor`), one mask per box.

    Each box gives SAM's single best mask (`multimask_output=False`, as Grounded-SAM does with
    box prompts), upsampled to the image and binarised at logit 0.

    Args:
        model_name_or_path: SAM checkpoint, Hub id or folder (e.g. `facebook/sam-vit-huge`).
        device, torch_dtype: where and in which dtype SAM runs.
        batch_size: images per forward pass.
        flag: the option named in load errors.
    """

    def __init__(
        self,
        model_name_or_path: str,
        device: str | torch.device,
        torch_dtype: torch.dtype = torch.float32,
        batch_size: int = 8,
        flag: str = SAM_FLAG,
    ) -> None:
        from transformers import SamModel, SamProcessor

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        self.torch_dtype = torch_dtype
        self.batch_size = batch_size
        path = str(model_name_or_path)
        self.processor = from_pretrained(SamProcessor.from_pretrained, path, flag)
        model = from_pretrained(SamModel.from_pretrained, path, flag, dtype=torch_dtype)
        self.model = model.to(self.device).eval().requires_grad_(False)

    @torch.no_grad()
    def __call__(self, images: list[Image.Image], boxes: list[list[Box]]) -> list[list[np.ndarray]]:
        """Per image, one boolean (height x width) mask per box; images without boxes get []."""
        if len(images) != len(boxes):
            raise ValueError(f"{len(images)} images but {len(boxes)} box lists")
        masks: list[list[np.ndarray]] = [[] for _ in images]
        todo = [i for i, image_boxes in enumerate(boxes) if image_boxes]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            # The processor needs as many boxes for every image of a batch: repeat an image's
            # first box. SAM decodes each box prompt independently, so the copies change nothing.
            count = max(len(boxes[i]) for i in chunk)
            padded = [
                [list(b) for b in boxes[i]] + [list(boxes[i][0])] * (count - len(boxes[i]))
                for i in chunk
            ]
            inputs = self.processor(
                images=[images[i] for i in chunk], input_boxes=padded, return_tensors="pt"
            )
            outputs = self.model(
                pixel_values=inputs["pixel_values"].to(self.device, self.torch_dtype),
                input_boxes=inputs["input_boxes"].to(self.device, self.torch_dtype),
                multimask_output=False,
            )
            full = self.processor.image_processor.post_process_masks(
                list(outputs.pred_masks.float().cpu()),
                inputs["original_sizes"],
                inputs["reshaped_input_sizes"],
            )
            for i, image_masks in zip(chunk, full, strict=True):
                masks[i] = [m[0].numpy() for m in image_masks[: len(boxes[i])]]
        return masks


class GroundedSAMReward(Reward):
    """Attribute binding by Grounding DINO boxes and SAM masks; scores in [0, 1].

    T2I-CompBench (GORS-unbiased) only says that the binding is the IoU of the attribute's and
    the object's masks combined with the grounding confidence; this is our exact rule:

    1. Pairs: each noun phrase of the prompt splits into attribute words and object words
       (`rewards.binding.split_phrase`: "a green bench" -> ("green", "bench"), "a triangular
       slice of pizza" -> ("triangular", "slice"), "a cylindrical pizza cutter" ->
       ("cylindrical", "pizza cutter")).
    2. Detection, in two passes per image: one queries the objects, one the attribute phrases
       (box_threshold 0.35, text_threshold 0.25). Separate passes give one box a confidence
       as "bench" and another as "green" (in one joint query its confidence is that of its
       best phrase, whichever kind), keep "orange" the fruit apart from "orange" the colour
       (a detection names one query label), and make attributes compete only with attributes.
    3. SAM segments every detected box (box prompt, single mask).
    4. Pair score = max over object detections o and attribute detections a of
       IoU(mask_o, mask_a) * sqrt(conf_o * conf_a): the overlap of an attribute region with
       the object, weighted by the geometric mean of the two confidences. 0 (with a reason)
       when the object or the attribute is not detected.
    5. Image score = mean of the pair scores. A prompt without attribute words scores object
       presence (mean over its objects of the best confidence of that object, 0 when missing);
       a prompt without any object scores 0.

    Args:
        model_name_or_path: Grounding DINO checkpoint (Hub id or folder); default
            `IDEA-Research/grounding-dino-base`. MM-Grounding-DINO and OWLv2 also load.
        sam_model_name_or_path: SAM checkpoint; default `facebook/sam-vit-huge`.
        device, torch_dtype: where and in which dtype both models run (see `Reward`).
        batch_size: images per forward pass of each model.
        box_threshold: minimum detection confidence, in [0, 1].
        text_threshold: Grounding DINO's phrase threshold in [0, 1]: a kept box is reported for
            every queried phrase whose probability reaches it (with the box's confidence);
            None reports each box for its best phrase only.
        noun_phrase_backend: the prompt parser, see `rewards.noun_phrases`.
        detector: an already-built detector with `ZeroShotDetector.detect`'s signature (then
            `model_name_or_path` is not loaded).
        segmenter: a callable (images, boxes per image) -> masks per image, replacing SAM (then
            `sam_model_name_or_path` is not loaded).
    """

    name = "grounded_sam"
    # 2: each phrase of a box at its own probability, a label at the mean over its tokens, a prompt
    # without objects 0 (1: every phrase at the box's best, the maximum over tokens, 1)
    scoring_version = 2
    default_model = "IDEA-Research/grounding-dino-base"
    model_objects = {"model_name_or_path": "detector", "sam_model_name_or_path": "segmenter"}
    default_sam_model = "facebook/sam-vit-huge"
    categories = ("color", "shape", "texture")
    description = (
        "Attribute binding: IoU of the attribute's and the object's SAM masks x geometric mean "
        "of their Grounding DINO confidences, averaged over the prompt's (attribute, object) pairs."
    )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse thresholds outside [0, 1] (text_threshold may be None) and an unknown parser."""
        if "box_threshold" in options:
            check_number("box_threshold", options["box_threshold"])
        if "text_threshold" in options:
            check_number("text_threshold", options["text_threshold"], optional=True)
        if "noun_phrase_backend" in options:
            check_choice("noun_phrase_backend", options["noun_phrase_backend"], BACKENDS)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        sam_model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        box_threshold: float = 0.35,
        text_threshold: float | None = 0.25,
        noun_phrase_backend: Backend = "auto",
        detector: Detector | None = None,
        segmenter: Segmenter | None = None,
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"box_threshold": box_threshold, "text_threshold": text_threshold,
                            "noun_phrase_backend": noun_phrase_backend})
        self.box_threshold = box_threshold
        self.text_threshold = text_threshold
        self.noun_phrase_backend = noun_phrase_backend
        self.sam_model_name_or_path = sam_model_name_or_path or self.default_sam_model
        if detector is None:
            detector = ZeroShotDetector(
                str(self.model_name_or_path), self.device, self.torch_dtype, batch_size, MODEL_FLAG
            )
        if segmenter is None:
            segmenter = SamSegmenter(
                self.sam_model_name_or_path, self.device, self.torch_dtype, batch_size
            )
        self.detector, self.segmenter = detector, segmenter

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        phrases = [binding_phrases(p, self.noun_phrase_backend) for p in prompts]
        labels = [query_labels(p) for p in phrases]
        objects = self._detect(images, [objs for objs, _ in labels])
        attributes = self._detect(images, [attrs for _, attrs in labels])
        masks = self._segment(images, objects, attributes)
        scores, details = [], []
        for image_phrases, found_objects, found_attributes, (object_masks, attribute_masks) in zip(
            phrases, objects, attributes, masks, strict=True
        ):
            score, explanation = binding_score(
                image_phrases,
                _segments(found_objects, object_masks),
                _segments(found_attributes, attribute_masks),
            )
            scores.append(score)
            details.append(
                {
                    "phrases": [_phrase_dict(p) for p in image_phrases],
                    **explanation,
                    "detections": {
                        "objects": [d.to_dict() for d in found_objects],
                        "attributes": [d.to_dict() for d in found_attributes],
                    },
                }
            )
        return RewardOutput(scores=scores, details=details)

    def _detect(self, images: list[Image.Image], labels: list[list[str]]) -> list[list[Detection]]:
        if not any(labels):
            return [[] for _ in images]
        return self.detector.detect(
            images, labels, threshold=self.box_threshold, text_threshold=self.text_threshold
        )

    def _segment(
        self,
        images: list[Image.Image],
        objects: list[list[Detection]],
        attributes: list[list[Detection]],
    ) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        """Masks of each image's object and attribute detections; SAM sees each box once."""
        unique = [
            list(dict.fromkeys(d.box for d in [*found_objects, *found_attributes]))
            for found_objects, found_attributes in zip(objects, attributes, strict=True)
        ]
        masks = self.segmenter(images, unique)
        result = []
        for boxes, image_masks, found_objects, found_attributes in zip(
            unique, masks, objects, attributes, strict=True
        ):
            if len(image_masks) != len(boxes):
                raise RuntimeError(f"the segmenter gave {len(image_masks)} masks for {len(boxes)} boxes")
            by_box = dict(zip(boxes, image_masks, strict=True))
            result.append(
                ([by_box[d.box] for d in found_objects], [by_box[d.box] for d in found_attributes])
            )
        return result


def _segments(detections: Sequence[Detection], masks: Sequence[np.ndarray]) -> list[Segment]:
    return [
        Segment(label=d.label, confidence=d.score, mask=m)
        for d, m in zip(detections, masks, strict=True)
    ]


def _phrase_dict(phrase: BindingPhrase) -> dict[str, str]:
    return {"phrase": phrase.phrase, "attribute": phrase.attribute, "object": phrase.object}
