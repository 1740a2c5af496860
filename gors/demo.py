"""The embedded offline default: the whole GORS loop on tiny random models built on the spot.

No GPU, network or download: a tiny Stable Diffusion pipeline and a tiny BLIP VQA of the real
classes are created with random weights, then generate -> score (B-VQA) -> select -> train run
exactly as they would on SD-2-base. The random models make the numbers meaningless; the point is
to see every stage work, where it writes, and how long each takes on a CPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from gors.cli import parse_config
from gors.config import RunConfig
from gors.distributed import process_state

DEMO_PROMPTS = (
    "a red circle and a blue square",
    "a green triangle and a yellow circle",
    "a blue square and a red triangle",
    "a yellow square and a green circle",
    "a red triangle and a yellow square",
    "a blue circle and a green square",
    "a green triangle on the left of a red circle",
    "a yellow circle on the right of a blue triangle",
)


def demo_defaults(output_dir: str = "demo_output") -> dict:
    models = Path(output_dir) / "models"
    return {
        "output_dir": output_dir,
        "pretrained_model_name_or_path": str(models / "tiny-sd"),
        "train_prompts": str(Path(output_dir) / "prompts.txt"),
        "images_per_prompt": 4,
        "num_inference_steps": 10,
        "resolution": 32,
        "reward": "b_vqa",
        "reward_model_name_or_path": str(models / "tiny-blip-vqa"),
        # The tiny random BLIP's scores say nothing about the images; this tau keeps about a quarter.
        "reward_threshold": 0.2,
        "max_train_steps": 20,
        "checkpointing_steps": 10,
        "validation_prompts": list(DEMO_PROMPTS[:2]),
        "validation_steps": 10,
    }


def build_demo_models(config: RunConfig) -> None:
    """Create the tiny models and the prompt file once (main process); others wait."""
    from gors.tiny.blip import build_tiny_blip_vqa
    from gors.tiny.sd import build_tiny_sd_pipeline

    state = process_state()
    if state.is_main_process:
        prompts = Path(config.train_prompts)
        if not prompts.exists():
            prompts.parent.mkdir(parents=True, exist_ok=True)
            prompts.write_text("\n".join(DEMO_PROMPTS) + "\n")
        if not Path(config.pretrained_model_name_or_path, "model_index.json").exists():
            build_tiny_sd_pipeline(config.pretrained_model_name_or_path, seed=0, resolution=config.resolution)
        if not Path(config.reward_model_name_or_path, "config.json").exists():
            build_tiny_blip_vqa(config.reward_model_name_or_path, seed=0)
    state.wait_for_everyone()


def main(argv: Sequence[str] | None = None) -> RunConfig:
    from gors.cli import run

    start = time.time()
    config = parse_config(RunConfig, argv, defaults=demo_defaults(), prog="recipes/gors_demo.py")
    build_demo_models(config)
    run(config)
    state = process_state()
    if state.is_main_process:
        out = Path(config.output_dir)
        print(
            f"\nGORS demo finished in {time.time() - start:.0f} s on {state.num_processes} process(es). Outputs:\n"
            f"  samples (image folder + metadata.jsonl)  {out / 'samples'}\n"
            f"  B-VQA scores with questions               {out / 'scores' / 'b_vqa'}\n"
            f"  selection and its summary                 {out / 'selection.jsonl'}, {out / 'selection_summary.json'}\n"
            f"  LoRA (diffusers format)                   {out / 'pytorch_lora_weights.safetensors'}\n"
            f"  checkpoints (resume with --resume_from_checkpoint latest)  {out / 'checkpoints'}\n"
            f"  TensorBoard logs                          tensorboard --logdir {out / 'logs'}"
        )
    return config
