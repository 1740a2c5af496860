"""3-in-1, the unbiased complex reward and --unbiased scoring on tiny random models of the real classes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rewards import load
from rewards.three_in_one import three_in_one_score

SPATIAL = "The red hat was on top of the brown coat rack."  # complex_val_spatial
ACTION = "The black phone was resting on the brown charger."  # complex_val_action
BOTH = "a blue cat on the left of a dog that is holding a green ball"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    from gors.testing.blip import build_tiny_blip_captioner, build_tiny_blip_vqa
    from gors.testing.clip import build_tiny_clip
    from gors.testing.detection import build_tiny_grounding_dino, build_tiny_owlv2
    from gors.testing.sam import build_tiny_sam

    root = tmp_path_factory.mktemp("composite")
    return {
        "blip_vqa": str(build_tiny_blip_vqa(root / "blip_vqa")),
        "owlv2": str(build_tiny_owlv2(root / "owlv2")),
        "clip": str(build_tiny_clip(root / "clip")),
        "grounding_dino": str(build_tiny_grounding_dino(root / "gdino")),
        "mm_grounding_dino": str(build_tiny_grounding_dino(root / "mmgdino", mm=True)),
        "sam": str(build_tiny_sam(root / "sam")),
        "captioner": str(build_tiny_blip_captioner(root / "captioner")),
    }


def images(count: int) -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)) for _ in range(count)]


def test_three_in_one_mixes_its_members_by_sub_split(models):
    reward = load(
        "three_in_one", device="cpu", subsplits="none",
        b_vqa={"model_name_or_path": models["blip_vqa"], "noun_phrase_backend": "builtin"},
        spatial_rule={"model_name_or_path": models["owlv2"], "threshold": 0.0},
        clip_score={"model_name_or_path": models["clip"]},
    )
    assert reward.members["spatial"].complex and reward.members["action"].remove_adjectives
    prompts = [SPATIAL, ACTION, BOTH]
    metadata = [{"three_in_one": "spatial"}, {"three_in_one": "action"}, {}]
    out = reward.score(images(3), prompts, metadata)
    assert [d["kind"] for d in out.details] == ["spatial", "action", "all"]
    for value, details in zip(out.scores, out.details):
        terms = {t: details[t]["score"] for t in ("attribute", "spatial", "action")}
        assert 0.0 <= value <= 1.0
        assert value == pytest.approx(three_in_one_score(terms["attribute"], terms["spatial"], terms["action"],
                                                         details["kind"]))
    # Each term is the member reward itself, configured as the official 3-in-1 configures it.
    clip_alone = load("clip_score", model_name_or_path=models["clip"], device="cpu", remove_adjectives=True)
    assert out.details[1]["action"]["score"] == pytest.approx(clip_alone.score(images(3)[1:2], [ACTION]).scores[0])
    assert out.details[1]["action"]["details"]["text"] == "The phone was resting on the charger ."


def test_three_in_one_reads_the_official_sub_splits(models, monkeypatch):
    shared = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
    if not (shared / "t2i_compbench" / "complex_val_spatial.txt").is_file():
        pytest.skip("needs ../shared/benchmarks")
    monkeypatch.setenv("GORS_DATA_DIR", str(shared))
    reward = load(
        "three_in_one", device="cpu",
        b_vqa={"model_name_or_path": models["blip_vqa"], "noun_phrase_backend": "builtin"},
        spatial_rule={"model_name_or_path": models["owlv2"]}, clip_score={"model_name_or_path": models["clip"]},
    )
    out = reward.score(images(3), [SPATIAL, ACTION, BOTH])
    assert [d["kind"] for d in out.details] == ["spatial", "action", "all"]


def test_official_sub_splits_hold_the_train_lists_too(monkeypatch):
    from rewards.three_in_one import _official_subsplits, normalise_prompt, prompt_kind

    shared = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
    if not (shared / "t2i_compbench" / "complex_train_spatial.txt").is_file():
        pytest.skip("needs ../shared/benchmarks")
    monkeypatch.setenv("GORS_DATA_DIR", str(shared))
    subsplits = _official_subsplits()
    train_spatial = "The green plant was on top of the white nightstand."  # complex_train_spatial
    train_action = "The rectangular mirror was hung above the marble sink."  # complex_train_action
    assert normalise_prompt(train_spatial) in subsplits["spatial"]
    assert normalise_prompt(train_action) in subsplits["action"]
    assert normalise_prompt(SPATIAL) in subsplits["spatial"] and normalise_prompt(ACTION) in subsplits["action"]
    assert [prompt_kind(p, subsplits["spatial"], subsplits["action"]) for p in (train_spatial, train_action, BOTH)] == [
        "spatial", "action", "all"]


def test_three_in_one_rejects_a_single_model_path():
    with pytest.raises(ValueError, match="give each one's model"):
        load("three_in_one", model_name_or_path="Salesforce/blip-vqa-capfilt-large")


def test_unbiased_complex_refuses_a_single_model_path_and_bad_member_options_before_any_work():
    from rewards.combined import check_reward_options

    # As three_in_one: checked with the options (`gors run` before generating), not when the reward loads.
    with pytest.raises(ValueError, match=r"^--reward_model_name_or_path='m': unbiased_complex combines three "
                                         r"rewards; give each one's model in its options"):
        check_reward_options("unbiased_complex", {}, model_name_or_path="m")
    with pytest.raises(ValueError, match=r"grounded_sam has no option 'sam_model'"):
        check_reward_options("unbiased_complex", {"grounded_sam": {"sam_model": "x"}})
    with pytest.raises(ValueError, match=r"weights for unknown members \['grounded_sma'\]"):
        check_reward_options("unbiased_complex", {"weights": {"grounded_sma": 2.0}})
    check_reward_options("unbiased_complex", {"weights": {"blip_clip": 2.0}, "grounded_detection": {"complex": True}})


def test_unbiased_complex_averages_the_unbiased_rewards(models):
    reward = load(
        "unbiased_complex", device="cpu", weights={"blip_clip": 2.0},
        grounded_sam={"model_name_or_path": models["grounding_dino"], "sam_model_name_or_path": models["sam"]},
        grounded_detection={"model_name_or_path": models["mm_grounding_dino"]},
        blip_clip={"model_name_or_path": models["captioner"], "clip_model_name_or_path": models["clip"],
                   "max_length": 14},
    )
    assert reward.members["grounded_detection"].complex
    out = reward.score(images(3), [BOTH, ACTION, "The tall tree stood nearby, casting long shadows."])
    with_relation, without, one_object = out.details
    assert set(with_relation["members"]) == {"grounded_sam", "grounded_detection", "blip_clip"}
    # An action prompt has no relation word, and "nearby" names one object: grounded detection has no
    # layout to judge and sits out (it used to count as a 0 for the second).
    assert set(without["members"]) == set(one_object["members"]) == {"grounded_sam", "blip_clip"}
    for value, details in zip(out.scores, out.details):
        members = details["members"]
        expected = sum(m["weight"] * m["score"] for m in members.values()) / sum(m["weight"] for m in members.values())
        assert 0.0 <= value <= 1.0 and value == pytest.approx(expected)
    assert with_relation["members"]["blip_clip"]["weight"] == pytest.approx(0.5)
    assert "caption" in without["members"]["blip_clip"]["details"]


def test_unbiased_flag_scores_with_the_intended_models(make_run_config, models, tiny_sd):
    """`gors score --unbiased --category color` must score with Grounded-SAM on the models given."""
    from gors.generate import generate
    from gors.score import score

    config = make_run_config(
        reward=None, reward_model_name_or_path=None, unbiased=True, category="color",
        reward_options=json.dumps({"model_name_or_path": models["grounding_dino"],
                                   "sam_model_name_or_path": models["sam"]}),
    )
    generate(config)
    rows = score(config)
    assert len(rows) == 6
    folder = Path(config.output_dir) / "scores" / "grounded_sam"
    assert folder.is_dir() and not (Path(config.output_dir) / "scores" / "b_vqa").exists()
    for row in rows.values():
        assert 0.0 <= row["reward"] <= 1.0 and "pairs" in row["details"]
