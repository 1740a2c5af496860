"""GenEval's scoring rules as pure functions of detections (no model, no network).

GenEval (Ghosh et al., 2023) judges an image correct or not from the objects a COCO instance
segmenter finds in it. These functions follow the official code, djghosh13/geneval
`evaluation/evaluate_images.py`, wherever it differs from the paper:

- Detections: per class, most confident first, confidence strictly above 0.3, or above 0.9 for
  every class when the prompt's tag is "counting" (include and exclude clauses alike); at most
  16 per class. (The official option of per-class NMS is off by default and not reproduced.)
- Clauses: every "include" clause must hold (AND); any "exclude" clause that matches makes the
  image wrong (OR). An include clause {class, count} needs `count` objects of the class; its
  colour and position are checked on the `count` most confident of them only. The colour check
  runs only when the count holds; the position check only when the clause still holds (count and
  colour) and its target group (an earlier include clause) held too; every (object, target) pair
  must show the relation. An exclude clause {class, count} fails with `count` or more objects.
- Position: `relative_position` (see there); the dead zone is 0.1 x (size_A + size_B) per axis.
- Colour: a callable (CLIP zero-shot over `COLORS` in the reward) gives one colour per object.

`judge_image` returns (correct, reason, details); the reason strings are the official ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# GenEval's `object_names.txt`: the 80 COCO classes in detector order.
GENEVAL_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
COLORS: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")

THRESHOLD = 0.3  # detector confidence, exclusive
COUNTING_THRESHOLD = 0.9  # the same for prompts tagged "counting"
MAX_OBJECTS = 16  # per class
POSITION_THRESHOLD = 0.1  # dead zone per axis, as a fraction of the two objects' summed size
# A relation needs the revised offset's share of the raw offset length above this, per axis.
RELATION_SHARE = 0.5
# Below this (pixels) on both axes, the revised offset means "no relation at all".
NO_RELATION_EPS = 1e-3


@dataclass(frozen=True)
class GenEvalObject:
    """One detected object of a class.

    Attributes:
        box: (x_min, y_min, x_max, y_max) in pixels of the image.
        score: detector confidence in [0, 1].
        mask: boolean (height, width) instance mask of the image, or None (colour is then judged
            on the box crop of the unmasked image, as the official code does without masks).
    """

    box: tuple[float, float, float, float]
    score: float
    mask: np.ndarray | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: box (4 pixel coordinates) and score."""
        return {"box": [float(v) for v in self.box], "score": float(self.score)}


# (class name, objects) -> one colour of `COLORS` per object, in order.
ColorClassifier = Callable[[str, Sequence[GenEvalObject]], list[str]]


@dataclass(frozen=True)
class GenEvalJudgement:
    """The verdict on one image.

    Attributes:
        correct: every include clause holds and no exclude clause matches.
        reason: the failed clauses, one official reason string per line ("" when correct).
        details: JSON-serialisable: tag, threshold used, correct, reason and the kept detections
            (class -> [{box, score}], most confident first).
    """

    correct: bool
    reason: str
    details: dict[str, Any]


def confidence_threshold(tag: str, threshold: float = THRESHOLD, counting_threshold: float = COUNTING_THRESHOLD) -> float:
    """The detector confidence an object must exceed: `counting_threshold` for "counting" prompts only."""
    return counting_threshold if tag == "counting" else threshold


def keep_objects(
    detections: Mapping[str, Sequence[GenEvalObject]], threshold: float, max_objects: int = MAX_OBJECTS
) -> dict[str, list[GenEvalObject]]:
    """Per class: objects with score > `threshold`, most confident first, at most `max_objects`.

    Compared in float32, as the official code compares the detector's float32 scores (a score of exactly
    float32(0.3) does not exceed 0.3 there, though it does in double precision). Classes left without
    objects are dropped. Ties keep the detector's order, where the official `np.argsort(scores)[::-1]`
    reverses them: the order of equal float32 scores (which real detections practically never have)
    is no more defined there, as mmdetection's `topk(sorted=False)` hands the detections over unordered.
    """
    above = np.float32(threshold)
    kept = {}
    for classname, objects in detections.items():
        ranked = sorted((o for o in objects if np.float32(o.score) > above), key=lambda o: -o.score)[:max_objects]
        if ranked:
            kept[classname] = ranked
    return kept


def relative_position(
    box_a: Sequence[float], box_b: Sequence[float], position_threshold: float = POSITION_THRESHOLD
) -> set[str]:
    """Relations of A to B among `RELATIONS` (image y grows downwards), the official rule.

    The centre offset A - B is shrunk towards zero per axis by a dead zone of
    `position_threshold` x (size of A + size of B) on that axis. If what remains is below 1e-3
    pixels on both axes, there is no relation. Otherwise each axis's remaining offset is divided
    by the length of the *raw* offset, and a relation holds where that quotient exceeds 0.5 in
    magnitude (the paper's text differs; the code decides). A and B can stand in two relations.
    """
    a, b = np.asarray(box_a[:4], dtype=float), np.asarray(box_b[:4], dtype=float)
    offset = (a[:2] + a[2:]) / 2 - (b[:2] + b[2:]) / 2
    size_a, size_b = np.abs(a[2:] - a[:2]), np.abs(b[2:] - b[:2])
    revised = np.maximum(np.abs(offset) - position_threshold * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < NO_RELATION_EPS):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = set()
    if dx < -RELATION_SHARE:
        relations.add("left of")
    if dx > RELATION_SHARE:
        relations.add("right of")
    if dy < -RELATION_SHARE:
        relations.add("above")
    if dy > RELATION_SHARE:
        relations.add("below")
    return relations


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """Raise ValueError naming the problem when `metadata` is not a valid GenEval clause set.

    Needs "tag" and "include" (a list of {"class", "count"} with an optional "color" of `COLORS`
    and "position" [relation, index of an earlier include clause]); "exclude" is optional.
    """
    hint = "each image's metadata must carry GenEval's clauses (keys tag, include, exclude) as in evaluation_metadata.jsonl"
    missing = [key for key in ("tag", "include") if key not in metadata]
    if missing:
        raise ValueError(f"GenEval metadata lacks {', '.join(missing)} (got keys {sorted(metadata)}): {hint}")
    for kind in ("include", "exclude"):
        clauses = metadata.get(kind, [])
        if not isinstance(clauses, list):
            raise TypeError(f"GenEval metadata {kind!r} must be a list of clauses, got {clauses!r}: {hint}")
        for index, clause in enumerate(clauses):
            if not isinstance(clause, Mapping) or "class" not in clause or "count" not in clause:
                raise ValueError(f"GenEval {kind} clause {index} {clause!r} needs 'class' and 'count': {hint}")
            if not isinstance(clause["count"], int) or clause["count"] < 1:
                raise ValueError(f"GenEval {kind} clause {index}: count must be a positive integer, got {clause['count']!r}")
            if kind == "exclude" and ({"color", "position"} & set(clause)):
                raise ValueError(f"GenEval exclude clause {index} {clause!r}: exclude clauses take only class and count")
            if "color" in clause and clause["color"] not in COLORS:
                raise ValueError(f"GenEval include clause {index}: colour {clause['color']!r} is not one of {COLORS}")
            if "position" in clause:
                position = clause["position"]
                if (not isinstance(position, Sequence) or len(position) != 2 or position[0] not in RELATIONS
                        or not isinstance(position[1], int) or not 0 <= position[1] < index):
                    raise ValueError(
                        f"GenEval include clause {index}: position {position!r} must be [relation, index of an "
                        f"earlier include clause] with relation one of {RELATIONS}"
                    )


def _colour_reason(classname: str, colour: str, count: int, colours: list[str]) -> str:
    found = ", ".join(f"{colours.count(c)} {c}" for c in COLORS if c in colours)
    return f"expected {colour} {classname}>={count}, found {colours.count(colour)} {colour}; and {found}"


def evaluate_clauses(
    objects: Mapping[str, Sequence[GenEvalObject]],
    metadata: Mapping[str, Any],
    classify_colors: ColorClassifier,
    position_threshold: float = POSITION_THRESHOLD,
) -> tuple[bool, str]:
    """(correct, reason) of kept `objects` (per class, most confident first) against the clauses.

    `classify_colors` is called only for include clauses with a colour whose count holds, on the
    `count` most confident objects of the class.
    """
    correct = True
    reasons: list[str] = []
    groups: list[Sequence[GenEvalObject] | None] = []  # objects of each include clause that held
    for clause in metadata.get("include", []):
        classname, count = clause["class"], clause["count"]
        found = list(objects.get(classname, []))[:count]
        matched = len(found) >= count
        if not matched:
            reasons.append(f"expected {classname}>={count}, found {len(found)}")
        elif "color" in clause:
            colours = list(classify_colors(classname, found))
            if colours.count(clause["color"]) < count:
                matched = False
                reasons.append(_colour_reason(classname, clause["color"], count, colours))
        if matched and "position" in clause:
            relation, target = clause["position"]
            if groups[target] is None:
                matched = False
                reasons.append(f"no target for {classname} to be {relation}")
            else:
                matched, reason = _check_position(classname, relation, found, groups[target], position_threshold)
                if reason:
                    reasons.append(reason)
        correct &= matched
        groups.append(found if matched else None)
    for clause in metadata.get("exclude", []):
        classname, count = clause["class"], clause["count"]
        present = len(objects.get(classname, []))
        if present >= count:
            correct = False
            reasons.append(f"expected {classname}<{count}, found {present}")
    return correct, "\n".join(reasons)


def _check_position(
    classname: str, relation: str, found: Sequence[GenEvalObject], targets: Sequence[GenEvalObject],
    position_threshold: float,
) -> tuple[bool, str]:
    """Every (object, target) pair must stand in `relation`; the first pair that does not is the reason."""
    for obj in found:
        for target in targets:
            relations = relative_position(obj.box, target.box, position_threshold)
            if relation not in relations:
                seen = " and ".join(r for r in RELATIONS if r in relations)  # official: set order; ours is fixed
                return False, f"expected {classname} {relation} target, found {seen} target"
    return True, ""


def judge_image(
    detections: Mapping[str, Sequence[GenEvalObject]],
    metadata: Mapping[str, Any],
    classify_colors: ColorClassifier,
    threshold: float = THRESHOLD,
    counting_threshold: float = COUNTING_THRESHOLD,
    max_objects: int = MAX_OBJECTS,
    position_threshold: float = POSITION_THRESHOLD,
) -> GenEvalJudgement:
    """GenEval's verdict on one image from all its detections (class name -> objects, any order).

    Thresholds the detections (`confidence_threshold`, `keep_objects`), then `evaluate_clauses`.
    """
    check_metadata(metadata)
    used = confidence_threshold(metadata["tag"], threshold, counting_threshold)
    objects = keep_objects(detections, used, max_objects)
    correct, reason = evaluate_clauses(objects, metadata, classify_colors, position_threshold)
    details = {
        "tag": metadata["tag"],
        "correct": correct,
        "reason": reason,
        "threshold": used,
        "detections": {name: [o.to_dict() for o in objs] for name, objs in objects.items()},
    }
    return GenEvalJudgement(correct, reason, details)
