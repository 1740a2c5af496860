"""T2I-CompBench's 2D-spatial rule on hand-made boxes with known answers (no models)."""

from __future__ import annotations

import pytest

from rewards.detection import Detection
from rewards.noun_phrases import TaggedToken
from rewards.spatial_rule import (
    COMPLEX_PREPOSITIONS,
    RELATIONS,
    box_iou,
    find_relation,
    first_and_last_nouns,
    judge_spatial,
    nouns_around_prepositions,
    official_frame,
    pick_detections,
    position_judgement,
    position_score,
    spatial_objects,
    to_official_frame,
)

# 512 x 512 image; boxes (x_min, y_min, x_max, y_max).
LEFT = (0.0, 200.0, 100.0, 300.0)  # centre (50, 250)
RIGHT = (300.0, 220.0, 400.0, 320.0)  # centre (350, 270): dx = 300, dy = 20
TOP = (200.0, 0.0, 300.0, 100.0)  # centre (250, 50)
BOTTOM = (220.0, 300.0, 320.0, 400.0)  # centre (270, 350): dx = 20, dy = 300


def det(label: str, score: float, box: tuple[float, float, float, float]) -> Detection:
    return Detection(label, score, box)


# --------------------------------------------------------------------------------------------
# Relations.


@pytest.mark.parametrize(
    ("prompt", "relation"),
    [
        ("a cat on the left of a dog", "on the left of"),
        ("a cat on the right of a dog", "on the right of"),
        ("a balloon on the top of a giraffe", "on the top of"),
        ("a car on the bottom of a bird", "on the bottom of"),
        ("a giraffe next to a lamp", "next to"),
        ("a mouse on side of a key", "on side of"),
        ("a candle near a bird", "near"),
        ("The red hat was on top of the brown coat rack.", "on top of"),
        ("a cat and a dog", None),
        ("The white towel was on the side of the blue bathtub.", None),
        ("A cat On the left of a dog", None),  # case-sensitive, as officially
        ("a cat nearby a dog", "near"),  # a substring match, as officially
        # The list order wins over the position in the prompt.
        ("a cat on the left of a dog near a tree", "near"),
    ],
)
def test_find_relation(prompt: str, relation: str | None) -> None:
    assert find_relation(prompt) == relation


def test_relation_order_is_official() -> None:
    assert RELATIONS == (
        "on side of", "next to", "near", "on the left of", "on the right of",
        "on the bottom of", "on the top of", "on top of",
    )


# --------------------------------------------------------------------------------------------
# Position rule.


def test_only_the_official_person_words_are_read_as_person() -> None:
    from rewards.spatial_rule import person_name

    # 2D_spatial_eval.py: `if obj1 in ['girl', 'boy', 'man', 'woman']`, a list's membership, not part of a word.
    assert [person_name(noun) for noun in ("girl", "boy", "man", "woman")] == ["person"] * 4
    assert [person_name(noun) for noun in ("snowman", "human", "mannequin")] == ["snowman", "human", "mannequin"]


def test_iou() -> None:
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert box_iou((5, 5, 5, 5), (5, 5, 5, 5)) == 0.0  # empty union, no division by zero


@pytest.mark.parametrize(
    ("relation", "box1", "box2", "expected"),
    [
        ("on the left of", LEFT, RIGHT, 1.0),
        ("on the left of", RIGHT, LEFT, 0.0),
        ("on the right of", RIGHT, LEFT, 1.0),
        ("on the right of", LEFT, RIGHT, 0.0),
        ("on the top of", TOP, BOTTOM, 1.0),
        ("on the top of", BOTTOM, TOP, 0.0),
        ("on the bottom of", BOTTOM, TOP, 1.0),
        ("on the bottom of", TOP, BOTTOM, 0.0),
        # Right side, but the other axis dominates.
        ("on the left of", TOP, BOTTOM, 0.0),  # dx = 20 > 0, dy = 300
        ("on the top of", LEFT, RIGHT, 0.0),  # dy = 20 > 0, dx = 300
        ("on the right of", (100, 0, 110, 10), (0, 200, 10, 210), 0.0),  # dx = -100 < 0, dy = 200
        ("on the bottom of", (0, 200, 10, 210), (300, 0, 310, 10), 0.0),  # dy = -200 < 0, dx = 300
        # A diagonal tie |dx| == |dy|: neither axis dominates, officially 0.
        ("on the left of", (0, 0, 10, 10), (100, 100, 110, 110), 0.0),
        ("on the top of", (0, 0, 10, 10), (100, 100, 110, 110), 0.0),
        # Official quirk: "on top of" has no branch.
        ("on top of", TOP, BOTTOM, 0.0),
        (None, LEFT, RIGHT, 0.0),
    ],
)
def test_directional_position(relation, box1, box2, expected) -> None:
    assert position_score(relation, box1, box2) == expected


def test_on_top_of_fixed_behaves_like_on_the_top_of() -> None:
    assert position_score("on top of", TOP, BOTTOM, fix_on_top_of=True) == 1.0
    assert position_score("on top of", BOTTOM, TOP, fix_on_top_of=True) == 0.0
    score, why = position_judgement("on top of", TOP, BOTTOM)
    assert score == 0.0 and "no branch" in why


def test_overlap_gives_soft_score() -> None:
    box1 = (0.0, 0.0, 100.0, 100.0)
    box2 = (50.0, 0.0, 150.0, 100.0)  # dx = 50, dy = 0, IoU = 5000 / 15000 = 1/3
    assert position_score("on the left of", box1, box2) == pytest.approx(0.1 / (1 / 3))
    assert position_score("on the right of", box2, box1) == pytest.approx(0.3)
    # Just under the IoU threshold: full score.
    box3 = (91.0, 0.0, 191.0, 100.0)  # IoU = 900 / 19100 < 0.1
    assert position_score("on the left of", box1, box3) == 1.0
    # Exactly at the threshold: 0.1 / IoU = 1 as well (IoU >= 0.1 branch).
    box4 = (0.0, 0.0, 100.0, 100.0)
    box5 = (100.0 - 200.0 / 11.0, 0.0, 200.0 - 200.0 / 11.0, 100.0)  # IoU = 0.1
    assert box_iou(box4, box5) == pytest.approx(0.1)
    assert position_score("on the left of", box4, box5) == pytest.approx(1.0)


@pytest.mark.parametrize("relation", ["near", "next to", "on side of"])
def test_proximity(relation: str) -> None:
    a = (0.0, 0.0, 20.0, 20.0)  # centre (10, 10)
    assert position_score(relation, a, (100.0, 100.0, 120.0, 120.0)) == 1.0  # both < 150
    # Far on x but close on y: OR rule gives 1.
    assert position_score(relation, a, (400.0, 50.0, 420.0, 70.0)) == 1.0
    # Exactly 150 px apart on x is not within 150 (official `<`): 150 / max(150, 200).
    assert position_score(relation, (0.0, 0.0, 10.0, 10.0), (150.0, 200.0, 160.0, 210.0)) == 0.75
    # Far on both axes: 150 / max(|dx|, |dy|) = 150 / 400.
    assert position_score(relation, a, (300.0, 400.0, 320.0, 420.0)) == pytest.approx(150 / 400)
    # Either direction, the same.
    assert position_score(relation, (300.0, 400.0, 320.0, 420.0), a) == pytest.approx(150 / 400)
    # The threshold is a parameter (pixels).
    assert position_score(relation, a, (300.0, 400.0, 320.0, 420.0), distance_threshold=500) == 1.0


def test_official_frame_is_torchvisions_resize_479_at_most_480() -> None:
    torchvision = pytest.importorskip("torchvision.transforms.functional")
    for width, height in ((512, 512), (1024, 1024), (1024, 768), (768, 1344), (479, 2000), (300, 301)):
        official_height, official_width = torchvision._compute_resized_output_size((height, width), [479], 480)
        assert official_frame(width, height) == (official_width, official_height), (width, height)
    assert official_frame(512, 512) == (479, 479)
    assert official_frame(1024, 768) == (480, 360)


def test_proximity_is_judged_in_the_official_frame() -> None:
    # 300 px apart on both axes of a 1024-px image are 140 px of the official 479-px frame: near.
    a, b = det("cat", 1.0, (0.0, 0.0, 20.0, 20.0)), det("dog", 1.0, (300.0, 300.0, 320.0, 320.0))
    moved = to_official_frame(b, 1024, 1024)
    assert moved.box == pytest.approx((300 * 479 / 1024, 300 * 479 / 1024, 320 * 479 / 1024, 320 * 479 / 1024))
    assert (moved.label, moved.score) == ("dog", 1.0)
    assert judge_spatial("near", a, b).position == pytest.approx(150 / 300)  # in the image's own pixels
    in_frame = judge_spatial("near", to_official_frame(a, 1024, 1024), moved)
    assert in_frame.position == 1.0


# --------------------------------------------------------------------------------------------
# Object names.


@pytest.mark.parametrize(
    ("prompt", "objects"),
    [
        ("a cat on the left of a dog", ("cat", "dog")),
        ("a balloon on the top of a giraffe", ("balloon", "giraffe")),
        ("a mouse on side of a key", ("mouse", "key")),
        ("a girl on the top of a frog", ("person", "frog")),
        ("a horse on the right of a man", ("horse", "person")),
        ("a boy near a woman", ("person", "person")),
        ("a bird next to a pizza cutter", ("bird", "cutter")),  # the last NOUN
        ("a pizza cutter next to a bird", ("pizza", "bird")),  # the first NOUN, as spaCy tags a compound
        ("a cat", ("cat", "cat")),  # one noun: first == last, as officially
        ("near it", None),  # no noun (the official script fails)
    ],
)
def test_simple_objects(prompt: str, objects) -> None:
    assert spatial_objects(prompt, backend="builtin") == objects


def test_head_rule_takes_each_phrase_head() -> None:
    assert spatial_objects("a pizza cutter next to a bird", backend="builtin", noun_rule="head") == ("cutter", "bird")
    with pytest.raises(ValueError, match="noun_rule must be one of"):
        spatial_objects("a cat near a dog", noun_rule="first")


def test_person_mapping_can_be_disabled() -> None:
    assert spatial_objects("a girl near a man", backend="builtin", person_mapping=False) == (
        "girl",
        "man",
    )
    # Only the official four words: plurals stay.
    assert spatial_objects("two women near a horse", backend="builtin") == ("women", "horse")


@pytest.mark.parametrize(
    ("prompt", "objects"),
    [
        # The first NOUN after the preposition: a compound's first noun, as officially.
        ("The red hat was on top of the brown coat rack.", ("hat", "coat")),
        ("The black sofa was on the left of the white coffee table.", ("sofa", "coffee")),
        # Before it, the nearest NOUN: "mid-air" is three tokens, as spaCy splits it.
        ("The yellow cone was suspended in mid-air near the orange pyramid", ("air", "pyramid")),
        ("The fluffy cat is on the left of the soft pillow.", ("cat", "pillow")),
        # "next  to" with two spaces is no preposition to spaCy (a whitespace token between the words).
        ("a dog next  to a cat", None),
        ("The green plant was on the right of the white wall.", ("plant", "wall")),
        ("A girl sat next to a big dog", ("person", "dog")),
        # Two prepositions give four nouns: no pair, as officially.
        ("a bowl sits on top of a table, and a cat is near the window", None),
        # "on the top of" is not an official complex preposition.
        ("a balloon on the top of a giraffe", None),
        ("a cat and a dog", None),
    ],
)
def test_complex_objects(prompt: str, objects) -> None:
    assert spatial_objects(prompt, complex=True, backend="builtin") == objects


def test_complex_objects_by_phrase_heads() -> None:
    prompt = "The red hat was on top of the brown coat rack."
    assert spatial_objects(prompt, complex=True, backend="builtin", noun_rule="head") == ("hat", "rack")
    # Two prepositions give four heads: no pair, as with the official nouns.
    prompt = "a cat on the left of a dog near a tree"
    assert spatial_objects(prompt, complex=True, backend="builtin", noun_rule="head") is None


def tokens(tagged: str) -> list[TaggedToken]:
    """Tokens as spaCy gives them, written "word/TAG" with a space between words, "word/TAG+" joined
    to the next (no whitespace after it)."""
    out = []
    for item in tagged.split():
        joined = item.endswith("+")
        text, pos = item.rstrip("+").rsplit("/", 1)
        out.append(TaggedToken(text, pos, "" if joined else " "))
    out[-1] = TaggedToken(out[-1].text, out[-1].pos, "")
    return out


def test_the_official_complex_walk_over_spacy_tags() -> None:
    """`nouns_around_prepositions` on part-of-speech tags written as spaCy's en_core_web_sm gives them."""
    walk = lambda tagged: nouns_around_prepositions(tokens(tagged), COMPLEX_PREPOSITIONS)  # noqa: E731
    # Nearest NOUN or PROPN before; the first NOUN after, anywhere after.
    assert walk("The/DET round/ADJ clock/NOUN was/AUX on/ADP the/DET right/NOUN of/ADP the/DET wooden/ADJ "
                "picture/NOUN frame/NOUN ./PUNCT") == ("clock", "picture")
    assert walk("Paris/PROPN is/AUX near/ADP the/DET sea/NOUN") == ("Paris", "sea")
    # No NOUN after it: the first PROPN that the next token does not continue.
    assert walk("a/DET cat/NOUN sat/VERB next/ADV to/ADP New/PROPN York/PROPN today/X") == ("cat", "York")
    assert walk("a/DET cat/NOUN sat/VERB near/ADP Bob/PROPN") is None  # a final PROPN is never taken
    # Two prepositions: four nouns, no pair.
    assert walk("a/DET cup/NOUN on/ADP top/NOUN of/ADP a/DET box/NOUN near/ADP a/DET dog/NOUN") is None
    # Matched as spaCy span texts: "next to" must be two tokens with a space between.
    assert walk("a/DET cat/NOUN next/ADV+ to/ADP a/DET dog/NOUN") is None
    assert first_and_last_nouns(tokens("a/DET pizza/NOUN cutter/NOUN near/ADP a/DET bird/NOUN")) == ("pizza", "bird")
    assert first_and_last_nouns(tokens("near/ADP it/PRON")) is None


def test_complex_objects_fixed_top_and_bottom() -> None:
    for prompt, objects in [
        ("a balloon on the top of a giraffe", ("balloon", "giraffe")),
        ("a car on the bottom of a bird", ("car", "bird")),
        ("The red hat was on top of the brown coat rack.", ("hat", "coat")),
    ]:
        assert spatial_objects(prompt, complex=True, backend="builtin", fix_on_top_of=True) == objects


# --------------------------------------------------------------------------------------------
# Image score.


def test_both_found_well_placed() -> None:
    verdict = judge_spatial("on the left of", det("cat", 0.8, LEFT), det("dog", 0.6, RIGHT))
    assert verdict.score == pytest.approx(0.25 * 0.8 + 0.25 * 0.6 + 0.5)
    assert verdict.position == 1.0
    assert "both objects found" in verdict.reason


def test_both_found_wrong_side_is_floored() -> None:
    verdict = judge_spatial("on the left of", det("cat", 0.9, RIGHT), det("dog", 0.9, LEFT))
    assert verdict.position == 0.0
    assert verdict.score == 0.0  # 0.45 < 0.5
    assert "floor" in verdict.reason and "wrong side" in verdict.reason
    # Without a floor the detections still count.
    assert judge_spatial(
        "on the left of", det("cat", 0.9, RIGHT), det("dog", 0.9, LEFT), floor=0.0
    ).score == pytest.approx(0.45)


def test_floor_boundary() -> None:
    # Overlapping boxes: position 0.1 / IoU = 0.3; 0.25 * (0.7 + 0.7) + 0.15 = 0.5, kept.
    box1, box2 = (0.0, 0.0, 100.0, 100.0), (50.0, 0.0, 150.0, 100.0)
    verdict = judge_spatial("on the left of", det("a", 0.7, box1), det("b", 0.7, box2))
    assert verdict.position == pytest.approx(0.3)
    assert verdict.score == pytest.approx(0.5)
    verdict = judge_spatial("on the left of", det("a", 0.69, box1), det("b", 0.7, box2))
    assert verdict.score == 0.0


def test_one_object_found() -> None:
    verdict = judge_spatial("on the left of", det("cat", 0.9, LEFT), None)
    assert verdict.score == 0.0 and verdict.position is None  # 0.225 < 0.5
    assert "only the first object" in verdict.reason
    verdict = judge_spatial("on the left of", None, det("dog", 0.9, LEFT), floor=0.0)
    assert verdict.score == pytest.approx(0.225)
    assert "only the second object ('dog')" in verdict.reason


def test_none_found_and_no_relation() -> None:
    assert judge_spatial("near", None, None, floor=0.0).score == 0.0
    verdict = judge_spatial(None, det("cat", 1.0, LEFT), det("dog", 1.0, RIGHT))
    assert verdict.score == 0.0 and "no spatial relation" in verdict.reason


def test_on_top_of_scores_official_zero_position() -> None:
    first, second = det("hat", 1.0, TOP), det("rack", 1.0, BOTTOM)
    assert judge_spatial("on top of", first, second).score == pytest.approx(0.5)
    assert judge_spatial("on top of", first, second).position == 0.0
    assert judge_spatial("on top of", first, second, fix_on_top_of=True).score == 1.0


def test_pick_detections() -> None:
    found = [det("dog", 0.9, LEFT), det("cat", 0.8, RIGHT), det("dog", 0.7, TOP)]
    assert pick_detections(found, ("cat", "dog")) == (found[1], found[0])
    assert pick_detections(found, ("cat", "bird")) == (found[1], None)
    # Same name twice: officially the same detection; optionally the second best.
    assert pick_detections(found, ("dog", "dog")) == (found[0], found[0])
    assert pick_detections(found, ("dog", "dog"), distinct_same_name=True) == (found[0], found[2])
    assert pick_detections(found[:2], ("cat", "cat"), distinct_same_name=True) == (found[1], None)
