"""Choosing rewards: weighted lists, --unbiased, the paper's table, plugins, 3-in-1's mix."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from PIL import Image

from gors.cli import main, parse_config
from gors.config import RunConfig, ScoreConfig
from gors.recipes import recipe_defaults
from rewards import Reward, RewardOutput, register_reward
from rewards.combined import (
    RewardSpec,
    WeightedReward,
    build_reward,
    check_reward_options,
    dtype_setting,
    parse_reward_list,
    weighted_mean,
)
from rewards.paper import METRIC_REWARD, UNBIASED_REWARD, resolve_reward
from rewards.registry import available_rewards, get_reward_class
from rewards.three_in_one import normalise_prompt, prompt_kind, three_in_one_score

SHARED_T2I = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "t2i_compbench"


@register_reward("test_constant")
class Constant(Reward):
    """Scores every image `value`; records how it was built."""

    built: ClassVar[list[dict]] = []

    def __init__(self, model_name_or_path=None, device=None, torch_dtype=None, batch_size=8, value=0.5):
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.value = value
        Constant.built.append({"model_name_or_path": model_name_or_path, "value": value})

    def _score(self, images, prompts, metadata):
        return RewardOutput([self.value] * len(images), [{"value": self.value} for _ in images])


@register_reward("test_bf16_trained")
class Bf16Trained(Constant):
    """A reward whose model overflows in float16 (as a Qwen3-VL trained in bfloat16 does)."""

    overflows_in_float16 = True


@register_reward("test_brightness")
class Brightness(Reward):
    def _score(self, images, prompts, metadata):
        values = [float(np.asarray(image).mean() / 255) for image in images]
        return RewardOutput(values, [{"brightness": v} for v in values])


# ---- pure logic -----------------------------------------------------------------------------


def test_parse_reward_list():
    assert parse_reward_list("b_vqa") == [RewardSpec("b_vqa", 1.0)]
    assert parse_reward_list(" b_vqa:0.7, blip_clip:0.3 ") == [RewardSpec("b_vqa", 0.7), RewardSpec("blip_clip", 0.3)]
    assert parse_reward_list("my.mod:MyReward:2,b_vqa") == [RewardSpec("my.mod:MyReward", 2.0), RewardSpec("b_vqa", 1.0)]
    assert parse_reward_list("my.mod:MyReward") == [RewardSpec("my.mod:MyReward", 1.0)]


@pytest.mark.parametrize(
    "text, message",
    [("", "give a reward name"), ("b_vqa,,clip_score", "empty item"), ("b_vqa:0", "must be > 0"),
     ("b_vqa:-1", "must be > 0"), ("b_vqa:nan", "must be > 0"), (":0.5", "no reward name"),
     ("b_vqa,b_vqa:2", "appears twice"), ("toy_oracle:abc", "weight 'abc' of 'toy_oracle' is not a number"),
     ("my.mod:MyReward:x", "weight 'x' of 'my.mod:MyReward' is not a number"), ("b_vqa:0.x", "weight '0.x'")],
)
def test_weight_lists_that_do_not_parse(text, message):
    with pytest.raises(ValueError, match=message):
        parse_reward_list(text)


def test_weighted_mean():
    assert weighted_mean([1.0, 0.0], [0.7, 0.3]) == pytest.approx(0.7)
    assert weighted_mean([0.2, 0.6], [1, 1]) == pytest.approx(0.4)
    assert weighted_mean([0.5], [3.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        weighted_mean([0.5, 0.5], [1.0])


def test_weights_that_are_infinite_or_read_as_a_path_are_refused():
    """A weight must be finite (inf would swamp every other member), an item `name::w` has no reward
    name, and `name:0.x` whose tail is no identifier is a bad weight, not a `module:Class` path."""
    with pytest.raises(ValueError, match="weights must be > 0 and finite"):
        parse_reward_list("b_vqa:inf,clip_score")
    with pytest.raises(ValueError, match="'b_vqa::0.5' has no reward name"):
        parse_reward_list("b_vqa::0.5")
    with pytest.raises(ValueError, match="weight '0.x' of 'my_mod' is not a number"):
        parse_reward_list("my_mod:0.x")


def test_weighted_mean_refuses_weights_that_sum_to_zero_and_empty_lists_by_name():
    """No weights, or weights summing to 0, are a ValueError that says so (never a ZeroDivisionError)."""
    with pytest.raises(ValueError, match=r"weights \[0.0\] sum to 0.0; they must be positive"):
        weighted_mean([0.5], [0.0])
    with pytest.raises(ValueError, match="0 scores and 0 weights; need the same, non-zero count"):
        weighted_mean([], [])


def test_three_in_one_terms_follow_the_official_mix():
    assert three_in_one_score(0.9, 0.6, 0.3) == pytest.approx(0.6)
    assert three_in_one_score(0.9, 0.6, 0.3, "spatial") == pytest.approx(0.75)
    assert three_in_one_score(0.9, 0.6, 0.3, "action") == pytest.approx(0.6)
    with pytest.raises(ValueError, match="kind"):
        three_in_one_score(0.9, 0.6, 0.3, "both")


def test_three_in_one_subsplit_lookup_uses_the_official_key():
    assert normalise_prompt("The Red hat was on top of the brown coat rack.\n") == "the red hat was on top of the brown coat rack"
    spatial, action = {"a cat on a mat"}, {"a dog runs"}
    assert prompt_kind("A cat on a mat.", spatial, action) == "spatial"
    assert prompt_kind("a dog runs", spatial, action) == "action"
    assert prompt_kind("a dog runs on a mat", spatial, action) == "all"
    # A prompt in both lists (user lists may overlap; the official ones do not) is spatial: 3_in_1.py asks
    # `if ... in spatial` before `elif ... in action`.
    assert prompt_kind("a dog runs", spatial | action, action) == "spatial"


@pytest.mark.skipif(not SHARED_T2I.is_dir(), reason="needs ../shared/benchmarks")
def test_official_complex_val_splits_into_58_spatial_212_action_30_both(monkeypatch):
    from rewards.three_in_one import _official_subsplits

    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED_T2I.parent))
    splits = _official_subsplits()
    prompts = (SHARED_T2I / "complex_val.txt").read_text().splitlines()
    kinds = [prompt_kind(p, splits["spatial"], splits["action"]) for p in prompts]
    assert (kinds.count("spatial"), kinds.count("action"), kinds.count("all")) == (58, 212, 30)


def test_three_in_one_key_strips_the_line_end_and_cuts_at_the_first_full_stop():
    """The sub-split key is 3_in_1.py's `i.strip('\\n').split('.')[0].lower()`: a prompt's line end never
    keeps it out of its sub-split, and a prompt of two sentences is keyed by its first."""
    assert normalise_prompt("a dog runs\n") == "a dog runs"
    assert prompt_kind("a dog runs\n", {"a cat on a mat"}, {"a dog runs"}) == "action"
    assert normalise_prompt("A cat sat on the mat. Then it slept.") == "a cat sat on the mat"


def test_three_in_one_takes_one_question_table_given_both_ways():
    """`questions` and ``b_vqa={"questions": ...}`` naming the same file, one as a path object and one as
    text, are one table, not two."""
    from rewards.three_in_one import ThreeInOneReward

    ThreeInOneReward.check_options({"questions": Path("table.json"), "b_vqa": {"questions": "table.json"}})
    with pytest.raises(ValueError, match="two question tables"):
        ThreeInOneReward.check_options({"questions": Path("a.json"), "b_vqa": {"questions": "b.json"}})


def _three_in_one_with_stub_members(monkeypatch, **options):
    """A ThreeInOneReward whose members are model-free stubs: member `name` scores image i `SCORES[name][i]`,
    with details naming itself and the image; `built` records each member's keyword arguments."""
    import rewards.three_in_one as three_in_one

    built: dict[str, dict] = {}

    def member(name):
        class Stub(Reward):
            def __init__(self, device=None, torch_dtype=None, batch_size=8, **kwargs):
                super().__init__(None, device, torch_dtype, batch_size)
                built[name] = kwargs

            def _score(self, images, prompts, metadata):
                return RewardOutput(STUB_SCORES[name][:len(images)],
                                    [{"member": name, "image": i} for i in range(len(images))])
        return Stub

    monkeypatch.setattr(three_in_one, "get_reward_class", member)
    return three_in_one.ThreeInOneReward(device="cpu", subsplits="none", **options), built


STUB_SCORES = {"b_vqa": [0.9, 0.3, 0.6, 0.0], "spatial_rule": [0.6, 0.9, 0.0, 0.3], "clip_score": [0.3, 0.0, 0.9, 0.6]}


def test_three_in_one_scores_each_image_by_its_own_kind_and_member_scores(monkeypatch):
    """Per image: its own metadata's kind (an entry without `three_in_one`, or with None, falls back to the
    prompt's sub-split), the mean of that kind's terms of its own member scores, and each member's own
    details for that image."""
    reward, _ = _three_in_one_with_stub_members(monkeypatch)
    metadata = [{"three_in_one": "spatial"}, {"three_in_one": "action"}, {"seed": 3}, {"three_in_one": None}]
    out = reward.score(_images(4), ["a", "b", "c", "d"], metadata)
    assert out.scores == pytest.approx([(0.9 + 0.6) / 2, (0.3 + 0.0) / 2, (0.6 + 0.0 + 0.9) / 3, (0.0 + 0.3 + 0.6) / 3])
    assert [d["kind"] for d in out.details] == ["spatial", "action", "all", "all"]
    assert [d["terms"] for d in out.details] == [["attribute", "spatial"], ["attribute", "action"],
                                                 ["attribute", "spatial", "action"]] + [["attribute", "spatial", "action"]]
    for i, details in enumerate(out.details):
        assert details["score"] == out.scores[i]
        for term, name in (("attribute", "b_vqa"), ("spatial", "spatial_rule"), ("action", "clip_score")):
            assert details[term] == {"score": STUB_SCORES[name][i], "details": {"member": name, "image": i}}


def test_three_in_one_metadata_kind_overrides_the_sub_split_and_is_checked(monkeypatch):
    """A metadata `three_in_one` wins over the prompt's sub-split; metadata without it keeps the sub-split;
    a kind that is not one of all/spatial/action is refused, naming the metadata."""
    reward, _ = _three_in_one_with_stub_members(monkeypatch)
    reward.subsplits = {"spatial": {"a cat on a mat"}, "action": set()}
    assert reward.kind_of("A cat on a mat.", None) == "spatial"
    assert reward.kind_of("A cat on a mat.", {"seed": 1}) == "spatial"
    assert reward.kind_of("A cat on a mat.", {"three_in_one": "action"}) == "action"
    with pytest.raises(ValueError, match=r"metadata three_in_one='both'; choose one of \['action', 'all', 'spatial'\]"):
        reward.kind_of("A cat on a mat.", {"three_in_one": "both"})


def test_three_in_one_member_options_override_its_official_member_settings(monkeypatch):
    """The official 3-in-1 settings (complex spatial rule, adjective-free CLIPScore) are defaults: a
    member's own option given by the user wins."""
    _, built = _three_in_one_with_stub_members(monkeypatch)
    assert built["spatial_rule"] == {"complex": True} and built["clip_score"] == {"remove_adjectives": True}
    _, built = _three_in_one_with_stub_members(monkeypatch, spatial_rule={"complex": False},
                                                clip_score={"remove_adjectives": False})
    assert built["spatial_rule"] == {"complex": False} and built["clip_score"] == {"remove_adjectives": False}


def test_paper_table_and_resolution():
    assert METRIC_REWARD["color"] == "b_vqa" and UNBIASED_REWARD["color"] == "grounded_sam"
    assert METRIC_REWARD["spatial"] == "spatial_rule" and UNBIASED_REWARD["spatial"] == "grounded_detection"
    assert METRIC_REWARD["non_spatial"] == "clip_score" and UNBIASED_REWARD["non_spatial"] == "blip_clip"
    assert METRIC_REWARD["complex"] == "three_in_one" and UNBIASED_REWARD["complex"] == "unbiased_complex"
    assert set(METRIC_REWARD.values()) | set(UNBIASED_REWARD.values()) <= set(available_rewards())
    assert resolve_reward(None, False, None) == "b_vqa"
    assert resolve_reward("clip_score", False, "color") == "clip_score"
    assert resolve_reward(None, True, "non_spatial") == "blip_clip"
    with pytest.raises(ValueError, match="needs a category"):
        resolve_reward(None, True, None)
    with pytest.raises(ValueError, match="both choose"):
        resolve_reward("b_vqa", True, "color")


@pytest.mark.parametrize("category", sorted(UNBIASED_REWARD.keys() - {"toy"}))
def test_recipe_flags_choose_metric_or_unbiased_reward(category):
    biased = parse_config(RunConfig, [], defaults=recipe_defaults(category))
    unbiased = parse_config(RunConfig, ["--unbiased"], defaults=recipe_defaults(category))
    listed = parse_config(RunConfig, ["--reward", "b_vqa:0.7,blip_clip:0.3"], defaults=recipe_defaults(category))
    assert biased.reward_name() == METRIC_REWARD[category]
    assert unbiased.reward_name() == UNBIASED_REWARD[category]
    assert listed.reward_name() == "b_vqa:0.7,blip_clip:0.3"


@pytest.mark.parametrize(
    "flags, message",
    [(["--reward", "b_vqa", "--unbiased"], "both choose"), (["--reward", "b_vqa:0.5,"], "empty item"),
     (["--reward_options", "{not: valid"], "not valid JSON"), (["--reward_options", "[1, 2]"], "expected a mapping")],
)
def test_bad_reward_flags_name_the_problem(flags, message):
    with pytest.raises(SystemExit, match=message):
        parse_config(ScoreConfig, flags)


def test_reward_options_parse_from_json_and_yaml(tmp_path):
    config = parse_config(ScoreConfig, ["--reward_options", '{"b_vqa": {"model_name_or_path": "x"}}'])
    assert config.reward_options == {"b_vqa": {"model_name_or_path": "x"}}
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("reward: blip_clip\nreward_options:\n  clip_model_name_or_path: y\n")
    config = parse_config(ScoreConfig, ["--config", str(yaml_file)])
    assert (config.reward, config.reward_options) == ("blip_clip", {"clip_model_name_or_path": "y"})


# ---- building and combining -------------------------------------------------------------------


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(n)]


def test_a_list_runs_each_member_in_its_own_dtype():
    # Under fp16 generation, only the bfloat16-trained member moves to bfloat16: the others keep the
    # half precision that pays, as each would alone.
    reward = build_reward("test_constant:1,test_bf16_trained:1", device="cpu", torch_dtype=torch.float16)
    assert {name: m.torch_dtype for name, m in reward.members.items()} == {
        "test_constant": torch.float16, "test_bf16_trained": torch.bfloat16}
    assert dtype_setting("test_constant:1,test_bf16_trained:1", torch.float16) == {
        "test_constant": "float16", "test_bf16_trained": "bfloat16"}
    # One dtype for all: recorded as one name, as for a single reward (folders made before keep resuming).
    assert dtype_setting("test_constant:1,test_bf16_trained:1", torch.bfloat16) == "bfloat16"
    assert dtype_setting("test_bf16_trained", torch.bfloat16) == "bfloat16"
    single = build_reward("test_bf16_trained", device="cpu", torch_dtype=torch.bfloat16)
    assert single.torch_dtype == torch.bfloat16


def test_weighted_reward_mixes_members_and_keeps_their_details():
    reward = build_reward("test_constant:3,test_brightness:1", options={"test_constant": {"value": 1.0}}, device="cpu")
    assert isinstance(reward, WeightedReward) and reward.weights == {"test_constant": 0.75, "test_brightness": 0.25}
    images = _images(3)
    out = reward.score(images, ["a"] * 3)
    for image, value, details in zip(images, out.scores, out.details):
        brightness = float(np.asarray(image).mean() / 255)
        assert value == pytest.approx(0.75 + 0.25 * brightness)
        assert details["members"]["test_brightness"]["details"]["brightness"] == pytest.approx(brightness)
        assert details["members"]["test_constant"]["weight"] == 0.75


def test_one_reward_with_a_weight_is_a_list_of_one():
    """`name:w` is a weighted list of one member (options keyed by member, details per member), not the
    reward built as itself: only a bare name is."""
    reward = build_reward("test_constant:2", options={"test_constant": {"value": 0.25}}, device="cpu")
    assert isinstance(reward, WeightedReward) and reward.weights == {"test_constant": 1.0}
    out = reward.score(_images(1), ["a"])
    assert out.scores == [0.25] and out.details[0]["members"]["test_constant"]["weight"] == 1.0

def test_single_reward_is_built_as_itself_with_its_options():
    reward = build_reward("test_constant", model_name_or_path="some/model", options={"value": 0.25}, device="cpu")
    assert type(reward) is Constant and reward.value == 0.25
    assert Constant.built[-1] == {"model_name_or_path": "some/model", "value": 0.25}


def test_build_reward_rejects_ambiguous_or_unknown_input():
    with pytest.raises(ValueError, match="ambiguous"):
        build_reward("test_constant,test_brightness", model_name_or_path="x")
    with pytest.raises(ValueError, match="disagree"):
        build_reward("test_constant", model_name_or_path="a", options={"model_name_or_path": "b"})
    with pytest.raises(ValueError, match="not in the reward list"):
        build_reward("test_constant,test_brightness", options={"b_vqa": {}})
    with pytest.raises(ValueError, match=r"Unknown reward 'bvqa' \(did you mean 'b_vqa'\?\)\. Known rewards: "):
        build_reward("test_constant:1,bvqa:1")


def test_unknown_reward_options_are_refused_with_the_accepted_ones_before_any_model_loads():
    built = len(Constant.built)
    accepted = "its options: model_name_or_path, value$"
    with pytest.raises(ValueError, match=rf"--reward_options: reward 'test_constant' has no option 'nope'; {accepted}"):
        build_reward("test_constant", options={"nope": 1}, device="cpu")
    with pytest.raises(ValueError, match=rf"reward 'test_constant' has no option 'device'; {accepted}"):
        check_reward_options("test_constant", {"device": "cpu"})  # gors sets it
    with pytest.raises(ValueError, match="reward 'test_constant' has no option 'nope'"):
        build_reward("test_brightness,test_constant", options={"test_constant": {"nope": 1}}, device="cpu")
    with pytest.raises(ValueError, match="the options of 'test_constant' are 5; give a mapping"):
        check_reward_options("test_brightness,test_constant", {"test_constant": 5})
    assert len(Constant.built) == built  # nothing was built
    check_reward_options("test_constant", {"value": 0.3, "model_name_or_path": "x"})


def test_evaluate_scorer_options_of_a_benchmark_must_be_a_mapping():
    from gors.config import EvaluateConfig

    with pytest.raises(SystemExit, match="--scorer_options: 'toy' maps to 5; give that benchmark's scorer options as a "
                                         "mapping"):
        parse_config(EvaluateConfig, ["--scorer_options", '{"toy": 5}'])


def test_non_rgb_images_are_converted_for_every_member():
    reward = build_reward("test_constant,test_brightness", device="cpu")
    gray = Image.new("L", (8, 8), 255)
    rgba = Image.new("RGBA", (8, 8), (255, 255, 255, 0))
    out = reward.score([gray, rgba], ["a", "b"])
    assert out.details[0]["members"]["test_brightness"]["score"] == pytest.approx(1.0)


def test_reward_from_an_installed_entry_point(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(
        "from rewards import Reward, RewardOutput\n"
        "class Half(Reward):\n"
        "    description = 'always one half'\n"
        "    def _score(self, images, prompts, metadata):\n"
        "        return RewardOutput([0.5] * len(images))\n"
    )
    dist = tmp_path / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gors.rewards]\nhalf = my_plugin:Half\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "half" in available_rewards()
    assert get_reward_class("half").__name__ == "Half"
    assert build_reward("half:1,test_constant:1", device="cpu").score(_images(1), ["a"]).scores == [0.5]


def test_entry_points_are_read_once_until_a_package_is_installed_on_the_path(tmp_path, monkeypatch):
    import rewards.registry

    reads = []
    monkeypatch.setattr(rewards.registry, "entry_points",
                        lambda group: (reads.append(group), importlib.metadata.entry_points(group=group))[1])
    monkeypatch.syspath_prepend(str(tmp_path))  # a state of the path no earlier test has seen
    assert "later" not in available_rewards() and "later" not in available_rewards()
    assert reads == ["gors.rewards"]  # the second lookup read no package's metadata
    (tmp_path / "later_plugin.py").write_text("from rewards import Reward\nclass Later(Reward):\n"
                                              "    def _score(self, images, prompts, metadata): ...\n")
    dist = tmp_path / "later_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: later-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gors.rewards]\nlater = later_plugin:Later\n")
    os.utime(tmp_path, ns=(0, os.stat(tmp_path).st_mtime_ns + 10**9))  # as an install a clock tick later does
    assert get_reward_class("later").__name__ == "Later"
    assert reads == ["gors.rewards"] * 2
    rewards.registry.declared_entry_points()["later"].append("a caller's own change")
    assert rewards.registry.declared_entry_points()["later"] == ["later_plugin:Later"]


BRIGHTNESS_MODULE = (
    "import numpy as np\n"
    "from rewards import Reward, RewardOutput\n"
    "class Brightness(Reward):\n"
    "    def _score(self, images, prompts, metadata):\n"
    "        values = [float(np.asarray(image.convert('L')).mean()) / 255 for image in images]\n"
    "        return RewardOutput(values, [{'brightness': v} for v in values])\n"
)


@pytest.fixture
def console_script_path(tmp_path, monkeypatch):
    """The working directory is `tmp_path` and, as under the `gors` console script or an `accelerate
    launch`ed recipe, not on `sys.path`; modules imported from it are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("cwd_reward"):
            del sys.modules[name]


def test_module_class_path_is_found_in_the_working_directory_as_python_m_finds_it(console_script_path):
    (console_script_path / "cwd_reward_ok.py").write_text(BRIGHTNESS_MODULE)
    path = list(sys.path)
    assert get_reward_class("cwd_reward_ok:Brightness").__name__ == "Brightness"
    assert sys.path == path  # the working directory was on it for that import only
    reward = build_reward("cwd_reward_ok:Brightness:1,test_constant:1", options={"test_constant": {"value": 0.0}})
    assert reward.score([Image.new("RGB", (8, 8), "white")], ["a"]).scores == [pytest.approx(0.5)]


def test_a_reward_module_that_is_nowhere_names_pythonpath_and_itself_once(console_script_path):
    path = list(sys.path)
    with pytest.raises(ValueError) as err:
        get_reward_class("cwd_reward_missing:Brightness")
    message = str(err.value)
    assert message.startswith("Could not import reward 'cwd_reward_missing:Brightness': No module named "
                              "'cwd_reward_missing', neither on the Python path nor in the working directory")
    assert "PYTHONPATH" in message and message.count("cwd_reward_missing:Brightness") == 1
    assert sys.path == path
    # Found, but broken inside: its own error, not advice about where it lives.
    (console_script_path / "cwd_reward_broken.py").write_text("import cwd_reward_dependency_not_installed\n")
    with pytest.raises(ValueError, match=r"^Could not import reward 'cwd_reward_broken:X': No module named "
                                         r"'cwd_reward_dependency_not_installed'$"):
        get_reward_class("cwd_reward_broken:X")
    # A module found on the Python path whose dependency lies only in the working directory: its error as it is,
    # not the working directory's module taken in (the working directory stands in only for the module itself).
    elsewhere = console_script_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cwd_reward_on_path.py").write_text("import cwd_reward_helper\n")
    (console_script_path / "cwd_reward_helper.py").write_text("")
    sys.path.insert(0, str(elsewhere))
    with pytest.raises(ValueError, match=r"^Could not import reward 'cwd_reward_on_path:X': No module named "
                                         r"'cwd_reward_helper'$"):
        get_reward_class("cwd_reward_on_path:X")
    sys.path.remove(str(elsewhere))
    (console_script_path / "cwd_reward_no_class.py").write_text(BRIGHTNESS_MODULE)
    with pytest.raises(ValueError, match=r"^Could not import reward 'cwd_reward_no_class:Brightnes': module "
                                         r"'cwd_reward_no_class' has no attribute 'Brightnes'$"):
        get_reward_class("cwd_reward_no_class:Brightnes")
    with pytest.raises(ValueError, match=r"^'cwd_reward_no_class:np' is not a Reward subclass$"):
        get_reward_class("cwd_reward_no_class:np")
    (console_script_path / "cwd_reward_unfinished.py").write_text("from rewards import Reward\nclass R(Reward): pass\n")
    with pytest.raises(ValueError, match=r"^reward class R does not implement _score"):  # found, and checked as registered
        get_reward_class("cwd_reward_unfinished:R")


@pytest.mark.slow
def test_gors_console_script_scores_with_a_reward_module_in_the_working_directory(tmp_path):
    """docs/extending.md's `gors score --reward my_module:Brightness`, run as the user runs it."""
    from gors.core.prompts import load_prompts
    from gors.core.store import SampleStore

    gors = Path(sys.executable).parent / "gors"
    store = SampleStore(tmp_path / "run" / "samples")
    prompts = load_prompts("toy:train").prompts[:2]
    store.save_prompts({"name": "toy:train", "category": "toy", "source": "test", "prompts": prompts})
    for index, prompt in enumerate(prompts):
        store.append(0, Image.new("RGB", (8, 8), "white"),
                     {"file_name": f"{index:05d}_000.png", "prompt": prompt, "prompt_index": index, "image_index": 0})
    (tmp_path / "my_module.py").write_text(BRIGHTNESS_MODULE)
    done = subprocess.run([str(gors), "score", "--output_dir", "run", "--reward", "my_module:Brightness"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    rows = (tmp_path / "run" / "scores" / "my_module_Brightness" / "part-00000.jsonl").read_text().splitlines()
    assert [json.loads(row)["reward"] for row in rows] == [1.0, 1.0]


def test_gors_rewards_lists_every_builtin_with_its_role(capsys):
    main(["rewards"])
    out = capsys.readouterr().out
    for name in ("b_vqa", "three_in_one", "unbiased_complex", "toy_oracle"):
        assert name in out
    assert "unbiased: color, shape, texture" in out and "metric: complex" in out


# ---- through the stages -----------------------------------------------------------------------


def test_weighted_list_reaches_scoring_selection_and_training(make_run_config, tiny_blip):
    from gors.run import run

    Constant.built.clear()
    config = make_run_config(
        reward="b_vqa:0.5,test_constant:0.5", reward_model_name_or_path=None,
        reward_options=json.dumps({"b_vqa": {"model_name_or_path": str(tiny_blip)}, "test_constant": {"value": 1.0}}),
        reward_threshold=0.5,
    )
    run(config)
    out = Path(config.output_dir)
    rows = [json.loads(line) for line in (out / "scores" / "b_vqa_0.5_test_constant_0.5" / "part-00000.jsonl").open()]
    assert len(rows) == 6 and Constant.built == [{"model_name_or_path": None, "value": 1.0}]
    for row in rows:
        b_vqa = row["details"]["members"]["b_vqa"]["score"]
        assert row["reward"] == pytest.approx(0.5 * b_vqa + 0.5)
    summary = json.loads((out / "selection_summary.json").read_text())
    assert summary["reward"] == "b_vqa:0.5,test_constant:0.5" and summary["num_selected"] == 6
    assert (out / "pytorch_lora_weights.safetensors").is_file()


def test_unbiased_flag_reaches_scoring_and_training(make_run_config):
    """The toy category's unbiased reward is the packaged classifier: it must be the one that scores."""
    from gors.run import run

    config = make_run_config(reward=None, reward_model_name_or_path=None, unbiased=True, category="toy",
                             reward_threshold=0.0)
    assert config.reward_name() == "toy_classifier"
    run(config)
    out = Path(config.output_dir)
    assert (out / "scores" / "toy_classifier").is_dir() and not (out / "scores" / "toy_oracle").exists()
    assert json.loads((out / "selection_summary.json").read_text())["reward"] == "toy_classifier"
    assert (out / "pytorch_lora_weights.safetensors").is_file()


def test_a_category_other_than_the_prompts_is_refused_where_it_would_judge_them(tmp_path):
    from gors.config import RunConfig
    from gors.core.prompts import check_category
    from gors.run import check_run_inputs

    # As a recipe with other prompts: that category's reward and tau would have judged these prompts.
    config = RunConfig(train_prompts="toy:train", category="color", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^--category='color' \(given, or set by the recipe\), but --train_prompts "
                                         r"toy:train are 'toy' prompts: color's reward and tau would judge them\. Drop "
                                         r"--category \(a recipe's: --category none, or run the toy recipe\), "
                                         r"or give --reward and "
                                         r"--reward_threshold"):
        check_run_inputs(config)
    with pytest.raises(ValueError, match=r"color's tau would judge them"):
        check_category(RunConfig(category="color", reward="toy_oracle"), "toy", "x")
    with pytest.raises(ValueError, match=r"color's reward would judge them"):
        check_category(RunConfig(category="color"), "toy", "x", tau=False)  # scoring: the reward only
    check_category(RunConfig(category="color", reward="toy_oracle", reward_threshold=0.5), "toy", "x")  # on purpose
    check_category(RunConfig(category="color"), None, "x")  # a prompt file takes any category
    check_category(RunConfig(category="spatial"), "3d_spatial", "x")  # no tau of its own: borrows spatial's
    check_category(RunConfig(category="toy"), "toy", "x")


def test_an_edited_plugin_rewards_old_scores_are_kept_with_a_warning(console_script_path, caplog):
    """A plugin reward's source file is recorded with its scores (informational): an edit is warned of where
    the old scores are read, not refused (a docstring edit would refuse every score)."""
    import json

    from gors.core.scoring import SETTINGS_FILE, check_settings
    from gors.core.store import StoreError
    from rewards.combined import versioned

    module = console_script_path / "cwd_reward_edited.py"
    module.write_text(BRIGHTNESS_MODULE)
    before = versioned("cwd_reward_edited:Brightness:1,toy_oracle:1")
    assert list(before["plugin_sources"]) == ["cwd_reward_edited:Brightness"]  # gors' own rewards: not recorded
    assert "plugin_sources" not in versioned("toy_oracle")
    folder = console_script_path / "scores"
    folder.mkdir()
    settings = {"reward": "cwd_reward_edited:Brightness", "options": {}, **before}
    (folder / SETTINGS_FILE).write_text(json.dumps(settings))
    assert check_settings(folder, settings, scored=True) is False and not caplog.records
    module.write_text(BRIGHTNESS_MODULE.replace("/ 255", "/ 255.0"))
    edited = {**settings, **versioned("cwd_reward_edited:Brightness")}
    assert edited["plugin_sources"] != settings["plugin_sources"]
    assert check_settings(folder, edited, scored=True) is False  # kept, and the record stays the old one
    assert "holds scores made when the source file of cwd_reward_edited:Brightness was another: the scores are " \
           "kept as they are; if the change changes them, raise the reward's scoring_version" in caplog.text
    check_settings(folder, edited, scored=True)  # overlapped scoring opens the folder again: said once
    assert caplog.text.count("holds scores made when the source file") == 1
    # A folder an earlier gors scored records the sources now; other settings still refuse.
    older = {key: value for key, value in settings.items() if key != "plugin_sources"}
    (folder / SETTINGS_FILE).write_text(json.dumps(older))
    assert check_settings(folder, edited, scored=True) is True
    with pytest.raises(StoreError, match="holds scores made with"):
        check_settings(folder, {**edited, "options": {"scale": 2}}, scored=True)
    # A refusal is said alone: no warning beside it that the scores are kept.
    refused = console_script_path / "scores_refused"
    refused.mkdir()
    (refused / SETTINGS_FILE).write_text(json.dumps(settings))
    caplog.clear()
    with pytest.raises(StoreError, match="holds scores made with"):
        check_settings(refused, {**edited, "options": {"scale": 2}}, scored=True)
    assert "scores are kept" not in caplog.text



def test_a_reward_defined_where_no_file_holds_it_records_no_source(monkeypatch):
    """A reward registered in a notebook or `python -c` has no source file: nothing is recorded, and
    scoring goes on."""
    import types

    import rewards.registry
    from rewards.combined import versioned

    monkeypatch.setattr(rewards.registry, "_REGISTERED", {})
    module = types.ModuleType("notebook_cell")  # no __file__
    exec("from rewards import Reward, RewardOutput\n"
         "class InCell(Reward):\n"
         "    def _score(self, images, prompts, metadata):\n"
         "        return RewardOutput([0.5] * len(images))\n", module.__dict__)
    monkeypatch.setitem(sys.modules, "notebook_cell", module)
    rewards.registry.register_reward("in_cell")(module.InCell)
    assert versioned("in_cell") == {}
