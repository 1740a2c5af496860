"""T2I-CompBench++'s 3D-spatial rule as pure functions of detections and a depth map (no models).

Follows the official ``UniDet_eval/3D_spatial_eval.py`` of ``Karine-Huang/T2I-CompBench``:

1. The relation is the first of "in front of", "behind", "hidden" (in that order) that is a
   case-sensitive substring of the prompt ("a chair hidden by a mouse" -> "hidden").
2. The two objects are the first and last nouns (as the 2D rule's simple prompts:
   `rewards.spatial_rule.spatial_objects`), girl/boy/man/woman -> "person".
3. Detections are walked most confident first; each detection of object 1 (2) becomes object
   1's (2's) box until both have one (`pick_detections_3d`).
4. Both found: ``0.25 * s1 + 0.25 * s2 + 0.5 * depth_order``; one found: ``0.25 * s``; none: 0.
   Unlike the 2D rule there is no floor: every score is kept.

The depth-order score (`depth_order_judgement`) reads a depth map normalised to [0, 1] per image
in which *larger means nearer* (MiDaS/DPT predict relative inverse depth). Each box's depth is the
mean of the map over the box; ``diff = depth(object 1) - depth(object 2)``. "in front of" needs
object 1 nearer (diff > 0); "behind" and "hidden" (as in "A hidden by B") need it farther
(diff < 0). With the boxes' IoU: IoU > 0.5 and the right order -> 1; 0 < IoU < 0.5 and the right
order -> IoU / 0.5; otherwise (wrong order, boxes apart, IoU exactly 0.5) -> 0. Overlap is
required because a depth order between objects that do not occlude each other is not what the
prompt asks for.

Official quirk kept (`transposed_depth=True`, the default): the box region is cut from the
(height, width) depth map as ``depth[x_min:x_max, y_min:y_max]`` (coordinates truncated to
integers), i.e. with x indexing rows; on the benchmark's square images this is the box mirrored
over the diagonal. ``transposed_depth=False`` reads ``depth[y_min:y_max, x_min:x_max]``. An empty
region (a box off the map, or thinner than a pixel) has no depth, and its depth order scores 0
(officially its mean is NaN, whose comparisons are false, which also scores 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rewards.detection import Detection
from rewards.spatial_rule import Box, box_iou

Relation3D = Literal["in front of", "behind", "hidden"]
RELATIONS_3D: tuple[Relation3D, ...] = ("in front of", "behind", "hidden")
IOU_THRESHOLD_3D = 0.5
# The sign of `depth(object 1) - depth(object 2)` each relation needs, on a map where larger = nearer.
_NEEDED_SIGN = {"in front of": 1, "behind": -1, "hidden": -1}


def find_relation_3d(prompt: str) -> Relation3D | None:
    """The first of `RELATIONS_3D` that is a (case-sensitive) substring of `prompt`, else None."""
    return next((relation for relation in RELATIONS_3D if relation in prompt), None)


def box_depth(depth_map: np.ndarray, box: Box, transposed_depth: bool = True) -> float | None:
    """Mean of `depth_map` over `box`, or None when the region is empty.

    Args:
        depth_map: (height, width) array, in [0, 1] with larger = nearer, in the box's pixel frame.
        box: (x_min, y_min, x_max, y_max) in pixels; coordinates are truncated to integers.
        transposed_depth: the official region ``depth_map[x_min:x_max, y_min:y_max]`` (True) or
            the box itself ``depth_map[y_min:y_max, x_min:x_max]`` (False).
    """
    x_min, y_min, x_max, y_max = (int(v) for v in box)
    if transposed_depth:
        region = depth_map[x_min:x_max, y_min:y_max]
    else:
        region = depth_map[y_min:y_max, x_min:x_max]
    return float(region.mean()) if region.size else None


def depth_order_judgement(
    relation: str | None,
    box1: Box,
    box2: Box,
    depth1: float | None,
    depth2: float | None,
    iou_threshold: float = IOU_THRESHOLD_3D,
) -> tuple[float, str]:
    """The official depth-order score in [0, 1] of "object 1 <relation> object 2", and why.

    Args:
        relation: one of `RELATIONS_3D` (None or another string scores 0, as officially).
        box1, box2: boxes of object 1 and object 2, (x_min, y_min, x_max, y_max) in pixels.
        depth1, depth2: mean depth of each box (larger = nearer), None when unknown.
        iou_threshold: IoU above which the right order scores 1; below it, IoU / iou_threshold.
    """
    if relation not in _NEEDED_SIGN:
        return 0.0, f"no 3D relation rule for {relation!r}"
    if depth1 is None or depth2 is None:
        return 0.0, "a box covers no pixel of the depth map"
    iou = box_iou(box1, box2)
    diff = depth1 - depth2
    order = "object 1 nearer" if diff > 0 else "object 1 farther" if diff < 0 else "same depth"
    where = f"depth {depth1:.3f} vs {depth2:.3f}, IoU {iou:.2f}"
    if diff * _NEEDED_SIGN[relation] <= 0:
        return 0.0, f"wrong depth order for {relation!r}: {order} ({where})"
    if iou > iou_threshold:
        return 1.0, f"{order} and overlapping ({where})"
    if 0 < iou < iou_threshold:
        return iou / iou_threshold, f"{order}, partial overlap scores IoU / {iou_threshold:g} ({where})"
    if iou == 0:
        return 0.0, f"{order} but the boxes do not overlap ({where})"
    return 0.0, f"{order} but IoU equals {iou_threshold:g} exactly, which the official rule scores 0 ({where})"


@dataclass(frozen=True)
class Spatial3DJudgement:
    """The rule's verdict on one image.

    Attributes:
        score: in [0, 1].
        depth_order: the depth-order score in [0, 1], or None when not both objects were found.
        depths: mean depth of object 1's and object 2's box when both were found (None: not
            measured, or an empty region).
        reason: one sentence on how the score came about.
    """

    score: float
    depth_order: float | None
    depths: tuple[float | None, float | None]
    reason: str


def judge_spatial_3d(
    relation: str | None,
    first: Detection | None,
    second: Detection | None,
    depth_map: np.ndarray,
    iou_threshold: float = IOU_THRESHOLD_3D,
    transposed_depth: bool = True,
) -> Spatial3DJudgement:
    """Score one image from its two objects' detections (None: not found) and its depth map.

    ``0.25 * s1 + 0.25 * s2 + 0.5 * depth_order`` when both are found, ``0.25 * s`` when one is,
    0 when none is. A prompt without a 3D relation word has depth order 0, as officially (so up to
    0.5 for finding both objects). Detection scores must lie in [0, 1]; `depth_map` is (height,
    width) in the detections' pixel frame, larger = nearer (read only when both objects are found
    and the prompt has a relation).
    """
    if relation is None and first is not None and second is not None:
        return Spatial3DJudgement(0.25 * first.score + 0.25 * second.score, 0.0, (None, None),
                                  "both objects found; no 3D relation word in the prompt: depth order 0")
    if first is not None and second is not None:
        depths = (box_depth(depth_map, first.box, transposed_depth), box_depth(depth_map, second.box, transposed_depth))
        order, why = depth_order_judgement(relation, first.box, second.box, depths[0], depths[1], iou_threshold)
        score = 0.25 * first.score + 0.25 * second.score + 0.5 * order
        return Spatial3DJudgement(min(1.0, score), order, depths, f"both objects found; depth order {order:.2f}: {why}")
    if first is None and second is None:
        return Spatial3DJudgement(0.0, None, (None, None), "neither object found")
    found, which = (first, "first") if first is not None else (second, "second")
    return Spatial3DJudgement(
        0.25 * found.score, None, (None, None), f"only the {which} object ({found.label!r}) found"  # type: ignore[union-attr]
    )


def pick_detections_3d(
    detections: list[Detection], names: tuple[str, str]
) -> tuple[Detection | None, Detection | None]:
    """The detections the official 3D script uses for the two objects.

    `detections` are sorted most confident first. A name matches a label it is part of, as
    officially (a "birdhouse" box is also a "bird"). When both names are detected, the walk stops
    at the first detection that completes the pair, and each object keeps the *last* of its
    detections seen by then: in [dog 0.9, dog 0.8, desk 0.7], "dog" gets the 0.8 box. When only
    one name is detected, its most confident detection is used. An object named twice uses one
    detection for both.
    """
    # Officially a name is detected when it is part of the labels joined by spaces.
    present = [name in " ".join(d.label for d in detections) for name in names]
    if not all(present):
        return tuple(  # type: ignore[return-value]
            next((d for d in detections if name in d.label), None) if found else None
            for name, found in zip(names, present))
    first = second = None
    for detection in detections:
        if names[0] in detection.label:
            first = detection
        if names[1] in detection.label:
            second = detection
        if first is not None and second is not None:
            break
    return first, second
