"""Loading the Stable Diffusion pipeline that generates samples (SD 1.x and 2.x)."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator

from gors.core.hub import from_pretrained

# The scheduler `load_pipeline` sets, by its diffusers class name (recorded in a sample store's settings).
SCHEDULER = "DDIMScheduler"


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
):
    """A `StableDiffusionPipeline` with a DDIM scheduler (the T2I-CompBench sampling protocol).

    `lora`: a folder with a diffusers-format LoRA (e.g. a gors run folder) to load on top.

    The safety checker is not loaded: it replaces flagged images with black ones, which would
    silently become low-reward samples.
    """
    import diffusers
    from diffusers import StableDiffusionPipeline

    pipeline = from_pretrained(
        StableDiffusionPipeline.from_pretrained,
        pretrained_model_name_or_path,
        "--pretrained_model_name_or_path",
        revision=revision,
        dtype=dtype,
        safety_checker=None,
        requires_safety_checker=False,
    )
    pipeline.scheduler = getattr(diffusers, SCHEDULER).from_config(pipeline.scheduler.config)
    if lora is not None:
        pipeline.load_lora_weights(lora)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def pipeline_settings(
    pretrained_model_name_or_path: str | None,
    dtype: torch.dtype,
    revision: str | None = None,
    lora: str | None = None,
) -> dict[str, Any]:
    """What `load_pipeline` with these arguments generates with, as a sample store records it."""
    return {
        "model": pretrained_model_name_or_path,
        "revision": revision,
        "lora": lora,
        "scheduler": SCHEDULER,
        "dtype": str(dtype).removeprefix("torch."),
    }


def cpu_generators(seeds: list[int]) -> list[torch.Generator]:
    """One generator per image, on the CPU so an image depends on its seed and not on the device."""
    return [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
