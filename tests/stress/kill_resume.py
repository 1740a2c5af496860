"""Random `kill -9`s across every stage of `gors run`, each followed by a resume; nothing may be lost.

    python tests/stress/kill_resume.py --faults 30            # 2 processes, the packaged toy model

A reference run goes uninterrupted first. Then, `--faults` times, a fresh run folder is started
with the same command and every process of it (the launcher and its workers) is SIGKILLed, as a
power cut would, at a random moment (0 to 1.5 s) after the run enters a stage: generate, score,
select and train in turn (a run that finishes first is not a fault and is started again); then the
same command is run again until it succeeds (it resumes: `--resume_from_checkpoint latest`). Each resumed folder is
compared with the reference:

- lost: samples or scores of the reference missing from the resumed folder;
- duplicated: a sample recorded twice (a line of two `metadata.jsonl` files, or of one);
- identical: every image, score, the selection and the final LoRA equal the reference's, bit for bit.

Generation runs one image per pipeline call (`--generation_batch_size 1`): an image generated
in another batch can differ by 1/255 in a few pixels on a CPU (see docs/run_folders.md, "Output layout"), and
the point here is whether anything is lost or repeated, not which batch an image lands in.
Prints one line per fault and the summary "faults N, resumed N, lost 0, duplicated 0, results
identical N". Not part of `make test`: it takes about 30 s per fault on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gors.core.toy import PRETRAINED_DIR  # noqa: E402

STAGES = ("generate", "score", "select", "train")


def command(run_dir: Path, processes: int) -> list[str]:
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", "0"]
    launch += ["--multi_gpu", "--num_processes", str(processes)] if processes > 1 else ["--num_processes", "1"]
    return launch + [
        "-m", "gors.cli", "run", "--output_dir", str(run_dir),
        "--pretrained_model_name_or_path", str(PRETRAINED_DIR / "pipeline"), "--train_prompts", "toy:train",
        "--max_prompts", "6", "--images_per_prompt", "4", "--num_inference_steps", "10", "--guidance_scale", "4.0",
        "--resolution", "64", "--generation_batch_size", "1", "--category", "toy", "--reward_threshold", "0.5",
        "--reward_batch_size", "4", "--train_batch_size", "4", "--max_train_steps", "12", "--checkpointing_steps", "3",
        "--checkpoints_total_limit", "2", "--learning_rate", "1e-3", "--no_sample_latents", "--report_to", "none",
        "--seed", "0", "--resume_from_checkpoint", "latest",
    ]


def environment() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=str(REPO))


def kill_all(process: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process below it (torchrun's workers run in their own sessions)."""
    try:
        victims = psutil.Process(process.pid).children(recursive=True) + [psutil.Process(process.pid)]
    except psutil.NoSuchProcess:
        return
    for victim in victims:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=30)


def run_to_end(run_dir: Path, processes: int, log: Path) -> float:
    start = time.time()
    with open(log, "a") as out:
        result = subprocess.run(command(run_dir, processes), env=environment(), stdout=out, stderr=out, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{run_dir}: the run failed (exit {result.returncode}); see {log}")
    return time.time() - start


def stage_reached(run_dir: Path) -> str:
    """The stage a killed run was in, judged from what it left behind."""
    if (run_dir / "checkpoints").is_dir() or (run_dir / "latent_cache").is_dir():
        return "train"
    if (run_dir / "selection.jsonl").is_file():
        return "select"
    if (run_dir / "scores").is_dir():
        return "score"
    return "generate"


def wait_for_stage(process: subprocess.Popen, run_dir: Path, target: str) -> str | None:
    """Wait until the run has reached `target` (or a later stage); None when it ended first."""
    while process.poll() is None:
        if STAGES.index(stage_reached(run_dir)) >= STAGES.index(target):
            return target
        time.sleep(0.1)
    return None


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(run_dir: Path) -> dict:
    """What must survive: samples (with every record line), scores, selection and the final LoRA."""
    keys, images = [], {}
    for metadata in sorted((run_dir / "samples").glob("part-*/metadata.jsonl")):
        for line in filter(str.strip, metadata.read_text().splitlines()):
            row = json.loads(line)
            keys.append((row["prompt_index"], row["image_index"]))
            images[keys[-1]] = digest(metadata.parent / row["file_name"])
    score_rows = [json.loads(line) for part in sorted((run_dir / "scores").rglob("part-*.jsonl"))
                  for line in part.read_text().splitlines() if line.strip()]
    scores = {(row["prompt_index"], row["image_index"]): row["reward"] for row in score_rows}
    lora = load_file(str(run_dir / "pytorch_lora_weights.safetensors"))
    return {
        "keys": keys, "images": images, "scores": scores, "score_lines": len(score_rows),
        # Which part folder holds an image depends on the process that made it, so paths are left out.
        "selection": [{k: v for k, v in json.loads(line).items() if k != "path"}
                      for line in (run_dir / "selection.jsonl").read_text().splitlines()],
        "lora": {name: digest_tensor(tensor) for name, tensor in lora.items()},
    }


def digest_tensor(tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


def compare(reference: dict, found: dict) -> tuple[int, int, list[str]]:
    """(lost, duplicated, the parts that differ) of a resumed folder against the reference."""
    lost = len(set(reference["images"]) - set(found["images"])) + len(set(reference["scores"]) - set(found["scores"]))
    duplicated = (len(found["keys"]) - len(set(found["keys"]))) + (found["score_lines"] - len(found["scores"]))
    return lost, duplicated, [key for key in ("images", "scores", "selection", "lora") if reference[key] != found[key]]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=30, help="How many runs to kill and resume.")
    parser.add_argument("--processes", type=int, default=2, help="Processes per run (gloo on a CPU).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the kill times within a stage.")
    parser.add_argument("--work_dir", default=None, help="Where the run folders go (default: a temporary folder).")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="gors-stress-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "runs.log"

    duration = run_to_end(work / "reference", args.processes, log)
    reference = snapshot(work / "reference")
    print(f"reference run: {duration:.0f} s, {len(reference['keys'])} samples, {len(reference['lora'])} LoRA tensors")

    totals = {"resumed": 0, "lost": 0, "duplicated": 0, "identical": 0}
    attempt = 0
    for fault in range(args.faults):
        target = STAGES[fault % len(STAGES)]  # every stage in turn
        while True:  # until a run is killed inside its target stage
            attempt += 1
            run_dir = work / f"fault-{fault:03d}-{attempt}"
            with open(log, "a") as out:
                process = subprocess.Popen(command(run_dir, args.processes), env=environment(), stdout=out,
                                           stderr=out)
                stage = wait_for_stage(process, run_dir, target)
                if stage is not None:
                    time.sleep(rng.uniform(0.0, 1.5))  # somewhere inside the stage, not only at its start
                    stage = stage_reached(run_dir) if process.poll() is None else None
                if stage is None:  # it finished first: no fault, try again
                    process.wait()
                    shutil.rmtree(run_dir)
                    continue
                kill_all(process)
                break
        resumed = run_to_end(run_dir, args.processes, log)
        lost, duplicated, differing = compare(reference, snapshot(run_dir))
        totals["resumed"] += 1
        totals["lost"] += lost
        totals["duplicated"] += duplicated
        totals["identical"] += not differing
        print(f"fault {fault + 1:3d}: killed in {stage:<8} resumed in {resumed:5.1f} s  lost {lost}  duplicated "
              f"{duplicated}  identical {not differing}{' (' + ', '.join(differing) + ' differ)' if differing else ''}",
              flush=True)
        if not differing:
            shutil.rmtree(run_dir)  # a folder that differs stays, to be looked at
    print(f"faults {args.faults}, resumed {totals['resumed']}, lost {totals['lost']}, duplicated "
          f"{totals['duplicated']}, results identical {totals['identical']}")


if __name__ == "__main__":
    main()
