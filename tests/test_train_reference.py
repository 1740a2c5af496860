"""gors' training steps against the reference loop they replace: same losses, same adapters.

The reference is diffusers' `train_text_to_image_lora.py` loop as GORS ran it, written out in
`benchmarks/train_step.py` (`ReferenceLoop`), which encodes each batch's images with the VAE
every step and samples the posterior there; gors samples the same posterior from the latent mean
and std it cached once. Both loops run three optimizer steps on the tiny SD pipeline, on the same
selected samples in the same order (`BatchSchedule`'s, handed to the reference's data loader),
from the same seed, with the same LoRA initialisation (gors' adapters copied into the
reference's before the first step), both LoRAs on.

The random numbers line up exactly: each step draws the posterior sample, then the noise, then
the timesteps, in that order and with the same shapes on both sides (`latent_dist.sample()` is
`mean + std * randn(shape)`, as gors' `mean + std * randn_like(mean)`). One thing differs: the
reference draws its noise `randn_like` the VAE's output, which the CPU convolution leaves
channels-last, and torch's CPU normal sampler fills a non-contiguous tensor element by element
where it fills a contiguous one 16 values at a time, so the same seed gives other noise values.
The test therefore runs both loops inside `same_draws()`, which makes `randn_like` draw
contiguously; no noise or timestep is injected, every draw is the loops' own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tests.run_copies import copy_selected_run

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
STEPS = 3


@pytest.fixture(scope="module")
def train_step():
    """`benchmarks/train_step.py` as a module (the scripts import their helpers as top-level modules)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("benchmark_train_step", BENCHMARKS / "train_step.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_first_steps_match_the_reference_loop(train_step, selected_run, tiny_sd):
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    from gors.core.distributed import make_accelerator
    from gors.core.run_folder import samples_dir
    from gors.select import load_selection

    run_dir = Path(selected_run.output_dir)
    accelerator = make_accelerator(mixed_precision="no")
    trainer = train_step.gors_trainer(tiny_sd, run_dir, accelerator, train_text_encoder=True, resolution=32,
                                      seed=0, mixed_precision="no")
    ours = train_step.GorsLoop(trainer)  # the tiny checkpoint's weights, loaded by GORSTrainer itself
    models = {  # the same checkpoint, loaded as the diffusers script loads it
        "unet": UNet2DConditionModel.from_pretrained(tiny_sd, subfolder="unet"),
        "vae": AutoencoderKL.from_pretrained(tiny_sd, subfolder="vae"),
        "text_encoder": CLIPTextModel.from_pretrained(tiny_sd, subfolder="text_encoder"),
    }
    reference = train_step.ReferenceLoop(
        models, CLIPTokenizer.from_pretrained(tiny_sd, subfolder="tokenizer"),
        DDPMScheduler.from_pretrained(tiny_sd, subfolder="scheduler"), samples_dir(run_dir),
        load_selection(run_dir), trainer.schedule.indices, accelerator, train_text_encoder=True, resolution=32)
    assert reference.trained_modules().keys() == ours.trained_modules().keys() == {"unet", "text_encoder"}
    train_step.copy_adapters(ours.trained_modules(), reference.trained_modules())
    initial = train_step.adapter_weights(ours.trained_modules())

    with train_step.same_draws():
        torch.manual_seed(0)
        reference_losses = [reference.step().item() for _ in range(STEPS)]
        torch.manual_seed(0)
        gors_losses = [ours.step().item() for _ in range(STEPS)]

    assert gors_losses == pytest.approx(reference_losses, abs=1e-5)
    assert len(set(gors_losses)) == STEPS  # three different batches, noises and timesteps
    reference_weights = train_step.adapter_weights(reference.trained_modules())
    gors_weights = train_step.adapter_weights(ours.trained_modules())
    assert reference_weights.keys() == gors_weights.keys() == initial.keys()
    assert any(k.startswith("text_encoder.") for k in gors_weights) and any(k.startswith("unet.") for k in gors_weights)
    for key, value in gors_weights.items():
        assert torch.allclose(value, reference_weights[key], atol=1e-5, rtol=0), key
    # The steps moved the adapters of both models (a match of untouched weights would prove nothing).
    for component in ("unet", "text_encoder"):
        moved = max((gors_weights[k] - initial[k]).abs().max().item() for k in initial if k.startswith(component))
        assert moved > 1e-6, component


def test_the_reference_trains_in_fp32_beside_gors_in_half_precision(train_step, selected_run, tiny_sd):
    # GORS' script trained in fp32 (its --mixed_precision default 'no' overrides the launcher's fp16); gors' bf16
    # Accelerator is the process's, and the reference's calls must still take fp32's branches.
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    from gors.core.distributed import make_accelerator
    from gors.core.run_folder import samples_dir
    from gors.select import load_selection

    run_dir = Path(selected_run.output_dir)
    accelerator = make_accelerator(mixed_precision="bf16")
    trainer = train_step.gors_trainer(tiny_sd, run_dir, accelerator, train_text_encoder=True, resolution=32,
                                      seed=0, mixed_precision="bf16")
    ours = train_step.GorsLoop(trainer)
    models = {"unet": UNet2DConditionModel.from_pretrained(tiny_sd, subfolder="unet"),
              "vae": AutoencoderKL.from_pretrained(tiny_sd, subfolder="vae"),
              "text_encoder": CLIPTextModel.from_pretrained(tiny_sd, subfolder="text_encoder")}
    # fp16's loss scaler, which accelerate makes on a GPU only: the reference's optimizer must not take it.
    scaler = accelerator.scaler = torch.amp.GradScaler("cpu")
    reference = train_step.ReferenceLoop(
        models, CLIPTokenizer.from_pretrained(tiny_sd, subfolder="tokenizer"),
        DDPMScheduler.from_pretrained(tiny_sd, subfolder="scheduler"), samples_dir(run_dir),
        load_selection(run_dir), trainer.schedule.indices, accelerator, train_text_encoder=True, resolution=32,
        precision="no")
    assert reference.optimizer.scaler is None and accelerator.scaler is scaler  # and the accelerator's is back
    accelerator.scaler = None
    train_step.copy_adapters(ours.trained_modules(), reference.trained_modules())
    autocast: dict[str, list[bool]] = {"reference": [], "gors": []}
    for name, loop in (("reference", reference), ("gors", ours)):
        for model in loop.trained_modules().values():  # a layer inside: accelerate autocasts the model's forward
            layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
            layer.register_forward_pre_hook(
                lambda *_, name=name: autocast[name].append(torch.is_autocast_enabled("cpu")))
    with train_step.same_draws():
        torch.manual_seed(0)
        reference_losses = [reference.step().item() for _ in range(STEPS)]
        torch.manual_seed(0)
        gors_losses = [ours.step().item() for _ in range(STEPS)]

    assert autocast["reference"] == [False] * 2 * STEPS and autocast["gors"] == [True] * 2 * STEPS
    assert all(p.dtype == torch.float32 for m in reference.trained_modules().values() for p in m.parameters())
    assert accelerator.native_amp  # gors' accelerator is left as it was
    # Released, the reference's prepared models, optimizer and scheduler leave the accelerator; gors' stay.
    counts = [len(accelerator._models), len(accelerator._optimizers), len(accelerator._schedulers)]
    reference.release()
    assert [len(accelerator._models), len(accelerator._optimizers), len(accelerator._schedulers)] == [
        counts[0] - 2, counts[1] - 1, counts[2] - 1]
    assert any(optimizer is trainer.optimizer for optimizer in accelerator._optimizers)
    # The same steps, the reference's in fp32: within bf16's rounding, and not equal.
    assert gors_losses == pytest.approx(reference_losses, rel=train_step.LOSS_TOLERANCE["bf16"])
    assert gors_losses != pytest.approx(reference_losses, rel=1e-6)


def test_train_loop_steps_as_the_step_compared_with_the_reference(train_step, selected_run, tiny_sd, tmp_path):
    """`train()`'s own loop (clipping, optimizer and LR-scheduler updates, zeroing) ends with the adapters of
    `GorsLoop`'s steps, the ones compared with the reference loop above, under a gradient-norm bound tight
    enough that clipping changes every step; and it logs each step's own loss at that step, though it
    reads each one back a step late (`LossLog`), flushed at a checkpoint mid-way and at the end."""
    from dataclasses import replace

    from accelerate.utils import set_seed

    from gors.config import TrainConfig
    from gors.core.distributed import make_accelerator
    from gors.report import load_scalars
    from gors.train import GORSTrainer

    def run_folder(name: str) -> str:
        folder = tmp_path / name
        folder.mkdir()
        copy_selected_run(selected_run, folder)
        return str(folder)

    accelerator = make_accelerator(mixed_precision="no")
    config = TrainConfig(pretrained_model_name_or_path=str(tiny_sd), output_dir=run_folder("train"), resolution=32,
                         train_batch_size=2, train_text_encoder=True, mixed_precision="no", report_to="none", seed=0,
                         max_train_steps=STEPS, checkpointing_steps=STEPS, max_grad_norm=1e-3)
    # Its own Accelerator, with the run's TensorBoard tracker.
    trained = GORSTrainer(replace(config, report_to="tensorboard", checkpointing_steps=2))
    trained.train()
    trained_weights = train_step.adapter_weights(
        {name: accelerator.unwrap_model(m) for name, m in trained.trained_modules().items()})

    def stepped(max_grad_norm: float) -> tuple[dict[str, torch.Tensor], list[float]]:
        set_seed(config.seed, device_specific=True)  # as `train()` seeds before setting its models up
        loop = train_step.GorsLoop(GORSTrainer(replace(config, output_dir=run_folder(f"loop-{max_grad_norm}"),
                                                       max_grad_norm=max_grad_norm), accelerator))
        losses = [loop.step().item() for _ in range(STEPS)]
        return train_step.adapter_weights(loop.trained_modules()), losses

    (loop_weights, loop_losses), (unclipped, _) = stepped(config.max_grad_norm), stepped(1e9)
    logged = load_scalars(Path(config.output_dir))["train/loss"]
    assert [step for step, _ in logged] == list(range(1, STEPS + 1))
    assert [value for _, value in logged] == pytest.approx(loop_losses, rel=1e-6)
    assert len(set(loop_losses)) == STEPS
    assert trained_weights.keys() == loop_weights.keys()
    for key, value in trained_weights.items():
        assert torch.equal(value, loop_weights[key]), key
    assert any(not torch.allclose(loop_weights[k], unclipped[k], atol=1e-7) for k in loop_weights)  # clipping counted
