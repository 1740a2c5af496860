"""`recipes/gors_toy.py`: GORS in the toy world, before/after binding accuracy on held-out prompts.

1. evaluate the packaged base model on the held-out prompts (combinations never seen in training);
2. run GORS on the train prompts: generate k images each, score with the reward (default the
   exact oracle `toy_oracle`; `--unbiased` or `--reward toy_classifier` for the unbiased one), keep
   reward > tau (by default the toy category's for the reward, `rewards.paper.TOY_THRESHOLDS`), train
   LoRA with the reward-weighted loss;
3. evaluate the fine-tuned model on the same held-out prompts and seeds;
4. print both accuracies, write `results.json`, a before/after grid PNG and TensorBoard scalars.

With `--rounds N` (online GORS, `gors.rounds`), step 2 runs N rounds and step 3 evaluates every
round's LoRA, so `results.json` and the printout hold the accuracy curve against the round.
"""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from diffusers.utils import make_image_grid
from PIL import Image, ImageDraw
from tabulate import tabulate

from evaluators.base import FIXED_BATCH_FLAGS
from gors.cli import TRAINING_INTERRUPTED, expected_errors, parse_config
from gors.config import RunConfig
from gors.core.distributed import end_training, main_process_decides
from gors.core.io import atomic_save_image, atomic_write_json
from gors.core.lock import run_folder_lock
from gors.core.pipeline import lora_sha256
from gors.core.store import SampleStore
from gors.core.toy import PRETRAINED_DIR
from gors.core.toy.world import SPLITS, split_prompts
from gors.evaluate import EVALUATE_LOCKS
from rewards.paper import toy_threshold

# The toy evaluation generates and scores in its benchmark's batches: no flag of the recipe sets them.
FIXED_BATCHES = {"flags": FIXED_BATCH_FLAGS, "scorer_batch_flag": None}


@dataclass
class ToyRunConfig(RunConfig):
    """A GORS run in the toy world plus its held-out evaluation."""

    eval_images_per_prompt: int = field(default=4, metadata={"help": "Held-out images per prompt."})
    eval_max_prompts: int | None = field(default=None, metadata={"help": "Evaluate on at most N prompts."})
    eval_split: str = field(
        default="held_out",
        metadata={"help": "'held_out' (the reported number); for choosing settings without peeking: 'val' with "
                          "--train_prompts toy:fit (GORS on the fit prompts, measured on colour-shape pairs they "
                          "lack, as held-out prompts measure the train prompts), and the other folds 'val_square' "
                          "with toy:fit_square and 'val_triangle' with toy:fit_triangle; or 'train'."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # The benchmark would refuse them only after the run, naming its own fields.
        for name in ("eval_images_per_prompt", "eval_max_prompts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name}={value}: must be >= 1")
        if self.eval_split not in SPLITS:
            raise ValueError(f"--eval_split={self.eval_split!r}: choose one of {', '.join(SPLITS)}")
        # A validation fold measures pairs that only its fit prompts leave out: with other toy training prompts
        # it measures prompts GORS trained on (toy:train holds every val prompt).
        if self.eval_split.startswith("val") and self.train_prompts.startswith("toy:"):
            fit = f"toy:fit{self.eval_split[3:]}"
            if self.train_prompts != fit:
                raise ValueError(f"--eval_split={self.eval_split} with --train_prompts {self.train_prompts}: those "
                                 f"prompts hold the {self.eval_split} ones, so it would measure trained prompts; "
                                 f"pass --train_prompts {fit} with it (or --eval_split held_out)")
        if self.eval_split == "held_out" and self.train_prompts == "toy:held_out":
            raise ValueError("--train_prompts toy:held_out with --eval_split held_out would measure the prompts GORS "
                             "trains on; train on toy:train (or toy:fit with --eval_split val)")


def toy_defaults(output_dir: str = "toy_output") -> dict[str, Any]:
    """The toy recipe's `RunConfig` values (`recipes/gors_toy.py`, `make demo`), each flag as it reads."""
    return {
        "output_dir": output_dir,
        "pretrained_model_name_or_path": str(PRETRAINED_DIR / "pipeline"),
        "train_prompts": "toy:train",
        "images_per_prompt": 24,
        "num_inference_steps": 20,
        "guidance_scale": 4.0,
        "resolution": 64,
        "generation_batch_size": 32,
        "category": "toy",  # reward toy_oracle; --unbiased: toy_classifier
        "reward_batch_size": 64,
        # Per process: `make demo`'s two processes (accelerate_configs/cpu.yaml) update on 32 samples; on one
        # process, --gradient_accumulation_steps 2 (or --global_batch_size 32) updates on the same 32 samples (with
        # other noise draws: each process seeds its own).
        "train_batch_size": 16,
        "sample_latents": False,  # the toy model was pretrained on posterior means
        # A model this small moves only with toy-scale steps and LR; the schedule and the anchor were chosen
        # on the validation folds of the train prompts (docs/toy_world_results.md): at a constant LR the accuracy on unseen
        # pairs swings by +-0.1 between checkpoints, and the cosine decay settles it; the LoRA's gain is
        # on the noisier steps and its new errors (wrong shapes, extra blobs) on the others, which the
        # anchor leaves to the base model. 3 600 steps keep `make demo` under 10 minutes on 2 cores.
        "max_train_steps": 3600,
        "anchor_below": 500,
        "lr_scheduler": "cosine",
        "learning_rate": 1e-3,
        "text_encoder_learning_rate": 1e-3,
        "rank": 8,
        "caption_dropout": 0.1,
        "checkpointing_steps": 1200,
        "validation_prompts": [p.text for p in split_prompts()[1][:4]],
        "validation_steps": 1200,
        "seed": 0,
    }


HEADER_LINES = 3  # the longest prompt, at 2x scale, wraps to three lines


def _label(image: Image.Image, text: str) -> Image.Image:
    canvas = Image.new("RGB", (image.width, image.height + 12), "white")
    canvas.paste(image, (0, 12))
    ImageDraw.Draw(canvas).text((2, 0), text, fill="black")
    return canvas


def before_after_grid(base_dir: Path, tuned_dir: Path, prompts: list[str], path: Path, scale: int = 2) -> Path:
    """The prompts over two rows (base, GORS) of image 0 of each, each marked OK or X by its binding
    (the oracle's verdict on colours and shapes; the relation is not counted)."""
    tiles = []  # the base row, then the GORS row
    for folder, title in ((base_dir, "base"), (tuned_dir, "GORS")):
        results = {r["prompt"]: r for r in map(json.loads, (folder / "results.jsonl").read_text().splitlines())
                   if r["image_index"] == 0}
        for prompt in prompts:
            row = results[prompt]
            image = Image.open(folder / "samples" / row["path"]).convert("RGB")
            image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
            tiles.append(_label(image, f"{title} {'OK' if row['correct'] else 'X'}"))
    body = make_image_grid(tiles, rows=2, cols=len(prompts))
    width = tiles[0].width
    header = 8 + 12 * HEADER_LINES  # the prompt above each column, wrapped to the tile width
    grid = Image.new("RGB", (body.width, header + body.height), "white")
    draw = ImageDraw.Draw(grid)
    for c, prompt in enumerate(prompts):
        lines = textwrap.wrap(prompt, width=max(8, width // 6))[:HEADER_LINES]
        draw.multiline_text((c * width + 2, 2), "\n".join(lines), fill="black", spacing=1)
    grid.paste(body, (0, header))
    atomic_save_image(grid, path)
    return path


def error_table(rows: Sequence[tuple[str, dict]]) -> str:
    """What the binding errors were: per (title, toy summary) row, the share of images with each kind
    of `rewards.toy_rules.BINDING_ERRORS` (an image can have several); empty if a summary lacks them."""
    if any(summary["binding_errors"] is None for _, summary in rows):
        return ""
    kinds = list(rows[0][1]["binding_errors"])
    return "share of images with each binding error:\n" + tabulate(
        [[title, *summary["binding_errors"].values()] for title, summary in rows],
        headers=["", *(kind.replace("_", " ") for kind in kinds)], tablefmt="plain", floatfmt=".3f",
    )


COMMAND = "recipes/gors_toy.py"


def holds_other_lora(eval_dir: Path, lora: str) -> bool:
    """Whether `eval_dir` holds images generated with another LoRA than the one now at `lora` (its
    weights' sha256 differs, or the store predates recording it): the LoRA was trained again there."""
    store = SampleStore(eval_dir / "samples")
    recorded = store.load_settings()
    return recorded is not None and bool(store.records()) and recorded.get("lora_sha256") != lora_sha256(lora)


def set_aside(folder: Path) -> Path:
    """Rename `folder` to the first free `<name>.previous-<n>`; nothing is deleted."""
    number = 1
    while (aside := folder.with_name(f"{folder.name}.previous-{number}")).exists():
        number += 1
    folder.rename(aside)
    return aside


def evaluate_lora(benchmark: Any, model: str, eval_dir: Path, lora: str, accelerator: Any) -> dict:
    """`benchmark.evaluate` of `lora` into `eval_dir` under its evaluate lock. A rerun in one folder
    trains the LoRA again at the same path: an evaluation of the former LoRA there is set aside and
    this one's images generated (a store refuses images of other LoRA weights, `gors evaluate` too)."""
    with run_folder_lock(eval_dir, EVALUATE_LOCKS, COMMAND):
        # One answer for all processes: on a network filesystem each could see another state of the folder.
        if not main_process_decides(accelerator.state, lambda: holds_other_lora(eval_dir, lora)):
            return benchmark.evaluate(model, eval_dir, lora=lora, accelerator=accelerator, **FIXED_BATCHES)
        if accelerator.is_main_process:
            aside = set_aside(eval_dir)
            print(f"note: {eval_dir} held the evaluation of an earlier LoRA at {lora}; moved it to {aside} and "
                  "evaluating the LoRA trained now")
        accelerator.wait_for_everyone()
        with run_folder_lock(eval_dir, EVALUATE_LOCKS, COMMAND):  # the new folder; the old lock moved with the old one
            return benchmark.evaluate(model, eval_dir, lora=lora, accelerator=accelerator, **FIXED_BATCHES)


@expected_errors(TRAINING_INTERRUPTED)  # one line `error: ...` and exit status 2, as in `gors`
def main(argv: Sequence[str] | None = None) -> dict:
    from evaluators.toy import ToyBenchmark
    from gors.core.run_folder import round_dir
    from gors.rounds import run_rounds
    from gors.run import check_run_inputs, run_stages
    from gors.train import training_accelerator

    start = time.time()
    config = parse_config(ToyRunConfig, argv, defaults=toy_defaults(), prog="recipes/gors_toy.py")
    reward = config.reward_name()
    # A mistyped --reward fails here, before the base model's evaluation; so does one without a toy tau
    # (select's, `rewards.paper.toy_threshold`) when no --reward_threshold is given.
    check_run_inputs(config)
    if config.reward_threshold is None and config.tau_schedule is None and config.select_top_fraction is None:
        config.reward_threshold = toy_threshold(reward)  # recorded as the run's tau, as the demo always has
    out = Path(config.output_dir)
    accelerator = training_accelerator(config)

    benchmark = ToyBenchmark(split=config.eval_split, images_per_prompt=config.eval_images_per_prompt,
                             guidance_scale=config.guidance_scale,
                             num_inference_steps=config.num_inference_steps, max_prompts=config.eval_max_prompts)
    with run_folder_lock(out / "eval_base", EVALUATE_LOCKS, COMMAND):
        base = benchmark.evaluate(config.pretrained_model_name_or_path, out / "eval_base", accelerator=accelerator,
                                  **FIXED_BATCHES)
    if config.rounds == 1:
        run_stages(config, accelerator, command=COMMAND)
    else:
        run_rounds(config, accelerator, command=COMMAND)
    # Each round's LoRA but the last, then the run's (the last round's).
    model = config.pretrained_model_name_or_path
    per_round = [evaluate_lora(benchmark, model, out / f"eval_{round_dir(out, r).name}", str(round_dir(out, r)),
                               accelerator)
                 for r in range(config.rounds - 1)]
    tuned = evaluate_lora(benchmark, model, out / "eval_gors", str(out), accelerator)
    per_round.append(tuned)
    results = {
        "reward": reward,
        "eval_split": config.eval_split,
        "seed": config.seed,
        "base_binding_accuracy": base["binding_accuracy"],
        "gors_binding_accuracy": tuned["binding_accuracy"],
        "gain": tuned["binding_accuracy"] - base["binding_accuracy"],
        "base_full_accuracy": base["full_accuracy"],
        "gors_full_accuracy": tuned["full_accuracy"],
        "rounds": [{"round": r, **{metric: summary[metric] for metric in
                                   ("binding_accuracy", "relation_accuracy", "full_accuracy")}}
                   for r, summary in enumerate(per_round)],
        "base": base,
        "gors": tuned,
        "seconds": round(time.time() - start, 1),
        "num_processes": accelerator.num_processes,
    }
    if accelerator.is_main_process:
        atomic_write_json(out / "results.json", results)
        grid = before_after_grid(out / "eval_base", out / "eval_gors", [p.text for p in benchmark.prompts()[:8]],
                                 out / "before_after.png")
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(out / "logs" / "eval")) as writer:
            for name, summary in (("base", base), ("gors", tuned)):
                for metric in ("binding_accuracy", "relation_accuracy", "full_accuracy"):
                    if summary[metric] is not None:
                        writer.add_scalar(f"toy_{config.eval_split}/{metric}_{name}", summary[metric], 0)
            for r, summary in enumerate(per_round):
                writer.add_scalar(f"toy_{config.eval_split}/binding_accuracy_by_round", summary["binding_accuracy"], r)
        rows = [("base model", base)] + ([(f"after round {r}", s) for r, s in enumerate(per_round)]
                                         if config.rounds > 1 else [("after GORS", tuned)])
        table = tabulate(
            [[title, summary["binding_accuracy"], summary["relation_accuracy"], summary["full_accuracy"]]
             for title, summary in rows],
            headers=["", "binding", "relation", "full"], tablefmt="plain", floatfmt=".3f", missingval="n/a",
        )
        errors = error_table(rows)
        errors = textwrap.indent(errors, "  ") + "\n" if errors else ""
        print(
            f"\nToy world, {config.eval_split} prompts ({base['num_prompts']} prompts x "
            f"{config.eval_images_per_prompt} images), GORS with reward {reward}:\n"
            f"{textwrap.indent(table, '  ')}\n"
            f"  binding accuracy gain {results['gain']:+.3f}\n"
            f"{errors}"
            f"  before/after grid  {grid}\n  results           {out / 'results.json'}\n"
            f"  TensorBoard       tensorboard --logdir {out / 'logs'}\n"
            f"  took {results['seconds']:.0f} s on {accelerator.num_processes} process(es)"
        )
    end_training(accelerator)
    return results
