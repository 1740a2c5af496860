"""The toy category's defaults: toy prompt sets choose the toy reward and tau, as `--category toy` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from gors.cli import parse_config
from gors.config import SelectConfig
from gors.core.io import atomic_write_json, atomic_write_jsonl
from gors.core.prompts import TOY_CATEGORY, load_prompts
from gors.core.run_folder import reward_key
from gors.core.store import SampleStore, StoreError
from gors.select import scored_rewards, select, threshold_fn
from rewards.paper import TOY_THRESHOLDS, resolve_reward, selection_threshold, toy_threshold


def _select_config(folder: Path, *flags: str) -> SelectConfig:
    return parse_config(SelectConfig, ["--output_dir", str(folder), *flags])


def _toy_run(folder: Path, rewards: list[float], scored_with: str = "toy_oracle", category: str | None = "toy") -> None:
    """A run folder of toy:train samples, one image per prompt scored `rewards` by `scored_with`, by hand (no model).

    `category=None` is what a toy store recorded before toy prompt sets had a category."""
    store = SampleStore(folder / "samples")
    prompts = load_prompts("toy:train").prompts[: len(rewards)]
    store.save_prompts({"name": "toy:train", "category": category, "source": "test", "prompts": prompts})
    rows = []
    for index, (prompt, reward) in enumerate(zip(prompts, rewards)):
        record = {"file_name": f"{index:05d}_000.png", "prompt": prompt, "prompt_index": index, "image_index": 0}
        stored = store.append(0, Image.new("RGB", (8, 8)), record)
        rows.append({"prompt_index": index, "image_index": 0, "reward": reward,
                     "image_sha256": stored["image_sha256"]})
    scores = folder / "scores" / reward_key(scored_with)
    atomic_write_jsonl(scores / "part-00000.jsonl", rows)
    atomic_write_json(scores / "settings.json", {"reward": scored_with})


def test_toy_rewards_and_taus_come_from_one_table():
    assert resolve_reward(None, False, load_prompts("toy:train").category) == "toy_oracle"
    assert resolve_reward(None, True, load_prompts("toy:held_out").category) == "toy_classifier"
    assert TOY_THRESHOLDS == {"toy_oracle": 0.99, "toy_classifier": 0.9}  # the demo's taus, README's results
    assert selection_threshold(TOY_CATEGORY, "toy_oracle", 699) == toy_threshold("toy_oracle") == 0.99
    assert selection_threshold(TOY_CATEGORY, "toy_classifier", 0) == 0.9
    assert selection_threshold("color", "toy_classifier", 0) == 0.92  # a paper category's tau, whichever reward
    with pytest.raises(ValueError, match=r"No toy tau for reward 'b_vqa' \(the toy taus: toy_oracle 0.99, "
                                         r"toy_classifier 0.9\); pass --reward_threshold"):
        selection_threshold(TOY_CATEGORY, "b_vqa", 0)
    with pytest.raises(ValueError, match=r"No GORS threshold for category 'numeracy'; known categories: .*complex, toy"):
        selection_threshold("numeracy", "numeracy", 0)


@pytest.mark.parametrize("flags, reward, tau", [([], "toy_oracle", 0.99), (["--unbiased"], "toy_classifier", 0.9),
                                                (["--reward", "toy_classifier"], "toy_classifier", 0.9)])
def test_the_toy_category_has_a_tau_per_reward(tmp_path, flags, reward, tau):
    for config, prompt_set_category in ((_select_config(tmp_path, "--category", "toy", *flags), None),
                                        (_select_config(tmp_path, *flags), "toy")):
        threshold, source = threshold_fn(config, prompt_set_category)
        assert threshold(0) == threshold(699) == tau and source == f"toy world's tau for reward {reward!r}"


@pytest.mark.parametrize("category", ["toy", None])  # None: a toy store recorded before toy sets had a category
def test_select_on_toy_prompts_defaults_to_the_oracle_and_its_tau(tmp_path, category):
    _toy_run(tmp_path, [1.0, 0.98, 0.5], category=category)
    summary = select(_select_config(tmp_path))
    assert summary["reward"] == "toy_oracle" and summary["threshold"] == "toy world's tau for reward 'toy_oracle'"
    assert summary["num_selected"] == 1
    kept = [json.loads(line) for line in (tmp_path / "selection.jsonl").read_text().splitlines()]
    assert [(row["prompt_index"], row["threshold"]) for row in kept] == [(0, 0.99)]


def test_select_refuses_a_mistyped_reward_before_advising_to_score_with_it(tmp_path):
    _toy_run(tmp_path, [1.0])
    with pytest.raises(ValueError, match=r"Unknown reward 'toy_classifer' \(did you mean 'toy_classifier'\?\)\. Known "
                                         r"rewards: .*toy_classifier") as err:
        select(_select_config(tmp_path, "--reward", "toy_classifer"))
    assert "gors score" not in str(err.value)
    with pytest.raises(ValueError, match=r"Unknown reward 'toy_classifer'"):
        select(_select_config(tmp_path, "--reward", "toy_oracle:0.5,toy_classifer:0.5"))
    with pytest.raises(StoreError, match=r"Run `gors score --output_dir .* --reward toy_classifier` first\.$"):
        select(_select_config(tmp_path, "--reward", "toy_classifier"))  # a known reward not scored yet


def test_select_offers_a_weighted_reward_as_it_is_typed(tmp_path):
    weighted = "toy_oracle:0.5,toy_classifier:0.5"
    _toy_run(tmp_path, [1.0], scored_with=weighted)
    assert (tmp_path / "scores" / "toy_oracle_0.5_toy_classifier_0.5").is_dir()
    assert scored_rewards(tmp_path) == [weighted]
    with pytest.raises(StoreError, match=f"toy_oracle is the default reward; this folder has scores of {weighted}: "
                                         f"pass --reward {weighted}, or run `gors score"):
        select(_select_config(tmp_path))
    assert select(_select_config(tmp_path, "--reward", weighted, "--reward_threshold", "0.5"))["num_selected"] == 1


class _Stop(Exception):
    """Stops the toy recipe once its config is final, before any model runs."""


@pytest.mark.parametrize("flags, tau", [([], 0.99), (["--unbiased"], 0.9)])
def test_the_toy_recipe_selects_with_the_same_taus(tmp_path, monkeypatch, flags, tau):
    from gors.toy.demo import main as toy_main

    seen = []

    def stop(config):
        seen.append(config)
        raise _Stop

    # Both bindings, each restored afterwards: a module first imported under the patch would keep the stub.
    monkeypatch.setattr("gors.run.training_accelerator", stop)
    monkeypatch.setattr("gors.train.training_accelerator", stop)
    with pytest.raises(_Stop):
        toy_main(["--output_dir", str(tmp_path / "demo"), *flags])
    assert seen[0].reward_threshold == tau  # recorded as the run's tau, as before select knew the toy taus


def test_the_toy_recipe_refuses_a_mistyped_reward_as_unknown(tmp_path, capsys):
    from gors.toy.demo import main as toy_main

    with pytest.raises(SystemExit) as exit_info:
        toy_main(["--output_dir", str(tmp_path / "demo"), "--reward", "toy_oracl"])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Unknown reward 'toy_oracl'" in error and "--reward_threshold" not in error
    with pytest.raises(SystemExit):
        toy_main(["--output_dir", str(tmp_path / "demo"), "--reward", "b_vqa"])
    assert "No toy tau for reward 'b_vqa'" in capsys.readouterr().err
    assert not (tmp_path / "demo" / "eval_base").exists()


def test_toy_prompts_sample_as_the_toy_benchmark_on_a_stable_diffusion_model(tmp_path):
    from gors.config import GenerateConfig
    from gors.core.toy import PRETRAINED_DIR
    from gors.generate import generate

    config = GenerateConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline"),
                            train_prompts="toy:train", max_prompts=1, images_per_prompt=1)
    settings = json.loads((generate(config).root / "settings.json").read_text())
    assert (settings["num_inference_steps"], settings["guidance_scale"], settings["resolution"]) == (20, 4.0, 64)
    config = GenerateConfig(output_dir=str(tmp_path / "given"), pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline"),
                            train_prompts="toy:train", max_prompts=1, images_per_prompt=1, num_inference_steps=3)
    assert json.loads((generate(config).root / "settings.json").read_text())["num_inference_steps"] == 3  # given wins


def test_toy_prompts_on_a_model_of_another_family_sample_as_that_family(tmp_path, monkeypatch):
    """Toy prompts on a model that is not Stable Diffusion sample with its family's defaults, not the toy benchmark's."""
    import gors.generate
    from gors.config import GenerateConfig
    from gors.core.backbones import FAMILIES
    from gors.core.toy import PRETRAINED_DIR

    monkeypatch.setattr(gors.generate, "detect_backbone", lambda *args: FAMILIES["StableDiffusionXLPipeline"])
    protocols = []
    monkeypatch.setattr(gors.generate, "generate_samples", lambda store, prompts, protocol, *args, **kwargs:
                        protocols.append(protocol))
    config = GenerateConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline"),
                            train_prompts="toy:train", max_prompts=1, images_per_prompt=1)
    gors.generate.generate(config)
    assert [(p.num_inference_steps, p.guidance_scale, p.resolution) for p in protocols] == [(50, 5.0, 1024)]


def test_select_refuses_a_category_other_than_the_samples(tmp_path):
    _toy_run(tmp_path, [1.0, 0.98, 0.5])
    with pytest.raises(ValueError, match=r"^--category='spatial' \(given, or set by the recipe\), but the samples in "
                                         r".*samples are 'toy' prompts: spatial's tau would judge them"):  # on toy images
        select(_select_config(tmp_path, "--category", "spatial", "--reward", "toy_oracle"))
    assert not (tmp_path / "selection.jsonl").exists()
    assert select(_select_config(tmp_path, "--category", "toy"))["num_selected"] == 1  # their own: as without it
