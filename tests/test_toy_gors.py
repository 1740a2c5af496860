"""The packaged toy model: it loads offline, draws, and one short GORS round on it trains LoRA."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

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
    assert all(steps_on("first20")(s) and steps_on("last20")(s) for s in range(STEPS))  # K = STEPS is every step
    for bad in ("first", "middle3", "lastx", "first21"):
        with pytest.raises(SystemExit, match=f"variant '{bad}'; use base, all, firstK or lastK"):
            steps_on(bad)


def test_lora_by_step_refuses_a_missing_or_non_lora_folder_in_one_line(tmp_path):
    from gors.toy.lora_by_step import main

    with pytest.raises(SystemExit, match=r"^error: --lora='/nonexistent': no such file or folder"):
        main(["--lora", "/nonexistent"])
    with pytest.raises(SystemExit, match=r"is not a LoRA folder \(it holds no pytorch_lora_weights.safetensors\)"):
        main(["--lora", str(tmp_path)])
    (tmp_path / "pytorch_lora_weights.safetensors").write_bytes(b"\x00\x01")  # a copy cut short
    with pytest.raises(SystemExit, match=r"^error: .*pytorch_lora_weights.safetensors"):
        main(["--lora", str(tmp_path)])


class _StepRecordingPipe:
    """Stands in for the toy pipeline in `lora_by_step.evaluate`: it encodes text with or without the LoRA
    (embeddings 1 with it, 2 without, negated for the empty negative prompt), runs the step callback as diffusers
    does, and records at each step whether the U-Net's adapters were on and which embeddings it denoised with."""

    device = torch.device("cpu")

    def __init__(self):
        from types import SimpleNamespace

        self.text_lora, self.unet_lora, self.calls, self.progress_bar = True, True, [], None
        self.unet = SimpleNamespace(enable_adapters=lambda: setattr(self, "unet_lora", True),
                                    disable_adapters=lambda: setattr(self, "unet_lora", False))

    def enable_lora(self):
        self.text_lora = True

    def disable_lora(self):
        self.text_lora = False

    def set_progress_bar_config(self, disable):
        self.progress_bar = not disable

    def encode_prompt(self, texts, device, num_images_per_prompt, do_classifier_free_guidance, negative_prompt):
        assert do_classifier_free_guidance and negative_prompt == [""] * len(texts)
        prompt = torch.full((len(texts), 1), 1.0 if self.text_lora else 2.0)
        return prompt, -prompt

    def __call__(self, prompt_embeds, negative_prompt_embeds, num_inference_steps, generator, callback_on_step_end,
                 callback_on_step_end_tensor_inputs, **options):
        from types import SimpleNamespace

        embeds, steps = torch.cat([negative_prompt_embeds, prompt_embeds]), []
        for step in range(num_inference_steps):
            negative, prompt = embeds.chunk(2)
            steps.append((self.unet_lora, prompt.unique().tolist(), negative.unique().tolist()))
            embeds = callback_on_step_end(self, step, 999 - step, {"prompt_embeds": embeds}).get("prompt_embeds",
                                                                                                 embeds)
        self.calls.append({"steps": steps, "seeds": [g.initial_seed() for g in generator], "options": options,
                           "num_inference_steps": num_inference_steps, "tensor_inputs": callback_on_step_end_tensor_inputs})
        return SimpleNamespace(images=[SimpleNamespace(seed=g.initial_seed()) for g in generator])


def test_lora_by_step_switches_both_adapters_at_the_variants_steps_on_the_held_out_prompts(monkeypatch):
    """Each step denoises with the U-Net adapters and the text-encoder LoRA's embeddings on exactly at the
    variant's steps, for the 20-step, guidance-4, 64 px `toy` protocol; image i of held-out prompt p has the
    seed 10000 + 100 p + i and is judged against its own prompt's text."""
    from types import SimpleNamespace

    import gors.toy.lora_by_step as lora_by_step

    train, held_out = split_prompts()
    monkeypatch.setattr(lora_by_step, "split_prompts", lambda: (train[:10], held_out[:10]))
    judged = []

    def judge(text, image):  # the first image of each prompt bound, the others missing an object
        judged.append((text, image.seed))
        return SimpleNamespace(bound=image.seed % 100 == 0, errors=[] if image.seed % 100 == 0 else ["missing"])

    monkeypatch.setattr(lora_by_step, "judge_image", judge)
    for variant in ("first10", "last5", "all", "base"):
        pipe = _StepRecordingPipe()
        result = lora_by_step.evaluate(pipe, variant)
        assert result["binding"] == 0.25 and result["missing"] == 0.75 and result["exchanged"] == 0.0
        on = lora_by_step.steps_on(variant)
        for call in pipe.calls:
            assert call["num_inference_steps"] == 20 and call["tensor_inputs"] == ["prompt_embeds"]
            assert call["options"] == {"guidance_scale": 4.0, "height": 64, "width": 64}
            assert call["steps"] == [(on(s), [1.0] if on(s) else [2.0], [-1.0] if on(s) else [-2.0])
                                     for s in range(20)], variant
        assert sum(len(call["seeds"]) for call in pipe.calls) == 40  # 10 prompts x 4 images
        seeds = [seed for call in pipe.calls for seed in call["seeds"]]
        assert seeds == [10_000 + 100 * p + i for p in range(10) for i in range(4)]
    assert judged[:40] == [(held_out[p].text, 10_000 + 100 * p + i) for p in range(10) for i in range(4)]


def test_lora_by_step_checks_every_variant_before_the_lora_and_draws_on_one_thread(tmp_path, monkeypatch, capsys):
    """A bad variant is named even when the LoRA path is wrong too; a good run loads the packaged pipeline with
    the given LoRA on one thread (the toy results' summation order), quietly, and prints a row per variant."""
    import gors.toy.lora_by_step as lora_by_step

    with pytest.raises(SystemExit, match="variant 'middle3'"):
        lora_by_step.main(["--lora", "/nonexistent", "--variants", "base,middle3"])
    save_file({"x": torch.zeros(1)}, tmp_path / "pytorch_lora_weights.safetensors")  # read only by the stand-in
    loaded, pipe = [], _StepRecordingPipe()

    def load(path, device, lora):
        loaded.append((path, device.type, lora, torch.get_num_threads()))
        return pipe

    monkeypatch.setattr(lora_by_step, "load_pipeline", load)
    monkeypatch.setattr(lora_by_step, "evaluate", lambda pipe, variant: {"binding": 0.5 if variant == "base" else 0.75,
                                                                        "exchanged": 0.125})
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lora_by_step.main(["--lora", str(tmp_path), "--variants", "base,first3"])
    finally:
        torch.set_num_threads(threads)
    assert loaded == [(str(PRETRAINED_DIR / "pipeline"), "cpu", str(tmp_path), 1)] and pipe.progress_bar is False
    out = capsys.readouterr().out
    assert "base: binding 0.500" in out and "first3: binding 0.750" in out and "0.125" in out


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


def test_an_evaluation_stopped_before_its_first_image_is_resumed_in_place(tmp_path):
    """A store that recorded another LoRA's settings but holds no image (a run stopped before the first one)
    has nothing to keep: the store adopts the new settings, so nothing is set aside."""
    from gors.core.distributed import make_accelerator
    from gors.core.store import SampleStore
    from gors.toy.demo import evaluate_lora, holds_other_lora

    eval_dir = tmp_path / "eval_gors"
    (tmp_path / "pytorch_lora_weights.safetensors").write_bytes(b"this training")
    (eval_dir / "samples").mkdir(parents=True)
    SampleStore(eval_dir / "samples").save_settings({"lora_sha256": "0" * 64})
    assert not holds_other_lora(eval_dir, str(tmp_path))
    evaluate_lora(_StoreBenchmark(), "toy", eval_dir, str(tmp_path), make_accelerator())
    assert not (tmp_path / "eval_gors.previous-1").exists() and len(SampleStore(eval_dir / "samples").records()) == 1


def test_the_error_table_is_left_out_when_any_summary_lacks_error_kinds():
    """An evaluation scored before the oracle named its errors has none to share: no table, not a crash on
    the other rows."""
    from gors.toy.demo import error_table

    named = {"binding_errors": {"exchanged": 0.25, "wrong_shape": 0.0}}
    assert error_table([("base", {"binding_errors": None}), ("GORS", named)]) == ""
    assert error_table([("base", named), ("GORS", {"binding_errors": None})]) == ""
    table = error_table([("base", named)])
    assert table.startswith("share of images with each binding error:") and "wrong shape" in table and "0.250" in table


def test_the_toy_tau_is_filled_in_only_when_no_other_selection_is_given(tmp_path, monkeypatch):
    """Without --reward_threshold the recipe records the toy tau, but --select_top_fraction or --tau_schedule
    select on their own and keep no threshold (checked before the base evaluation starts)."""
    import gors.train
    from rewards.paper import toy_threshold

    seen = []

    def stop(config):
        seen.append(config.reward_threshold)
        raise KeyboardInterrupt

    monkeypatch.setattr(gors.train, "training_accelerator", stop)
    for flags in ([], ["--select_top_fraction", "0.5"]):
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            toy_main(["--output_dir", str(tmp_path / "demo"), *flags])
    assert seen == [toy_threshold("toy_oracle"), None]


def test_the_before_after_grid_marks_each_tile_by_its_images_binding(tmp_path):
    """The same images under other verdicts make another grid (OK for a bound image, X otherwise), and the
    tiles show image 0 of each prompt."""
    from PIL import Image

    from gors.toy.demo import before_after_grid

    def evaluation(name, correct):
        folder = tmp_path / name
        (folder / "samples").mkdir(parents=True)
        rows = []
        for i in range(2):
            Image.new("RGB", (16, 16), "red" if i == 0 else "blue").save(folder / "samples" / f"{i}.png")
            rows.append({"prompt": "a red circle", "image_index": i, "path": f"{i}.png", "correct": correct})
        (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return folder

    grids = []
    for correct in (True, False):
        base, tuned = evaluation(f"base{correct}", correct), evaluation(f"gors{correct}", correct)
        grids.append(np.asarray(Image.open(before_after_grid(base, tuned, ["a red circle"], tmp_path / f"{correct}.png"))))
    assert grids[0].shape == grids[1].shape and (grids[0] != grids[1]).any()
    pixels = grids[0].reshape(-1, 3)
    assert ((pixels == [255, 0, 0]).all(axis=1)).any() and not ((pixels == [0, 0, 255]).all(axis=1)).any()
