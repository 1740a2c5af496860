"""T2I-CompBench's 2D-spatial rule as pure functions (no models).

Follows the official ``UniDet_eval/2D_spatial_eval.py`` of ``Karine-Huang/T2I-CompBench``:

1. The relation is the first of `RELATIONS` (in that order) that is a substring of the prompt.
2. Two object names: the first and last nouns of a simple prompt, or, for complex prompts
   (3-in-1), the noun nearest before the preposition and the first noun after it; "girl", "boy",
   "man" and "woman" become "person" (UniDet's class).
3. The most confident detection of each object is used. Both found:
   ``0.25 * s1 + 0.25 * s2 + 0.5 * position``; one found: ``0.25 * s``; none: 0. Scores below 0.5
   become 0 (so an image needs both objects, well placed, to score at all).

`position_score` is the official soft position rule, with box centres c1 (first object) and c2,
``dx = c2.x - c1.x`` and ``dy = c2.y - c1.y`` in pixels (y grows downwards):

- "near" / "next to" / "on side of": 1 when |dx| < 150 or |dy| < 150, else 150 / max(|dx|, |dy|),
  in pixels of the frame the official script detects in: it resizes every image with
  torchvision's ``Resize(size=479, max_size=480)`` first (`official_frame`; 479 x 479 for the
  benchmark's 512 x 512 images), so the reward maps boxes into that frame (`to_official_frame`)
  and the threshold is the same share of any image, 1024-px ones included.
- "on the left of" needs dx > 0, "on the right of" dx < 0, "on the top of" dy > 0,
  "on the bottom of" dy < 0, and the relation's axis must dominate (|dx| > |dy| for left/right,
  |dy| > |dx| for top/bottom); then 1 when IoU < 0.1, else 0.1 / IoU; otherwise 0.

Official quirks kept (each noted where it happens): "on top of" has no branch in the position
function and scores position 0 (``fix_on_top_of=True`` scores it like "on the top of"); the
complex preposition list has "on top of" and "on bottom of" but not "on the top of" / "on the
bottom of", so those complex prompts find no objects (also fixed by ``fix_on_top_of``); a
complex prompt with two prepositions yields more than two nouns and scores 0; relation words
are matched as case-sensitive substrings ("near" also matches "nearby"); an object named twice
("a dog on the left of a dog") uses the same detection for both.

Object names follow the official rule over part-of-speech tags (`first_and_last_nouns`,
`nouns_around_prepositions`): spaCy's tags where spaCy and ``en_core_web_sm`` are installed (the
official parser, then the official names), else the built-in parser's approximation
(`rewards.noun_phrases.builtin_tagged_tokens`). So a complex prompt's compound gives its first
noun ("next to the white coffee table": "coffee"), as officially; ``noun_rule="head"`` takes the
head word of each noun phrase instead ("table").

Differences from the official code: a prompt without a relation word scores 0 with a reason (the
official code scores its position 0, which caps the score at 0.5), and a prompt without a noun
finds no objects (the official script stops with an error).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, get_args

from rewards.detection import Detection
from rewards.noun_phrases import Backend, TaggedToken, noun_phrases, tagged_tokens

Box = tuple[float, float, float, float]
# In the official order: the first one found in the prompt wins, wherever it stands.
Relation = Literal[
    "on side of",
    "next to",
    "near",
    "on the left of",
    "on the right of",
    "on the bottom of",
    "on the top of",
    "on top of",
]

RELATIONS: tuple[Relation, ...] = get_args(Relation)
PROXIMITY_RELATIONS = ("near", "next to", "on side of")
# Prepositions the official complex parser looks for, as whole words of the prompt.
COMPLEX_PREPOSITIONS = (
    "on top of",
    "on bottom of",
    "on the left",
    "on the right",
    "next to",
    "on side of",
    "near",
)
# Added to COMPLEX_PREPOSITIONS by fix_on_top_of (longest first, so they win over "on top of").
_FIXED_PREPOSITIONS = ("on the top of", "on the bottom of")
PERSON_WORDS = ("girl", "boy", "man", "woman")
IOU_THRESHOLD = 0.1
DISTANCE_THRESHOLD = 150.0  # pixels of the official detection frame (`official_frame`)
# UniDet_eval's `Resize(size=479, max_size=480)`: the shorter side to 479, the longer at most 480.
OFFICIAL_SHORT_SIDE, OFFICIAL_MAX_SIDE = 479, 480
# UniDet in the official evaluation keeps every (box, class) above 0.1 (hard-coded in
# `UnifiedCascadeROIHeads._forward_box`; the scripts' --confidence-threshold 0.5 never reaches it),
# then suppresses per class at detectron2's default IoU 0.5 (`per_class_detections`).
DETECTION_THRESHOLD = 0.1
NMS_IOU = 0.5


def resolve_nms_iou(text_threshold: float | None, nms_iou: float | None) -> float | None:
    """The per-class NMS IoU a detector-based rule runs with: `nms_iou`, by default `NMS_IOU`;
    None with a `text_threshold` (Grounding DINO's phrase rule labels the boxes instead)."""
    if nms_iou is not None and text_threshold is not None:
        raise ValueError("nms_iou and text_threshold are two ways to label boxes (detectron2's per-class rule, "
                         "Grounding DINO's phrase rule): give one of them")
    if nms_iou is not None and not 0.0 <= nms_iou <= 1.0:
        raise ValueError(f"nms_iou must be in [0, 1] (1 keeps every box), got {nms_iou}")
    return None if text_threshold is not None else (NMS_IOU if nms_iou is None else nms_iou)
SCORE_FLOOR = 0.5
# Noun phrases that are the relation itself ("the left" in "on the left of"), never objects.
_RELATION_NOUNS = frozenset(("top", "bottom", "left", "right", "side"))
_DETERMINERS = frozenset(("a", "an", "the"))
_PRONOUNS = frozenset(("it", "they", "them", "he", "she", "him", "her", "we", "us", "you"))


def official_frame(width: int, height: int) -> tuple[int, int]:
    """(width, height) in pixels of a `width` x `height` image after the official evaluation's
    resize (torchvision's ``Resize(size=479, max_size=480)``, rounding as torchvision does)."""
    short, long = min(width, height), max(width, height)
    new_short, new_long = OFFICIAL_SHORT_SIDE, int(OFFICIAL_SHORT_SIDE * long / short)
    if new_long > OFFICIAL_MAX_SIDE:
        new_short, new_long = int(OFFICIAL_MAX_SIDE * new_short / new_long), OFFICIAL_MAX_SIDE
    return (new_short, new_long) if width <= height else (new_long, new_short)


def to_official_frame(detection: Detection, width: int, height: int) -> Detection:
    """`detection` of a `width` x `height` image with its box in pixels of `official_frame`."""
    frame_width, frame_height = official_frame(width, height)
    sx, sy = frame_width / width, frame_height / height
    x0, y0, x1, y1 = detection.box
    return replace(detection, box=(x0 * sx, y0 * sy, x1 * sx, y1 * sy))


def find_relation(prompt: str) -> Relation | None:
    """The first of `RELATIONS` that is a (case-sensitive) substring of `prompt`, else None."""
    return next((relation for relation in RELATIONS if relation in prompt), None)


def box_iou(box1: Box, box2: Box) -> float:
    """Intersection over union of two (x_min, y_min, x_max, y_max) boxes, in [0, 1].

    0 when the union is empty (degenerate boxes; the official code would divide by zero).
    """
    width = max(0.0, min(box1[2], box2[2]) - max(box1[0], box2[0]))
    height = max(0.0, min(box1[3], box2[3]) - max(box1[1], box2[1]))
    intersection = width * height
    area1 = (box1[2] - box1[0]) * (box1[3] - box1[1])
    area2 = (box2[2] - box2[0]) * (box2[3] - box2[1])
    union = area1 + area2 - intersection
    return intersection / union if union > 0 else 0.0


def position_judgement(
    relation: str | None,
    box1: Box,
    box2: Box,
    iou_threshold: float = IOU_THRESHOLD,
    distance_threshold: float = DISTANCE_THRESHOLD,
    fix_on_top_of: bool = False,
) -> tuple[float, str]:
    """The official position score in [0, 1] of "object 1 <relation> object 2", and why.

    Args:
        relation: one of `RELATIONS` (None or another string scores 0, as officially).
        box1, box2: boxes of object 1 and object 2, (x_min, y_min, x_max, y_max) in pixels of the
            official detection frame (`official_frame`), where `distance_threshold` applies.
        iou_threshold: overlap above which a directional relation gets iou_threshold / IoU.
        distance_threshold: centre distance in pixels within which a proximity relation holds.
        fix_on_top_of: score "on top of" like "on the top of" (official: 0).
    """
    if fix_on_top_of and relation == "on top of":
        relation = "on the top of"
    dx = (box2[0] + box2[2]) / 2 - (box1[0] + box1[2]) / 2
    dy = (box2[1] + box2[3]) / 2 - (box1[1] + box1[3]) / 2
    where = f"dx={dx:.1f}, dy={dy:.1f}"
    if relation in PROXIMITY_RELATIONS:
        if abs(dx) < distance_threshold or abs(dy) < distance_threshold:
            return 1.0, f"centres within {distance_threshold:g} px on one axis ({where})"
        return (
            distance_threshold / max(abs(dx), abs(dy)),
            f"centres farther than {distance_threshold:g} px on both axes ({where})",
        )
    directions = {
        "on the left of": (dx > 0, abs(dx) > abs(dy), "object 2 right of object 1"),
        "on the right of": (dx < 0, abs(dx) > abs(dy), "object 2 left of object 1"),
        "on the top of": (dy > 0, abs(dy) > abs(dx), "object 2 below object 1"),
        "on the bottom of": (dy < 0, abs(dy) > abs(dx), "object 2 above object 1"),
    }
    if relation not in directions:
        return 0.0, f"the official position rule has no branch for {relation!r}"
    right_side, dominant, needed = directions[relation]
    if not right_side:
        return 0.0, f"wrong side: needs {needed} ({where})"
    if not dominant:
        return 0.0, f"the other axis dominates ({where})"
    iou = box_iou(box1, box2)
    if iou < iou_threshold:
        return 1.0, f"{needed}, IoU {iou:.2f} < {iou_threshold:g} ({where})"
    return iou_threshold / iou, f"{needed} but overlapping: IoU {iou:.2f} ({where})"


def position_score(
    relation: str | None,
    box1: Box,
    box2: Box,
    iou_threshold: float = IOU_THRESHOLD,
    distance_threshold: float = DISTANCE_THRESHOLD,
    fix_on_top_of: bool = False,
) -> float:
    """The official position score in [0, 1]; see `position_judgement`."""
    return position_judgement(
        relation, box1, box2, iou_threshold, distance_threshold, fix_on_top_of
    )[0]


# --------------------------------------------------------------------------------------------
# Object names.


# "official": the official scripts' nouns, read off part-of-speech tags (a compound gives its first noun);
# "head": the head word of each noun phrase (what an open-vocabulary detector should be asked for).
NounRule = Literal["official", "head"]
NOUN_RULES: tuple[NounRule, ...] = get_args(NounRule)


def first_and_last_nouns(tokens: Sequence[TaggedToken]) -> tuple[str, str] | None:
    """The official simple-prompt objects: the first and the last token tagged NOUN (one noun gives
    it twice). None without a noun (where the official script fails)."""
    nouns = [token.text for token in tokens if token.pos == "NOUN"]
    return (nouns[0], nouns[-1]) if nouns else None


def _span_text(tokens: Sequence[TaggedToken]) -> str:
    """The text of consecutive tokens, as spaCy's `Span.text`."""
    return "".join(t.text + t.whitespace for t in tokens[:-1]) + tokens[-1].text


def nouns_around_prepositions(tokens: Sequence[TaggedToken], prepositions: Sequence[str]) -> tuple[str, str] | None:
    """The official complex-prompt objects (``2D_spatial_eval.py --complex``), or None unless exactly two.

    At every token that starts one of `prepositions` (the longest that matches), the nearest NOUN or
    PROPN before it, and the first NOUN after it ("the wooden picture frame" gives "picture"); with
    no NOUN after it, the first PROPN that the next token does not continue. A prompt with two
    prepositions gives four nouns, hence None, as officially.
    """
    longest = max(len(p.split()) for p in prepositions)
    nouns: list[str] = []
    for i in range(len(tokens)):
        # As officially: a span cut short by the prompt's end may match a shorter preposition.
        k = next((k for k in range(longest, 0, -1) if _span_text(tokens[i : i + k]) in prepositions), None)
        if k is None:
            continue
        before = next((t.text for t in reversed(tokens[:i]) if t.pos in ("NOUN", "PROPN")), None)
        after = next((t.text for t in tokens[i + k :] if t.pos == "NOUN"), None)
        if after is None:
            after = next((t.text for t, following in zip(tokens[i + k :], tokens[i + k + 1 :])
                          if t.pos == "PROPN" and following.pos != "PROPN"), None)
        nouns += [noun for noun in (before, after) if noun is not None]
    return (nouns[0], nouns[1]) if len(nouns) == 2 else None


def _head(phrase: str) -> str:
    return phrase.split()[-1]


def _is_object_phrase(phrase: str) -> bool:
    words = [w for w in phrase.lower().split() if w not in _DETERMINERS]
    return bool(words) and not (len(words) == 1 and words[0] in _RELATION_NOUNS | _PRONOUNS)


def _object_phrases(prompt: str, backend: Backend) -> list[tuple[int, int, str]]:
    """(start, end, phrase) of each noun phrase that can name an object, in prompt order."""
    spans, cursor = [], 0
    for phrase in noun_phrases(prompt, backend):
        start = prompt.index(phrase, cursor)
        cursor = start + len(phrase)
        if _is_object_phrase(phrase):
            spans.append((start, cursor, phrase))
    return spans


def person_name(noun: str) -> str:
    """"person" for the official person words (girl, boy, man, woman), else `noun` unchanged."""
    return "person" if noun in PERSON_WORDS else noun


def spatial_objects(
    prompt: str,
    complex: bool = False,
    backend: Backend = "auto",
    person_mapping: bool = True,
    fix_on_top_of: bool = False,
    noun_rule: NounRule = "official",
) -> tuple[str, str] | None:
    """The two object names the rule looks for, or None when the prompt does not give two.

    Args:
        prompt: the text prompt.
        complex: False (T2I-CompBench's spatial category): the first and last nouns (one noun
            gives the same noun twice). True (complex prompts, 3-in-1): for each preposition of
            `COMPLEX_PREPOSITIONS`, the nouns nearest before and after it; exactly two nouns must
            result, as officially.
        backend: parser backend of `rewards.noun_phrases` (spaCy, the official parser, or built-in).
        person_mapping: map girl/boy/man/woman to "person" (official, UniDet's class name).
        fix_on_top_of: complex prompts also recognise "on the top of" / "on the bottom of".
        noun_rule: "official": the nouns of the official scripts, read off part-of-speech tags
            (`first_and_last_nouns`, `nouns_around_prepositions`; "a coffee table" gives "coffee",
            as spaCy tags it); "head": the head word of each noun phrase ("table").
    """
    if noun_rule not in NOUN_RULES:
        raise ValueError(f"noun_rule must be one of {NOUN_RULES}, got {noun_rule!r}")
    text = prompt.strip()
    words = (_FIXED_PREPOSITIONS if fix_on_top_of else ()) + COMPLEX_PREPOSITIONS
    if noun_rule == "official":
        tokens = tagged_tokens(text, backend)
        found = nouns_around_prepositions(tokens, words) if complex else first_and_last_nouns(tokens)
    else:
        found = _head_nouns(text, complex, backend, words)
    if found is None:
        return None
    first, last = found
    if person_mapping:
        first, last = person_name(first), person_name(last)
    return first, last


def _head_nouns(text: str, complex: bool, backend: Backend, prepositions: Sequence[str]) -> tuple[str, str] | None:
    """`spatial_objects` by noun-phrase heads: those of the first and last phrases, or of the phrases
    nearest each preposition."""
    phrases = _object_phrases(text, backend)
    if not complex:
        if not phrases:
            return None
        return _head(phrases[0][2]), _head(phrases[-1][2])
    pattern = r"\b(?:" + "|".join(re.escape(w) for w in prepositions) + r")\b"
    nouns = []
    for match in re.finditer(pattern, text):
        before = [p for s, e, p in phrases if e <= match.start()]
        after = [p for s, e, p in phrases if s >= match.end()]
        nouns += [_head(p) for p in before[-1:] + after[:1]]
    return (nouns[0], nouns[1]) if len(nouns) == 2 else None


# --------------------------------------------------------------------------------------------
# The image score.


@dataclass(frozen=True)
class SpatialJudgement:
    """The rule's verdict on one image.

    Attributes:
        score: in [0, 1].
        position: the position score in [0, 1], or None when not both objects were found.
        reason: one sentence on how the score came about.
    """

    score: float
    position: float | None
    reason: str


def judge_spatial(
    relation: str | None,
    first: Detection | None,
    second: Detection | None,
    floor: float = SCORE_FLOOR,
    iou_threshold: float = IOU_THRESHOLD,
    distance_threshold: float = DISTANCE_THRESHOLD,
    fix_on_top_of: bool = False,
) -> SpatialJudgement:
    """Score one image from the detections of its two objects (None: not detected).

    ``0.25 * s1 + 0.25 * s2 + 0.5 * position`` when both are found, ``0.25 * s`` when one is,
    0 when none is or the prompt has no relation; a score below `floor` becomes 0 (official 0.5;
    0 keeps every score). Detection scores must lie in [0, 1].
    """
    if relation is None:
        return SpatialJudgement(0.0, None, "no spatial relation word in the prompt")
    if first is not None and second is not None:
        position, why = position_judgement(
            relation, first.box, second.box, iou_threshold, distance_threshold, fix_on_top_of
        )
        score = 0.25 * first.score + 0.25 * second.score + 0.5 * position
        reason = f"both objects found; position {position:.2f}: {why}"
    elif first is not None or second is not None:
        found = first if first is not None else second
        position, score = None, 0.25 * found.score  # type: ignore[union-attr]
        which = "first" if first is not None else "second"
        reason = f"only the {which} object ({found.label!r}) found"  # type: ignore[union-attr]
    else:
        position, score, reason = None, 0.0, "neither object found"
    if score < floor:
        return SpatialJudgement(0.0, position, f"{reason}; {score:.3f} < floor {floor:g} -> 0")
    return SpatialJudgement(min(1.0, score), position, reason)


def pick_detections(
    detections: list[Detection], names: tuple[str, str], distinct_same_name: bool = False
) -> tuple[Detection | None, Detection | None]:
    """The most confident detection labelled with each name (`detections` sorted by score).

    Officially both objects of "a dog on the left of a dog" take the same, most confident
    detection; `distinct_same_name` gives the second object the second most confident one.
    """
    first = [d for d in detections if d.label == names[0]]
    second = [d for d in detections if d.label == names[1]]
    if distinct_same_name and names[0] == names[1]:
        return (first[0] if first else None), (first[1] if len(first) > 1 else None)
    return (first[0] if first else None), (second[0] if second else None)
