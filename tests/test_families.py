"""SDXL, SD3 and FLUX.1 train on what their diffusers pipelines condition on.

Each family's prompt encodings, FLUX's packed latents and guidance input, and SDXL's size conditions
are compared with the pipelines' own code; cached text encodings with live ones; and settings a
family cannot take are refused before any weights load. The tiny pipelines come from
tests/conftest.py; a selected run folder (generate, score, select at 32 px) is built once per
family in this module and copied by the tests that train on it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from diffusers import FluxPipeline
from PIL import Image
from torchvision import transforms
from transformers import T5EncoderModel

from gors.checkpoints import fingerprint_differences, training_fingerprint
from gors.config import RunConfig, TrainConfig
from gors.core.backbones import FAMILIES, FLUX_SCHNELL_SAMPLING, SamplingDefaults, detect_backbone
from gors.core.distributed import reset_process_state
from gors.core.io import atomic_write_jsonl
from gors.core.run_folder import SELECTION_FILE, TEXT_EMBEDDING_CACHE_DIR, samples_dir
from gors.core.store import SampleStore
from gors.families import Batch, resolve_training
from gors.families.base import FlowMatchingFamily, TrainingFamily
from gors.families.flux import FluxFamily, latent_image_ids, pack_latents, unpack_latents
from gors.generate import generate
from gors.lora import adapters_disabled
from gors.loss import diffusion_target
from gors.score import score
from gors.select import load_selection, select
from gors.train import GORSTrainer, train
from gors.training_data import crop_top_left

PROMPTS = ["a red circle and a blue square", "a green triangle"]
RESOLUTION = 32


@pytest.fixture(scope="module")
def selected_runs(tmp_path_factory, tiny_blip):
    """`selected(model)`: the RunConfig of a run folder of that model after generate, score and select,
    built on first use (read-only: copy it with `_copy_run`)."""
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a red circle and a blue square\na green triangle\na yellow circle\n")
    runs = {}

    def selected(model: Path) -> RunConfig:
        if model not in runs:
            config = RunConfig(
                output_dir=str(tmp_path_factory.mktemp("selected")), pretrained_model_name_or_path=str(model),
                train_prompts=str(prompts), images_per_prompt=2, num_inference_steps=2, resolution=RESOLUTION,
                reward="b_vqa", reward_model_name_or_path=str(tiny_blip), reward_threshold=0.0, seed=0,
            )
            generate(config)
            score(config)
            select(config)
            reset_process_state()
            runs[model] = config
        return runs[model]

    return selected


@pytest.fixture(scope="module")
def pipelines():
    """`pipeline(model)`: the model's diffusers pipeline, loaded once per module."""
    loaded = {}

    def pipeline(model: Path):
        if model not in loaded:
            backbone = detect_backbone(str(model))
            loaded[model] = getattr(diffusers, backbone.pipeline_class).from_pretrained(str(model))
        return loaded[model]

    return pipeline


def _copy_run(selected: RunConfig, destination: Path, **overrides) -> RunConfig:
    """A copy of a selected run's samples, scores and selection, and its config there (no trackers)."""
    destination.mkdir()
    for name in ("samples", "scores"):
        shutil.copytree(Path(selected.output_dir) / name, destination / name)
    shutil.copy(Path(selected.output_dir) / "selection.jsonl", destination)
    return replace(selected, output_dir=str(destination), report_to="none", **overrides)


def _prepared_trainer(config: RunConfig) -> GORSTrainer:
    """A trainer with its models set up and its data (latents, tokens, cached encodings) loaded."""
    trainer = GORSTrainer(config)
    trainer.selection = load_selection(config.output_dir)
    trainer._setup_models()
    trainer._load_data()
    return trainer


def _family(model: Path, **overrides):
    """(resolved config, family) of a TrainConfig for `model` at 32 px (unless overridden)."""
    config = TrainConfig(pretrained_model_name_or_path=str(model), **{"resolution": RESOLUTION} | overrides)
    return resolve_training(config, detect_backbone(str(model)))


@torch.no_grad()
def _encodings(family: TrainingFamily, prompts: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Every text encoder's outputs for `prompts`, one encoder at a time, as the trainer computes them."""
    encodings = {}
    for encoder in family.text_encoders:
        ids = family.tokenize(encoder, family.load(encoder.tokenizer), prompts)
        encodings[encoder.component] = family.encode(encoder, family.load(encoder.component), ids)
    return encodings


def _batch(size: int, original_size=(RESOLUTION, RESOLUTION), crop=(0, 0), channels: int = 16) -> Batch:
    """A batch of zero latents (32 px through a VAE of factor 2) with these size conditions."""
    side = RESOLUTION // 2
    return Batch(torch.zeros(size, channels, side, side), torch.ones(size),
                 torch.tensor([original_size] * size), torch.tensor([crop] * size))


@pytest.fixture
def no_weights(monkeypatch):
    """Make any load of a model component fail the test."""
    def refuse(self, component, *args, **kwargs):
        raise AssertionError(f"{component} was loaded before the settings were checked")

    monkeypatch.setattr(TrainingFamily, "load", refuse)
    monkeypatch.setattr(TrainingFamily, "load_scheduler", lambda self: refuse(self, "scheduler"))


@pytest.fixture
def loaded_components(monkeypatch):
    """The components the families load, in order (tokenizers, encoders, denoiser, VAE)."""
    loaded = []
    original = TrainingFamily.load

    def recording(self, component, *args, **kwargs):
        loaded.append(component)
        return original(self, component, *args, **kwargs)

    monkeypatch.setattr(TrainingFamily, "load", recording)
    return loaded


# ---- prompt encodings and conditions, against the pipelines' own code ------------------------------


def _pipeline_encoding(name: str, pipeline) -> dict[str, torch.Tensor]:
    """`encode_prompt` of the family's pipeline on PROMPTS (no guidance), by the denoiser's argument names."""
    if name == "sdxl":
        hidden, _, pooled, _ = pipeline.encode_prompt(PROMPTS, device="cpu", do_classifier_free_guidance=False)
        return {"encoder_hidden_states": hidden, "text_embeds": pooled}
    if name == "sd3":
        hidden, _, pooled, _ = pipeline.encode_prompt(PROMPTS, None, None, device="cpu",
                                                      do_classifier_free_guidance=False, max_sequence_length=256)
        return {"encoder_hidden_states": hidden, "pooled_projections": pooled}
    hidden, pooled, text_ids = pipeline.encode_prompt(PROMPTS, None, device="cpu", max_sequence_length=512)
    return {"encoder_hidden_states": hidden, "pooled_projections": pooled, "txt_ids": text_ids}


@pytest.mark.parametrize("name, text_shape", [
    ("sdxl", (2, 77, 32 + 64)),  # CLIP-L and bigG penultimate states side by side
    ("sd3", (2, 77 + 256, 128)),  # CLIP states padded to T5's width, then 256 T5 tokens
    ("flux", (2, 512, 128)),  # 512 T5 tokens
])
def test_family_encodings_equal_the_pipelines_encode_prompt(name, text_shape, request, pipelines):
    model = request.getfixturevalue(f"tiny_{name}")
    _, family = _family(model)
    conditioning = family.condition(_encodings(family, PROMPTS), _batch(len(PROMPTS)), torch.float32)
    with torch.no_grad():
        expected = _pipeline_encoding(name, pipelines(model))
    assert conditioning["encoder_hidden_states"].shape == text_shape
    for key, value in expected.items():
        assert conditioning[key].shape == value.shape, key
        assert torch.allclose(conditioning[key], value, rtol=0, atol=1e-6), key


def test_validation_decodes_an_sdxl_vae_in_float32_under_fp16_autocast_as_its_pipeline_upcasts(tiny_sdxl, tiny_sd):
    from gors.train import decode_in_float32_as_the_pipeline_would

    def decoder_dtype(pipeline) -> torch.dtype:
        seen = []
        hook = pipeline.vae.decoder.conv_out.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
        latents = torch.randn(1, pipeline.vae.config.latent_channels, 4, 4, dtype=torch.float16)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            pipeline.vae.decode(latents)
        hook.remove()
        return seen[0]

    sdxl = diffusers.StableDiffusionXLPipeline.from_pretrained(str(tiny_sdxl))  # the trainer's VAE: float32
    assert sdxl.vae.config.force_upcast and decoder_dtype(sdxl) == torch.float16  # what autocast alone does
    decode_in_float32_as_the_pipeline_would(sdxl, torch.bfloat16)  # bf16 does not overflow: left as it is
    assert decoder_dtype(sdxl) == torch.float16
    for _ in range(2):  # each validation builds a pipeline over the same VAE
        decode_in_float32_as_the_pipeline_would(sdxl, torch.float16)
        assert decoder_dtype(sdxl) == torch.float32
    # SD 1/2 pipelines decode in the pipeline's dtype, as `gors evaluate` does: unchanged.
    sd = diffusers.StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    decode_in_float32_as_the_pipeline_would(sd, torch.float16)
    assert decoder_dtype(sd) == torch.float16


def test_sdxl_time_ids_equal_the_pipelines(tiny_sdxl, pipelines):
    _, family = _family(tiny_sdxl)
    pipeline = pipelines(tiny_sdxl)
    encodings = {"text_encoder": {"hidden": torch.zeros(2, 77, 32)},
                 "text_encoder_2": {"hidden": torch.zeros(2, 77, 64), "pooled": torch.zeros(2, 64)}}
    for original_size, crop in [((40, 56), (0, 6)), ((72, 40), (12, 0)), ((32, 32), (0, 0))]:
        batch = _batch(2, original_size, crop, channels=4)
        time_ids = family.condition(encodings, batch, torch.float32)["time_ids"]
        expected = pipeline._get_add_time_ids(original_size, crop, (RESOLUTION, RESOLUTION), torch.float32,
                                              text_encoder_projection_dim=pipeline.text_encoder_2.config.projection_dim)
        assert torch.equal(time_ids, expected.expand(2, 6))


def test_sdxl_time_ids_are_in_the_compute_dtype_as_the_pipeline_makes_them(tiny_sdxl):
    """SDXL's added time ids (from integer sizes and crops) reach the U-Net in the compute dtype, as the pipeline's
    `_get_add_time_ids(..., dtype=prompt_embeds.dtype)`: (original h, w, crop top, left, target h, w)."""
    _, family = _family(tiny_sdxl)
    encodings = {"text_encoder": {"hidden": torch.zeros(2, 77, 32)},
                 "text_encoder_2": {"hidden": torch.zeros(2, 77, 64), "pooled": torch.zeros(2, 64)}}
    batch = Batch(torch.zeros(2, 4, 16, 16), torch.ones(2), torch.tensor([[40, 56], [72, 40]]),
                  torch.tensor([[0, 6], [12, 0]]))
    time_ids = family.condition(encodings, batch, torch.float16)["time_ids"]
    assert time_ids.dtype == torch.float16
    assert time_ids.tolist() == [[40, 56, 0, 6, 32, 32], [72, 40, 12, 0, 32, 32]]


# ---- cached text encodings -------------------------------------------------------------------------


@pytest.mark.parametrize("name, t5", [("sd3", "text_encoder_3"), ("flux", "text_encoder_2")])
def test_cached_text_encodings_equal_the_live_encoders_and_are_reused(name, t5, request, selected_runs, tmp_path,
                                                                     loaded_components):
    selected = selected_runs(request.getfixturevalue(f"tiny_{name}"))
    cached_config = _copy_run(selected, tmp_path / "cached")  # cache_text_embeddings=True, the default
    cached = _prepared_trainer(cached_config)
    components = [encoder.component for encoder in cached.family.text_encoders]
    # Every encoder is frozen (SD3's CLIP ones by default, FLUX.1's always): none runs during training,
    # and T5 was loaded once, to fill its cache.
    assert cached.text_encoders == {} and sorted(cached.cached) == sorted(components)
    assert loaded_components.count(t5) == 1
    assert len(list((Path(cached_config.output_dir) / TEXT_EMBEDDING_CACHE_DIR).glob(f"{t5}-*.safetensors"))) == 1

    live = _prepared_trainer(_copy_run(selected, tmp_path / "live", cache_text_embeddings=False))
    assert live.cached == {} and sorted(live.text_encoders) == sorted(components)
    with torch.no_grad():
        for encoder in live.family.text_encoders:
            component = encoder.component
            expected = live.family.encode(encoder, live.text_encoders[component], live.tokens[component])
            assert cached.cached[component].keys() == expected.keys()
            for key, value in expected.items():
                assert torch.allclose(cached.cached[component][key], value, rtol=0, atol=1e-6), (component, key)
    losses = []
    for trainer in (cached, live):
        torch.manual_seed(0)  # the same latent sample, noise and timesteps
        losses.append(trainer._micro_batch_loss(0))
    assert torch.allclose(losses[0], losses[1], rtol=1e-5, atol=1e-6)

    loaded_components.clear()
    again = _prepared_trainer(cached_config)
    assert not set(loaded_components) & set(components)  # no text encoder loaded: the cache is read
    assert all(torch.equal(again.cached[c][k], v) for c in components for k, v in cached.cached[c].items())


# ---- FLUX.1: packed latents and the guidance input ----------------------------------------------------


def test_flux_packing_equals_the_pipelines():
    latents = torch.randn(2, 16, 8, 6, generator=torch.Generator().manual_seed(0))
    packed = pack_latents(latents)
    assert torch.equal(packed, FluxPipeline._pack_latents(latents, 2, 16, 8, 6))
    # The pipeline unpacks from the image size in pixels and the VAE factor (8 in FLUX.1).
    assert torch.equal(unpack_latents(packed, 8, 6), FluxPipeline._unpack_latents(packed, 8 * 8, 6 * 8, 8))
    assert torch.equal(unpack_latents(packed, 8, 6), latents)
    # Ids of the 4 x 3 patch grid the pipeline makes for 8 x 6 latents.
    expected_ids = FluxPipeline._prepare_latent_image_ids(2, 8 // 2, 6 // 2, "cpu", torch.float32)
    assert torch.equal(latent_image_ids(8, 6), expected_ids)


def test_flux_dev_conditions_on_the_guidance_its_samples_were_drawn_with(tiny_flux, selected_runs, tmp_path):
    encodings = {"text_encoder": {"pooled": torch.zeros(3, 32)}, "text_encoder_2": {"hidden": torch.zeros(3, 7, 128)}}
    _, family = _family(tiny_flux)
    guidance = family.condition(encodings, _batch(3), torch.float32)["guidance"]
    assert torch.equal(guidance, torch.full((3,), 3.5))  # without samples: FLUX.1-dev's default sampling guidance

    config = _copy_run(selected_runs(tiny_flux), tmp_path / "run")
    settings = Path(config.output_dir) / "samples" / "settings.json"
    assert json.loads(settings.read_text())["guidance_scale"] == 3.5
    settings.write_text(json.dumps(json.loads(settings.read_text()) | {"guidance_scale": 5.0}))
    family = GORSTrainer(config).family  # reads the store's settings; loads no weights
    guidance = family.condition(encodings, _batch(3), torch.float32)["guidance"]
    assert torch.equal(guidance, torch.full((3,), 5.0))
    assert family.fingerprint()["guidance_scale"] == 5.0  # a resume at another guidance is refused


def test_flux_schnell_has_no_guidance_input(tmp_path):
    from gors.testing.flux import build_tiny_flux_pipeline

    config, family = _family(build_tiny_flux_pipeline(tmp_path / "schnell", schnell=True))
    # T5 reads as many tokens as schnell's samples are generated with: 256, not the pipeline's default 512 ([dev]'s).
    assert config.max_sequence_length == 256 < inspect.signature(FluxPipeline.__call__).parameters[
        "max_sequence_length"].default
    assert detect_backbone(str(tmp_path / "schnell")).call_kwargs == {"max_sequence_length": 256}
    encodings = {"text_encoder": {"pooled": torch.zeros(3, 32)}, "text_encoder_2": {"hidden": torch.zeros(3, 7, 128)}}
    assert "guidance" not in family.condition(encodings, _batch(3), torch.float32)
    assert "guidance_scale" not in family.fingerprint()


def test_flux_divides_the_timestep_by_1000_in_the_latents_dtype_as_its_pipeline(tiny_flux):
    """FLUX's transformer gets `timestep.to(latents.dtype) / 1000`, as `FluxPipeline` computes it: in bfloat16 the
    division rounds in bfloat16, not float32 (diffusers' script's), so training sees the sampler's time inputs."""
    _, family = _family(tiny_flux)
    seen = {}

    def denoiser(hidden_states, timestep, return_dict, **conditioning):
        seen["timestep"] = timestep
        return (hidden_states,)

    noisy = torch.randn(3, 16, 4, 4, dtype=torch.bfloat16)
    timesteps = torch.tensor([999.0, 733.3, 1.7])
    out = family.predict(denoiser, noisy, timesteps, {})
    assert torch.equal(out, noisy)  # packing and unpacking round-trip
    assert seen["timestep"].dtype == torch.bfloat16
    assert torch.equal(seen["timestep"], timesteps.to(torch.bfloat16) / 1000)
    assert not torch.equal(seen["timestep"].float(), (timesteps / 1000).to(torch.bfloat16).float())


def test_the_flow_matching_loss_runs_flux_on_noisy_latents_and_timesteps_in_the_compute_dtype(tiny_flux):
    """The flow-matching loss hands the transformer the noisy latents in the compute dtype, so that FLUX's
    timestep / 1000 is computed in it too (as `FluxPipeline` does in bfloat16); the loss is float32."""
    _, family = _family(tiny_flux)
    scheduler = family.load_scheduler()
    batch = Batch(torch.randn(2, 16, 4, 4), torch.ones(2), torch.zeros(2, 2), torch.zeros(2, 2))
    seen = []

    def transformer(hidden_states, timestep, return_dict, **conditioning):
        seen.append((hidden_states.dtype, timestep.dtype))
        return (torch.zeros_like(hidden_states),)

    loss = family.loss(transformer, scheduler, batch, {}, torch.randn_like(batch.latents), torch.tensor([0.3, 0.8]),
                       torch.bfloat16)
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    assert loss.dtype == torch.float32


# ---- settings a family cannot take ---------------------------------------------------------------------


def test_a_density_parameter_the_scheme_does_not_draw_with_is_named_as_doing_nothing(caplog):
    # A warning, not a refusal: runs made before it recorded such values, and their reruns must go on.
    from gors.config import RunConfig
    from gors.families import check_density_options

    check_density_options(RunConfig(logit_std=2.0), None, "a StableDiffusionPipeline (sd family)")
    assert ("--logit_std: a StableDiffusionPipeline (sd family) trains with the DDPM loss, which takes no timestep "
            "density; they apply to SD3 and FLUX.1. Drop it: it does nothing here.") in caplog.text
    caplog.clear()
    check_density_options(RunConfig(mode_scale=1.0, logit_mean=0.5), "logit_normal", "an SD3")
    # --logit_mean is logit_normal's own: only --mode_scale is named.
    assert [record.getMessage().split(":")[0] for record in caplog.records] == ["--mode_scale"]
    assert ("an SD3 draws its timesteps with --weighting_scheme logit_normal, which takes no such parameter; pass the "
            "scheme that uses it") in caplog.text
    caplog.clear()
    check_density_options(RunConfig(mode_scale=1.0), "mode", "an SD3")
    assert not caplog.text


@pytest.mark.parametrize("model, overrides, error", [
    ("tiny_flux", dict(train_text_encoder=True),
     r"--train_text_encoder: gors trains only the transformer of a FluxPipeline \(flux family\); its text encoders "
     r"stay frozen \(and cached\)\. Leave the flag unset\."),
    ("tiny_flux", dict(train_text_encoder_2=True), r"^--train_text_encoder_2: gors trains only the transformer of a "
                                                   r"FluxPipeline"),  # the flag given is named
    ("tiny_sd", dict(train_text_encoder_2=True),
     r"--train_text_encoder_2: a StableDiffusionPipeline \(sd family\) has no second CLIP text encoder; "
     r"use --train_text_encoder\."),
    ("tiny_sd", dict(weighting_scheme="logit_normal"),
     r"--weighting_scheme=logit_normal: a StableDiffusionPipeline \(sd family\) trains with the DDPM loss; the "
     r"flow-matching options apply to SD3 and FLUX\.1\."),
    ("tiny_sd3", dict(max_sequence_length=77),
     r"--max_sequence_length=77: gors samples a StableDiffusion3Pipeline \(sd3 family\) with the "
     r"256 T5 tokens .*a conditioning no sampler uses\. Leave the flag unset\."),
    ("tiny_sdxl", dict(max_sequence_length=77),
     r"--max_sequence_length: a StableDiffusionXLPipeline \(sdxl family\) has no T5 encoder; its CLIP encoders take "
     r"77 tokens\."),
    ("tiny_sd3", dict(resolution=40), r"--resolution=40: a StableDiffusion3Pipeline needs a multiple of 16 \(e\.g\. 32\)"),
    ("tiny_flux", dict(train_unet=False),
     r"--no_train_unet leaves nothing to train on a FluxPipeline \(flux family\): train its transformer\."),
    ("tiny_sd3", dict(train_unet=False),  # its CLIP encoders are off by default
     r"--no_train_unet leaves nothing to train on a StableDiffusion3Pipeline \(sd3 family\): train its text encoders\."),
    ("tiny_flux", dict(anchor_below=500),
     r"--anchor_below: a FluxPipeline \(flux family\) trains a rectified flow, whose timesteps come from "
     r"--weighting_scheme; --anchor_below applies to the DDPM families \(SD 1/2, SDXL\)\."),
    ("tiny_sd3", dict(timestep_range=[500, 1000]),
     r"--timestep_range: a StableDiffusion3Pipeline \(sd3 family\) trains a rectified flow, whose timesteps come from "
     r"--weighting_scheme; --timestep_range applies to the DDPM families \(SD 1/2, SDXL\)\."),
], ids=["flux_text_encoder", "flux_text_encoder_2", "sd_text_encoder_2", "sd_weighting", "sd3_t5_length", "sdxl_t5_length", "sd3_resolution",
        "flux_nothing_to_train", "sd3_nothing_to_train", "flux_anchor", "sd3_timestep_range"])
def test_settings_a_family_cannot_take_are_refused_before_any_weights_load(model, overrides, error, request, tmp_path,
                                                                         no_weights):
    run_dir = tmp_path / "run"
    config = TrainConfig(output_dir=str(run_dir), pretrained_model_name_or_path=str(request.getfixturevalue(model)),
                         **{"resolution": RESOLUTION} | overrides)
    with pytest.raises(ValueError, match=error):
        train(config)
    assert not run_dir.exists()  # refused before the selection is even read


def test_8bit_adam_without_bitsandbytes_is_refused_before_any_weights_load(tiny_sd, tmp_path, monkeypatch, no_weights):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` raises ImportError
    config = TrainConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(tiny_sd),
                         resolution=RESOLUTION, use_8bit_adam=True)
    with pytest.raises(ValueError, match=r"--use_8bit_adam needs bitsandbytes: `pip install gors\[bnb\]` .*or train "
                                          r"without the flag"):
        train(config)


def test_cli_refuses_8bit_adam_without_bitsandbytes_with_one_error_line(tiny_sd, tmp_path, capsys, monkeypatch,
                                                                       no_weights):
    from gors.cli import main

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    (tmp_path / "run").mkdir()  # gors train reads an existing run folder, with a selection
    (tmp_path / "run" / "selection.jsonl").write_text('{"path": "00000_000.png", "prompt": "p", "reward": 0.9}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--output_dir", str(tmp_path / "run"), "--pretrained_model_name_or_path", str(tiny_sd),
              "--use_8bit_adam"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: --use_8bit_adam needs bitsandbytes")


@pytest.mark.parametrize("flag", [
    ["--train_text_encoder", "true"],
    ["--train_text_encoder"],
], ids=["with_value", "bare"])
def test_cli_refuses_a_text_encoder_lora_on_flux_with_one_error_line(flag, tiny_flux, tmp_path, capsys, no_weights):
    from gors.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    kept = b'{"path": "00000_000.png", "prompt": "p", "reward": 0.9}\r\n'
    (run_dir / "selection.jsonl").write_bytes(kept)  # finished work that must survive the refusal
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--output_dir", str(run_dir), "--pretrained_model_name_or_path", str(tiny_flux), *flag])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --train_text_encoder: gors trains only the transformer of a FluxPipeline (flux family); its text "
        "encoders stay frozen (and cached). Leave the flag unset."]
    assert "Traceback" not in err
    assert (run_dir / "selection.jsonl").read_bytes() == kept
    assert not any((run_dir / name).exists() for name in ("checkpoints", "latent_cache", TEXT_EMBEDDING_CACHE_DIR))


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize("edm_scheduler, latent_statistics, error", [
    (True, False, r"its scheduler is EDMDPMSolverMultistepScheduler \(EDM\), as in an EDM-trained SDXL"),
    (False, True, r"its VAE config has latents_mean and latents_std, as in an EDM-trained SDXL"),
    (True, True, r"EDMDPMSolverMultistepScheduler \(EDM\) and its VAE config has latents_mean and latents_std"),
], ids=["scheduler", "vae", "both"])
def test_an_edm_sdxl_is_refused_for_training_before_any_weights_load(tiny_sdxl, tmp_path, no_weights, edm_scheduler,
                                                                   latent_statistics, error):
    # As Playground v2.5: diffusers' SDXL script trains it with EDM and per-channel latent statistics.
    model = tmp_path / "edm_sdxl"
    shutil.copytree(tiny_sdxl, model)
    if edm_scheduler:
        _edit_json(model / "model_index.json", scheduler=["diffusers", "EDMDPMSolverMultistepScheduler"])
        _edit_json(model / "scheduler" / "scheduler_config.json", _class_name="EDMDPMSolverMultistepScheduler")
    if latent_statistics:
        _edit_json(model / "vae" / "config.json", latents_mean=[-1.6, 1.9, -1.4, 2.5], latents_std=[8.5, 5.9, 6.5, 5.2])
    run_dir = tmp_path / "run"
    config = TrainConfig(output_dir=str(run_dir), pretrained_model_name_or_path=str(model), resolution=RESOLUTION)
    with pytest.raises(ValueError, match=error + r".*gors trains DDPM-type SDXL checkpoints only"):
        train(config)
    assert not run_dir.exists()


def test_a_checkpoint_saved_without_a_text_encoder_is_refused_for_training_before_any_weights_load(
        tiny_sd3, tmp_path, no_weights):
    # SD3 saved with text_encoder_3=None: its pipeline samples without T5, training conditions on it.
    model = tmp_path / "sd3_without_t5"
    shutil.copytree(tiny_sd3, model)
    _edit_json(model / "model_index.json", text_encoder_3=[None, None], tokenizer_3=[None, None])
    run_dir = tmp_path / "run"
    config = TrainConfig(output_dir=str(run_dir), pretrained_model_name_or_path=str(model), resolution=RESOLUTION)
    with pytest.raises(ValueError, match=r"its model_index.json has no text_encoder_3 \(T5\), which training "
                                         r"conditions on"):
        train(config)
    assert not run_dir.exists()


def _store_made_by(run_dir: Path, model: Path, **settings) -> Path:
    """A run folder whose sample store records these generation settings (no images: enough for the checks)."""
    SampleStore(samples_dir(run_dir)).save_settings({"model": str(model), "revision": None, "guidance_scale": 3.5,
                                                     "resolution": RESOLUTION} | settings)
    return run_dir


def test_training_defaults_to_the_resolution_the_samples_were_generated_at(tiny_sd3, tmp_path, no_weights):
    run_dir = _store_made_by(tmp_path / "run", tiny_sd3)
    config = TrainConfig(output_dir=str(run_dir), pretrained_model_name_or_path=str(tiny_sd3))
    trainer = GORSTrainer(config)  # SD3's own default would be 1024
    assert trainer.resolution == trainer.config.resolution == trainer.family.settings["resolution"] == RESOLUTION
    with pytest.raises(ValueError, match=r"--resolution=64: the samples were generated at 32 px "
                                         r"\(samples/settings.json\); .*Leave --resolution unset \(or pass 32\)"):
        GORSTrainer(replace(config, resolution=64))


def test_training_another_model_than_the_one_that_generated_the_samples_is_refused(tiny_sd, tiny_sdxl, tmp_path,
                                                                                   no_weights):
    run_dir = _store_made_by(tmp_path / "run", tiny_sd)
    config = TrainConfig(output_dir=str(run_dir), pretrained_model_name_or_path=str(tiny_sdxl))
    with pytest.raises(ValueError, match=rf"--pretrained_model_name_or_path='{tiny_sdxl}': the samples in .* were "
                                         rf"generated by '{tiny_sd}' \(samples/settings.json\).*"
                                         rf"--pretrained_model_name_or_path {tiny_sd}\)"):
        GORSTrainer(config)
    same = TrainConfig(output_dir=str(run_dir), pretrained_model_name_or_path=str(tiny_sd) + "/")  # one folder
    assert GORSTrainer(same).backbone.name == "sd"


def test_flux_guidance_input_defaults_to_none_as_in_diffusers(tiny_flux, tmp_path):
    model = tmp_path / "flux"
    shutil.copytree(tiny_flux, model)
    config = json.loads((model / "transformer" / "config.json").read_text())
    del config["guidance_embeds"]  # diffusers' FluxTransformer2DModel default: False
    (model / "transformer" / "config.json").write_text(json.dumps(config))
    assert detect_backbone(str(model)).sampling == FLUX_SCHNELL_SAMPLING
    _, family = _family(model)
    assert isinstance(family, FluxFamily) and not family.guidance_embeds


# ---- family defaults and checkpoint fingerprints ---------------------------------------------------------


@pytest.mark.parametrize("model, expected", [
    # (train_text_encoder, train_text_encoder_2, weighting_scheme, max_sequence_length, resolution)
    ("tiny_sd", (True, False, None, None, 32)),  # SD: the checkpoint's own side (SD-2-base: 512)
    ("tiny_sdxl", (True, True, None, None, 1024)),
    ("tiny_sd3", (False, False, "logit_normal", 256, 1024)),
    ("tiny_flux", (False, False, "none", 512, 1024)),
])
def test_unset_flags_take_the_family_defaults(model, expected, request):
    config, _ = _family(request.getfixturevalue(model), resolution=None)
    assert (config.train_text_encoder, config.train_text_encoder_2, config.weighting_scheme,
            config.max_sequence_length, config.resolution) == expected


def test_flags_given_win_over_the_family_defaults(tiny_sd3):
    config, family = _family(tiny_sd3, weighting_scheme="mode", max_sequence_length=256, mode_scale=0.5)
    assert (config.weighting_scheme, config.max_sequence_length, config.resolution) == ("mode", 256, RESOLUTION)
    assert (family.settings["weighting_scheme"], family.settings["mode_scale"]) == ("mode", 0.5)


@pytest.mark.parametrize("model, flags, trained", [
    ("tiny_sdxl", dict(train_text_encoder=True), ["text_encoder", "text_encoder_2"]),
    ("tiny_sdxl", dict(train_text_encoder=True, train_text_encoder_2=False), ["text_encoder"]),
    ("tiny_sdxl", dict(train_text_encoder=False), []),
    ("tiny_sdxl", dict(train_text_encoder=False, train_text_encoder_2=True), ["text_encoder_2"]),
    ("tiny_sd3", dict(train_text_encoder=True), ["text_encoder", "text_encoder_2"]),
    ("tiny_sd3", dict(), []),
])
def test_train_text_encoder_turns_on_both_clip_encoders_unless_the_second_is_off(model, flags, trained, request):
    config, family = _family(request.getfixturevalue(model), **flags)
    assert [e.component for e in family.trained_text_encoders(config.train_text_encoder)] == trained
    assert family.settings["train_text_encoder_2"] == ("text_encoder_2" in trained)


SELECTION = [{"path": "part-00000/00000_000.png", "reward": 0.5}]
# The keys of SD checkpoints made before other families trained (gors 9911ce6^): those must still resume.
SD_FINGERPRINT_KEYS = {
    "selection_rows", "selection_sha256", "pretrained_model_name_or_path", "revision", "resolution", "center_crop",
    "rank", "train_unet", "train_text_encoder", "train_batch_size", "gradient_accumulation_steps", "seed",
    "learning_rate", "text_encoder_learning_rate", "adam_beta1", "adam_beta2", "adam_weight_decay", "adam_epsilon",
    "lr_scheduler", "lr_warmup_steps", "unet_target_modules", "text_encoder_target_modules", "num_processes",
}


def test_sd_fingerprint_keeps_its_keys_and_flow_matching_adds_its_own(tiny_sd, tiny_flux):
    config, family = _family(tiny_sd)
    fingerprint = training_fingerprint(config, SELECTION, 1, family.fingerprint())
    # The base model's version, recorded where known (here the local folder's fingerprint), is no
    # difference to a checkpoint that lacks it (`RECORDED_WHERE_KNOWN`).
    assert set(fingerprint) == SD_FINGERPRINT_KEYS | {"base_model_commit"}
    older = {key: value for key, value in fingerprint.items() if key != "base_model_commit"}
    assert fingerprint_differences(older, fingerprint) == []
    assert fingerprint["unet_target_modules"] == ["to_q", "to_k", "to_v", "to_out.0"]
    assert fingerprint["text_encoder_target_modules"] == ["q_proj", "k_proj", "v_proj", "out_proj"]
    assert fingerprint["train_text_encoder"] is True

    config, family = _family(tiny_flux)
    fingerprint = training_fingerprint(config, SELECTION, 1, family.fingerprint())
    assert "unet_target_modules" not in fingerprint and fingerprint["guidance_scale"] == 3.5
    assert fingerprint["transformer_target_modules"] == list(FlowMatchingFamily.denoiser_lora_targets)
    assert {k: fingerprint[k] for k in ("weighting_scheme", "logit_mean", "logit_std", "mode_scale",
                                        "max_sequence_length")} == {
        "weighting_scheme": "none", "logit_mean": 0.0, "logit_std": 1.0, "mode_scale": 1.29, "max_sequence_length": 512}


def test_flow_matching_loras_keep_peft_names_as_diffusers_sd3_and_flux_scripts_save(tiny_sd3, tmp_path):
    """SD3/FLUX.1 LoRA files keep peft's `lora_A`/`lora_B` names (diffusers' SD3 and FLUX scripts save
    `get_peft_model_state_dict` as is); SD/SDXL's take the diffusers names (`lora.down`/`lora.up`), as theirs."""
    from safetensors.torch import load_file

    from gors.families import TRAINING_FAMILIES
    from gors.lora import add_lora, save_lora

    assert {name: cls.peft_lora_names for name, cls in TRAINING_FAMILIES.items()} == {
        "sd": False, "sdxl": False, "sd3": True, "flux": True}
    _, family = _family(tiny_sd3)
    transformer = family.load("transformer")
    add_lora(transformer, family.denoiser_lora_targets, 2)
    keys = load_file(str(save_lora(tmp_path, {"transformer": transformer}, "StableDiffusion3Pipeline",
                                   family.peft_lora_names))).keys()
    assert keys and all(key.startswith("transformer.") for key in keys)
    assert any(".lora_A." in key for key in keys) and not any(".lora.down." in key for key in keys)


@pytest.mark.parametrize("value", [[500], [1000, 500], [-1, 500], [500, 500, 1000]])
def test_a_malformed_timestep_range_is_refused(value):
    with pytest.raises(ValueError, match=r"--timestep_range=.*: give BEGIN END with 0 <= BEGIN < END"):
        TrainConfig(timestep_range=value)


def test_timestep_range_bounds_the_ddpm_timesteps_and_leaves_the_default_draws_alone(tiny_sd):
    latents = torch.zeros(4096, 1)
    config, family = _family(tiny_sd)
    scheduler = family.load_scheduler()
    torch.manual_seed(0)
    default = family.sample_noise(latents, scheduler)[1]
    torch.manual_seed(0)  # the draws the trainer made before the option: the noise, then the timesteps
    torch.randn_like(latents)
    assert torch.equal(default, torch.randint(0, scheduler.config.num_train_timesteps, (4096,)))
    assert "timestep_range" not in family.fingerprint()  # checkpoints made before the option still resume

    config, family = _family(tiny_sd, timestep_range=[500, 1000])
    timesteps = family.sample_noise(latents, scheduler)[1]
    assert timesteps.min() == 500 and timesteps.max() == 999
    assert family.fingerprint()["timestep_range"] == [500, 1000]

    config, family = _family(tiny_sd, timestep_range=[0, scheduler.config.num_train_timesteps + 1])
    with pytest.raises(ValueError, match=r"schedule has 1000 timesteps; give an END <= 1000"):
        family.load_scheduler()  # the trainer's first load, before any weights


def test_a_timestep_range_ending_at_the_schedule_s_length_is_accepted(tiny_sd):
    """`--timestep_range BEGIN END` draws from [BEGIN, END): END may be the schedule's length (1000), its last
    timestep 999 then included; only a longer END is refused."""
    _, family = _family(tiny_sd, timestep_range=[990, 1000])
    scheduler = family.load_scheduler()
    assert scheduler.config.num_train_timesteps == 1000
    torch.manual_seed(0)
    timesteps = family.sample_noise(torch.zeros(512, 1), scheduler)[1]
    assert timesteps.min() == 990 and timesteps.max() == 999


def test_the_ddpm_loss_runs_the_denoiser_on_noisy_latents_in_the_compute_dtype(tiny_sd):
    """DDPM families hand the denoiser the noisy latents cast to the compute dtype (its weights' under fp16/bf16),
    the timesteps as drawn, and return a float32 loss."""
    _, family = _family(tiny_sd)
    scheduler = family.load_scheduler()
    batch = Batch(torch.randn(2, 4, 2, 2), torch.ones(2), torch.zeros(2, 2), torch.zeros(2, 2))
    seen = []

    def denoiser(noisy, steps, states, return_dict):
        seen.append((noisy.dtype, steps.tolist()))
        return (torch.zeros_like(noisy),)

    loss = family.loss(denoiser, scheduler, batch, {"encoder_hidden_states": None}, torch.randn_like(batch.latents),
                       torch.tensor([10, 900]), torch.bfloat16)
    assert seen == [(torch.bfloat16, [10, 900])]
    assert loss.dtype == torch.float32


def test_anchor_below_replaces_the_target_of_the_less_noisy_rows_by_the_base_prediction(tiny_sd):
    """The loss with `--anchor_below`, on a stub denoiser that predicts 0 and a base model that predicts 1."""
    config, family = _family(tiny_sd, anchor_below=500)
    scheduler = family.load_scheduler()
    timesteps = torch.tensor([0, 499, 500, 999])
    batch = Batch(torch.randn(4, 4, 2, 2), torch.tensor([1.0, 0.5, 1.0, 0.25]), torch.zeros(4, 2), torch.zeros(4, 2))
    noise = torch.randn_like(batch.latents)
    calls = []

    def base_prediction(noisy, steps, rows, at):
        calls.append((steps.tolist(), rows.tolist()))
        assert torch.equal(at, rows) and at.device == noisy.device
        return torch.ones_like(noisy)

    def zero_denoiser(noisy, steps, states, return_dict):
        return (torch.zeros_like(noisy),)

    loss = family.loss(zero_denoiser, scheduler, batch, {"encoder_hidden_states": None}, noise, timesteps,
                       torch.float32, base_prediction)
    assert calls == [([0, 499], [0, 1])]
    target = diffusion_target(scheduler, batch.latents, noise, timesteps)
    per_sample = torch.stack([torch.tensor(1.0), torch.tensor(1.0), target[2].pow(2).mean(), target[3].pow(2).mean()])
    assert torch.allclose(loss, (batch.rewards * per_sample).mean())
    assert "anchor_below" in family.fingerprint() and "anchor_below" not in _family(tiny_sd)[1].fingerprint()


def test_a_compiled_denoiser_s_base_pass_keeps_the_micro_batch_s_shape(tiny_sd, selected_runs, tmp_path, monkeypatch):
    """A compiled denoiser compiles once per shape: with some rows of a micro-batch anchored, the base pass still
    takes the whole micro-batch (the other rows dropped after), and the loss is the uncompiled one."""
    compiled = _prepared_trainer(_copy_run(selected_runs(tiny_sd), tmp_path / "compiled", anchor_below=500,
                                           train_batch_size=4, torch_compile="eager"))
    plain = _prepared_trainer(_copy_run(selected_runs(tiny_sd), tmp_path / "plain", anchor_below=500,
                                        train_batch_size=4))
    shapes = []
    predict = compiled.family.predict
    monkeypatch.setattr(compiled.family, "predict", lambda denoiser, noisy, *args: (shapes.append(len(noisy)),
                                                                                     predict(denoiser, noisy, *args))[1])
    mixed = 0
    for seed in range(6):
        draws = []
        for trainer in (compiled, plain):
            torch.manual_seed(seed)
            draws.append(trainer._micro_batch_loss(0))
        assert torch.allclose(draws[0], draws[1], atol=1e-6, rtol=1e-5), seed
        mixed += len(shapes) == 2  # a base pass and the trained one
        assert set(shapes) == {4}
        shapes.clear()
    assert mixed  # some seed anchored some rows of the four, not all or none


def test_anchor_below_trains_the_lora_towards_the_base_model(tiny_sd, selected_runs, tmp_path):
    """All rows anchored: the loss is 0 at the LoRA's zero init and is the LoRA's distance from the base
    model once it moves; the adapters (and their gradients) are on again after the base pass."""
    config = _copy_run(selected_runs(tiny_sd), tmp_path / "run", anchor_below=1000)
    trainer = _prepared_trainer(config)
    torch.manual_seed(0)
    assert trainer._micro_batch_loss(0).item() == 0.0  # lora_B starts at zero: the LoRA model is the base model

    plain = _prepared_trainer(_copy_run(selected_runs(tiny_sd), tmp_path / "plain"))
    torch.manual_seed(0)
    assert plain._micro_batch_loss(0).item() > 0  # the same draws against the samples' targets

    lora_b = [p for module in trainer.trained_modules().values() for n, p in module.named_parameters()
              if "lora_B" in n]
    assert set(trainer.trained) == {trainer.family.denoiser, "text_encoder"}  # both LoRAs train
    with torch.no_grad():
        for p in lora_b:
            p.normal_(std=0.1)
    torch.manual_seed(0)
    loss = trainer._micro_batch_loss(0)
    assert loss.item() > 0
    loss.backward()
    assert all(p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)

    # The base pass's text encodings, cached once before training: the base encoder's, not the moved LoRA's.
    for encoder in trainer.family.text_encoders:
        module = trainer.accelerator.unwrap_model(trainer.text_encoders[encoder.component])
        tokens = trainer.tokens[encoder.component]
        with torch.no_grad():
            tuned = trainer.family.encode(encoder, module, tokens)
            with adapters_disabled(module):
                base = trainer.family.encode(encoder, module, tokens)
        for key, value in trainer.base_encodings[encoder.component].items():
            assert torch.allclose(value, base[key], rtol=1e-4, atol=1e-6)
            assert not torch.allclose(value, tuned[key], rtol=1e-4, atol=1e-6)


def test_adapters_disabled_runs_the_base_model_and_restores_the_adapters():
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    base = model(x)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["0"], init_lora_weights=False), model)
    tuned = model(x)
    assert not torch.allclose(tuned, base)
    with adapters_disabled(model):
        assert torch.equal(model(x), base)
    assert torch.equal(model(x), tuned)
    with pytest.raises(RuntimeError), adapters_disabled(model):  # an error inside (out of memory) turns them on again
        raise RuntimeError("out of memory")
    assert torch.equal(model(x), tuned)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


# ---- SDXL's size conditions from the sample store --------------------------------------------------------


def _crop_offset(image: Image.Image) -> tuple[int, int]:
    """(top, left) of the training crop in the resized image, found by matching pixels (not by formula)."""
    resized = np.asarray(transforms.Resize(RESOLUTION)(image))
    cropped = np.asarray(transforms.CenterCrop(RESOLUTION)(Image.fromarray(resized)))
    offsets = [(top, left) for top in range(resized.shape[0] - RESOLUTION + 1)
               for left in range(resized.shape[1] - RESOLUTION + 1)
               if np.array_equal(resized[top:top + RESOLUTION, left:left + RESOLUTION], cropped)]
    assert len(offsets) == 1
    return offsets[0]


def _noise_image(height: int, width: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("height, width", [
    (40, 56), (72, 40), (32, 32), (31, 45),
    # torchvision resizes the long side to int(32 * 1127 / 784) = 46, where int(1127 * (32 / 784)) is 45.
    (784, 1127),
    # An odd overhang (59 - 32 = 27): torchvision rounds 13.5 to 14, as diffusers' SDXL script records it.
    (74, 40), (40, 74),
    # The long side truncated, not rounded: 32 * 65 / 60 = 34.67 gives 34 (offset 1), where 35 would give 2.
    (60, 65),
])
def test_crop_top_left_is_where_the_training_transform_crops(height, width):
    assert crop_top_left(height, width, RESOLUTION, True) == _crop_offset(_noise_image(height, width, 0))
    assert crop_top_left(height, width, RESOLUTION, False) == (0, 0)  # resized to the square, nothing cropped


def test_ddp_looks_for_unused_parameters_only_in_the_encoder_that_has_some(tiny_sdxl, selected_runs, tmp_path,
                                                                            monkeypatch):
    # SDXL's CLIP-L LoRA has a layer whose output is never read; the U-Net and bigG use every adapter, and DDP's
    # search for unused ones walks the autograd graph at each backward. (Launched on two processes by
    # tests/test_family_training.py, where an unused parameter outside CLIP-L would stop DDP.)
    trainer = GORSTrainer(_copy_run(selected_runs(tiny_sdxl), tmp_path / "run"))
    trainer._setup_models()
    trainer._setup_optimizer()
    handler = trainer.accelerator.ddp_handler
    assert handler is not None and handler.find_unused_parameters
    searched = {}
    prepare = trainer.accelerator.prepare

    def recording(*objects):
        for module in (o for o in objects if isinstance(o, torch.nn.Module)):
            searched[type(module).__name__] = trainer.accelerator.ddp_handler is handler
        return prepare(*objects)

    monkeypatch.setattr(trainer.accelerator, "prepare", recording)
    trainer.prepare()
    assert searched == {"UNet2DConditionModel": False, "CLIPTextModel": True, "CLIPTextModelWithProjection": False}
    assert trainer.accelerator.ddp_handler is handler
    assert [type(model).__name__ for model in trainer.accelerator._models] == list(searched)  # checkpoints' order


def test_sdxl_trains_on_each_stored_images_size_and_crop(tiny_sdxl, selected_runs, tmp_path, monkeypatch):
    config = _copy_run(selected_runs(tiny_sdxl), tmp_path / "run")
    selection = load_selection(config.output_dir)
    sizes = [(40, 56), (72, 40), (32, 32)]  # (height, width): wide, tall, as generated
    expected = []
    for i, row in enumerate(selection):
        height, width = sizes[i % len(sizes)]
        image = _noise_image(height, width, seed=i)
        path = Path(config.output_dir) / "samples" / row["path"]
        image.save(path)
        row["image_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()  # as if generated so
        expected.append([height, width, *_crop_offset(image)])
    atomic_write_jsonl(Path(config.output_dir) / SELECTION_FILE, selection)
    trainer = _prepared_trainer(config)
    recorded = torch.cat([trainer.latents["original_size"], trainer.latents["crop_top_left"]], dim=1)
    assert recorded.tolist() == expected

    seen = []
    condition = trainer.family.condition

    def recording(*args):
        seen.append(condition(*args))
        return seen[-1]

    monkeypatch.setattr(trainer.family, "condition", recording)
    trainer._micro_batch_loss(0)
    rows = trainer.schedule.indices(0)
    assert seen[0]["time_ids"].tolist() == [expected[i] + [RESOLUTION, RESOLUTION] for i in rows]


def test_sdxl_caption_dropout_trains_the_zero_embeddings_its_pipeline_samples_with(tiny_sdxl, selected_runs,
                                                                                   tmp_path, monkeypatch):
    # StableDiffusionXLPipeline with force_zeros_for_empty_prompt (SDXL base) and no negative prompt: the
    # unconditional branch is zero text embeddings and zero pooled ones, with the same size conditions.
    assert json.loads((tiny_sdxl / "model_index.json").read_text())["force_zeros_for_empty_prompt"] is True
    trainer = _prepared_trainer(_copy_run(selected_runs(tiny_sdxl), tmp_path / "run", caption_dropout=0.999))
    seen = []
    monkeypatch.setattr(trainer.family, "loss", lambda denoiser, scheduler, batch, conditioning, *args, **kwargs: (
        seen.append(conditioning), torch.zeros(()))[1])
    trainer._micro_batch_loss(0)
    conditioning = seen[0]
    assert not conditioning["encoder_hidden_states"].any() and not conditioning["text_embeds"].any()
    assert conditioning["time_ids"].tolist() == [[RESOLUTION, RESOLUTION, 0, 0, RESOLUTION, RESOLUTION]] * 2  # sizes stay
    # The checkpoints say so: one that dropped captions to the encoding of "" (an older gors) does not resume.
    assert trainer.family.fingerprint()["dropped_captions"] == "zero embeddings"

    # Without the option, the dropped rows keep the encoding of "" (as SD 1/2's always do).
    _, family = _family(tiny_sdxl)
    conditioning = {"encoder_hidden_states": torch.ones(3, 4, 2), "text_embeds": torch.ones(3, 2),
                    "time_ids": torch.ones(3, 6)}
    dropped = torch.tensor([True, False, True])
    zeroed = family.drop_captions(conditioning, dropped)
    assert zeroed["encoder_hidden_states"].sum(dim=(1, 2)).tolist() == [0, 8, 0]
    assert zeroed["text_embeds"].sum(dim=1).tolist() == [0, 2, 0] and torch.equal(zeroed["time_ids"], torch.ones(3, 6))
    assert "dropped_captions" not in family.fingerprint()  # no caption dropout: checkpoints as before
    family.zeros_for_empty_prompt = False
    assert family.drop_captions(conditioning, dropped) is conditioning


def test_sdxl_without_force_zeros_in_its_model_index_drops_captions_to_zeros_as_its_pipeline(tiny_sdxl, tmp_path):
    """`force_zeros_for_empty_prompt` missing from model_index.json: StableDiffusionXLPipeline's default (True)
    holds, and caption dropout zeroes the dropped rows' text embeddings (sequence and pooled)."""
    from diffusers import StableDiffusionXLPipeline

    assert inspect.signature(StableDiffusionXLPipeline.__init__).parameters[
        "force_zeros_for_empty_prompt"].default is True
    model = tmp_path / "sdxl"
    model.mkdir()
    for part in tiny_sdxl.iterdir():
        if part.name != "model_index.json":
            (model / part.name).symlink_to(part)
    index = json.loads((tiny_sdxl / "model_index.json").read_text())
    index.pop("force_zeros_for_empty_prompt")
    (model / "model_index.json").write_text(json.dumps(index))
    _, family = _family(model)
    assert family.zeros_for_empty_prompt
    conditioning = {"encoder_hidden_states": torch.ones(2, 3, 4), "text_embeds": torch.ones(2, 4),
                    "time_ids": torch.ones(2, 6)}
    dropped = family.drop_captions(conditioning, torch.tensor([False, True]))
    assert torch.equal(dropped["encoder_hidden_states"][1], torch.zeros(3, 4))
    assert torch.equal(dropped["text_embeds"][1], torch.zeros(4))
    assert torch.equal(dropped["encoder_hidden_states"][0], torch.ones(3, 4))
    assert torch.equal(dropped["time_ids"], torch.ones(2, 6))


def test_benchmark_validation_renders_with_the_trained_familys_sampling(tiny_sd3, selected_runs, tmp_path,
                                                                        monkeypatch):
    # The real SD3 default (28 steps at 1024 px) is more than the tiny model's 64 px position table holds.
    tiny_defaults = replace(FAMILIES["StableDiffusion3Pipeline"], sampling=SamplingDefaults(2, 3.5, RESOLUTION))
    monkeypatch.setitem(FAMILIES, "StableDiffusion3Pipeline", tiny_defaults)
    selected = selected_runs(tiny_sd3)
    t5_loads = []
    load_t5 = T5EncoderModel.from_pretrained.__func__
    monkeypatch.setattr(T5EncoderModel, "from_pretrained",
                        classmethod(lambda cls, *args, **kwargs: t5_loads.append(1) or load_t5(cls, *args, **kwargs)))
    config = _copy_run(selected, tmp_path / "run", max_train_steps=2, checkpointing_steps=2,
                       validation_benchmark="toy:train", validation_num_prompts=2, validation_steps=1)
    train(config)
    for step in (1, 2):
        validation = Path(config.output_dir) / "validation" / f"step-{step:06d}"
        settings = json.loads((validation / "samples" / "settings.json").read_text())
        # SD3's own sampling, not the toy benchmark's SD 1/2 protocol (DDIM, 20 steps, guidance 4, 64 px).
        assert (settings["num_inference_steps"], settings["guidance_scale"], settings["resolution"]) == \
            (2, 3.5, RESOLUTION)
        assert settings["scheduler"] == "the checkpoint's"
        assert json.loads((validation / "summary.json").read_text())["num_images"] == 2
    assert (Path(config.output_dir) / "best" / "pytorch_lora_weights.safetensors").is_file()
    # T5 is loaded to fill the text-embedding cache, then dropped; the first validation loads it again and
    # keeps it (on the CPU) for the next one, instead of its pipeline reading it from disk every time.
    assert len(t5_loads) == 2
