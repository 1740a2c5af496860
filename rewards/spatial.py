"""T2I-CompBench's 2D-spatial metric as a reward, on a pluggable zero-shot detector."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from PIL import Image

from rewards.base import Reward, RewardOutput, check_choice, check_number
from rewards.detection import Detector, detection_dict, reward_detector
from rewards.noun_phrases import BACKENDS, Backend, parser_record
from rewards.spatial_rule import (
    DETECTION_THRESHOLD,
    DISTANCE_THRESHOLD,
    IOU_THRESHOLD,
    NOUN_RULES,
    SCORE_FLOOR,
    NounRule,
    SpatialJudgement,
    find_relation,
    judge_spatial,
    pick_detections,
    resolve_nms_iou,
    spatial_objects,
    to_official_frame,
)
from rewards.unidet_labels import LABEL_SPACES, LabelSpace, split_by_label_space, unnamed_note


def check_detection_options(options: Mapping[str, Any], threshold_default: bool = False) -> None:
    """Refuse, of the detector-based rules' options given, a `threshold` (None too where it stands for
    the reward's default: `threshold_default`), `text_threshold` or `nms_iou` outside [0, 1], both of
    the last two (`resolve_nms_iou`), an unknown `noun_phrase_backend` and an unknown `label_space`: the
    shared part of their `Reward.check_options`."""
    for name in ("threshold", "text_threshold", "nms_iou"):
        if name in options:
            check_number(name, options[name], optional=name != "threshold" or threshold_default)
    resolve_nms_iou(options.get("text_threshold"), options.get("nms_iou"))
    if "noun_phrase_backend" in options:
        check_choice("noun_phrase_backend", options["noun_phrase_backend"], BACKENDS)
    if options.get("label_space") is not None:
        check_choice("label_space", options["label_space"], LABEL_SPACES)


class SpatialRuleReward(Reward):
    """T2I-CompBench's 2D-spatial score of (image, prompt) pairs, in [0, 1].

    The rule (`rewards.spatial_rule`) follows the official ``UniDet_eval/2D_spatial_eval.py``:
    relation word, two object names, the most confident detection of each,
    ``0.25 * s1 + 0.25 * s2 + 0.5 * position``, and 0 below 0.5.

    Differences from the official code:

    - Detector. The official metric runs UniDet (a unified-label-space detector, RS200
      checkpoint), which has no installable implementation. The default here is OWLv2
      (`google/owlv2-base-patch16-ensemble`), queried with the two object names; any Grounding
      DINO, MM-Grounding-DINO or OWLv2 checkpoint can be passed. This is deliberately another
      detector than the unbiased `grounded_detection` reward's (MM-Grounding-DINO). As UniDet
      finds only its own classes and the official code looks nouns up among their names, a
      name that no UniDet label equals ("cow", "wallet") is not asked for and never found
      (`label_space="unidet"`, `rewards.unidet_labels`; "open" asks for every name).
    - Confidence calibration. UniDet's scores are closed-set class probabilities; an
      open-vocabulary detector's scores are text-box matching probabilities on another scale
      (OWLv2's are typically lower), yet UniDet's rule (every (box, label) pair above 0.1,
      non-maximum suppression per label at IoU 0.5) and the 0.5 score floor are applied. Numbers are therefore comparable in kind, not digit for digit, with published ones.
    - Object names follow the official rule over part-of-speech tags (`noun_rule="official"`):
      with spaCy's English model installed (the official parser) they are the official ones; the
      built-in parser approximates its tags (`rewards.noun_phrases.builtin_tagged_tokens`). On the
      1000 spatial prompts the names equal the prompts' second and last words (the official
      nouns), "girl/boy/man/woman" -> "person"; on complex prompts a compound gives its first
      noun ("the white coffee table": "coffee"), as officially.
    - A prompt without a relation word scores 0 with a reason (officially its position is 0, so
      its score is at most 0.5 and floored to 0 unless both confidences are exactly 1).

    Official quirks kept (see `rewards.spatial_rule`): "on top of" scores position 0
    (`fix_on_top_of=True` corrects it), complex prompts with two prepositions or with
    "on the top of" find no object pair, relation words match as case-sensitive substrings, and
    an object named twice uses the same detection twice (`distinct_same_name=True` corrects it).

    Args:
        model_name_or_path: detector checkpoint (Hub id or folder); default OWLv2.
        device, torch_dtype, batch_size: see `Reward`; batch_size is images per detector pass.
        detector: an already-built detector (anything with `ZeroShotDetector.detect`'s
            signature); `model_name_or_path` is then not loaded.
        threshold: detector confidence threshold (official, UniDet: 0.1, see
            `rewards.spatial_rule.DETECTION_THRESHOLD`).
        text_threshold: Grounding DINO phrase threshold (see `rewards.detection`); None: every
            (box, label) pair above `threshold` counts, suppressed per label (`nms_iou`).
        nms_iou: the per-label non-maximum suppression IoU (official, detectron2: 0.5; 1 keeps
            every box); not with `text_threshold`.
        complex: object parsing of complex prompts (3-in-1) instead of simple ones.
        floor: scores below it become 0 (official 0.5).
        iou_threshold, distance_threshold: of the position rule (official 0.1, and 150 px of the
            official script's detection frame: 479 x 479 for a 512 x 512 image, `official_frame`).
        fix_on_top_of: score "on top of" like "on the top of" (official: position 0).
        distinct_same_name: an object named twice takes the two most confident detections.
        person_mapping: girl/boy/man/woman are detected as "person" (official: UniDet has no such
            classes); default the class's (`default_person_mapping`).
        noun_phrase_backend: see `rewards.noun_phrases.noun_phrases`.
        noun_rule: "official" (the official scripts' nouns, read off part-of-speech tags) or "head"
            (each noun phrase's head word: "table" for "a coffee table"); default the class's
            (`default_noun_rule`). See `rewards.spatial_rule.spatial_objects`.
        label_space: "unidet" (only the names a UniDet label equals are asked for, as the official
            lookup finds only those) or "open" (every name); default the class's (`default_label_space`).
    """

    name = "spatial_rule"
    # T2I-CompBench's scripts run UniDet (detectron2) under float16 autocast (`Accelerator(mixed_precision=
    # 'fp16')`); the detectors here are other models, run in float32, the more exact.
    official_dtype = torch.float32
    # 5: names no UniDet label equals are never found (`label_space="unidet"`); 4: object names by the official
    # part-of-speech rule (a complex prompt's compound gives its first noun);
    # 3: a Grounding DINO detector's labels score the mean over their tokens, each phrase its own probability
    # (the default OWLv2 scores as in 2); 2: UniDet's 0.1 threshold and per-class NMS; 1: 0.5, no NMS
    scoring_version = 5
    default_model = "google/owlv2-base-patch16-ensemble"
    model_objects = {"model_name_or_path": "detector"}
    categories = ("spatial",)
    description = (
        "T2I-CompBench 2D-spatial rule (relation word, two objects, box positions) on a "
        "zero-shot detector (default OWLv2; the official UniDet is not installable)"
    )
    # Defaults of the subclass-tunable options, official for this class.
    default_threshold: ClassVar[float] = DETECTION_THRESHOLD
    default_floor: ClassVar[float] = SCORE_FLOOR
    default_fix_on_top_of: ClassVar[bool] = False
    default_distinct_same_name: ClassVar[bool] = False
    default_person_mapping: ClassVar[bool] = True
    default_noun_rule: ClassVar[NounRule] = "official"
    default_label_space: ClassVar[LabelSpace] = "unidet"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse thresholds and floor outside [0, 1], position thresholds <= 0, both `nms_iou` and
        `text_threshold`, an unknown parser (`check_detection_options`) and an unknown `noun_rule`."""
        check_detection_options(options, threshold_default=True)
        if "noun_rule" in options:
            check_choice("noun_rule", options["noun_rule"], NOUN_RULES)
        if "floor" in options:
            check_number("floor", options["floor"], optional=True)
        for name in ("iou_threshold", "distance_threshold"):
            if name in options:
                check_number(name, options[name], 0.0, math.inf, open_low=True)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        detector: Detector | None = None,
        threshold: float | None = None,
        text_threshold: float | None = None,
        nms_iou: float | None = None,
        complex: bool = False,
        floor: float | None = None,
        iou_threshold: float = IOU_THRESHOLD,
        distance_threshold: float = DISTANCE_THRESHOLD,
        fix_on_top_of: bool | None = None,
        distinct_same_name: bool | None = None,
        person_mapping: bool | None = None,
        noun_phrase_backend: Backend = "auto",
        noun_rule: NounRule | None = None,
        label_space: LabelSpace | None = None,
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.noun_rule = self.default_noun_rule if noun_rule is None else noun_rule
        self.label_space = self.default_label_space if label_space is None else label_space
        self.check_options({"threshold": threshold, "text_threshold": text_threshold, "nms_iou": nms_iou,
                            "floor": floor, "iou_threshold": iou_threshold, "distance_threshold": distance_threshold,
                            "noun_phrase_backend": noun_phrase_backend, "noun_rule": self.noun_rule,
                            "label_space": self.label_space})
        self.parser = parser_record(noun_phrase_backend)
        self.threshold = self.default_threshold if threshold is None else threshold
        self.floor = self.default_floor if floor is None else floor
        self.text_threshold = text_threshold
        self.nms_iou = resolve_nms_iou(text_threshold, nms_iou)
        self.complex = complex
        self.iou_threshold = iou_threshold
        self.distance_threshold = distance_threshold
        self.fix_on_top_of = (
            self.default_fix_on_top_of if fix_on_top_of is None else fix_on_top_of
        )
        self.distinct_same_name = (
            self.default_distinct_same_name if distinct_same_name is None else distinct_same_name
        )
        self.person_mapping = self.default_person_mapping if person_mapping is None else person_mapping
        self.noun_phrase_backend = noun_phrase_backend
        self.detector = reward_detector(self, detector)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        relations = [find_relation(prompt) for prompt in prompts]
        objects = [
            spatial_objects(
                prompt,
                complex=self.complex,
                backend=self.noun_phrase_backend,
                person_mapping=self.person_mapping,
                fix_on_top_of=self.fix_on_top_of,
                noun_rule=self.noun_rule,
            )
            for prompt in prompts
        ]
        # Only images whose prompt gives a relation and two objects, one of them a name the label space has, go
        # through the detector, asked for those names.
        asked = {i: split_by_label_space(o, self.label_space, exact=True)
                 for i, (r, o) in enumerate(zip(relations, objects)) if r and o}
        todo = [i for i, (named, _) in asked.items() if named]
        found = self.detector.detect(
            [images[i] for i in todo],
            [asked[i][0] for i in todo],
            threshold=self.threshold,
            text_threshold=self.text_threshold,
            nms_iou=self.nms_iou,
        )
        detections = dict(zip(todo, found, strict=True))
        scores, details = [], []
        for i, (relation, names) in enumerate(zip(relations, objects, strict=True)):
            first = second = None
            if i in asked:
                first, second = pick_detections(
                    detections.get(i, []), names, self.distinct_same_name  # type: ignore[arg-type]
                )
                # Judged where the official script detects, so that 150 px is the same share of
                # any image; the details keep the boxes in the image's own pixels.
                in_frame = [to_official_frame(d, *images[i].size) if d else None for d in (first, second)]
                verdict = judge_spatial(
                    relation, *in_frame, self.floor, self.iou_threshold,
                    self.distance_threshold, self.fix_on_top_of,
                )
            elif relation is None:
                verdict = SpatialJudgement(0.0, None, "no spatial relation word in the prompt")
            else:
                verdict = SpatialJudgement(0.0, None, "the prompt does not name two objects")
            unnamed = asked[i][1] if i in asked else []
            scores.append(verdict.score)
            details.append(
                {
                    "relation": relation,
                    "objects": list(names) if names else None,
                    "parser": self.parser,  # which tagger found the names (spaCy's: the official ones)
                    # Names no UniDet class equals: never asked for, never found (`rewards.unidet_labels`).
                    "not_in_label_space": unnamed,
                    "first": detection_dict(first),
                    "second": detection_dict(second),
                    "position": verdict.position,
                    "score": verdict.score,
                    "reason": verdict.reason + unnamed_note(unnamed, exact=True),
                }
            )
        return RewardOutput(scores=scores, details=details)
