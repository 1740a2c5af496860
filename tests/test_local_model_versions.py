"""Local models in run folders: recorded by the fingerprint of their files, so that the images and scores
of a model retrained or overwritten at the same path are never mixed with the old one's."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

import gors.core.fingerprints as fingerprints
from gors.core.fingerprints import LOCAL_PREFIX, local_fingerprint
from gors.core.hub import cached_snapshot, model_version
from gors.core.store import MODELS, StoreError, check_model_commits, recorded_model_commits


def _model(folder: Path) -> Path:
    (folder / "unet").mkdir(parents=True)
    (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "U"]}')
    (folder / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"\x01" * 64)
    return folder


def _rewrite(file: Path, data: bytes) -> None:
    """Write `data` to `file` with a later modification time, as a training that saves again does."""
    before = file.stat().st_mtime_ns
    file.write_bytes(data)
    os.utime(file, ns=(before + 10**9, before + 10**9))


def test_a_local_fingerprint_follows_the_files_the_loader_reads_and_nothing_else(tmp_path):
    model = _model(tmp_path / "model")
    first = local_fingerprint(model)
    assert first.startswith(LOCAL_PREFIX) and len(first) == len(LOCAL_PREFIX) + 64
    assert local_fingerprint(str(model) + "/") == first  # however the path is spelled
    # Documents, pictures, hidden bookkeeping (huggingface_hub's .cache/), folders that are no component of
    # the pipeline (a run folder kept inside it: the run writes there), a dangling link, a symlink loop.
    (model / "README.md").write_text("# retrained")
    (model / "sample.png").write_bytes(b"png")
    for name in ("LICENSE", "notes.txt", "eval_results.json", "nohup.out"):  # beside a pipeline: no component
        (model / name).write_text("x")
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "download.lock").write_text("x")
    (model / "runs" / "color" / "samples").mkdir(parents=True)
    (model / "runs" / "color" / "samples" / "metadata.jsonl").write_text("{}\n")
    (model / "v1-old.ckpt").symlink_to(tmp_path / "gone.ckpt")
    (model / "unet" / "loop").symlink_to(model)
    assert local_fingerprint(model) == first
    # A copy with new modification times holds the same files.
    copy = tmp_path / "copy"
    shutil.copytree(model, copy, symlinks=True)
    assert local_fingerprint(copy) == first
    # Retrained weights (same size), a changed config, a renamed file: another model.
    _rewrite(model / "unet" / "diffusion_pytorch_model.safetensors", b"\x02" * 64)
    retrained = local_fingerprint(model)
    assert retrained not in (first, None)
    _rewrite(copy / "model_index.json", b'{"_class_name": "StableDiffusionXLPipeline", "unet": ["diffusers", "U"]}')
    assert local_fingerprint(copy) not in (first, retrained)
    (copy / "unet" / "diffusion_pytorch_model.safetensors").rename(copy / "unet" / "other.safetensors")
    assert local_fingerprint(copy) not in (first, retrained)
    # A single file (an open_clip checkpoint), whatever its name; a path that does not exist.
    weights = model / "unet" / "diffusion_pytorch_model.safetensors"
    shutil.copy(weights, tmp_path / "renamed.safetensors")
    assert local_fingerprint(weights) == local_fingerprint(tmp_path / "renamed.safetensors")
    assert local_fingerprint(weights).startswith(LOCAL_PREFIX) and local_fingerprint(weights) != retrained
    assert local_fingerprint(tmp_path / "absent") is None


def test_a_transformers_folder_counts_its_model_files_and_chat_templates(tmp_path):
    model = tmp_path / "vlm"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "chat_template.jinja"):
        (model / name).write_text(name)
    first = local_fingerprint(model)
    for name in ("LICENSE", "notes.txt", "README.md", "train.log"):
        (model / name).write_text("x")
    (model / "runs").mkdir()
    (model / "runs" / "config.json").write_text("{}")
    assert local_fingerprint(model) == first
    # transformers reads additional_chat_templates/ too: a template there may replace the folder's own.
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "default.jinja").write_text("{{ messages }}")
    with_template = local_fingerprint(model)
    assert with_template != first
    _rewrite(model / "vocab.txt", b"other")
    assert local_fingerprint(model) not in (first, with_template)


def test_a_fingerprint_is_hashed_again_only_when_a_file_was_written(tmp_path, monkeypatch):
    model = _model(tmp_path / "model")
    weights = model / "unet" / "diffusion_pytorch_model.safetensors"
    hashed: list[Path] = []
    original = fingerprints.hash_file_into
    monkeypatch.setattr(fingerprints, "hash_file_into", lambda digest, file: (hashed.append(file),
                                                                                 original(digest, file))[1])
    first = local_fingerprint(model)
    assert len(hashed) == 2
    fingerprints._computed.clear()  # another process: the fingerprint is kept under $GORS_CACHE_DIR
    assert local_fingerprint(model) == first and len(hashed) == 2
    # Other weights of the same size written with the old modification time kept (`cp -p`, `rsync -a`).
    stat = weights.stat()
    weights.write_bytes(b"\x03" * 64)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert local_fingerprint(model) != first and len(hashed) == 4
    # A cache that cannot be written costs hashing once per process, no error.
    monkeypatch.setenv("GORS_CACHE_DIR", str(tmp_path / "not-a-folder"))
    (tmp_path / "not-a-folder").write_text("a file")
    fingerprints._computed.clear()
    assert local_fingerprint(model) == local_fingerprint(model) and len(hashed) == 6


def test_model_version_is_a_commit_for_a_hub_id_and_a_fingerprint_for_a_local_path(tmp_path, monkeypatch):
    from huggingface_hub import constants

    refs = tmp_path / "hub" / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model = _model(tmp_path / "model")
    assert model_version("org/model") == "a" * 40
    assert model_version(str(model)) == local_fingerprint(model)
    assert model_version("org/absent") is None
    assert cached_snapshot("org/model", "a" * 40) is None  # the ref alone, no files
    (refs.parent / "snapshots" / ("a" * 40)).mkdir(parents=True)
    assert cached_snapshot("org/model", "a" * 40) == refs.parent / "snapshots" / ("a" * 40)


def test_a_folder_made_by_a_local_model_refuses_the_model_changed_in_place(tmp_path):
    model = _model(tmp_path / "model")
    folder = tmp_path / "scores"
    check_model_commits(folder, {str(model): model_version(str(model))}, False, "scores")
    check_model_commits(folder, {str(model) + "/": model_version(str(model))}, True, "scores")  # the same files
    assert recorded_model_commits(folder) == {str(model): local_fingerprint(model)}
    _rewrite(model / "unet" / "diffusion_pytorch_model.safetensors", b"\x04" * 64)
    with pytest.raises(StoreError, match=rf"the files of local model {model}/ changed since \(fingerprint sha256:.*"
                                         r"retrained or overwritten in place.*delete"):
        check_model_commits(folder, {str(model) + "/": model_version(str(model))}, True, "scores")
    # Before anything is scored, the folder takes the model as it is now.
    check_model_commits(folder, {str(model): model_version(str(model))}, False, "scores")
    assert recorded_model_commits(folder) == {str(model): local_fingerprint(model)}


def test_a_relative_model_path_that_names_another_folder_from_here_is_said_so(tmp_path, monkeypatch):
    _model(tmp_path / "a" / "model")
    second = _model(tmp_path / "b" / "model")
    _rewrite(second / "unet" / "diffusion_pytorch_model.safetensors", b"\x04" * 64)
    folder = tmp_path / "scores"
    monkeypatch.chdir(tmp_path / "a")
    check_model_commits(folder, {"model": model_version("model")}, False, "scores")
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(StoreError, match=rf"retrained or overwritten in place, or another folder than then: from here "
                                         rf"it is {second}"):
        check_model_commits(folder, {"model": model_version("model")}, True, "scores")


def test_a_folder_recorded_before_fingerprints_takes_the_current_files_with_a_warning(tmp_path, caplog):
    model = _model(tmp_path / "model")
    (tmp_path / MODELS).write_text(json.dumps({str(model): None}))  # gors 0.2 before fingerprints
    with caplog.at_level(logging.WARNING, logger="gors.core.store"):
        check_model_commits(tmp_path, {str(model): model_version(str(model))}, True, "images")
    assert "made before gors recorded local models' fingerprints" in caplog.text and str(model) in caplog.text
    assert recorded_model_commits(tmp_path) == {str(model): local_fingerprint(model)}


def test_generate_refuses_to_add_images_of_a_pipeline_retrained_at_the_same_path(make_run_config, tmp_path):
    """The real path: `gors generate` on a local tiny Stable Diffusion folder, saved again at the same path
    by another training (another seed here); a rerun asking for more images per prompt is refused before
    the pipeline loads, and the images of the first model are kept."""
    from gors.core.store import SampleStore
    from gors.generate import generate
    from gors.testing.sd import build_tiny_sd_pipeline

    model = tmp_path / "model"
    build_tiny_sd_pipeline(model, seed=0, resolution=32)
    store = generate(make_run_config(pretrained_model_name_or_path=str(model), images_per_prompt=1))
    assert recorded_model_commits(store.root) == {str(model): local_fingerprint(model)}
    build_tiny_sd_pipeline(model, seed=1, resolution=32)
    with pytest.raises(StoreError, match=f"holds images made with other versions of the models loaded now "
                                         rf"\(the files of local model {model} changed since"):
        generate(make_run_config(pretrained_model_name_or_path=str(model), images_per_prompt=2))
    assert len(SampleStore(store.root).records()) == 3  # one image per prompt, all of the first model


def test_score_refuses_to_add_scores_of_a_reward_model_overwritten_in_place(make_run_config, tmp_path, tiny_blip):
    from gors.generate import generate
    from gors.score import score
    from gors.testing.blip import build_tiny_blip_vqa

    blip = tmp_path / "blip"
    shutil.copytree(tiny_blip, blip)
    config = make_run_config(reward_model_name_or_path=str(blip), images_per_prompt=1, max_prompts=2)
    generate(config)
    score(config)
    scores = Path(config.output_dir) / "scores" / "b_vqa"
    assert recorded_model_commits(scores)[str(blip)] == local_fingerprint(blip)
    shutil.rmtree(blip)
    build_tiny_blip_vqa(blip, seed=1)
    more = make_run_config(reward_model_name_or_path=str(blip), images_per_prompt=1)
    generate(more)
    with pytest.raises(StoreError, match=f"holds scores made with other versions.*local model {blip} changed"):
        score(more)


def test_a_checkpoint_of_a_local_base_model_is_bound_to_its_files(tmp_path):
    """A LoRA goes on only on the weights it was trained on: a checkpoint's fingerprint records a local base
    model's files, and resuming after the base was retrained in place is refused (`gors train` sets such a
    checkpoint aside)."""
    from gors.checkpoints import check_resumable, training_fingerprint
    from gors.config import TrainConfig
    from gors.core.run_folder import CHECKPOINT_MARKER

    model = _model(tmp_path / "model")
    config = TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(model))
    before = training_fingerprint(config, [], 1, {})
    assert before["base_model_commit"] == local_fingerprint(model)
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / CHECKPOINT_MARKER).write_text(json.dumps({"fingerprint": before}))
    assert check_resumable(checkpoint, training_fingerprint(config, [], 1, {}), max_train_steps=4) == 2
    _rewrite(model / "unet" / "diffusion_pytorch_model.safetensors", b"\x05" * 64)
    with pytest.raises(ValueError, match="base_model_commit 'sha256:.*' in the checkpoint, 'sha256:.*' now"):
        check_resumable(checkpoint, training_fingerprint(config, [], 1, {}), max_train_steps=4)


def test_a_hub_id_that_now_names_a_local_folder_is_refused_as_such(tmp_path, monkeypatch):
    """`hf download org/model --local-dir org/model` beside a folder made from the Hub snapshot: the name now
    reads the local copy, whose files are not known to be the snapshot's."""
    (tmp_path / MODELS).write_text(json.dumps({"org/model": "a" * 40}))
    monkeypatch.chdir(tmp_path)
    _model(tmp_path / "org" / "model")
    with pytest.raises(StoreError, match=f"org/model named the Hub model at commit {'a' * 40}, and names a local "
                                         r"folder \(a folder at that path made or removed since\)"):
        check_model_commits(tmp_path, {"org/model": model_version("org/model")}, True, "scores")


def test_a_local_folder_that_now_names_a_hub_model_is_refused_as_such(tmp_path):
    from gors.core.store import describe_version_change

    assert describe_version_change("org/model", "sha256:" + "0" * 64, "b" * 40) == (
        f"org/model named a local folder, and names the Hub model at commit {'b' * 40} (a folder at that path made "
        "or removed since)")


def test_two_hub_models_of_unknown_commits_are_no_moved_local_model(tmp_path):
    """Neither is a local folder (no fingerprint, no cache entry: both versions unknown): nothing moved."""
    from gors.core.store import moved_local_model

    assert not moved_local_model("org/model", "org/other", {})
    model = _model(tmp_path / "model")
    shutil.copytree(model, tmp_path / "copy")
    assert moved_local_model(str(model), str(tmp_path / "copy"), {str(model): local_fingerprint(model)})


def test_training_refuses_samples_of_the_base_model_before_it_was_retrained_in_place(tmp_path, monkeypatch):
    """`gors train` (and `gors run` before generating) on a folder whose samples are all there: no generation
    to notice the change, so training checks the samples' recorded version of its base model itself."""
    import gors.train
    from gors.config import TrainConfig
    from gors.train import check_samples_model

    model = _model(tmp_path / "model")
    samples = tmp_path / "run" / "samples"
    samples.mkdir(parents=True)
    (samples / "settings.json").write_text(json.dumps({"model": str(model), "revision": None}))
    (samples / MODELS).write_text(json.dumps({str(model): local_fingerprint(model)}))
    config = TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(model) + "/")
    check_samples_model(config)
    _rewrite(model / "unet" / "diffusion_pytorch_model.safetensors", b"\x06" * 64)
    with pytest.raises(ValueError, match=r"the samples in .* were generated by another version of it \(the files of "
                                         r"local model .* changed since \(fingerprint sha256:.*retrained or "
                                         r"overwritten in place\).*Generate again with it as it is now, in a new "
                                         r"--output_dir\.$"):
        check_samples_model(config)
    # A Hub model updated since; `gors train --revision <the commit that generated them>` trains that version.
    (samples / "settings.json").write_text(json.dumps({"model": "org/model", "revision": None}))
    (samples / MODELS).write_text(json.dumps({"org/model": "a" * 40}))
    monkeypatch.setattr(gors.train, "model_version", lambda name, revision=None: revision or "b" * 40)
    hub = TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path="org/model")
    with pytest.raises(ValueError, match=f"org/model was at commit {'a' * 40}, now {'b' * 40}: updated on the Hub "
                                         rf"since.*Generate again.*pass --revision {'a' * 40} to train the version"):
        check_samples_model(hub)
    check_samples_model(TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path="org/model",
                                    revision="a" * 40))
    with pytest.raises(ValueError, match="were generated by 'org/model' \\(samples/settings.json\\)"):
        check_samples_model(TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path="org/model",
                                        revision="c" * 40))  # another revision than the one that generated them
    # Not in the cache when training starts: unknown then, compared once the model has loaded.
    monkeypatch.setattr(gors.train, "model_version", lambda name, revision=None: None)
    check_samples_model(hub)
    with pytest.raises(ValueError, match="updated on the Hub since"):
        check_samples_model(hub, loaded="b" * 40)
    check_samples_model(hub, loaded="a" * 40)


def test_online_rounds_refuse_a_base_model_changed_since_a_round_generated_before_any_round_runs(
        make_run_config, tmp_path):
    from gors.core.run_folder import round_dir
    from gors.run import check_run_inputs

    model = tmp_path / "model"
    shutil.copytree(make_run_config().pretrained_model_name_or_path, model)
    config = make_run_config(pretrained_model_name_or_path=str(model), rounds=2, steps_per_round=1)
    samples = round_dir(config.output_dir, 1) / "samples"  # round 1 stopped while generating
    samples.mkdir(parents=True)
    (samples / "settings.json").write_text(json.dumps({"model": str(model), "revision": None}))
    (samples / MODELS).write_text(json.dumps({str(model): local_fingerprint(model)}))
    check_run_inputs(config)
    _rewrite(model / "unet" / "diffusion_pytorch_model.safetensors", b"\x07" * 64)
    with pytest.raises(ValueError, match=f"the samples in {samples} were generated by another version of it"):
        check_run_inputs(config)


def test_training_takes_a_local_base_model_moved_or_copied_elsewhere_as_the_samples_model(tmp_path):
    from gors.config import TrainConfig
    from gors.train import check_samples_model

    model = _model(tmp_path / "model")
    samples = tmp_path / "run" / "samples"
    samples.mkdir(parents=True)
    (samples / "settings.json").write_text(json.dumps({"model": str(model), "revision": None}))
    (samples / MODELS).write_text(json.dumps({str(model): local_fingerprint(model)}))
    copy = tmp_path / "disk2" / "model"
    shutil.copytree(model, copy)
    shutil.rmtree(model)  # moved: the recorded path is gone
    check_samples_model(TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(copy)))
    other = _model(tmp_path / "other")
    _rewrite(other / "unet" / "diffusion_pytorch_model.safetensors", b"\x08" * 64)
    with pytest.raises(ValueError, match=r"the samples in .* were generated by '.*/model' \(samples/settings.json\); "
                                         r"training another base model on them"):
        check_samples_model(TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(other)))


def test_a_renamed_file_or_a_hidden_one_beside_the_model_files(tmp_path):
    """A model file renamed (contents unchanged) is another model: names are hashed with the contents; a hidden
    file (an editor's or a sync tool's `.config.json`) is no model file."""
    model = tmp_path / "vlm"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model / name).write_text(name)
    first = local_fingerprint(model)
    (model / ".config.json").write_text("{}")
    (model / ".model.safetensors.part").write_text("partial download")
    assert local_fingerprint(model) == first
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    assert local_fingerprint(model) != first


def test_weights_moved_to_another_component_or_unreadable_are_another_model(tmp_path, monkeypatch):
    """A pipeline's files count by their path in it (the same weights in `vae/` instead of `unet/` are another
    model); a file that cannot be read counts as such, not as an empty one; an upper-case suffix is a suffix."""
    index = '{"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "U"], "vae": ["diffusers", "V"]}'
    folders = {}
    for name, component in (("in_unet", "unet"), ("in_vae", "vae")):
        folders[name] = tmp_path / name
        (folders[name] / component).mkdir(parents=True)
        (folders[name] / "model_index.json").write_text(index)
        (folders[name] / component / "diffusion_pytorch_model.safetensors").write_bytes(b"\x01" * 64)
    assert local_fingerprint(folders["in_unet"]) != local_fingerprint(folders["in_vae"])
    readable, unreadable = tmp_path / "readable", tmp_path / "unreadable"
    for folder in (readable, unreadable):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"")
    original = fingerprints.hash_file_into

    def hash_file_into(digest, file):
        if file.parent == unreadable and file.name == "model.safetensors":
            raise PermissionError(13, "Permission denied", str(file))
        original(digest, file)

    monkeypatch.setattr(fingerprints, "hash_file_into", hash_file_into)
    assert local_fingerprint(unreadable) != local_fingerprint(readable)
    first = local_fingerprint(readable)
    (readable / "WEIGHTS.SAFETENSORS").write_bytes(b"\x02")
    assert local_fingerprint(readable) != first


def test_each_machine_keeps_its_own_fingerprint_of_a_path(tmp_path, monkeypatch):
    """Nodes that share a home but each hold their own copy of a model at one path keep one cache entry each,
    rather than replacing each other's (and hashing at every start)."""
    from gors.core.data import cache_root

    model = _model(tmp_path / "model")
    entries = cache_root() / fingerprints.FINGERPRINTS_DIR
    before = set(entries.glob("*.json")) if entries.is_dir() else set()
    for host in ("node-a", "node-b"):
        monkeypatch.setattr(fingerprints.socket, "gethostname", lambda host=host: host)
        fingerprints._computed.clear()  # another process, on another node
        local_fingerprint(model)
    kept = [json.loads(path.read_text()) for path in set(entries.glob("*.json")) - before]
    assert [entry["path"] for entry in kept] == [str(model.resolve())] * 2
