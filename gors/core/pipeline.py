"""Loading the text-to-image pipeline that generates samples: any diffusers pipeline, by its model family."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator

from gors.core.backbones import FAMILIES, Backbone, check_lora_fits, detect_backbone, half_precision_warning
from gors.core.hub import from_pretrained

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

logger = logging.getLogger(__name__)

# What a store records when the family samples with the checkpoint's own scheduler.
CHECKPOINT_SCHEDULER = "the checkpoint's"


def inference_dtype(accelerator: Accelerator, mixed_precision: str | None) -> torch.dtype:
    """fp16/bf16 on GPU when asked (or when the accelerate config says so); fp32 on CPU."""
    precision = mixed_precision or accelerator.mixed_precision
    if accelerator.device.type != "cuda":
        return torch.float32
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)


def load_pipeline(
    pretrained_model_name_or_path: str,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    revision: str | None = None,
    lora: str | None = None,
    backbone: Backbone | None = None,
    torch_compile: str = "no",
) -> DiffusionPipeline:
    """The checkpoint's diffusers pipeline, with its family's sampler (`gors.core.backbones`).

    Stable Diffusion 1/2 samples with DDIM (the T2I-CompBench protocol) and without its safety
    checker, which replaces flagged images with black ones that would silently become low-reward
    samples; other families keep the checkpoint's own scheduler. `lora`: a folder with a
    diffusers-format LoRA (e.g. a gors run folder) loaded on top. `backbone`: the family when it
    is already known (it is read from `model_index.json` otherwise). `torch_compile`: a
    `torch.compile` backend for the denoiser (`compile_module`), "no" for none.
    """
    import diffusers

    backbone = backbone or detect_backbone(pretrained_model_name_or_path, revision)
    warning = half_precision_warning(backbone, dtype)
    if warning is not None:
        logger.warning(warning)
    if lora is not None:
        check_lora_fits(pretrained_model_name_or_path, lora, revision)  # before any weights load
    pipeline_class = getattr(diffusers, backbone.pipeline_class)
    pipeline = from_pretrained(pipeline_class.from_pretrained, pretrained_model_name_or_path,
                               "--pretrained_model_name_or_path", revision=revision, dtype=dtype,
                               **backbone.pipeline_kwargs)
    if backbone.sampling.scheduler is not None:
        pipeline.scheduler = getattr(diffusers, backbone.sampling.scheduler).from_config(pipeline.scheduler.config)
    if lora is not None:
        pipeline.load_lora_weights(lora)
    pipeline.set_progress_bar_config(disable=True)
    pipeline = pipeline.to(device)
    if torch_compile != "no":
        denoiser = getattr(pipeline, "unet", None) or getattr(pipeline, "transformer", None)
        if denoiser is None:
            raise ValueError(f"--torch_compile={torch_compile!r}: a {backbone.pipeline_class} has no unet or "
                             "transformer to compile; generate without the flag")
        compile_module(denoiser, torch_compile)
    return pipeline


def compile_module(module: torch.nn.Module, backend: str) -> None:
    """`torch.compile` the module in place with `backend` ("no": leave it as it is).

    In place (`nn.Module.compile`), not wrapped: its class, state-dict keys and LoRA file names stay
    the same, so saving adapters, DDP and pipelines see the module they know. Call it after the
    adapters are added: the graph is traced on the first call.
    """
    if backend != "no":
        module.compile(backend=backend)


def pipeline_settings(
    pretrained_model_name_or_path: str | None,
    dtype: torch.dtype,
    revision: str | None = None,
    lora: str | None = None,
    backbone: Backbone | None = None,
) -> dict[str, Any]:
    """What `load_pipeline` with these arguments generates with, as a sample store records it
    (`backbone` None: Stable Diffusion 1/2, or a pipeline in memory)."""
    scheduler = (backbone or FAMILIES["StableDiffusionPipeline"]).sampling.scheduler
    return {
        "model": pretrained_model_name_or_path,
        "revision": revision,
        "lora": lora,
        "scheduler": scheduler or CHECKPOINT_SCHEDULER,
        "dtype": str(dtype).removeprefix("torch."),
    }


def cpu_generators(seeds: list[int]) -> list[torch.Generator]:
    """One generator per image, on the CPU so an image depends on its seed and not on the device."""
    return [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
