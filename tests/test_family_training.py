"""GORS on SDXL, SD3 and FLUX.1: the whole loop on two CPU processes (gloo), launched as users launch it.

One 2-process `gors run` per family (tiny random models, 2 prompts x 2 images, 2 training steps with a
checkpoint after each) is shared by the tests of that family: what the run folder holds, that the LoRA
loads in the family's own diffusers pipeline and changes its images, (SDXL and SD3; FLUX.1 trains its
transformer as SD3 does) that a 2-process resume from the first checkpoint ends on the same LoRA, and (SDXL)
how the LoRA of a text-encoder layer whose output is unused trained on two processes.

The three runs are one launch, one `gors run` after another (`launch_gors_jobs`), and the 2-process trainings
that follow from them another: each launch costs its processes' imports (about 25 s of CPU on 2 slow cores).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from two_processes import launch_gors_jobs

from gors.core.run_folder import TEXT_EMBEDDING_CACHE_DIR
from gors.core.scoring import load_scores
from gors.core.store import SampleStore
from gors.lora import LORA_WEIGHT_NAME
from gors.select import load_selection

PROMPTS = ("a red circle and a blue square", "a green triangle")
IMAGES_PER_PROMPT = 2
SAMPLE_KEYS = [(p, i) for p in range(len(PROMPTS)) for i in range(IMAGES_PER_PROMPT)]
TEXT_ENCODER_RATE = 1e-2  # large enough that AdamW's weight decay visibly moves a text-encoder LoRA in two steps


@dataclass(frozen=True)
class Family:
    """What a family's run is expected to produce."""

    model_fixture: str
    pipeline_class: str
    lora_components: frozenset[str]  # the prefixes of the LoRA file's keys
    cached_encoders: tuple[str, ...]  # the frozen text encoders, whose outputs are cached


FAMILIES = {
    # Both CLIP encoders train by default, so nothing is cached.
    "sdxl": Family("tiny_sdxl", "StableDiffusionXLPipeline", frozenset({"unet", "text_encoder", "text_encoder_2"}),
                   ()),
    # CLIP-L and bigG are frozen by default, T5 always.
    "sd3": Family("tiny_sd3", "StableDiffusion3Pipeline", frozenset({"transformer"}),
                  ("text_encoder", "text_encoder_2", "text_encoder_3")),
    # CLIP-L and T5, both frozen.
    "flux": Family("tiny_flux", "FluxPipeline", frozenset({"transformer"}), ("text_encoder", "text_encoder_2")),
}


@dataclass(frozen=True)
class FamilyRun:
    """A finished 2-process `gors run` of one family (read-only: tests that write copy it)."""

    name: str  # the family's key in FAMILIES
    family: Family
    model: Path
    run_dir: Path

    def train_flags(self, output_dir: Path) -> list[str]:
        """The flags of `gors train` that the run trained with, in `output_dir`."""
        return ["--output_dir", str(output_dir), "--pretrained_model_name_or_path", str(self.model),
                "--resolution", "32", "--learning_rate", "0.1", "--text_encoder_learning_rate", str(TEXT_ENCODER_RATE),
                "--max_train_steps", "2", "--checkpointing_steps", "1", "--seed", "0", "--report_to", "none"]


def _render(pipeline) -> np.ndarray:
    """One prompt, 2 steps at 32 x 32, from a fixed CPU generator."""
    return pipeline(PROMPTS[0], num_inference_steps=2, height=32, width=32, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images


@pytest.fixture(scope="module")
def family_runs(request, tmp_path_factory, tiny_blip) -> dict[str, FamilyRun]:
    """generate -> score -> select -> train of each family on two processes, one `gors run` after another in one
    launch, with a large learning rate so that two steps visibly move the tiny model."""
    root = tmp_path_factory.mktemp("families")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    runs = {name: FamilyRun(name, family, request.getfixturevalue(family.model_fixture), root / name)
            for name, family in FAMILIES.items()}
    launch_gors_jobs([["run", *run.train_flags(run.run_dir), "--train_prompts", str(prompts), "--images_per_prompt",
                       str(IMAGES_PER_PROMPT), "--num_inference_steps", "2", "--generation_batch_size", "2",
                       "--reward_model_name_or_path", str(tiny_blip), "--reward_batch_size", "2",
                       "--reward_threshold", "0.0"] for run in runs.values()], cwd=root)
    return runs


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_run(request, family_runs) -> FamilyRun:
    return family_runs[request.param]


@dataclass(frozen=True)
class FollowUps:
    """The 2-process trainings that follow from the family runs, in one launch."""

    resumed: dict[str, Path]  # by family: its run resumed from its first checkpoint
    bf16_sdxl: Path  # SDXL's training again, under bf16
    stdout: str


RESUMED_FAMILIES = ("sdxl", "sd3")  # FLUX.1 trains as SD3 does: a transformer


@pytest.fixture(scope="module")
def follow_ups(family_runs, tmp_path_factory) -> FollowUps:
    """Each of `RESUMED_FAMILIES`' runs without its second checkpoint and its LoRA, resumed from the first, and
    SDXL's training under bf16 (each in a copy of the run without its checkpoints and LoRA)."""
    root = tmp_path_factory.mktemp("follow_ups")
    jobs, resumed = [], {}
    for name in RESUMED_FAMILIES:
        run = family_runs[name]
        resumed[name] = root / f"resumed-{name}"
        shutil.copytree(run.run_dir, resumed[name])
        shutil.rmtree(resumed[name] / "checkpoints" / "checkpoint-2")
        (resumed[name] / LORA_WEIGHT_NAME).unlink()
        jobs.append(["train", *run.train_flags(resumed[name]), "--resume_from_checkpoint", "latest"])
    sdxl, bf16 = family_runs["sdxl"], root / "bf16-sdxl"
    shutil.copytree(sdxl.run_dir, bf16, ignore=shutil.ignore_patterns("checkpoints", LORA_WEIGHT_NAME))
    jobs += ["reset_process_state",  # a script's training under another precision than the last
             ["train", *sdxl.train_flags(bf16), "--mixed_precision", "bf16", "--checkpointing_steps", "100"]]
    return FollowUps(resumed, bf16, launch_gors_jobs(jobs, cwd=root).stdout)


@pytest.mark.slow
def test_two_process_run_writes_each_sample_once_and_a_lora_of_the_family(family_run):
    run_dir, family = family_run.run_dir, family_run.family
    records = SampleStore(run_dir / "samples").records()
    assert sorted((r["prompt_index"], r["image_index"]) for r in records) == SAMPLE_KEYS  # each image once
    assert {r["path"].split("/")[0] for r in records} == {"part-00000", "part-00001"}  # both processes wrote
    assert sorted(load_scores(run_dir, "b_vqa")) == SAMPLE_KEYS
    assert len(load_selection(run_dir)) == len(SAMPLE_KEYS)  # tau 0 keeps every sample

    weights = load_file(str(run_dir / LORA_WEIGHT_NAME))
    assert {key.split(".")[0] for key in weights} == family.lora_components
    assert all("lora" in key for key in weights)  # adapters only, no base weight
    for step in (1, 2):
        checkpoint = run_dir / "checkpoints" / f"checkpoint-{step}"
        assert sorted(p.name for p in checkpoint.glob("random_states_*.pkl")) == ["random_states_0.pkl",
                                                                                  "random_states_1.pkl"]
    cached = sorted(p.name.split("-")[0] for p in (run_dir / TEXT_EMBEDDING_CACHE_DIR).glob("*"))
    assert cached == sorted(family.cached_encoders)  # one merged file per frozen encoder
    leftovers = [p for p in run_dir.rglob("*") if ".part-" in p.name or p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.slow
def test_lora_loads_in_the_family_pipeline_and_changes_its_images(family_run):
    import diffusers

    pipeline = getattr(diffusers, family_run.family.pipeline_class).from_pretrained(str(family_run.model))
    pipeline.set_progress_bar_config(disable=True)
    before = _render(pipeline)
    pipeline.load_lora_weights(str(family_run.run_dir))
    assert set(pipeline.get_list_adapters()) == family_run.family.lora_components  # every part took its adapter
    assert np.abs(_render(pipeline) - before).max() > 1e-3


def test_adapter_weights_cast_at_once_train_the_family_s_lora_bit_for_bit_in_bf16(family_run, tmp_path,
                                                                                  monkeypatch):
    # bf16 autocast on the CPU: the joint cast (`AdapterCast`) against a cast per weight, on the family's
    # denoiser and trained text encoders (FLUX.1 and SD3 have adapters that get no gradient).
    import gors.core.fused_lora
    import gors.train
    from gors.cli import main
    from gors.core.distributed import reset_process_state

    joint_casts = []
    forward = gors.core.fused_lora._CastTogether.forward
    monkeypatch.setattr(gors.core.fused_lora._CastTogether, "forward",
                        staticmethod(lambda ctx, *args: (joint_casts.append(1), forward(ctx, *args))[1]))
    loras = {}
    for cast in ("joint", "per weight"):
        if cast == "per weight":
            monkeypatch.setattr(gors.train, "AdapterCast", lambda modules, dtype: None)
        run_dir = tmp_path / cast.replace(" ", "_")
        shutil.copytree(family_run.run_dir, run_dir, ignore=shutil.ignore_patterns("checkpoints", LORA_WEIGHT_NAME))
        main(["train", *family_run.train_flags(run_dir), "--mixed_precision", "bf16", "--checkpointing_steps", "100"])
        reset_process_state()
        loras[cast] = load_file(str(run_dir / LORA_WEIGHT_NAME))
        if cast == "joint":
            assert joint_casts  # the joint cast ran (once per micro-batch)
    assert loras["joint"].keys() == loras["per weight"].keys()
    assert {key.split(".")[0] for key in loras["joint"]} == family_run.family.lora_components
    for key, value in loras["per weight"].items():
        assert torch.equal(loras["joint"][key], value), key


@pytest.mark.slow
@pytest.mark.parametrize("family_run", ["sdxl"], indirect=True)
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_two_process_training_steps_the_lora_that_gets_no_gradient_by_weight_decay_alone(family_run, precision,
                                                                                         tmp_path, request):
    # SDXL reads CLIP-L's penultimate layer, so its last layer's LoRA gets no gradient; DDP looks for unused
    # parameters for this family, and under bf16 the adapters are cast at once (`AdapterCast`). One process leaves
    # that LoRA as initialised (no gradient, no AdamW step). DDP hands it a zero gradient instead (the layer runs in
    # the encoder's forward), which AdamW steps by its weight decay alone. The layer's output is unused, so the
    # LoRA acts the same either way.
    from gors.cli import main
    from gors.core.distributed import reset_process_state

    rate, decay, steps = TEXT_ENCODER_RATE, 1e-2, 2  # the run's rate, the default --adam_weight_decay, its steps

    def trained(processes: int) -> dict[str, torch.Tensor]:
        if processes == 2:  # the family's own 2-process run trained so (the accelerate config's), or its bf16 twin
            folder = family_run.run_dir if precision == "no" else request.getfixturevalue("follow_ups").bf16_sdxl
            return load_file(str(folder / LORA_WEIGHT_NAME))
        run_dir = tmp_path / "processes-1"
        shutil.copytree(family_run.run_dir, run_dir, ignore=shutil.ignore_patterns("checkpoints", LORA_WEIGHT_NAME))
        main(["train", *family_run.train_flags(run_dir), "--mixed_precision", precision, "--checkpointing_steps", "100"])
        reset_process_state()
        return load_file(str(run_dir / LORA_WEIGHT_NAME))

    loras = {processes: trained(processes) for processes in (1, 2)}
    layers = {int(key.split(".layers.")[1].split(".")[0]) for key in loras[1] if key.startswith("text_encoder.")}
    unused = [key for key in loras[1] if key.startswith(f"text_encoder.text_model.encoder.layers.{max(layers)}.")]
    assert unused and loras[1].keys() == loras[2].keys()
    for key in unused:  # the down-projections decay; the up-projections stay at their initial zeros
        assert torch.allclose(loras[2][key], loras[1][key] * (1 - rate * decay) ** steps, rtol=1e-6, atol=0), key
        assert not torch.equal(loras[2][key], loras[1][key]) or not loras[1][key].any(), key
    # The layers that learn moved (in both: their samples differ between one process and two).
    used = next(key for key in loras[1] if key.startswith("unet.") and "up" in key.split("."))
    assert loras[1][used].abs().max() > 0 and loras[2][used].abs().max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("family_run", RESUMED_FAMILIES, indirect=True)
def test_two_process_resume_from_the_first_checkpoint_gives_the_same_lora(family_run, follow_ups):
    resumed = follow_ups.resumed[family_run.name]
    assert f"resumed from {resumed / 'checkpoints' / 'checkpoint-1'} at step 1" in follow_ups.stdout
    original = load_file(str(family_run.run_dir / LORA_WEIGHT_NAME))
    again = load_file(str(resumed / LORA_WEIGHT_NAME))
    assert original.keys() == again.keys()
    for key in original:
        assert torch.allclose(original[key], again[key], atol=1e-6), key


def test_a_frozen_t5_loads_in_fp16_with_the_layers_transformers_keeps_in_fp32(tiny_sd3):
    # Training loads base weights in the mixed-precision dtype, so T5's `wo` stays fp32 under fp16 as in the
    # sampling pipeline (a cast after loading in fp32 would make it fp16 and the cached encodings differ).
    from gors.core.backbones import detect_backbone
    from gors.families import TRAINING_FAMILIES

    backbone = detect_backbone(str(tiny_sd3))
    family = TRAINING_FAMILIES[backbone.name](backbone, str(tiny_sd3), None, {})
    t5 = family.load("text_encoder_3", dtype=torch.float16)
    dtypes = {name: p.dtype for name, p in t5.named_parameters()}
    assert any(name.endswith("wo.weight") for name in dtypes)
    assert all(dtype == (torch.float32 if ".wo." in name else torch.float16) for name, dtype in dtypes.items())
