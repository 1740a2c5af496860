"""The sample store and score folders under faults: mixed settings, failed rewards, short or torn
output, batch composition and file permissions (tiny models, one process)."""

import json
import logging
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from PIL import Image
from safetensors.torch import save_file

import gors
from gors.core import io
from gors.core.distributed import make_accelerator
from gors.core.io import append_jsonl, atomic_save_image, atomic_write_json, read_jsonl, set_usual_permissions
from gors.core.sampling import SamplingProtocol, generate_samples
from gors.core.scoring import RewardError, checked_scores, load_scores, score_samples
from gors.core.store import SETTINGS, SampleStore, StoreError
from gors.generate import generate
from gors.score import score
from gors.select import select
from gors.testing.sd import build_tiny_sd_pipeline
from gors.train import train
from gors.training_data import sharded_cache
from rewards import Reward, RewardOutput


def _pixels(store):
    return {(r["prompt_index"], r["image_index"]): np.asarray(store.open_image(r), dtype=int) for r in store.records()}


def _tear_last_line(path: Path) -> None:
    """Cut a file in the middle of its last line, as a kill during a write or a short copy would."""
    data = path.read_bytes().rstrip(b"\n")
    start = data.rfind(b"\n") + 1
    path.write_bytes(data[: (start + len(data)) // 2])


# ---- 3: one store, one set of generation settings ------------------------------------------------


def test_generate_records_its_settings_and_refuses_others(make_run_config, tiny_sd, tmp_path, monkeypatch):
    store = generate(make_run_config(max_prompts=2))
    settings = json.loads((store.root / SETTINGS).read_text())
    assert settings == {
        "model": str(tiny_sd), "revision": None, "lora": None, "lora_sha256": None, "scheduler": "DDIMScheduler",
        "dtype": "float32",
        "resolution": 32, "num_inference_steps": 2, "guidance_scale": 7.5, "seed": 0, "seed_rule": "sample_seed",
        "gors_version": gors.__version__,
    }
    # More images under another resolution and guidance: refused, each difference named, nothing written.
    with pytest.raises(StoreError, match=r"resolution: 32 -> 16.*only --images_per_prompt and --max_prompts") as error:
        generate(make_run_config(images_per_prompt=3, resolution=16, guidance_scale=5.0))
    assert "guidance_scale: 7.5 -> 5.0" in str(error.value) and "seed:" not in str(error.value)
    assert len(store.records()) == 4
    # The same settings may ask for more images and more prompts, with the model's folder spelled another way.
    monkeypatch.chdir(tiny_sd.parent)
    store = generate(make_run_config(images_per_prompt=3, pretrained_model_name_or_path=f"{tiny_sd.name}/"))
    assert len(store.records()) == 9 and json.loads((store.root / SETTINGS).read_text()) == settings
    # A store an earlier gors made takes this one's images: its version is recorded, not compared.
    (store.root / SETTINGS).write_text(json.dumps({**settings, "gors_version": "0.1.0"}))
    store = generate(make_run_config(images_per_prompt=3, max_prompts=3))
    assert json.loads((store.root / SETTINGS).read_text())["gors_version"] == gors.__version__
    # Fewer prompts than the store holds: the later stages would use them all, so it is refused.
    with pytest.raises(StoreError, match=r"holds samples of 3 prompts and 2 are asked for.*--max_prompts 3 or more, "
                                         r"with the --train_prompts that made this store\)"):
        generate(make_run_config(images_per_prompt=3, max_prompts=2))
    # Fewer images per prompt, likewise (an evaluation scores the first ones: tests/test_evaluate.py).
    with pytest.raises(StoreError, match=r"holds up to 3 images per prompt and --images_per_prompt=2 is asked for: the "
                                         r"later stages would use all of them. Ask for 3 or more"):
        generate(make_run_config(images_per_prompt=2, max_prompts=3))
    # The same files at another path (the model moved or copied) are the same model: the store takes the path.
    another = shutil.copytree(tiny_sd, tmp_path / "another_model")
    store = generate(make_run_config(images_per_prompt=3, pretrained_model_name_or_path=str(another)))
    assert len(store.records()) == 9 and json.loads((store.root / SETTINGS).read_text())["model"] == str(another)
    # Other files at another path are another model.
    other = tmp_path / "other_model"
    build_tiny_sd_pipeline(other, seed=1, resolution=32)
    with pytest.raises(StoreError, match=r"model: .*another_model\" -> \".*other_model\""):
        generate(make_run_config(images_per_prompt=3, pretrained_model_name_or_path=str(other)))


def test_a_store_from_before_settings_is_adopted_with_a_warning(make_run_config, caplog):
    store = generate(make_run_config())
    recorded = (store.root / SETTINGS).read_text()
    (store.root / SETTINGS).unlink()  # as an older gors left it
    with caplog.at_level(logging.WARNING):
        generate(make_run_config(images_per_prompt=3))
    assert "made before gors recorded generation settings" in caplog.text
    assert (store.root / SETTINGS).read_text() == recorded and len(store.records()) == 9


def _fake_pipeline(**kwargs):
    """Stands in for a pipeline: one grey image per prompt."""
    return SimpleNamespace(images=[Image.new("RGB", (8, 8), (128, 128, 128)) for _ in kwargs["prompt"]])


def test_benchmark_stores_record_the_model_and_lora_they_pass(tmp_path):
    accelerator = make_accelerator()
    store = SampleStore(tmp_path / "samples")
    protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8)

    def run(lora):
        info = {"benchmark": "toy", "model": "base", "lora": lora}
        generate_samples(store, ["a red circle"], protocol, lambda: _fake_pipeline, accelerator, prompt_info=info)

    run(None)
    assert json.loads((store.root / SETTINGS).read_text())["lora"] is None
    run(None)  # the same evaluation resumes
    with pytest.raises(StoreError, match=r"lora: null -> \"run/lora\""):
        run("run/lora")


def test_each_pipeline_call_takes_the_protocols_settings_and_each_images_seed_and_the_records_say_so(tmp_path):
    # What settings.json records must be what the pipeline was called with: the side (height and width), steps,
    # guidance, the family's extra arguments, and one CPU generator per image seeded by (prompt, image).
    from gors.core.store import sample_seed

    calls = []

    def pipeline(**kwargs):
        calls.append(kwargs)
        return _fake_pipeline(**kwargs)

    protocol = SamplingProtocol(images_per_prompt=2, num_inference_steps=3, guidance_scale=4.5, resolution=16,
                                batch_size=4, seed=7, call_kwargs={"max_sequence_length": 256})
    store = SampleStore(tmp_path / "samples")
    generate_samples(store, ["a cat", "a dog"], protocol, lambda: pipeline, make_accelerator())
    [call] = calls
    generators = call.pop("generator")
    assert call == {"prompt": ["a cat", "a cat", "a dog", "a dog"], "height": 16, "width": 16,
                    "num_inference_steps": 3, "guidance_scale": 4.5, "max_sequence_length": 256}
    seeds = [sample_seed(7, p, i) for p in range(2) for i in range(2)]
    assert seeds == [7, 8, 100_007, 100_008]
    assert [g.initial_seed() for g in generators] == seeds and {g.device.type for g in generators} == {"cpu"}
    assert [(r["prompt_index"], r["image_index"], r["seed"], r["num_inference_steps"], r["guidance_scale"],
             r["resolution"]) for r in store.records()] == [(p, i, seed, 3, 4.5, 16) for (p, i), seed in
                                                             zip([(0, 0), (0, 1), (1, 0), (1, 1)], seeds)]


def _lora_run(store, lora, protocol=None, pipeline=_fake_pipeline):
    """Generate one image of one prompt into `store` as a benchmark does with `lora` (a local file)."""
    from gors.core.pipeline import pipeline_settings

    protocol = protocol or SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5,
                                            resolution=8)
    generate_samples(store, ["a red circle"], protocol, lambda: pipeline, make_accelerator(),
                     settings=pipeline_settings("base", torch.float32, lora=lora and str(lora)))


def test_a_store_without_records_takes_corrected_settings(tmp_path):
    store = SampleStore(tmp_path / "samples")
    protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8)

    def interrupted(**kwargs):
        raise KeyboardInterrupt  # Ctrl-C before the first image: the settings are written, no record

    with pytest.raises(KeyboardInterrupt):
        _lora_run(store, None, protocol, interrupted)
    assert (store.root / SETTINGS).is_file() and not store.records()
    corrected = SamplingProtocol(images_per_prompt=1, num_inference_steps=3, guidance_scale=7.5, resolution=8)
    _lora_run(store, None, corrected)  # not refused: the empty store takes the new settings
    assert json.loads((store.root / SETTINGS).read_text())["num_inference_steps"] == 3
    assert len(store.records()) == 1
    with pytest.raises(StoreError, match="num_inference_steps: 3 -> 2"):  # with a record it is bound to them
        _lora_run(store, None, protocol)


def test_a_seed_torch_cannot_take_is_refused_before_anything_is_written(tmp_path):
    store = SampleStore(tmp_path / "samples")
    protocol = SamplingProtocol(images_per_prompt=2, num_inference_steps=2, guidance_scale=7.5, resolution=8,
                                seed=2**64 - 1)
    with pytest.raises(ValueError, match=r"--seed=18446744073709551615 gives image seeds .* pass a --seed in "
                                         r"\[-9223372036854775808, 18446744073709551614\]"):
        _lora_run(store, None, protocol)
    assert not store.root.exists()
    # Both ends of the range torch takes are seeds: the last image's seed may be 2**64 - 1, the first's -2**63.
    from gors.core.sampling import check_seed_range

    check_seed_range(replace(protocol, seed=2**64 - 2), 1)  # seeds 2**64 - 2 and 2**64 - 1
    check_seed_range(replace(protocol, seed=-(2**63)), 1)
    # The last prompt's seeds are the highest (100 000 apart per prompt): checked too, not only the first prompt's.
    check_seed_range(replace(protocol, seed=2**64 - 100_000), 1)
    with pytest.raises(ValueError, match=r"gives image seeds in \[18446744073709451616, 18446744073709551617\]"):
        check_seed_range(replace(protocol, seed=2**64 - 100_000), 2)
    with pytest.raises(ValueError, match=r"outside the \[-9223372036854775808, 18446744073709551615\]"):
        check_seed_range(replace(protocol, seed=-(2**63) - 1), 1)


def test_a_protocol_built_in_python_batches_and_seeds_as_gors_generate_does_by_default():
    """A `SamplingProtocol` made without a batch size or seed takes `gors generate`'s (42: the official GORS seed)."""
    from dataclasses import fields

    from gors.config import GenerateConfig

    defaults = {field.name: field.default for field in fields(GenerateConfig)}
    protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8)
    assert (protocol.batch_size, protocol.seed) == (defaults["generation_batch_size"], defaults["seed"]) == (8, 42)


def test_a_store_of_more_prompts_that_differ_from_those_asked_for_is_another_prompt_set(tmp_path):
    from gors.core.sampling import StoreFlags, _check_same_prompts

    # Three prompts held, two asked for, and prompt 0 differs: not "ask for 3 prompts" (that would mix two sets).
    store = SampleStore(tmp_path / "samples")
    for p, prompt in enumerate(["a cat", "a dog", "a cow"]):
        store.append(0, Image.new("RGB", (8, 8)), {"file_name": f"{p:05d}_000.png", "prompt": prompt,
                                                   "prompt_index": p, "image_index": 0})
    with pytest.raises(StoreError, match=r"holds samples of another prompt set \(prompt 0: 'a cat', now 'a bird'\)"):
        _check_same_prompts(store, store.records(), ["a bird", "a dog"], StoreFlags())
    with pytest.raises(StoreError, match=r"holds samples of 3 prompts and 2 are asked for"):
        _check_same_prompts(store, store.records(), ["a cat", "a dog"], StoreFlags())


def test_a_lora_retrained_at_the_same_path_is_other_settings(tmp_path, caplog):
    lora = tmp_path / "lora.safetensors"
    lora.write_bytes(b"first weights")
    store = SampleStore(tmp_path / "samples")
    _lora_run(store, lora)
    recorded = json.loads((store.root / SETTINGS).read_text())
    assert recorded["lora"] == str(lora) and len(recorded["lora_sha256"]) == 64
    _lora_run(store, lora)  # the same LoRA resumes
    lora.write_bytes(b"retrained weights")
    with pytest.raises(StoreError, match=r"lora_sha256: \"[0-9a-f]{64}\" -> \"[0-9a-f]{64}\""):
        _lora_run(store, lora)
    # A store from before the sha256 was recorded takes the current LoRA's, with a warning.
    del recorded["lora_sha256"]
    atomic_write_json(store.root / SETTINGS, recorded)
    with caplog.at_level(logging.WARNING):
        _lora_run(store, lora)
    assert "made before gors recorded lora_sha256" in caplog.text
    assert json.loads((store.root / SETTINGS).read_text())["lora_sha256"] is not None


def test_a_store_from_before_call_arguments_were_recorded_takes_the_current_ones_with_a_warning(tmp_path, caplog):
    # A family's extra pipeline-call arguments (PixArt's use_resolution_binning) are recorded since a later gors: an
    # older store lacks them and is taken to have been made with them, as a store without lora_sha256 is.
    protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8,
                                call_kwargs={"use_resolution_binning": False})
    store = SampleStore(tmp_path / "samples")
    _lora_run(store, None, protocol)
    recorded = json.loads((store.root / SETTINGS).read_text())
    assert recorded["call_kwargs"] == {"use_resolution_binning": False}
    del recorded["call_kwargs"]
    atomic_write_json(store.root / SETTINGS, recorded)
    with caplog.at_level(logging.WARNING):
        _lora_run(store, None, protocol)
    assert "made before gors recorded call_kwargs" in caplog.text
    assert json.loads((store.root / SETTINGS).read_text())["call_kwargs"] == {"use_resolution_binning": False}
    with pytest.raises(StoreError, match="call_kwargs: "):  # once recorded, they bind the store
        _lora_run(store, None, replace(protocol, call_kwargs={"use_resolution_binning": True}))


def test_a_lora_moved_or_copied_elsewhere_resumes_its_store_and_is_recorded_where_it_is_now(tmp_path):
    lora = tmp_path / "lora.safetensors"
    lora.write_bytes(b"weights")
    store = SampleStore(tmp_path / "samples")
    _lora_run(store, lora)
    moved = tmp_path / "elsewhere" / "lora.safetensors"
    moved.parent.mkdir()
    lora.rename(moved)
    _lora_run(store, moved)  # the same weights: not refused as another LoRA
    assert json.loads((store.root / SETTINGS).read_text())["lora"] == str(moved)
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"other weights")
    with pytest.raises(StoreError, match=r"lora: .*elsewhere/lora.safetensors\" -> .*other.safetensors\"; "
                                         r"lora_sha256: "):
        _lora_run(store, other)
    # A store from before the sha256 was recorded knows no weights: another path is another LoRA.
    recorded = json.loads((store.root / SETTINGS).read_text())
    del recorded["lora_sha256"]
    atomic_write_json(store.root / SETTINGS, recorded)
    with pytest.raises(StoreError, match=r"lora: .*elsewhere/lora.safetensors\" -> .*other.safetensors\""):
        _lora_run(store, other)


def test_a_lora_folder_is_hashed_by_its_weights_file(tmp_path, monkeypatch):
    from gors.core.pipeline import check_lora_path, lora_sha256

    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(FileNotFoundError, match="is not a LoRA folder"):
        check_lora_path(str(folder))
    (folder / "samples").mkdir()  # a run folder not trained yet: said so
    with pytest.raises(FileNotFoundError, match=r"is a run folder that holds no LoRA yet \(pytorch_lora_weights"
                                                r"\.safetensors\): its training has not finished \(`gors status "):
        check_lora_path(str(folder))
    (folder / "pytorch_lora_weights.safetensors").write_bytes(b"w")  # cut short
    with pytest.raises(ValueError, match=r"pytorch_lora_weights.safetensors is not a readable safetensors LoRA "
                                         r"\(.*cut short, or another format\); pass the folder or file a gors run wrote"):
        check_lora_path(str(folder))
    cut = tmp_path / "lora.safetensors"
    cut.write_bytes(b"{")
    with pytest.raises(ValueError, match="lora.safetensors is not a readable safetensors LoRA"):
        check_lora_path(str(cut))
    save_file({"unet.x.lora_A.weight": torch.zeros(1)}, str(folder / "pytorch_lora_weights.safetensors"))
    check_lora_path(str(folder))
    (folder / "other.txt").write_text("not part of the LoRA")
    assert lora_sha256(str(folder)) == lora_sha256(str(folder / "pytorch_lora_weights.safetensors"))
    assert lora_sha256(None) is None and lora_sha256("user/hub-lora") is None
    with pytest.raises(FileNotFoundError, match="no such file or folder") as missing:
        check_lora_path(str(tmp_path / "missing"))
    assert "Hub" not in str(missing.value)  # a path, not a Hub id: no download advice
    with pytest.raises(FileNotFoundError, match=r"--lora='user/hub-lora': no such file or folder; .*; "
                                                r"if user/hub-lora is a LoRA on the Hugging Face Hub, `gors evaluate --lora "
                                                r"hub:user/hub-lora` downloads it \(elsewhere pass a local copy: `hf "
                                                r"download user/hub-lora --local-dir DIR`\)"):
        check_lora_path("user/hub-lora")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # a mistyped run folder whose parent is here: no Hub advice
    with pytest.raises(FileNotFoundError, match="no such file or folder") as missing:
        check_lora_path("runs/gors_colr")
    assert "Hub" not in str(missing.value)


def test_generate_refuses_a_missing_lora_before_the_store_records_anything(make_run_config, tmp_path):
    """A --lora path that does not exist is named as such by generate, before any sample or setting is written."""
    config = make_run_config()
    missing = str(tmp_path / "no-such-lora")
    with pytest.raises(FileNotFoundError, match=r"--lora='.*no-such-lora': no such file or folder"):
        generate(config, lora=missing)
    assert not (Path(config.output_dir) / "samples").exists()


def test_generate_loads_the_lora_it_is_given_and_records_its_hash_and_relative_path(make_run_config, monkeypatch):
    """generate(config, lora=...) (an online round's) loads that LoRA and records its weights' hash and its path
    relative to output_dir (so the run folder resumes after a move)."""
    import gors.generate
    from gors.core.pipeline import lora_sha256

    config = make_run_config()
    lora = Path(config.output_dir) / "round-1"
    lora.mkdir(parents=True)
    save_file({"unet.x.lora_A.weight": torch.zeros(1, 1)}, str(lora / "pytorch_lora_weights.safetensors"))
    loaded = []

    def load_pipeline(*args, lora=None, **kwargs):
        loaded.append(lora)
        raise InterruptedError("stop before sampling")

    monkeypatch.setattr(gors.generate, "load_pipeline", load_pipeline)
    with pytest.raises(InterruptedError):
        generate(config, lora=str(lora))
    assert loaded == [str(lora)]
    settings = json.loads((Path(config.output_dir) / "samples" / SETTINGS).read_text())
    assert (settings["lora"], settings["lora_sha256"]) == ("round-1", lora_sha256(str(lora)))


def test_a_lora_of_another_base_model_is_one_line(tmp_path, tiny_sd, capsys, caplog):
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from gors.core.pipeline import load_lora
    from gors.core.toy import PRETRAINED_DIR

    toy = StableDiffusionPipeline.from_pretrained(str(PRETRAINED_DIR / "pipeline"))
    toy.unet.add_adapter(LoraConfig(r=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    layers = get_peft_model_state_dict(toy.unet)
    StableDiffusionPipeline.save_lora_weights(tmp_path / "lora", unet_lora_layers=layers)
    # A torch pickle is not read before loading: torch's size-mismatch error is cut to one line.
    StableDiffusionPipeline.save_lora_weights(tmp_path / "pickled", unet_lora_layers=layers, safe_serialization=False)
    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))  # same family, other widths
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"^LoRA .*lora does not fit .*tiny_sd.*: it has weights for unet\.down_blocks"
                                         r"\.0\.\S+, a layer this StableDiffusionPipeline does not have\. It was "
                                         r"trained on another base model; pass the model it was trained on$"):
        load_lora(pipeline, str(tmp_path / "lora"))
    with pytest.raises(ValueError, match=r"^LoRA .*pickled was trained on another base model \(.*lora_A.*\); pass "
                                         r"the model it was trained on$"):
        load_lora(pipeline, str(tmp_path / "pickled"))
    captured = capsys.readouterr()
    assert "size mismatch" not in captured.err + captured.out + caplog.text  # not diffusers' logged copy of torch's


# ---- 4: a reward that fails to build blocks nothing ----------------------------------------------


def test_a_reward_that_fails_to_build_does_not_block_its_folder(make_run_config):
    config = make_run_config()
    generate(config)
    with pytest.raises((TypeError, ValueError), match="foo"):
        score(make_run_config(reward_options={"foo": 1}))
    rows = score(config)  # refused before: "holds scores made with {... foo ...}"
    assert len(rows) == 6
    settings = json.loads((Path(config.output_dir) / "scores" / "b_vqa" / "settings.json").read_text())
    assert settings["options"] == {}


# ---- 6: one finite score and one details dict per image ------------------------------------------


class _ShortReward(Reward):
    def _score(self, images, prompts, metadata):
        return RewardOutput([0.5] * (len(images) - 1))


class _NaNReward(Reward):
    def _score(self, images, prompts, metadata):
        return RewardOutput([float("nan")] * len(images))


def test_reward_refuses_a_missing_or_non_finite_score():
    images = [Image.new("RGB", (8, 8))] * 2
    with pytest.raises(RuntimeError, match=r"_ShortReward returned 1 scores and 1 details for 2 images"):
        _ShortReward(device="cpu").score(images, ["a", "b"])
    with pytest.raises(RuntimeError, match=r"_NaNReward returned nan for image 0 \('a'\), not a finite number"):
        _NaNReward(device="cpu").score(images, ["a", "b"])


class _NoneReward(Reward):
    def _score(self, images, prompts, metadata):
        return RewardOutput([None] * len(images))


class _NumpyReward(Reward):
    """What a plug-in reward easily returns: numpy numbers, and an array in its details."""

    def __init__(self, details, **kwargs):
        super().__init__(**kwargs)
        self.details = details

    def _score(self, images, prompts, metadata):
        return RewardOutput([np.float32(0.25)] * len(images), [dict(self.details) for _ in images])


def test_reward_numbers_become_floats_and_details_must_be_json():
    images = [Image.new("RGB", (8, 8))] * 2
    out = _NumpyReward({"p": [0.5]}, device="cpu").score(images, ["a", "b"])
    assert out.scores == [0.25, 0.25] and all(type(v) is float for v in out.scores)
    json.dumps(out.scores)  # writable as a score row
    with pytest.raises(RuntimeError, match=r"_NumpyReward's details for image 0 cannot be written as JSON .*"
                                           r"array\.tolist\(\)"):
        _NumpyReward({"p": np.array([0.5])}, device="cpu").score(images, ["a", "b"])
    with pytest.raises(RuntimeError, match=r"_NoneReward returned None for image 0 \('a'\), not a number"):
        _NoneReward(device="cpu").score(images, ["a", "b"])


def test_checked_scores_refuse_a_score_out_of_range_a_missing_details_dict_or_details_of_another_type():
    """A reward's batch is refused when a score leaves [0, 1] beyond rounding or its details are too few or no dicts."""
    def check(scores, details):
        return checked_scores("Mine", SimpleNamespace(scores=scores, details=details), ["a", "b"])

    assert check([0.0, 1.0 + 1e-7], [{}, {}]) == [0.0, 1.0 + 1e-7]  # float rounding at the ends is no error
    for value in (1.001, 1.5, -0.001):
        with pytest.raises(RewardError, match=rf"Mine returned {value} for image 1 \('b'\), outside \[0.0, 1.0\]"):
            check([0.5, value], [{}, {}])
    with pytest.raises(RewardError, match=r"Mine returned 2 scores and 1 details for 2 images"):
        check([0.5, 0.5], [{}])
    with pytest.raises(RewardError, match=r"Mine returned details of type list for image 1 \('b'\)"):
        check([0.5, 0.5], [{}, ["not", "a", "dict"]])


class _Samples:
    """A minimal store: two prompts, one image each."""

    def records(self):
        return [{"prompt_index": p, "image_index": 0, "prompt": f"prompt {p}", "path": f"{p}.png"} for p in range(2)]

    def open_image(self, record):
        return Image.new("RGB", (8, 8))


def test_score_samples_refuses_a_scorer_that_returns_too_few_scores(tmp_path):
    accelerator = make_accelerator()
    short = SimpleNamespace(score=lambda images, prompts, metadata=None: RewardOutput([0.5]))
    with pytest.raises(RuntimeError, match=r"SimpleNamespace returned 1 scores and 1 details for 2 images"):
        score_samples(_Samples(), tmp_path, lambda: short, 2, accelerator)
    assert not list(tmp_path.glob("part-*.jsonl"))  # nothing of the batch was written
    full = SimpleNamespace(score=lambda images, prompts, metadata=None: RewardOutput([0.5] * len(images)))
    assert len(score_samples(_Samples(), tmp_path, lambda: full, 2, accelerator)) == 2


def test_scores_this_node_cannot_see_after_scoring_are_waited_for_then_refused(tmp_path, monkeypatch):
    """On several nodes each reads back every process's rows after the barrier; a network filesystem may
    show another node's rows late. Rows that appear within the wait are taken; rows that never do stop
    the stage with what to check, instead of a summary over fewer samples."""
    import gors.core.scoring
    from gors.core import distributed

    accelerator = make_accelerator()
    reward = SimpleNamespace(score=lambda images, prompts, metadata=None: RewardOutput([0.5] * len(images)))
    real = gors.core.scoring.read_score_rows
    reads = []

    def late(folder, records):  # the first read misses a row, as a node with a stale view would
        reads.append(1)
        rows = real(folder, records)
        return dict(list(rows.items())[1:]) if len(reads) == 1 else rows

    monkeypatch.setattr(gors.core.scoring, "read_score_rows", late)
    assert len(score_samples(_Samples(), tmp_path / "late", lambda: reward, 2, accelerator)) == 2 and len(reads) == 2

    monkeypatch.setattr(gors.core.scoring, "read_score_rows", lambda folder, records: {})
    monkeypatch.setattr(distributed, "SHARED_CHECK_WAIT_S", 0.0)
    with pytest.raises(StoreError, match=r"2 of 2 samples have no score in .* after scoring: every node must see one "
                                         r"run folder .* rerun the same command"):
        score_samples(_Samples(), tmp_path / "never", lambda: reward, 2, accelerator)


def test_images_this_node_cannot_see_after_generating_are_waited_for_then_refused(tmp_path, monkeypatch):
    """Under several processes each reads the store back after the barrier: images another node's view never shows
    stop the stage with what to check, instead of later stages working on fewer samples."""
    from gors.core import distributed

    class Hiding(SampleStore):
        hide = False  # set once the pipeline has run: the read-back after it misses the first image

        def records(self):
            return super().records()[1:] if self.hide else super().records()

    class OneOfTwoProcesses:  # the only process here, counted as one of two so that the read-back runs
        num_processes = 2

        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

    def pipeline(**kwargs):
        store.hide = True
        return _fake_pipeline(**kwargs)

    monkeypatch.setattr(distributed, "SHARED_CHECK_WAIT_S", 0.0)
    store = Hiding(tmp_path / "samples")
    protocol = SamplingProtocol(images_per_prompt=2, num_inference_steps=2, guidance_scale=7.5, resolution=8)
    with pytest.raises(StoreError, match=r"1 of the 2 images generated now are not visible in .* every node must see "
                                         r"one run folder"):
        generate_samples(store, ["a cat"], protocol, lambda: pipeline, OneOfTwoProcesses(make_accelerator()))
    store.hide = False  # visible: the same run resumes with nothing left to do
    generate_samples(store, ["a cat"], protocol, lambda: pipeline, OneOfTwoProcesses(make_accelerator()))
    assert len(store.records()) == 2


# ---- 7: a torn last line is reported and repaired ------------------------------------------------


def test_a_torn_line_is_reported_once_and_the_file_is_left_alone(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, [{"a": 1}, {"a": 2}])
    _tear_last_line(path)
    torn = path.read_bytes()
    with caplog.at_level(logging.WARNING):
        assert list(read_jsonl(path)) == [{"a": 1}]
        assert list(read_jsonl(path)) == [{"a": 1}]
    assert caplog.text.count(f"{path}:2 is incomplete") == 1 and "left out" in caplog.text
    assert path.read_bytes() == torn  # a reader never writes: a writer may still be appending


def test_generate_cuts_a_torn_record_and_generates_its_image_again(make_run_config, caplog):
    store = generate(make_run_config())
    before = _pixels(store)
    metadata = store.part_dir(0) / "metadata.jsonl"
    _tear_last_line(metadata)
    with caplog.at_level(logging.WARNING):
        assert len(store.records()) == 5
        assert "metadata.jsonl:6 is incomplete" in caplog.text
        generate(make_run_config())
    assert "cut its incomplete last line" in caplog.text
    assert metadata.read_bytes().endswith(b"\n") and len(metadata.read_bytes().splitlines()) == 6
    after = _pixels(store)
    assert sorted(after) == sorted(before)
    assert np.abs(after[(2, 1)] - before[(2, 1)]).max() <= 1  # generated again, in a batch of its own


def test_generate_repairs_every_part_before_sampling_even_one_no_process_appends_to_now(tmp_path, caplog):
    # A store resumed on fewer processes: part 1 (of an earlier second process) is never appended to, so only the
    # repair before sampling cuts its torn line; a record whose image file is gone is forgotten and generated again.
    two = SamplingProtocol(images_per_prompt=3, num_inference_steps=2, guidance_scale=7.5, resolution=8)
    store = SampleStore(tmp_path / "samples")
    _lora_run(store, None, replace(two, images_per_prompt=2))
    image = Image.new("RGB", (8, 8), (128, 128, 128))
    store.append(1, image, {"file_name": "00000_002.png", "prompt": "a red circle", "prompt_index": 0,
                            "image_index": 2})
    _tear_last_line(store.part_dir(1) / "metadata.jsonl")
    store.image_path(store.records()[0]).unlink()  # (0, 0): deleted as corrupt
    with caplog.at_level(logging.WARNING):
        _lora_run(store, None, two)
    assert "cut its incomplete last line" in caplog.text
    assert "1 records had no image file and will be generated again" in caplog.text
    assert (store.part_dir(1) / "metadata.jsonl").read_bytes() == b""
    records = store.records()
    assert [(r["prompt_index"], r["image_index"]) for r in records] == [(0, 0), (0, 1), (0, 2)]
    assert all(store.image_path(r).is_file() for r in records)


def test_score_cuts_a_torn_row_and_scores_its_sample_again(make_run_config, caplog):
    config = make_run_config()
    generate(config)
    rows = score(config)
    part = Path(config.output_dir) / "scores" / "b_vqa" / "part-00000.jsonl"
    _tear_last_line(part)
    with pytest.raises(StoreError, match="1 of 6 samples have no 'b_vqa' score"):
        select(config)
    with caplog.at_level(logging.WARNING):
        again = score(config)
    assert "cut its incomplete last line" in caplog.text
    assert len(part.read_text().splitlines()) == 6 and sorted(again) == sorted(rows)
    assert again[(2, 1)]["reward"] == pytest.approx(rows[(2, 1)]["reward"], abs=1e-4)  # scored alone now
    assert len(load_scores(config.output_dir, "b_vqa")) == 6


def test_a_sample_generated_again_loses_its_old_score_and_is_scored_again(make_run_config, caplog):
    config = make_run_config()
    store = generate(config)
    rows = score(config)
    old = next(r for r in store.records() if (r["prompt_index"], r["image_index"]) == (2, 1))
    size = store.open_image(old).size
    # Its file lost (deleted, or empty after a power cut), then made anew: the new image is another file.
    store.image_path(old).unlink()
    assert store.drop_records_without_image() == 1
    record = {k: v for k, v in old.items() if k not in ("path", "image_sha256")}
    new = store.append(0, Image.new("RGB", size, "black"), record)
    assert new["image_sha256"] != old["image_sha256"]
    with pytest.raises(StoreError, match="1 of 6 samples have no 'b_vqa' score"):
        select(config)  # the old image's score is not the new image's
    with caplog.at_level(logging.WARNING):
        again = score(config)
    assert "held 1 scores not of the samples' current image files" in caplog.text
    assert again[(2, 1)]["image_sha256"] == new["image_sha256"] != rows[(2, 1)]["image_sha256"]
    on_disk = list(read_jsonl(Path(config.output_dir) / "scores" / "b_vqa" / "part-00000.jsonl"))
    assert len(on_disk) == 6 and sum((row["prompt_index"], row["image_index"]) == (2, 1) for row in on_disk) == 1
    assert {key: row for key, row in again.items() if key != (2, 1)} == \
        {key: row for key, row in rows.items() if key != (2, 1)}  # the other scores are kept, not redone
    assert select(config)["num_samples"] == 6


def test_training_refuses_a_selection_made_before_an_image_was_generated_again(make_run_config):
    config = make_run_config(max_train_steps=1, report_to="none")
    store = generate(config)
    score(config)
    kept = select(config, write=True)
    assert kept["num_selected"] > 0
    first = json.loads((Path(config.output_dir) / "selection.jsonl").read_text().splitlines()[0])
    old = next(r for r in store.records() if r["path"] == first["path"])
    size = store.open_image(old).size
    store.image_path(old).unlink()
    store.drop_records_without_image()
    store.append(0, Image.new("RGB", size, "black"), {k: v for k, v in old.items() if k not in ("path", "image_sha256")})
    with pytest.raises(StoreError, match="is not the image this row was made from"):
        train(config)  # the stale selection would train the new image with the old one's reward


def test_a_sample_generated_again_with_the_same_pixels_keeps_its_score(make_run_config):
    config = make_run_config()
    store = generate(config)
    rows = score(config)
    old = next(r for r in store.records() if (r["prompt_index"], r["image_index"]) == (2, 1))
    image = store.open_image(old)
    store.image_path(old).unlink()
    store.drop_records_without_image()
    # Made again by another process (e.g. the rerun had more): same bytes, another part of the store.
    store.append(1, image, {k: v for k, v in old.items() if k not in ("path", "image_sha256")})
    again = score(config)  # the same bytes, the same hash: nothing to score again, the path follows the image
    assert again[(2, 1)]["path"] == "part-00001/00002_001.png" and store.image_path(again[(2, 1)]).is_file()
    assert again == rows | {(2, 1): rows[(2, 1)] | {"path": "part-00001/00002_001.png"}}


def test_select_reports_a_sample_whose_record_is_torn(make_run_config, caplog):
    config = make_run_config()
    store = generate(config)
    score(config)
    _tear_last_line(store.part_dir(0) / "metadata.jsonl")
    with caplog.at_level(logging.WARNING):
        summary = select(config)
    assert summary["num_samples"] == 5 and "metadata.jsonl:6 is incomplete" in caplog.text


# ---- 8: what an image depends on -----------------------------------------------------------------


def test_an_image_batched_alike_is_bit_identical(make_run_config, tmp_path):
    first = _pixels(generate(make_run_config(output_dir=str(tmp_path / "first"))))
    second = _pixels(generate(make_run_config(output_dir=str(tmp_path / "second"))))
    assert all(np.array_equal(first[key], second[key]) for key in first)
    # Another batch size changes an image by at most one 1/255 step per channel.
    third = _pixels(generate(make_run_config(output_dir=str(tmp_path / "third"), generation_batch_size=3)))
    assert max(np.abs(first[key] - third[key]).max() for key in first) <= 1


# ---- 10: the usual permissions -------------------------------------------------------------------


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    previous = os.umask(request.param)
    io._umask.cache_clear()
    yield request.param
    os.umask(previous)
    io._umask.cache_clear()


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_atomic_writes_respect_the_umask(tmp_path, umask):
    atomic_write_json(tmp_path / "a.json", {"a": 1})
    atomic_save_image(Image.new("RGB", (4, 4)), tmp_path / "a.png")
    append_jsonl(tmp_path / "a.jsonl", [{"a": 1}])
    for name in ("a.json", "a.png", "a.jsonl"):
        assert _mode(tmp_path / name) == 0o666 & ~umask, name
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    set_usual_permissions(folder)
    assert _mode(folder) == 0o777 & ~umask
    # Training's caches, which safetensors creates owner-only.
    cache = sharded_cache(tmp_path / "cache" / "latents.safetensors", 2,
                          lambda indices: {"value": torch.zeros(len(indices), 1)}, Accelerator(cpu=True), 2, "encode")
    assert len(cache["value"]) == 2 and _mode(tmp_path / "cache" / "latents.safetensors") == 0o666 & ~umask


def _flushes_and_renames(monkeypatch) -> list[tuple[str, int | str]]:
    """The `os.fsync` (with the file's size then) and `os.replace` (with the target's name) calls from now on."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.fstat(fd).st_size)) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda src, dst: events.append(("replace", Path(dst).name)) or
                        real_replace(src, dst))
    return events


def test_atomic_writes_and_appends_flush_their_data_to_disk_before_it_counts(tmp_path, monkeypatch):
    # A power cut must not leave a renamed-into-place file (or an appended record) whose bytes were still only in
    # the page cache: each is fsynced, whole, before the rename publishes it or the append returns.
    events = _flushes_and_renames(monkeypatch)
    atomic_write_json(tmp_path / "a.json", {"a": 1})
    size = (tmp_path / "a.json").stat().st_size
    assert events == [("fsync", size), ("replace", "a.json")]
    events.clear()
    append_jsonl(tmp_path / "a.jsonl", [{"a": 1}, {"a": 2}])
    assert events == [("fsync", (tmp_path / "a.jsonl").stat().st_size)]


def test_a_training_cache_is_flushed_to_disk_whole_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """The latent and text caches (read back by their header alone) are fsynced whole before the rename publishes them."""
    events = _flushes_and_renames(monkeypatch)
    path = tmp_path / "latents.safetensors"
    sharded_cache(path, 3, lambda indices: {"value": torch.ones(len(indices), 4)}, Accelerator(cpu=True), 2, "encode")
    assert events == [("fsync", path.stat().st_size), ("replace", path.name)]


def test_equal_mappings_are_written_as_the_same_bytes_whatever_their_key_order(tmp_path):
    # settings.json, models.json and the summaries are compared and hashed as files: two runs that record the same
    # settings, built in another order, must not write two different files.
    atomic_write_json(tmp_path / "a.json", {"model": "m", "dtype": "fp16", "options": {"b": 1, "a": 2}})
    atomic_write_json(tmp_path / "b.json", {"dtype": "fp16", "options": {"a": 2, "b": 1}, "model": "m"})
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


@pytest.mark.parametrize("umask", [0o022], indirect=True, ids=["umask022"])
def test_generated_samples_are_readable_by_others(make_run_config, umask):
    store = generate(make_run_config())
    for path in [store.root / "prompts.json", store.root / SETTINGS, store.part_dir(0) / "metadata.jsonl",
                 store.image_path(store.records()[0])]:
        assert _mode(path) == 0o644, path


def test_a_run_folder_at_any_stage_before_its_lora_is_said_to_be_unfinished(tmp_path):
    # Sampled, selected, or training (its lock taken, nothing else written yet): each is a run, not a wrong folder.
    from gors.core.pipeline import check_lora_path

    for marker in ("samples", "selection.jsonl", ".lock-train"):
        folder = tmp_path / marker.strip(".")
        folder.mkdir()
        (folder / marker).write_text("")
        with pytest.raises(FileNotFoundError, match="is a run folder that holds no LoRA yet"):
            check_lora_path(str(folder))


def test_a_lora_diffusion_checkpoint_saved_as_a_tuple_is_told_to_convert_too(tmp_path):
    # lora_diffusion saves its up/down weights as a sequence: a tuple is the same checkpoint as a list.
    from gors.core.pipeline import check_lora_path

    torch.save((torch.zeros(4, 1), torch.zeros(1, 4)), tmp_path / "lora_weight.pt")
    with pytest.raises(ValueError, match=r"is a lora_diffusion checkpoint .*Convert it first, `gors convert-lora"):
        check_lora_path(str(tmp_path / "lora_weight.pt"))


def test_torch_lora_files_pass_to_diffusers_and_other_files_are_refused(tmp_path):
    from gors.core.backbones import check_lora_fits
    from gors.core.pipeline import check_lora_path

    folder = tmp_path / "bin_only"
    folder.mkdir()
    torch.save({"unet.x.lora_A.weight": torch.zeros(1)}, folder / "pytorch_lora_weights.bin")
    check_lora_path(str(folder))  # diffusers reads its .bin
    check_lora_fits("unused/model", str(folder))  # not a safetensors file: nothing to read here, no Hub call
    for name in ("lora.bin", "lora.ckpt"):
        torch.save({"x": torch.zeros(1)}, tmp_path / name)
        check_lora_path(str(tmp_path / name))
        check_lora_fits("unused/model", str(tmp_path / name))
    # A model's own weights given as the LoRA: refused before any pipeline loads (diffusers would fail only then).
    save_file({"conv_in.bias": torch.zeros(1), "down_blocks.0.attn.to_q.weight": torch.zeros(1)},
              str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(ValueError, match=r"diffusion_pytorch_model.safetensors' holds no LoRA weights \(none of the 2 "
                                         r"tensors of .*e.g. 'conv_in.bias'.*a model's own weights\?"):
        check_lora_fits("unused/model", str(tmp_path / "diffusion_pytorch_model.safetensors"))
    (tmp_path / "notes.txt").write_text("a red circle\n")
    with pytest.raises(ValueError, match=r"notes.txt' is not a LoRA file: pass a .safetensors file \(or a torch "
                                         r"\.bin, \.pt, \.pth, \.ckpt file\)"):
        check_lora_path(str(tmp_path / "notes.txt"))
    # A lora_diffusion checkpoint (T2I-CompBench's GORS LoRAs: a list of tensors) is converted first.
    official = tmp_path / "official"
    official.mkdir()
    for name in ("lora_weight.pt", "lora_weight.text_encoder.pt"):
        torch.save([torch.zeros(4, 1), torch.zeros(1, 4)], official / name)
    for given in (official / "lora_weight.pt", official / "lora_weight.text_encoder.pt", official):
        with pytest.raises((ValueError, FileNotFoundError), match=rf"{given}' is a lora_diffusion checkpoint .*"
                                                                  rf"Convert it first, `gors convert-lora {given} OUT`"):
            check_lora_path(str(given))
    (tmp_path / "cut.pt").write_bytes(b"PK\x03")
    with pytest.raises(ValueError, match=r"torch.load cannot read .*cut.pt as tensors"):
        check_lora_path(str(tmp_path / "cut.pt"))
    torch.save(torch.zeros(2), tmp_path / "tensor.pt")
    with pytest.raises(ValueError, match=r"tensor.pt holds a Tensor, not a LoRA's state dict"):
        check_lora_path(str(tmp_path / "tensor.pt"))


def test_a_lora_for_a_pipeline_diffusers_loads_none_into_is_refused_before_loading(tmp_path):
    from dataclasses import replace

    from gors.core.backbones import FAMILIES, check_lora_loader

    pixart = replace(FAMILIES["StableDiffusionPipeline"], pipeline_class="PixArtSigmaPipeline")  # as detected
    with pytest.raises(ValueError, match=r"--lora='lora': a PixArtSigmaPipeline has no LoRA loader in diffusers "
                                         r"[\d.]+; evaluate it without --lora"):
        check_lora_loader(pixart, "lora")
    check_lora_loader(FAMILIES["StableDiffusionPipeline"], "lora")


@pytest.mark.parametrize("value", ["high", 5, -0.5, float("nan"), True])
def test_select_refuses_a_score_row_whose_reward_is_no_number_in_0_1(selected_run, tmp_path, value):
    from dataclasses import replace

    from gors.core.run_folder import scores_dir

    run = tmp_path / "run"
    for name in ("samples", "scores"):
        shutil.copytree(f"{selected_run.output_dir}/{name}", run / name)
    folder = scores_dir(run, "b_vqa")
    part = next(folder.glob("part-*.jsonl"))
    rows = list(read_jsonl(part))
    rows[0]["reward"] = value
    part.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(StoreError, match=rf"{folder} holds reward .* for {rows[0]['path']}; rewards are numbers in "
                                         r"\[0, 1\].*Delete that row \(\"prompt_index\": \d+, \"image_index\": \d+\) "
                                         r"from its part-\*.jsonl file there and run `gors score` again: it scores "
                                         r"that sample again"):
        select(replace(selected_run, output_dir=str(run)))
    assert not (run / "selection.jsonl").exists()


def test_training_refuses_an_emptied_selection_or_a_reward_that_is_no_loss_weight(tmp_path):
    from gors.select import load_selection

    path = tmp_path / "selection.jsonl"
    path.write_text("")
    with pytest.raises(StoreError, match=r"selection.jsonl holds no sample .*run `gors select --output_dir"):
        load_selection(tmp_path)
    path.write_text(json.dumps({"path": "p-0/a.png", "prompt": "p", "reward": "x"}) + "\n")
    with pytest.raises(StoreError, match=r"holds reward 'x' for p-0/a.png; rewards are numbers in \[0, 1\]"):
        load_selection(tmp_path)
    # Rows edited by hand: each needs its path and prompt, and is a JSON object.
    path.write_text(json.dumps({"path": "p-0/a.png", "reward": 0.5}) + "\n")
    with pytest.raises(StoreError, match=r"selection.jsonl:1 has no prompt text, which gors select writes in every "
                                         r"row: run `gors select"):
        load_selection(tmp_path)
    path.write_text(json.dumps({"path": "p-0/a.png", "prompt": "p", "reward": 0.5}) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"selection.jsonl:2 is '\[1, 2\]', not a JSON object as gors writes each "
                                         r"line; fix or delete that line"):
        load_selection(tmp_path)
    # A script that filtered the rows and left out the last line feed: the rows are whole, and read.
    path.write_text(json.dumps({"path": "p-0/a.png", "prompt": "p", "reward": 0.5}))
    assert load_selection(tmp_path) == [{"path": "p-0/a.png", "prompt": "p", "reward": 0.5}]
    path.write_text(json.dumps({"path": "p-0/a.png", "prompt": "p", "reward": 0.5})[:-3])
    with pytest.raises(StoreError, match=r"is cut short"):
        load_selection(tmp_path)
    path.write_text(json.dumps({"path": "p-0/a.png", "prompt": "p", "reward": 0.5}) + "\n")
    assert load_selection(tmp_path) == [{"path": "p-0/a.png", "prompt": "p", "reward": 0.5}]


def test_training_refuses_a_selection_that_lost_lines_since_select_wrote_it(tmp_path):
    from gors.select import load_selection

    rows = [{"path": f"p-{i}/a.png", "prompt": "p", "reward": 0.5} for i in range(3)]
    path = tmp_path / "selection.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows)[:-5])  # a copy cut short
    with pytest.raises(StoreError, match=r"selection.jsonl is cut short \(its last line is incomplete; gors select "
                                         r"writes it whole\): run `gors select --output_dir .*` again$"):
        load_selection(tmp_path)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows[:2]))  # cut at a line's end
    (tmp_path / "selection_summary.json").write_text(json.dumps({"num_selected": 3}))
    with pytest.raises(StoreError, match=r"selection.jsonl holds 2 samples, selection_summary.json says gors select "
                                         r"kept 3: the file lost lines since \(or gors select was stopped between "
                                         r"writing the two\); run `gors select"):
        load_selection(tmp_path)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows * 2))  # more: rows a rounds run replays
    assert len(load_selection(tmp_path)) == 6


def test_a_score_file_set_aside_beside_the_parts_is_not_read(tmp_path):
    from gors.core.scoring import read_score_rows

    record = {"prompt_index": 0, "image_index": 0, "path": "part-00000/00000_000.png", "image_sha256": "a" * 64}
    row = {"prompt_index": 0, "image_index": 0, "prompt": "p", "reward": 0.25, "image_sha256": "a" * 64}
    append_jsonl(tmp_path / "part-00000.jsonl", [row])
    append_jsonl(tmp_path / "part-00000.old.jsonl", [{**row, "reward": 1.0}])  # sorts after, so it would win
    append_jsonl(tmp_path / "part-00001 (copy).jsonl", [{**row, "reward": 1.0}])
    assert read_score_rows(tmp_path, [record])[(0, 0)]["reward"] == 0.25


def test_a_store_of_a_prompt_read_with_invisible_characters_by_an_older_gors_is_named_as_such(tmp_path):
    from gors.core.sampling import StoreFlags, _check_same_prompts

    store = SampleStore(tmp_path / "samples")
    append_jsonl(store.part_dir(0) / "metadata.jsonl", [{"file_name": "00000_000.png", "prompt": "a red circle\u200b",
                                                         "prompt_index": 0, "image_index": 0}])
    with pytest.raises(StoreError, match=r"holds samples of prompt 0 as an older gors read it, 'a red circle\\u200b', "
                                         r"with invisible characters at its ends that gors now strips"):
        _check_same_prompts(store, store.records(), ["a red circle"], StoreFlags())
    with pytest.raises(StoreError, match=r"holds samples of another prompt set"):
        _check_same_prompts(store, store.records(), ["a blue circle"], StoreFlags())


def test_a_metadata_or_score_row_edited_without_its_keys_is_named_with_its_file_and_row(tmp_path):
    from gors.core.scoring import read_score_rows

    store = SampleStore(tmp_path / "samples")
    metadata = store.part_dir(0) / "metadata.jsonl"
    append_jsonl(metadata, [{"file_name": "00000_000.png", "prompt": "p", "prompt_index": 0, "image_index": 0},
                            {"file_name": "00000_001.png", "prompt": "p", "image_index": 1}])
    with pytest.raises(ValueError, match=rf"^{metadata}, row 2: no integer prompt_index and image_index, which gors "
                                         r"writes in every row; fix or delete that line$"):
        store.records()
    metadata.write_text(json.dumps({"prompt": "p", "prompt_index": 0, "image_index": 0}) + "\n")
    with pytest.raises(ValueError, match=rf"^{metadata}, row 1: no file_name text"):
        store.records()
    # Present but no text (edited to null or a number) is as unusable as missing: the prompt is what scoring reads.
    metadata.write_text(json.dumps({"file_name": "00000_000.png", "prompt": None, "prompt_index": 0,
                                    "image_index": 0}) + "\n")
    with pytest.raises(ValueError, match=rf"^{metadata}, row 1: no prompt text"):
        store.records()
    scores = tmp_path / "scores"
    append_jsonl(scores / "part-00000.jsonl", [{"prompt_index": "x", "image_index": 0, "reward": 0.5}])
    with pytest.raises(ValueError, match=r"part-00000.jsonl, row 1: no integer prompt_index and image_index"):
        read_score_rows(scores, [])


def test_settings_and_model_files_holding_no_mapping_are_named_with_a_fix_that_keeps_the_work(tmp_path):
    from gors.core.scoring import check_settings
    from gors.core.store import recorded_model_commits

    store = SampleStore(tmp_path / "samples")
    store.root.mkdir()
    (store.root / SETTINGS).write_text("[1, 2]")
    with pytest.raises(StoreError, match=r"settings.json holds no settings mapping, which `gors generate` records: "
                                         r"restore the file, or delete it and run `gors generate` with the flags that "
                                         r"made the images"):
        store.load_settings()
    # A mapping without its prompt list (edited, or another tool's file) is refused as well, not a KeyError later.
    for info in ('{"name": "color_train"}', '{"prompts": "a cat"}'):
        (store.root / "prompts.json").write_text(info)
        with pytest.raises(StoreError, match=r"prompts.json holds no prompt list, which `gors generate` records"):
            store.load_prompts()
    (tmp_path / "scores").mkdir()
    (tmp_path / "scores" / "settings.json").write_text("[1, 2]")
    with pytest.raises(StoreError, match=r"holds no settings mapping, which gors writes there: restore the file, or "
                                         r"delete it and score again"):
        check_settings(tmp_path / "scores", {"reward": "b_vqa"}, True)
    (store.root / "models.json").write_text('"model"')
    with pytest.raises(StoreError, match=r"models.json holds no mapping of models to versions.*restore the file, or "
                                         r"delete it"):
        recorded_model_commits(store.root)


def test_a_store_whose_local_model_moved_records_it_at_its_new_path_only(tmp_path, monkeypatch):
    """Accepted at its new path (the same files), the model is checked there from then on: whatever is put at
    the old path later is not this run's model. A path recorded as typed (`~/m`) is found too."""
    from gors.core.fingerprints import local_fingerprint
    from gors.core.sampling import StoreFlags, _check_same_settings, _prepare_store
    from gors.core.store import MODELS, recorded_model_commits

    monkeypatch.setenv("HOME", str(tmp_path))
    model = tmp_path / "m"
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    store = SampleStore(tmp_path / "samples")
    append_jsonl(store.part_dir(0) / "metadata.jsonl", [{"file_name": "00000_000.png", "prompt": "p",
                                                         "prompt_index": 0, "image_index": 0}])
    protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8, seed=0)
    settings = {"model": "~/m", "revision": None}
    wanted = {**json.loads(json.dumps(protocol.settings())), "gors_version": gors.__version__, **settings}
    store.save_settings(wanted)
    store.save_prompts({"prompts": ["p"]})
    atomic_write_json(store.root / MODELS, {str(model): local_fingerprint(model)})
    moved = tmp_path / "disk2" / "m"
    moved.parent.mkdir()
    model.rename(moved)
    assert _check_same_settings(store, store.records(), {**wanted, "model": str(moved)}, StoreFlags()) == []  # not refused
    _prepare_store(store, ["p"], protocol, {**settings, "model": str(moved)}, None, make_accelerator(),
                   StoreFlags())
    assert recorded_model_commits(store.root) == {str(moved): local_fingerprint(moved)}
    assert json.loads((store.root / SETTINGS).read_text())["model"] == str(moved)
    # A run killed between the settings and models.json, or one that moved the model before any image: the
    # next run records the model at its path only all the same.
    atomic_write_json(store.root / MODELS, {"~/m": local_fingerprint(moved), "/elsewhere": "sha256:" + "0" * 64})
    _prepare_store(store, ["p"], protocol, {**settings, "model": str(moved)}, None, make_accelerator(),
                   StoreFlags())
    assert recorded_model_commits(store.root) == {"/elsewhere": "sha256:" + "0" * 64,
                                                  str(moved): local_fingerprint(moved)}


def test_a_reward_scoring_again_is_not_shown_its_own_earlier_scores(tmp_path):
    """The store keeps each reward's scores as a record column (`reward_<name>`), metadata for other rewards; a
    reward whose score folder was deleted to score again must not read its own stale values."""
    class Scored(_Samples):
        def records(self):
            return [{**record, "reward_mine": 0.9, "reward_other": 0.1} for record in super().records()]

    seen = []

    def score(images, prompts, metadata=None):
        seen.extend(metadata)
        return RewardOutput([0.5] * len(images))

    reward = SimpleNamespace(score=score)
    score_samples(Scored(), tmp_path, lambda: reward, 2, make_accelerator(), settings={"reward": "mine"})
    assert [sorted(key for key in m if key.startswith("reward_")) for m in seen] == [["reward_other"]] * 2
