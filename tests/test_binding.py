"""Pure rules of the Grounded-SAM binding reward: prompt pairs, mask IoU, pair and image scores."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rewards.binding import (
    BindingPhrase,
    Segment,
    binding_phrases,
    binding_score,
    box_mask,
    is_attribute_word,
    mask_iou,
    object_presence,
    pair_score,
    query_labels,
    split_phrase,
)

SIZE = 10  # masks are SIZE x SIZE pixels


def square(x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[y0:y1, x0:x1] = True
    return mask


@pytest.mark.parametrize(
    ("phrase", "attribute", "obj"),
    [
        ("a green bench", "green", "bench"),
        ("a triangular slice", "triangular", "slice"),
        ("a cylindrical pizza cutter", "cylindrical", "pizza cutter"),
        ("a red orange", "red", "orange"),  # the final word is the object even if a colour
        ("rubber sole shoes", "rubber", "sole shoes"),
        ("A black and white cat", "black and white", "cat"),
        ("the dull brown tree trunk", "dull brown", "tree trunk"),  # "dull" precedes a colour
        ("A long, narrow yellow kitchen", "long narrow yellow", "kitchen"),
        ("the diamond-studded bracelet", "diamond-studded", "bracelet"),
        ("a star-shaped cookie", "star-shaped", "cookie"),
        ("a hot-air balloon", "", "hot-air balloon"),  # a hyphen alone makes no attribute
        ("Two hot dogs", "", "hot dogs"),
        ("a mirror", "", "mirror"),
        ("the other orange", "", "orange"),
    ],
)
def test_split_phrase(phrase: str, attribute: str, obj: str) -> None:
    assert split_phrase(phrase) == BindingPhrase(phrase, attribute, obj)


@pytest.mark.parametrize("phrase", ["it", "the top", "the left", "a", "", "them"])
def test_phrases_without_object(phrase: str) -> None:
    assert split_phrase(phrase) is None


def test_attribute_words() -> None:
    assert all(is_attribute_word(w) for w in ["Green", "cylindrical", "wooden", "fluffy", "heart-shaped"])
    assert not any(is_attribute_word(w) for w in ["bench", "pizza", "dull", "heart"])


def test_binding_phrases_of_benchmark_prompts() -> None:
    def pairs(prompt: str) -> list[tuple[str, str]]:
        return [(p.attribute, p.object) for p in binding_phrases(prompt, "builtin")]

    assert pairs("a green bench and a blue bowl") == [("green", "bench"), ("blue", "bowl")]
    assert pairs("a triangular slice of pizza and a cylindrical pizza cutter") == [
        ("triangular", "slice"),
        ("", "pizza"),
        ("cylindrical", "pizza cutter"),
    ]
    assert pairs("rubber gloves and a fluffy teddy bear") == [
        ("rubber", "gloves"),
        ("fluffy", "teddy bear"),
    ]
    assert pairs("The bright green grass contrasted with the dull brown tree trunk") == [
        ("bright green", "grass"),
        ("dull brown", "tree trunk"),
    ]
    # Positions and pronouns are no objects.
    assert pairs("a balloon on the top of a giraffe") == [("", "balloon"), ("", "giraffe")]
    assert pairs("It is blue") == []


def test_query_labels_unique_in_order() -> None:
    phrases = binding_phrases("a red apple, a green apple and a red car and a pear", "builtin")
    assert query_labels(phrases) == (["apple", "car", "pear"], ["red", "green"])


def test_mask_iou() -> None:
    a, b = square(0, 0, 4, 4), square(2, 0, 6, 4)  # 16 px each, 8 px shared, union 24
    assert mask_iou(a, b) == pytest.approx(8 / 24)
    assert mask_iou(a, a) == 1.0
    assert mask_iou(a, square(5, 5, 9, 9)) == 0.0
    empty = np.zeros((SIZE, SIZE), dtype=bool)
    assert mask_iou(empty, empty) == 0.0
    with pytest.raises(ValueError, match="different shapes"):
        mask_iou(a, np.zeros((3, 3), dtype=bool))


def test_box_mask_covers_pixel_centres_in_box() -> None:
    mask = box_mask((2.0, 1.0, 6.0, 4.0), width=8, height=5)
    assert mask.shape == (5, 8)
    assert mask.sum() == 4 * 3
    assert mask[1:4, 2:6].all()
    assert np.array_equal(box_mask((2.0, 1.0, 6.0, 4.0), 8, 5), mask)
    assert box_mask((0.0, 0.0, 2.5, 2.5), 4, 4).sum() == 3 * 3  # a centre on the box's edge is inside


def test_pair_score_is_best_iou_times_geometric_mean_confidence() -> None:
    objects = [
        Segment("bench", 0.9, square(0, 0, 4, 4)),
        Segment("bowl", 0.99, square(0, 0, 4, 4)),  # another label: ignored
        Segment("bench", 0.5, square(5, 5, 9, 9)),
    ]
    attributes = [
        Segment("green", 0.4, square(2, 0, 6, 4)),  # IoU 1/3 with the first bench
        Segment("green", 0.8, square(5, 5, 9, 9)),  # IoU 1 with the second bench
        Segment("blue", 1.0, square(0, 0, 4, 4)),
    ]
    result = pair_score("green", "bench", objects, attributes)
    # Candidates: (bench 0, green 0) = 1/3 * sqrt(0.36) = 0.2; (bench 2, green 1) = sqrt(0.4).
    assert result["score"] == pytest.approx(math.sqrt(0.5 * 0.8))
    assert (result["object_segment"], result["attribute_segment"]) == (2, 1)
    assert result["iou"] == 1.0
    assert (result["object_confidence"], result["attribute_confidence"]) == (0.5, 0.8)
    assert "IoU 1.00" in result["reason"]
    # Without the second bench the overlapping but less confident pair wins.
    result = pair_score("green", "bench", objects[:2], attributes)
    assert result["score"] == pytest.approx(0.2)
    assert result["iou"] == pytest.approx(1 / 3)


def test_pair_score_missing_or_disjoint() -> None:
    bench = [Segment("bench", 0.9, square(0, 0, 4, 4))]
    green = [Segment("green", 0.9, square(5, 5, 9, 9))]
    missing_object = pair_score("green", "bench", [], green)
    assert missing_object["score"] == 0.0 and missing_object["reason"] == "no 'bench' detected"
    assert missing_object["object_segment"] is None
    assert pair_score("green", "bench", bench, [])["reason"] == "no 'green' detected"
    disjoint = pair_score("green", "bench", bench, green)
    assert disjoint["score"] == 0.0 and disjoint["iou"] == 0.0
    assert disjoint["reason"] == "no 'green' region overlaps a 'bench'"


def test_binding_score_swapped_colours_score_lower() -> None:
    phrases = binding_phrases("a green bench and a blue bowl", "builtin")
    objects = [Segment("bench", 0.9, square(0, 0, 4, 4)), Segment("bowl", 0.9, square(5, 5, 9, 9))]
    bound = [Segment("green", 0.9, square(0, 0, 4, 4)), Segment("blue", 0.9, square(5, 5, 9, 9))]
    swapped = [Segment("green", 0.9, square(5, 5, 9, 9)), Segment("blue", 0.9, square(0, 0, 4, 4))]
    score, details = binding_score(phrases, objects, bound)
    assert score == pytest.approx(0.9)
    assert [p["score"] for p in details["pairs"]] == pytest.approx([0.9, 0.9])
    swapped_score, swapped_details = binding_score(phrases, objects, swapped)
    assert swapped_score == 0.0
    assert "weakest 'green' + 'bench'" in swapped_details["reason"]
    json.dumps(details)  # JSON-serialisable


def test_binding_score_means_unique_pairs() -> None:
    phrases = [
        BindingPhrase("a red car", "red", "car"),
        BindingPhrase("the red car", "red", "car"),  # the same pair once
        BindingPhrase("a green apple", "green", "apple"),
        BindingPhrase("a mirror", "", "mirror"),  # no attribute: not a pair
    ]
    objects = [Segment("car", 1.0, square(0, 0, 4, 4))]
    attributes = [Segment("red", 0.25, square(0, 0, 4, 4))]
    score, details = binding_score(phrases, objects, attributes)
    assert [(p["attribute"], p["object"]) for p in details["pairs"]] == [
        ("red", "car"),
        ("green", "apple"),
    ]
    assert score == pytest.approx((0.5 + 0.0) / 2)
    assert details["presence"] == [] and details["score"] == score


def test_without_attributes_scores_object_presence() -> None:
    phrases = binding_phrases("a balloon on the top of a giraffe", "builtin")
    objects = [
        Segment("balloon", 0.6, square(0, 0, 2, 2)),
        Segment("balloon", 0.8, square(3, 3, 5, 5)),
    ]
    score, details = binding_score(phrases, objects, [])
    assert score == pytest.approx((0.8 + 0.0) / 2)
    assert details["pairs"] == []
    assert details["presence"] == [
        object_presence("balloon", objects),
        {"object": "giraffe", "score": 0.0, "reason": "no 'giraffe' detected"},
    ]
    assert details["presence"][0]["score"] == 0.8


def test_object_presence_means_unique_objects() -> None:
    phrases = [BindingPhrase("a dog", "", "dog")] * 2 + [BindingPhrase("a cat", "", "cat")]
    objects = [Segment("dog", 0.9, square(0, 0, 2, 2)), Segment("cat", 0.3, square(3, 3, 5, 5))]
    score, details = binding_score(phrases, objects, [])
    assert score == pytest.approx((0.9 + 0.3) / 2)  # the dog named twice counts once
    assert [p["object"] for p in details["presence"]] == ["dog", "cat"]


def test_without_objects_scores_zero() -> None:
    # A prompt the parser finds no object in gives no evidence of binding: it selects nothing.
    score, details = binding_score([], [], [])
    assert score == 0.0 and details["reason"] == "no object to check"
