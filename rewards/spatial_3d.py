"""T2I-CompBench++'s 3D-spatial metric as a reward: a zero-shot detector plus DPT depth."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import Reward, RewardOutput, check_number, same_size_batches
from rewards.detection import Detection, Detector, detection_dict, reward_detector
from rewards.noun_phrases import Backend, parser_record
from rewards.spatial import check_detection_options
from rewards.spatial_3d_rule import (
    IOU_THRESHOLD_3D,
    Spatial3DJudgement,
    find_relation_3d,
    judge_spatial_3d,
    pick_detections_3d,
)
from rewards.spatial_rule import DETECTION_THRESHOLD, resolve_nms_iou, spatial_objects
from rewards.unidet_labels import LabelSpace, split_by_label_space, unnamed_note

DEPTH_FLAG = "depth_model_name_or_path"
DEFAULT_DEPTH_MODEL = "Intel/dpt-hybrid-midas"
# The official script's depth input (UniDet_eval/experts/model_bank_3d.py): `Resize([480, 480])` of the PIL image
# (torchvision's bilinear), then `Normalize(mean=0.5, std=0.5)`; `Intel/dpt-hybrid-midas` is configured for 384.
OFFICIAL_DEPTH_SIZE = 480
DPT_PATCH_SIZE = 16  # every DPT's ViT (MiDaS' DPT-Hybrid and DPT-Large) cuts 16-px patches


class DepthModel(Protocol):
    """Anything that predicts depth like `DepthEstimator.predict` (the reward accepts one ready-built)."""

    def predict(self, images: list[Image.Image]) -> list[np.ndarray]:
        """One (height, width) map per image, at the image's size, in [0, 1] with larger = nearer."""


class DepthEstimator:
    """Relative depth maps from a `transformers` depth model (DPT / MiDaS by default).

    Each map is the model's relative inverse depth (larger = nearer), min-max normalised to
    [0, 1] per image and resized bilinearly (corners aligned) to the image's size, as the official
    script prepares it. A constant prediction gives a map of zeros.

    With `image_size` (the reward gives 480 for its default `Intel/dpt-hybrid-midas`, the MiDaS
    weights of the official DPT-Hybrid), images are prepared as the official script prepares them:
    resized to `image_size` x `image_size` as PIL images (torchvision's bilinear) and normalised with
    mean and std 0.5, and the ViT-hybrid's position embeddings are interpolated to that grid
    (bilinear, as MiDaS does; transformers' DPT-Hybrid otherwise refuses any size but its configured
    384). Without it, the checkpoint's image processor prepares them. The official maps are also
    stored as 8-bit PNGs (steps of 1/255); these stay in float.

    Args:
        model_name_or_path: Hub id or folder of an `AutoModelForDepthEstimation` checkpoint with
            its image processor.
        device, torch_dtype: where and in which dtype the model runs.
        batch_size: images per forward pass.
        flag: the option named in load errors.
        image_size: the official input side in pixels (a DPT-Hybrid's), or None for the processor's.
    """

    def __init__(
        self,
        model_name_or_path: str,
        device: torch.device,
        torch_dtype: torch.dtype = torch.float32,
        batch_size: int = 8,
        flag: str = DEPTH_FLAG,
        image_size: int | None = None,
    ) -> None:
        from transformers import AutoImageProcessor, AutoModelForDepthEstimation

        self.model_name_or_path = str(model_name_or_path)
        self.device, self.torch_dtype, self.batch_size = device, torch_dtype, batch_size
        self.processor = from_pretrained(AutoImageProcessor.from_pretrained, self.model_name_or_path, flag)
        model = from_pretrained(
            AutoModelForDepthEstimation.from_pretrained, self.model_name_or_path, flag, dtype=torch_dtype
        )
        self.model = model.to(device).eval().requires_grad_(False)
        self.official_transform = None
        if image_size is not None:
            dpt = getattr(self.model, "dpt", None)
            if dpt is None:
                raise ValueError(f"{flag}={self.model_name_or_path!r}: depth_image_size={image_size} applies to a DPT "
                                 f"(MiDaS) checkpoint; this one is a {type(self.model).__name__}")
            if image_size % self.model.config.patch_size:
                raise ValueError(f"depth_image_size={image_size}: give a multiple of {self.model_name_or_path}'s "
                                 f"{self.model.config.patch_size}-px patches")
            if hasattr(dpt.embeddings, "image_size"):  # the hybrid's forward refuses other sizes, then interpolates
                dpt.embeddings.image_size = (image_size, image_size)
            self.official_transform = official_depth_transform(image_size)

    @torch.no_grad()
    def predict(self, images: list[Image.Image]) -> list[np.ndarray]:
        """One (height, width) float32 map in [0, 1] per image, larger = nearer. Images of one size share a
        pass: a processor that keeps the aspect ratio (Depth Anything's) gives other sizes other shapes."""
        maps: list[np.ndarray] = [np.empty(0)] * len(images)
        for chunk in same_size_batches(images, range(len(images)), self.batch_size):
            if self.official_transform is None:
                pixels = self.processor(images=[images[i] for i in chunk], return_tensors="pt").pixel_values
            else:
                pixels = torch.stack([self.official_transform(images[i].convert("RGB")) for i in chunk])
            predicted = self.model(pixel_values=pixels.to(self.device, self.torch_dtype)).predicted_depth.float()
            for i, depth in zip(chunk, predicted, strict=True):
                maps[i] = _normalised_map(depth, images[i].size)
        return maps


def official_depth_transform(image_size: int) -> Any:
    """The official script's depth input transform at `image_size` (a torchvision `Compose` of a PIL image)."""
    from torchvision import transforms

    return transforms.Compose([transforms.Resize([image_size, image_size]), transforms.ToTensor(),
                               transforms.Normalize(mean=0.5, std=0.5)])


def _normalised_map(depth: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Min-max normalise a (h, w) prediction, then resize it to `size` = (width, height)."""
    low, high = depth.min(), depth.max()
    depth = (depth - low) / (high - low) if high > low else torch.zeros_like(depth)
    width, height = size
    resized = torch.nn.functional.interpolate(
        depth[None, None], size=(height, width), mode="bilinear", align_corners=True
    )
    return resized[0, 0].clamp(0, 1).cpu().numpy()


class Spatial3DReward(Reward):
    """T2I-CompBench++'s 3D-spatial score ("in front of", "behind", "hidden by"), in [0, 1].

    The rule (`rewards.spatial_3d_rule`) follows the official ``UniDet_eval/3D_spatial_eval.py``:
    relation word, two object names, their detections, each box's mean depth on a DPT depth
    map, ``0.25 * s1 + 0.25 * s2 + 0.5 * depth_order`` (no floor).

    Differences from the official code:

    - Detector: the official UniDet has no installable implementation; the default here is the
      2D rule's (`spatial_rule`), OWLv2 `google/owlv2-base-patch16-ensemble`, queried with the
      two object names; any Grounding DINO / MM-Grounding-DINO / OWLv2 checkpoint can be given.
      Its confidences are on another scale than UniDet's while UniDet's rule is kept (every
      (box, label) pair above 0.1, non-maximum suppression per label at IoU 0.5), so
      numbers are comparable in kind, not digit for digit (see `rewards.spatial.SpatialRuleReward`).
    - Depth: the same MiDaS DPT-Hybrid weights through transformers, at the official 480 x 480 input
      (see `DepthEstimator`).
    - The official script resizes images to 479 x 479 before detection and depth; here both run
      on the image as given (IoU and the depth order do not depend on the scale).
    - Object names: the official rule over part-of-speech tags, exact where spaCy is installed
      (the official parser), else the built-in parser's approximation of its tags.

    - Label space: the official code takes a detection whose UniDet label contains a name as that
      object, so a name that no label contains ("painting", "wallet") is never found; it is not
      asked for here either (`label_space="unidet"`, `rewards.unidet_labels`; "open" asks for every
      name). Boxes of a label that merely contains a name ("monkey" for "key") are not reproduced:
      the detector is asked for the names themselves.

    Official quirk kept: a prompt without a 3D relation word scores its objects with depth order 0
    (up to 0.5).

    Args:
        model_name_or_path: detector checkpoint (Hub id or folder); default OWLv2.
        device, torch_dtype, batch_size: see `Reward`; batch_size is images per model pass.
        depth_model_name_or_path: depth checkpoint; default `Intel/dpt-hybrid-midas`.
        detector: an already-built detector (`ZeroShotDetector.detect`'s signature).
        depth_model: an already-built depth model (`DepthEstimator.predict`'s signature).
        threshold, text_threshold, nms_iou: how boxes are kept and labelled, as for
            `rewards.spatial.SpatialRuleReward` (official: UniDet's 0.1, per-label NMS at IoU 0.5).
        iou_threshold: the depth rule's IoU threshold (official 0.5).
        transposed_depth: cut box regions from the depth map with x as the row index, as the
            official code does (False: the box itself).
        person_mapping: girl/boy/man/woman are detected as "person" (official).
        noun_phrase_backend: see `rewards.noun_phrases.noun_phrases`.
        depth_image_size: the depth model's input side (see `DepthEstimator`); default 480, the official
            script's, for `Intel/dpt-hybrid-midas`, the processor's size for any other checkpoint (a local
            copy of the default is not recognised by its path: pass 480).
        label_space: "unidet" (only names some UniDet label contains are asked for, official) or "open".
    """

    name = "spatial_3d"
    # T2I-CompBench++'s scripts run UniDet and DPT depth under float16 autocast (`Accelerator(mixed_precision=
    # 'fp16')`); the detectors here are other models, and both run in float32, the more exact.
    official_dtype = torch.float32
    # 6: names no UniDet label contains are never found (`label_space="unidet"`);
    # 5: the default depth model reads the official 480 x 480 input (it read its processor's 384); 4: object names by
    # the official part-of-speech rule (spaCy's tags where installed; "a coffee table": "coffee"),
    # names matched as parts of labels, a prompt without a relation word scored on its objects (all as officially);
    # 3: a Grounding DINO detector's labels score the mean over their tokens, each phrase its own probability
    # (the default OWLv2 scores as in 2); 2: UniDet's 0.1 threshold and per-class NMS; 1: 0.5, no NMS
    scoring_version = 6
    default_model = "google/owlv2-base-patch16-ensemble"
    model_objects = {"model_name_or_path": "detector", "depth_model_name_or_path": "depth_model"}
    categories = ("3d_spatial",)
    description = (
        "T2I-CompBench++ 3D-spatial rule (in front of / behind / hidden by: detector boxes and "
        "their mean DPT depth; default OWLv2 + Intel/dpt-hybrid-midas)"
    )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse detection options `check_detection_options` refuses, an `iou_threshold` outside (0, 1] and a
        `depth_image_size` that is no whole number of 16-px patches."""
        check_detection_options(options)
        if "iou_threshold" in options:
            check_number("iou_threshold", options["iou_threshold"], 0.0, 1.0, open_low=True)
        size = options.get("depth_image_size")
        check_number("depth_image_size", size, DPT_PATCH_SIZE, math.inf, optional=True)
        if size is not None and (not isinstance(size, int) or size % DPT_PATCH_SIZE):
            raise ValueError(f"depth_image_size={size!r}: give a multiple of the DPT's {DPT_PATCH_SIZE}-px patches, "
                             f"e.g. {OFFICIAL_DEPTH_SIZE}")

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        depth_model_name_or_path: str = DEFAULT_DEPTH_MODEL,
        detector: Detector | None = None,
        depth_model: DepthModel | None = None,
        threshold: float = DETECTION_THRESHOLD,
        text_threshold: float | None = None,
        nms_iou: float | None = None,
        iou_threshold: float = IOU_THRESHOLD_3D,
        transposed_depth: bool = True,
        person_mapping: bool = True,
        noun_phrase_backend: Backend = "auto",
        depth_image_size: int | None = None,
        label_space: LabelSpace = "unidet",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"threshold": threshold, "text_threshold": text_threshold, "nms_iou": nms_iou,
                            "iou_threshold": iou_threshold, "noun_phrase_backend": noun_phrase_backend,
                            "depth_image_size": depth_image_size, "label_space": label_space})
        self.label_space = label_space
        self.threshold, self.text_threshold, self.iou_threshold = threshold, text_threshold, iou_threshold
        self.nms_iou = resolve_nms_iou(text_threshold, nms_iou)
        self.transposed_depth = transposed_depth
        self.person_mapping = person_mapping
        self.noun_phrase_backend = noun_phrase_backend
        self.parser = parser_record(noun_phrase_backend)
        self.detector = reward_detector(self, detector)
        if depth_model is not None and depth_image_size is not None:
            raise ValueError("depth_image_size sets the input of the depth model the reward loads; a depth_model "
                             "given ready-built prepares its own input")
        if depth_model is None:
            if depth_image_size is None and depth_model_name_or_path == DEFAULT_DEPTH_MODEL:
                depth_image_size = OFFICIAL_DEPTH_SIZE
            depth_model = DepthEstimator(depth_model_name_or_path, self.device, self.torch_dtype, self.batch_size,
                                         image_size=depth_image_size)
        self.depth_model = depth_model

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        relations = [find_relation_3d(prompt) for prompt in prompts]
        objects = [
            spatial_objects(prompt, backend=self.noun_phrase_backend, person_mapping=self.person_mapping)
            for prompt in prompts
        ]
        # Without a relation too: its objects still count. Asked for: the names the label space has.
        asked = {i: split_by_label_space(names, self.label_space, exact=False)
                 for i, names in enumerate(objects) if names}
        todo = [i for i, (named, _) in asked.items() if named]
        found = dict(zip(todo, self.detector.detect(
            [images[i] for i in todo],
            [asked[i][0] for i in todo],
            threshold=self.threshold,
            text_threshold=self.text_threshold,
            nms_iou=self.nms_iou,
        ), strict=True))
        picked = {i: pick_detections_3d(found.get(i, []), objects[i]) for i in asked}  # type: ignore[arg-type]
        # Depth only matters (and is only computed) where both objects were found under a relation word.
        need_depth = [i for i, (first, second) in picked.items()
                      if relations[i] and first is not None and second is not None]
        depth_maps = dict(zip(need_depth, self.depth_model.predict([images[i] for i in need_depth]), strict=True))
        scores, details = [], []
        for i, (relation, names) in enumerate(zip(relations, objects, strict=True)):
            first, second = picked.get(i, (None, None))
            verdict = self._verdict(i, relation, names, first, second, depth_maps)
            unnamed = asked[i][1] if i in asked else []
            scores.append(verdict.score)
            details.append(
                {
                    "relation": relation,
                    "objects": list(names) if names else None,
                    "parser": self.parser,  # which tagger found the names (spaCy's: the official ones)
                    # Names no UniDet label contains: never asked for, never found (`rewards.unidet_labels`).
                    "not_in_label_space": unnamed,
                    "first": detection_dict(first),
                    "second": detection_dict(second),
                    "depths": list(verdict.depths),
                    "depth_order": verdict.depth_order,
                    "score": verdict.score,
                    "reason": verdict.reason + unnamed_note(unnamed, exact=False),
                }
            )
        return RewardOutput(scores=scores, details=details)

    def _verdict(
        self,
        index: int,
        relation: str | None,
        names: Sequence[str] | None,
        first: Detection | None,
        second: Detection | None,
        depth_maps: dict[int, np.ndarray],
    ) -> Spatial3DJudgement:
        if names is None:
            return Spatial3DJudgement(0.0, None, (None, None), "the prompt does not name two objects")
        # Without both objects the depth map is never read (nor computed); an empty one stands in.
        depth_map = depth_maps.get(index, np.zeros((0, 0), dtype=np.float32))
        return judge_spatial_3d(
            relation, first, second, depth_map, self.iou_threshold, self.transposed_depth
        )
