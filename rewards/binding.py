"""Attribute binding from segments: the pure rules of the Grounded-SAM reward (no models).

A prompt's noun phrases split into attribute words and an object ("a green bench" ->
("green", "bench"), "the dull brown tree trunk" -> ("dull brown", "tree trunk")). Given the
masks and confidences of the detected objects and attributes of an image, each (attribute,
object) pair scores

    pair = max over object segments o and attribute segments a of
           IoU(mask_o, mask_a) * sqrt(confidence_o * confidence_a)            in [0, 1]

and the image scores the mean over its pairs. A prompt without any attribute scores object
presence: the mean over its objects of the highest confidence of a detection of that object.
A prompt without any object scores 0 (nothing to check, so nothing to reward; B-VQA's empty
product would say 1, which would select every such image at full weight).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewards.noun_phrases import Backend, noun_phrases


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# T2I-CompBench's attribute words (the colour, shape and texture prompts' vocabulary) and common
# synonyms. A word of a noun phrase is an attribute when it is one of these, or when it precedes
# one ("dull brown", "light brown"); the final word of a phrase is always the object ("a red
# orange"). Nouns that mostly start compound nouns ("paper towel", "heart locket") are left out.
COLORS = _words(
    "red orange yellow green blue purple pink brown black white gray grey gold golden silver "
    "beige turquoise maroon teal cyan magenta crimson scarlet tan navy violet indigo lavender "
    "whitish reddish bluish greenish yellowish brownish"
)
SHAPES = _words(
    "big small large tiny huge little tall short long wide thin thick narrow giant round square "
    "oval oblong circular rectangular triangular spherical cylindrical conical cubic pyramidal "
    "pentagonal hexagonal octagonal teardrop diamond crescent curved flat"
)
TEXTURES = _words(
    "metallic metal wooden wood fluffy furry fuzzy plastic glass rubber leather fabric silk silky "
    "wool woolen woollen velvet denim cotton marble stone brick concrete steel iron ceramic "
    "porcelain crystal shiny glossy matte transparent"
)
ATTRIBUTE_WORDS = COLORS | SHAPES | TEXTURES
_ATTRIBUTE_SUFFIXES = ("-shaped", "-colored", "-coloured")
# Words before the attribute words that say which or how many, not what kind.
_DETERMINERS = _words(
    "a an the this that these those each every some any no another other either neither both all "
    "its his her their my your our many several few one two three four five six seven eight nine "
    "ten twelve dozen"
)
_PRONOUNS = _words(
    "it they them he she him we us i me you itself themselves something someone everything "
    "nothing anything"
)
# Noun phrases of a relation ("on the top of", "to the left of"), not objects.
_POSITIONS = _words("top bottom left right side middle center centre front back")


@dataclass(frozen=True)
class BindingPhrase:
    """One noun phrase of a prompt, split into attribute words and object words (lower case).

    `attribute` is "" when the phrase has none ("a mirror"); `object` is never empty.
    """

    phrase: str
    attribute: str
    object: str


def is_attribute_word(word: str) -> bool:
    """True for a colour, shape or texture word ("green", "cylindrical", "wooden", "star-shaped")."""
    low = word.lower().strip(",")
    if low in ATTRIBUTE_WORDS or low.endswith(_ATTRIBUTE_SUFFIXES):
        return True
    # "diamond-studded", "black-and-white"
    return "-" in low and low.split("-")[0] in ATTRIBUTE_WORDS


def split_phrase(phrase: str) -> BindingPhrase | None:
    """Attribute and object words of one noun phrase; None when it names no object.

    Leading determiners and numbers are dropped; the object is the words after the last
    attribute word (at least the final word), the attribute everything before it, commas
    removed: "A long, narrow yellow kitchen" -> ("long narrow yellow", "kitchen"),
    "a cylindrical pizza cutter" -> ("cylindrical", "pizza cutter"). Pronouns and positions
    ("it", "the top") name no object.
    """
    words = [w.strip(",") for w in phrase.lower().split()]
    words = [w for w in words if w]
    start = 0
    while start < len(words) and words[start] in _DETERMINERS:
        start += 1
    words = words[start:]
    if not words or words[-1] in _PRONOUNS or words[-1] in _POSITIONS:
        return None
    last_attribute = max((i for i, w in enumerate(words[:-1]) if is_attribute_word(w)), default=-1)
    attribute = words[: last_attribute + 1]
    while attribute and attribute[0] in ("and", "or"):
        attribute = attribute[1:]
    return BindingPhrase(
        phrase=phrase, attribute=" ".join(attribute), object=" ".join(words[last_attribute + 1 :])
    )


def binding_phrases(prompt: str, backend: Backend = "auto") -> list[BindingPhrase]:
    """The prompt's noun phrases that name an object, split into (attribute, object), in order.

    "a triangular slice of pizza and a cylindrical pizza cutter" ->
    [("triangular", "slice"), ("", "pizza"), ("cylindrical", "pizza cutter")].
    `backend` chooses the noun-phrase parser (see `rewards.noun_phrases.noun_phrases`).
    """
    phrases = (split_phrase(p) for p in noun_phrases(prompt, backend))
    return [p for p in phrases if p is not None]


def query_labels(phrases: Sequence[BindingPhrase]) -> tuple[list[str], list[str]]:
    """The detector's object labels and attribute labels, each unique and in prompt order."""
    objects = list(dict.fromkeys(p.object for p in phrases))
    attributes = list(dict.fromkeys(p.attribute for p in phrases if p.attribute))
    return objects, attributes


@dataclass(frozen=True)
class Segment:
    """A detection with its mask.

    Attributes:
        label: the query label the detection matched.
        confidence: the detector's confidence, in [0, 1].
        mask: boolean array (height x width pixels of the image).
    """

    label: str
    confidence: float
    mask: np.ndarray


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks of one shape, in [0, 1]; 0.0 when both are empty."""
    if a.shape != b.shape:
        raise ValueError(f"masks of different shapes {a.shape} and {b.shape}")
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0


def box_mask(box: Sequence[float], width: int, height: int) -> np.ndarray:
    """Boolean (height x width) mask of the pixels whose centres lie in `box` (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    xs = np.arange(width) + 0.5
    ys = np.arange(height) + 0.5
    return ((ys >= y0) & (ys <= y1))[:, None] & ((xs >= x0) & (xs <= x1))[None, :]


def pair_score(
    attribute: str, obj: str, objects: Sequence[Segment], attributes: Sequence[Segment]
) -> dict[str, Any]:
    """Binding of `attribute` to `obj`: the best IoU x sqrt(conf_obj x conf_attr), in [0, 1].

    `objects` and `attributes` are the segments of the object pass and of the attribute pass;
    only those labelled `obj` and `attribute` count. Returns a JSON-serialisable dict with the
    score, the IoU and confidences of the best (object, attribute) segment pair (their indices
    in `objects` and `attributes`; None when one is missing) and a reason.
    """
    result: dict[str, Any] = {
        "attribute": attribute,
        "object": obj,
        "score": 0.0,
        "iou": 0.0,
        "object_confidence": 0.0,
        "attribute_confidence": 0.0,
        "object_segment": None,
        "attribute_segment": None,
    }
    object_ids = [i for i, s in enumerate(objects) if s.label == obj]
    attribute_ids = [i for i, s in enumerate(attributes) if s.label == attribute]
    if not object_ids:
        return {**result, "reason": f"no {obj!r} detected"}
    if not attribute_ids:
        return {**result, "reason": f"no {attribute!r} detected"}
    best = (-1.0, -1.0, object_ids[0], attribute_ids[0])
    for i in object_ids:
        for j in attribute_ids:
            iou = mask_iou(objects[i].mask, attributes[j].mask)
            score = iou * math.sqrt(objects[i].confidence * attributes[j].confidence)
            if score > best[0]:
                best = (score, iou, i, j)
    score, iou, i, j = best
    reason = (
        f"{attribute!r} overlaps {obj!r} with IoU {iou:.2f}"
        if iou > 0
        else f"no {attribute!r} region overlaps a {obj!r}"
    )
    return {
        **result,
        "score": min(1.0, max(0.0, score)),
        "iou": iou,
        "object_confidence": objects[i].confidence,
        "attribute_confidence": attributes[j].confidence,
        "object_segment": i,
        "attribute_segment": j,
        "reason": reason,
    }


def object_presence(obj: str, objects: Sequence[Segment]) -> dict[str, Any]:
    """Presence of `obj`: the highest confidence of a segment labelled `obj`, in [0, 1]."""
    confidences = [s.confidence for s in objects if s.label == obj]
    if not confidences:
        return {"object": obj, "score": 0.0, "reason": f"no {obj!r} detected"}
    score = max(confidences)
    return {"object": obj, "score": score, "reason": f"{obj!r} detected with confidence {score:.2f}"}


def binding_score(
    phrases: Sequence[BindingPhrase], objects: Sequence[Segment], attributes: Sequence[Segment]
) -> tuple[float, dict[str, Any]]:
    """Image score in [0, 1] and its explanation, from the prompt's phrases and the segments.

    The mean of `pair_score` over the unique (attribute, object) pairs; without any pair the
    mean of `object_presence` over the unique objects; 0.0 without any object (nothing the image
    could get right, so nothing to reward: 1.0 would select every such image). Beside pairs,
    objects named without an attribute are not scored (an attribute-binding reward: their
    presence is not what it judges). The dict holds
    "pairs" (one `pair_score` dict each), "presence" (one `object_presence` dict per object,
    only when there is no pair), "score" and "reason".
    """
    pairs = list(dict.fromkeys((p.attribute, p.object) for p in phrases if p.attribute))
    if pairs:
        scored = [pair_score(a, o, objects, attributes) for a, o in pairs]
        score = sum(p["score"] for p in scored) / len(scored)
        weakest = min(scored, key=lambda p: p["score"])
        reason = f"mean of {len(scored)} pair(s); weakest {weakest['attribute']!r} + " + (
            f"{weakest['object']!r}: {weakest['reason']}"
        )
        return score, {"pairs": scored, "presence": [], "score": score, "reason": reason}
    objs = list(dict.fromkeys(p.object for p in phrases))
    if not objs:
        # Nothing the image could get right: as a reward it must not select every image at full weight.
        return 0.0, {"pairs": [], "presence": [], "score": 0.0, "reason": "no object to check"}
    presence = [object_presence(o, objects) for o in objs]
    score = sum(p["score"] for p in presence) / len(presence)
    reason = f"no attribute in the prompt: mean presence of {len(objs)} object(s)"
    return score, {"pairs": [], "presence": presence, "score": score, "reason": reason}
