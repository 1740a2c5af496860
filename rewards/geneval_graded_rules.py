"""GenEval with partial credit: per-clause credits of detections, combined into a score in [0, 1].

GenEval's verdict (`rewards.geneval_rules`) is 0 or 1 per image; reward-driven training needs to
tell a near miss from an empty image. Same detections, thresholds, colour classifier and position
rule as the binary judgement; each clause earns credits in [0, 1]:

- include {class, count c, [color], [position]}, with n kept objects of the class and `found` the
  min(n, c) most confident of them (GenEval's own choice of objects):
  - class: 1 when n >= 1, else 0;
  - count (only when c > 1; for c = 1 it would repeat the class credit): min(n, c) / c;
  - color (clauses with a colour): the objects of `found` classified as the colour, over c;
  - position (clauses with a position): the (object of `found`, object of the target clause's
    `found`) pairs that stand in the relation, over c x c_target.
- exclude {class, count e} (GenEval's "fewer than e"): 1 when n < e, else
  max(0, 1 - (n - e + 1) / e), i.e. one e-th less per object too many.

score = (mean of every include credit, all weighing the same) x (product of the exclude credits).
Exclude clauses veto in GenEval (one match makes the image wrong), so they scale the score instead
of adding to the mean, where an image without any object would earn them for free. The score is
1.0 exactly when GenEval judges the image correct: every credit is 1 then, and only then.

Where Flow-GRPO's partial reward (yifan123/reward-server `reward_server/gen_eval.py`,
`evaluate_reward`) differs:
- its count credit is 1 - |c - n| / c over all n detections: negative once n > 2c (a count-1
  clause with 3 objects adds -1), so its score leaves [0, 1]; ours is min(n, c) / c and too many
  objects cost only through GenEval's exclude clauses (the counting prompts'), clipped at 0;
- its "strict" verdict needs exactly c objects, not GenEval's >= c (plus exclude clauses), so its
  1.0 is not GenEval-correct; it ignores exclude clauses;
- when the count is wrong it gives colour and position one 0 together; ours credits the colour of
  the objects that are there and the relation of the pairs that are there;
- a failed relation adds both 0 and 1 (a 1.0 is appended after the pair loop whatever happened),
  so it earns half; ours gives the share of pairs in the relation;
- it checks position only when the clause's colour and its target clause held; ours whenever
  both sides have objects.

`grade_image` returns GenEval's verdict and reason too, and one official reason per clause (the
line the binary rule gives for that clause, "" where it holds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewards.geneval_rules import (
    COUNTING_THRESHOLD,
    MAX_OBJECTS,
    POSITION_THRESHOLD,
    THRESHOLD,
    ColorClassifier,
    GenEvalObject,
    check_metadata,
    confidence_threshold,
    evaluate_clauses,
    keep_objects,
    relative_position,
)


@dataclass(frozen=True)
class ClauseGrade:
    """The credits of one clause.

    Attributes:
        kind: "include" or "exclude".
        index: the clause's position in its list.
        classname: the clause's class.
        credits: name -> credit in [0, 1] (include: class, count, color, position as they apply;
            exclude: excess).
        reason: GenEval's reason for this clause ("" when it holds in GenEval's binary sense).
    """

    kind: str
    index: int
    classname: str
    credits: dict[str, float]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The grade as a score's JSON details (the class under `class`)."""
        return {"kind": self.kind, "index": self.index, "class": self.classname, "credits": dict(self.credits),
                "reason": self.reason}


@dataclass(frozen=True)
class GradedJudgement:
    """The graded verdict on one image.

    Attributes:
        score: in [0, 1]; 1.0 exactly when `correct`.
        correct: GenEval's binary verdict.
        reason: GenEval's reason, one line per failed clause ("" when correct).
        clauses: the credits of each include clause, then of each exclude clause.
        details: JSON-serialisable: tag, threshold, score, correct, reason, clauses, detections.
    """

    score: float
    correct: bool
    reason: str
    clauses: list[ClauseGrade]
    details: dict[str, Any]


def remember_colors(classify_colors: ColorClassifier) -> ColorClassifier:
    """`classify_colors` asked at most once per object; later calls reuse that object's colour.

    The graded credits and GenEval's verdict then see the same colours, and CLIP runs once per
    object. Objects are known by identity, so the cache lives only as long as one image's detections.
    """
    known: dict[tuple[str, int], str] = {}

    def classify_once(classname: str, objects: Sequence[GenEvalObject]) -> list[str]:
        new = [obj for obj in objects if (classname, id(obj)) not in known]
        if new:
            for obj, colour in zip(new, classify_colors(classname, new), strict=True):
                known[(classname, id(obj))] = colour
        return [known[(classname, id(obj))] for obj in objects]

    return classify_once


def exclude_credit(present: int, count: int) -> float:
    """Credit in [0, 1] of an exclude clause "fewer than `count`" with `present` objects of its class."""
    too_many = max(0, present - count + 1)
    return max(0.0, 1.0 - too_many / count)


def include_credits(
    objects: Mapping[str, Sequence[GenEvalObject]],
    metadata: Mapping[str, Any],
    classify_colors: ColorClassifier,
    position_threshold: float = POSITION_THRESHOLD,
) -> list[dict[str, float]]:
    """Per include clause: its credits (class, count, color, position as they apply), each in [0, 1]."""
    clauses = metadata.get("include", [])
    found = [list(objects.get(c["class"], []))[: c["count"]] for c in clauses]
    grades = []
    for clause, mine in zip(clauses, found):
        count = clause["count"]
        credits = {"class": 1.0 if mine else 0.0}
        if count > 1:
            credits["count"] = len(mine) / count
        if "color" in clause:
            colours = classify_colors(clause["class"], mine) if mine else []
            credits["color"] = colours.count(clause["color"]) / count
        if "position" in clause:
            relation, target = clause["position"]
            targets = found[target]
            pairs = sum(relation in relative_position(obj.box, other.box, position_threshold)
                        for obj in mine for other in targets)
            credits["position"] = pairs / (count * clauses[target]["count"])
        grades.append(credits)
    return grades


def clause_reasons(
    objects: Mapping[str, Sequence[GenEvalObject]],
    metadata: Mapping[str, Any],
    classify_colors: ColorClassifier,
    position_threshold: float = POSITION_THRESHOLD,
) -> list[str]:
    """GenEval's reason for each include clause, then each exclude clause ("" where it holds).

    The binary rule appends at most one line per include clause, in order: the new line of each
    prefix of the include list is that clause's. Pass a `remember_colors` classifier, or CLIP runs
    once per prefix.
    """
    reasons: list[str] = []
    include = list(metadata.get("include", []))
    before = 0
    for end in range(1, len(include) + 1):
        _, text = evaluate_clauses(objects, {"include": include[:end]}, classify_colors, position_threshold)
        lines = text.split("\n") if text else []
        reasons.append("\n".join(lines[before:]))
        before = len(lines)
    for clause in metadata.get("exclude", []):
        _, text = evaluate_clauses(objects, {"exclude": [clause]}, classify_colors, position_threshold)
        reasons.append(text)
    return reasons


def graded_score(include: Sequence[Mapping[str, float]], exclude: Sequence[float]) -> float:
    """(mean of every include credit) x (product of the exclude credits), in [0, 1]; 0 without credits."""
    credits = [value for clause in include for value in clause.values()]
    if not credits:
        return 0.0
    return sum(credits) / len(credits) * math.prod(exclude)


def grade_clauses(
    objects: Mapping[str, Sequence[GenEvalObject]],
    metadata: Mapping[str, Any],
    classify_colors: ColorClassifier,
    position_threshold: float = POSITION_THRESHOLD,
) -> tuple[float, bool, str, list[ClauseGrade]]:
    """(score, GenEval's correct, GenEval's reason, per-clause grades) of kept `objects` (per class,
    most confident first) against the clauses; see the module docstring."""
    classify = remember_colors(classify_colors)
    correct, reason = evaluate_clauses(objects, metadata, classify, position_threshold)
    reasons = clause_reasons(objects, metadata, classify, position_threshold)
    include = include_credits(objects, metadata, classify, position_threshold)
    exclude = [exclude_credit(len(objects.get(c["class"], [])), c["count"]) for c in metadata.get("exclude", [])]
    grades = [ClauseGrade("include", i, c["class"], credits, reasons[i])
              for i, (c, credits) in enumerate(zip(metadata.get("include", []), include))]
    grades += [ClauseGrade("exclude", i, c["class"], {"excess": credit}, reasons[len(include) + i])
               for i, (c, credit) in enumerate(zip(metadata.get("exclude", []), exclude))]
    return graded_score(include, exclude), correct, reason, grades


def grade_image(
    detections: Mapping[str, Sequence[GenEvalObject]],
    metadata: Mapping[str, Any],
    classify_colors: ColorClassifier,
    threshold: float = THRESHOLD,
    counting_threshold: float = COUNTING_THRESHOLD,
    max_objects: int = MAX_OBJECTS,
    position_threshold: float = POSITION_THRESHOLD,
) -> GradedJudgement:
    """The graded verdict on one image from all its detections (class name -> objects, any order).

    The same thresholds as `rewards.geneval_rules.judge_image`, then `grade_clauses`.
    """
    check_metadata(metadata)
    used = confidence_threshold(metadata["tag"], threshold, counting_threshold)
    objects = keep_objects(detections, used, max_objects)
    score, correct, reason, grades = grade_clauses(objects, metadata, classify_colors, position_threshold)
    details = {
        "tag": metadata["tag"],
        "score": score,
        "correct": correct,
        "reason": reason,
        "clauses": [grade.to_dict() for grade in grades],
        "threshold": used,
        "detections": {name: [o.to_dict() for o in objs] for name, objs in objects.items()},
    }
    return GradedJudgement(score, correct, reason, grades, details)
