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
    for flag in ("eval_max_prompts", "eval_images_per_prompt"):  # refused before the run, not after it
        with pytest.raises(ValueError, match=f"--{flag}=0: must be >= 1"):
            ToyRunConfig(**values, **{flag: 0})
    config = ToyRunConfig(**values)
    run_stages(config, training_accelerator(config))
    summary = json.loads((tmp_path / "run" / "selection_summary.json").read_text())
    assert summary["num_selected"] > 0 and summary["dropped"]["count"] > 0  # tau 0.5 splits this round's samples
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


def test_lora_by_step_refuses_a_missing_or_non_lora_folder_in_one_line(tmp_path):
    from gors.toy.lora_by_step import main

    with pytest.raises(SystemExit, match=r"^error: --lora='/nonexistent': no such file or folder"):
        main(["--lora", "/nonexistent"])
    with pytest.raises(SystemExit, match=r"is not a LoRA folder \(it holds no pytorch_lora_weights.safetensors\)"):
        main(["--lora", str(tmp_path)])


def test_toy_recipe_checks_the_reward_before_the_base_evaluation(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        toy_main(["--output_dir", str(tmp_path / "demo"), "--reward", "toy_oracl", "--reward_threshold", "0.5"])
    assert exit_info.value.code == 2 and "toy_oracl" in capsys.readouterr().err
    assert not (tmp_path / "demo" / "eval_base").exists()


class _StoreBenchmark:
    """Evaluates as a benchmark does, with a stand-in pipeline: one image into a store recording the LoRA."""

    def evaluate(self, model, folder, lora=None, accelerator=None, **options):
        from PIL import Image

        from gors.core.lock import lock_path
        from gors.core.pipeline import pipeline_settings
        from gors.core.sampling import SamplingProtocol, generate_samples
        from gors.core.store import SampleStore

        def pipeline(**kwargs):
            return type("Out", (), {"images": [Image.new("RGB", (8, 8)) for _ in kwargs["prompt"]]})

        protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8)
        generate_samples(SampleStore(folder / "samples"), ["a red circle"], protocol, lambda: pipeline, accelerator,
                         settings=pipeline_settings(model, torch.float32, lora=lora))
        return {"locked": bool(lock_path(folder, "evaluate").read_text())}


def test_toy_evaluation_of_a_retrained_lora_sets_the_old_one_aside(tmp_path, capsys):
    from gors.core.distributed import make_accelerator
    from gors.core.lock import LockError, run_folder_lock
    from gors.core.store import SampleStore
    from gors.toy.demo import evaluate_lora

    accelerator, eval_dir = make_accelerator(), tmp_path / "eval_gors"
    (tmp_path / "pytorch_lora_weights.safetensors").write_bytes(b"first training")
    assert evaluate_lora(_StoreBenchmark(), "toy", eval_dir, str(tmp_path), accelerator) == {"locked": True}
    first = SampleStore(eval_dir / "samples").load_settings()["lora_sha256"]
    evaluate_lora(_StoreBenchmark(), "toy", eval_dir, str(tmp_path), accelerator)  # the same LoRA: resumed
    assert not (tmp_path / "eval_gors.previous-1").exists()
    (tmp_path / "pytorch_lora_weights.safetensors").write_bytes(b"second training")  # the rerun trained again
    assert evaluate_lora(_StoreBenchmark(), "toy", eval_dir, str(tmp_path), accelerator) == {"locked": True}
    assert "moved it to " + str(tmp_path / "eval_gors.previous-1") in capsys.readouterr().out
    assert SampleStore(tmp_path / "eval_gors.previous-1" / "samples").load_settings()["lora_sha256"] == first
    assert SampleStore(eval_dir / "samples").load_settings()["lora_sha256"] != first
    assert len(SampleStore(eval_dir / "samples").records()) == 1
    # Another launch evaluating the folder holds its lock: refused, not recorded twice.
    with run_folder_lock(eval_dir, ("evaluate",), "another launch"):
        with pytest.raises(LockError, match="is being written by `another launch`"):
            evaluate_lora(_StoreBenchmark(), "toy", eval_dir, str(tmp_path), accelerator)
