"""Offline (HF_HUB_OFFLINE), a scorer's model that the Hugging Face cache lacks stops `gors run`, `gors
evaluate` and benchmark validation before anything is generated; `Reward.models` names the models a
reward loads, checked against what it does load."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from gors.core.hub import ModelLoadError, check_cached
from rewards.combined import build_reward, reward_models
from rewards.registry import _BUILTIN


def test_every_reward_names_its_default_models():
    assert reward_models("b_vqa") == {"model_name_or_path": "Salesforce/blip-vqa-capfilt-large"}
    assert reward_models("grounded_sam") == {"model_name_or_path": "IDEA-Research/grounding-dino-base",
                                             "sam_model_name_or_path": "facebook/sam-vit-huge"}
    assert reward_models("spatial_3d")["depth_model_name_or_path"] == "Intel/dpt-hybrid-midas"  # an argument's default
    assert reward_models("toy_oracle") == {}  # rules, no model
    for name in _BUILTIN:  # every value a model name, under the option that sets it (an installed plugin's are its own)
        for option, model in reward_models(name).items():
            assert isinstance(model, str) and model, (name, option)
            assert option.rpartition(".")[2] in ("model_name_or_path", "clip_pretrained") or option.endswith(
                "_model_name_or_path"), (name, option)


def test_models_follow_the_options_that_choose_them():
    # TIT-Score loads its embedder or its LLM judge, never both.
    assert set(reward_models("tit_score")) == {"model_name_or_path", "embedding_model_name_or_path"}
    assert reward_models("tit_score", None, {"judge": "llm"})["judge_model_name_or_path"] == "Qwen/Qwen3-8B"
    assert "embedding_model_name_or_path" not in reward_models("tit_score", None, {"judge": "llm"})
    # GenEval: open_clip's weights come from the Hub repository of the tag, none for a local file or the
    # official detector (fetched from openmmlab, not the Hub).
    assert reward_models("geneval")["clip_pretrained"] == "timm/vit_large_patch14_clip_224.openai"
    assert reward_models("geneval", None, {"model_name_or_path": "official", "clip_pretrained": "/x/clip.pt"}) == {}
    # Members of composites and lists, keyed by member, their options applied.
    assert reward_models("three_in_one", None, {"b_vqa": {"model_name_or_path": "me/blip"}}) == {
        "b_vqa.model_name_or_path": "me/blip", "spatial_rule.model_name_or_path": "google/owlv2-base-patch16-ensemble",
        "clip_score.model_name_or_path": "openai/clip-vit-base-patch32"}
    assert reward_models("b_vqa:1,blip_clip:1", None, {"blip_clip": {"clip_model_name_or_path": "me/clip"}}) == {
        "b_vqa.model_name_or_path": "Salesforce/blip-vqa-capfilt-large",
        "blip_clip.model_name_or_path": "Salesforce/blip-image-captioning-large",
        "blip_clip.clip_model_name_or_path": "me/clip"}
    assert reward_models("b_vqa", "me/blip") == {"model_name_or_path": "me/blip"}  # --reward_model_name_or_path
    # A ready model passed in (Python) replaces the one its option would load.
    assert reward_models("spatial_3d", None, {"detector": object()}) == {
        "depth_model_name_or_path": "Intel/dpt-hybrid-midas"}
    assert reward_models("grounded_sam", None, {"segmenter": object()}) == {
        "model_name_or_path": "IDEA-Research/grounding-dino-base"}


def test_the_models_named_are_the_models_a_composite_reward_loads(tmp_path):
    from gors.testing.blip import build_tiny_blip_captioner
    from gors.testing.clip import build_tiny_clip
    from gors.testing.detection import build_tiny_grounding_dino
    from gors.testing.sam import build_tiny_sam

    options = {
        "grounded_sam": {"model_name_or_path": str(build_tiny_grounding_dino(tmp_path / "dino")),
                         "sam_model_name_or_path": str(build_tiny_sam(tmp_path / "sam"))},
        "grounded_detection": {"model_name_or_path": str(build_tiny_grounding_dino(tmp_path / "mm", mm=True))},
        "blip_clip": {"model_name_or_path": str(build_tiny_blip_captioner(tmp_path / "blip")),
                      "clip_model_name_or_path": str(build_tiny_clip(tmp_path / "clip"))},
    }
    reward = build_reward("unbiased_complex", options=options, device="cpu")
    named = reward_models("unbiased_complex", None, options)
    assert len(named) == 5 and set(named.values()) == set(reward.model_commits)


def test_an_uncached_model_is_refused_offline_only(hub_cache, monkeypatch):
    cache = hub_cache()
    with pytest.raises(ModelLoadError, match=r"^--x='org/model' is not in the local Hugging Face cache "
                                             r"\(.*hf-hub-cache\) and HF_HUB_OFFLINE=1 is set, so it cannot be "
                                             r"downloaded: on a machine with internet run `hf download org/model` "
                                             r"\(or `gors download` before the command"):
        check_cached("org/model", "--x")
    hub_cache("org/partial")
    shutil.rmtree(cache / "models--org--partial" / "snapshots")  # a ref without its files is no copy
    with pytest.raises(ModelLoadError, match="'org/partial' is not in the local"):
        check_cached("org/partial", "--x")
    hub_cache("org/model")
    check_cached("org/model", "--x")  # cached
    check_cached(str(cache), "--x")  # a local folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    check_cached("org/other", "--x")  # online: the loader downloads it


def test_gors_run_offline_stops_before_generating_when_the_rewards_model_is_not_cached(
        hub_cache, make_run_config, tiny_blip, tmp_path):
    from gors.core.run_folder import samples_dir
    from gors.run import check_run_inputs, run

    config = make_run_config(output_dir=str(tmp_path / "run"), reward="blip_clip", reward_model_name_or_path=None,
                             reward_options={"clip_model_name_or_path": "me/clip"})
    with pytest.raises(ModelLoadError, match=r"^--reward blip_clip: the default of --reward_model_name_or_path="
                                             r"'Salesforce/blip-image-captioning-large' is not in the local"):
        run(config)
    assert not samples_dir(config.output_dir).exists()  # nothing generated
    hub_cache("Salesforce/blip-image-captioning-large")
    with pytest.raises(ModelLoadError, match=r"^--reward blip_clip: --reward_options clip_model_name_or_path='me/clip' is not in"):
        check_run_inputs(config)  # the option's model is checked too
    hub_cache("me/clip")
    check_run_inputs(config)
    check_run_inputs(replace(config, reward="b_vqa", reward_options={},  # a local folder: nothing to look up
                             reward_model_name_or_path=str(tiny_blip)))


def test_gors_evaluate_and_validation_offline_stop_before_generating_when_a_scorer_is_not_cached(
        hub_cache, tmp_path, monkeypatch, make_run_config):
    from gors.config import EvaluateConfig
    from gors.core.toy import PRETRAINED_DIR
    from gors.evaluate import evaluate
    from gors.validation import validation_target

    shared = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
    monkeypatch.setenv("GORS_DATA_DIR", str(shared))
    config = EvaluateConfig(pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline"),
                            benchmarks="t2i_compbench:color", max_prompts=2, images_per_prompt=1,
                            output_dir=str(tmp_path / "eval"))
    with pytest.raises(ModelLoadError, match=r"^t2i_compbench:color's scorer 'b_vqa': the default of --scorer_options "
                                             r"model_name_or_path='Salesforce/blip-vqa-capfilt-large' is not in the local"):
        evaluate(config)
    assert not list(tmp_path.rglob("*.png"))
    run_config = make_run_config(validation_benchmark="t2i_compbench:color", validation_steps=1)
    with pytest.raises(ModelLoadError, match=r"'Salesforce/blip-vqa-capfilt-large' is not in the local"):
        validation_target(run_config)
    hub_cache("Salesforce/blip-vqa-capfilt-large")
    validation_target(run_config)
    # The main scorer's model cached, a column's not: stopped as early, naming the column.
    with pytest.raises(ModelLoadError, match=r"^t2i_compbench:color's B-CLIP scorer 'blip_clip': the default of "
                                             r"--scorer_options model_name_or_path='Salesforce/blip-image-captioning"):
        evaluate(config)
    assert not list(tmp_path.rglob("*.png"))
    # Cached but unreadable (an empty snapshot here): the load fails, named by the command's option.
    from evaluators import build_benchmark
    from gors.core.distributed import make_accelerator

    for flag in ("--scorer_options", "--validation_scorer_options"):
        with pytest.raises(ModelLoadError, match=rf"^the default of {flag} model_name_or_path="
                                                 r"'Salesforce/blip-vqa-capfilt-large' could not be loaded: "):
            build_benchmark("t2i_compbench", "color").make_scorer(make_accelerator(), flag=flag)
    # A column that takes the main scorer's model (GenEval 2's VQAScore its judge): the user's, not a default.
    with pytest.raises(ModelLoadError, match=r"^--scorer_options model_name_or_path='someone/judge' could not be "):
        build_benchmark("geneval2").make_scorer(make_accelerator(), column="vqascore",
                                                main_options={"model_name_or_path": "someone/judge"})


def test_a_rewards_data_file_that_cannot_be_fetched_stops_run_and_evaluate_before_generating(
        hub_cache, make_run_config, tmp_path, monkeypatch):
    import rewards.numeracy
    import rewards.three_in_one
    from gors.config import EvaluateConfig
    from gors.core.data import DownloadError
    from gors.core.run_folder import samples_dir
    from gors.core.toy import PRETRAINED_DIR
    from gors.evaluate import evaluate
    from gors.run import run

    def unreachable():
        raise DownloadError("the network is unreachable")

    # 3-in-1's prompt lists and numeracy's noun list, which they read when built: after generation.
    monkeypatch.setattr(rewards.three_in_one, "_official_subsplits", unreachable)
    monkeypatch.setattr(rewards.numeracy, "load_noun_list", unreachable)
    hub_cache(*reward_models("three_in_one").values(), *reward_models("numeracy").values())  # the models are there
    config = make_run_config(output_dir=str(tmp_path / "run"), reward="three_in_one", reward_model_name_or_path=None)
    with pytest.raises(DownloadError, match="unreachable"):
        run(config)
    assert not samples_dir(config.output_dir).exists()
    monkeypatch.setenv("GORS_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "benchmarks"))
    with pytest.raises(DownloadError, match="unreachable"):
        evaluate(EvaluateConfig(pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline"), max_prompts=2,
                                benchmarks="t2i_compbench:numeracy", images_per_prompt=1,
                                output_dir=str(tmp_path / "e"), columns="none"))
    assert not list(tmp_path.rglob("*.png"))


def test_a_rerun_with_every_image_scored_does_not_need_the_rewards_model_offline(hub_cache, make_run_config):
    """Training stopped after scoring, resumed where the reward's model is not cached (another node, a
    cleaned cache): scoring has nothing left to load, so the run is not refused for it."""
    from gors.core.run_folder import samples_dir
    from gors.core.store import SampleStore
    from gors.generate import generate
    from gors.run import check_run_inputs, run
    from gors.score import score
    from gors.testing.blip import build_tiny_blip_vqa

    cache = hub_cache("gors-test/tiny-blip")
    repo = cache / "models--gors-test--tiny-blip"
    build_tiny_blip_vqa(next((repo / "snapshots").iterdir()))
    config = make_run_config(reward_model_name_or_path="gors-test/tiny-blip")
    generate(config)
    score(config)
    shutil.rmtree(repo)
    run(config)  # selects and trains on the scores it has
    assert (Path(config.output_dir) / "pytorch_lora_weights.safetensors").is_file()
    more = replace(config, images_per_prompt=config.images_per_prompt + 1)  # new images: scoring loads the model
    with pytest.raises(ModelLoadError, match=r"^--reward b_vqa: --reward_model_name_or_path='gors-test/tiny-blip' "
                                             "is not in the local"):
        check_run_inputs(more)
    store = SampleStore(samples_dir(config.output_dir))
    store.image_path(store.records()[0]).unlink()  # a lost image is generated again, and scored again
    with pytest.raises(ModelLoadError, match="'gors-test/tiny-blip' is not in the local"):
        check_run_inputs(config)


def test_a_list_member_s_model_that_cannot_load_is_named_by_the_option_that_sets_it(monkeypatch):
    # A list refuses --reward_model_name_or_path, so a member's model is never that flag's.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    options = {"b_vqa": {"model_name_or_path": "gors-test/no-such-blip"}}
    with pytest.raises(ModelLoadError, match=r"^--reward_options b_vqa model_name_or_path='gors-test/no-such-blip' "
                                             r"could not be loaded: "):
        build_reward("b_vqa:0.5,toy_oracle:0.5", options=options, device="cpu")
    with pytest.raises(ModelLoadError, match=r"^--reward_model_name_or_path='gors-test/no-such-blip' could not be "
                                             r"loaded: "):  # alone, the flag names it
        build_reward("b_vqa", "gors-test/no-such-blip", device="cpu")
    # A model nobody named is called the default of its option: the user never typed that Hub id.
    with pytest.raises(ModelLoadError, match=r"^the default of --reward_options b_vqa model_name_or_path="
                                             r"'Salesforce/blip-vqa-capfilt-large' could not be loaded: "):
        build_reward("b_vqa:0.5,toy_oracle:0.5", device="cpu")


def test_a_reward_s_default_model_that_cannot_load_is_called_the_default_of_its_flag(make_run_config, tmp_path,
                                                                                      monkeypatch):
    from gors.core.distributed import make_accelerator
    from gors.score import reward_builder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = make_run_config(output_dir=str(tmp_path / "run"), reward_model_name_or_path=None)
    with pytest.raises(ModelLoadError, match=r"^the default of --reward_model_name_or_path="
                                             r"'Salesforce/blip-vqa-capfilt-large' could not be loaded: "):
        reward_builder(config, make_accelerator(), "b_vqa")()
    given = replace(config, reward_model_name_or_path="gors-test/no-such-blip")
    with pytest.raises(ModelLoadError, match=r"^--reward_model_name_or_path='gors-test/no-such-blip' could not be"):
        reward_builder(given, make_accelerator(), "b_vqa")()
    in_options = replace(config, reward_options={"model_name_or_path": "gors-test/no-such-blip"})
    with pytest.raises(ModelLoadError, match=r"^--reward_options model_name_or_path='gors-test/no-such-blip' could "):
        reward_builder(in_options, make_accelerator(), "b_vqa")()
