"""`gors evaluate --lora hub:org/name`: a LoRA on the Hugging Face Hub, read through huggingface_hub from its cache.

Offline, as every test: the cache is laid out as `hf download` leaves it (`hub_cache`), so the real
`hf_hub_download` / `snapshot_download` resolve it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from two_processes import launch_gors

from gors.core.hub import ModelLoadError, is_hub_id
from gors.core.pipeline import lora_sha256
from gors.lora import LORA_WEIGHT_NAME
from gors.lora_sources import resolve_lora


def snapshot(cache: Path, repo_id: str) -> Path:
    return next((cache / ("models--" + repo_id.replace("/", "--")) / "snapshots").iterdir())


def test_only_the_hub_prefix_goes_to_the_hub(tiny_sd_lora):
    # gors' own run folders read like Hub ids: a relative folder missing here stays a local path.
    assert resolve_lora("runs/gors_color") == "runs/gors_color"
    assert resolve_lora(str(tiny_sd_lora)) == str(tiny_sd_lora)
    with pytest.raises(ValueError, match=r"^--lora='hub:mylora': after hub: give a Hugging Face Hub repository id"):
        resolve_lora("hub:mylora")
    assert is_hub_id("user/tiny-lora") and not any(is_hub_id(name) for name in (
        "mylora", "./user/lora", "/abs/lora", "a/b/c", "~/lora/x", "org/name@v1"))


def test_a_hub_lora_resolves_to_the_file_load_lora_weights_would_read(hub_cache, tiny_sd_lora, capsys):
    repos = ("user/tiny-lora", "user/one-file", "user/two-files", "user/no-lora")
    cache = hub_cache(*repos)
    shutil.copy(tiny_sd_lora, snapshot(cache, "user/tiny-lora") / LORA_WEIGHT_NAME)
    (snapshot(cache, "user/tiny-lora") / "pytorch_lora_weights.bin").write_bytes(b"another format, not read")
    resolved = resolve_lora("hub:user/tiny-lora")
    assert Path(resolved) == snapshot(cache, "user/tiny-lora") / LORA_WEIGHT_NAME  # the file, not what lies beside
    assert lora_sha256(resolved) == lora_sha256(str(tiny_sd_lora))
    assert (f"note: --lora hub:user/tiny-lora is read from the Hugging Face Hub: {LORA_WEIGHT_NAME} at commit "
            f"{snapshot(cache, 'user/tiny-lora').name}") in capsys.readouterr().out
    # Another name: the repository's one safetensors file, as diffusers picks it.
    shutil.copy(tiny_sd_lora, snapshot(cache, "user/one-file") / "my_lora.safetensors")
    shutil.copy(tiny_sd_lora, snapshot(cache, "user/one-file") / "optimizer.safetensors")  # no LoRA, as diffusers says
    assert resolve_lora("hub:user/one-file") == str(snapshot(cache, "user/one-file") / "my_lora.safetensors")
    for name in ("b.safetensors", "a.safetensors"):
        shutil.copy(tiny_sd_lora, snapshot(cache, "user/two-files") / name)
    with pytest.raises(ModelLoadError, match=r"^--lora='hub:user/two-files': the repository holds no "
                                             r"pytorch_lora_weights\.safetensors and several LoRA-like \.safetensors files "
                                             r"\(a\.safetensors, b\.safetensors\) at its top level: download the one "
                                             r"to use \(`hf download user/two-files FILE --local-dir DIR`\)"):
        resolve_lora("hub:user/two-files")
    # Offline, a cache that holds no top-level safetensors file says so (the repository may hold one); a LoRA in a
    # subfolder is not the one load_lora_weights reads.
    (snapshot(cache, "user/no-lora") / "sub").mkdir()
    shutil.copy(tiny_sd_lora, snapshot(cache, "user/no-lora") / "sub" / LORA_WEIGHT_NAME)
    with pytest.raises(ModelLoadError, match=r"^--lora='hub:user/no-lora': the local cache holds no "
                                             r"pytorch_lora_weights\.safetensors, no other LoRA \.safetensors file at its "
                                             r"top level and no pytorch_lora_weights\.bin\. HF_HUB_OFFLINE=1 is set, so only "
                                             r"the local cache is searched"):
        resolve_lora("hub:user/no-lora")
    # Not in the cache, offline: one line that says so and what to do.
    with pytest.raises(ModelLoadError, match=r"^--lora='hub:user/missing': the LoRA "
                                             r"could not be read from the Hugging Face Hub \(.*\)\. HF_HUB_OFFLINE=1 "
                                             r"is set, so only the local cache is searched"):
        resolve_lora("hub:user/missing")
    assert resolve_lora(str(tiny_sd_lora)) == str(tiny_sd_lora)  # a local path as given
    # A repository with a torch file only, as older diffusers saved LoRAs: that file, as diffusers falls back to it.
    torch.save(load_file(str(tiny_sd_lora)), snapshot(hub_cache("user/bin-lora"), "user/bin-lora") / "pytorch_lora_weights.bin")
    assert Path(resolve_lora("hub:user/bin-lora")).name == "pytorch_lora_weights.bin"


def test_the_prefix_settles_a_name_that_is_also_a_local_folder(hub_cache, tiny_sd_lora, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "color").mkdir(parents=True)  # a run folder of the same name here
    shutil.copy(tiny_sd_lora, snapshot(hub_cache("runs/color"), "runs/color") / LORA_WEIGHT_NAME)
    assert Path(resolve_lora("hub:runs/color")).name == LORA_WEIGHT_NAME  # the Hub's, not refused
    assert resolve_lora("runs/color") == "runs/color"


def test_gors_evaluate_scores_a_hub_lora_as_its_local_copy(hub_cache, tiny_sd_lora, tiny_sd, tmp_path, monkeypatch):
    from gors.config import EvaluateConfig
    from gors.evaluate import evaluate

    cache = hub_cache("user/tiny-lora")
    shutil.copy(tiny_sd_lora, snapshot(cache, "user/tiny-lora") / LORA_WEIGHT_NAME)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # the launched processes' huggingface_hub reads it at import
    flags = ["--pretrained_model_name_or_path", str(tiny_sd), "--benchmarks", "toy", "--max_prompts", "2",
             "--images_per_prompt", "1", "--num_inference_steps", "2", "--resolution", "32", "--columns", "none"]
    launched = launch_gors(["evaluate", *flags, "--lora", "hub:user/tiny-lora", "--output_dir", str(tmp_path / "two")],
                           cwd=tmp_path)
    assert launched.stdout.count("note: --lora hub:user/tiny-lora is read from the Hugging Face Hub") == 1
    images = {}
    for name, lora in (("hub", "hub:user/tiny-lora"), ("local", str(tiny_sd_lora.parent)), ("none", None)):
        config = EvaluateConfig(pretrained_model_name_or_path=str(tiny_sd), lora=lora, benchmarks="toy",
                                max_prompts=2, images_per_prompt=1, num_inference_steps=2, resolution=32,
                                output_dir=str(tmp_path / name), columns="none")
        evaluate(config)
        images[name] = [np.asarray(Image.open(path)) for path in
                        sorted((tmp_path / name / "toy" / "held_out" / "samples").rglob("*.png"))]
    images["two"] = [np.asarray(Image.open(path)) for path in
                     sorted((tmp_path / "two" / "toy" / "held_out" / "samples").rglob("*.png"))]
    assert len(images["hub"]) == 2 and len(images["two"]) == 2
    # Two processes, the same LoRA: batched otherwise, so within one 1/255 step (docs/run_folders.md).
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(images["hub"], images["two"]))
    assert all(np.array_equal(a, b) for a, b in zip(images["hub"], images["local"]))  # the same LoRA, applied
    assert not any(np.array_equal(a, b) for a, b in zip(images["hub"], images["none"]))
    assert json.loads((tmp_path / "hub" / "summary.json").read_text())["lora"] == "hub:user/tiny-lora"
    two = tmp_path / "two" / "toy" / "held_out"  # each process scored its share
    assert sorted(p.name for p in (two / "scores").glob("part-*.jsonl")) == ["part-00000.jsonl", "part-00001.jsonl"]
    settings = json.loads((tmp_path / "hub" / "toy" / "held_out" / "samples" / "settings.json").read_text())
    assert settings["lora_sha256"] == lora_sha256(str(tiny_sd_lora))


def test_a_hub_lora_of_another_family_is_refused_by_its_name(hub_cache, tiny_sd, tmp_path):
    from gors.config import EvaluateConfig
    from gors.evaluate import evaluate

    cache = hub_cache("user/flux-lora")
    save_file({"transformer.x.lora_A.weight": torch.zeros(1, 4)}, str(snapshot(cache, "user/flux-lora") / LORA_WEIGHT_NAME))
    config = EvaluateConfig(pretrained_model_name_or_path=str(tiny_sd), lora="hub:user/flux-lora", benchmarks="toy",
                            max_prompts=2, images_per_prompt=1, output_dir=str(tmp_path / "eval"))
    with pytest.raises(ValueError, match=r"^--lora='hub:user/flux-lora' has weights for transformer, but the "
                                         r"StableDiffusionPipeline"):
        evaluate(config)
    assert not (tmp_path / "eval").exists()  # refused before any work


def test_a_push_that_leaves_a_hub_loras_weights_keeps_the_folders_earlier_results(hub_cache, tiny_sd, tiny_sd_lora,
                                                                                    tmp_path):
    """A README edit moves the repository's main branch: the LoRA file is read at the new commit, another path
    with the same weights, whose earlier benchmarks stay in the evaluation folder's summary."""
    from gors.config import EvaluateConfig
    from gors.evaluate import evaluate

    cache = hub_cache("user/tiny-lora")
    shutil.copy(tiny_sd_lora, snapshot(cache, "user/tiny-lora") / LORA_WEIGHT_NAME)

    def evaluate_on(benchmarks: str) -> list[str]:
        evaluate(EvaluateConfig(pretrained_model_name_or_path=str(tiny_sd), lora="hub:user/tiny-lora",
                                benchmarks=benchmarks, max_prompts=2, images_per_prompt=1, num_inference_steps=2,
                                resolution=32, columns="none",
                                output_dir=str(tmp_path / "eval")))
        return [entry["label"] for entry in json.loads((tmp_path / "eval" / "summary.json").read_text())["summaries"]]

    assert evaluate_on("toy") == ["toy:held_out"]
    repository = cache / "models--user--tiny-lora"
    pushed = repository / "snapshots" / ("d" * 40)
    shutil.copytree(snapshot(cache, "user/tiny-lora"), pushed)
    (pushed / "README.md").write_text("a model card")
    (repository / "refs" / "main").write_text("d" * 40)
    assert evaluate_on("toy:train") == ["toy:held_out", "toy:train"]
    # Other weights at the next push: toy:train evaluated again (its old images set aside by hand, as a store of
    # another LoRA's is refused), toy:held_out's results are another LoRA's.
    (pushed / LORA_WEIGHT_NAME).unlink()
    save_file({key: value * 2 for key, value in load_file(str(tiny_sd_lora)).items()}, str(pushed / LORA_WEIGHT_NAME))
    shutil.rmtree(tmp_path / "eval" / "toy" / "train")
    assert evaluate_on("toy:train") == ["toy:train"]


def test_a_hub_loras_checkpoint_file_beside_it_is_no_lora(hub_cache):
    """As diffusers picks a repository's LoRA: a top-level `.safetensors` file named as a training checkpoint's
    (as a scheduler's or an optimizer's) is passed over, so the one LoRA file beside it is found."""
    from gors.core.hub import download_lora

    cache = hub_cache("user/with-checkpoint")
    (snapshot(cache, "user/with-checkpoint") / "my_lora.safetensors").write_bytes(b"lora")
    (snapshot(cache, "user/with-checkpoint") / "checkpoint-500.safetensors").write_bytes(b"state")
    assert download_lora("user/with-checkpoint", LORA_WEIGHT_NAME, "pytorch_lora_weights.bin") == str(
        snapshot(cache, "user/with-checkpoint") / "my_lora.safetensors")


def test_a_hub_lora_with_the_hub_out_of_reach_is_read_from_the_cache_only(hub_cache, monkeypatch):
    """The network down (not offline mode): the repository's other top-level LoRA file is looked for in the cache
    alone, since every download would be retried in vain; one not cached either fails on the network, its cause."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    from gors.core.hub import download_lora

    cache = hub_cache("user/one-file")
    (snapshot(cache, "user/one-file") / "my_lora.safetensors").write_bytes(b"lora")
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(*args, **kwargs):
        try:
            raise ConnectionError("Connection refused")
        except ConnectionError as cause:
            raise LocalEntryNotFoundError("cannot find the requested files in the local cache") from cause

    real_snapshot = huggingface_hub.snapshot_download
    calls = []

    def snapshot_download(*args, **kwargs):
        calls.append(kwargs.get("local_files_only"))
        if not kwargs.get("local_files_only"):
            raise AssertionError("the network was tried again")
        return real_snapshot(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert download_lora("user/one-file", LORA_WEIGHT_NAME, "pytorch_lora_weights.bin") == str(
        snapshot(cache, "user/one-file") / "my_lora.safetensors")
    with pytest.raises(ModelLoadError, match=r"^--lora='user/missing': the LoRA could not be read from the Hugging "
                                             r"Face Hub \(cannot find the requested files in the local cache\)\. The "
                                             r"Hugging Face Hub could not be reached \(ConnectionError\)"):
        download_lora("user/missing", LORA_WEIGHT_NAME, "pytorch_lora_weights.bin")
    assert calls == [True, True]


def test_a_hub_lora_at_a_revision_is_read_from_that_commits_snapshot(hub_cache):
    """A LoRA at a commit (every process reads the commit the main one resolved) is that snapshot's file, whichever
    way it is found: its weight file, its one other LoRA file or its torch file, not the main branch's."""
    from gors.core.hub import download_lora

    main = snapshot(hub_cache("user/two-commits"), "user/two-commits")
    older = main.parent / ("d" * 40)
    older.mkdir()
    for names in ([LORA_WEIGHT_NAME], ["my_lora.safetensors"], ["pytorch_lora_weights.bin"]):
        for folder in (main, older):
            for path in folder.iterdir():
                path.unlink()
            for name in names:
                (folder / name).write_bytes(b"lora")
        assert download_lora("user/two-commits", LORA_WEIGHT_NAME, "pytorch_lora_weights.bin",
                             revision=older.name) == str(older / names[0])
