"""Scoring overlapped with generation (`gors run --overlap_scoring`) against generating, then scoring.

Same pipeline, same B-VQA reward, same prompts and seeds, in one process, interleaved and
repeated (`common.paired_ratios`); the script prints the min and median of the paired ratios
reference time / overlapped time and whether the two give the same score rows.

- **Reference**: the two stages one after the other, as `gors run` runs them without the flag and
  as T2I-CompBench runs its sampling script and then its B-VQA script: `generate_samples` into a
  new sample store, then `score_samples` over it (each image read back from its PNG).
- **gors, overlapped**: `generate_samples` with a `BackgroundScorer` as its sink, the reward
  already built on both sides (its load is not timed), so each generated batch is scored on a
  second thread (on a GPU on its own CUDA stream) while the next one generates.

What it can gain: at most the shorter stage's time, when the device has room for both (a GPU that
the denoiser's batch does not fill); on a CPU whose cores both stages already use, the two threads
share the cores and little or nothing is gained. Agreement: the score rows of the two, compared
exactly (same batches, same images).

Sizes. By default (a CPU): generation at `train_step.py`'s reduced SD-2-base (widths / 4) at
128 px, 10 DDIM steps, 8 images per pipeline call; B-VQA with BLIP ViT-B/16's real widths at
480 px, 2 of 12 vision and text layers (`b_vqa_passes.save_model`), 8 images per reward call (the
scorer starts on a full batch: a batch of all 16 images would start only after generation ended,
which the runs of 2026-12-01 and 2026-12-04 did, so that they measured no overlap at all).
`--full-size`: SD-2-base at 512 px (float16) and the full 12 + 12-layer BLIP (float32, as the
official B-VQA runs), 50 DDIM steps, the training samples' of the paper's run that `cost_model.py`
prices (GORS' `inference.py` default; T2I-CompBench's evaluation samples 30, which would leave
scoring a larger share to overlap) (a GPU).

    python benchmarks/overlap.py                          # CPU, a few minutes
    python benchmarks/overlap.py --device cuda --full-size --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from b_vqa_passes import save_model
from common import SpeedResult, checked_device, paired_ratios, positive_int, print_table, refuse_halved
from generation import PROMPTS, write_sd2_base_folder

IMAGES_PER_PROMPT = 4


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    parser = argparse.ArgumentParser(prog="overlap.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed pairs")
    parser.add_argument("--full-size", action="store_true", help="SD-2-base at 512 px and the 12 + 12-layer BLIP")
    parser.add_argument("--steps", type=int, default=None, help="DDIM steps; default 10 (CPU) / 50 (--full-size)")
    parser.add_argument("--generation_batch_size", type=int, default=8)
    # No larger than a generation batch: scoring starts with a full batch (or at generation's end), and a batch
    # holding all the images would only start once generation is done, leaving nothing to overlap.
    parser.add_argument("--reward_batch_size", type=int, default=8)
    args = parser.parse_args(argv)
    device = checked_device(parser, args)
    steps = args.steps or (50 if args.full_size else 10)
    resolution = 512 if args.full_size else 128
    generation_dtype = torch.float16 if device.type == "cuda" else torch.float32

    from gors.core.background_scoring import BackgroundScorer
    from gors.core.distributed import make_accelerator, reset_process_state
    from gors.core.memory import BatchLimit
    from gors.core.pipeline import load_pipeline
    from gors.core.sampling import SamplingProtocol, generate_samples
    from gors.core.scoring import open_score_folder, read_score_rows, score_samples
    from gors.core.store import SampleStore
    from rewards.b_vqa import BVQAReward

    protocol = SamplingProtocol(images_per_prompt=IMAGES_PER_PROMPT, num_inference_steps=steps, guidance_scale=7.5,
                                resolution=resolution, batch_size=args.generation_batch_size, seed=42)
    with tempfile.TemporaryDirectory(prefix="overlap_") as tmp:
        root = Path(tmp)
        log("[overlap] building the models with random weights ...")
        write_sd2_base_folder(root / "sd", device, generation_dtype, seed=0, reduced=not args.full_size)
        layers = 12 if args.full_size else 2
        counts = save_model(root / "blip", layers, layers)
        pipeline = load_pipeline(str(root / "sd"), device, generation_dtype)
        reward = BVQAReward(model_name_or_path=str(root / "blip"), device=device, torch_dtype=torch.float32,
                            batch_size=args.reward_batch_size, noun_phrase_backend="builtin")
        reset_process_state()
        accelerator = make_accelerator()
        calls = {"reference": 0, "gors": 0}

        def generate(name: str, sink=None) -> tuple[SampleStore, Path]:
            run = root / f"{name}-{calls[name]}"
            calls[name] += 1
            store = SampleStore(run / "samples")
            limit = BatchLimit()
            generate_samples(store, PROMPTS, protocol, lambda: pipeline, accelerator, desc=f"generate ({name})",
                             sink=sink, limit=limit)
            refuse_halved(limit.size, "overlap", f"--generation_batch_size {args.generation_batch_size}",
                          "lower --generation_batch_size")
            return store, run / "scores"

        def reward_batch_fit(went_on_at: int | None) -> None:
            refuse_halved(went_on_at, "overlap", f"--reward_batch_size {args.reward_batch_size}",
                          "lower --reward_batch_size")

        def run_reference() -> dict:
            with contextlib.redirect_stdout(sys.stderr):
                store, scores = generate("reference")
                limit = BatchLimit()
                rows = score_samples(store, scores, lambda: reward, args.reward_batch_size, accelerator, limit=limit)
                reward_batch_fit(limit.size)
                return rows

        def run_overlapped() -> dict:
            with contextlib.redirect_stdout(sys.stderr):
                run = root / f"gors-{calls['gors']}"
                open_score_folder(run / "scores", [], accelerator)
                scorer = BackgroundScorer(run / "scores", lambda: reward, args.reward_batch_size,
                                          accelerator.process_index, device)
                try:
                    store, scores = generate("gors", sink=scorer)
                finally:
                    scorer.close()
                reward_batch_fit(None if scorer.batch_size == args.reward_batch_size else scorer.batch_size)
                return read_score_rows(scores, store.records())

        ratios, expected, overlapped = paired_ratios(run_reference, run_overlapped, device, args.repeats)
        # The images' hashes and folders differ between the two runs' stores; their scores must not.
        strip = lambda rows: {key: {k: v for k, v in row.items() if k not in ("path", "image_sha256")}  # noqa: E731
                              for key, row in rows.items()}
        if set(expected) != set(overlapped):
            raise SystemExit(f"[overlap] the overlapped run scored {len(overlapped)} images, the plain run "
                             f"{len(expected)}: not the same images")
        same = strip(expected) == strip(overlapped)
        differences = [abs(expected[key]["reward"] - overlapped[key]["reward"]) for key in expected]
        agreement = "identical score rows" if same else f"max |reward difference| {max(differences):.1e}"
        if max(differences, default=0.0) > 1e-6:
            raise SystemExit(f"[overlap] the overlapped run's scores are not the plain run's ({agreement})")
        log(f"[overlap] {len(expected)} images; ratios {', '.join(f'{r:.2f}' for r in ratios)}; {agreement}")
        for path in root.glob("*-*"):
            shutil.rmtree(path)
        reset_process_state()
    sd = "SD-2-base" if args.full_size else "SD-2-base widths / 4"
    sizes = (f"{sd} at {resolution} px, {steps} DDIM steps, batch {args.generation_batch_size}, "
             f"{str(generation_dtype).removeprefix('torch.')}; B-VQA BLIP ViT-B/16 widths at 480 px, {layers} + "
             f"{layers} layers ({sum(counts.values()) / 1e6:.0f} M), batch {args.reward_batch_size}; "
             f"{len(PROMPTS) * IMAGES_PER_PROMPT} images, {device.type}")
    return [SpeedResult("generate + score, overlapped", "gors run without --overlap_scoring: gors' generation, "
                        "then gors' B-VQA scoring (gors against itself)", sizes, ratios, agreement)]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
