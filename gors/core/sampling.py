"""Sampling a prompt set into a sample store: k images per prompt, resumable, sharded over processes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from accelerate import Accelerator

from gors.core.distributed import batches, progress_bar
from gors.core.pipeline import cpu_generators
from gors.core.store import SampleStore, StoreError, sample_file_name, sample_key, sample_seed

logger = logging.getLogger(__name__)


def _check_same_prompts(store: SampleStore, prompts: list[str]) -> None:
    """Refuse to mix samples of two prompt sets in one store."""
    for record in store.records():
        index = record["prompt_index"]
        if index >= len(prompts) or prompts[index] != record["prompt"]:
            found = prompts[index] if index < len(prompts) else "<no such prompt>"
            raise StoreError(
                f"{store.root} holds samples of another prompt set (prompt {index}: {record['prompt']!r}, "
                f"now {found!r}). Use a new --output_dir, or the --train_prompts that made this store."
            )


@dataclass(frozen=True)
class SamplingProtocol:
    """How images are generated: k per prompt, sampler settings, and the seed of each image."""

    images_per_prompt: int
    num_inference_steps: int
    guidance_scale: float
    resolution: int
    batch_size: int = 8
    seed: int = 42
    seed_fn: Callable[[int, int, int], int] = sample_seed  # (base seed, prompt index, image index) -> seed


def generate_samples(
    store: SampleStore,
    prompts: list[str],
    protocol: SamplingProtocol,
    pipeline_loader: Callable[[], Any],
    accelerator: Accelerator,
    prompt_info: dict[str, Any] | None = None,
    record_extras: dict[str, Any] | None = None,
    desc: str = "generate",
) -> SampleStore:
    """Add the missing images of `protocol` for `prompts` to `store`, sharded over processes.

    Resumable: samples already in the store are skipped, so a rerun after an interruption only
    generates what is missing. The pipeline is loaded (by `pipeline_loader`) only if there is work.
    """
    _check_same_prompts(store, prompts)  # on every process, so all of them stop on a mismatch
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        dropped = store.drop_records_without_image()
        if dropped:
            logger.warning("%d records had no image file and will be generated again", dropped)
        store.save_prompts({**(prompt_info or {}), "prompts": prompts})
    accelerator.wait_for_everyone()

    done = {sample_key(record) for record in store.records()}
    todo = [(p, i) for p in range(len(prompts)) for i in range(protocol.images_per_prompt) if (p, i) not in done]
    if accelerator.is_main_process:
        print(f"[{desc}] {len(done)} samples exist, {len(todo)} to generate into {store.root}")

    # A contiguous share per process; an image depends only on its seed, not on the process that makes it.
    with accelerator.split_between_processes(todo) as mine:
        if mine:
            pipeline = pipeline_loader()
            bar = progress_bar(len(mine), accelerator, desc)
            for batch in batches(mine, protocol.batch_size):
                seeds = [protocol.seed_fn(protocol.seed, p, i) for p, i in batch]
                with torch.inference_mode():
                    images = pipeline(
                        prompt=[prompts[p] for p, _ in batch],
                        height=protocol.resolution,
                        width=protocol.resolution,
                        num_inference_steps=protocol.num_inference_steps,
                        guidance_scale=protocol.guidance_scale,
                        generator=cpu_generators(seeds),
                    ).images
                for (p, i), seed, image in zip(batch, seeds, images):
                    record = {
                        "file_name": sample_file_name(p, i),
                        "prompt": prompts[p],
                        "prompt_index": p,
                        "image_index": i,
                        "seed": seed,
                        "num_inference_steps": protocol.num_inference_steps,
                        "guidance_scale": protocol.guidance_scale,
                        "resolution": protocol.resolution,
                    }
                    store.append(accelerator.process_index, image, {**record, **(record_extras or {})})
                bar.update(len(batch))
            bar.close()
    accelerator.wait_for_everyone()
    return store
