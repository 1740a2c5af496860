"""Generation: gors' `generate_samples` against plain `StableDiffusionPipeline` calls, same prompts and seeds.

One batch of 8 images (4 prompts x 2 images), DDIM 30 steps, guidance 7.5, each image with its own
CPU `torch.Generator` seeded as gors seeds it (`sample_seed`: base seed 42 + 100 000 x prompt
index + image index), in one process, interleaved and repeated (`common.paired_ratios`); the script
prints the min and median of the paired ratios reference time / gors time and whether the two
give the same pixels.

- **Reference**: T2I-CompBench's sampling (`GORS_finetune/inference_eval.py`, read as facts, not
  copied): `StableDiffusionPipeline.from_pretrained` with `DDIMScheduler.from_pretrained(...,
  subfolder="scheduler")`, then a plain pipeline call per batch (here the batch of 8 prompts with a
  list of 8 generators instead of its one generator per batch, so that each image has its own seed
  as in gors) and `image.save(...png)` per image.
- **gors**: `gors.core.sampling.generate_samples` into a new sample store per batch, the pipeline
  from `gors.core.pipeline.load_pipeline` (DDIM from the checkpoint's scheduler config, no safety
  checker): the store's bookkeeping (settings, prompts, the records already there), the same
  pipeline call under `torch.inference_mode()` (the reference under the pipeline's own `no_grad`:
  on the tiny pipeline, 2 % apart, within the noise), an atomic PNG write and a metadata line per
  image.

Both pipelines load from the same folder before timing (the load is not timed on either side:
`generate_samples`' loader hands it the pipeline already loaded), with the progress bar off on
both. Agreement: the uint8 pixels of gors' stored PNGs against the reference's images (max
absolute difference; 0 is pixel-identical).

Sizes. By default (a CPU): the tiny SD pipeline of `gors.testing.sd` (real diffusers and
transformers classes: a 2-level U-Net of widths 32 and 64, a 2-layer CLIP text encoder of width 32,
a 2-level VAE) at 32 px, float32. The models being the same on both sides, the ratio measures what
each procedure adds around the pipeline call, which weighs more at this size than at 512 px.
`--full-size`: SD-2-base's real U-Net, text encoder and VAE (`gors.sd2_architecture` and the
configs of `train_memory.py`) at 512 px with random weights, saved and loaded in float16 by
default, as T2I-CompBench samples (a GPU).

    python benchmarks/generation.py                      # CPU, tiny pipeline, under a minute
    python benchmarks/generation.py --device cuda --full-size --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import SpeedResult, checked_device, paired_ratios, print_table
from train_memory import SPECS

from gors.core.store import sample_seed

PROMPTS = ["a red apple and a green bowl", "a blue car and a yellow house", "a white cat on a black sofa",
           "a brown dog and an orange ball"]
IMAGES_PER_PROMPT = 2
BASE_SEED = 42


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def millions(module: torch.nn.Module) -> str:
    n = sum(p.numel() for p in module.parameters())
    return f"{n / 1e6:.0f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"


def write_sd2_base_folder(folder: Path, device: torch.device, dtype: torch.dtype, seed: int) -> Path:
    """SD-2-base's architecture with random weights, saved as a pipeline folder (weights in `dtype`)."""
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from gors.sd2_architecture import SD2_BASE_TEXT_ENCODER_CONFIG, SD2_BASE_UNET_CONFIG
    from gors.testing.sd import write_clip_tokenizer_files

    torch.manual_seed(seed)
    with torch.device(device):
        unet = UNet2DConditionModel.from_config(SD2_BASE_UNET_CONFIG)
        text_encoder = CLIPTextModel(CLIPTextConfig(**SD2_BASE_TEXT_ENCODER_CONFIG))
        vae = AutoencoderKL.from_config(SPECS["sd"].components["vae"].config)
    files = write_clip_tokenizer_files(folder.parent / "_clip_files")
    tokenizer = CLIPTokenizer(str(files / "vocab.json"), str(files / "merges.txt"), model_max_length=77)
    pipeline = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
        scheduler=PNDMScheduler.from_config(SPECS["sd"].components["scheduler"].config),  # as SD-2-base ships
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipeline.to(dtype=dtype).save_pretrained(folder)
    return folder


def reference_pipeline(folder: Path, device: torch.device, dtype: torch.dtype):
    """The pipeline as T2I-CompBench's sampling script loads it."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    scheduler = DDIMScheduler.from_pretrained(str(folder), subfolder="scheduler")
    pipeline = StableDiffusionPipeline.from_pretrained(str(folder), scheduler=scheduler, dtype=dtype,
                                                       safety_checker=None, requires_safety_checker=False)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    parser = argparse.ArgumentParser(prog="generation.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed pairs of batches")
    parser.add_argument("--full-size", action="store_true", help="SD-2-base's real architecture at 512 px")
    parser.add_argument("--resolution", type=int, default=None, help="image side; default 32 (tiny) / 512 (full)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="default: float16 on a GPU (as T2I-CompBench samples), float32 on a CPU")
    parser.add_argument("--steps", type=int, default=30, help="DDIM steps (T2I-CompBench: 30)")
    parser.add_argument("--guidance", type=float, default=7.5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    device = checked_device(parser, args)
    dtype = getattr(torch, args.dtype or ("float16" if device.type == "cuda" else "float32"))
    resolution = args.resolution or (512 if args.full_size else 32)

    from gors.core.distributed import make_accelerator, reset_process_state
    from gors.core.pipeline import load_pipeline
    from gors.core.sampling import SamplingProtocol, generate_samples
    from gors.core.store import SampleStore
    from gors.testing.sd import build_tiny_sd_pipeline

    batch = [(p, i) for p in range(len(PROMPTS)) for i in range(IMAGES_PER_PROMPT)]
    prompts = [PROMPTS[p] for p, _ in batch]
    seeds = [sample_seed(BASE_SEED, p, i) for p, i in batch]
    protocol = SamplingProtocol(images_per_prompt=IMAGES_PER_PROMPT, num_inference_steps=args.steps,
                                guidance_scale=args.guidance, resolution=resolution, batch_size=len(batch),
                                seed=BASE_SEED)
    with tempfile.TemporaryDirectory(prefix="generation_") as tmp:
        root = Path(tmp)
        folder = root / "model"
        if args.full_size:
            log(f"[generation] building SD-2-base with random weights on {device} ...")
            write_sd2_base_folder(folder, device, dtype, args.seed)
            label = "SD-2-base"
        else:
            build_tiny_sd_pipeline(folder, seed=args.seed, resolution=resolution)
            label = "tiny SD (gors.testing.sd)"
        reference = reference_pipeline(folder, device, dtype)
        ours = load_pipeline(str(folder), device, dtype)
        size_text = (f"{label}: U-Net {millions(ours.unet)}, text encoder {millions(ours.text_encoder)}, VAE "
                     f"{millions(ours.vae)}; {resolution} px, {args.steps} DDIM steps, guidance {args.guidance}, "
                     f"batch {len(batch)}, {str(dtype).removeprefix('torch.')}, {device.type}")
        reset_process_state()
        accelerator = make_accelerator()
        calls = {"reference": 0, "gors": 0}

        def run_reference() -> list:
            out = root / f"reference-{calls['reference']}"
            out.mkdir()
            calls["reference"] += 1
            images = reference(prompts, height=resolution, width=resolution, num_inference_steps=args.steps,
                               guidance_scale=args.guidance,
                               generator=[torch.Generator("cpu").manual_seed(s) for s in seeds]).images
            for (p, i), image in zip(batch, images):
                image.save(out / f"{PROMPTS[p]}_{i:06d}.png")
            return images

        def run_gors() -> SampleStore:
            store = SampleStore(root / f"gors-{calls['gors']}" / "samples")
            calls["gors"] += 1
            with contextlib.redirect_stdout(sys.stderr):  # its "[generate] ..." line, off the table's stdout
                generate_samples(store, PROMPTS, protocol, lambda: ours, accelerator, desc="generate (gors)")
            return store

        ratios, reference_images, store = paired_ratios(run_reference, run_gors, device, args.repeats)
        # The last batch of each, compared after the timing: the reference's images as its call returned
        # them, gors' as read back from its store's PNG files.
        reference_pixels = [pixels(image) for image in reference_images]
        gors_pixels = [pixels(store.open_image(record)) for record in store.records()]
        for name in ("reference", "gors"):
            for path in root.glob(f"{name}-*"):
                shutil.rmtree(path)
        difference = max(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
                         for a, b in zip(reference_pixels, gors_pixels, strict=True))
        agreement = "pixel-identical" if difference == 0 else f"max pixel difference {difference} / 255"
        log(f"[generation] {len(batch)} images, max |reference - gors| of the uint8 pixels: {difference}; ratios "
            f"{', '.join(f'{r:.2f}' for r in ratios)}")
        reset_process_state()
    return [SpeedResult("generation, DDIM 30 steps, batch 8" if args.steps == 30 else
                        f"generation, DDIM {args.steps} steps, batch 8",
                        "plain `StableDiffusionPipeline` calls with per-image generators, PNGs saved",
                        size_text, ratios, agreement)]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
