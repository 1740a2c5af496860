"""Model families are read from model_index.json, and their defaults reach generation and benchmarks."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from evaluators import build_benchmark
from gors.core.backbones import (
    FAMILIES,
    Backbone,
    SamplingDefaults,
    check_resolution,
    check_trainable,
    detect_backbone,
    family_precision,
    half_precision_warning,
)
from gors.core.toy import PRETRAINED_DIR

TOY_MODEL = PRETRAINED_DIR / "pipeline"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"


def test_the_family_comes_from_the_class_in_model_index_not_from_the_name(tmp_path: Path) -> None:
    assert detect_backbone(str(TOY_MODEL)).name == "sd"
    renamed = tmp_path / "stable-diffusion-3.5-medium"  # a misleading name changes nothing
    shutil.copytree(TOY_MODEL, renamed)
    assert detect_backbone(str(renamed)).name == "sd"
    index = json.loads((renamed / "model_index.json").read_text())
    (renamed / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusionXLPipeline"}))
    assert detect_backbone(str(renamed)).name == "sdxl"


def _config_only_pipeline(folder: Path, class_name: str, denoiser: str, sample_size: int, vae: dict,
                          **denoiser_config: object) -> Path:
    """A pipeline folder with configs and no weights: all that family detection reads."""
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": class_name, denoiser: ["diffusers", "X"],
                                                          "vae": ["diffusers", "Y"]}))
    for component, config in ((denoiser, {"sample_size": sample_size, **denoiser_config}), ("vae", vae)):
        (folder / component).mkdir()
        (folder / component / "config.json").write_text(json.dumps(config))
    return folder


def test_the_default_side_is_the_checkpoints_own(tmp_path: Path) -> None:
    assert detect_backbone(str(TOY_MODEL)).sampling.resolution == 64  # 8 latent pixels x 8
    sd_vae = {"block_out_channels": [128, 256, 512, 512]}
    sd2_768 = _config_only_pipeline(tmp_path / "sd21", "StableDiffusionPipeline", "unet", 96, sd_vae)
    assert detect_backbone(str(sd2_768)).sampling.resolution == 768
    sd2_base = _config_only_pipeline(tmp_path / "sd2base", "StableDiffusionPipeline", "unet", 64, sd_vae)
    assert detect_backbone(str(sd2_base)).sampling.resolution == 512  # the paper's
    # A DC-AE (Sana) names its levels encoder_block_out_channels: 32 x downsampling
    dc_ae = {"encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024]}
    sana = _config_only_pipeline(tmp_path / "sana", "SanaPipeline", "transformer", 32, dc_ae)
    assert detect_backbone(str(sana)).sampling.resolution == 1024


def test_a_folder_without_model_index_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "unet").mkdir()
    with pytest.raises(FileNotFoundError, match="has no model_index.json: it is not a diffusers pipeline folder"):
        detect_backbone(str(tmp_path))


def test_resolution_and_training_checks_name_the_family(monkeypatch: pytest.MonkeyPatch) -> None:
    flux = FAMILIES["FluxPipeline"]
    assert check_resolution(flux, 1024) == 1024
    with pytest.raises(ValueError, match="FluxPipeline needs a multiple of 16"):
        check_resolution(flux, 520)
    for family in FAMILIES.values():
        check_trainable(family, family.name)
    # A trainable backbone without a training family (or the reverse) would fail deep in training: the two
    # registries, kept in two layers, must name the same families.
    from gors.core.backbones import TRAINABLE
    from gors.families import TRAINING_FAMILIES

    assert sorted(TRAINABLE) == sorted(TRAINING_FAMILIES)
    # Sampling defaults alone make no family trainable, nor listed as one in the refusal.
    untrained = Backbone("pixart", "PixArtSigmaPipeline", SamplingDefaults(20, 4.5, 1024))
    monkeypatch.setitem(FAMILIES, "PixArtSigmaPipeline", untrained)
    with pytest.raises(ValueError, match=r"families \(StableDiffusionPipeline, StableDiffusionXLPipeline, "
                                         r"StableDiffusion3Pipeline, FluxPipeline\)\. It generates"):
        check_trainable(untrained, "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS")
    sana = Backbone("pipeline", "SanaPipeline", SamplingDefaults(20, 4.5, 1024))
    with pytest.raises(ValueError, match="gors trains the sd, sdxl, sd3, flux families .*StableDiffusionXLPipeline.* "
                                         "generates and evaluates any diffusers pipeline"):
        check_trainable(sana, "Efficient-Large-Model/Sana_600M_1024px_diffusers")


def test_sdxl_samples_with_its_pipelines_own_defaults() -> None:
    import inspect

    from diffusers import StableDiffusionXLPipeline

    # SDXL's model card calls the pipeline with its defaults (SD3.5 and FLUX.1 follow their cards' values instead).
    call = inspect.signature(StableDiffusionXLPipeline.__call__).parameters
    sampling = FAMILIES["StableDiffusionXLPipeline"].sampling
    assert (sampling.num_inference_steps, sampling.guidance_scale) == (
        call["num_inference_steps"].default, call["guidance_scale"].default) == (50, 5.0)


@pytest.mark.parametrize("name, official", [("t2i_compbench", (30, 7.5, 512)), ("geneval", (50, 9.0, 512)),
                                            ("geneval2", (30, 7.5, 512)), ("toy", (20, 4.0, 64))])
def test_benchmarks_keep_their_protocol_for_sd_and_take_the_family_defaults_elsewhere(name, official) -> None:
    def values(protocol):
        return protocol.num_inference_steps, protocol.guidance_scale, protocol.resolution

    benchmark = build_benchmark(name)
    assert values(benchmark.protocol()) == values(benchmark.protocol(FAMILIES["StableDiffusionPipeline"])) == official
    assert values(benchmark.protocol(FAMILIES["StableDiffusion3Pipeline"])) == (28, 3.5, 1024)
    assert values(benchmark.protocol(FAMILIES["FluxPipeline"])) == (50, 3.5, 1024)
    given = build_benchmark(name, num_inference_steps=12, resolution=256)  # given values always win
    assert values(given.protocol(FAMILIES["FluxPipeline"])) == (12, 3.5, 256)
    # The official scripts call the pipeline without a size: an SD 2.x 768-v checkpoint generates at 768 px
    # (`detect_backbone` reads its side), which only the toy benchmark, drawn at 64 px, overrides.
    sd_768 = replace(FAMILIES["StableDiffusionPipeline"],
                     sampling=replace(FAMILIES["StableDiffusionPipeline"].sampling, resolution=768))
    assert values(benchmark.protocol(sd_768)) == official[:2] + ((64,) if name == "toy" else (768,))
    assert given.protocol(sd_768).resolution == 256


# ---- every family generates and evaluates; only trainable ones train ----------------------------


@pytest.mark.parametrize("family", ["tiny_sd3", "tiny_flux"])
@pytest.mark.skipif(not (SHARED / "t2i_compbench").is_dir(), reason="needs ../shared/benchmarks")
def test_evaluate_runs_on_flow_matching_families_over_two_benchmarks(family, request, tmp_path, tiny_blip,
                                                                     monkeypatch) -> None:
    """`gors evaluate` on SD3 and FLUX.1: the family's own scheduler and defaults, the benchmark's protocol fields."""
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))
    model = str(request.getfixturevalue(family))
    backbone = detect_backbone(model)
    assert backbone.name == family.removeprefix("tiny_") and backbone.sampling.scheduler is None
    small = {"max_prompts": 2, "images_per_prompt": 1, "resolution": 32, "num_inference_steps": 2}
    toy = build_benchmark("toy", **small).evaluate(model, tmp_path / "toy")
    color = build_benchmark("t2i_compbench", "color", **small).evaluate(
        model, tmp_path / "color", scorer_options={"model_name_or_path": str(tiny_blip)}, with_columns=False)
    assert toy["num_images"] == 2 and 0.0 <= toy["binding_accuracy"] <= 1.0
    assert color["num_images"] == 2 and 0.0 <= color["score"] <= 1.0
    settings = json.loads((tmp_path / "toy" / "samples" / "settings.json").read_text())
    assert settings["scheduler"] == "the checkpoint's" and settings["resolution"] == 32
    # The family's guidance (not T2I-CompBench's 7.5, written for SD 1/2) where none was given.
    assert color["results"]["config"]["guidance_scale"] == backbone.sampling.guidance_scale


def test_a_pipeline_gors_cannot_train_still_evaluates(tiny_pixart, tmp_path) -> None:
    backbone = detect_backbone(str(tiny_pixart))
    assert (backbone.name, backbone.pipeline_class, backbone.trainable) == ("pipeline", "PixArtSigmaPipeline", False)
    assert backbone.call_kwargs == {"use_resolution_binning": False}  # the protocol's side, not a binned one
    summary = build_benchmark("toy", max_prompts=2, images_per_prompt=1, resolution=32, num_inference_steps=2) \
        .evaluate(str(tiny_pixart), tmp_path / "toy")
    assert summary["num_images"] == 2


def test_train_on_another_family_stops_before_loading_weights(tiny_pixart, make_run_config, tmp_path, capsys) -> None:
    from gors.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    kept = '{"path": "00000_000.png", "prompt": "p", "reward": 0.9}\n'
    (run_dir / "selection.jsonl").write_text(kept)  # finished work that must survive the refusal
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--output_dir", str(run_dir), "--pretrained_model_name_or_path", str(tiny_pixart)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "is a PixArtSigmaPipeline (pipeline family); gors trains the sd, sdxl, sd3, flux families" in err
    assert "Traceback" not in err
    assert (run_dir / "selection.jsonl").read_text() == kept
    assert not (run_dir / "checkpoints").exists()


def test_generate_takes_the_family_defaults_and_refuses_a_resolution_it_cannot_take(tiny_flux, tmp_path) -> None:
    from gors.config import GenerateConfig
    from gors.generate import generate

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    config = GenerateConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path=str(tiny_flux),
                            train_prompts=str(prompts), images_per_prompt=1, resolution=40, num_inference_steps=2)
    with pytest.raises(ValueError, match="--resolution=40: a FluxPipeline needs a multiple of 16"):
        generate(config)
    config.resolution = 32
    store = generate(config)
    settings = json.loads((store.root / "settings.json").read_text())
    assert (settings["resolution"], settings["num_inference_steps"], settings["guidance_scale"]) == (32, 2, 3.5)
    assert store.open_image(store.records()[0]).size == (32, 32)


def test_a_lora_of_another_family_is_refused_before_any_weights_load(tiny_flux, tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    from gors.core.pipeline import load_pipeline

    lora = tmp_path / "sd_lora"
    lora.mkdir()
    save_file({"unet.down_blocks.0.attentions.0.proj_in.lora_A.weight": torch.zeros(4, 8)},
              str(lora / "pytorch_lora_weights.safetensors"))
    with pytest.raises(ValueError, match="has weights for unet, but the FluxPipeline .* has no unet: the LoRA was "
                                         "trained on another model family"):
        load_pipeline(str(tiny_flux), torch.device("cpu"), lora=str(lora))
    with pytest.raises(FileNotFoundError, match="holds no pytorch_lora_weights.safetensors"):
        load_pipeline(str(tiny_flux), torch.device("cpu"), lora=str(tmp_path))


def test_fp16_on_the_t5_families_is_warned_of() -> None:
    import torch

    for class_name in ("StableDiffusion3Pipeline", "FluxPipeline"):
        assert "pass --mixed_precision bf16" in half_precision_warning(FAMILIES[class_name], torch.float16)
        assert half_precision_warning(FAMILIES[class_name], torch.bfloat16) is None
    assert half_precision_warning(FAMILIES["StableDiffusionPipeline"], torch.float16) is None  # GORS' own fp16


def test_settings_record_ddim_for_stable_diffusion_and_the_checkpoint_s_scheduler_for_the_others() -> None:
    # No backbone given means Stable Diffusion 1/2 (or a pipeline in memory): a store records its DDIM sampling.
    from gors.core.pipeline import pipeline_settings

    assert pipeline_settings("model", torch.float16)["scheduler"] == "DDIMScheduler"
    sdxl = pipeline_settings("model", torch.float16, backbone=FAMILIES["StableDiffusionXLPipeline"])
    assert sdxl["scheduler"] == "the checkpoint's" and sdxl["dtype"] == "float16"


def test_loading_a_t5_family_in_fp16_warns_of_it(tiny_flux, caplog) -> None:
    # Said where the pipeline loads, whatever command loads it: fp16 FLUX.1 and SD3 samples wash out or turn black.
    from gors.core.pipeline import load_pipeline

    with caplog.at_level("WARNING", logger="gors.core.pipeline"):
        load_pipeline(str(tiny_flux), torch.device("cpu"), dtype=torch.float16)
    assert any("fp16 on a FluxPipeline" in r.getMessage() and "pass --mixed_precision bf16" in r.getMessage()
               for r in caplog.records)


def test_an_fp16_accelerate_config_runs_the_t5_families_in_bf16_unless_fp16_is_asked_for(monkeypatch, capsys):
    sd3, flux, sd = (FAMILIES[name] for name in ("StableDiffusion3Pipeline", "FluxPipeline", "StableDiffusionPipeline"))
    from gors.core.backbones import _say_bf16

    _say_bf16.cache_clear()  # said once per process: an earlier test may have said it
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # as `accelerate launch` with a shipped GPU config
    assert family_precision(sd3, None) == family_precision(flux, None) == "bf16"
    assert "pass --mixed_precision fp16 to run it in fp16 anyway" in capsys.readouterr().out
    assert family_precision(flux, "fp16") == "fp16" and family_precision(flux, "no") == "no"  # asked for: kept
    assert family_precision(sd, None) is None  # Stable Diffusion 2 keeps the config's fp16 (GORS' own)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert family_precision(flux, None) is None


def test_generate_train_and_evaluate_take_the_family_precision(tiny_flux, tmp_path, monkeypatch):
    import gors.evaluate
    import gors.generate
    import gors.train
    from gors.config import EvaluateConfig, GenerateConfig, TrainConfig

    class Asked(Exception):
        pass

    def capture(*args, **kwargs):
        raise Asked(kwargs.get("mixed_precision", args[1] if len(args) > 1 else None))

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setattr(gors.generate, "inference_dtype", capture)
    monkeypatch.setattr(gors.train, "make_accelerator", capture)
    monkeypatch.setattr(gors.evaluate, "make_accelerator", capture)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    model = str(tiny_flux)
    with pytest.raises(Asked, match="bf16"):
        gors.generate.generate(GenerateConfig(output_dir=str(tmp_path / "g"), pretrained_model_name_or_path=model,
                                              train_prompts=str(prompts)))
    with pytest.raises(Asked, match="bf16"):
        gors.train.training_accelerator(TrainConfig(output_dir=str(tmp_path / "t"), pretrained_model_name_or_path=model))
    with pytest.raises(Asked, match="bf16"):
        gors.evaluate.evaluate(EvaluateConfig(benchmarks="toy", pretrained_model_name_or_path=model,
                                              output_dir=str(tmp_path / "e")))
    import evaluators.base

    monkeypatch.setattr(evaluators.base, "make_accelerator", capture)
    with pytest.raises(Asked, match="bf16"):  # a benchmark evaluated from Python, without an accelerator
        build_benchmark("toy", max_prompts=1).evaluate(model, tmp_path / "b")


def test_each_sd3_checkpoint_samples_as_its_model_card(tmp_path: Path) -> None:
    vae = {"block_out_channels": [128, 256, 512, 512]}

    def sd3(name: str, **transformer: object) -> str:
        return str(_config_only_pipeline(tmp_path / name, "StableDiffusion3Pipeline", "transformer", 128, vae,
                                         **transformer))

    def steps_and_guidance(folder: str) -> tuple[int, float]:
        sampling = detect_backbone(folder).sampling
        return sampling.num_inference_steps, sampling.guidance_scale

    assert steps_and_guidance(sd3("sd35_medium", qk_norm="rms_norm", dual_attention_layers=list(range(13)))) == (40, 4.5)
    assert steps_and_guidance(sd3("sd35_large", qk_norm="rms_norm")) == (28, 3.5)
    assert steps_and_guidance(sd3("sd3_medium")) == (28, 7.0)  # no qk_norm: SD3 Medium


def test_a_gpu_left_in_float32_by_no_choice_of_precision_is_said_once(monkeypatch, caplog):
    from types import SimpleNamespace

    from gors.core import logs
    from gors.core.pipeline import inference_dtype

    monkeypatch.setattr(logs, "_said", set())
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    gpu = SimpleNamespace(device=torch.device("cuda"), mixed_precision="no")
    assert inference_dtype(gpu, "fp16") == torch.float16 and not caplog.records  # chosen: nothing to say
    assert inference_dtype(gpu, None) == torch.float32 and inference_dtype(gpu, None) == torch.float32
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["generating in float32 on a GPU"]  # once
    caplog.clear()
    monkeypatch.setattr(logs, "_said", set())
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # `accelerate launch --mixed_precision no`: a choice
    assert inference_dtype(gpu, None) == torch.float32 and not caplog.records
    assert inference_dtype(SimpleNamespace(device=torch.device("cpu"), mixed_precision="fp16"), None) == torch.float32


def test_the_precision_asked_for_or_configured_picks_the_gpu_dtype(monkeypatch) -> None:
    # SD3/3.5 and FLUX.1 sample in bf16: a bf16 read as fp16 overflows their T5 encoder.
    from types import SimpleNamespace

    from gors.core.pipeline import inference_dtype

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cuda = torch.device("cuda")
    assert inference_dtype(SimpleNamespace(device=cuda, mixed_precision="no"), "bf16") == torch.bfloat16
    assert inference_dtype(SimpleNamespace(device=cuda, mixed_precision="bf16"), None) == torch.bfloat16
    assert inference_dtype(SimpleNamespace(device=cuda, mixed_precision="bf16"), "fp16") == torch.float16  # flag wins


def test_stable_diffusion_samples_with_ddim_whatever_its_checkpoint_ships_and_without_a_progress_bar(
        tiny_sd, tmp_path, capsys) -> None:
    # Released SD 1.x checkpoints ship PNDM; the T2I-CompBench protocol samples with DDIM (on the same betas).
    import diffusers

    from gors.core.pipeline import load_pipeline

    model = tmp_path / "pndm_sd"
    shutil.copytree(tiny_sd, model)
    config_file = model / "scheduler" / "scheduler_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(config | {"_class_name": "PNDMScheduler"}))
    index = json.loads((model / "model_index.json").read_text())
    (model / "model_index.json").write_text(json.dumps(index | {"scheduler": ["diffusers", "PNDMScheduler"]}))
    pipeline = load_pipeline(str(model), torch.device("cpu"))
    assert type(pipeline.scheduler) is diffusers.DDIMScheduler
    assert pipeline.scheduler.config.beta_schedule == config["beta_schedule"] == "scaled_linear"
    capsys.readouterr()
    pipeline("a red circle", num_inference_steps=2, height=32, width=32, output_type="latent")
    assert capsys.readouterr().err == ""  # a bar per call would bury the run's own progress


def test_another_pipeline_with_a_safety_checker_loads_without_it(tiny_sd, tmp_path):
    # A safety checker blackens flagged images, which would score as low-reward samples (as for Stable Diffusion).
    model = tmp_path / "lcm"
    shutil.copytree(tiny_sd, model)
    index = json.loads((model / "model_index.json").read_text())
    (model / "model_index.json").write_text(json.dumps(index | {"_class_name": "LatentConsistencyModelPipeline"}))
    backbone = detect_backbone(str(model))
    assert backbone.name == "pipeline" and backbone.pipeline_kwargs == {"safety_checker": None,
                                                                       "requires_safety_checker": False}


def test_a_pipeline_without_guidance_samples_at_guidance_1(tmp_path: Path) -> None:
    # An unconditional pipeline's __call__ takes no guidance_scale: the generic family must not invent classifier-free
    # guidance (1.0 is none), while its steps are the pipeline's own default.
    import inspect

    import diffusers

    ddpm = _config_only_pipeline(tmp_path / "ddpm", "DDPMPipeline", "unet", 32, {"block_out_channels": [1, 2]})
    sampling = detect_backbone(str(ddpm)).sampling
    steps = inspect.signature(diffusers.DDPMPipeline.__call__).parameters["num_inference_steps"].default
    assert (sampling.guidance_scale, sampling.num_inference_steps, sampling.resolution) == (1.0, steps, 64)


def test_a_lora_for_a_component_the_model_leaves_empty_is_refused_and_extra_entries_are_no_reason(tmp_path: Path):
    # model_index.json lists an absent optional component as [null, null] (an SDXL refiner's text_encoder): a LoRA for
    # it would find nothing. A file that also holds entries not named "lora" (alphas) is still a LoRA file.
    from safetensors.torch import save_file

    from gors.core.backbones import check_lora_fits

    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLImg2ImgPipeline",
                                                        "unet": ["diffusers", "UNet2DConditionModel"],
                                                        "text_encoder": [None, None]}))
    lora = tmp_path / "lora.safetensors"
    save_file({"unet.proj_in.lora_A.weight": torch.zeros(2, 4), "unet.proj_in.alpha": torch.tensor(2.0)}, str(lora))
    check_lora_fits(str(model), str(lora))
    save_file({"text_encoder.q_proj.lora_A.weight": torch.zeros(2, 4)}, str(lora))
    with pytest.raises(ValueError, match="has no text_encoder: the LoRA was trained on another model family"):
        check_lora_fits(str(model), str(lora))


def test_generate_passes_the_familys_extra_call_arguments_to_every_pipeline_call(tmp_path, monkeypatch):
    """generate samples with the family's extra pipeline-call arguments (FLUX.1 [schnell]'s T5 length) in every call."""
    import gors.generate
    from gors.config import GenerateConfig

    flux = replace(FAMILIES["FluxPipeline"], call_kwargs={"max_sequence_length": 256})
    monkeypatch.setattr(gors.generate, "detect_backbone", lambda *args: flux)
    protocols = []
    monkeypatch.setattr(gors.generate, "generate_samples", lambda store, prompts, protocol, *args, **kwargs:
                        protocols.append(protocol))
    (tmp_path / "prompts.txt").write_text("a cat\n")
    gors.generate.generate(GenerateConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path="any/flux",
                                          train_prompts=str(tmp_path / "prompts.txt"), images_per_prompt=1))
    assert [dict(p.call_kwargs) for p in protocols] == [{"max_sequence_length": 256}]


def test_generate_detects_loads_and_records_the_revision_it_is_given(tmp_path, monkeypatch):
    """generate reads the family of, loads and records the model at --revision, not at its main branch."""
    import gors.generate
    from gors.config import GenerateConfig

    detected, loaded = [], []
    monkeypatch.setattr(gors.generate, "detect_backbone", lambda name, revision=None: detected.append(revision)
                        or FAMILIES["StableDiffusionPipeline"])

    def load_pipeline(name, device, dtype, revision=None, **kwargs):
        loaded.append(revision)
        raise InterruptedError("stop before sampling")

    monkeypatch.setattr(gors.generate, "load_pipeline", load_pipeline)
    (tmp_path / "prompts.txt").write_text("a cat\n")
    config = GenerateConfig(output_dir=str(tmp_path / "run"), pretrained_model_name_or_path="org/model", revision="v2",
                            train_prompts=str(tmp_path / "prompts.txt"), images_per_prompt=1)
    with pytest.raises(InterruptedError):
        gors.generate.generate(config)
    assert detected == ["v2"] and loaded == ["v2"]
    assert json.loads((tmp_path / "run" / "samples" / "settings.json").read_text())["revision"] == "v2"


def test_stable_diffusion_samples_as_t2i_compbench_does_and_loads_without_its_safety_checker() -> None:
    # The GORS paper's sampling (T2I-CompBench's protocol: DDIM, 30 steps, guidance 7.5, 512 px for SD 1.x and SD-2-base);
    # the safety checker would blacken flagged samples into low-reward ones, so it is never loaded.
    sd = FAMILIES["StableDiffusionPipeline"]
    assert sd.sampling == SamplingDefaults(30, 7.5, 512, "DDIMScheduler")
    assert sd.pipeline_kwargs == {"safety_checker": None, "requires_safety_checker": False}
    detected = detect_backbone(str(TOY_MODEL))  # the checkpoint's side replaces 512, nothing else
    assert detected.sampling == SamplingDefaults(30, 7.5, 64, "DDIMScheduler")
    assert detected.pipeline_kwargs == sd.pipeline_kwargs and detected.call_kwargs == {}


def test_each_family_takes_sides_of_its_vae_factor_times_its_patch_size() -> None:
    # SD and SDXL: an 8x VAE on a UNet; SD3 and FLUX.1: an 8x VAE under 2 x 2 patches.
    for class_name, multiple in (("StableDiffusionPipeline", 8), ("StableDiffusionXLPipeline", 8),
                                 ("StableDiffusion3Pipeline", 16), ("FluxPipeline", 16)):
        family = FAMILIES[class_name]
        assert family.resolution_multiple == multiple
        assert check_resolution(family, 1024) == 1024 and check_resolution(family, multiple * 33) == multiple * 33
        with pytest.raises(ValueError, match=f"--resolution={multiple * 33 + multiple // 2}: a {class_name} needs a multiple of "
                                             f"{multiple}"):
            check_resolution(family, multiple * 33 + multiple // 2)


def test_each_flux_checkpoint_samples_as_its_model_card(tmp_path: Path) -> None:
    # FLUX.1 [dev] (guidance-distilled: its transformer embeds the guidance) samples 50 steps at 3.5; [schnell], 4 steps
    # without guidance on 256 T5 tokens (the pipeline's 512 is [dev]'s). A config without `guidance_embeds` is
    # [schnell]'s, as diffusers' FluxTransformer2DModel defaults it to False.
    vae = {"block_out_channels": [128, 256, 512, 512]}

    def flux(name: str, **transformer: object) -> Backbone:
        return detect_backbone(str(_config_only_pipeline(tmp_path / name, "FluxPipeline", "transformer", 128, vae,
                                                         **transformer)))

    dev = flux("dev", guidance_embeds=True)
    assert (dev.sampling, dev.call_kwargs) == (SamplingDefaults(50, 3.5, 1024), {})
    for schnell in (flux("schnell", guidance_embeds=False), flux("no_key")):
        assert (schnell.name, schnell.trainable) == ("flux", True)
        assert schnell.sampling == SamplingDefaults(4, 0.0, 1024)
        assert schnell.call_kwargs == {"max_sequence_length": 256}


def test_a_pipeline_whose_call_names_no_steps_or_guidance_samples_30_steps_without_guidance(tmp_path, monkeypatch):
    # The generic family's fallbacks: 30 steps (T2I-CompBench's count) and guidance 1.0 (none); a pipeline whose
    # __init__ takes no safety checker is given no safety-checker arguments, nor a call argument it lacks.
    import diffusers

    class StepFreePipeline:
        def __init__(self, unet, scheduler):
            pass

        def __call__(self, prompt, height=None, width=None):
            pass

    monkeypatch.setattr(diffusers, "StepFreePipeline", StepFreePipeline, raising=False)
    model = _config_only_pipeline(tmp_path / "free", "StepFreePipeline", "unet", 32, {"block_out_channels": [1, 2]})
    backbone = detect_backbone(str(model))
    assert (backbone.name, backbone.trainable) == ("pipeline", False)
    assert backbone.sampling == SamplingDefaults(30, 1.0, 64)
    assert backbone.pipeline_kwargs == {} and backbone.call_kwargs == {}


def test_configs_without_a_sample_size_or_vae_levels_are_taken_for_stable_diffusions(tmp_path: Path) -> None:
    # A denoiser config without `sample_size` is read as 64 latent pixels, a VAE config without its levels as 4 (8x
    # downsampling): Stable Diffusion's 512 px.
    model = _config_only_pipeline(tmp_path / "bare", "StableDiffusionPipeline", "unet", 64, {})
    (model / "unet" / "config.json").write_text("{}")
    assert detect_backbone(str(model)).sampling.resolution == 512


@pytest.mark.parametrize("index", [{}, {"_class_name": ["diffusers", "StableDiffusionPipeline"]}, {"_class_name": None}])
def test_a_model_index_naming_no_pipeline_class_is_a_clear_error(tmp_path: Path, index: dict) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names no pipeline class \(`_class_name`\); it is not a diffusers pipeline"):
        detect_backbone(str(tmp_path))
