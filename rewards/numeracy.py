"""T2I-CompBench++'s numeracy metric as a reward: detector counts of the prompt's objects."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from rewards.base import Reward, RewardOutput
from rewards.detection import Detector, reward_detector
from rewards.numeracy_rule import (
    OFFICIAL_RENAMES,
    NounList,
    counted_objects,
    deduplicate,
    judge_numeracy,
    load_noun_list,
)
from rewards.spatial import check_detection_options
from rewards.spatial_rule import DETECTION_THRESHOLD, resolve_nms_iou
from rewards.unidet_labels import LabelSpace, split_by_label_space, unnamed_note


class NumeracyReward(Reward):
    """T2I-CompBench++'s numeracy score of (image, prompt) pairs, in [0, 1].

    The rule (`rewards.numeracy_rule`) follows the official ``UniDet_eval/numeracy_eval.py``:
    objects and counts from number words before nouns of the official noun list, near-duplicate
    boxes merged, and per object (weight 1/n) half for being detected, half for the exact count.

    Differences from the official code: the detector (UniDet in the official code, not
    installable) is the 2D spatial rule's, OWLv2 `google/owlv2-base-patch16-ensemble` by default
    (any Grounding DINO / MM-Grounding-DINO / OWLv2 checkpoint can be given), queried with the
    asked object names with UniDet's rule (every (box, label) pair above 0.1, non-maximum
    suppression per label at IoU 0.5); its confidences are on another scale, so
    numbers are comparable in kind, not digit for digit. As the official code counts the boxes
    whose UniDet label contains an object's name, a name that no label contains is never found;
    it is not asked for here either (`label_space="unidet"`, `rewards.unidet_labels`; "open" asks
    for every name). See `rewards.numeracy_rule` for the prompt parsing.

    Args:
        model_name_or_path: detector checkpoint (Hub id or folder); default OWLv2.
        device, torch_dtype, batch_size: see `Reward`; batch_size is images per detector pass.
        detector: an already-built detector (`ZeroShotDetector.detect`'s signature).
        threshold, text_threshold, nms_iou: how boxes are kept and labelled, as for
            `rewards.spatial.SpatialRuleReward` (official: UniDet's 0.1, per-label NMS at IoU 0.5).
        noun_file: a "singular - plural" noun list; None reads the official `new_objects.txt`
            (downloaded pinned and checksummed, or from GORS_DATA_DIR).
        official_renames: detect boy/girl/man/woman as "person", ship as "boat" and so on, as the
            official code maps nouns to UniDet's classes (False: detect the nouns as written).
        label_space: "unidet" (only names some UniDet label contains are asked for, official) or "open".
    """

    name = "numeracy"
    # T2I-CompBench++'s scripts run UniDet under float16 autocast (`Accelerator(mixed_precision='fp16')`); the
    # detectors here are other models, run in float32, the more exact.
    official_dtype = torch.float32
    # 5: names no UniDet label contains are never found (`label_space="unidet"`);
    # 4: duplicates found in the official evaluation's resized image (its pixels); 3: a Grounding DINO detector's
    # labels score the mean over their tokens, each phrase its own probability
    # (the default OWLv2 scores as in 2); 2: UniDet's 0.1 threshold and per-class NMS; 1: 0.5, no NMS
    scoring_version = 5
    default_model = "google/owlv2-base-patch16-ensemble"
    model_objects = {"model_name_or_path": "detector"}
    categories = ("numeracy",)
    description = (
        "T2I-CompBench++ numeracy rule (detector counts of the prompt's objects: half for "
        "presence, half for the exact count; default OWLv2)"
    )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse detection options `check_detection_options` refuses."""
        check_detection_options(options)

    @classmethod
    def download_files(cls, options: Mapping[str, Any]) -> None:
        """The official noun list, unless `noun_file` gives one."""
        if options.get("noun_file") is None:
            load_noun_list()

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        detector: Detector | None = None,
        threshold: float = DETECTION_THRESHOLD,
        text_threshold: float | None = None,
        nms_iou: float | None = None,
        noun_file: str | Path | None = None,
        official_renames: bool = True,
        label_space: LabelSpace = "unidet",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"threshold": threshold, "text_threshold": text_threshold, "nms_iou": nms_iou,
                            "label_space": label_space})
        self.label_space = label_space
        self.threshold, self.text_threshold = threshold, text_threshold
        self.nms_iou = resolve_nms_iou(text_threshold, nms_iou)
        if noun_file is None:
            self.nouns = load_noun_list()
        else:
            path = Path(noun_file)
            if not path.is_file():
                raise FileNotFoundError(f"noun_file={str(path)!r}: no such file (lines 'singular - plural')")
            self.nouns = NounList.parse(path.read_text(encoding="utf-8-sig").splitlines())
        self.renames = OFFICIAL_RENAMES if official_renames else {}
        self.detector = reward_detector(self, detector)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        objects = [counted_objects(prompt, self.nouns, self.renames) for prompt in prompts]
        named = {i: split_by_label_space((obj.name for obj in asked), self.label_space, exact=False)
                 for i, asked in enumerate(objects) if asked}
        todo = [i for i, (names, _) in named.items() if names]
        found = self.detector.detect(
            [images[i] for i in todo],
            [named[i][0] for i in todo],
            threshold=self.threshold,
            text_threshold=self.text_threshold,
            nms_iou=self.nms_iou,
        )
        # The duplicate test runs in the pixels of the official evaluation's resized image, as its boxes are.
        detections = {i: deduplicate(image_detections, image_size=images[i].size)
                      for i, image_detections in zip(todo, found, strict=True)}
        scores, details = [], []
        for i, asked in enumerate(objects):
            kept = detections.get(i, [])
            verdict = judge_numeracy(asked, kept)
            unnamed = named[i][1] if i in named else []
            scores.append(verdict.score)
            details.append(
                {
                    "objects": [
                        {"noun": obj.noun, "name": obj.name, "count": obj.count, "detected": seen}
                        for obj, seen in zip(asked, verdict.detected, strict=True)
                    ],
                    "detections": [d.to_dict() for d in kept],
                    # Names no UniDet label contains: never asked for, never found (`rewards.unidet_labels`).
                    "not_in_label_space": unnamed,
                    "score": verdict.score,
                    "reason": verdict.reason + unnamed_note(unnamed, exact=False),
                }
            )
        return RewardOutput(scores=scores, details=details)
