"""The cost model of a whole GORS run on this machine: a calibration `gors run`, then `gors estimate`.

Issue #13's third part asks for the GPU-hours of the paper's colour run (700 prompts x 90 images, 50
DDIM steps, B-VQA, 15 000 steps of batch 16) for gors and for the official procedures, stage by
stage, measured on the user's hardware. This script makes that one command on a machine without
the real weights (the GPU machines lent to this project have no internet): it writes SD-2-base's and
BLIP VQA's real architectures with random weights (their compute is that of the real models; only
what the images show differs), runs a short calibration `gors run` on them as a user would on the
real ones, and prints `gors estimate`'s table for the paper's run.

- **Calibration** (`gors run`, one process): 4 colour prompts x 8 images (`--images_per_prompt`), 50
  DDIM steps at 512 px in batches of 8 (`gors run`'s default) in fp16, as T2I-CompBench samples; B-VQA
  with the 12 + 12-layer BLIP at 480 px; the top half of the images selected (`--select_top_fraction
  0.5`: a random-weight reward's scores do not meet tau, and which images train does not change a
  step's cost); 50 training steps of batch 2 (GORS' per-GPU batch; `--train_batch_size` for another) with both LoRAs in fp16 (gors'
  default on a GPU; GORS' own script trained in fp32, which the training ratio's reference does), one checkpoint at the end and no validation, as `gors estimate` asks of a calibration.
- **Official column**: gors' per-unit time multiplied by gors' speed over the official procedure per
  stage. `--speedups FILE.json` takes the ratios from `python -m benchmarks --output FILE.md` run on
  the same machine (each row that prices a stage of the estimate: B-VQA for score, training with
  both LoRAs for train, generation for generate; the median of its paired ratios); without it,
  `gors estimate`'s defaults, measured on 2 CPU cores, and its note says so.

Without `--full-size` (a CPU) the models are `train_step.py`'s reduced SD-2-base (widths / 4) at
128 px with 10 DDIM steps, BLIP's 2 + 2 layers, 10 training steps in fp32: minutes, a check that
the path works, not a cost model of real hardware.

    python benchmarks/cost_model.py                                    # CPU, reduced sizes, a few minutes
    python -m benchmarks --device cuda --full-size --output speed.md   # the GPU's own ratios (speed.json)
    python benchmarks/cost_model.py --device cuda --full-size --speedups speed.json --output cost.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
from b_vqa_passes import save_model
from common import checked_device, machine, positive_int
from generation import PROMPTS, write_sd2_base_folder

from gors.estimate import speed_table_ratios, speed_table_train_batch

REPO = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measured_speedups(paths: list[str]) -> dict[str, float]:
    """Per `gors estimate` stage, the ratio that prices it in `python -m benchmarks`' JSON files
    (`gors.estimate.speed_table_ratios`; a later file wins)."""
    speedups: dict[str, float] = {}
    for path in paths:
        try:
            speedups |= speed_table_ratios(path)
        except ValueError as error:
            raise SystemExit(f"--speedups {error}") from None
    return speedups


def other_machines(paths: list[str], here: str) -> list[str]:
    """"FILE (MACHINE)" for each of `paths` measured on another processor or GPU than `here` (`common.machine`'s
    name, before its library versions): its ratios price this machine's calibration with another's speed."""
    found = []
    for path in paths:
        measured = str(json.loads(Path(path).read_text(encoding="utf-8")).get("machine") or "an unrecorded machine")
        if measured.split(";")[0] != here.split(";")[0]:
            found.append(f"{path} ({measured.split(';')[0]})")
    return found


def training_batch(paths: list[str]) -> int | None:
    """gors' per-process batch in the row that prices training in the last of `paths` holding one
    (`gors.estimate.speed_table_train_batch`); None when none prices training."""
    batches = [batch for batch in map(speed_table_train_batch, paths) if batch is not None]
    return batches[-1] if batches else None


def gors(*args: str, devices: str | None = None) -> str:
    """Run `gors ARGS` in a child process (as a user would), on CUDA devices `devices` (CUDA_VISIBLE_DEVICES;
    None: as this process), echoing its output; returns its stdout."""
    command = [sys.executable, "-c", "from gors.cli import main; main()", *args]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    log(f"[cost_model] gors {' '.join(args)}")
    result = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    sys.stderr.write(result.stdout)
    if result.returncode != 0:
        raise SystemExit(f"[cost_model] `gors {args[0]}` failed with exit status {result.returncode}")
    return result.stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cost_model.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--full-size", action="store_true",
                        help="SD-2-base at 512 px and the 12 + 12-layer BLIP VQA (a GPU)")
    parser.add_argument("--images_per_prompt", type=positive_int, default=8, help=f"of {len(PROMPTS)} prompts")
    parser.add_argument("--max_train_steps", type=positive_int, default=None, help="default 50 (full) / 10")
    parser.add_argument("--train_batch_size", type=positive_int, default=2,
                        help="the calibration's batch (one process); GORS trains 2 per GPU x 8 GPUs, and one GPU at 16 "
                             "trains the same global batch. Price it with `python -m benchmarks --only train_step "
                             "--gors_batch_size` of the same size")
    parser.add_argument("--speedups", nargs="*", default=[],
                        help="`python -m benchmarks --output X.md`'s X.json, measured on this machine")
    parser.add_argument("--output", default=None,
                        help="also write the estimate to this markdown file, and the calibration's timings beside it "
                             "(X.timings.json: `gors estimate X.timings.json` prices it again)")
    parser.add_argument("--keep", default=None, help="calibrate in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    device = checked_device(parser, args)
    speedups = measured_speedups(args.speedups)
    priced_batch = training_batch(args.speedups)
    if priced_batch is not None and priced_batch != args.train_batch_size:
        parser.error(f"--speedups prices training with gors at batch {priced_batch}, but the calibration trains at "
                     f"--train_batch_size {args.train_batch_size}: measure train_step with --gors_batch_size "
                     f"{args.train_batch_size}, or calibrate at {priced_batch}")
    if priced_batch is None and args.train_batch_size != 2:  # gors estimate's default ratio is of gors at 2
        parser.error(f"--train_batch_size {args.train_batch_size} needs its training ratio: pass --speedups with "
                     f"the JSON of `python -m benchmarks --only train_step --gors_batch_size {args.train_batch_size}`")
    cuda = device.type == "cuda"
    steps, resolution = (50, 512) if args.full_size else (10, 128)
    train_steps = args.max_train_steps or (50 if args.full_size else 10)
    layers = 12 if args.full_size else 2

    with tempfile.TemporaryDirectory(prefix="cost_model_") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        log("[cost_model] writing the models with random weights ...")
        write_sd2_base_folder(root / "sd", device, torch.float16 if cuda else torch.float32, seed=0,
                              reduced=not args.full_size)
        if cuda:
            torch.cuda.empty_cache()  # the builder's copy: the run loads its own
        counts = save_model(root / "blip", layers, layers)
        (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
        run = root / "run"
        flags = [
            "--pretrained_model_name_or_path", str(root / "sd"), "--train_prompts", str(root / "prompts.txt"),
            "--category", "color", "--output_dir", str(run), "--resolution", str(resolution),
            "--images_per_prompt", str(args.images_per_prompt), "--num_inference_steps", str(steps),
            "--reward", "b_vqa", "--reward_model_name_or_path", str(root / "blip"),
            "--reward_options", '{"noun_phrase_backend": "builtin"}', "--select_top_fraction", "0.5",
            "--max_train_steps", str(train_steps), "--train_batch_size", str(args.train_batch_size),
            "--checkpointing_steps", str(train_steps), "--mixed_precision", "fp16" if cuda else "no",
        ]
        # The device asked for: its index alone visible, or none for the CPU.
        gors("run", *flags, devices=(None if device.index is None else str(device.index)) if cuda else "")
        if args.output:  # kept at once: a run cut short before the estimate can be estimated again offline
            shutil.copy(run / "timings.json", Path(args.output).with_suffix(".timings.json"))
        estimate = gors("estimate", str(run), *(["--reference_speedups", json.dumps(speedups)] if speedups else []))

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    sd = "SD-2-base" if args.full_size else "SD-2-base widths / 4, text encoder 3 of 23 layers"
    source = (f"official / gors per unit from {', '.join(args.speedups)}: {json.dumps(speedups)}" if speedups
              else "official / gors per unit: gors estimate's defaults (2 CPU cores)")
    elsewhere = other_machines(args.speedups, machine(str(device)))
    if elsewhere:  # said in the table itself: a mixed estimate must not pass for one machine's
        source += (f". Measured on another machine: {', '.join(elsewhere)}, so the official column prices this "
                   "machine's work with that machine's speed ratios")
    text = "\n".join([
        f"Measured {when} on {machine(str(device))}. Calibration: `gors run` with random weights of "
        f"{sd} at {resolution} px ({steps} DDIM steps, {len(PROMPTS)} prompts x {args.images_per_prompt} images, "
        f"batch 8) and B-VQA's BLIP at 480 px ({layers} + {layers} layers, {sum(counts.values()) / 1e6:.0f} M), "
        f"{train_steps} training steps of batch {args.train_batch_size} with both LoRAs, {'fp16' if cuda else 'fp32'}; {source}.",
        "", estimate.strip()])
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
