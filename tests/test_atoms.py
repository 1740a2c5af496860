"""Pure tests of Soft-TIFA's rules (no model): questions, variants, sums, TIFA, AM/GM."""

from __future__ import annotations

import math

import pytest
import torch

from rewards.atoms import (
    NO_VARIANTS,
    YES_VARIANTS,
    Atom,
    aggregate,
    answer_variants,
    atoms_from_vqa_list,
    looks_plural,
    pluralize,
    prompt_atoms,
    tifa_correct,
    variant_probability,
    variant_token_ids,
)

# GenEval 2's published vqa_list of its README example.
GENEVAL2_EXAMPLE = [
    ["How many bicycles are in the image?", "four"],
    ["Are the bicycles white?", "Yes"],
    ["Are there any bicycles in the image?", "Yes"],
    ["Are the bicycles in front of the cows?", "Yes"],
    ["How many cows are in the image?", "three"],
    ["Are the cows plastic?", "Yes"],
    ["Are there any cows in the image?", "Yes"],
]


def pairs(atoms: list[Atom]) -> list[list[str]]:
    return [[a.question, a.answer] for a in atoms]


def test_parser_reproduces_geneval2_readme_example() -> None:
    atoms = prompt_atoms("four white bicycles in front of three plastic cows")
    assert pairs(atoms) == GENEVAL2_EXAMPLE
    assert [a.skill for a in atoms] == [
        "count", "attribute", "object", "position", "count", "attribute", "object"
    ]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        # Rows of GenEval 2's data (singular "a" counts as one; a comma-"and" is no relation).
        (
            "a toy and a white bagel",
            [
                ["How many toys are in the image?", "one"],
                ["Are there any toys in the image?", "Yes"],
                ["How many bagels are in the image?", "one"],
                ["Is the bagel white?", "Yes"],
                ["Are there any bagels in the image?", "Yes"],
            ],
        ),
        (
            "a zebra jumping over two black horses playing with four brown elephants",
            [
                ["How many zebras are in the image?", "one"],
                ["Are there any zebras in the image?", "Yes"],
                ["Is the zebra jumping over the horses?", "Yes"],
                ["How many horses are in the image?", "two"],
                ["Are the horses black?", "Yes"],
                ["Are there any horses in the image?", "Yes"],
                ["Are the horses playing with the elephants?", "Yes"],
                ["How many elephants are in the image?", "four"],
                ["Are the elephants brown?", "Yes"],
                ["Are there any elephants in the image?", "Yes"],
            ],
        ),
        (
            "seven metal kangaroos, and a yellow dog to the right of seven wooden bears",
            [
                ["How many kangaroos are in the image?", "seven"],
                ["Are the kangaroos metal?", "Yes"],
                ["Are there any kangaroos in the image?", "Yes"],
                ["How many dogs are in the image?", "one"],
                ["Is the dog yellow?", "Yes"],
                ["Are there any dogs in the image?", "Yes"],
                ["Is the dog to the right of the bears?", "Yes"],
                ["How many bears are in the image?", "seven"],
                ["Are the bears wooden?", "Yes"],
                ["Are there any bears in the image?", "Yes"],
            ],
        ),
        (
            "six sparkling sheeps",
            [
                ["How many sheeps are in the image?", "six"],
                ["Are the sheeps sparkling?", "Yes"],
                ["Are there any sheeps in the image?", "Yes"],
            ],
        ),
    ],
)
def test_parser_matches_geneval2_data(prompt: str, expected: list[list[str]]) -> None:
    assert pairs(prompt_atoms(prompt)) == expected


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        # T2I-CompBench attribute binding: bare plurals get no count question.
        (
            "rubber gloves and a fluffy teddy bear",
            [
                ["Are the gloves rubber?", "Yes"],
                ["Are there any gloves in the image?", "Yes"],
                ["How many teddy bears are in the image?", "one"],
                ["Is the teddy bear fluffy?", "Yes"],
                ["Are there any teddy bears in the image?", "Yes"],
            ],
        ),
        # "of" joins a noun phrase to the object it describes.
        (
            "a triangular slice of pizza and a cylindrical pizza cutter",
            [
                ["How many slices of pizza are in the image?", "one"],
                ["Is the slice of pizza triangular?", "Yes"],
                ["Are there any slices of pizza in the image?", "Yes"],
                ["How many pizza cutters are in the image?", "one"],
                ["Is the pizza cutter cylindrical?", "Yes"],
                ["Are there any pizza cutters in the image?", "Yes"],
            ],
        ),
        # T2I-CompBench spatial: "the top", "the right" belong to the relation.
        (
            "a balloon on the top of a giraffe",
            [
                ["How many balloons are in the image?", "one"],
                ["Are there any balloons in the image?", "Yes"],
                ["Is the balloon on the top of the giraffe?", "Yes"],
                ["How many giraffes are in the image?", "one"],
                ["Are there any giraffes in the image?", "Yes"],
            ],
        ),
        (
            "a horse on the right of a man",
            [
                ["How many horses are in the image?", "one"],
                ["Are there any horses in the image?", "Yes"],
                ["Is the horse on the right of the man?", "Yes"],
                ["How many men are in the image?", "one"],
                ["Are there any men in the image?", "Yes"],
            ],
        ),
        # T2I-CompBench non-spatial: the auxiliary goes, the -ing verb is the relation.
        (
            "A man is holding a red book",
            [
                ["How many men are in the image?", "one"],
                ["Are there any men in the image?", "Yes"],
                ["Is the man holding the book?", "Yes"],
                ["How many books are in the image?", "one"],
                ["Is the book red?", "Yes"],
                ["Are there any books in the image?", "Yes"],
            ],
        ),
    ],
)
def test_parser_on_t2i_compbench_prompts(prompt: str, expected: list[list[str]]) -> None:
    assert pairs(prompt_atoms(prompt)) == expected


def test_parser_skills_and_edge_cases() -> None:
    skills = {a.question: a.skill for a in prompt_atoms("a man is holding a red book")}
    assert skills["Is the man holding the book?"] == "verb"
    assert prompt_atoms("") == []
    assert prompt_atoms("it is blue") == []
    # A finite verb becomes a do-question; numbers above ten keep their word.
    assert ["Does the cat sit on the mat?", "Yes"] in pairs(prompt_atoms("a cat sits on a mat"))
    assert pairs(prompt_atoms("twelve red apples"))[0] == ["How many apples are in the image?", "twelve"]
    # The digit 1 counts one, as the word does: a singular question.
    assert ["Is the dog red?", "Yes"] in pairs(prompt_atoms("1 red dog"))
    # A finite verb in -ies: "carries" -> "carry".
    assert "Does the man carry the box?" in [a.question for a in prompt_atoms("a man carries a box")]


@pytest.mark.parametrize(
    ("noun", "plural"),
    [("cars", True), ("mice", True), ("glass", False), ("cactus", False), ("tennis", False), ("dog", False)],
)
def test_looks_plural(noun: str, plural: bool) -> None:
    assert looks_plural(noun) is plural


def test_pluralize() -> None:
    assert [pluralize(w) for w in ("car", "bus", "cherry", "boy", "man", "box", "sheep")] == [
        "cars", "buses", "cherries", "boys", "men", "boxes", "sheep"
    ]
    assert [pluralize(w) for w in ("Bus", "Man", "Person")] == ["Buses", "Men", "People"]  # as the prompt wrote it


def test_answer_variants_follow_geneval2() -> None:
    # GenEval 2's evaluation.py: count words plus their digit; everything else the Yes list.
    assert answer_variants("How many cows are in the image?", "four") == (
        "four", "Four", " four", " Four", "4", " 4"
    )
    assert answer_variants("Are the cows plastic?", "Yes") == YES_VARIANTS == (
        "Yes", "yes", " yes", " Yes"
    )
    # Extensions for answers GenEval 2's data never hold.
    assert answer_variants("Is there a dog?", "no") == NO_VARIANTS
    assert answer_variants("How many cows are in the image?", "4") == (
        "4", " 4", "four", "Four", " four", " Four"
    )
    assert answer_variants("How many apples are in the image?", "twelve") == (
        "twelve", "Twelve", " twelve", " Twelve"
    )
    # "how many" in lower case is not a count question in the official rule.
    assert answer_variants("how many cows?", "Yes") == YES_VARIANTS


def test_variant_token_ids_dedupe_and_multi_token_policy() -> None:
    # "four", "Four", " four", " Four", "4", " 4" -> " 4" is two tokens (space, "4").
    encoded = [[10], [11], [12], [13], [4], [99, 4], [10]]
    assert variant_token_ids(encoded, "first") == [10, 11, 12, 13, 4, 99]
    assert variant_token_ids(encoded, "skip") == [10, 11, 12, 13, 4]
    assert variant_token_ids([[], [5]]) == [5]
    with pytest.raises(ValueError, match="multi_token"):
        variant_token_ids(encoded, "all")  # type: ignore[arg-type]


def test_variant_probability_sums_distinct_ids() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    assert variant_probability(probs, [1, 3]) == pytest.approx(0.6)
    assert variant_probability(probs, []) == 0.0
    assert variant_probability(probs, [0, 1, 2, 3]) == 1.0
    # Round-off above 1 is clamped.
    assert variant_probability(torch.tensor([0.5000001, 0.5000001]), [0, 1]) == 1.0
    with pytest.raises(ValueError, match="distinct"):
        variant_probability(probs, [1, 1])


def test_tifa_hard_decision() -> None:
    assert tifa_correct("Yes", YES_VARIANTS)
    assert tifa_correct(" yes", YES_VARIANTS)
    assert tifa_correct("YES", YES_VARIANTS)
    assert not tifa_correct("No", YES_VARIANTS)
    assert not tifa_correct("Yes.", YES_VARIANTS)
    four = answer_variants("How many cows are in the image?", "four")
    assert tifa_correct("Four", four) and tifa_correct(" 4", four) and tifa_correct("4", four)
    assert not tifa_correct("three", four)
    # The official decision does not strip: a bare space token is not an answer.
    assert not tifa_correct(" ", four)


def test_aggregate_am_and_gm() -> None:
    scores = [0.9, 0.5, 0.2]
    assert aggregate(scores, "am") == pytest.approx(1.6 / 3)
    assert aggregate(scores, "gm") == pytest.approx((0.9 * 0.5 * 0.2) ** (1 / 3))
    assert aggregate(scores, "gm") <= aggregate(scores, "am")
    assert aggregate([0.7, 0.0], "gm") == 0.0  # scipy.stats.gmean gives 0 too
    assert aggregate([0.7, 0.0], "am") == pytest.approx(0.35)
    assert aggregate([], "am") == aggregate([], "gm") == 1.0
    assert aggregate([1e-300, 1.0], "gm") == pytest.approx(math.sqrt(1e-300))
    with pytest.raises(ValueError, match="'am' or 'gm'"):
        aggregate(scores, "hm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        aggregate([1.5])


def test_atoms_from_vqa_list() -> None:
    atoms = atoms_from_vqa_list(GENEVAL2_EXAMPLE, ["count", "attribute"])
    assert pairs(atoms) == GENEVAL2_EXAMPLE
    assert [a.skill for a in atoms[:3]] == ["count", "attribute", "unspecified"]
    with pytest.raises(ValueError, match=r"vqa_list\[0\]"):
        atoms_from_vqa_list([["only a question"]])
    with pytest.raises(ValueError, match=r"vqa_list\[1\] = \['How many cows are in the image\?', 3\]"):
        atoms_from_vqa_list([GENEVAL2_EXAMPLE[0], ["How many cows are in the image?", 3]])  # a count as a number


def test_free_form_adjectives_relative_clauses_and_verbs_ending_in_ss():
    def questions(prompt: str) -> list[str]:
        return [atom.question for atom in prompt_atoms(prompt)]

    assert "Is the shirt wrinkled?" in questions("a wrinkled shirt")  # an -ed adjective the word list lacks
    # "pen" ends in -en but is too short to be taken for an adjective: one object, "pen holder".
    assert questions("a pen holder") == ["How many pen holders are in the image?",
                                         "Are there any pen holders in the image?"]
    assert "Is the cat chasing the mouse?" in questions("a cat that is chasing a mouse")
    assert "Does the boy kiss the girl?" in questions("a boy kiss a girl")  # "kiss" is no third-person "kis"
    assert "Is the car red?" in questions("A Red car")  # the attribute as GenEval 2 asks it, lower-case


def test_shape_words_of_t2i_compbench_are_attributes():
    # As GenEval 2 asks colours apart from the noun: "Is the cucumber oblong?", "How many cucumbers ...".
    questions = [atom.question for atom in prompt_atoms("an oblong cucumber and a teardrop plum")]
    assert "Is the cucumber oblong?" in questions and "Is the plum teardrop?" in questions
    assert "How many cucumbers are in the image?" in questions


@pytest.mark.parametrize(
    ("prompt", "relation_question", "object_questions"),
    [
        # A finite verb's base form for the question: -ches, -shes and -xes drop "es", others "s".
        ("a cat watches a bird", "Does the cat watch the bird?", ["Are there any cats in the image?"]),
        ("a dog catches a ball", "Does the dog catch the ball?", ["Are there any dogs in the image?"]),
        ("a fox fixes a box", "Does the fox fix the box?", ["Are there any foxes in the image?"]),
        # An irregular plural without a number is plural ("Are the mice"), and counts nothing.
        ("the mice near a cat", "Are the mice near the cat?", ["Are there any mice in the image?"]),
        ("some children beside a bench", "Are the children beside the bench?", ["Are there any children in the image?"]),
    ],
)
def test_relation_questions_take_the_subjects_number(prompt, relation_question, object_questions) -> None:
    questions = [a.question for a in prompt_atoms(prompt)]
    assert relation_question in questions
    assert all(q in questions for q in object_questions)


def test_other_determiners_are_not_part_of_the_noun() -> None:
    assert pairs(prompt_atoms("each dog and their cats")) == [
        ["Are there any dogs in the image?", "Yes"], ["Are there any cats in the image?", "Yes"]]
