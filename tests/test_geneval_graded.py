"""GenEval with partial credit: the graded rules on hand-made detections, the reward on tiny models."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.geneval import build_tiny_geneval_models
from rewards import load
from rewards.geneval import GenEvalReward
from rewards.geneval_graded import GenEvalGradedReward
from rewards.geneval_graded_rules import (
    exclude_credit,
    grade_image,
    graded_score,
    include_credits,
    remember_colors,
)
from rewards.geneval_rules import COLORS, RELATIONS, GenEvalObject, judge_image

GRADED = "rewards.geneval_graded:GenEvalGradedReward"
TINY_CLIP = "gors-tiny-graded-clip"


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


# ---- the rules, by tag ----

def test_counting_credits_class_count_and_too_many() -> None:
    meta = {"tag": "counting", "include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}]}
    classify = colours_by_score({})
    scores = []
    for n in range(7):
        found = {"cup": [obj(50 * k, 0, 0.95) for k in range(n)]}
        graded = grade_image(found, meta, classify)
        scores.append(graded.score)
        include, exclude = graded.clauses
        assert include.credits == ({"class": 1.0, "count": min(n, 3) / 3} if n else {"class": 0.0, "count": 0.0})
        assert exclude.credits == {"excess": exclude_credit(n, 4)}
    # 0, 1, 2, 3 cups: (class + count) / 2; 4, 5, 6 cups: full include credit x (1 - k / 4) for k too many.
    assert scores == pytest.approx([0.0, (1 + 1 / 3) / 2, (1 + 2 / 3) / 2, 1.0, 0.75, 0.5, 0.25])
    assert [exclude_credit(n, 4) for n in (3, 4, 7, 8, 20)] == [1.0, 0.75, 0.0, 0.0, 0.0]


def test_counting_threshold_and_reasons_are_geneval_s() -> None:
    meta = {"tag": "counting", "include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}]}
    # Three cups, one below the counting threshold 0.9: two count, the image is correct.
    found = {"cup": [obj(0, 0, 0.95), obj(50, 0, 0.92), obj(100, 0, 0.5)]}
    graded = grade_image(found, meta, colours_by_score({}))
    assert (graded.score, graded.correct, graded.details["threshold"]) == (1.0, True, 0.9)
    found["cup"][2] = obj(100, 0, 0.91)
    graded = grade_image(found, meta, colours_by_score({}))
    assert graded.score == pytest.approx(1 - 1 / 3) and not graded.correct
    assert graded.reason == "expected cup<3, found 3"
    assert [c.reason for c in graded.clauses] == ["", "expected cup<3, found 3"]


def test_colour_credit_counts_the_objects_that_are_there() -> None:
    meta = {"tag": "color_attr", "include": [{"class": "car", "count": 1, "color": "red"},
                                             {"class": "bus", "count": 1, "color": "blue"}]}
    classify = colours_by_score({0.95: "red", 0.94: "green"})
    graded = grade_image({"car": [obj(0, 0, 0.95)], "bus": [obj(100, 0, 0.94)]}, meta, classify)
    assert [c.credits for c in graded.clauses] == [{"class": 1.0, "color": 1.0}, {"class": 1.0, "color": 0.0}]
    assert graded.score == 0.75 and not graded.correct
    assert graded.clauses[1].reason == "expected blue bus>=1, found 0 blue; and 1 green"
    # No bus at all: its class and colour earn nothing, and CLIP is not asked about it.
    classify = colours_by_score({0.95: "red"})
    graded = grade_image({"car": [obj(0, 0, 0.95)]}, meta, classify)
    assert graded.score == 0.5 and graded.clauses[1].reason == "expected bus>=1, found 0"
    assert classify.calls == [("car", 1)]  # once per object, although three rules look at colours


def test_position_credit_is_the_share_of_pairs_in_the_relation() -> None:
    meta = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                           {"class": "cat", "count": 1, "position": ["left of", 0]}]}
    none = colours_by_score({})
    right = grade_image({"dog": [obj(200, 0)], "cat": [obj(0, 0)]}, meta, none)
    assert (right.score, right.correct, right.reason) == (1.0, True, "")
    wrong = grade_image({"dog": [obj(0, 0)], "cat": [obj(200, 0)]}, meta, none)
    assert wrong.clauses[1].credits == {"class": 1.0, "position": 0.0}
    assert wrong.score == pytest.approx(2 / 3)
    assert wrong.reason == wrong.clauses[1].reason == "expected cat left of target, found right of target"
    no_target = grade_image({"cat": [obj(200, 0)]}, meta, none)
    assert no_target.score == pytest.approx(1 / 3)
    assert [c.reason for c in no_target.clauses] == ["expected dog>=1, found 0", "no target for cat to be left of"]
    # Two cats asked for, one left of the dog and one right of it: half the pairs hold.
    meta["include"][1]["count"] = 2
    half = grade_image({"dog": [obj(200, 0)], "cat": [obj(0, 0, 0.95), obj(400, 0, 0.9)]}, meta, none)
    assert half.clauses[1].credits == {"class": 1.0, "count": 1.0, "position": 0.5}


def test_position_credit_counts_pairs_over_both_clauses_counts() -> None:
    # One dog, two target cats: left of one of them, 1 of 1 x 2 pairs.
    meta = {"tag": "position", "include": [{"class": "cat", "count": 2},
                                           {"class": "dog", "count": 1, "position": ["left of", 0]}]}
    found = {"cat": [GenEvalObject((100, 0, 110, 10), 0.95), GenEvalObject((-100, 0, -90, 10), 0.9)],
             "dog": [GenEvalObject((0, 0, 10, 10), 0.9)]}
    assert include_credits(found, meta, colours_by_score({})) == [
        {"class": 1.0, "count": 1.0}, {"class": 1.0, "position": 0.5}]


def test_colour_credit_is_over_the_asked_count() -> None:
    # Two red cars asked, one found (red): half the count and half the colour.
    meta = {"tag": "colors", "include": [{"class": "car", "count": 2, "color": "red"}]}
    credits = include_credits({"car": [obj(0, 0, 0.95)]}, meta, colours_by_score({0.95: "red"}))
    assert credits == [{"class": 1.0, "count": 0.5, "color": 0.5}]


def test_graded_score_combination() -> None:
    assert graded_score([{"class": 1.0, "color": 0.0}, {"class": 1.0}], []) == pytest.approx(2 / 3)
    assert graded_score([{"class": 1.0, "count": 1.0}], [0.5, 0.5]) == 0.25
    assert graded_score([], []) == 0.0


def test_remember_colors_asks_once_per_object() -> None:
    classify = colours_by_score({0.9: "red", 0.8: "blue"})
    once = remember_colors(classify)
    a, b = obj(0, 0, 0.9), obj(50, 0, 0.8)
    assert once("car", [a]) == ["red"] and once("car", [a, b]) == ["red", "blue"] and once("car", [b, a]) == [
        "blue", "red"]
    assert classify.calls == [("car", 1), ("car", 1)]


# ---- agreement with GenEval's binary verdict ----

def random_case(rng: random.Random) -> tuple[dict, dict, dict[float, str]]:
    """A random clause set of one of GenEval's tags, random detections of its classes, random colours."""
    classes = ["dog", "cat", "cup"]
    a, b = rng.sample(classes, 2)
    tag = rng.choice(["single_object", "two_object", "counting", "colors", "position", "color_attr"])
    if tag == "single_object":
        include, exclude = [{"class": a, "count": 1}], []
    elif tag == "two_object":
        include, exclude = [{"class": a, "count": 1}, {"class": b, "count": 1}], []
    elif tag == "counting":
        count = rng.randint(2, 4)
        include, exclude = [{"class": a, "count": count}], [{"class": a, "count": count + 1}]
    elif tag == "colors":
        include, exclude = [{"class": a, "count": 1, "color": rng.choice(COLORS[:3])}], []
    elif tag == "position":
        include = [{"class": b, "count": 1}, {"class": a, "count": rng.randint(1, 2),
                                              "position": [rng.choice(RELATIONS), 0]}]
        exclude = []
    else:
        include = [{"class": a, "count": 1, "color": rng.choice(COLORS[:3])},
                   {"class": b, "count": 1, "color": rng.choice(COLORS[:3])}]
        exclude = []
    detections, colours = {}, {}
    for name in classes:
        objects = []
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3, 4, 5])):
            score = round(rng.uniform(0.2, 1.0), 6)
            while score in colours:
                score = round(rng.uniform(0.2, 1.0), 6)
            colours[score] = rng.choice(COLORS[:3])
            objects.append(obj(rng.uniform(0, 300), rng.uniform(0, 300), score, size=rng.uniform(10, 80)))
        if objects:
            detections[name] = objects
    return detections, {"tag": tag, "include": include, "exclude": exclude}, colours


def test_score_is_one_exactly_when_geneval_judges_correct_with_the_same_reasons() -> None:
    rng = random.Random(0)
    seen = {True: 0, False: 0}
    partial = 0
    for _ in range(3000):
        detections, meta, table = random_case(rng)
        binary = judge_image(detections, meta, colours_by_score(table))
        graded = grade_image(detections, meta, colours_by_score(table))
        assert (graded.score == 1.0) == binary.correct == graded.correct
        assert 0.0 <= graded.score <= 1.0
        assert graded.reason == binary.reason
        assert "\n".join(c.reason for c in graded.clauses if c.reason) == binary.reason
        assert graded.details["detections"] == binary.details["detections"]
        seen[binary.correct] += 1
        partial += 0.0 < graded.score < 1.0
    assert min(seen.values()) > 300 and partial > 300  # both verdicts and partial credit were exercised
    json.dumps(graded.details)


def test_check_prompts_names_the_problem_before_any_model_loads() -> None:
    good = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
    GenEvalGradedReward.check_prompts(["a photo of a dog"], [good])
    with pytest.raises(ValueError, match="geneval_graded reward.*carry no metadata.*evaluators.geneval_train_prompts"):
        GenEvalGradedReward.check_prompts(["a dog"], None)
    with pytest.raises(ValueError, match=r"geneval reward, prompt 1 \('a cat'\): GenEval metadata lacks tag, include"):
        GenEvalReward.check_prompts(["a dog", "a cat"], [good, {"prompt": "a cat"}])
    with pytest.raises(ValueError, match="for each of the 2 prompts, but only 1"):
        GenEvalReward.check_prompts(["a dog", "a cat"], [good])


# ---- the reward on tiny models ----

@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny GenEval models, thresholds 0: a random detector's confidences are tiny; every detection then counts."""
    built = build_tiny_geneval_models(tmp_path_factory.mktemp("geneval_graded_models"), TINY_CLIP)
    return {**built, "threshold": 0.0, "counting_threshold": 0.0, "detector_image_size": None}


def random_images(count: int, size: tuple[int, int] = (48, 40), seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)]


def test_reward_grades_with_the_binary_reward_s_models(models: dict[str, str]) -> None:
    graded = load(GRADED, device="cpu", batch_size=2, **models)
    binary = load("geneval", device="cpu", batch_size=2, **models)
    assert isinstance(graded, GenEvalGradedReward) and isinstance(graded, GenEvalReward)
    images = random_images(3)
    found = graded.detector.detect(images[:1], threshold=0.0)[0]
    ranked = sorted(found, key=lambda name: -found[name][0].score)
    present, second = ranked[0], ranked[1]
    absent = next(name for name in ("dog", "cat", "cup", "car", "bus", "kite") if name not in found)
    colour = graded.classify_colors(images[0], present, found[present][:1])[0]
    other = next(c for c in COLORS if c != colour)
    metadata = [
        {"tag": "two_object", "include": [{"class": present, "count": 1}, {"class": second, "count": 1}]},
        {"tag": "two_object", "include": [{"class": present, "count": 1}, {"class": absent, "count": 1}]},
        {"tag": "colors", "include": [{"class": present, "count": 1, "color": other}]},
        {"tag": "color_attr", "include": [{"class": present, "count": 1, "color": colour},
                                          {"class": absent, "count": 1, "color": other}]},
        {"tag": "counting", "include": [{"class": absent, "count": 2}], "exclude": [{"class": absent, "count": 3}]},
    ]
    prompts = [f"prompt {i}" for i in range(len(metadata))]
    out = graded.score([images[0]] * len(metadata), prompts, metadata)
    reference = binary.score([images[0]] * len(metadata), prompts, metadata)
    assert out.scores == pytest.approx([1.0, 0.5, 0.5, 0.5, 0.0])
    assert reference.scores == [1.0, 0.0, 0.0, 0.0, 0.0]
    for mine, theirs, score in zip(out.details, reference.details, out.scores):
        assert (mine["correct"], mine["reason"]) == (theirs["correct"], theirs["reason"])
        assert (score == 1.0) == theirs["correct"] and mine["score"] == score
        assert list(mine["detections"]) == list(theirs["detections"])
    assert out.details[1]["clauses"][1] == {"kind": "include", "index": 1, "class": absent,
                                            "credits": {"class": 0.0}, "reason": f"expected {absent}>=1, found 0"}
    assert out.details[3]["clauses"][0]["credits"] == {"class": 1.0, "color": 1.0}
    json.dumps(out.details)
    # Deterministic, and each image's score does not depend on its batch.
    again = graded.score(images[:1], prompts[:1], metadata[:1])
    assert again.scores == out.scores[:1] and again.details[0]["reason"] == out.details[0]["reason"]
    assert all(0.0 <= s <= 1.0 for s in graded.score(images, prompts[:3], metadata[:3]).scores)


def test_reward_without_clauses_is_a_clear_error(models: dict[str, str], tmp_path: Path) -> None:
    graded = load(GRADED, device="cpu", **models)
    with pytest.raises(ValueError, match="geneval_graded reward needs each prompt's GenEval clauses"):
        graded.score(random_images(1), ["a photo of a dog"])
    with pytest.raises(ValueError, match=r"prompt 0 \('a photo of a dog'\).*lacks include"):
        graded.score(random_images(1), ["a photo of a dog"], [{"tag": "single_object"}])


# ---- metadata from a .jsonl prompt set to the reward, in the score stage ----

class RandomImages:
    """Stands in for a text-to-image pipeline: random images, seeded by each image's generator."""

    def __call__(self, prompt: list[str], height: int, width: int, generator: list[torch.Generator], **_: object):
        images = [Image.fromarray(torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8).numpy())
                  for g in generator]
        return type("Output", (), {"images": images})()


def geneval_rows() -> list[dict]:
    return [
        {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cup", "count": 1}],
         "prompt": "a photo of a dog and a cup"},
        {"tag": "color_attr", "include": [{"class": "car", "count": 1, "color": "red"},
                                          {"class": "bus", "count": 1, "color": "blue"}],
         "prompt": "a photo of a red car and a blue bus"},
        {"tag": "counting", "include": [{"class": "kite", "count": 2}], "exclude": [{"class": "kite", "count": 3}],
         "prompt": "a photo of two kites"},
    ]


def generated_store(folder: Path, prompts_path: Path):
    """Two images per prompt of `prompts_path` in `folder/samples`, as `gors generate` stores them."""
    from accelerate import Accelerator

    from gors.core.prompts import load_prompts
    from gors.core.sampling import SamplingProtocol, generate_samples
    from gors.core.store import SampleStore

    prompt_set = load_prompts(str(prompts_path))
    protocol = SamplingProtocol(images_per_prompt=2, num_inference_steps=1, guidance_scale=1.0, resolution=48)
    return generate_samples(SampleStore(folder / "samples"), prompt_set.prompts, protocol, RandomImages,
                            Accelerator(cpu=True), prompt_info=prompt_set.info())


def test_score_stage_hands_each_prompt_s_clauses_to_the_reward(models: dict[str, str], tmp_path: Path) -> None:
    from gors.config import ScoreConfig
    from gors.score import score

    prompts_path = tmp_path / "geneval_train.jsonl"
    prompts_path.write_text("".join(json.dumps(row) + "\n" for row in geneval_rows()))
    store = generated_store(tmp_path / "run", prompts_path)
    options = {k: v for k, v in models.items() if k != "model_name_or_path"}
    config = ScoreConfig(output_dir=str(tmp_path / "run"), reward=GRADED, reward_batch_size=4,
                         reward_model_name_or_path=models["model_name_or_path"], reward_options=options)
    rows = score(config)
    assert len(rows) == 6
    reference = load(GRADED, device="cpu", **models)
    for record in store.records():
        row = rows[(record["prompt_index"], record["image_index"])]
        meta = geneval_rows()[record["prompt_index"]]
        assert [c["class"] for c in row["details"]["clauses"]] == [
            c["class"] for c in meta["include"] + meta.get("exclude", [])]
        assert row["details"]["tag"] == meta["tag"]
        expected = reference.score([store.open_image(record)], [record["prompt"]], [meta])
        assert row["reward"] == pytest.approx(expected.scores[0]) and 0.0 <= row["reward"] <= 1.0
        assert row["details"]["reason"] == expected.details[0]["reason"]


def test_geneval_rewards_refuse_prompts_without_clauses_before_any_work(
    models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_cache
) -> None:
    import gors.score
    from gors.config import RunConfig, ScoreConfig
    from gors.run import run

    text = tmp_path / "prompts.txt"
    text.write_text("a photo of a dog and a cup\n")
    generated_store(tmp_path / "run", text)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("no reward may load before the metadata check")

    monkeypatch.setattr(gors.score, "build_reward", no_model)
    for reward in (GRADED, "geneval", f"clip_score:0.5,{GRADED}:0.5"):
        with pytest.raises(ValueError, match="carry no metadata"):
            gors.score.score(ScoreConfig(output_dir=str(tmp_path / "run"), reward=reward))

    # `gors run` checks before generating: nothing is written, no model loads.
    monkeypatch.setattr("gors.run.training_accelerator", no_model)
    config = RunConfig(output_dir=str(tmp_path / "fresh"), train_prompts=str(text), reward=GRADED)
    with pytest.raises(ValueError, match="geneval_graded reward needs each prompt's GenEval clauses"):
        run(config)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(geneval_rows()[0]) + "\n" + json.dumps({"tag": "colors", "prompt": "a red car"}) + "\n")
    with pytest.raises(ValueError, match=r"prompt 1 \('a red car'\): GenEval metadata lacks include"):
        run(RunConfig(output_dir=str(tmp_path / "fresh"), train_prompts=str(bad), reward="geneval"))
    with pytest.raises(ValueError, match="Unknown reward 'genevall'"):
        run(RunConfig(output_dir=str(tmp_path / "fresh"), train_prompts=str(bad), reward="genevall"))
    assert not (tmp_path / "fresh").exists()
    # --max_prompts 1 keeps only the valid row: the check passes and the run goes on to start (on a
    # local model: the checks read the model's config after the prompts').
    from gors.core.toy import PRETRAINED_DIR
    from rewards.combined import reward_models

    hub_cache(*reward_models("geneval").values())  # as a user's cache holds them
    with pytest.raises(AssertionError, match="no reward may load"):
        run(RunConfig(output_dir=str(tmp_path / "fresh"), train_prompts=str(bad), reward="geneval", max_prompts=1,
                      reward_threshold=0.5, pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline")))


def test_the_recipe_s_tau_keeps_what_its_comment_says() -> None:
    from gors.recipes import GENEVAL_TAU

    def kept(include: list[dict[str, float]], exclude: list[float] = ()) -> bool:
        return graded_score(include, list(exclude)) > GENEVAL_TAU  # GORS keeps s > tau

    assert kept([{"class": 1.0, "color": 1.0}, {"class": 1.0, "color": 0.0}])  # color_attr, one wrong colour
    assert all(kept([{"class": 1.0, "count": (c - 1) / c}]) for c in (2, 3, 4))  # counting, one short
    assert all(kept([{"class": 1.0, "count": 1.0}], [exclude_credit(c + 1, c + 1)]) for c in (3, 4))  # one too many
    assert not kept([{"class": 1.0, "count": 1.0}], [exclude_credit(3, 3)])  # two asked, three found
    assert not kept([{"class": 1.0}, {"class": 0.0}])  # two_object, one missing
    assert not kept([{"class": 1.0, "color": 0.0}])  # colors, wrong colour
    assert not kept([{"class": 1.0}, {"class": 1.0, "position": 0.0}])  # position, wrong relation


def test_the_geneval_recipe_runs_end_to_end_at_tiny_size(
    models: dict[str, str], tiny_sd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread
) -> None:
    """recipes/gors_geneval.py's config on tiny models: its generated train prompts and their clauses
    through generate and score to geneval_graded, selection and training. (Its GenEval validation
    runs the benchmark's 512-px, 50-step protocol, too slow here; the benchmark has its own tests.)"""
    from dataclasses import replace

    from gors.recipes import geneval_recipe_config
    from gors.run import run

    # GenEval's test prompts, which the generated train prompts must avoid.
    monkeypatch.setenv("GORS_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "benchmarks"))
    options = {k: v for k, v in models.items() if k != "model_name_or_path"}
    out = tmp_path / "run"
    config = geneval_recipe_config([
        "--output_dir", str(out), "--pretrained_model_name_or_path", str(tiny_sd), "--max_prompts", "3",
        "--images_per_prompt", "2", "--num_inference_steps", "2", "--resolution", "32", "--reward_batch_size", "6",
        "--reward_model_name_or_path", models["model_name_or_path"], "--reward_options", json.dumps(options),
        "--reward_threshold", "0.0", "--max_train_steps", "2", "--train_batch_size", "2",
    ])
    run(replace(config, validation_benchmark=None))
    rows = [json.loads(line) for line in (out / "geneval_train_prompts.jsonl").read_text().splitlines()][:3]
    scores = [json.loads(line) for path in sorted((out / "scores").rglob("*.jsonl")) for line in
              path.read_text().splitlines()]
    assert len(scores) == 6 and all(0.0 <= row["reward"] <= 1.0 for row in scores)
    # Each sample was judged by its own prompt's clauses.
    assert sorted({(row["prompt"], row["details"]["tag"]) for row in scores}) == sorted(
        (row["prompt"], row["tag"]) for row in rows)
    assert (out / "pytorch_lora_weights.safetensors").is_file()
