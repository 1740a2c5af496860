"""GenEval's rules (official evaluate_images.py behaviour) on hand-made detections, no model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from rewards.geneval_rules import (
    COLORS,
    GENEVAL_CLASSES,
    GenEvalObject,
    check_metadata,
    confidence_threshold,
    judge_image,
    keep_objects,
    relative_position,
)


def obj(x: float, y: float, score: float = 0.95, size: float = 40.0) -> GenEvalObject:
    """A size x size box whose top-left corner is (x, y)."""
    return GenEvalObject((x, y, x + size, y + size), score)


def colours_by_score(table: dict[float, str]):
    """A colour classifier that reads each object's colour from its score; records its calls."""
    calls: list[tuple[str, int]] = []

    def classify(classname: str, objects: Sequence[GenEvalObject]) -> list[str]:
        calls.append((classname, len(objects)))
        return [table[o.score] for o in objects]

    classify.calls = calls  # type: ignore[attr-defined]
    return classify


def no_colours(classname: str, objects: Sequence[GenEvalObject]) -> list[str]:
    raise AssertionError("the colour classifier must not be called for this prompt")


def test_constants_match_the_official_lists() -> None:
    assert len(GENEVAL_CLASSES) == 80 and len(set(GENEVAL_CLASSES)) == 80
    assert GENEVAL_CLASSES[64:67] == ("computer mouse", "tv remote", "computer keyboard")
    assert COLORS == ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")


# ---- position rule ----

def test_paper_and_code_disagreement_gives_left_of_only() -> None:
    # Centres 100 px apart horizontally, 20 px vertically; 40 x 40 boxes: dead zone 8 px per axis.
    # Revised offset (-92, -12) over the raw offset's length 101.98: dx = -0.90, dy = -0.118.
    a, b = obj(30, 30), obj(130, 50)
    assert relative_position(a.box, b.box) == {"left of"}
    assert relative_position(b.box, a.box) == {"right of"}


def test_no_relation_inside_the_dead_zone() -> None:
    # Offset (5, -3) px, dead zone 8 px on both axes: nothing remains.
    assert relative_position(obj(105, 97).box, obj(100, 100).box) == set()
    assert relative_position(obj(100, 100).box, obj(100, 100).box) == set()  # same centre, no division by 0


def test_diagonal_offset_gives_two_relations_and_dead_zone_scales_with_size() -> None:
    assert relative_position(obj(0, 0).box, obj(100, 100).box) == {"left of", "above"}
    # Offset (0, 60): below for small boxes; with 200 px boxes the dead zone (40 px) leaves 20/60 < 0.5.
    assert relative_position(obj(0, 60).box, obj(0, 0).box) == {"below"}
    assert relative_position(obj(0, 60, size=200).box, obj(0, 0, size=200).box) == set()
    # Offset (30, 60), 40 px boxes: revised (22, 52) / 67.08 -> dx 0.33, dy 0.78: below only.
    assert relative_position(obj(30, 60).box, obj(0, 0).box) == {"below"}


@pytest.mark.parametrize(
    ("box_b", "relations"),
    [
        # A = (0, 0, 10, 10); 10 px boxes: dead zone 0.1 x (10 + 10) = 2 px on x.
        ((5, 0, 15, 10), {"left of"}),  # offset -5: revised -3, -3 / 5 = -0.6
        ((3.5, 0, 13.5, 10), set()),  # offset -3.5: -1.5 / 3.5 = -0.43
        ((4, 0, 14, 10), set()),  # offset -4: -2 / 4 = -0.5 exactly, not beyond 0.5
        # B 30 px wide: dead zone 0.1 x (10 + 30) = 4 px, the two sizes each their own.
        ((-4, 0, 26, 10), set()),  # offset -6: -2 / 6 = -0.33
    ],
)
def test_relation_share_and_dead_zone_boundaries(box_b, relations: set[str]) -> None:
    assert relative_position((0, 0, 10, 10), box_b) == relations


# ---- thresholds and the per-class cap ----

def test_counting_threshold_applies_to_counting_prompts_only() -> None:
    assert confidence_threshold("counting") == 0.9
    for tag in ("single_object", "two_object", "colors", "position", "color_attr"):
        assert confidence_threshold(tag) == 0.3


def test_thresholds_are_exclusive_and_depend_on_the_tag() -> None:
    detections = {"dog": [obj(0, 0, 0.95), obj(100, 0, 0.5), obj(200, 0, 0.3)]}
    single = {"tag": "single_object", "include": [{"class": "dog", "count": 2}], "prompt": "a photo of a dog"}
    counting = {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}],
                "prompt": "a photo of two dogs"}
    result = judge_image(detections, single, no_colours)
    assert result.correct and [d["score"] for d in result.details["detections"]["dog"]] == [0.95, 0.5]
    result = judge_image(detections, counting, no_colours)
    assert not result.correct
    assert result.reason == "expected dog>=2, found 1"
    assert result.details["threshold"] == 0.9
    # The official code compares float32 scores with the threshold in float32: float32(0.3) is not above 0.3.
    cow = {"tag": "single_object", "include": [{"class": "cow", "count": 1}], "prompt": "a photo of a cow"}
    assert not judge_image({"cow": [obj(0, 0, float(np.float32(0.3)))]}, cow, no_colours).correct
    assert judge_image({"cow": [obj(0, 0, float(np.nextafter(np.float32(0.3), np.float32(1))))]}, cow, no_colours).correct


def test_at_most_16_objects_per_class_most_confident_first() -> None:
    scores = [0.31 + 0.01 * i for i in range(20)]
    kept = keep_objects({"cup": [obj(10 * i, 0, s) for i, s in enumerate(scores)], "cat": [obj(0, 0, 0.2)]}, 0.3)
    assert list(kept) == ["cup"]  # a class with nothing above the threshold is dropped
    assert [o.score for o in kept["cup"]] == sorted(scores, reverse=True)[:16]
    # The cap decides exclude clauses: 20 detections count as 16.
    meta = {"tag": "counting", "include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 17}]}
    assert judge_image({"cup": [obj(10 * i, 0, 0.95) for i in range(20)]}, meta, no_colours).correct


# ---- the six tasks ----

def test_single_object() -> None:
    meta = {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}
    assert judge_image({"bench": [obj(0, 0, 0.4)]}, meta, no_colours).correct
    result = judge_image({"cow": [obj(0, 0)]}, meta, no_colours)
    assert (result.correct, result.reason) == (False, "expected bench>=1, found 0")
    assert result.details["detections"] == {"cow": [{"box": [0.0, 0.0, 40.0, 40.0], "score": 0.95}]}
    assert result.details["tag"] == "single_object"


def test_two_object_fails_on_either_class() -> None:
    meta = {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]}
    assert judge_image({"cat": [obj(0, 0)], "dog": [obj(100, 0)]}, meta, no_colours).correct
    result = judge_image({"dog": [obj(100, 0)]}, meta, no_colours)
    assert (result.correct, result.reason) == (False, "expected cat>=1, found 0")


def test_counting_with_its_exclude_clause() -> None:
    meta = {"tag": "counting", "include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}]}
    assert judge_image({"clock": [obj(0, 0), obj(100, 0)]}, meta, no_colours).correct
    result = judge_image({"clock": [obj(0, 0), obj(100, 0), obj(200, 0)]}, meta, no_colours)
    assert (result.correct, result.reason) == (False, "expected clock<3, found 3")
    # A third clock below the counting threshold is not counted.
    assert judge_image({"clock": [obj(0, 0), obj(100, 0), obj(200, 0, 0.85)]}, meta, no_colours).correct


def test_exclude_clauses_are_or_ed() -> None:
    meta = {"tag": "counting", "include": [{"class": "cup", "count": 1}],
            "exclude": [{"class": "cup", "count": 2}, {"class": "bowl", "count": 1}]}
    assert judge_image({"cup": [obj(0, 0)]}, meta, no_colours).correct
    result = judge_image({"cup": [obj(0, 0)], "bowl": [obj(100, 0)]}, meta, no_colours)
    assert (result.correct, result.reason) == (False, "expected bowl<1, found 1")
    result = judge_image({"cup": [obj(0, 0), obj(50, 0)], "bowl": [obj(100, 0)]}, meta, no_colours)
    assert result.reason == "expected cup<2, found 2\nexpected bowl<1, found 1"


def test_colors_checks_the_count_most_confident_objects() -> None:
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "pink"}], "prompt": "a photo of a pink car"}
    classify = colours_by_score({0.95: "pink", 0.5: "blue"})
    assert judge_image({"car": [obj(0, 0, 0.5), obj(100, 0, 0.95)]}, meta, classify).correct
    assert classify.calls == [("car", 1)]  # only the most confident car is classified
    result = judge_image({"car": [obj(0, 0, 0.95), obj(100, 0, 0.5)]}, meta, colours_by_score({0.95: "blue"}))
    assert (result.correct, result.reason) == (False, "expected pink car>=1, found 0 pink; and 1 blue")


def test_colour_is_not_classified_when_the_count_fails() -> None:
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "pink"}]}
    assert not judge_image({}, meta, no_colours).correct


def test_color_attr_reason_lists_found_colours_in_official_order() -> None:
    meta = {"tag": "color_attr", "include": [{"class": "wine glass", "count": 1, "color": "purple"},
                                             {"class": "apple", "count": 1, "color": "black"}]}
    classify = colours_by_score({0.95: "purple", 0.9: "red"})
    result = judge_image({"wine glass": [obj(0, 0, 0.95)], "apple": [obj(100, 0, 0.9)]}, meta, classify)
    assert (result.correct, result.reason) == (False, "expected black apple>=1, found 0 black; and 1 red")
    multi = {"tag": "colors", "include": [{"class": "cup", "count": 3, "color": "white"}]}
    classify = colours_by_score({0.99: "white", 0.98: "red", 0.97: "black"})
    result = judge_image({"cup": [obj(0, 0, 0.99), obj(50, 0, 0.98), obj(100, 0, 0.97)]}, multi, classify)
    assert result.reason == "expected white cup>=3, found 1 white; and 1 red, 1 black, 1 white"


def test_position() -> None:
    meta = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                           {"class": "dog", "count": 1, "position": ["right of", 0]}]}
    assert judge_image({"teddy bear": [obj(0, 0)], "dog": [obj(200, 10)]}, meta, no_colours).correct
    result = judge_image({"teddy bear": [obj(200, 0)], "dog": [obj(0, 0)]}, meta, no_colours)
    assert (result.correct, result.reason) == (False, "expected dog right of target, found left of target")
    result = judge_image({"teddy bear": [obj(0, 0)], "dog": [obj(3, 2)]}, meta, no_colours)
    assert result.reason == "expected dog right of target, found  target"  # no relation: the official text
    result = judge_image({"dog": [obj(0, 0)]}, meta, no_colours)
    assert result.reason == "expected teddy bear>=1, found 0\nno target for dog to be right of"


@pytest.mark.parametrize(
    ("counts", "cats", "dogs"),
    [
        # Two dogs: the first is left of the cat, the second is not.
        ((1, 2), [GenEvalObject((100, 0, 110, 10), 0.95)],
         [GenEvalObject((0, 0, 10, 10), 0.9), GenEvalObject((200, 0, 210, 10), 0.8)]),
        # Two target cats: the dog is left of the first, not of the second.
        ((2, 1), [GenEvalObject((100, 0, 110, 10), 0.95), GenEvalObject((-100, 0, -90, 10), 0.9)],
         [GenEvalObject((0, 0, 10, 10), 0.9)]),
    ],
)
def test_position_needs_every_object_and_target_pair(counts, cats, dogs) -> None:
    meta = {"tag": "position", "include": [{"class": "cat", "count": counts[0]},
                                           {"class": "dog", "count": counts[1], "position": ["left of", 0]}]}
    result = judge_image({"cat": cats, "dog": dogs}, meta, no_colours)
    assert (result.correct, result.reason) == (False, "expected dog left of target, found right of target")


def test_position_uses_the_most_confident_objects_only() -> None:
    meta = {"tag": "position", "include": [{"class": "kite", "count": 1},
                                           {"class": "wine glass", "count": 1, "position": ["above", 0]}]}
    # The most confident glass is above the kite; a weaker one below it is ignored.
    glasses = [obj(0, 300, 0.5), obj(0, 0, 0.9)]
    assert judge_image({"kite": [obj(0, 150)], "wine glass": glasses}, meta, no_colours).correct
    glasses = [obj(0, 300, 0.9), obj(0, 0, 0.5)]
    assert not judge_image({"kite": [obj(0, 150)], "wine glass": glasses}, meta, no_colours).correct


def test_position_is_skipped_when_the_colour_fails() -> None:
    meta = {"tag": "position", "include": [{"class": "cat", "count": 1},
                                           {"class": "dog", "count": 1, "color": "red", "position": ["left of", 0]}]}
    result = judge_image({"cat": [obj(0, 0)], "dog": [obj(200, 0)]}, meta, colours_by_score({0.95: "blue"}))
    assert result.reason == "expected red dog>=1, found 0 red; and 1 blue"  # no position reason on top


def test_metadata_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="lacks tag, include"):
        check_metadata({"prompt": "a photo of a dog"})
    with pytest.raises(ValueError, match="needs 'class' and 'count'"):
        check_metadata({"tag": "single_object", "include": [{"class": "dog"}]})
    with pytest.raises(ValueError, match="not one of"):
        check_metadata({"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "teal"}]})
    with pytest.raises(ValueError, match="earlier include clause"):
        check_metadata({"tag": "position", "include": [{"class": "dog", "count": 1, "position": ["above", 0]}]})
    with pytest.raises(ValueError, match="lacks include"):
        judge_image({}, {"tag": "single_object"}, no_colours)


def test_masks_do_not_enter_details_or_equality() -> None:
    mask = np.ones((4, 4), dtype=bool)
    a = GenEvalObject((0, 0, 4, 4), 0.9, mask)
    assert a == GenEvalObject((0, 0, 4, 4), 0.9) and a.to_dict() == {"box": [0.0, 0.0, 4.0, 4.0], "score": 0.9}
