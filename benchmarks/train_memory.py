"""Step time and peak GPU memory of one GORS LoRA training step, per model family, at the real sizes.

For SD 2 base, SDXL base 1.0, SD3.5 Medium and FLUX.1 [dev], each at its recipe resolution
(512 / 1024 / 1024 / 1024 px) and batch 1, this script builds the family's real diffusers /
transformers classes from the published configs written below (random weights, built on the
device in bf16, nothing downloaded or written but the small config files), and times gors' own
training step: the family from `gors.families.resolve_training`, LoRA from `gors.lora.add_lora`
on the family's denoiser targets (adapters in fp32, as the trainer keeps them), the loss from the
family's `encode` / `condition` / `sample_noise` / `loss`, then backward, gradient clipping and an
AdamW step through Accelerate as `gors train` runs them. Each family runs with and without
gradient checkpointing, and with and without cached text embeddings (cached: the frozen text
encoders run once before timing and are deleted, T5 included, so they are not in memory while
training; not cached: they stay on the device and run every step).

    python benchmarks/train_memory.py --device cuda                     # all four families
    python benchmarks/train_memory.py --device cuda --families sd3,flux --checkpointing on
    python benchmarks/train_memory.py --tiny --device cpu --steps 2 --warmup 1   # smoke run, CPU

Peak memory is `torch.cuda.max_memory_allocated()` over the warm-up and timed steps (the peak
statistics are reset once the models are on the device and any text encodings are cached), so it
counts weights, adapters, optimizer state, activations and gradients, not the one-off prompt
encoding, the allocator's cached-but-free blocks (the `reserved` figure shows those) or the CUDA
context (a few hundred MiB more in `nvidia-smi`). The VAE is not on the device: the trainer
encodes the latents once and moves the VAE to the CPU before training, so only its latent shape
and scaling are used here. Only the denoiser trains (no text-encoder LoRA, which SD 2 and SDXL
enable by default in `gors train`): a trained encoder could not be cached.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from gors.config import TrainConfig
from gors.core.backbones import check_trainable, detect_backbone, read_model_index
from gors.families import Batch, TrainingFamily, resolve_training
from gors.lora import add_lora, lora_parameters
from gors.sd2_architecture import SD2_BASE_TEXT_ENCODER_CONFIG, SD2_BASE_UNET_CONFIG
from gors.testing.flux import flux_scheduler_config

GIB = 2**30

# ----- published configs ------------------------------------------------------------------------
# Values from each Hub repository's `<component>/config.json` (`scheduler/scheduler_config.json`).
# Keys left out take the class defaults, which the published files also leave implicit or equal.
# Token ids of the CLIP configs are left at the defaults: they only choose which position pools.

# openai/clip-vit-large-patch14's text tower: stabilityai/stable-diffusion-xl-base-1.0
# text_encoder/config.json (CLIPTextModel), the same tower as stable-diffusion-3.5-medium
# text_encoder (CLIPTextModelWithProjection) and FLUX.1-dev text_encoder (CLIPTextModel).
CLIP_L = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "hidden_act": "quick_gelu", "projection_dim": 768, "vocab_size": 49408, "max_position_embeddings": 77,
          "layer_norm_eps": 1e-05}
# OpenCLIP ViT-bigG/14's text tower: stable-diffusion-xl-base-1.0 text_encoder_2/config.json
# (CLIPTextModelWithProjection), also stable-diffusion-3.5-medium text_encoder_2.
CLIP_G = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
          "hidden_act": "gelu", "projection_dim": 1280, "vocab_size": 49408, "max_position_embeddings": 77,
          "layer_norm_eps": 1e-05}
# google/t5-v1_1-xxl's encoder: stable-diffusion-3.5-medium text_encoder_3/config.json and
# FLUX.1-dev text_encoder_2/config.json (T5EncoderModel).
T5_XXL = {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
          "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32,
          "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-06, "dropout_rate": 0.1,
          "tie_word_embeddings": False}
# The 8x KL autoencoder's geometry (block_out_channels: 3 downsamplings), shared by all four;
# latent channels and scaling differ. Only these numbers are used: the VAE is not built.
_VAE_BLOCKS = {"block_out_channels": [128, 256, 512, 512],
               "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
               "layers_per_block": 2}
# SD 1/2's DDPM betas (stable-diffusion-2-base scheduler/scheduler_config.json, a PNDMScheduler;
# stable-diffusion-xl-base-1.0's EulerDiscreteScheduler has the same betas).
_SD_BETAS = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
             "prediction_type": "epsilon", "steps_offset": 1, "set_alpha_to_one": False, "skip_prk_steps": True,
             "clip_sample": False}


@dataclass(frozen=True)
class Component:
    library: str
    class_name: str
    config: dict[str, Any] | None = None  # None: listed in model_index.json, never built (tokenizers)


@dataclass(frozen=True)
class ModelSpec:
    label: str
    pipeline_class: str
    components: dict[str, Component]


SPECS: dict[str, ModelSpec] = {
    # stabilityai/stable-diffusion-2-base: unet/config.json and text_encoder/config.json as written in
    # gors.sd2_architecture (the OpenCLIP ViT-H text tower, 23 layers); vae/config.json (scaling_factor
    # 0.18215: diffusers' default, which that file leaves implicit); scheduler (PNDMScheduler).
    "sd": ModelSpec("SD 2 base", "StableDiffusionPipeline", {
        "unet": Component("diffusers", "UNet2DConditionModel", SD2_BASE_UNET_CONFIG),
        "text_encoder": Component("transformers", "CLIPTextModel", SD2_BASE_TEXT_ENCODER_CONFIG),
        "tokenizer": Component("transformers", "CLIPTokenizer"),
        "vae": Component("diffusers", "AutoencoderKL", {**_VAE_BLOCKS, "latent_channels": 4, "scaling_factor": 0.18215}),
        "scheduler": Component("diffusers", "PNDMScheduler", _SD_BETAS),
    }),
    # stabilityai/stable-diffusion-xl-base-1.0: unet/config.json (2.6 B parameters), text_encoder
    # (CLIP-L), text_encoder_2 (bigG, with projection), vae/config.json, scheduler (EulerDiscreteScheduler).
    "sdxl": ModelSpec("SDXL base 1.0", "StableDiffusionXLPipeline", {
        "unet": Component("diffusers", "UNet2DConditionModel", {
            "act_fn": "silu", "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64,
            "addition_time_embed_dim": 256, "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280],
            "center_input_sample": False, "cross_attention_dim": 2048,
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "layers_per_block": 2,
            "mid_block_type": "UNetMidBlock2DCrossAttn", "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4,
            "projection_class_embeddings_input_dim": 2816, "sample_size": 128,
            "transformer_layers_per_block": [1, 2, 10],
            "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], "use_linear_projection": True,
        }),
        "text_encoder": Component("transformers", "CLIPTextModel", CLIP_L),
        "text_encoder_2": Component("transformers", "CLIPTextModelWithProjection", CLIP_G),
        "tokenizer": Component("transformers", "CLIPTokenizer"),
        "tokenizer_2": Component("transformers", "CLIPTokenizer"),
        "vae": Component("diffusers", "AutoencoderKL", {**_VAE_BLOCKS, "latent_channels": 4, "scaling_factor": 0.13025}),
        "scheduler": Component("diffusers", "EulerDiscreteScheduler",
                               {**_SD_BETAS, "interpolation_type": "linear", "timestep_spacing": "leading"}),
    }),
    # stabilityai/stable-diffusion-3.5-medium: transformer/config.json (SD3Transformer2DModel, MMDiT-X:
    # dual attention in blocks 0-12, RMS q/k norm), text_encoder (CLIP-L) and text_encoder_2 (bigG), both
    # CLIPTextModelWithProjection, text_encoder_3 (T5-XXL encoder), vae/config.json (16 channels,
    # no quant convs), scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler, shift 3).
    "sd3": ModelSpec("SD3.5 Medium", "StableDiffusion3Pipeline", {
        "transformer": Component("diffusers", "SD3Transformer2DModel", {
            "sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24, "attention_head_dim": 64,
            "num_attention_heads": 24, "joint_attention_dim": 4096, "caption_projection_dim": 1536,
            "pooled_projection_dim": 2048, "out_channels": 16, "pos_embed_max_size": 384,
            "dual_attention_layers": list(range(13)), "qk_norm": "rms_norm",
        }),
        "text_encoder": Component("transformers", "CLIPTextModelWithProjection", CLIP_L),
        "text_encoder_2": Component("transformers", "CLIPTextModelWithProjection", CLIP_G),
        "text_encoder_3": Component("transformers", "T5EncoderModel", T5_XXL),
        "tokenizer": Component("transformers", "CLIPTokenizer"),
        "tokenizer_2": Component("transformers", "CLIPTokenizer"),
        "tokenizer_3": Component("transformers", "T5TokenizerFast"),
        "vae": Component("diffusers", "AutoencoderKL", {**_VAE_BLOCKS, "latent_channels": 16, "scaling_factor": 1.5305,
                                                        "shift_factor": 0.0609, "use_quant_conv": False,
                                                        "use_post_quant_conv": False}),
        "scheduler": Component("diffusers", "FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 3.0}),
    }),
    # black-forest-labs/FLUX.1-dev: transformer/config.json (FluxTransformer2DModel, 19 double- and 38
    # single-stream blocks, 24 heads of 128, guidance embedding), text_encoder (CLIP-L, CLIPTextModel),
    # text_encoder_2 (T5-XXL encoder), vae/config.json (16 channels, no quant convs),
    # scheduler/scheduler_config.json (as gors.testing.flux writes it).
    "flux": ModelSpec("FLUX.1 [dev]", "FluxPipeline", {
        "transformer": Component("diffusers", "FluxTransformer2DModel", {
            "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
            "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
            "guidance_embeds": True, "axes_dims_rope": [16, 56, 56],
        }),
        "text_encoder": Component("transformers", "CLIPTextModel", CLIP_L),
        "text_encoder_2": Component("transformers", "T5EncoderModel", T5_XXL),
        "tokenizer": Component("transformers", "CLIPTokenizer"),
        "tokenizer_2": Component("transformers", "T5TokenizerFast"),
        "vae": Component("diffusers", "AutoencoderKL", {**_VAE_BLOCKS, "latent_channels": 16, "scaling_factor": 0.3611,
                                                        "shift_factor": 0.1159, "use_quant_conv": False,
                                                        "use_post_quant_conv": False}),
        "scheduler": Component("diffusers", "FlowMatchEulerDiscreteScheduler", flux_scheduler_config()),
    }),
}

# Peak-memory targets quoted in the issue, in decimal GB, and the settings they assume.
TARGETS: dict[str, tuple[float, bool]] = {  # family -> (GB, needs gradient checkpointing)
    "sd3": (40.0, False),  # SD3.5 Medium LoRA at 1024 px
    "flux": (80.0, True),  # FLUX.1 LoRA at 1024 px, one GPU, bf16 and gradient checkpointing
}


def write_config_folder(spec: ModelSpec, folder: Path) -> Path:
    """A diffusers pipeline folder holding only configs: `model_index.json` and each built component's
    `config.json` (`scheduler_config.json`), a few KiB in all. gors reads the family from it
    (`detect_backbone`), FLUX.1's guidance input from the transformer's config and the noise
    schedule from the scheduler's (`TrainingFamily.load_scheduler`), as from a real checkpoint."""
    index = {"_class_name": spec.pipeline_class}
    for name, component in spec.components.items():
        index[name] = [component.library, component.class_name]
        if component.config is not None:
            (folder / name).mkdir(parents=True)
            file = "scheduler_config.json" if name == "scheduler" else "config.json"
            (folder / name / file).write_text(json.dumps({"_class_name": component.class_name, **component.config}))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def build_tiny_folder(family: str, folder: Path) -> Path:
    """The tiny test pipeline of `gors.testing` for `family` (its configs are read; its weights are not)."""
    testing = importlib.import_module(f"gors.testing.{family}")
    getattr(testing, f"build_tiny_{family}_pipeline")(folder)
    return folder


def component_config(folder: Path, component: str) -> dict[str, Any]:
    return json.loads((folder / component / "config.json").read_text())


def build(folder: Path, component: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A component with random weights, from its config in `folder`, on `device`, frozen, in `dtype`.

    The trainer reads its base weights straight in the mixed-precision dtype (`GORSTrainer._load_frozen`);
    random weights are initialised here in fp32 and then cast. The fp32 copy exists only while building:
    the peak memory measured is reset after the models are built.
    """
    library, class_name = read_model_index(str(folder))[component]
    cls = getattr(importlib.import_module(library), class_name)
    config = component_config(folder, component)
    with torch.device(device):
        model = cls.from_config(config) if library == "diffusers" else cls(cls.config_class.from_dict(config))
    model.requires_grad_(False).eval()  # eval: as from_pretrained leaves it; the trainer puts the denoiser in train()
    return model.to(dtype=dtype) if dtype != torch.float32 else model


def count(parameters) -> str:
    n = sum(p.numel() for p in parameters)
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n / 1e3:.1f} k"


def token_ids(family: TrainingFamily, encoder, config: dict[str, Any], generator: torch.Generator) -> torch.Tensor:
    """Random ids (1, L) at the length the family pads to: the tokenizers are not needed for the cost."""
    tokenizer = SimpleNamespace(model_max_length=config.get("max_position_embeddings", 77))
    length = family.max_length(encoder, tokenizer)
    return torch.randint(0, config["vocab_size"], (1, length), generator=generator)


# ----- one configuration ------------------------------------------------------------------------
@dataclass
class Result:
    family: str
    label: str
    resolution: int
    checkpointing: bool
    cached: bool
    times: list[float] = field(default_factory=list)
    peak: int | None = None  # bytes allocated
    reserved: int | None = None
    resident: int | None = None  # allocated before the first step: weights and adapters
    error: str | None = None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(folder: Path, tiny: bool, checkpointing: bool, cached: bool,
            encodings: dict[str, dict[str, torch.Tensor]] | None, args, accelerator, result: Result) -> None:
    """Build the trainable set-up of one configuration and time its training steps into `result`."""
    device = torch.device(args.device)
    weight_dtype = {"bf16": torch.bfloat16, "no": torch.float32}[args.mixed_precision]
    config, family = training_family(folder, tiny, checkpointing, cached, args)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    # The models, as GORSTrainer._setup_models sets them up.
    scheduler = family.load_scheduler()
    vae_config = SimpleNamespace(**component_config(folder, "vae"))
    denoiser = build(folder, family.denoiser, device, weight_dtype)
    encoders = {e.component: build(folder, e.component, device, weight_dtype) for e in family.text_encoders
                if not cached}
    tokens = {e.component: token_ids(family, e, component_config(folder, e.component), generator)
              for e in family.text_encoders if not cached}
    add_lora(denoiser, family.denoiser_lora_targets, config.rank)
    params = lora_parameters(denoiser)
    for param in params:
        param.data = param.data.float()  # adapters train in fp32 under mixed precision
    if checkpointing:
        denoiser.enable_gradient_checkpointing()
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                  weight_decay=config.adam_weight_decay, eps=config.adam_epsilon)
    denoiser, optimizer = accelerator.prepare(denoiser, optimizer)  # bf16 autocast on the denoiser's forward
    denoiser.train()

    # One cached sample: the VAE posterior of a `resolution` image, in the denoiser's latent space.
    scale = 2 ** (len(vae_config.block_out_channels) - 1)
    side = config.resolution // scale
    mean = torch.randn(1, vae_config.latent_channels, side, side, generator=generator)
    std = torch.full_like(mean, 0.05)
    rewards = torch.ones(1)
    original_size = torch.tensor([[config.resolution, config.resolution]])
    crop_top_left = torch.zeros(1, 2, dtype=torch.long)
    prompts = torch.tensor([0])

    def step(check_gradients: bool) -> None:
        # GORSTrainer._micro_batch_loss, then the body of its training loop (one micro-batch per update).
        with accelerator.accumulate(denoiser):
            sample = mean.to(device) + std.to(device) * torch.randn_like(mean.to(device))
            latents = family.scale_latents(sample, vae_config)
            noise, position = family.sample_noise(latents, scheduler)
            conditioning_outputs = {}
            for encoder in family.text_encoders:
                name = encoder.component
                if cached:
                    conditioning_outputs[name] = {k: v[prompts].to(device) for k, v in encodings[name].items()}
                else:  # frozen: no parameter needs a gradient, so no graph is kept (the trainer adds no no_grad)
                    conditioning_outputs[name] = family.encode(encoder, encoders[name], tokens[name][prompts].to(device))
            batch = Batch(latents, rewards.to(device), original_size.to(device), crop_top_left.to(device))
            conditioning = family.condition(conditioning_outputs, batch, weight_dtype)
            loss = family.loss(denoiser, scheduler, batch, conditioning, noise, position, weight_dtype)
            accelerator.backward(loss)
            if check_gradients and any(p.grad is None for p in params):
                missing = sum(p.grad is None for p in params)
                raise RuntimeError(f"{missing} of {len(params)} LoRA tensors got no gradient")
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    frozen = [p for name, p in denoiser.named_parameters() if "lora_" not in name]
    print(f"  {result.label}, {config.resolution} px, gradient checkpointing {'on' if checkpointing else 'off'}, "
          f"text embeddings {'cached' if cached else 'computed each step'}: denoiser {count(frozen)} "
          f"parameters + LoRA {count(params)}"
          + "".join(f", {name} {count(model.parameters())}" for name, model in encoders.items()), file=sys.stderr, flush=True)
    synchronize(device)
    if device.type == "cuda":
        result.resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(args.warmup + args.steps):
        synchronize(device)
        start = time.perf_counter()
        step(check_gradients=i == 0)
        synchronize(device)
        if i >= args.warmup:
            result.times.append(time.perf_counter() - start)
    if device.type == "cuda":
        result.peak = torch.cuda.max_memory_allocated(device)
        result.reserved = torch.cuda.max_memory_reserved(device)


def training_family(folder: Path, tiny: bool, checkpointing: bool, cached: bool, args) -> tuple[TrainConfig, TrainingFamily]:
    """gors' resolved training config and family for the folder, as `GORSTrainer.__init__` makes them."""
    backbone = detect_backbone(str(folder))
    check_trainable(backbone, str(folder))
    config = TrainConfig(
        pretrained_model_name_or_path=str(folder), output_dir=str(folder / "run"), mixed_precision=args.mixed_precision,
        resolution=args.resolution or (32 if tiny else None), train_batch_size=1, rank=args.rank,
        train_text_encoder=False, gradient_checkpointing=checkpointing, cache_text_embeddings=cached,
        report_to="none",
    )
    return resolve_training(config, backbone)


@torch.no_grad()
def cache_encodings(folder: Path, tiny: bool, args) -> dict[str, dict[str, torch.Tensor]]:
    """Every frozen encoder's outputs for the one prompt, computed once, one encoder in memory at a time
    (as GORSTrainer._cached_encoding: built, run, deleted; the outputs kept on the CPU)."""
    device = torch.device(args.device)
    weight_dtype = {"bf16": torch.bfloat16, "no": torch.float32}[args.mixed_precision]
    _, family = training_family(folder, tiny, checkpointing=False, cached=True, args=args)
    generator = torch.Generator().manual_seed(args.seed)
    cached = {}
    for encoder in family.text_encoders:
        ids = token_ids(family, encoder, component_config(folder, encoder.component), generator)
        model = build(folder, encoder.component, device, weight_dtype)
        cached[encoder.component] = {k: v.cpu() for k, v in family.encode(encoder, model, ids.to(device)).items()}
        del model  # T5-XXL (4.8 B parameters) goes as soon as its outputs exist
        free(device)
    return cached


class _QuietCast(logging.Filter):
    """Drops diffusers' warning on `ModelMixin.to(dtype)`, which `build` casts with; it fires even when no
    module has to stay in fp32 (`... kept in float32: []`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "should be kept in float32: []" not in record.getMessage()


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----- the table --------------------------------------------------------------------------------
def target_cell(result: Result, tiny: bool) -> str:
    if result.family not in TARGETS:
        return ""
    gb, needs_checkpointing = TARGETS[result.family]
    if tiny:
        return f"< {gb:.0f} GB (real size only)"
    if needs_checkpointing and not result.checkpointing:
        return f"< {gb:.0f} GB with checkpointing"
    if result.peak is None:
        return f"< {gb:.0f} GB"
    return f"< {gb:.0f} GB: {'met' if result.peak < gb * 1e9 else 'NOT met'}"


def table(results: list[Result], tiny: bool) -> str:
    lines = ["| family | px | grad checkpointing | cached embeddings | step s (min / median) | "
             "peak GiB (allocated / reserved) | resident GiB | target |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.error is not None:
            timing, peak, resident = r.error, "", ""
        else:
            timing = f"{min(r.times):.3f} / {statistics.median(r.times):.3f}"
            peak = "n/a (CPU)" if r.peak is None else f"{r.peak / GIB:.1f} / {r.reserved / GIB:.1f}"
            resident = "n/a (CPU)" if r.resident is None else f"{r.resident / GIB:.1f}"
        lines.append(f"| {r.label} | {r.resolution} | {'on' if r.checkpointing else 'off'} | "
                     f"{'yes' if r.cached else 'no'} | {timing} | {peak} | {resident} | {target_cell(r, tiny)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--families", default="sd,sdxl,sd3,flux", help="comma-separated: sd, sdxl, sd3, flux")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny test models of gors.testing instead of the real sizes (runs on a CPU)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first allocates AdamW's state)")
    parser.add_argument("--checkpointing", choices=["both", "on", "off"], default="both",
                        help="gradient checkpointing of the denoiser")
    parser.add_argument("--cached", choices=["both", "on", "off"], default="both",
                        help="cached text embeddings (on) or the frozen encoders run every step (off)")
    parser.add_argument("--resolution", type=int, help="image side in px; default: each family's (tiny: 32)")
    parser.add_argument("--rank", type=int, default=4, help="LoRA rank (gors' default: 4)")
    parser.add_argument("--mixed_precision", choices=["bf16", "no"], default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    families = [name.strip() for name in args.families.split(",") if name.strip()]
    unknown = sorted(set(families) - set(SPECS))
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here (pass --tiny --device cpu for the smoke run)")
    if device.type != "cuda" and not args.tiny:
        parser.error(f"--device {args.device}: the real-size models (up to 12 B parameters, plus T5-XXL) need a CUDA "
                     "GPU and peak memory is measured on one; pass --tiny to run the tiny models on this device")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # Accelerate and the allocator statistics follow the current device
    from accelerate import Accelerator

    logging.getLogger("diffusers.models.modeling_utils").addFilter(_QuietCast())

    # One Accelerator for every configuration, as a training run has; free_memory() drops what it prepared.
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=args.mixed_precision, device_placement=False)
    checkpointing = {"both": [True, False], "on": [True], "off": [False]}[args.checkpointing]
    cached_settings = {"both": [True, False], "on": [True], "off": [False]}[args.cached]

    results: list[Result] = []
    for name in families:
        spec = SPECS[name]
        label = f"tiny {name}" if args.tiny else spec.label
        with tempfile.TemporaryDirectory(prefix=f"train_memory_{name}_") as tmp:
            folder = build_tiny_folder(name, Path(tmp)) if args.tiny else write_config_folder(spec, Path(tmp))
            print(f"{label}:", file=sys.stderr, flush=True)
            encodings = cache_encodings(folder, args.tiny, args) if True in cached_settings else None
            for gc_on in checkpointing:
                for cached in cached_settings:
                    _, family = training_family(folder, args.tiny, gc_on, cached, args)
                    result = Result(name, label, family.settings["resolution"], gc_on, cached)
                    try:
                        measure(folder, args.tiny, gc_on, cached, encodings, args, accelerator, result)
                    except torch.cuda.OutOfMemoryError:
                        result.error = "out of memory"
                    except Exception as err:  # noqa: BLE001  (reported in the table; the other configurations still run)
                        traceback.print_exc()
                        result.error = f"error: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
                    finally:
                        accelerator.free_memory()
                        free(device)
                    results.append(result)
                    # The rows so far, as they come: a run stopped at a time limit keeps what it measured.
                    print(table(results, args.tiny), file=sys.stderr, flush=True)
            del encodings
            free(device)

    where = f"{torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU"
    sizes = "tiny test models" if args.tiny else "real architectures, random weights"
    print(f"\nGORS LoRA training step, batch 1, rank {args.rank}, {args.mixed_precision}, {sizes}, on {where}; "
          f"{args.warmup} warm-up + {args.steps} timed steps per row\n")
    print(table(results, args.tiny))
    if any(r.error is not None and r.error != "out of memory" for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
