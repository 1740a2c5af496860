"""The toy oracle: exact on rendered scenes, catches each kind of error with its reason, tolerant of blur."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image, ImageFilter

import rewards
from gors.core.toy import world
from gors.core.toy.world import PlacedObject, ToyObject, ToyPrompt
from rewards.toy_rules import Blob, Judgement, classify_shape, judge, judge_image, segment


def _all_prompts() -> list[ToyPrompt]:
    train, held_out = world.split_prompts()
    return train + held_out + [ToyPrompt((obj,)) for obj in world.all_objects()]


def _blur_and_noise(image: Image.Image, rng: np.random.Generator) -> np.ndarray:
    """What a small diffusion model draws, roughly: soft edges and colours off by a few units."""
    blurred = np.asarray(image.filter(ImageFilter.GaussianBlur(1)), dtype=np.float64)
    return np.clip(blurred + rng.normal(0, 8, blurred.shape), 0, 255).astype(np.uint8)


def _relation_scene(rng: np.random.Generator) -> tuple[ToyPrompt, list[PlacedObject]]:
    prompt = ToyPrompt.parse("a green triangle on the left of a yellow circle")
    return prompt, world.sample_scene(prompt, rng)


def test_every_rendered_scene_is_judged_correct():
    assert len(world.split_prompts()[0]) + len(world.split_prompts()[1]) == 360
    rng = np.random.default_rng(0)
    failures, judged = [], 0
    for prompt in _all_prompts():
        for _ in range(2):
            judgement = judge_image(prompt, world.render(world.sample_scene(prompt, rng)))
            judged += 1
            exact = judgement.correct and judgement.bound and judgement.binding_score == 1.0
            if not (exact and judgement.score == 1.0 and not judgement.reasons and not judgement.errors):
                failures.append((prompt.text, judgement.reasons))
            assert len(judgement.found) == len(prompt.objects)
    assert judged == 744
    assert not failures, failures[:5]


def test_blob_geometry_matches_the_render():
    blobs = segment(np.asarray(world.render([PlacedObject("red", "square", 20.0, 31.0, 20.0)])))
    assert len(blobs) == 1
    (blob,) = blobs
    assert (blob.colour, blob.shape, blob.area, blob.bbox, blob.fill) == ("red", "square", 400, (10, 21, 30, 41), 1.0)
    assert blob.centroid == pytest.approx((20.0, 31.0))
    assert blob.describe() == "red square at (20, 31)"


def test_swapped_colours_are_caught_for_both_objects():
    rng = np.random.default_rng(1)
    prompt = ToyPrompt.parse("a red circle and a blue square")
    a, b = world.sample_scene(prompt, rng)
    swapped = [replace(a, colour=b.colour), replace(b, colour=a.colour)]
    judgement = judge_image(prompt, world.render(swapped))
    assert not judgement.correct and not judgement.bound and judgement.score == judgement.binding_score == 0.0
    assert "no red circle: the red object is a square" in judgement.reasons
    assert "no blue square: the blue object is a circle" in judgement.reasons
    assert any(r.startswith("unexpected") and "blue circle" in r and "red square" in r for r in judgement.reasons)
    assert judgement.errors == ["exchanged"]  # the two drawn objects stand for the missing ones: no extras


def test_binding_error_kinds():
    rng = np.random.default_rng(1)
    prompt = ToyPrompt.parse("a red circle and a blue square")
    a, b = world.sample_scene(prompt, rng)

    def errors(*objects: PlacedObject, bar: str | None = None) -> list[str]:
        image = np.array(world.render(list(objects)))
        if bar is not None:  # a 3 x 24 px bar: no shape of the world (aspect 8)
            image[2:5, 2:26] = world.COLOURS[bar]
        judgement = judge_image(prompt, image)
        assert judgement.bound == (not judgement.errors)  # every binding failure has a kind
        return judgement.errors

    assert errors(a, b) == []
    assert errors(replace(a, shape="triangle"), b) == ["wrong_shape"]
    assert errors(replace(a, shape="square"), replace(b, shape="triangle")) == ["wrong_shape"]  # not an exchange
    assert errors(b, bar="red") == ["shapeless"]
    assert errors(b) == ["missing"]
    assert errors(a, b, bar="green") == ["extra"]
    swapped = [replace(a, colour=b.colour), replace(b, colour=a.colour)]
    assert errors(*swapped, bar="blue") == ["exchanged", "extra"]  # the larger blue blob stands for the square
    assert errors(replace(a, shape="triangle"), bar="blue") == ["wrong_shape", "shapeless"]


def test_moved_objects_fail_only_the_relation():
    prompt, (a, b) = _relation_scene(np.random.default_rng(2))
    moved = [replace(a, cx=b.cx, cy=b.cy), replace(b, cx=a.cx, cy=a.cy)]
    judgement = judge_image(prompt, world.render(moved))
    assert judgement.reasons == ["green triangle is not on the left of yellow circle"]
    assert judgement.score == pytest.approx(3 / 4)  # both objects present, no extras
    assert judgement.bound and judgement.binding_score == 1.0 and judgement.relation_holds is False
    assert judgement.errors == []  # the relation is no binding error
    assert [found.split(" at ")[0] for found in judgement.found] == ["green triangle", "yellow circle"]
    assert dict(judgement.checks)["green triangle on the left of yellow circle"] is False


def test_a_missing_object_is_caught_and_its_relation_not_checked():
    prompt, (a, _) = _relation_scene(np.random.default_rng(3))
    judgement = judge_image(prompt, world.render([a]))
    assert judgement.reasons == [
        "no yellow circle: nothing yellow",
        "could not check that green triangle on the left of yellow circle: no yellow circle",
    ]
    assert judgement.score == pytest.approx(2 / 4)
    assert judgement.binding_score == pytest.approx(2 / 3) and judgement.relation_holds is None


def test_an_extra_object_is_caught():
    scene = world.sample_scene(ToyPrompt.parse("a red circle and a green triangle"), np.random.default_rng(4))
    judgement = judge_image("a red circle", world.render(scene))
    assert judgement.checks == [("a red circle is present", True), ("no extra objects", False)]
    assert len(judgement.reasons) == 1 and judgement.reasons[0].startswith("unexpected green triangle at (")
    assert judgement.score == 0.5
    assert judgement.errors == ["extra"]


def test_an_empty_image_passes_nothing_but_the_extras_check():
    judgement = judge_image("a red circle and a blue square", world.render([]))
    assert judgement.reasons == ["no red circle: nothing red", "no blue square: nothing blue"]
    assert judgement.score == pytest.approx(1 / 3)


def test_blurred_noisy_scenes_are_still_judged_correct():
    # Measured (this seed): 360 / 360 (100%) correct with GaussianBlur(1) and noise of std 8 per
    # channel; 360 / 360 with noise of std 15, 357 / 360 with GaussianBlur(1.5), 341 / 360 with
    # GaussianBlur(2), where squares' corners round off.
    rng = np.random.default_rng(5)
    train, held_out = world.split_prompts()
    results = [
        judge_image(prompt, _blur_and_noise(world.render(world.sample_scene(prompt, rng)), rng)).correct
        for prompt in train + held_out
    ]
    assert np.mean(results) >= 0.95


@pytest.mark.parametrize("shape", world.SHAPES)
@pytest.mark.parametrize("size", [10, 16, 20.5, 24, 40, 60])
def test_classify_shape_on_hand_made_masks(shape, size):
    image_size = 96
    for offset in (0.0, 0.3, 0.5):
        mask = world.shape_mask(shape, 48 + offset, 48 - offset, size, image_size)
        assert classify_shape(mask) == shape, (size, offset)


def test_classify_shape_rejects_what_fits_no_shape():
    assert classify_shape(np.zeros((64, 64), dtype=bool)) is None
    bar = np.zeros((64, 64), dtype=bool)
    bar[10:14, 5:60] = True  # long and thin
    assert classify_shape(bar) is None
    y, x = np.mgrid[0:64, 0:64]
    diamond = np.abs(x - 32) + np.abs(y - 32) <= 12  # no taper, corners empty, fill 0.5
    assert classify_shape(diamond) is None


def test_reward_scores_with_details():
    reward = rewards.load("toy_oracle")
    assert reward.name == "toy_oracle" and reward.categories == ("toy",)
    rng = np.random.default_rng(6)
    prompt = ToyPrompt((ToyObject("blue", "triangle"), ToyObject("yellow", "square")), "above")
    good = world.render(world.sample_scene(prompt, rng))
    bad = world.render(world.sample_scene(ToyPrompt.parse("a blue triangle"), rng))
    output = reward.score([good.convert("P"), bad.convert("RGBA")], [prompt.text, prompt.text])
    assert output.scores == [1.0, pytest.approx(2 / 3)]  # binding checks: triangle yes, square no, no extras yes
    assert output.details[0] == {
        "bound": True,
        "relation_holds": True,
        "correct": True,
        "reasons": [],
        "found": output.details[0]["found"],
        "errors": [],
        "checks": [
            ["a blue triangle is present", True],
            ["a yellow square is present", True],
            ["blue triangle above yellow square", True],
            ["no extra objects", True],
        ],
    }
    # The blobs matched to the prompt's objects, in the prompt's order; the bad image has only the triangle.
    assert [found.split(" at ")[0] for found in output.details[0]["found"]] == ["blue triangle", "yellow square"]
    assert [found.split(" at ")[0] for found in output.details[1]["found"]] == ["blue triangle"]
    assert output.details[1]["correct"] is False and "no yellow square: nothing yellow" in output.details[1]["reasons"]
    assert output.details[1]["errors"] == ["missing"]
    json.dumps(output.details)


def test_reward_counts_the_relation_only_with_all_checks():
    prompt, (a, b) = _relation_scene(np.random.default_rng(2))
    moved = world.render([replace(a, cx=b.cx, cy=b.cy), replace(b, cx=a.cx, cy=a.cy)])
    binding = rewards.load("toy_oracle").score([moved], [prompt.text])
    every = rewards.load("toy_oracle", checks="all").score([moved], [prompt.text])
    assert binding.scores == [1.0] and every.scores == [pytest.approx(3 / 4)]
    assert binding.details == every.details and every.details[0]["relation_holds"] is False
    # Bound (objects right, wherever they are) yet not correct (the relation fails): the details tell them apart.
    assert every.details[0]["bound"] is True and every.details[0]["correct"] is False
    with pytest.raises(ValueError, match="checks='relation'.*'binding'.*'all'"):
        rewards.load("toy_oracle", checks="relation")


def test_reward_refuses_a_model_and_non_toy_prompts():
    with pytest.raises(ValueError, match="no model"):
        rewards.load("toy_oracle", model_name_or_path="some/model")
    with pytest.raises(ValueError, match="a photo of a cat"):
        rewards.load("toy_oracle").score([world.render([])], ["a photo of a cat"])


def test_judge_image_takes_strings_arrays_and_floats():
    scene = [PlacedObject("yellow", "circle", 32.0, 32.0, 20.0)]
    array = np.asarray(world.render(scene))
    for image in (array, array / 255.0, Image.fromarray(array)):
        assert judge_image("a yellow circle", image).correct
    assert isinstance(judge(ToyPrompt.parse("a yellow circle"), segment(array)), Judgement)


def test_reward_judges_each_image_against_its_own_prompt():
    """A batch of different prompts: image i is judged against prompt i, not another's."""
    rng = np.random.default_rng(7)
    prompts = ["a red circle", "a blue square on the left of a green triangle"]
    images = [world.render(world.sample_scene(ToyPrompt.parse(p), rng)) for p in prompts]
    output = rewards.load("toy_oracle", checks="all").score(images, prompts)
    assert output.scores == [1.0, 1.0]
    assert [len(d["checks"]) for d in output.details] == [2, 4]  # object(s), the relation, no extras


def test_reward_refuses_non_toy_prompts_before_any_image_is_made():
    """`check_prompts` (a class method: no reward built, no image drawn) names the first prompt outside the grammar."""
    rewards.get_reward_class("toy_oracle").check_prompts(["a red circle", "A Blue Square "], None)
    with pytest.raises(ValueError, match="toy_oracle reward judges toy-world prompts only; prompt 1: 'a cat'"):
        rewards.get_reward_class("toy_oracle").check_prompts(["a red circle", "a cat", "a dog"], None)


def test_segment_drops_specks_under_30_pixels_and_lists_blobs_largest_first():
    """At 64 x 64 a component of 30 px is a blob and one of 29 px is noise; blobs come largest first."""
    image = np.full((64, 64, 3), 255, dtype=np.uint8)
    image[20:36, 20:36] = world.COLOURS["red"]  # 256 px
    image[2:7, 2:8] = world.COLOURS["blue"]  # 5 x 6 = 30 px: kept
    image[40:45, 40:46] = world.COLOURS["green"]
    image[44, 45] = world.BACKGROUND  # 29 px: noise
    assert [(blob.colour, blob.area) for blob in segment(image)] == [("red", 256), ("blue", 30)]


def test_segment_joins_pixels_that_touch_only_at_corners():
    """Components are 8-connected: a staircase of 2 x 2 blocks meeting corner to corner is one blob (64 px),
    not sixteen specks of 4 px dropped as noise."""
    image = np.full((64, 64, 3), 255, dtype=np.uint8)
    for i in range(16):
        image[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = world.COLOURS["red"]
    (blob,) = segment(image)
    assert (blob.colour, blob.area, blob.bbox, blob.shape) == ("red", 64, (0, 0, 32, 32), None)


@pytest.mark.parametrize("size", [16, 20, 24, 40])
def test_classify_shape_takes_an_upside_down_triangle(size):
    """A generated triangle may point down: the taper is the narrower third over the wider, top or bottom."""
    assert classify_shape(np.flipud(world.shape_mask("triangle", 32, 32, size))) == "triangle"


def test_classify_shape_measures_the_taper_over_thirds_of_the_box():
    """12 rows, the top 3 half as wide as the other 9: over thirds (4 rows) the taper is 7.5 / 12 = 0.625, above
    the triangle's 0.6 (over quarters it would be 0.5, a triangle). Its 2 x 2 px corner cells hold 0.5 (the top
    ones empty): a square."""
    box = np.zeros((12, 12), dtype=bool)
    box[:3, 3:9] = True
    box[3:] = True
    assert classify_shape(box) == "square"


@pytest.mark.parametrize("transpose", [False, True])
def test_classify_shape_takes_corner_cells_of_a_fifth_of_the_shorter_side(transpose):
    """A 12 x 24 px box, full but for notches 3 rows high and 5 px deep just inside each corner: its corner cells,
    2 px (a fifth of 12), are full, a square; cells of a fifth of the longer side (5 px) would be 0.4 full, a
    circle. The same standing up."""
    box = np.ones((12, 24), dtype=bool)
    for rows in (slice(2, 5), slice(7, 10)):
        box[rows, :5] = box[rows, -5:] = False
    assert classify_shape(box.T if transpose else box) == "square"


def test_classify_shape_rejects_a_sparse_blob_that_tapers():
    """An L of 3 px strokes tapers like a triangle (thin top, full bottom row) but fills 0.28 of its box, under
    the triangle's 0.5: no shape."""
    ell = np.zeros((64, 64), dtype=bool)
    ell[10:30, 10:13] = True
    ell[27:30, 10:30] = True
    assert classify_shape(ell) is None


def test_judge_matches_the_largest_candidate_whatever_the_order_of_the_blobs():
    """`judge` sorts the blobs itself: the largest red circle is the object, the smaller one an extra."""
    small = Blob("red", 120, (0, 0, 12, 12), (6.0, 6.0), 0.83, "circle")
    large = Blob("red", 300, (30, 30, 50, 50), (40.0, 40.0), 0.75, "circle")
    judgement = judge(ToyPrompt.parse("a red circle"), [small, large])
    assert judgement.found == ["red circle at (40, 40)"]
    assert judgement.reasons == ["unexpected red circle at (6, 6)"]


def test_a_second_object_of_a_matched_colour_is_reported_as_nothing_else_of_it():
    scene = world.sample_scene(ToyPrompt.parse("a red circle and a red square"), np.random.default_rng(8))
    judgement = judge_image("a red circle and a red square", world.render(scene[:1]))
    assert judgement.reasons == ["no red square: nothing else red"]


def test_a_missing_object_names_every_unmatched_blob_of_its_colour_largest_first():
    scene = [PlacedObject("red", "circle", 16.0, 16.0, 24.0), PlacedObject("red", "square", 46.0, 46.0, 16.0)]
    judgement = judge_image("a red triangle", world.render(scene))
    assert judgement.reasons[0] == "no red triangle: the red objects are a circle, a square"


def test_a_relation_holds_by_any_margin_between_the_centres():
    """The judge checks the relation with margin 0: a centre 2 px to the left is on the left."""
    scene = [PlacedObject("red", "circle", 30.0, 14.0, 20.0), PlacedObject("blue", "square", 32.0, 46.0, 20.0)]
    judgement = judge_image("a red circle on the left of a blue square", world.render(scene))
    assert judgement.correct and judgement.relation_holds is True


def test_to_rgb_array_rounds_floats_and_gives_three_channels():
    """Floats in [0, 1] are scaled and rounded (0.5 -> 128, not truncated to 127); grey arrays get three equal
    channels and RGBA arrays lose the alpha, so every array comes out uint8 (H, W, 3)."""
    from rewards.toy_rules import to_rgb_array

    grey = to_rgb_array(np.array([[0.5, 1.0]]))
    assert grey.dtype == np.uint8 and grey.shape == (1, 2, 3)
    assert grey.tolist() == [[[128] * 3, [255] * 3]]
    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    assert to_rgb_array(rgba).shape == (2, 2, 3)
