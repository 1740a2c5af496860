"""Soft-TIFA's rules as pure functions: atom questions, answer variants, atom scores, aggregation.

GenEval 2 (Kamath et al., 2025; `facebookresearch/GenEval2`, ``evaluation.py``) asks a VLM one
question per atom of the prompt, e.g. for "four white bicycles in front of three plastic cows"::

    How many bicycles are in the image?      four
    Are the bicycles white?                  Yes
    Are there any bicycles in the image?     Yes
    Are the bicycles in front of the cows?   Yes
    How many cows are in the image?          three
    ...

and scores an atom by the next-token probability of the expected answer, summed over its
spellings ("answer variants"). This module holds everything of that which needs no model:

- `prompt_atoms`: GenEval-2-style questions written from a prompt by a rule-based parser (the
  benchmark ships its questions as ``vqa_list``; the parser serves other prompts);
- `answer_variants`, `variant_token_ids`, `variant_probability`: the soft atom score;
- `tifa_correct`: TIFA's hard 0/1 decision; `aggregate`: Soft-TIFA AM and GM.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rewards.noun_phrases import noun_phrases

Aggregation = Literal["am", "gm"]
MultiTokenPolicy = Literal["first", "skip"]

# The official prompt templates (GenEval 2's evaluation.py).
QUESTION_SUFFIX = " Answer in one word."
VQASCORE_TEMPLATE = 'Does this image show "{prompt}"? Answer the question with Yes or No.'

# The official variant lists: 'Yes', 'yes', ' yes', ' Yes' for every question that is not a
# "How many" question; `answer_variants` adds the same four spellings of "No" for an expected
# "No", which GenEval 2's data never contain.
YES_VARIANTS = ("Yes", "yes", " yes", " Yes")
NO_VARIANTS = ("No", "no", " no", " No")
# GenEval 2's `return_numeric_string` maps "one" ... "ten" to digits.
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
DIGIT_OF_WORD = {word: str(i) for i, word in enumerate(NUMBER_WORDS, start=1)}
WORD_OF_DIGIT = {digit: word for word, digit in DIGIT_OF_WORD.items()}


@dataclass(frozen=True)
class Atom:
    """One question about the image and the answer a faithful image gets.

    Attributes:
        question: the question, e.g. "How many cows are in the image?".
        answer: the expected answer: "Yes", "No", or a count ("four", "4").
        skill: what the atom checks: "object", "count", "attribute", "position" or "verb"
            (GenEval 2's skill names; "position" for spatial, "verb" for other relations).
    """

    question: str
    answer: str
    skill: str = "unspecified"


# --------------------------------------------------------------------------------------------
# Scoring rules.


def is_count_question(question: str) -> bool:
    """GenEval 2's rule: a question is about a count when it starts with "How many"."""
    return question.startswith("How many")


def answer_variants(question: str, answer: str) -> tuple[str, ...]:
    """The spellings of `answer` whose next-token probabilities add up to the atom's score.

    As GenEval 2's evaluation.py: a "How many" question with expected answer w gets
    ``w, w.capitalize(), " " + w, " " + w.capitalize()`` followed by the digit d of w and
    ``" " + d``; any other question gets ``YES_VARIANTS``. Differences, all for answers that
    GenEval 2's data never contain: an expected "No" gets ``NO_VARIANTS`` (the official code
    would score "Yes"); a count answer given as a digit 1-10 gets its number word's four
    spellings after its own; a count beyond "ten" gets no digit variants (the official code
    scores the word "other" instead); an expected answer other than yes/no/count gets its own
    four spellings.
    """
    answer = answer.strip()
    low = answer.lower()
    if is_count_question(question):
        variants = [answer, answer.capitalize(), " " + answer, " " + answer.capitalize()]
        if low in DIGIT_OF_WORD:
            variants += [DIGIT_OF_WORD[low], " " + DIGIT_OF_WORD[low]]
        elif low in WORD_OF_DIGIT:
            word = WORD_OF_DIGIT[low]
            variants += [word, word.capitalize(), " " + word, " " + word.capitalize()]
        return tuple(dict.fromkeys(variants))
    if low == "no":
        return NO_VARIANTS
    if low == "yes":
        return YES_VARIANTS
    return tuple(dict.fromkeys([answer, answer.capitalize(), " " + answer, " " + answer.capitalize()]))


def variant_token_ids(
    variant_ids: Sequence[Sequence[int]], multi_token: MultiTokenPolicy = "first"
) -> list[int]:
    """Distinct next-token ids whose probabilities make an atom's score, in first-seen order.

    Args:
        variant_ids: the tokenizer's ids of each answer variant (no special tokens).
        multi_token: a variant of several tokens contributes its first token ("first", as
            GenEval 2's ``tokenizer.encode(answer)[0]``; with Qwen's tokenizer " 4" is a space
            then "4", so "first" counts the space token) or nothing ("skip": only variants that
            are one token count).

    An id shared by several variants is counted once (the official code would add its
    probability twice; with Qwen3-VL's tokenizer GenEval 2's variants have no shared ids).
    """
    if multi_token not in ("first", "skip"):
        raise ValueError(f"multi_token must be 'first' or 'skip', got {multi_token!r}")
    ids: list[int] = []
    for tokens in variant_ids:
        if not tokens or (multi_token == "skip" and len(tokens) > 1):
            continue
        if tokens[0] not in ids:
            ids.append(int(tokens[0]))
    return ids


def variant_probability(probabilities: torch.Tensor, token_ids: Sequence[int]) -> float:
    """Sum of `probabilities[i]` over the distinct `token_ids`, clamped to [0, 1].

    `probabilities` is one next-token distribution (vocabulary-sized, summing to 1); the clamp
    only removes float round-off, since distinct tokens' probabilities sum to at most 1.
    """
    if len(set(token_ids)) != len(token_ids):
        raise ValueError(f"token_ids must be distinct, got {list(token_ids)}")
    if not token_ids:
        return 0.0
    index = torch.tensor(list(token_ids), device=probabilities.device)
    total = float(probabilities.index_select(0, index).double().sum())
    return min(max(total, 0.0), 1.0)


def tifa_correct(predicted_token: str, variants: Sequence[str]) -> bool:
    """TIFA's hard decision, as GenEval 2: the lower-cased most probable next token (decoded,
    spaces kept) is one of the answer variants ("Yes" and " yes" match YES_VARIANTS)."""
    return predicted_token.lower() in variants


def aggregate(scores: Sequence[float], method: Aggregation = "am") -> float:
    """One image's score from its atom scores (each in [0, 1]); in [0, 1].

    "am" is the arithmetic mean (Soft-TIFA AM, atom-level), "gm" the geometric mean (Soft-TIFA GM,
    prompt-level; scipy's ``gmean`` in GenEval 2, so any zero atom gives 0). An image without
    atoms scores 1.0 (nothing to get wrong; the official script would divide by zero).
    """
    if method not in ("am", "gm"):
        raise ValueError(f"aggregation must be 'am' or 'gm', got {method!r}")
    if any(not 0.0 <= s <= 1.0 for s in scores):
        raise ValueError(f"atom scores must lie in [0, 1], got {list(scores)}")
    if not scores:
        return 1.0
    if method == "am":
        return math.fsum(scores) / len(scores)
    if min(scores) == 0.0:
        return 0.0
    return math.exp(math.fsum(math.log(s) for s in scores) / len(scores))


def atoms_from_vqa_list(vqa_list: Sequence[Sequence[str]], skills: Sequence[str] = ()) -> list[Atom]:
    """Atoms of GenEval 2's ``vqa_list`` (pairs [question, expected answer]) and ``skills``."""
    atoms = []
    for index, pair in enumerate(vqa_list):
        if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise ValueError(
                f"vqa_list[{index}] = {pair!r}: each entry must be [question, expected answer], "
                'e.g. ["Are there any cows in the image?", "Yes"]'
            )
        skill = skills[index] if index < len(skills) else "unspecified"
        atoms.append(Atom(pair[0], pair[1], skill))
    return atoms


# --------------------------------------------------------------------------------------------
# The prompt parser.



def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NUMBERS = _words(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
)
_SINGULAR_DETERMINERS = _words("a an one")
_OTHER_DETERMINERS = _words(
    "the this that these those some several many few each every any another its his her their "
    "my your our"
)
_PRONOUNS = _words("it they them he she him her we us i me you one")
# Nouns that name a side of something: inside a relation ("on the top of"), never an object.
_SPATIAL_NOUNS = _words("top bottom left right side front back middle center centre")
# Relation phrases that place one object relative to another (skill "position"); any other
# connecting words (verbs such as "playing with") make a "verb" atom.
_SPATIAL_RELATIONS = (
    "in front of",
    "behind",
    "to the left of",
    "to the right of",
    "on the left of",
    "on the right of",
    "on top of",
    "on the top of",
    "on the bottom of",
    "at the bottom of",
    "on side of",
    "on the side of",
    "next to",
    "near",
    "beside",
    "above",
    "below",
    "under",
    "over",
    "on",
    "in",
    "inside",
    "underneath",
    "beneath",
    "between",
)
_AUXILIARIES = _words("is are was were be being")
_PREPOSITIONS = _words(
    "in on at by with near under over above below behind beside beneath inside into onto to "
    "from of next underneath atop across along around against among between through"
)
# Attribute words: colours, materials, textures, shapes, sizes. Words before the head noun that
# are not attributes belong to the noun ("teddy bear", "pizza cutter").
_ATTRIBUTES = _words(
    """red orange yellow green blue purple pink brown black white gray grey golden silver gold
    beige turquoise teal maroon navy violet
    metal metallic wooden wood plastic glass stone rubber leather fabric paper ceramic marble
    brick concrete steel iron porcelain crystal cotton silk wool woolen velvet denim clay
    fluffy furry fuzzy shiny smooth rough soft hard hairy silky glossy matte transparent sparkly
    prickly bumpy spiky spotted striped checkered sparkling dotted
    round square oval triangular rectangular circular spherical cylindrical conical cubic
    pyramidal hexagonal oblong teardrop pentagonal crescent
    big small large tiny huge little tall short long wide thin thick narrow giant
    old new young happy sad cute"""
)
_ATTRIBUTE_SUFFIXES = ("ed", "en", "ic", "ous", "ful", "ish", "ular", "less")
_IRREGULAR_PLURALS = {
    "man": "men",
    "woman": "women",
    "person": "people",
    "child": "children",
    "mouse": "mice",
    "goose": "geese",
    "foot": "feet",
    "tooth": "teeth",
    "knife": "knives",
    "leaf": "leaves",
    "wolf": "wolves",
    "loaf": "loaves",
    "shelf": "shelves",
    "sheep": "sheep",
    "fish": "fish",
    "deer": "deer",
}
_IRREGULAR_SINGULARS = {plural: singular for singular, plural in _IRREGULAR_PLURALS.items()}


def pluralize(noun: str) -> str:
    """English plural of a singular noun ("bus" -> "buses", "cherry" -> "cherries"), capitalised as the noun is."""
    low = noun.lower()
    if low in _IRREGULAR_PLURALS:
        plural = _IRREGULAR_PLURALS[low]
        return plural.capitalize() if noun[0].isupper() else plural
    if low.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def looks_plural(noun: str) -> bool:
    """Guess whether a noun is plural, for a phrase without a number ("rubber gloves")."""
    low = noun.lower()
    if low in _IRREGULAR_SINGULARS:
        return True
    return low.endswith("s") and not low.endswith(("ss", "us", "is", "ous"))


@dataclass(frozen=True)
class _Object:
    """An object of the prompt: its noun (as written), plural form, number, count, attributes."""

    noun: str
    plural: str
    is_plural: bool
    count: str | None
    attributes: tuple[str, ...]


def _is_attribute(word: str) -> bool:
    low = word.lower()
    return low in _ATTRIBUTES or (len(low) > 4 and low.endswith(_ATTRIBUTE_SUFFIXES))


def _parse_object(phrase: str, of_tail: str) -> _Object | None:
    """An object from a noun phrase ("four white bicycles") and an "of" tail (" of pizza")."""
    words = phrase.split()
    count: str | None = None
    low = words[0].lower() if words else ""
    if low in _NUMBERS or low.isdigit():
        count = low
        words = words[1:]
    elif low in _SINGULAR_DETERMINERS:
        count = "one"
        words = words[1:]
    elif low in _OTHER_DETERMINERS:
        words = words[1:]
    if not words or (len(words) == 1 and words[0].lower() in _PRONOUNS):
        return None
    attributes: list[str] = []
    while len(words) > 1 and _is_attribute(words[0]):
        attributes.append(words.pop(0))
    head = " ".join(words)
    is_plural = count not in ("one", "1") if count is not None else looks_plural(words[-1])
    # A plural keeps the prompt's own word, as GenEval 2 does ("four sheeps", "two sheep").
    plural = head if is_plural else " ".join(words[:-1] + [pluralize(words[-1])])
    return _Object(head + of_tail, plural + of_tail, is_plural, count, tuple(attributes))


def _relation(connector: str) -> tuple[str, str] | None:
    """The relation named by the words between two objects, and its skill; None for "and".

    "in front of" -> ("in front of", "position"); "is holding" -> ("holding", "verb").
    """
    words = re.sub(r"[,;.]", " ", connector).lower().split()
    while words and words[0] in ("and", "or", "while", "which", "that", "who"):
        words = words[1:]
    while words and words[0] in _AUXILIARIES:
        words = words[1:]
    if not words:
        return None
    text = " ".join(words)
    if text in _SPATIAL_RELATIONS:
        return text, "position"
    return text, "verb"


def _verb_question(subject: _Object, relation: str, target: _Object) -> str:
    """A yes/no question that `subject` stands in `relation` to `target`."""
    first, _, rest = relation.partition(" ")
    be = "Are" if subject.is_plural else "Is"
    if first in _PREPOSITIONS or first.endswith(("ing", "ed")) or relation in _SPATIAL_RELATIONS:
        return f"{be} the {subject.noun} {relation} the {target.noun}?"
    # A finite verb ("rises over", "sit on"): "Does the sun rise over the sea?"
    base = first
    if not subject.is_plural and first.endswith("s") and not first.endswith("ss"):
        base = first[:-3] + "y" if first.endswith("ies") else first[:-1]
        if first.endswith(("ches", "shes", "xes", "sses", "zes")):
            base = first[:-2]
    do = "Do" if subject.is_plural else "Does"
    return f"{do} the {subject.noun} {f'{base} {rest}'.strip()} the {target.noun}?"


def prompt_atoms(prompt: str) -> list[Atom]:
    """GenEval-2-style atoms of a prompt, written by a rule-based parser (no model).

    Objects are the noun phrases of `rewards.noun_phrases.noun_phrases(prompt, "builtin")`
    (phrases naming a side, like "the top" in "on the top of", belong to the relation; an
    "of" joins two phrases into one object: "a slice of pizza"). For each object, in prompt
    order, as GenEval 2's ``vqa_list``:

    - "How many {plural} are in the image?" -> the count, when the prompt gives one ("a"/"an"
      counts as "one", as in GenEval 2);
    - "Is the {noun} {attribute}?" / "Are the {plural} {attribute}?" -> "Yes", per attribute
      word (colours, materials, textures, shapes, sizes, and -ed/-en/-ic/... adjectives);
    - "Are there any {plural} in the image?" -> "Yes";
    - "Is the {noun} {relation} the {next object}?" -> "Yes", when words other than "and" join
      the object to the next one ("in front of": skill "position"; "playing with": "verb").

    Exact on GenEval 2's templates ("four white bicycles in front of three plastic cows") but for
    the plural of a single sheep (GenEval 2's data asks "How many sheeps ...", gors "sheep"), and
    T2I-CompBench's ("a green bench and a red car", "a horse on the right of a man");
    approximate on free-form sentences, like the chunker it is built on.
    """
    text = prompt.strip()
    spans: list[tuple[int, int]] = []
    cursor = 0
    for phrase in noun_phrases(text, "builtin"):
        start = text.find(phrase, cursor)
        if start < 0:
            raise RuntimeError(f"noun phrase {phrase!r} is not in the prompt {text!r}")
        cursor = start + len(phrase)
        words = phrase.lower().split()
        if words and words[0] in _OTHER_DETERMINERS:
            words = words[1:]
        if len(words) == 1 and words[0] in _SPATIAL_NOUNS:
            continue  # "the top" of "on the top of": part of the relation
        spans.append((start, cursor))

    # Join "X of Y" into one object ("a triangular slice of pizza"); an "of" that ends a
    # relation ("in front of") lies between two objects, never alone between two phrases.
    objects: list[_Object] = []
    connectors: list[str] = []
    last_end = 0
    index = 0
    while index < len(spans):
        start, head_end = spans[index]
        end = head_end
        while index + 1 < len(spans) and text[end : spans[index + 1][0]].strip().lower() == "of":
            index += 1
            end = spans[index][1]
        parsed = _parse_object(text[start:head_end], text[head_end:end])
        if parsed is not None:
            if objects:
                connectors.append(text[last_end:start])
            objects.append(parsed)
            last_end = end
        index += 1

    atoms: list[Atom] = []
    for position, obj in enumerate(objects):
        if obj.count is not None:
            atoms.append(Atom(f"How many {obj.plural} are in the image?", obj.count, "count"))
        be = "Are" if obj.is_plural else "Is"
        for attribute in obj.attributes:
            atoms.append(Atom(f"{be} the {obj.noun} {attribute.lower()}?", "Yes", "attribute"))
        atoms.append(Atom(f"Are there any {obj.plural} in the image?", "Yes", "object"))
        if position + 1 < len(objects):
            relation = _relation(connectors[position])
            if relation is not None:
                question = _verb_question(obj, relation[0], objects[position + 1])
                atoms.append(Atom(question, "Yes", relation[1]))
    return atoms
