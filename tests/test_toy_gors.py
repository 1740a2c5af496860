"""The packaged toy model: it loads offline, draws, and one short GORS round on it trains LoRA."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gors.core.pipeline import load_pipeline
from gors.core.toy import PRETRAINED_DIR
from gors.core.toy.world import split_prompts
from gors.run import run_stages
from gors.toy.demo import ToyRunConfig, toy_defaults
from gors.toy.demo import main as toy_main
from gors.train import training_accelerator


def test_packaged_model_loads_offline_and_draws_shapes():
    pipeline = load_pipeline(str(PRETRAINED_DIR / "pipeline"), torch.device("cpu"))
    image = pipeline("a red circle and a blue triangle", height=64, width=64, num_inference_steps=10,
                     guidance_scale=4.0, generator=torch.Generator().manual_seed(0)).images[0]
    pixels = np.asarray(image).reshape(-1, 3).astype(int)
    coloured = (pixels.max(axis=1) - pixels.min(axis=1)) > 80
    assert image.size == (64, 64) and 0.03 < coloured.mean() < 0.6  # objects on a white background


def test_one_short_gors_round_selects_better_samples_and_trains_lora(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(p.text for p in split_prompts()[0][::35]) + "\n")  # 6 train prompts
    values = toy_defaults(str(tmp_path / "run")) | {
        "train_prompts": str(prompts), "images_per_prompt": 4, "num_inference_steps": 10,
        "max_train_steps": 3, "checkpointing_steps": 3, "validation_prompts": None, "reward_threshold": 0.5,
    }
    config = ToyRunConfig(**values)
    run_stages(config, training_accelerator(config))
    summary = json.loads((tmp_path / "run" / "selection_summary.json").read_text())
    assert summary["num_selected"] > 0
    if summary["dropped"]["count"]:
        assert summary["selected"]["mean"] > summary["dropped"]["mean"]
    lora = load_file(str(tmp_path / "run" / "pytorch_lora_weights.safetensors"))
    ups = [v for k, v in lora.items() if "lora.up" in k or "lora_B" in k or ".up." in k]
    assert ups and any(v.abs().max() > 0 for v in ups)  # up-projections start at zero; training moved them


@pytest.mark.parametrize("rounds", [1, 2])
def test_toy_recipe_reports_base_and_gors_accuracy(tmp_path, rounds, capsys):
    results = toy_main(["--output_dir", str(tmp_path / "demo"), "--max_prompts", "16", "--images_per_prompt", "2",
                        "--num_inference_steps", "8", "--max_train_steps", "2", "--checkpointing_steps", "2",
                        "--eval_max_prompts", "4", "--eval_images_per_prompt", "1", "--reward_threshold", "0.5",
                        "--validation_steps", "1", "--rounds", str(rounds)])
    assert 0 <= results["base_binding_accuracy"] <= 1 and 0 <= results["gors_binding_accuracy"] <= 1
    # The accuracy after each round; the last is the run's.
    assert [r["round"] for r in results["rounds"]] == list(range(rounds))
    assert results["rounds"][-1]["binding_accuracy"] == results["gors_binding_accuracy"]
    assert (tmp_path / "demo" / "round-000").is_dir() == (rounds > 1)
    from PIL import Image

    # Four prompts: a header of wrapped prompt text over two rows of 2x tiles, each with a 12 px label.
    assert Image.open(tmp_path / "demo" / "before_after.png").size == (4 * 128, 8 + 12 * 3 + 2 * (128 + 12))
    saved = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert saved["gain"] == results["gors_binding_accuracy"] - results["base_binding_accuracy"]
    assert saved["base"]["num_prompts"] == 4
    assert 0 <= saved["base_full_accuracy"] <= saved["base_binding_accuracy"]  # full = binding and relation
    # Every wrongly bound image has at least one kind of binding error, and the printout shows their shares.
    errors = saved["base"]["binding_errors"]
    assert set(errors) == {"exchanged", "wrong_shape", "shapeless", "missing", "extra"}
    assert sum(errors.values()) >= 1 - saved["base_binding_accuracy"] - 1e-9
    assert "share of images with each binding error:" in capsys.readouterr().out


def test_lora_by_step_variants_name_the_steps_the_adapters_are_on():
    from gors.toy.lora_by_step import STEPS, steps_on

    assert [s for s in range(STEPS) if steps_on("first10")(s)] == list(range(10))
    assert [s for s in range(STEPS) if steps_on("last5")(s)] == list(range(15, 20))
    assert all(steps_on("all")(s) and not steps_on("base")(s) for s in range(STEPS))
    for bad in ("first", "middle3", "lastx"):
        with pytest.raises(SystemExit, match=f"variant '{bad}'; use base, all, firstK or lastK"):
            steps_on(bad)
