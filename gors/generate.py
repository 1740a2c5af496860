"""Stage 1, `gors generate`: k images per training prompt into the sample store."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from accelerate import Accelerator

from gors.config import GenerateConfig
from gors.distributed import batches, make_accelerator, my_share, progress_bar
from gors.pipeline import cpu_generators, inference_dtype, load_pipeline
from gors.prompts import load_prompts
from gors.store import SampleStore, StoreError, sample_file_name, sample_key, sample_seed

logger = logging.getLogger(__name__)


def samples_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "samples"


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


def generate(config: GenerateConfig, accelerator: Accelerator | None = None) -> SampleStore:
    """Generate the missing images of `config.images_per_prompt` per prompt; returns the store.

    Resumable: samples already in the store are skipped, so a rerun after an interruption only
    generates what is missing. Runs sharded over all Accelerate processes.
    """
    accelerator = accelerator or make_accelerator()
    prompt_set = load_prompts(config.train_prompts)
    prompts = prompt_set.prompts[: config.max_prompts]
    store = SampleStore(samples_dir(config.output_dir))

    _check_same_prompts(store, prompts)  # on every process, so all of them stop on a mismatch
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        dropped = store.drop_records_without_image()
        if dropped:
            logger.warning("%d records had no image file and will be generated again", dropped)
        store.save_prompts(
            {"name": prompt_set.name, "category": prompt_set.category, "source": prompt_set.source, "prompts": prompts}
        )
    accelerator.wait_for_everyone()

    done = {sample_key(record) for record in store.records()}
    todo = [(p, i) for p in range(len(prompts)) for i in range(config.images_per_prompt) if (p, i) not in done]
    mine = my_share(todo, accelerator)
    if accelerator.is_main_process:
        print(f"[generate] {len(done)} samples exist, {len(todo)} to generate into {store.root}")

    if mine:
        dtype = inference_dtype(accelerator, config.mixed_precision)
        pipeline = load_pipeline(config.pretrained_model_name_or_path, accelerator.device, dtype, config.revision)
        bar = progress_bar(len(mine), accelerator, "generate")
        for batch in batches(mine, config.generation_batch_size):
            seeds = [sample_seed(config.seed, p, i) for p, i in batch]
            with torch.inference_mode():
                images = pipeline(
                    prompt=[prompts[p] for p, _ in batch],
                    height=config.resolution,
                    width=config.resolution,
                    num_inference_steps=config.num_inference_steps,
                    guidance_scale=config.guidance_scale,
                    generator=cpu_generators(seeds),
                ).images
            for (p, i), seed, image in zip(batch, seeds, images):
                store.append(
                    accelerator.process_index,
                    image,
                    {
                        "file_name": sample_file_name(p, i),
                        "prompt": prompts[p],
                        "prompt_index": p,
                        "image_index": i,
                        "seed": seed,
                        "model": config.pretrained_model_name_or_path,
                        "num_inference_steps": config.num_inference_steps,
                        "guidance_scale": config.guidance_scale,
                        "resolution": config.resolution,
                    },
                )
            bar.update(len(batch))
        bar.close()
    accelerator.wait_for_everyone()
    return store

