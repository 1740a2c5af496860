"""Generation: gors' `generate_samples` against plain `StableDiffusionPipeline` calls, same prompts and seeds.

8 images (4 prompts x 2 images), DDIM 30 steps, guidance 7.5, each image with its own CPU
`torch.Generator` seeded as gors seeds it (`sample_seed`: base seed 42 + 100 000 x prompt index +
image index), in one process, interleaved and repeated (`common.paired_ratios`); the script prints
the min and median of the paired ratios reference time / gors time and whether the two give the
same pixels.

- **Reference**: T2I-CompBench's sampling (`GORS_finetune/inference_eval.py`, read as facts, not
  copied): `StableDiffusionPipeline.from_pretrained` with `DDIMScheduler.from_pretrained(...,
  subfolder="scheduler")` (in float16 on a GPU), then one plain pipeline call per image, its
  default `--batch_size 1`, each call with a generator of its own seed, and `image.save(...png)`
  per image. `--reference_batch_size N` calls it with N images at once (there: N copies of one
  prompt and one generator per call; here a list of N generators, so that each image keeps its seed).
  As the script, each prompt's images are also saved as one grid PNG. Its generators are CUDA ones
  on a GPU; here they draw on the CPU as gors' do, so that the two give the same images.
- **gors**: `gors.core.sampling.generate_samples` into a new sample store, 8 images per pipeline
  call (`--generation_batch_size`'s default), the pipeline from `gors.core.pipeline.load_pipeline`
  (DDIM from the checkpoint's scheduler config, no safety checker; `--torch_compile` compiles its
  U-Net, as the flag of the same name does): the store's bookkeeping (settings, prompts, the records
  already there), the pipeline call under `torch.inference_mode()` (the reference under the
  pipeline's own `no_grad`: on the tiny pipeline, 2 % apart, within the noise), an atomic PNG write
  and a metadata line per image.

Both pipelines load from the same folder before timing (the load is not timed on either side:
`generate_samples`' loader hands it the pipeline already loaded; with `--torch_compile` the first
untimed pair compiles), with the progress bar off on both. Agreement: the uint8 pixels of gors'
stored PNGs against the reference's images (max absolute difference; 0 is pixel-identical; a
batch of 8 and 8 batches of 1 may round a pixel apart).

Sizes. By default (a CPU): the tiny SD pipeline of `gors.testing.sd` (real diffusers and
transformers classes: a 2-level U-Net of widths 32 and 64, a 2-layer CLIP text encoder of width 32,
a 2-level VAE) at 32 px, float32. The models being the same on both sides, the ratio measures what
each procedure adds around the pipeline call, which weighs more at this size than at 512 px.
`--full-size`: SD-2-base's real U-Net, text encoder and VAE (`gors.sd2_architecture` and the
configs of `train_memory.py`) at 512 px with random weights, saved and loaded in float16 by
default, as T2I-CompBench samples (a GPU).

    python benchmarks/generation.py                      # CPU, tiny pipeline, under a minute
    python benchmarks/generation.py --reduced --steps 10 --repeats 3   # CPU, SD-2-base widths / 4, minutes
    python benchmarks/generation.py --device cuda --full-size --repeats 5 [--torch_compile inductor]
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
from common import SpeedResult, checked_device, paired_ratios, positive_int, print_table, refuse_halved
from PIL import Image
from train_memory import SPECS
from train_step import sizes_for

from gors.core.store import sample_seed
from gors.estimate import GENERATION_RATIO_BATCH

PROMPTS = ["a red apple and a green bowl", "a blue car and a yellow house", "a white cat on a black sofa",
           "a brown dog and an orange ball"]
IMAGES_PER_PROMPT = GENERATION_RATIO_BATCH // len(PROMPTS)  # one gors batch, the one gors estimate assumes
BASE_SEED = 42


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def millions(module: torch.nn.Module) -> str:
    n = sum(p.numel() for p in module.parameters())
    return f"{n / 1e6:.0f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"


# Largest uint8 difference between the reference's and gors' images of one seed that still counts
# as the same sample: float rounding (float32; half precision rounds more and compounds over steps: the
# H200 measured 2 at full size). Each gors image must also be nearer its own reference than any other.
PIXEL_TOLERANCE, HALF_PIXEL_TOLERANCE = 2, 16


def write_sd2_base_folder(folder: Path, device: torch.device, dtype: torch.dtype, seed: int, reduced: bool) -> Path:
    """SD-2-base's architecture with random weights, saved as a pipeline folder (weights in `dtype`);
    `reduced`: `train_step.py`'s reduction (widths / 4, text encoder 3 of 23 layers)."""
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from gors.testing.sd import write_clip_tokenizer_files

    sizes = sizes_for(full_size=not reduced, resolution=None)
    torch.manual_seed(seed)
    with torch.device(device):
        unet = UNet2DConditionModel.from_config(sizes.unet)
        text_encoder = CLIPTextModel(CLIPTextConfig(**sizes.text_encoder))
        vae = AutoencoderKL.from_config(sizes.vae)
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


def column(images: list[Image.Image]) -> Image.Image:
    """The images one under another: T2I-CompBench's per-prompt grid at its batch of 1 (a row per iteration)."""
    width, height = images[0].size
    grid = Image.new("RGB", (width, height * len(images)))
    for row, image in enumerate(images):
        grid.paste(image, (0, row * height))
    return grid


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    parser = argparse.ArgumentParser(prog="generation.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed pairs of batches")
    parser.add_argument("--full-size", action="store_true", help="SD-2-base's real architecture at 512 px")
    parser.add_argument("--reduced", action="store_true",
                        help="SD-2-base's shape at widths / 4 (as train_step.py) at 128 px: a CPU-sized model whose "
                             "compute, not Python, dominates")
    parser.add_argument("--resolution", type=int, default=None,
                        help="image side; default 32 (tiny) / 128 (reduced) / 512 (full)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="default: float16 on a GPU (as T2I-CompBench samples), float32 on a CPU")
    parser.add_argument("--steps", type=int, default=30, help="DDIM steps (T2I-CompBench: 30)")
    parser.add_argument("--guidance", type=float, default=7.5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--reference_batch_size", type=int, default=1,
                        help="images per reference pipeline call (T2I-CompBench's default: 1)")
    parser.add_argument("--torch_compile", default="no", help="gors' torch.compile backend for the U-Net")
    args = parser.parse_args(argv)
    device = checked_device(parser, args)
    dtype = getattr(torch, args.dtype or ("float16" if device.type == "cuda" else "float32"))
    if args.full_size and args.reduced:
        parser.error("--full-size and --reduced: choose one")
    resolution = args.resolution or (512 if args.full_size else 128 if args.reduced else 32)

    from gors.core.distributed import make_accelerator, reset_process_state
    from gors.core.memory import BatchLimit
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
        if args.full_size or args.reduced:
            label = "SD-2-base" if args.full_size else "SD-2-base shape, widths / 4, text encoder 3 of 23 layers"
            log(f"[generation] building {label} with random weights on {device} ...")
            write_sd2_base_folder(folder, device, dtype, args.seed, reduced=args.reduced)
        else:
            build_tiny_sd_pipeline(folder, seed=args.seed, resolution=resolution)
            label = "tiny SD (gors.testing.sd)"
        reference = reference_pipeline(folder, device, dtype)
        ours = load_pipeline(str(folder), device, dtype, torch_compile=args.torch_compile)
        size_text = (f"{label}: U-Net {millions(ours.unet)}, text encoder {millions(ours.text_encoder)}, VAE "
                     f"{millions(ours.vae)}; {resolution} px, {args.steps} DDIM steps, guidance {args.guidance}, "
                     f"gors batch {len(batch)}, reference batch {args.reference_batch_size}, "
                     f"{str(dtype).removeprefix('torch.')}, {device.type}"
                     + ("" if args.torch_compile == "no" else f", gors' U-Net compiled ({args.torch_compile})"))
        reset_process_state()
        accelerator = make_accelerator()
        calls = {"reference": 0, "gors": 0}

        def run_reference() -> list:
            out = root / f"reference-{calls['reference']}"
            out.mkdir()
            calls["reference"] += 1
            images = []
            for start in range(0, len(batch), args.reference_batch_size):
                end = start + args.reference_batch_size
                images += reference(prompts[start:end], height=resolution, width=resolution,
                                    num_inference_steps=args.steps, guidance_scale=args.guidance,
                                    generator=[torch.Generator("cpu").manual_seed(s) for s in seeds[start:end]]).images
            for (p, i), image in zip(batch, images):
                image.save(out / f"{PROMPTS[p]}_{i:06d}.png")
            for p, prompt in enumerate(PROMPTS):  # and, as the official script, each prompt's images as one grid
                column(images[p * IMAGES_PER_PROMPT:(p + 1) * IMAGES_PER_PROMPT]).save(out / f"{prompt}-grid.png")
            return images

        def run_gors() -> SampleStore:
            store = SampleStore(root / f"gors-{calls['gors']}" / "samples")
            calls["gors"] += 1
            limit = BatchLimit()
            with contextlib.redirect_stdout(sys.stderr):  # its "[generate] ..." line, off the table's stdout
                generate_samples(store, PROMPTS, protocol, lambda: ours, accelerator, desc="generate (gors)",
                                 limit=limit)
            refuse_halved(limit.size, "generation", f"gors' batch of {len(batch)} images",
                          "lower --resolution or use a device with more free memory")
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
        # Batching moves float rounding by a level or two; a wrong seed moves pixels by ~200, a wrong prompt on
        # random weights by ~30: each image must also be nearer its own reference than any other image's.
        tolerance = PIXEL_TOLERANCE if dtype == torch.float32 else HALF_PIXEL_TOLERANCE
        if difference > tolerance:
            raise SystemExit(f"[generation] gors' images differ from the reference's by up to {difference} / 255, "
                             f"more than {tolerance}: they are not the same samples")
        mean_distance = [[float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()) for a in reference_pixels]
                         for b in gors_pixels]
        astray = [i for i, row in enumerate(mean_distance) if len(row) > 1 and int(np.argmin(row)) != i]
        if astray:
            raise SystemExit(f"[generation] gors' images {astray} are nearer another reference image than their own: "
                             "they are not the same samples")
        log(f"[generation] {len(batch)} images, max |reference - gors| of the uint8 pixels: {difference}; ratios "
            f"{', '.join(f'{r:.2f}' for r in ratios)}")
        reset_process_state()
    return [SpeedResult(f"generation, DDIM {args.steps} steps, 8 images",
                        f"T2I-CompBench's sampling: plain `StableDiffusionPipeline` calls of {args.reference_batch_size} "
                        "image(s), a generator per image, PNGs saved", size_text, ratios, agreement,
                        "generate")]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
