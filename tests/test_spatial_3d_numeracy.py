"""T2I-CompBench++'s 3D-spatial and numeracy rules on hand-made boxes and depth maps, and both
rewards on tiny random OWLv2 / DPT models and on injected detectors (offline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.detection import build_tiny_owlv2
from gors.testing.dpt import build_tiny_dpt
from rewards import get_reward_class
from rewards.detection import Detection
from rewards.numeracy import NumeracyReward
from rewards.numeracy_rule import (
    OFFICIAL_RENAMES,
    CountedObject,
    NounList,
    counted_objects,
    deduplicate,
    judge_numeracy,
    load_noun_list,
    tokens,
)
from rewards.spatial_3d import DepthEstimator, Spatial3DReward
from rewards.spatial_3d_rule import (
    box_depth,
    depth_order_judgement,
    find_relation_3d,
    judge_spatial_3d,
    pick_detections_3d,
)
from rewards.spatial_rule import spatial_objects

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "t2i_compbench"
NOUNS = NounList.parse(
    ["dog - dogs", "cat - cats", "boy - boys", "person - people", "sheep - sheep", "ice cream - ice creams",
     "ship - ships", "apple - apples", ""]
)


def det(label: str, score: float, box: tuple[float, float, float, float]) -> Detection:
    return Detection(label, score, box)


# --------------------------------------------------------------------------------------------
# The 3D-spatial rule.


def test_relation_words_in_official_order() -> None:
    assert find_relation_3d("a dog in front of a desk") == "in front of"
    assert find_relation_3d("a cat behind a boy") == "behind"
    assert find_relation_3d("a chair hidden by a mouse") == "hidden"
    assert find_relation_3d("a dog behind a cat in front of a tree") == "in front of"  # list order wins
    assert find_relation_3d("a dog on the left of a cat") is None


def test_box_depth_reads_the_official_transposed_region() -> None:
    depth = np.tile(np.arange(10, dtype=float)[:, None], (1, 10))  # the value is the row index
    box = (0.0, 6.0, 2.9, 8.0)  # x 0..2 (truncated), y 6..8
    assert box_depth(depth, box, transposed_depth=False) == pytest.approx(6.5)  # rows 6, 7
    assert box_depth(depth, box) == pytest.approx(0.5)  # official: rows are x 0, 1
    assert box_depth(depth, (3.0, 3.0, 3.5, 9.0)) is None  # thinner than a pixel
    assert box_depth(depth, (20.0, 20.0, 30.0, 30.0)) is None  # off the map


@pytest.mark.parametrize(
    ("relation", "depths", "box2", "expected"),
    [
        ("in front of", (0.8, 0.2), (0, 0, 10, 10), 1.0),  # nearer, IoU 1
        ("in front of", (0.8, 0.2), (0, 0, 10, 2.5), 0.5),  # IoU 0.25 -> 0.25 / 0.5
        ("in front of", (0.2, 0.8), (0, 0, 10, 10), 0.0),  # farther
        ("in front of", (0.8, 0.2), (20, 20, 30, 30), 0.0),  # no overlap
        ("in front of", (0.5, 0.5), (0, 0, 10, 10), 0.0),  # same depth
        ("behind", (0.2, 0.8), (0, 0, 10, 10), 1.0),
        ("behind", (0.8, 0.2), (0, 0, 10, 10), 0.0),
        ("hidden", (0.2, 0.8), (0, 0, 10, 2.5), 0.5),
        ("on the left of", (0.8, 0.2), (0, 0, 10, 10), 0.0),
    ],
)
def test_depth_order_score(relation: str, depths: tuple[float, float], box2, expected: float) -> None:
    score, reason = depth_order_judgement(relation, (0.0, 0.0, 10.0, 10.0), box2, *depths)
    assert score == pytest.approx(expected), reason
    assert reason


def test_depth_order_iou_exactly_threshold_scores_zero() -> None:
    score, reason = depth_order_judgement("in front of", (0, 0, 10, 10), (0, 0, 10, 5), 0.9, 0.1)
    assert score == 0.0 and "exactly" in reason
    assert depth_order_judgement("behind", (0, 0, 10, 10), (0, 0, 10, 10), None, 0.3)[0] == 0.0


def test_judge_spatial_3d_scores_without_floor() -> None:
    depth = np.zeros((20, 20))
    depth[0:10, 0:10] = 1.0  # the (transposed) region of box (0, 0, 10, 10) is near
    near, far = det("dog", 0.9, (0, 0, 10, 10)), det("desk", 0.8, (0, 0, 10, 12))
    both = judge_spatial_3d("in front of", near, far, depth)
    iou = 100 / 120
    assert both.depth_order == 1.0 and iou > 0.5
    assert both.score == pytest.approx(0.25 * 0.9 + 0.25 * 0.8 + 0.5)
    assert both.depths[0] == pytest.approx(1.0) and both.depths[1] == pytest.approx(100 / 120)
    wrong = judge_spatial_3d("behind", near, far, depth)
    assert wrong.score == pytest.approx(0.25 * 0.9 + 0.25 * 0.8) and wrong.depth_order == 0.0
    one = judge_spatial_3d("in front of", None, far, depth)
    assert one.score == pytest.approx(0.2) and "second" in one.reason  # below 0.5, still kept
    assert judge_spatial_3d("in front of", None, None, depth).score == 0.0
    assert judge_spatial_3d(None, near, far, depth).score == pytest.approx(0.25 * 0.9 + 0.25 * 0.8)  # order 0
    assert judge_spatial_3d(None, near, None, depth).score == pytest.approx(0.25 * 0.9)


def test_judge_spatial_3d_reads_both_boxes_transposed() -> None:
    depth = np.zeros((20, 20))
    depth[:, :5] = 1.0  # near in columns 0-4: the transposed reading of y 0..4
    dog, desk = det("dog", 0.9, (0, 0, 10, 10)), det("desk", 0.8, (0, 0, 10, 12))
    verdict = judge_spatial_3d("in front of", dog, desk, depth)
    # Transposed, the desk's region is rows 0-9, columns 0-11: 5 / 12 near, farther than the dog's 1 / 2.
    assert verdict.depths == pytest.approx((0.5, 5 / 12))
    assert verdict.score == pytest.approx(0.25 * 0.9 + 0.25 * 0.8 + 0.5)


def test_pick_detections_follows_the_official_walk() -> None:
    detections = [det("dog", 0.9, (0, 0, 1, 1)), det("dog", 0.8, (1, 1, 2, 2)), det("desk", 0.7, (2, 2, 3, 3)),
                  det("dog", 0.6, (3, 3, 4, 4))]
    first, second = pick_detections_3d(detections, ("dog", "desk"))
    assert first.score == 0.8 and second.score == 0.7  # the last dog before the pair completed
    only = [det("dog", 0.9, (0, 0, 1, 1)), det("dog", 0.8, (1, 1, 2, 2))]
    assert pick_detections_3d(only, ("dog", "desk")) == (only[0], None)
    same = pick_detections_3d(only, ("dog", "dog"))
    assert same == (only[0], only[0])
    # A name is detected where it is part of a label, as officially: the birdhouse box is the bird's too.
    house = [det("birdhouse", 0.8, (0, 0, 1, 1))]
    assert pick_detections_3d(house, ("bird", "birdhouse")) == (house[0], house[0])
    assert pick_detections_3d(house, ("birdhouse", "bird")) == (house[0], house[0])
    assert pick_detections_3d(house, ("dog", "birdhouse")) == (None, house[0])
    assert pick_detections_3d(house, ("bird", "dog")) == (house[0], None)


def test_pick_detections_keeps_the_last_detection_of_the_second_object_too() -> None:
    detections = [det("desk", 0.9, (0, 0, 1, 1)), det("desk", 0.8, (1, 1, 2, 2)), det("dog", 0.7, (2, 2, 3, 3))]
    assert pick_detections_3d(detections, ("dog", "desk")) == (detections[2], detections[1])


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/benchmarks")
def test_official_3d_prompts_give_a_relation_and_the_official_nouns() -> None:
    prompts = [p for p in (SHARED / "3d_spatial_val.txt").read_text().splitlines() if p.strip()]
    assert len(prompts) == 300
    persons = {"girl", "boy", "man", "woman"}
    for prompt in prompts:
        words = prompt.split()
        expected = tuple("person" if w in persons else w for w in (words[1], words[-1]))
        assert find_relation_3d(prompt) is not None, prompt
        assert spatial_objects(prompt, backend="builtin") == expected, prompt


# --------------------------------------------------------------------------------------------
# The numeracy rule.


def test_noun_list_parsing() -> None:
    assert NOUNS.singular[:2] == ("dog", "cat") and NOUNS.to_singular("people") == "person"
    with pytest.raises(ValueError, match="singular - plural"):
        NounList.parse(["dog, dogs"])
    with pytest.raises(ValueError, match="empty"):
        NounList.parse(["", " "])


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("two boys", [("boy", "person", 2)]),
        ("a dog and three cats", [("dog", "dog", 1), ("cat", "cat", 3)]),
        ("six people gathered for a picnic", [("person", "person", 6)]),
        ("one sheep, two sheep", [("sheep", "sheep", 1), ("sheep", "sheep", 2)]),
        ("two ice creams and an ice cream", [("ice cream", "ice cream", 2), ("ice cream", "ice cream", 1)]),
        # A two-word noun takes a number only in its plural after two..eight; else it counts 1 as written.
        ("two ice cream", [("ice cream", "ice cream", 1)]),
        ("an ice creams", [("ice creams", "ice creams", 1)]),
        ("eight dogs", [("dog", "dog", 8)]),
        ("two ships", [("ship", "boat", 2)]),
        ("one apples", [("apple", "apple", 1)]),  # a plural after one counts 1
        ("two dog", [("dog", "dog", 2)]),  # officially a crash
        ("Three Dogs.", [("dog", "dog", 3)]),
        ("dogs and two", []),  # a number word as last token is skipped
        ("seven tables", []),  # not in the noun list
    ],
)
def test_counted_objects(prompt: str, expected: list[tuple[str, str, int]]) -> None:
    assert counted_objects(prompt, NOUNS) == [CountedObject(*e) for e in expected]


def test_official_renames() -> None:
    # numeracy_eval.py: boy, girl, man, woman -> person; ship -> boat; telivision -> tv; goldfish -> fish;
    # painting -> picture.
    assert OFFICIAL_RENAMES == {"boy": "person", "girl": "person", "man": "person", "woman": "person",
                                "ship": "boat", "telivision": "tv", "goldfish": "fish", "painting": "picture"}
    nouns = NounList.parse(["dog - dogs", "man - men", "goldfish - goldfish"])
    assert [o.name for o in counted_objects("a man and a goldfish", nouns)] == ["person", "fish"]


def test_counted_objects_without_renames_and_tokens() -> None:
    assert counted_objects("two boys", NOUNS, renames={}) == [CountedObject("boy", "boy", 2)]
    assert tokens("four tents, two boats") == ["four", "tents", ",", "two", "boats"]


def test_deduplicate_merges_near_identical_boxes_of_one_label() -> None:
    big = det("dog", 0.9, (0, 0, 99, 99))
    same = det("dog", 0.8, (1, 1, 99, 99))  # IoU > 0.9
    inside = det("dog", 0.7, (10, 10, 50, 50))  # wholly inside: covers 100 % of itself
    cat = det("cat", 0.6, (0, 0, 99, 99))  # another label is another object
    apart = det("dog", 0.5, (200, 200, 250, 250))
    half = det("dog", 0.4, (50, 0, 149, 99))  # overlaps half of big: a second dog
    assert deduplicate([big, same, inside, cat, apart, half]) == [big, cat, apart, half]


@pytest.mark.parametrize(
    ("boxes", "kept"),
    [
        # The kept (more confident) box lies inside the new one: covers 100 % of the first box.
        ([(10, 10, 19, 19), (0, 0, 99, 99)], 1),
        # Shifted 9 px: intersection 91 x 100 pixels with the +1-pixel convention, 91 % of each box.
        ([(0, 0, 99, 99), (9, 0, 108, 99)], 1),
        # Shifted 15 px: 85 % of each box, IoU 0.74: two dogs.
        ([(0, 0, 99, 99), (15, 0, 114, 99)], 2),
    ],
)
def test_deduplicate_overlap_thresholds(boxes, kept: int) -> None:
    assert len(deduplicate([det("dog", 0.9, boxes[0]), det("dog", 0.8, boxes[1])])) == kept


def test_duplicates_are_tested_in_the_pixels_of_the_official_resized_image() -> None:
    """The official boxes are those of the image resized to 479 px, where the +1-pixel areas weigh more: two
    small boxes of a 1024-px image that are two dogs in its own pixels are one there."""
    from rewards.spatial_rule import official_frame

    first, second = det("dog", 0.9, (0, 0, 10, 10)), det("dog", 0.8, (1.15, 0, 11.15, 10))  # 89.5 % covered
    assert len(deduplicate([first, second])) == 2
    assert official_frame(1024, 1024) == (479, 479)
    assert deduplicate([first, second], image_size=(1024, 1024)) == [first]  # 90.5 % there; boxes as given


def test_judge_numeracy_half_presence_half_count() -> None:
    asked = [CountedObject("dog", "dog", 2), CountedObject("cat", "cat", 3), CountedObject("boy", "person", 1)]
    found = [det("dog", 0.9, (0, 0, 1, 1)), det("dog", 0.9, (5, 5, 6, 6)), det("cat", 0.9, (0, 0, 1, 1))]
    verdict = judge_numeracy(asked, found)
    assert verdict.score == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert verdict.detected == [2, 1, 0]
    assert "person: none detected" in verdict.reason and "cat: 1 detected, asked 3" in verdict.reason
    assert judge_numeracy([CountedObject("dog", "dog", 2)], found[:2]).score == 1.0
    three = found[:2] + [det("dog", 0.9, (9, 9, 10, 10))]
    assert judge_numeracy([CountedObject("dog", "dog", 2)], three).score == 0.5  # too many: presence only
    empty = judge_numeracy([], found)
    assert empty.score == 0.0 and "no countable object" in empty.reason


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/benchmarks")
def test_official_numeracy_prompts_all_name_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED.parent))
    nouns = load_noun_list()
    assert len(nouns.singular) == 101 and nouns.to_singular("mice") == "mouse"
    prompts = [p for p in (SHARED / "numeracy_val.txt").read_text().splitlines() if p.strip()]
    parsed = [counted_objects(p, nouns) for p in prompts]
    assert all(parsed)
    assert parsed[prompts.index("seven women")] == [CountedObject("woman", "person", 7)]


# --------------------------------------------------------------------------------------------
# The rewards.


class FakeDetector:
    """Returns the given detections of each queried label; records the queries."""

    model_name_or_path = "fake detector"

    def __init__(self, detections: list[Detection]) -> None:
        self.detections, self.calls = detections, []

    def detect(self, images, labels, threshold, text_threshold=None, nms_iou=None):
        self.calls.append(labels)
        return [[d for d in self.detections if d.label in wanted and d.score >= threshold] for wanted in labels]


class FakeDepth:
    """A map whose left half (in the official transposed reading: the top rows) is near."""

    def __init__(self) -> None:
        self.count = 0

    def predict(self, images):
        self.count += len(images)
        maps = []
        for image in images:
            depth = np.zeros((image.height, image.width), dtype=np.float32)
            depth[: image.height // 2] = 1.0
            maps.append(depth)
        return maps


def images(count: int, size: int = 32, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(count)]


def test_registry_names() -> None:
    assert get_reward_class("spatial_3d") is Spatial3DReward
    assert get_reward_class("numeracy") is NumeracyReward
    assert Spatial3DReward.default_model == NumeracyReward.default_model == "google/owlv2-base-patch16-ensemble"


def test_spatial_3d_reward_on_injected_models() -> None:
    near = det("dog", 0.9, (0, 0, 12, 12))  # x 0..12 -> rows 0..12 of the map: near
    far = det("desk", 0.7, (14, 0, 30, 12))  # rows 14..30: far; IoU 0 with the dog
    overlapping_far = det("desk", 0.7, (4, 0, 30, 12))  # rows 4..30: mostly far; IoU 96 / 360
    depth = FakeDepth()
    reward = Spatial3DReward(detector=FakeDetector([near, overlapping_far]), depth_model=depth, device="cpu")
    prompts = ["a dog in front of a desk", "a dog behind a desk", "a dog near a desk", "a desk in front of a cat"]
    out = reward.score(images(4), prompts)
    iou = 96 / 360
    assert out.scores[0] == pytest.approx(0.25 * 0.9 + 0.25 * 0.7 + 0.5 * iou / 0.5)
    assert out.scores[1] == pytest.approx(0.25 * 0.9 + 0.25 * 0.7)  # wrong order
    # No 3D relation word: depth order 0, the objects still count (officially too); no depth map needed.
    assert out.scores[2] == pytest.approx(0.25 * 0.9 + 0.25 * 0.7) and "no 3D relation word" in out.details[2]["reason"]
    assert out.scores[3] == pytest.approx(0.25 * 0.7) and out.details[3]["depths"] == [None, None]
    assert depth.count == 2  # depth only for images with both objects found
    assert out.details[0]["objects"] == ["dog", "desk"] and out.details[0]["first"]["score"] == 0.9
    apart = Spatial3DReward(detector=FakeDetector([near, far]), depth_model=FakeDepth(), device="cpu")
    assert apart.score(images(1), prompts[:1]).scores[0] == pytest.approx(0.25 * 0.9 + 0.25 * 0.7)
    # No noun at all: nothing to find, scored 0 with the reason. (One noun is both objects, as officially.)
    none = reward.score(images(1), ["blue"])
    assert none.scores == [0.0] and none.details[0]["reason"] == "the prompt does not name two objects"


def test_numeracy_reward_on_an_injected_detector(tmp_path: Path) -> None:
    noun_file = tmp_path / "nouns.txt"
    noun_file.write_text("dog - dogs\r\ncat - cats\r\nboy - boys\r\n")
    found = [det("dog", 0.9, (0, 0, 10, 10)), det("dog", 0.8, (0, 0, 10, 10)), det("dog", 0.7, (20, 0, 30, 10)),
             det("cat", 0.9, (0, 20, 10, 30)), det("person", 0.3, (0, 0, 5, 5))]
    detector = FakeDetector(found)
    reward = NumeracyReward(detector=detector, noun_file=noun_file, device="cpu")
    out = reward.score(images(3), ["two dogs and two cats", "a boy", "a table"])
    # The duplicate dog box is merged; the person at 0.3 counts, above UniDet's 0.1.
    assert out.scores == pytest.approx([0.5 + 0.25, 1.0, 0.0])
    assert out.details[0]["objects"][0] == {"noun": "dog", "name": "dog", "count": 2, "detected": 2}
    assert len(out.details[0]["detections"]) == 3
    assert detector.calls == [[["dog", "cat"], ["person"]]]  # "a table" names nothing countable
    assert "no countable object" in out.details[2]["reason"]
    with pytest.raises(FileNotFoundError, match="noun_file"):
        NumeracyReward(detector=detector, noun_file=tmp_path / "missing.txt")
    # Two boxes 1.15 px apart on a 1024-px image: two dogs in its pixels, one in the official 479-px frame's.
    close = NumeracyReward(detector=FakeDetector([det("dog", 0.9, (0, 0, 10, 10)), det("dog", 0.8, (1.15, 0, 11.15, 10))]),
                           noun_file=noun_file, device="cpu")
    assert close.score(images(1, size=1024), ["two dogs"]).details[0]["objects"][0]["detected"] == 1


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_3d_numeracy")
    return {"owlv2": build_tiny_owlv2(root / "owl", seed=0), "dpt": build_tiny_dpt(root / "dpt", seed=0)}


def test_depth_estimator_on_tiny_dpt(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from transformers import DPTForDepthEstimation

    estimator = DepthEstimator(str(tiny_dirs["dpt"]), torch.device("cpu"), batch_size=2)
    assert isinstance(estimator.model, DPTForDepthEstimation) and estimator.model.config.is_hybrid
    pictures = [images(1, 32, seed=3)[0], Image.fromarray(np.zeros((24, 40, 3), dtype=np.uint8))]
    maps = estimator.predict(pictures)
    assert [m.shape for m in maps] == [(32, 32), (24, 40)]  # (height, width) of each image
    for depth in maps:
        assert depth.dtype == np.float32 and depth.min() >= 0.0 and depth.max() <= 1.0
    # The model predicts at 32 x 32, so the first map is the normalised prediction itself.
    assert maps[0].max() == pytest.approx(1.0) and maps[0].min() == pytest.approx(0.0)
    again = DepthEstimator(str(build_tiny_dpt(tmp_path / "same", seed=0)), torch.device("cpu")).predict(pictures)
    assert all(np.array_equal(a, b) for a, b in zip(maps, again))


def test_depth_reads_the_official_480_px_input_for_the_default_model(tiny_dirs: dict[str, Path], monkeypatch) -> None:
    """The official script resizes to 480 x 480 (PIL, bilinear) and normalises with 0.5 / 0.5; transformers'
    DPT-Hybrid is configured for 384 and reads other sizes once its position embeddings may be interpolated."""
    import rewards.spatial_3d as spatial_3d
    from rewards.spatial_3d import official_depth_transform

    seen = []
    estimator = DepthEstimator(str(tiny_dirs["dpt"]), torch.device("cpu"), image_size=64)
    estimator.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["pixel_values"]),
                                              with_kwargs=True)
    pictures = [images(1, 40, seed=4)[0], Image.fromarray(np.zeros((24, 40, 3), dtype=np.uint8))]
    maps = estimator.predict(pictures)
    assert [m.shape for m in maps] == [(40, 40), (24, 40)]
    assert len(seen) == 2 and all(batch.shape[-2:] == (64, 64) for batch in seen)  # one pass per image size
    assert any(torch.equal(batch[0], official_depth_transform(64)(pictures[0])) for batch in seen)
    at_processor_size = DepthEstimator(str(tiny_dirs["dpt"]), torch.device("cpu")).predict(pictures[:1])[0]
    assert not np.allclose(maps[0], at_processor_size)
    # The reward gives the default checkpoint the official size, any other its processor's.
    monkeypatch.setattr(spatial_3d, "DEFAULT_DEPTH_MODEL", str(tiny_dirs["dpt"]))
    official = Spatial3DReward(detector=FakeDetector([]), depth_model_name_or_path=str(tiny_dirs["dpt"]), device="cpu")
    assert official.depth_model.official_transform is not None
    assert official.depth_model.model.dpt.embeddings.image_size == (480, 480)
    monkeypatch.undo()
    other = Spatial3DReward(detector=FakeDetector([]), depth_model_name_or_path=str(tiny_dirs["dpt"]), device="cpu")
    assert other.depth_model.official_transform is None
    # Sizes the DPT cannot cut into whole patches are refused before any model loads; so is a size for a depth
    # model given ready-built.
    for size in (72, 480.5):
        with pytest.raises(ValueError, match=rf"depth_image_size={size}: give a multiple of the DPT's 16-px patches"):
            Spatial3DReward.check_options({"depth_image_size": size})
    with pytest.raises(ValueError, match="a depth_model given ready-built prepares its own input"):
        Spatial3DReward(detector=FakeDetector([]), depth_model=estimator, depth_image_size=480, device="cpu")


def test_depth_maps_of_mixed_aspect_ratios_are_those_of_each_image_alone(tmp_path: Path) -> None:
    # Depth Anything's processor keeps each image's aspect ratio: its images of two shapes cannot share a pass.
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, DPTImageProcessor

    folder = tmp_path / "depth_anything"
    DPTImageProcessor(size={"height": 28, "width": 28}, keep_aspect_ratio=True, ensure_multiple_of=14,
                      do_pad=False).save_pretrained(folder)
    torch.manual_seed(0)
    DepthAnythingForDepthEstimation(DepthAnythingConfig(
        backbone_config={"model_type": "dinov2", "image_size": 28, "patch_size": 14, "hidden_size": 16,
                         "num_hidden_layers": 4, "num_attention_heads": 2, "mlp_ratio": 2,
                         "out_features": ["stage1", "stage2", "stage3", "stage4"], "reshape_hidden_states": False},
        patch_size=14, reassemble_hidden_size=16, neck_hidden_sizes=[8, 8, 16, 16], fusion_hidden_size=8,
        head_hidden_size=8)).eval().save_pretrained(folder)
    estimator = DepthEstimator(str(folder), torch.device("cpu"), batch_size=8)
    with pytest.raises(ValueError, match=r"depth_image_size=480 applies to a DPT \(MiDaS\) checkpoint; this one is a "
                                         r"DepthAnythingForDepthEstimation"):
        DepthEstimator(str(folder), torch.device("cpu"), image_size=480)
    pictures = [images(1, 48, seed=1)[0], images(1, 32, seed=2)[0].resize((64, 32)), images(1, 48, seed=3)[0]]
    together = estimator.predict(pictures)
    assert [m.shape for m in together] == [(48, 48), (32, 64), (48, 48)]
    assert all(np.allclose(m, estimator.predict([p])[0], atol=1e-6) for m, p in zip(together, pictures))


def test_rewards_on_tiny_owlv2_and_dpt(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    spatial = Spatial3DReward(
        model_name_or_path=str(tiny_dirs["owlv2"]), depth_model_name_or_path=str(tiny_dirs["dpt"]),
        device="cpu", batch_size=2, threshold=0.0, noun_phrase_backend="builtin",
    )
    prompts = ["a dog in front of a desk", "a cat behind a boy", "a chair hidden by a mouse", "a red dog"]
    out = spatial.score(images(4, seed=1), prompts)
    assert len(out.scores) == 4 and all(0.0 <= s <= 1.0 for s in out.scores)
    assert out.details[1]["objects"] == ["cat", "person"]
    both = [d for d in out.details[:3] if d["first"] is not None and d["second"] is not None]
    assert both  # at threshold 0 the tiny detector finds both objects in some image
    for details in both:
        # A box thinner than a pixel has no depth (None), and then no depth order.
        assert details["depth_order"] is not None
        assert all(d is None or 0.0 <= d <= 1.0 for d in details["depths"])
    # No relation word ("a red dog": the dog twice): its objects count, depth order 0, no depth map read.
    assert out.scores[3] == pytest.approx(0.5 * out.details[3]["first"]["score"])
    assert out.details[3]["depth_order"] == 0.0 and out.details[3]["depths"] == [None, None]
    noun_file = tmp_path / "nouns.txt"
    noun_file.write_text("dog - dogs\ncat - cats\nboy - boys\n")
    numeracy = NumeracyReward(
        model_name_or_path=str(tiny_dirs["owlv2"]), device="cpu", batch_size=2, threshold=0.0, noun_file=noun_file
    )
    counted = numeracy.score(images(2, seed=2), ["two dogs and one cat", "three boys"])
    assert all(0.0 <= s <= 1.0 for s in counted.scores)
    # OWLv2 reports each box once, for its best label; at threshold 0 some label is always present.
    assert all(d["detections"] for d in counted.details)
    assert counted.details[1]["objects"][0]["name"] == "person"


def test_the_rules_ask_only_for_names_unidet_has_a_label_for(tmp_path: Path) -> None:
    """The official scripts look prompt nouns up among UniDet's label names: the 2D rule by equality, the 3D and
    numeracy rules as part of a label. A noun no label matches is never found, so it is not asked for."""
    from rewards.spatial import SpatialRuleReward

    dog, key = det("dog", 0.9, (0, 0, 12, 12)), det("key", 0.8, (14, 0, 30, 12))
    mouse, cow = det("mouse", 0.9, (0, 0, 12, 12)), det("cow", 0.9, (14, 0, 30, 12))
    # 2D: "mouse" is no label ("mouse2, mouse" is): the key alone, 0.25 * 0.8 under the floor.
    detector = FakeDetector([mouse, key])
    out = SpatialRuleReward(detector=detector, device="cpu").score(images(1), ["a mouse on side of a key"])
    assert detector.calls == [[["key"]]] and out.scores == [0.0]
    assert out.details[0]["not_in_label_space"] == ["mouse"] and "'mouse': no UniDet class" in out.details[0]["reason"]
    # Neither noun a label: the detector is asked about no image.
    assert SpatialRuleReward(detector=detector, device="cpu").score(images(1), ["a wallet near a sofa"]).scores == [0.0]
    assert detector.calls[-1] == []
    # "open" asks for both, as an open-vocabulary detector can find them.
    opened = SpatialRuleReward(detector=detector, device="cpu", label_space="open")
    assert opened.score(images(1), ["a mouse on side of a key"]).scores[0] == pytest.approx(0.25 * 1.7 + 0.5)
    assert detector.calls[-1] == [["mouse", "key"]]
    # 3D: part of a label is enough ("cow" of "cattle, cow"), "painting" is part of none.
    detector = FakeDetector([cow, dog])
    out = Spatial3DReward(detector=detector, depth_model=FakeDepth(), device="cpu").score(
        images(2), ["a cow in front of a dog", "a painting behind a dog"])
    assert detector.calls == [[["cow", "dog"], ["dog"]]]
    assert out.details[0]["not_in_label_space"] == [] and out.details[1]["not_in_label_space"] == ["painting"]
    assert out.scores[1] == pytest.approx(0.25 * 0.9)
    with pytest.raises(ValueError, match="label_space"):
        Spatial3DReward(detector=detector, depth_model=FakeDepth(), device="cpu", label_space="unidet2")  # type: ignore[arg-type]
    # Numeracy: a wallet is never counted.
    noun_file = tmp_path / "nouns.txt"
    noun_file.write_text("dog - dogs\nwallet - wallets\n")
    detector = FakeDetector([dog, det("wallet", 0.9, (14, 0, 30, 12))])
    out = NumeracyReward(detector=detector, noun_file=noun_file, device="cpu").score(images(1), ["a dog and a wallet"])
    assert detector.calls == [[["dog"]]] and out.scores == [pytest.approx(0.5)]
    assert out.details[0]["not_in_label_space"] == ["wallet"]
    assert out.details[0]["reason"].endswith("('wallet': in no UniDet class, never found)")
    out = NumeracyReward(detector=detector, noun_file=noun_file, device="cpu", label_space="open").score(
        images(1), ["a dog and a wallet"])
    assert out.scores == [pytest.approx(1.0)]
    # Part of a label is enough, as numeracy_eval.py's `if my_obj_i in obj_i`: "computer" of "computer monitor".
    noun_file.write_text("computer - computers\ndog - dogs\n")
    detector = FakeDetector([dog])
    out = NumeracyReward(detector=detector, noun_file=noun_file, device="cpu").score(images(1), ["two computers and a dog"])
    assert detector.calls == [[["computer", "dog"]]] and out.details[0]["not_in_label_space"] == []


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/benchmarks")
def test_a_third_of_the_2d_val_prompts_name_an_object_unidet_cannot() -> None:
    """As an audit of the official label list found: 100 of the 300 2D-spatial val prompts name an object no UniDet
    label equals (their published score is 0 whatever the image), and 20 of the 300 3D ones one that no label
    contains."""
    from collections import Counter

    from rewards.unidet_labels import UNIDET_LABELS, split_by_label_space

    assert len(UNIDET_LABELS) == 722 and len(set(UNIDET_LABELS)) == 677
    missing: Counter[str] = Counter()
    prompts = [p for p in (SHARED / "spatial_val.txt").read_text().splitlines() if p.strip()]
    for prompt in prompts:
        missing.update(split_by_label_space(spatial_objects(prompt, backend="builtin"), "unidet", exact=True)[1])
    assert sum(1 for p in prompts
               if split_by_label_space(spatial_objects(p, backend="builtin"), "unidet", exact=True)[1]) == 100
    assert missing.most_common(3) == [("wallet", 18), ("mouse", 16), ("cow", 15)]
    prompts = [p for p in (SHARED / "3d_spatial_val.txt").read_text().splitlines() if p.strip()]
    assert sum(1 for p in prompts
               if split_by_label_space(spatial_objects(p, backend="builtin") or [], "unidet", exact=False)[1]) == 20
