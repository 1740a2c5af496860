"""T2I-CompBench's MLLM chain-of-thought judge: the official questions per category and the score parser.

Source: ``MLLM_eval/MiniGPT4-CoT_eval/`` of ``Karine-Huang/T2I-CompBench`` at commit
1b7094991a57f3c22abdd4f6e8ba6c1a15517073 (`gors.core.prompts.T2I_COMPBENCH_COMMIT`; the MLLM
files were added in ac7b5aa and are unchanged at that commit). The paper's MLLM evaluation
(MiniGPT-4 with chain of thought) asks, in one conversation about the image:

1. a description question (``Q1``) naming what to look at in the category;
2. the scoring question(s), with the category's rating criteria on a 0-100 scale:
   - color, shape, texture (``mGPT_cot_attribute.py``): one question per noun phrase of the
     prompt (spaCy noun chunks), the first with the criteria 100 / 75 / 20 / 10 written for the
     phrase's noun and attribute, the next ones "according to the same criteria"; the image
     scores the mean of the phrases' scores;
   - spatial, non-spatial, complex (``mGPT_cot_general.py``): one question quoting the prompt,
     with criteria 100 / 80 / 60 / 40 / 20.

The texts below are the official strings exactly, including their missing spaces (e.g.
"in the image?Give a score"), so that the judge reads what the paper's judge read.
T2I-CompBench++'s 3d_spatial and numeracy have no MiniGPT-4 questions: 3d_spatial asks the
spatial ones (as the official ShareGPT4V script ``Share_eval.py`` does); numeracy asks
``Share_eval.py``'s numeracy description, and its numeracy criteria (1-5) in the form of MiniGPT-4's
complex question on the 0-100 scale (5 -> 100, ..., 1 -> 20, the mapping between the two
scripts' spatial criteria): these two questions are gors' own, not an official text.

The official parser (kept here, `parse_score`): the answer is lower-cased and split at non-word
characters; the first piece that is a whole number from 0 to 100 is the score. So "Score: 85",
'{"score": 85, ...}', "85/100" and "85%" give 85, but the first number anywhere wins ("2 of the 3
cars..., score 85" gives 2) and "eighty-five" gives none. Pieces are ASCII digits here (the
official ``str.isnumeric`` also accepts e.g. "½", on which its ``float`` then fails).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rewards.noun_phrases import Backend, noun_phrases, pipeline_for

ATTRIBUTE_CATEGORIES = ("color", "shape", "texture")
CATEGORIES = (*ATTRIBUTE_CATEGORIES, "spatial", "non_spatial", "complex", "3d_spatial", "numeracy")

_JSON_REQUEST = (
    "\n Provide your analysis and explanation in JSON format with the following keys: score (e.g., 85),"
    " explanation (within 20 words)."
)
_DESCRIBE = {
    "spatial": "You are my assistant to identify objects and their spatial layout in the image. "
    "Briefly describe the image within 50 words.",
    "non_spatial": "You are my assistant to identify the actions, events, objects and their relationships in "
    "the image. Briefly describe the image within 50 words.",
    "complex": "You are my assistant to evaluate the correspondence of the image to a given text prompt. "
    "Briefly describe the image within 50 words, focus on the objects in the image and their attributes "
    "(such as color, shape, texture), spatial layout and action relationships.",
    # Share_eval.py's numeracy description, its line-continuation spaces collapsed.
    "numeracy": "You are my assistant to identify objects and their quantities in the image. "
    "Briefly describe the image within 50 words, focus on the objects in the image and their quantity.",
}
_DESCRIBE["3d_spatial"] = _DESCRIBE["spatial"]
_RATE = {
    "spatial": "According to the image and your previous answer, evaluate if the text \"{prompt}\" is correctly "
    "portrayed in the image. Give a score from 0 to 100, according the criteria:"
    "\n 100: correct spatial layout in the image for all objects mentioned in the text"
    "\n 80: basically, spatial layout of objects matches the text"
    "\n 60: spatial layout not aligned properly with the text"
    "\n 40: image not aligned properly with the text"
    "\n 20: image almost irrelevant to the text" + _JSON_REQUEST,
    "non_spatial": "According to the image and your previous answer, evaluate if the text \"{prompt}\" is "
    "correctly portrayed in the image. Give a score from 0 to 100, according the criteria:"
    "\n 100: the image accurately portrayed the actions, events and relationships between objects described "
    "in the text."
    "\n 80: the image portrayed most of the actions, events and relationships but with minor discrepancies."
    "\n 60: the image depicted some elements, but action relationships between objects are not correct."
    "\n 40: the image failed to convey the full scope of the text."
    "\n 20: the image did not depict any actions or events that match the text." + _JSON_REQUEST,
    "complex": "According to the image and your previous answer, evaluate how well the image aligns with the "
    "text prompt: \"{prompt}\". Give a score from 0 to 100, according the criteria:"
    "\n 100: the image perfectly matches the content of the text prompt, with no discrepancies."
    "\n 80: the image portrayed most of the actions, events and relationships but with minor discrepancies."
    "\n 60: the image depicted some elements in the text prompt, but ignored some key parts or details."
    "\n 40: the image did not depict any actions or events that match the text."
    "\n 20: the image failed to convey the full scope in the text prompt." + _JSON_REQUEST,
    "numeracy": "According to the image and your previous answer, evaluate how well the image aligns with the "
    "text prompt: \"{prompt}\". Give a score from 0 to 100, according the criteria:"
    "\n 100: correct numerical content in the image for all objects mentioned in the text"
    "\n 80: basically, numerical content of objects matches the text"
    "\n 60: numerical content not aligned properly with the text"
    "\n 40: image not aligned properly with the text"
    "\n 20: image almost irrelevant to the text" + _JSON_REQUEST,
}
_RATE["3d_spatial"] = _RATE["spatial"]
_DESCRIBE_ATTRIBUTE = (
    "You are my assistant to identify any objects and their {category} in the image. "
    "Briefly describe what it is in the image within 50 words"
)
_RATE_FIRST_PHRASE = (
    "According to the image and your previous answer, evaluate if there is {phrase} in the image?"
    "Give a score from 0 to 100, according the criteria:"
    "\n 100: there is {noun}, and {noun} is {adj}."
    "\n 75: there is {noun}, {noun} is mostly {adj}."
    "\n 20: there is {noun}, but it is not {adj}."
    "\n 10: no {noun} in the image."
    "\n Provide your analysis and explanation in JSON format with the following keys: score (e.g., 85),"
    " explanation (within 20 words). "
)
_RATE_NEXT_PHRASE = (
    "Please evaluate if there is {phrase} in the image according to the same criteria. "
    "Provide your analysis and explanation in JSON format with the following keys: score (e.g., 85), "
    "explanation (within 20 words)"
)


@dataclass(frozen=True)
class Questions:
    """The questions of one image, in the order they are asked in one conversation.

    Attributes:
        describe: the description question (asked first, with the image).
        rate: the scoring questions (one, or one per noun phrase for color, shape, texture).
        phrases: the noun phrase each scoring question is about (attribute categories; else empty).
    """

    describe: str
    rate: tuple[str, ...]
    phrases: tuple[str, ...] = ()


def check_category(category: str | None) -> str:
    """`category` if it is one of `CATEGORIES`; else a ValueError naming them."""
    if category not in CATEGORIES:
        raise ValueError(f"category={category!r}: the MLLM-CoT questions are per category; "
                         f"give one of {', '.join(CATEGORIES)}")
    return category


def noun_and_attribute(phrase: str, backend: Backend = "auto") -> tuple[str, str]:
    """(noun, attribute) of a noun phrase, as the official script splits it.

    With spaCy: the lemma of the phrase's last NOUN token; the attribute is the phrase without
    " <noun>" and without any "the ", "a ", "an " (plain string replacements, as the official
    code does: "a green bench" -> ("bench", "green")). Without spaCy (or `backend="builtin"`), the
    last word stands for the noun, not lemmatised ("red cars" -> ("cars", "red")).
    """
    nlp = pipeline_for(backend)
    noun = phrase.split()[-1] if phrase.split() else phrase
    if nlp is not None:
        nouns = [token.lemma_ for token in nlp(phrase) if token.pos_ == "NOUN"]
        noun = nouns[-1] if nouns else noun
    attribute = phrase.replace(f" {noun}", "")
    for article in ("the ", "a ", "an "):
        attribute = attribute.replace(article, "")
    return noun, attribute


def category_questions(category: str, prompt: str, backend: Backend = "auto") -> Questions:
    """The official questions of `prompt` for `category` (see the module docstring).

    An attribute prompt without any noun phrase has no scoring question (`rate` is empty).
    """
    check_category(category)
    if category not in ATTRIBUTE_CATEGORIES:
        return Questions(_DESCRIBE[category], (_RATE[category].format(prompt=prompt),))
    phrases = tuple(noun_phrases(prompt, backend))
    rate = []
    for index, phrase in enumerate(phrases):
        if index == 0:
            noun, attribute = noun_and_attribute(phrase, backend)
            rate.append(_RATE_FIRST_PHRASE.format(phrase=phrase, noun=noun, adj=attribute))
        else:
            rate.append(_RATE_NEXT_PHRASE.format(phrase=phrase))
    return Questions(_DESCRIBE_ATTRIBUTE.format(category=category), tuple(rate), phrases)


NO_NUMBER = "no whole number from 0 to 100 in the answer"


def parse_score(answer: str) -> tuple[float | None, str]:
    """(score in [0, 100] or None, reason) of one scoring answer, as the official parser reads it.

    The first run of word characters that is a whole number from 0 to 100 is the score ("Score: 85",
    "85/100", '{"score": 85}' -> 85.0; "150 ... 85" -> 85.0, 150 being out of range). None, with
    the reason `NO_NUMBER`, when there is none ("eighty-five", an empty answer).
    """
    for piece in re.findall(r"\w+", answer.lower()):
        if piece.isascii() and piece.isdigit() and int(piece) <= 100:
            return float(int(piece)), f"read {int(piece)} from the answer"
    return None, NO_NUMBER
