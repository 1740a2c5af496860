"""`gors download COMMAND [flags]`: what each command loads, fetched so that it then runs offline.

The Hub is not reachable here: huggingface_hub stays offline for the whole session (conftest), and
the three calls that would reach it (`HfApi.list_repo_files`, `snapshot_download`,
`DiffusionPipeline.download`) are replaced by ones that record the request and leave the model in a
test cache as `hf download` would. gors' own pinned files come from ../shared (GORS_DATA_DIR).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from gors.cli import main
from gors.config import EvaluateConfig, RunConfig
from gors.core.hub import ModelLoadError
from gors.download import ModelNeed, download, download_model, pickles_with_safetensors, plan
from rewards.combined import check_models_cached, reward_models

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
pytestmark = pytest.mark.skipif(not (SHARED / "t2i_compbench").is_dir(), reason="needs ../shared/benchmarks")
SD2 = "stabilityai/stable-diffusion-2-base"


@pytest.fixture
def hub(hub_cache, monkeypatch, tiny_sd):
    """A Hub stand-in: the requests made, by kind; each request leaves its model in the test cache.
    `HF_HUB_OFFLINE=0` is seen by gors' check only; huggingface_hub itself stays offline."""
    import diffusers
    import huggingface_hub

    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))
    cache = hub_cache()
    # The SD 2 base id holds the tiny pipeline, so that its model_index.json is read from the cache.
    shutil.copytree(tiny_sd, next((hub_cache(SD2) / "models--stabilityai--stable-diffusion-2-base" / "snapshots")
                                  .iterdir()), dirs_exist_ok=True)
    requests: dict[str, list] = {"files": [], "snapshot": [], "pipeline": []}

    def list_repo_files(self, repo_id, revision=None, **kwargs):
        requests["files"].append(repo_id)
        return ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5"]

    def snapshot_download(repo_id, revision=None, ignore_patterns=None, **kwargs):
        requests["snapshot"].append((repo_id, tuple(ignore_patterns or ())))
        return str(hub_cache(repo_id))

    def pipeline_download(cls, name, **kwargs):
        requests["pipeline"].append((cls.__name__, name, kwargs))
        return str(hub_cache(name))

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(diffusers.DiffusionPipeline, "download", classmethod(pipeline_download))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    requests["cache"] = cache
    return requests


def test_a_run_fetches_its_pipeline_reward_and_validation_scorer_then_passes_offline(hub, monkeypatch, capsys):
    config = RunConfig(output_dir="unused", train_prompts="complex", validation_benchmark="t2i_compbench:color")
    fetched = download("run", config)

    expected_reward = reward_models("three_in_one")  # the complex category's metric
    assert fetched[0] == SD2 and set(fetched[1:]) == set(expected_reward.values()) | {
        "Salesforce/blip-vqa-capfilt-large"}  # the colour validation's B-VQA, once though 3-in-1 has it too
    assert len(fetched) == len(set(fetched))
    # The pipeline as it loads: without Stable Diffusion's safety checker.
    assert [(cls, name, kwargs.get("safety_checker", "x")) for cls, name, kwargs in hub["pipeline"]] == [
        ("StableDiffusionPipeline", SD2, None)]
    # Other repositories whole, but for formats no loader reads (and a pickle beside its safetensors twin).
    for _, ignore in hub["snapshot"]:
        assert "*.h5" in ignore and "pytorch_model.bin" in ignore and "config.json" not in ignore
    out = capsys.readouterr().out
    assert "[download] --reward three_in_one data" in out and "[download] t2i_compbench:color prompts" in out

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the compute node: every model is now found
    check_models_cached("three_in_one", None, {}, "--reward three_in_one")
    check_models_cached("b_vqa", None, {}, "validation")


def test_evaluate_fetches_every_scorer_and_column_and_each_command_only_what_it_loads(hub):
    config = EvaluateConfig(pretrained_model_name_or_path=SD2, benchmarks="t2i_compbench:spatial,geneval")
    models, files = plan("evaluate", config)
    names = {need.name for need in models}
    assert {SD2, "google/owlv2-base-patch16-ensemble", "facebook/mask2former-swin-small-coco-instance",
            "timm/vit_large_patch14_clip_224.openai"} <= names
    assert any(need.option.startswith("t2i_compbench:spatial CLIPScore") for need in models)  # a further column
    assert [d for d, _ in files] == ["t2i_compbench:spatial prompts", "geneval prompts"]  # scorers' data: planned
    with pytest.raises(FileNotFoundError, match=r"--lora='/no/such': no such file or folder"):  # it said "done"
        plan("evaluate", replace(config, lora="/no/such"))
    images = EvaluateConfig(images=str(hub["cache"]), benchmarks="geneval")
    assert SD2 not in {need.name for need in plan("evaluate", images)[0]}  # scoring a folder generates nothing

    generate, _ = plan("generate", RunConfig(output_dir="unused", train_prompts="color"))
    assert [need.name for need in generate] == [SD2]  # no reward
    score, _ = plan("score", RunConfig(output_dir="unused", reward="numeracy"))
    assert [need.name for need in score] == ["google/owlv2-base-patch16-ensemble"]  # no pipeline
    train, _ = plan("train", RunConfig(output_dir="unused"))
    assert [need.name for need in train] == [SD2]
    # Training with benchmark validation loads its scorer: fetched too, the pipeline first (as evaluate's).
    validated, files = plan("train", RunConfig(output_dir="unused", validation_benchmark="t2i_compbench:color"))
    assert [need.name for need in validated] == [SD2, "Salesforce/blip-vqa-capfilt-large"]
    assert files[0][0] == "t2i_compbench:color prompts"
    assert plan("evaluate", config)[0][0].name == SD2


def test_offline_or_another_command_is_refused_and_a_gated_model_says_what_to_do(hub, monkeypatch, capsys):
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="fetches from the Hub, but HF_HUB_OFFLINE=1 is set: unset it"):
        download("generate", RunConfig(output_dir="unused"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    class Response:
        status_code, headers, url, request = 403, {}, "https://huggingface.co/org/gated", None

    def gated(self, repo_id, **kwargs):
        raise GatedRepoError("403 gated", response=Response())

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", gated)
    with pytest.raises(ModelLoadError, match=r"--x='org/gated' is a gated repository: accept its license"):
        download_model(ModelNeed("--x", "org/gated"))

    with pytest.raises(SystemExit) as exit_info:
        main(["download", "select", "--output_dir", "x"])
    assert exit_info.value.code == 2
    assert "gors download: it downloads for run, generate, score, train, evaluate, not 'select'" in \
        capsys.readouterr().err
    main(["--help"])
    assert re.search(r"\n  download +fetch what `gors COMMAND \[flags\]` loads", capsys.readouterr().out)


def test_a_local_folder_that_is_not_there_is_refused_not_reported_as_done(hub, tmp_path, capsys):
    # Local folders are used as they are, not downloaded; one that is missing made the command fail only later.
    with pytest.raises(FileNotFoundError, match=r"--pretrained_model_name_or_path='\./typo_model': no such folder"):
        download("generate", RunConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path="./typo_model",
                                       train_prompts="toy:train"))
    with pytest.raises(FileNotFoundError, match=r"^--reward_model_name_or_path='/no/such/cls': no such folder"):
        download("score", RunConfig(output_dir=str(tmp_path / "run"), reward="b_vqa",
                                    reward_model_name_or_path="/no/such/cls"))
    assert "[download] done" not in capsys.readouterr().out
    assert hub["pipeline"] == [] and hub["snapshot"] == []


def test_the_command_line_takes_the_commands_own_flags(hub, capsys):
    main(["download", "score", "--output_dir", "unused", "--reward", "b_vqa:0.5,clip_score:0.5",
          "--reward_options", '{"clip_score": {"model_name_or_path": "me/clip"}}'])
    assert [name for name, _ in hub["snapshot"]] == ["Salesforce/blip-vqa-capfilt-large", "me/clip"]
    assert "[download] --reward b_vqa:0.5,clip_score:0.5 clip_score.model_name_or_path: me/clip" in \
        capsys.readouterr().out


def test_a_pickle_is_left_out_only_beside_its_own_safetensors():
    files = ["config.json", "model-00001-of-00002.safetensors", "pytorch_model-00001-of-00002.bin",
             "unet/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.bin",
             "open_clip_pytorch_model.bin", "open_clip_model.safetensors", "model.fp16.safetensors",
             "pytorch_model.bin", "training_args.pt", "pytorch_model.bin.index.json"]
    assert pickles_with_safetensors(files) == ["pytorch_model-00001-of-00002.bin", "unet/diffusion_pytorch_model.bin",
                                               "open_clip_pytorch_model.bin"]
    # An open_clip repository with only transformers' safetensors keeps the pickle open_clip reads.
    assert pickles_with_safetensors(["model.safetensors", "open_clip_pytorch_model.bin"]) == []


def test_score_takes_the_reward_of_the_folders_samples_and_a_flag_given_model_brings_its_files(
        hub, make_run_config, tmp_path, monkeypatch):
    import rewards.geneval
    from gors.config import ScoreConfig
    from gors.generate import generate

    config = make_run_config(output_dir=str(tmp_path / "run"), train_prompts="spatial", max_prompts=1,
                             images_per_prompt=1)
    generate(config)
    models, _ = plan("score", ScoreConfig(output_dir=config.output_dir))  # the spatial samples' metric
    assert [need.name for need in models] == ["google/owlv2-base-patch16-ensemble"]
    with pytest.raises(ValueError, match="holds no samples yet, so the reward `gors score` takes from their "
                                         "category is unknown; give --reward or --category"):
        plan("score", ScoreConfig(output_dir=str(tmp_path / "empty"), unbiased=True))

    converted = []
    monkeypatch.setattr(rewards.geneval, "official_detector_folder", lambda: converted.append(1))
    models, files = plan("score", ScoreConfig(output_dir=str(tmp_path / "empty"), reward="geneval",
                                              reward_model_name_or_path="official"))
    assert [need.name for need in models] == ["timm/vit_large_patch14_clip_224.openai"]  # no Hub detector
    for _, fetch in files:
        fetch()
    assert converted == [1]  # GenEval's own detector, fetched and converted


def test_pickles_with_a_safetensors_twin_are_left_out_and_each_revision_is_fetched(monkeypatch):
    """A pickle is left out where a safetensors twin is there (the same name, or `pytorch_model` read as `model`),
    kept where it is the only copy; one model at two revisions is fetched at each; offline, nothing is fetched."""
    import gors.download
    from gors.download import ModelNeed, download, pickles_with_safetensors

    files = ["pytorch_model-00001-of-00002.bin", "model-00001-of-00002.safetensors", "open_clip_pytorch_model.bin",
             "open_clip_model.safetensors", "unet/diffusion_pytorch_model.bin", "unet/diffusion_pytorch_model.safetensors",
             "only_copy.bin", "config.json"]
    assert pickles_with_safetensors(files) == ["pytorch_model-00001-of-00002.bin", "open_clip_pytorch_model.bin",
                                               "unet/diffusion_pytorch_model.bin"]
    needs = [ModelNeed("--a", "org/m", revision="v1"), ModelNeed("--b", "org/m", revision="v2"),
             ModelNeed("--c", "org/m", revision="v1")]
    monkeypatch.setattr(gors.download, "plan", lambda command, config: (needs, []))
    fetched = []
    monkeypatch.setattr(gors.download, "download_model", lambda need: fetched.append(need.revision) or "folder")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=1 is set: unset it"):
        download("generate", None)
    assert fetched == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert download("generate", None) == ["org/m", "org/m"] and fetched == ["v1", "v2"]


def test_train_fetches_its_pipeline_at_its_revision_and_a_load_error_is_passed_on_as_it_is(monkeypatch):
    """`gors download train --revision R` fetches the pipeline at R (what training loads); a `ModelLoadError`
    of a loader (already saying what to do) is raised as it is, not wrapped into a second one."""
    import gors.core.backbones
    from gors.config import TrainConfig

    config = TrainConfig(output_dir="unused", pretrained_model_name_or_path="org/model", revision="abc")
    models, _ = plan("train", config)
    assert models == [ModelNeed("--pretrained_model_name_or_path", "org/model", True, "abc")]

    def refused(name, revision=None):
        raise ModelLoadError("--pretrained_model_name_or_path='org/model' is a gated repository: accept its license")

    monkeypatch.setattr(gors.core.backbones, "detect_backbone", refused)
    with pytest.raises(ModelLoadError, match=r"^--pretrained_model_name_or_path='org/model' is a gated repository"):
        download_model(ModelNeed("--pretrained_model_name_or_path", "org/model", True))


def test_evaluate_fetches_its_pipeline_as_a_pipeline_an_images_folder_none_and_other_commands_are_refused(hub):
    config = EvaluateConfig(pretrained_model_name_or_path=SD2, benchmarks="geneval")
    assert plan("evaluate", config)[0][0] == ModelNeed("--pretrained_model_name_or_path", SD2, True)
    images = EvaluateConfig(images=str(hub["cache"]), benchmarks="geneval")
    assert all(not need.pipeline and need.option != "--pretrained_model_name_or_path"
               for need in plan("evaluate", images)[0])  # scoring a folder loads no pipeline
    with pytest.raises(ValueError, match="gors download select: it downloads for one of run, generate, score"):
        plan("select", None)


def test_each_download_is_of_the_revision_asked(hub, monkeypatch):
    """A pipeline and a whole repository are both listed and fetched at the need's revision, not the main branch."""
    import huggingface_hub

    import gors.core.backbones

    backbone = gors.core.backbones.detect_backbone(SD2, None)
    asked = []
    monkeypatch.setattr(gors.core.backbones, "detect_backbone", lambda name, revision=None: asked.append(revision)
                        or backbone)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files",
                        lambda self, repo_id, revision=None, **kwargs: asked.append(revision) or ["model.safetensors"])
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, revision=None, **kwargs: asked.append(revision) or "folder")
    download_model(ModelNeed("--a", "org/pipeline", True, "v1"))
    download_model(ModelNeed("--b", "org/model", revision="v2"))
    assert asked == ["v1", "v2", "v2"] and hub["pipeline"][0][2]["revision"] == "v1"


def test_a_local_folder_is_used_as_it_is_and_gors_own_files_are_fetched(hub, tiny_sd, capsys):
    """A local pipeline is neither downloaded nor reported as fetched; the prompt files gors fetches itself are."""
    import gors.download

    fetched = []
    config = RunConfig(output_dir="unused", pretrained_model_name_or_path=str(tiny_sd), train_prompts="toy:train")
    models, files = plan("generate", config)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gors.download, "plan", lambda command, config: (models, [("data", lambda: fetched.append(1))]))
        assert download("generate", config) == []
    assert hub["pipeline"] == [] and fetched == [1]
    assert "done: 0 model(s) and 1 file set(s)" in capsys.readouterr().out


def test_the_validation_scorers_options_choose_its_model_and_its_data(hub, monkeypatch):
    import rewards.combined

    asked = []
    monkeypatch.setattr(rewards.combined, "download_reward_files", lambda *args: asked.append(args))
    config = RunConfig(output_dir="unused", validation_benchmark="t2i_compbench:color",
                       validation_scorer_options={"model_name_or_path": "me/vqa"})
    models, files = plan("train", config)
    assert [need.name for need in models] == [SD2, "me/vqa"]
    for _, fetch in files[1:]:  # past the prompts: the scorer's data
        fetch()
    assert asked == [("b_vqa", None, {"model_name_or_path": "me/vqa"})]
