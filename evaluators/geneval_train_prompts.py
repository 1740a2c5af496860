"""GenEval-style training prompts that share no clause combination with GenEval's 553 test prompts.

Reward-driven training on GenEval-style prompts (as Flow-GRPO does) must not train on the test
set. This module writes prompts with GenEval's templates, object list (the 80 COCO classes of
`object_names.txt`), colours, counts and relations, and GenEval's metadata (`tag`, `include`,
`exclude`, `prompt`, as in `evaluation_metadata.jsonl`), so that the `geneval` and
`geneval_graded` rewards can judge their images.

Templates and rules, from GenEval's generator (djghosh13/geneval `prompts/create_prompts.py`):
- two_object "a photo of {a A} and {a B}": two different classes;
- counting "a photo of {three} {As}": 2 to 4 objects, with the exclude clause count + 1;
- colors "a photo of {a red} {A}": any class but person, one of the 10 colours;
- position "a photo of {a A} {left of} {a B}": include [B, A at (relation, 0)];
- color_attr "a photo of {a red} {A} and {a blue} {B}": two different classes (not person) with
  two different colours;
- "a"/"an" by the first letter, plurals by appending "s" ("es" after an "s"), GenEval's quirks
  ("a photo of three persons") included, so training and test prompts read alike.

No overlap, stricter than distinct prompt text: a training prompt's combination, what its clauses
ask for regardless of wording, is none of a test prompt's. Combinations: two_object the unordered
pair of classes; counting (class, count); colors (class, colour); position the scene, so
"A left of B" and "B right of A" are one; color_attr the unordered pair of (class, colour). GenEval
tests single_object on all 80 classes, so no single_object training prompt exists.

Tag mix: equal shares of `num_prompts` over `tags` (default the five tags above; a remainder goes
to the first tags), drawn without repetition, then shuffled together so that the first N prompts
(`--max_prompts`) keep the mix. Deterministic in `seed`. Unused combinations per tag: two_object
3 061, counting 160, colors 696, position 12 541, color_attr 277 190; beyond 800 prompts counting
is full and the other tags share the rest equally.

Flow-GRPO (yifan123/flow_grpo `dataset/geneval_filter_test.py`) removes from its training rows only
those whose prompt text is a test prompt: a test combination in other words (other order, the
inverse relation) stays in its training set.

    python -m evaluators.geneval_train_prompts --output geneval_train.jsonl [--num_prompts 700] [--seed 0]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluators.geneval import load_geneval_metadata
from gors.core.data import ChecksumError, DownloadError
from gors.core.io import atomic_write_bytes, make_folder
from rewards.geneval_rules import COLORS, GENEVAL_CLASSES, RELATIONS, TAGS

TRAIN_TAGS = ("two_object", "counting", "colors", "position", "color_attr")
COUNTS = (2, 3, 4)  # GenEval's counting prompts: 2 to max_count = 4
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
UNCOLOURED = "person"  # GenEval writes no "[colour] person" prompts
DEFAULT_NUM_PROMPTS = 700  # a T2I-CompBench train split's size: the paper's GORS budget per category

Combination = tuple[Any, ...]


def with_article(name: str) -> str:
    """GenEval's article: "an" before a vowel letter, else "a"."""
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def make_plural(name: str) -> str:
    """GenEval's plural: "es" after a final "s", else "s"."""
    return f"{name}es" if name.endswith("s") else f"{name}s"


def combination(row: Mapping[str, Any]) -> Combination:
    """What a metadata row asks for, regardless of wording: (tag, ...) as in the module docstring."""
    tag, include = row["tag"], row["include"]
    if tag == "single_object":
        return (tag, include[0]["class"])
    if tag == "two_object":
        return (tag, *sorted(c["class"] for c in include))
    if tag == "counting":
        return (tag, include[0]["class"], include[0]["count"])
    if tag == "colors":
        return (tag, include[0]["class"], include[0]["color"])
    if tag == "position":
        target, subject = include
        relation = subject["position"][0]
        return (tag, *min((subject["class"], relation, target["class"]),
                          (target["class"], INVERSE[relation], subject["class"])))
    if tag == "color_attr":
        return (tag, *sorted((c["class"], c["color"]) for c in include))
    raise ValueError(f"unknown GenEval tag {tag!r}; GenEval's tags are {TAGS}")


@functools.cache  # color_attr has 277 290 combinations: built once per process
def candidates(tag: str, classes: tuple[str, ...] = GENEVAL_CLASSES) -> tuple[Combination, ...]:
    """Every combination of `tag` over `classes`, each once, in a fixed order."""
    names = sorted(classes)
    coloured = [name for name in names if name != UNCOLOURED]
    if tag == "two_object":
        return tuple((tag, a, b) for a, b in itertools.combinations(names, 2))
    if tag == "counting":
        return tuple((tag, name, count) for name in names for count in COUNTS)
    if tag == "colors":
        return tuple((tag, name, colour) for name in coloured for colour in COLORS)
    if tag == "position":
        scenes = {min((a, r, b), (b, INVERSE[r], a)) for a, b in itertools.permutations(names, 2) for r in RELATIONS}
        return tuple((tag, *scene) for scene in sorted(scenes))
    if tag == "color_attr":
        return tuple((tag, (a, ca), (b, cb)) for a, b in itertools.combinations(coloured, 2)
                     for ca, cb in itertools.permutations(COLORS, 2))
    raise ValueError(f"tag {tag!r} has no training prompts; choose among {TRAIN_TAGS}")


def metadata_row(key: Combination, rng: np.random.Generator) -> dict[str, Any]:
    """GenEval's metadata row of a combination; `rng` picks the wording where several say the same."""
    tag = key[0]
    swap = rng.random() < 0.5  # one draw per row, whatever its tag
    if tag == "two_object":
        _, a, b = key
        if swap:
            a, b = b, a
        return {"tag": tag, "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
                "prompt": f"a photo of {with_article(a)} and {with_article(b)}"}
    if tag == "counting":
        _, name, count = key
        return {"tag": tag, "include": [{"class": name, "count": count}],
                "exclude": [{"class": name, "count": count + 1}],
                "prompt": f"a photo of {NUMBERS[count]} {make_plural(name)}"}
    if tag == "colors":
        _, name, colour = key
        return {"tag": tag, "include": [{"class": name, "count": 1, "color": colour}],
                "prompt": f"a photo of {with_article(colour)} {name}"}
    if tag == "position":
        _, a, relation, b = key
        if swap:
            a, relation, b = b, INVERSE[relation], a
        return {"tag": tag, "include": [{"class": b, "count": 1}, {"class": a, "count": 1, "position": [relation, 0]}],
                "prompt": f"a photo of {with_article(a)} {relation} {with_article(b)}"}
    _, first, second = key
    (a, ca), (b, cb) = (second, first) if swap else (first, second)
    return {"tag": tag, "include": [{"class": a, "count": 1, "color": ca}, {"class": b, "count": 1, "color": cb}],
            "prompt": f"a photo of {with_article(ca)} {a} and {with_article(cb)} {b}"}


def tag_shares(num_prompts: int, capacities: Mapping[str, int]) -> dict[str, int]:
    """Equal shares of `num_prompts` over the tags of `capacities` (in its order), each at most its
    capacity: what a full tag cannot take is shared among the others; a remainder goes to the first tags.

    Raises ValueError when the capacities add up to fewer than `num_prompts`.
    """
    if num_prompts > sum(capacities.values()):
        raise ValueError(f"num_prompts={num_prompts}, but the tags {list(capacities)} have only "
                         f"{sum(capacities.values())} combinations that are not GenEval test prompts "
                         f"({', '.join(f'{tag} {n}' for tag, n in capacities.items())}); ask for fewer prompts")
    shares = dict.fromkeys(capacities, 0)
    left, open_tags = num_prompts, list(capacities)
    while left:  # each pass hands out everything or fills at least one tag
        base, extra = divmod(left, len(open_tags))
        for index, tag in enumerate(open_tags):
            given = min(base + (index < extra), capacities[tag] - shares[tag])
            shares[tag] += given
            left -= given
        open_tags = [tag for tag in open_tags if shares[tag] < capacities[tag]]
    return shares


def generate_train_prompts(
    num_prompts: int = DEFAULT_NUM_PROMPTS,
    seed: int = 0,
    tags: Sequence[str] = TRAIN_TAGS,
    evaluation_rows: Iterable[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """`num_prompts` GenEval metadata rows (tag, include, [exclude], prompt), none of whose
    combinations is among `evaluation_rows` (default: GenEval's 553, pinned); distinct
    combinations read differently, so no prompt text is a test prompt either.

    Raises ValueError before any work when a tag is unknown or the tags have fewer unused
    combinations than `num_prompts`.
    """
    if num_prompts < 1:
        raise ValueError(f"num_prompts={num_prompts}: ask for at least one prompt")
    unknown = [tag for tag in tags if tag not in TRAIN_TAGS]
    if unknown or not tags or len(set(tags)) != len(tags):
        raise ValueError(f"tags={list(tags)!r}: give distinct tags among {TRAIN_TAGS} (single_object has no "
                         "combination left: GenEval tests all 80 classes)")
    rows = list(load_geneval_metadata() if evaluation_rows is None else evaluation_rows)
    taken = {combination(row) for row in rows}
    pools = {tag: [key for key in candidates(tag) if key not in taken] for tag in tags}
    shares = tag_shares(num_prompts, {tag: len(pool) for tag, pool in pools.items()})
    rng = np.random.default_rng(seed)
    chosen = []
    for tag in tags:
        pool = pools[tag]
        chosen += [metadata_row(pool[i], rng) for i in sorted(rng.choice(len(pool), shares[tag], replace=False))]
    return [chosen[i] for i in rng.permutation(len(chosen))]


def write_train_prompts(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write `rows` as JSON lines (GenEval's `evaluation_metadata.jsonl` format), atomically; returns the path."""
    path = Path(path)
    make_folder(path.parent)
    atomic_write_bytes(path, "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8"))
    return path


def main(argv: Sequence[str] | None = None) -> Path:
    """Command line: write GenEval-style training prompts to --output."""
    parser = argparse.ArgumentParser(prog="python -m evaluators.geneval_train_prompts",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the .jsonl file to write (a --train_prompts for gors run)")
    parser.add_argument("--num_prompts", type=int, default=DEFAULT_NUM_PROMPTS, help="how many prompts (default 700)")
    parser.add_argument("--seed", type=int, default=0, help="which prompts and wordings (default 0)")
    parser.add_argument("--tags", nargs="+", default=list(TRAIN_TAGS), help=f"tags, equal shares (default {TRAIN_TAGS})")
    args = parser.parse_args(argv)
    try:
        rows = generate_train_prompts(args.num_prompts, args.seed, args.tags)
        path = write_train_prompts(args.output, rows)
    except (DownloadError, ChecksumError) as err:  # GenEval's metadata file, fetched once
        raise SystemExit(f"error: {err} (`gors download evaluate --benchmarks geneval` fetches the same file)") from None
    except (ValueError, OSError) as err:
        raise SystemExit(f"error: {err}") from None
    print(f"wrote {args.num_prompts} GenEval-style training prompts to {path}")
    return path


if __name__ == "__main__":
    main()
