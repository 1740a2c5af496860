"""T2I-CompBench++'s numeracy rule as pure functions of detections (no models).

Follows the official ``UniDet_eval/numeracy_eval.py`` of ``Karine-Huang/T2I-CompBench``:

1. Objects and counts come from the prompt's tokens and the official noun list
   (``examples/dataset/new_objects.txt``, lines "singular - plural"): a number word ("a", "an",
   "one" ... "eight") followed by a listed noun (or a listed two-word noun) names an object. After
   "a" / "an" / "one" a singular noun counts 1; after "two" ... "eight" a plural noun counts that
   number and is stored in the singular. So "a dog and three cats" asks for dog x1 and cat x3,
   and "six people gathered for a picnic" for person x6 ("picnic" is not listed). A listed
   two-word noun wins over a one-word one; officially only its plural after "two" ... "eight"
   takes the number, any other two-word match counts 1 (kept; the official list has none).
2. The object names become the detector's class names: boy, girl, man, woman -> person;
   ship -> boat; telivision -> tv; goldfish -> fish; painting -> picture (`OFFICIAL_RENAMES`).
3. Detections of one label that overlap almost entirely (IoU > 0.9, or the intersection covering
   > 90 % of either box, areas counted with the +1-pixel convention) are one object
   (`deduplicate`, greedy, most confident first).
4. Each of the n objects weighs 1/n: half of it when the object is detected at all, the other
   half when it is detected exactly the asked number of times. The image score is the sum, in
   [0, 1].

Differences from the official code (none changes a benchmark prompt's score):

- Tokens are words and single punctuation marks (`tokens`) instead of spaCy's, which split the
  benchmark prompts the same way; the prompt is lower-cased first (the official code matches
  case-sensitively; all benchmark prompts are lower-case).
- Cases where the official script crashes or misaligns counts are given a meaning: a number word
  as the last token is skipped (officially an IndexError); "two" ... "eight" before a singular
  noun that has no plural entry asks for that number (officially a ValueError); "a" / "an" before
  a plural noun asks for 1 (officially the count is not recorded, shifting later counts); a prompt
  with no countable object scores 0 (officially a division by zero).
- The official detector (UniDet) names classes in its own label space and the script matches a
  wanted name as a substring of a detected class name; the detector here is queried with the
  wanted names themselves, so labels match exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rewards.detection import Detection
from rewards.spatial_rule import Box, to_official_frame

# Number words the official script looks for, and what each counts.
NUMBER_WORDS: dict[str, int] = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
}
_SINGULAR_ARTICLES = ("a", "an", "one")
# Prompt noun -> UniDet class name (the official renames; "telivision" is spelled as there).
OFFICIAL_RENAMES: dict[str, str] = {
    "boy": "person", "girl": "person", "man": "person", "woman": "person",
    "ship": "boat", "telivision": "tv", "goldfish": "fish", "painting": "picture",
}
DUPLICATE_OVERLAP = 0.9
NOUN_FILE = "new_objects.txt"


@dataclass(frozen=True)
class NounList:
    """The official countable nouns: `singular[i]` and `plural[i]` name one object."""

    singular: tuple[str, ...]
    plural: tuple[str, ...]

    @classmethod
    def parse(cls, lines: Iterable[str]) -> NounList:
        """From "singular - plural" lines (blank lines skipped), lower-cased and stripped."""
        pairs = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.split(" - ")
            if len(parts) != 2:
                raise ValueError(f"noun list line {number} is {line!r}; expected 'singular - plural'")
            pairs.append((parts[0].strip().lower(), parts[1].strip().lower()))
        if not pairs:
            raise ValueError("the noun list is empty")
        singular, plural = zip(*pairs)
        return cls(tuple(singular), tuple(plural))

    def to_singular(self, plural: str) -> str:
        """The list's singular of `plural` (one of `self.plural`: ValueError otherwise)."""
        return self.singular[self.plural.index(plural)]


def load_noun_list() -> NounList:
    """The official noun list (`new_objects.txt`, fetched pinned or from GORS_DATA_DIR)."""
    from gors.core.prompts import fetch_t2i_compbench_file

    return NounList.parse(fetch_t2i_compbench_file(NOUN_FILE).read_text(encoding="utf-8-sig").splitlines())


def tokens(prompt: str) -> list[str]:
    """Lower-cased words and single punctuation marks: "four tents, two boats" -> four|tents|,|two|boats."""
    return re.findall(r"\w+|[^\w\s]", prompt.lower())


@dataclass(frozen=True)
class CountedObject:
    """One object the prompt asks for.

    Attributes:
        noun: the prompt's noun in the singular (e.g. "woman").
        name: the name detected and counted (after `OFFICIAL_RENAMES`, e.g. "person").
        count: how many the prompt asks for, >= 1.
    """

    noun: str
    name: str
    count: int


def counted_objects(prompt: str, nouns: NounList, renames: dict[str, str] | None = None) -> list[CountedObject]:
    """The objects and counts the prompt asks for, in prompt order (see the module docstring).

    Args:
        prompt: the text prompt.
        nouns: the countable nouns (`load_noun_list()` for the official list).
        renames: noun -> detected name; None for `OFFICIAL_RENAMES`, {} to detect the nouns as written.
    """
    renames = OFFICIAL_RENAMES if renames is None else renames
    words = tokens(prompt)
    found = []
    for i, word in enumerate(words[:-1]):  # a number word needs a noun after it
        if word not in NUMBER_WORDS:
            continue
        article = word in _SINGULAR_ARTICLES
        number = 1 if article else NUMBER_WORDS[word]
        pair = " ".join(words[i + 1 : i + 3]) if i + 2 < len(words) else None
        noun = words[i + 1]
        # A listed two-word noun wins over a one-word one, as officially; its only counted form
        # is the plural after two..eight, otherwise it counts 1 as written.
        if pair is not None and (pair in nouns.singular or pair in nouns.plural):
            plural = pair in nouns.plural and not article
            found.append((nouns.to_singular(pair), number) if plural else (pair, 1))
        elif noun in nouns.singular and article:
            found.append((noun, 1))
        elif noun in nouns.plural:
            found.append((nouns.to_singular(noun), number))
        elif noun in nouns.singular:
            found.append((noun, number))  # "two dog": officially a crash; the number is meant
    return [CountedObject(noun, renames.get(noun, noun), count) for noun, count in found]


def _nearly_same(box1: Box, box2: Box, overlap: float = DUPLICATE_OVERLAP) -> bool:
    """Official duplicate test: IoU > overlap, or the intersection covers > overlap of either box.

    Areas use the +1-pixel convention of the official code (a box from x to x covers one pixel).
    """
    width = max(0.0, min(box1[2], box2[2]) - max(box1[0], box2[0]) + 1)
    height = max(0.0, min(box1[3], box2[3]) - max(box1[1], box2[1]) + 1)
    intersection = width * height
    area1 = (box1[2] - box1[0] + 1) * (box1[3] - box1[1] + 1)
    area2 = (box2[2] - box2[0] + 1) * (box2[3] - box2[1] + 1)
    iou = intersection / (area1 + area2 - intersection)
    return iou > overlap or intersection / area1 > overlap or intersection / area2 > overlap


def deduplicate(detections: Sequence[Detection], overlap: float = DUPLICATE_OVERLAP,
                image_size: tuple[int, int] | None = None) -> list[Detection]:
    """Drop each detection that nearly coincides with an earlier kept one of the same label.

    `detections` are sorted most confident first, so the most confident of a cluster is kept. With
    `image_size` (width, height), the test runs on the boxes in pixels of the official evaluation's resized
    image (`rewards.spatial_rule.to_official_frame`), where the +1-pixel areas weigh otherwise; the
    detections are returned as given.
    """
    boxes = [d.box if image_size is None else to_official_frame(d, *image_size).box for d in detections]
    kept: list[int] = []
    for i, detection in enumerate(detections):
        if not any(detections[k].label == detection.label and _nearly_same(boxes[k], boxes[i], overlap) for k in kept):
            kept.append(i)
    return [detections[i] for i in kept]


@dataclass(frozen=True)
class NumeracyJudgement:
    """The rule's verdict on one image.

    Attributes:
        score: in [0, 1].
        detected: per asked object, how many distinct detections it has (after `deduplicate`).
        reason: one sentence per object on how the score came about.
    """

    score: float
    detected: list[int]
    reason: str


def judge_numeracy(objects: Sequence[CountedObject], detections: Sequence[Detection]) -> NumeracyJudgement:
    """Score one image: each object weighs 1/n, half for being detected, half for the exact count.

    `detections` are those of the image, already deduplicated (`deduplicate`).
    """
    if not objects:
        return NumeracyJudgement(0.0, [], "the prompt names no countable object of the official noun list")
    weight = 1.0 / len(objects)
    score, detected, reasons = 0.0, [], []
    for obj in objects:
        seen = sum(d.label == obj.name for d in detections)
        detected.append(seen)
        if seen == 0:
            reasons.append(f"{obj.name}: none detected (asked {obj.count})")
            continue
        score += 0.5 * weight
        if seen == obj.count:
            score += 0.5 * weight
            reasons.append(f"{obj.name}: {seen} detected, as asked")
        else:
            reasons.append(f"{obj.name}: {seen} detected, asked {obj.count}")
    return NumeracyJudgement(min(1.0, score), detected, "; ".join(reasons))
