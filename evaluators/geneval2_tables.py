"""GenEval 2's reported numbers from per-atom Soft-TIFA scores (pure functions, no models).

As GenEval 2's ``soft_tifa_analysis.py`` and ``evaluation.py`` (`facebookresearch/GenEval2`,
CC BY-NC 4.0) compute them, all x100:

- overall Soft-TIFA AM / GM (``evaluation.py``'s total): the mean over images of each image's
  arithmetic / geometric mean of its atom scores;
- per-skill table (Soft-TIFA AM, atom level): for each skill, the mean of the scores of all atoms
  of that skill, pooled over every image (an image with three count atoms weighs three times),
  not a mean of per-image means;
- per-atomicity table (Soft-TIFA GM, prompt level): for each atom count 3..10 (the prompt's
  ``atom_count``, which leaves "a"/"and" out, so it may differ from the number of questions),
  the mean over the images of those prompts of each image's geometric mean (any zero atom makes
  it zero, as scipy's ``gmean``).

`markdown_tables` shows them as markdown, the scale in every column header.

Where the official script divides by zero (a skill or atomicity with nothing in it, e.g. on a
`max_prompts` subset), the table holds None instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from rewards.atoms import aggregate

SKILLS = ("object", "attribute", "count", "position", "verb")
ATOMICITIES = tuple(range(3, 11))
SCALE = 100.0


def _check_scores(score_lists: Sequence[Sequence[float]]) -> None:
    for index, scores in enumerate(score_lists):
        if not scores:
            raise ValueError(f"score list {index} is empty; every GenEval 2 image has at least one atom")
        if any(not 0.0 <= s <= 1.0 for s in scores):
            raise ValueError(f"score list {index} has scores outside [0, 1]: {list(scores)}")


def overall(score_lists: Sequence[Sequence[float]]) -> dict[str, float]:
    """{"soft_tifa_am", "soft_tifa_gm"}: x100 means over images of the per-image AM and GM."""
    if not score_lists:
        raise ValueError("no score lists: evaluate at least one image")
    _check_scores(score_lists)
    return {
        f"soft_tifa_{method}": SCALE * math.fsum(aggregate(s, method) for s in score_lists) / len(score_lists)
        for method in ("am", "gm")
    }


def per_skill_table(
    score_lists: Sequence[Sequence[float]], skill_lists: Sequence[Sequence[str]]
) -> dict[str, float | None]:
    """Soft-TIFA AM per skill, x100, pooled over atoms; None for a skill without atoms.

    `score_lists[i][j]` is the score of atom j of image i and `skill_lists[i][j]` its skill, one
    of `SKILLS` (anything else is an error, as in the official script).
    """
    if len(score_lists) != len(skill_lists):
        raise ValueError(f"{len(score_lists)} score lists but {len(skill_lists)} skill lists")
    _check_scores(score_lists)
    pooled: dict[str, list[float]] = {skill: [] for skill in SKILLS}
    for index, (scores, skills) in enumerate(zip(score_lists, skill_lists)):
        if len(scores) != len(skills):
            raise ValueError(f"image {index}: {len(scores)} atom scores but {len(skills)} skills")
        for score, skill in zip(scores, skills):
            if skill not in pooled:
                raise ValueError(f"image {index}: unrecognized skill {skill!r}; GenEval 2's skills are {SKILLS}")
            pooled[skill].append(score)
    return {skill: SCALE * math.fsum(v) / len(v) if v else None for skill, v in pooled.items()}


def per_atomicity_table(
    score_lists: Sequence[Sequence[float]], atom_counts: Sequence[int]
) -> dict[int, float | None]:
    """Soft-TIFA GM per atom count 3..10, x100: mean of the images' geometric means; None if none."""
    if len(score_lists) != len(atom_counts):
        raise ValueError(f"{len(score_lists)} score lists but {len(atom_counts)} atom counts")
    _check_scores(score_lists)
    groups: dict[int, list[float]] = {k: [] for k in ATOMICITIES}
    for index, (scores, count) in enumerate(zip(score_lists, atom_counts)):
        if count not in groups:
            raise ValueError(f"image {index}: atom_count {count!r} is outside GenEval 2's range 3..10")
        groups[count].append(aggregate(scores, "gm"))
    return {k: SCALE * math.fsum(v) / len(v) if v else None for k, v in groups.items()}


def format_analysis(per_skill: dict[str, float | None], per_atomicity: dict[int, float | None]) -> str:
    """The two tables as text, in the layout ``soft_tifa_analysis.py`` prints (2 decimals)."""

    def value(x: float | None) -> str:
        return "n/a" if x is None else str(round(x, 2))

    lines = ["Per Atom Type Analysis (Soft-TIFA AM)"]
    for skill in SKILLS:
        lines += [f"{skill.capitalize()}:", value(per_skill.get(skill))]
    lines += ["", "Per Atomicity Analysis (Soft-TIFA GM)"]
    for count in ATOMICITIES:
        lines += [f"Results for Atomicity={count}", value(per_atomicity.get(count))]
    return "\n".join(lines) + "\n"


# Summary key -> column header of the overall table.
OVERALL_COLUMNS = {"soft_tifa_gm": "Soft-TIFA GM", "soft_tifa_am": "Soft-TIFA AM", "tifa": "TIFA",
                   "vqascore": "VQAScore"}
_FORMAT: dict[str, Any] = {"tablefmt": "github", "floatfmt": ".2f", "missingval": "-"}


def markdown_tables(summary: Mapping[str, Any]) -> str:
    """The overall, per-skill and per-atomicity numbers of a GenEval 2 summary as three markdown
    tables, every value x100 (said in each header), 2 decimals as the official script prints,
    "-" for a number not computed (a column not scored, an empty skill or atomicity)."""
    overall_table = tabulate([[summary.get(key) for key in OVERALL_COLUMNS]],
                             headers=[f"{header} (x100)" for header in OVERALL_COLUMNS.values()], **_FORMAT)
    skills = tabulate([[skill, summary["per_skill_am"].get(skill)] for skill in SKILLS],
                      headers=["skill", "Soft-TIFA AM (x100)"], **_FORMAT)
    atomicities = tabulate([[count, summary["per_atomicity_gm"].get(str(count))] for count in ATOMICITIES],
                           headers=["atomicity", "Soft-TIFA GM (x100)"], **_FORMAT)
    return f"{overall_table}\n\n{skills}\n\n{atomicities}\n"
