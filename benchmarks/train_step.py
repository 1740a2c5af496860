"""Training step: one GORSTrainer optimizer step against the diffusers LoRA loop GORS was trained with.

Both sides train the same models (copies of one set of random weights) on the same selected
samples (a run folder written here: PNG images in a sample store and `selection.jsonl` with their
rewards), in the same batch order (`BatchSchedule`), batch 2 per process as the paper, in one
process, interleaved and repeated (`common.paired_ratios`); the script prints the min and median
of the paired ratios reference time / gors time, for two settings: LoRA on the U-Net only, and on
the U-Net and the text encoder (gors' default for SD 1/2, as GORS).

- **Reference**: the training loop of diffusers' `examples/text_to_image/train_text_to_image_lora.py`
  as T2I-CompBench's GORS script (`GORS_finetune/train_text_to_image.py`, a copy of that loop) runs
  it, written out below (`ReferenceLoop`), read as facts, not copied. Set-up: everything frozen and
  moved to the device in the weight dtype; peft LoRA (rank 4, alpha = rank, Gaussian init) on the
  U-Net's `to_q`, `to_k`, `to_v`, `to_out.0` (`unet.add_adapter`), and for the text-encoder variant
  on the CLIP encoder's `q_proj`, `k_proj`, `v_proj`, `out_proj` (peft's `inject_adapter_in_model`,
  as gors: transformers 5 refuses `add_adapter` with current peft); AdamW with GORS' learning
  rates (U-Net 1e-4, text encoder 5e-6); a constant LR schedule; `accelerator.prepare`. Data: a
  map-style dataset whose items open the image file (PIL, RGB), resize, centre crop, `ToTensor`,
  normalise to [-1, 1] and tokenise the caption (padded to 77), batched by a `DataLoader` with one
  worker process, as GORS' script hard-codes (`num_workers=1`; diffusers' script defaults to
  none, loading in the main process). Each step: the next batch,
  `vae.encode(pixel_values).latent_dist.sample() * scaling_factor`, `noise = randn_like`, uniform
  integer timesteps, `noise_scheduler.add_noise`, the text encoder on the batch's input ids (frozen
  or with its LoRA), the U-Net, GORS' reward-weighted MSE against the epsilon target, the loss
  gathered and `.item()`-ed for the log, `accelerator.backward`, gradient clipping over the trained
  models' parameters (as the GORS script; diffusers' current script clips an already-consumed
  `filter`, which clips nothing), optimizer step, LR-scheduler step, `zero_grad`.
- **gors**: a `GORSTrainer` set up as `train()` sets it up (`_setup_models`, `_setup_optimizer`,
  `_load_data`, which encodes every selected image once and caches its latent mean and std, and,
  without the text-encoder LoRA, the frozen encoder's outputs; AdamW with its fused kernel, gors'
  default `--fused_adam`; with `--torch_compile BACKEND[:MODE]` the U-Net (and the text encoder
  when it trains, without CUDA graphs) compiled, the first untimed steps compiling it; then
  `accelerator.prepare`), and per
  step the body of its training loop: `_micro_batch_loss` (a latent drawn from the cached
  posterior, noise, timesteps, the text encoder if it trains, the U-Net, the loss), backward,
  clipping, optimizer and LR-scheduler steps (`Updates`: under fp16, the loss scaler's verdict on the
  schedule read one update late), `zero_grad`, the loss gathered and read back one step late
  (`LossLog`; neither read makes the device idle while the host waits). The
  models load from memory instead of a checkpoint (the loading is not timed); the one-off caching
  is timed separately and printed.

Sizes. By default (a CPU): SD-2-base's architecture (`gors.sd2_architecture`, and the VAE and
scheduler configs of `train_memory.py`) with every width divided by 4 (head counts kept; U-Net
GroupNorm 16 groups instead of 32, as 80 channels do not split into 32), the U-Net's and VAE's
depth kept, the text encoder 3 of its 23 layers, at 192 px instead of 512: 1/116 of the U-Net's
forward FLOPs, 1/115 of the VAE encoder's and 1/118 of the text encoder's (counted with
`torch.utils.flop_counter` at batch 2: 1.61, 2.23 and 0.09 TFLOPs at full size), so the three keep
their real shares of a step; only the fixed cost per op (Python, dispatch) weighs more than at full
size. `--full-size`: SD-2-base's real U-Net (866 M parameters), text encoder (340 M) and VAE at
512 px, random weights (a GPU). `--host-bound`: SD-2-base's every layer, block and head at the least
widths that keep them, at 64 px: the operations of a full-size step (the same count), each nearly
free to compute, so that on the CPU a step times the host's work per operation (Python, dispatch,
autograd), which is what a step at GORS' batch of 2 on a large GPU waits on (benchmarks/README.md
compares its phases with the H200's). `--peft_layers`: gors with peft's own LoRA layers instead of
its fused ones, to measure what those save. The agreement column: the first three steps of both
(untimed; under `--torch_compile` they compile, and with CUDA graphs the third is the first
replay), each from the same seed, the same LoRA initialisation (copied from gors' to the
reference's) and layout-independent noise draws (`same_draws`), must give the same losses within
float rounding (`LOSS_TOLERANCE`; `tests/test_train_reference.py` checks three steps within 1e-5).
The losses catch a step on wrong inputs; a replay blind to the adapters' updates would move them
less than half precision's tolerance (at GORS' learning rates three steps move the loss by about 5e-4).

    python benchmarks/train_step.py                         # CPU, reduced sizes, 2-4 minutes
    python benchmarks/train_step.py --repeats 3 --profile   # also profile a gors step with both LoRAs
    python benchmarks/train_step.py --host-bound --mixed_precision bf16 [--peft_layers]  # the host's work per step
    python benchmarks/train_step.py --device cuda --full-size --repeats 10 [--torch_compile inductor[:reduce-overhead]]

`--gors_batch_size N` adds a third row: gors' step with both LoRAs at a per-process batch of N
against the reference's at GORS' 2, as a ratio per sample (each pair's time ratio x N / 2). The
official run trains a global batch of 16 as 2 per GPU on 8 GPUs; gors can train the same global
batch on fewer GPUs at a larger batch each (the same updates: the loss is the mean over the global
batch either way), which pays where a step at batch 2 leaves the GPU waiting for kernel launches.
Its first three steps' losses are compared with the official loop's at batch N on the same batches
(untimed); the timed reference then runs three untimed steps too. `--both_loras_only` skips the U-Net-LoRA-only row.

Precision. The reference trains in fp32, as GORS' script did: `train.sh` launches it with
`accelerate launch --mixed_precision=fp16`, but the script passes its own `--mixed_precision`, whose
default is 'no', to its Accelerator, which then ignores the launcher's (and in fp16 the script would
cast its LoRA to fp16 and fail at gradient clipping); it leaves TF32 matrix products off (no
`--allow_tf32`). gors trains in its `--mixed_precision`: fp16 on a GPU by default, as its shipped
GPU configs. accelerate holds one precision per process, so the reference's calls go through
gors' Accelerator with the branches of one made for fp32 (`full_precision`). `--reference_precision
fp16` (gors' own) gives the ratio at equal precision, the one the 2026-12-04 H200 rows measured.
The losses then agree within the looser of the two precisions' tolerances.
"""

from __future__ import annotations

import argparse
import copy
import gc
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from common import SpeedResult, checked_device, paired_ratios, positive_int, print_table, synchronize
from PIL import Image
from torchvision import transforms
from train_memory import SPECS

from gors.config import TrainConfig
from gors.core.run_folder import SELECTION_FILE, samples_dir
from gors.core.store import SampleStore, sample_file_name, sample_seed
from gors.sd2_architecture import SD2_BASE_TEXT_ENCODER_CONFIG, SD2_BASE_UNET_CONFIG

UNET_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]  # diffusers' script
TEXT_ENCODER_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]  # GORS (and diffusers' SDXL LoRA script)
# Relative difference allowed between the two loops' losses of the same steps: float rounding of the same
# operations in other orders (tests/test_train_reference.py holds fp32 to 1e-5), and half precision's.
LOSS_TOLERANCE = {"no": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
GORS_BATCH = 2  # per process, x 8 GPUs: the official train.sh
# Steps of both loops compared before the timing: the third is the first that updated weights twice, and, under CUDA
# graphs, the first replayed.
AGREEMENT_STEPS = 3

# ----- sizes --------------------------------------------------------------------------------------
SD2_BASE_VAE_CONFIG = dict(SPECS["sd"].components["vae"].config)
SD2_BASE_SCHEDULER_CONFIG = dict(SPECS["sd"].components["scheduler"].config)


def _quarter(channels: list[int]) -> list[int]:
    return [c // 4 for c in channels]


REDUCED_UNET_CONFIG = {**SD2_BASE_UNET_CONFIG, "block_out_channels": _quarter(SD2_BASE_UNET_CONFIG["block_out_channels"]),
                       "cross_attention_dim": SD2_BASE_UNET_CONFIG["cross_attention_dim"] // 4, "norm_num_groups": 16,
                       "sample_size": 24}
REDUCED_TEXT_ENCODER_CONFIG = {**SD2_BASE_TEXT_ENCODER_CONFIG,
                               "hidden_size": SD2_BASE_TEXT_ENCODER_CONFIG["hidden_size"] // 4,
                               "intermediate_size": SD2_BASE_TEXT_ENCODER_CONFIG["intermediate_size"] // 4,
                               "num_hidden_layers": 3}
REDUCED_VAE_CONFIG = {**SD2_BASE_VAE_CONFIG, "block_out_channels": _quarter(SD2_BASE_VAE_CONFIG["block_out_channels"])}
# SD-2-base's every layer, block and head count with the least widths that keep them (head width 4 in the U-Net's
# and text encoder's attentions, 1 channel per GroupNorm group in the U-Net), at 64 px: its operations are SD 2's own
# (the same count per step as at full size), each nearly free to compute, so a step on the CPU times the host's
# work per operation (Python, dispatch, autograd), what a step waits on where a GPU's kernels finish before the
# next is launched.
HOST_BOUND_UNET_CONFIG = {**SD2_BASE_UNET_CONFIG, "block_out_channels": [20, 40, 80, 80], "cross_attention_dim": 64,
                          "norm_num_groups": 4, "sample_size": 8}
HOST_BOUND_TEXT_ENCODER_CONFIG = {**SD2_BASE_TEXT_ENCODER_CONFIG, "hidden_size": 64, "intermediate_size": 64}
HOST_BOUND_VAE_CONFIG = {**SD2_BASE_VAE_CONFIG, "block_out_channels": [32, 32, 32, 32]}

# T2I-CompBench-style attribute-binding prompts (the selection's captions).
PROMPTS = [
    "a red apple and a green bowl", "a blue car and a yellow house", "a white cat on a black sofa",
    "a brown dog and an orange ball", "a purple flower in a pink vase", "a green bench and a red door",
    "a black bicycle and a white fence", "a yellow banana and a blue plate",
]


@dataclass(frozen=True)
class Sizes:
    label: str
    unet: dict[str, Any]
    text_encoder: dict[str, Any]
    vae: dict[str, Any]
    resolution: int


def sizes_for(full_size: bool, resolution: int | None, host_bound: bool = False) -> Sizes:
    if full_size:
        return Sizes("SD-2-base", SD2_BASE_UNET_CONFIG, SD2_BASE_TEXT_ENCODER_CONFIG, SD2_BASE_VAE_CONFIG,
                     resolution or 512)
    if host_bound:
        return Sizes("SD-2-base's layers and heads, least widths (host-bound)", HOST_BOUND_UNET_CONFIG,
                     HOST_BOUND_TEXT_ENCODER_CONFIG, HOST_BOUND_VAE_CONFIG, resolution or 64)
    return Sizes("SD-2-base shape, widths / 4, text encoder 3 of 23 layers", REDUCED_UNET_CONFIG,
                 REDUCED_TEXT_ENCODER_CONFIG, REDUCED_VAE_CONFIG, resolution or 192)


def build_models(sizes: Sizes, device: torch.device, seed: int) -> dict[str, torch.nn.Module]:
    """The U-Net, text encoder and VAE with random weights (fp32, frozen, eval as from_pretrained leaves them)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    with torch.device(device):
        models = {
            "unet": UNet2DConditionModel.from_config(sizes.unet),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**sizes.text_encoder)),
            "vae": AutoencoderKL.from_config(sizes.vae),
        }
    return {name: model.requires_grad_(False).eval() for name, model in models.items()}


def millions(module: torch.nn.Module) -> str:
    return f"{sum(p.numel() for p in module.parameters()) / 1e6:.0f} M"


# ----- the run folder -----------------------------------------------------------------------------
def clip_tokenizer(folder: Path):
    """CLIP's real BPE tokenizer (the one SD 2 ships has the same vocabulary), padded to 77."""
    from transformers import CLIPTokenizer

    from gors.testing.sd import write_clip_tokenizer_files

    files = write_clip_tokenizer_files(folder / "_clip_files")
    return CLIPTokenizer(str(files / "vocab.json"), str(files / "merges.txt"), model_max_length=77)


def write_model_folder(folder: Path, sizes: Sizes, tokenizer) -> Path:
    """A Stable Diffusion pipeline folder of configs, the tokenizer and the scheduler (no weights: the
    benchmark hands both sides the models built in memory)."""
    components = {"unet": ("diffusers", "UNet2DConditionModel", sizes.unet),
                  "text_encoder": ("transformers", "CLIPTextModel", sizes.text_encoder),
                  "vae": ("diffusers", "AutoencoderKL", sizes.vae),
                  "scheduler": ("diffusers", "PNDMScheduler", SD2_BASE_SCHEDULER_CONFIG)}
    index = {"_class_name": "StableDiffusionPipeline", "tokenizer": ["transformers", "CLIPTokenizer"],
             "safety_checker": [None, None], "feature_extractor": [None, None]}
    for name, (library, class_name, config) in components.items():
        index[name] = [library, class_name]
        (folder / name).mkdir(parents=True, exist_ok=True)
        file = "scheduler_config.json" if name == "scheduler" else "config.json"
        (folder / name / file).write_text(json.dumps({"_class_name": class_name, **config}))
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def smooth_image(resolution: int, rng: np.random.Generator) -> Image.Image:
    """A smooth random RGB picture (blobs of colour and a little grain), as compressible as a sample."""
    coarse = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize(
        (resolution, resolution), Image.Resampling.BICUBIC)
    grain = rng.integers(-6, 7, (resolution, resolution, 3))
    return Image.fromarray(np.clip(np.asarray(coarse, dtype=np.int64) + grain, 0, 255).astype(np.uint8))


def write_selected_run(run_dir: Path, resolution: int, prompts: list[str] = PROMPTS, images_per_prompt: int = 2,
                       seed: int = 0) -> list[dict[str, Any]]:
    """A run folder after select: the images in its sample store (`resolution` px PNGs, as generated),
    and `selection.jsonl` with a reward in [0.5, 1] per image. Returns the selection's rows."""
    rng = np.random.default_rng(seed)
    store = SampleStore(samples_dir(run_dir))
    store.save_prompts({"prompts": prompts})
    for p, prompt in enumerate(prompts):
        for i in range(images_per_prompt):
            store.append(0, smooth_image(resolution, rng), {
                "file_name": sample_file_name(p, i), "prompt": prompt, "prompt_index": p, "image_index": i,
                "seed": sample_seed(42, p, i), "resolution": resolution})
    rows = [{**record, "reward": float(rng.uniform(0.5, 1.0))} for record in store.records()]
    (run_dir / SELECTION_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


# ----- timing regions (no-ops unless a breakdown is asked for) ----------------------------------------
class Phases:
    """Named regions of a step: seconds per name (the device synchronised at both ends) and a
    `torch.profiler.record_function` range, only while `enabled`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.enabled = False
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        synchronize(self.device)
        start = time.perf_counter()
        with torch.profiler.record_function(name):
            yield
        synchronize(self.device)
        self.seconds[name] += time.perf_counter() - start


@contextmanager
def same_draws() -> Iterator[None]:
    """`torch.randn_like(t)` drawn as `torch.randn(t.shape)`, whatever `t`'s memory layout.

    The two loops draw the same random numbers in the same order (the latent's posterior sample,
    the noise, the timesteps), but the reference draws its noise like the VAE's output, which the
    CPU convolution may leave channels-last, and torch's CPU normal sampler fills a non-contiguous
    tensor element by element where it fills a contiguous one 16 values at a time: the same seed
    then gives other noise. Inside this context both draw contiguously, hence identically.
    """
    randn_like = torch.randn_like

    def contiguous_randn_like(tensor: torch.Tensor, *, dtype=None, device=None, **kwargs) -> torch.Tensor:
        return torch.randn(tensor.shape, dtype=dtype or tensor.dtype, device=device or tensor.device)

    torch.randn_like = contiguous_randn_like
    try:
        yield
    finally:
        torch.randn_like = randn_like


@contextmanager
def full_precision(accelerator) -> Iterator[None]:
    """Inside the block, `accelerator` (made for gors' fp16 or bf16) takes the branches an Accelerator made with
    `mixed_precision="no"` takes, as GORS' script's did: `prepare` wraps no forward in autocast and gives the
    optimizer no loss scaler, `backward` scales nothing and `clip_grad_norm_` unscales nothing. accelerate's
    process-wide state holds one precision, so the two loops of one process cannot have an Accelerator each."""
    saved = accelerator.native_amp, accelerator.scaler
    accelerator.native_amp, accelerator.scaler = False, None
    try:
        yield
    finally:
        accelerator.native_amp, accelerator.scaler = saved


# ----- the reference: diffusers' LoRA training loop as GORS ran it ----------------------------------
class SelectedImages(torch.utils.data.Dataset):
    """The selected samples as the script's dataset gives them: image file -> transforms, caption ->
    token ids, and the reward (GORS' dataset adds it)."""

    def __init__(self, store_root: Path, rows: list[dict[str, Any]], tokenizer, resolution: int) -> None:
        self.root, self.rows, self.tokenizer = store_root, rows, tokenizer
        self.transform = transforms.Compose([
            transforms.Resize(resolution, interpolation=transforms.InterpolationMode.BILINEAR),
            transforms.CenterCrop(resolution),  # GORS: --center_crop; no --random_flip
            transforms.ToTensor(),
            transforms.Normalize([0.5], [0.5]),
        ])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        image = Image.open(self.root / row["path"]).convert("RGB")
        input_ids = self.tokenizer(row["prompt"], max_length=self.tokenizer.model_max_length, padding="max_length",
                                   truncation=True, return_tensors="pt").input_ids[0]
        return {"pixel_values": self.transform(image), "input_ids": input_ids, "reward": row["reward"]}


def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
    pixel_values = torch.stack([e["pixel_values"] for e in examples]).to(memory_format=torch.contiguous_format).float()
    return {"pixel_values": pixel_values, "input_ids": torch.stack([e["input_ids"] for e in examples]),
            "reward": [e["reward"] for e in examples]}


class BatchOrder(torch.utils.data.Sampler):
    """Batch `step` is `indices(step)`: gors' `BatchSchedule` order, so both sides see the same samples."""

    def __init__(self, indices: Callable[[int], list[int]]) -> None:
        self.indices = indices

    def __iter__(self) -> Iterator[list[int]]:
        for step in itertools.count():
            yield self.indices(step)


def pairs_in_order(count: int) -> Callable[[int], list[int]]:
    """Batches of GORS' 2 samples taken in turn from `count` (the reference's order where gors' batch is larger)."""
    return lambda step: [(GORS_BATCH * step + k) % count for k in range(GORS_BATCH)]


class ReferenceLoop:
    """The set-up and the per-step body of diffusers' `train_text_to_image_lora.py` as GORS ran it."""

    def __init__(self, models: dict[str, torch.nn.Module], tokenizer, noise_scheduler, store_root: Path,
                 rows: list[dict[str, Any]], order: Callable[[int], list[int]], accelerator, *,
                 train_text_encoder: bool, resolution: int, rank: int = 4, learning_rate: float = 1e-4,
                 text_encoder_learning_rate: float = 5e-6, max_grad_norm: float = 1.0, train_batch_size: int = 2,
                 max_train_steps: int = 15000, phases: Phases | None = None, precision: str | None = None) -> None:
        """`precision`: "no" (fp32, as GORS' script trained: its own `--mixed_precision` default 'no' overrides
        `train.sh`'s `accelerate launch --mixed_precision=fp16`), or the accelerator's own (the default)."""
        from diffusers.optimization import get_scheduler
        from diffusers.training_utils import cast_training_params
        from peft import LoraConfig, inject_adapter_in_model
        from tqdm.auto import tqdm

        self.precision = precision or accelerator.mixed_precision
        if self.precision not in ("no", accelerator.mixed_precision):
            raise ValueError(f"the reference runs in fp32 or in the accelerator's {accelerator.mixed_precision}, "
                             f"not {self.precision}")
        # The reference's accelerate calls take its precision's branches (gors' take the accelerator's).
        self.scope = full_precision if self.precision != accelerator.mixed_precision else lambda _: nullcontext()
        self.accelerator, self.noise_scheduler = accelerator, noise_scheduler
        self.train_text_encoder, self.max_grad_norm, self.train_batch_size = (train_text_encoder, max_grad_norm,
                                                                             train_batch_size)
        self.phases = phases or Phases(accelerator.device)
        unet, vae, text_encoder = models["unet"], models["vae"], models["text_encoder"]
        for model in (unet, vae, text_encoder):
            model.requires_grad_(False)
        self.weight_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.precision, torch.float32)
        for model in (unet, vae, text_encoder):
            model.to(accelerator.device, dtype=self.weight_dtype)
        unet.add_adapter(LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=UNET_TARGETS))
        if train_text_encoder:
            inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian",
                                               target_modules=TEXT_ENCODER_TARGETS), text_encoder)
        if self.precision == "fp16":
            cast_training_params([unet, text_encoder], dtype=torch.float32)
        unet_lora = [p for p in unet.parameters() if p.requires_grad]
        groups = [{"params": unet_lora, "lr": learning_rate}]
        if train_text_encoder:
            groups.append({"params": [p for p in text_encoder.parameters() if p.requires_grad],
                           "lr": text_encoder_learning_rate})
        optimizer = torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
        dataset = SelectedImages(store_root, rows, tokenizer, resolution)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=BatchOrder(order), collate_fn=collate,
                                             num_workers=1)  # GORS' train_text_to_image.py
        n = accelerator.num_processes
        lr_scheduler = get_scheduler("constant", optimizer=optimizer, num_warmup_steps=0,
                                     num_training_steps=max_train_steps * n)
        with self.scope(accelerator):
            if train_text_encoder:
                unet, text_encoder, optimizer, lr_scheduler = accelerator.prepare(unet, text_encoder, optimizer,
                                                                                  lr_scheduler)
            else:
                unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
        self.unet, self.vae, self.text_encoder = unet, vae, text_encoder
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.batches = iter(loader)
        self.unet.train()
        if train_text_encoder:
            self.text_encoder.train()
        self.train_loss = 0.0
        self.data_seconds: list[float] = []
        # GORS' script shows a progress bar with each step's loss and LR (here to nowhere: the same work, unseen).
        self.progress_bar = tqdm(range(max_train_steps), file=open(os.devnull, "w"))  # noqa: SIM115
        self.global_step = 0

    def release(self) -> None:
        """Drop the accelerator's references to this loop's prepared models, optimizer and scheduler, so that
        their memory goes back once the loop is deleted (`free_memory` would drop gors' too)."""
        mine = (self.unet, self.text_encoder, self.optimizer, self.lr_scheduler)
        for name in ("_models", "_optimizers", "_schedulers"):
            kept = [item for item in getattr(self.accelerator, name) if all(item is not own for own in mine)]
            getattr(self.accelerator, name)[:] = kept

    def trained_modules(self) -> dict[str, torch.nn.Module]:
        unwrap = self.accelerator.unwrap_model
        return {"unet": unwrap(self.unet)} | ({"text_encoder": unwrap(self.text_encoder)}
                                               if self.train_text_encoder else {})

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the loss."""
        with self.scope(self.accelerator):
            return self._step()

    def _step(self) -> torch.Tensor:
        accelerator, phase, device = self.accelerator, self.phases, self.accelerator.device
        unet, vae, text_encoder, noise_scheduler = self.unet, self.vae, self.text_encoder, self.noise_scheduler
        start = time.perf_counter()
        with phase("data loading"):
            batch = next(self.batches)
            pixel_values, input_ids = batch["pixel_values"].to(device), batch["input_ids"].to(device)
        self.data_seconds.append(time.perf_counter() - start)
        with accelerator.accumulate(unet):
            with phase("vae encode"):
                latents = vae.encode(pixel_values.to(dtype=self.weight_dtype)).latent_dist.sample()
                latents = latents * vae.config.scaling_factor
            with phase("noise and timesteps"):
                noise = torch.randn_like(latents)
                bsz = latents.shape[0]
                timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,), device=latents.device)
                timesteps = timesteps.long()
                noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
            with phase("text encoder forward"):
                encoder_hidden_states = text_encoder(input_ids, return_dict=False)[0]
            if noise_scheduler.config.prediction_type == "epsilon":
                target = noise
            else:
                target = noise_scheduler.get_velocity(latents, noise, timesteps)
            with phase("unet forward"):
                model_pred = unet(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
            with phase("loss"):
                rewards = torch.FloatTensor(batch["reward"]).squeeze().to(device)
                loss = (rewards * F.mse_loss(model_pred.float(), target.float(), reduction="none").mean([1, 2, 3])).mean()
            with phase("loss logging (gather, .item())"):
                avg_loss = accelerator.gather(loss.repeat(self.train_batch_size)).mean()
                self.train_loss += avg_loss.item()
            with phase("backward"):
                accelerator.backward(loss)
            with phase("clip_grad_norm_"):
                if accelerator.sync_gradients:
                    params_to_clip = (itertools.chain(unet.parameters(), text_encoder.parameters())
                                      if self.train_text_encoder else unet.parameters())
                    accelerator.clip_grad_norm_(params_to_clip, self.max_grad_norm)
        # As GORS' script: the update outside `accumulate`, then the step's loss and LR read back for its
        # progress bar and trackers (a second synchronisation a step).
        with phase("optimizer step"):
            self.optimizer.step()
        with phase("lr_scheduler step"):
            self.lr_scheduler.step()
        with phase("progress bar and logs (.item())"):
            self.progress_bar.update(1)
        with phase("zero_grad"):
            self.optimizer.zero_grad()
        self.global_step += 1
        with phase("progress bar and logs (.item())"):
            logs = {"loss": loss.detach().item(), "lr": self.lr_scheduler.get_last_lr()[0]}
            self.progress_bar.set_postfix(**logs)
            accelerator.log(logs, step=self.global_step)
        return loss.detach()


# ----- gors: GORSTrainer's set-up and the body of its loop -------------------------------------------
class GorsLoop:
    """A `GORSTrainer` set up as `train()` sets it up, stepped as its loop steps."""

    def __init__(self, trainer, models: dict[str, torch.nn.Module] | None = None, phases: Phases | None = None) -> None:
        from gors.select import load_selection
        from gors.train import LossLog, Updates

        self.trainer, accelerator = trainer, trainer.accelerator
        self.accelerator = accelerator
        self.phases = phases or Phases(accelerator.device)
        if models is not None:  # the checkpoint's weights come from memory (not timed either way)
            load = trainer.family.load

            def from_memory(component: str, dtype: torch.dtype = torch.float32):
                if component not in models:
                    return load(component, dtype)
                model = copy.deepcopy(models[component])
                return model if dtype == torch.float32 else model.to(dtype=dtype)

            trainer.family.load = from_memory
        # GORSTrainer.train(), up to its loop.
        trainer.selection = load_selection(trainer.config.output_dir)
        trainer._setup_models()
        trainer._setup_optimizer()
        start = time.perf_counter()
        trainer._load_data()
        self.cache_seconds = time.perf_counter() - start
        trainer.prepare()
        self.models = list(trainer.trained_modules().values())
        self.params = [p for m in self.models for p in m.parameters() if p.requires_grad]
        for module in self.models:
            module.train()
        self.micro_batch = 0
        self.log, self.updates = LossLog(accelerator, trainer.trained), Updates(trainer.optimizer, trainer.lr_scheduler)
        self._wrap_family()

    def _wrap_family(self) -> None:
        """The family's text-encoder and U-Net calls inside `_micro_batch_loss`, as named phases."""
        family, phase = self.trainer.family, self.phases
        encode, predict = family.encode, family.predict

        def timed_encode(*args, **kwargs):
            with phase("text encoder forward"):
                return encode(*args, **kwargs)

        def timed_predict(*args, **kwargs):
            with phase("unet forward"):
                return predict(*args, **kwargs)

        family.encode, family.predict = timed_encode, timed_predict

    def trained_modules(self) -> dict[str, torch.nn.Module]:
        unwrap = self.accelerator.unwrap_model
        return {name: unwrap(module) for name, module in self.trainer.trained_modules().items()}

    def step(self) -> torch.Tensor:
        """One optimizer step (gradient accumulation 1); returns the loss."""
        trainer, accelerator, phase = self.trainer, self.accelerator, self.phases
        losses = []
        with accelerator.accumulate(*self.models):
            with phase("micro-batch loss (all)"):
                loss = trainer._micro_batch_loss(self.micro_batch)
            with phase("backward"):
                accelerator.backward(loss)
            with phase("clip_grad_norm_"):
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(self.params, trainer.config.max_grad_norm)
            with phase("optimizer and lr_scheduler steps"):
                self.updates.step(accelerator.scaler, accelerator.sync_gradients)
            with phase("zero_grad"):
                trainer.optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        with phase("loss logging (gather; read one step late)"):
            self.log.add(self.micro_batch + 1, losses, self.updates.lrs)
        self.micro_batch += 1
        return loss.detach()


def host_syncs(step: Callable[[], torch.Tensor], steps: int) -> tuple[float, list[tuple[str, int]]]:
    """CUDA calls per step that make the host wait for all queued device work (torch's sync debug mode:
    copies from pageable memory, `.item()`, stream and device synchronisations; a wait on one event, as
    `LossLog`'s for the step before, is not one), and the five source lines making the most."""
    synchronize(torch.device("cuda"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower())
    return sum(sites.values()) / steps, sites.most_common(5)


# Operations that compute nothing: they make tensors' storage or metadata, never launch a kernel.
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "detach", "lift_fresh", "alias", "_unsafe_view",
              "_local_scalar_dense"}


def dispatched_ops(step: Callable[[], torch.Tensor], steps: int) -> float:
    """Tensor operations a step dispatches to the device, forward and backward (views and allocations
    aside): on a GPU each is at least one kernel launch, what a launch-bound step waits on."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func._schema.name.removeprefix("aten::") not in _NO_KERNEL:
                Counting.count += 1
            return func(*args, **(kwargs or {}))

    with Counting():  # the autograd engine's threads run the backward under it too
        for _ in range(steps):
            step()
    return Counting.count / steps


@contextmanager
def peft_lora_layers() -> Iterator[None]:
    """gors' LoRA set-up leaving peft's linear layers as peft makes them (`gors.lora` gives them the fused forward
    of `gors.core.fused_lora` otherwise; `AdapterCast` then finds no layer to cast for)."""
    import gors.lora

    fuse = gors.lora.fuse_lora_forward
    gors.lora.fuse_lora_forward = lambda module: 0
    try:
        yield
    finally:
        gors.lora.fuse_lora_forward = fuse


def gors_trainer(model_dir: Path, run_dir: Path, accelerator, *, train_text_encoder: bool, resolution: int,
                 seed: int, mixed_precision: str, torch_compile: str = "no", train_batch_size: int = 2):
    from gors.train import GORSTrainer

    config = TrainConfig(pretrained_model_name_or_path=str(model_dir), output_dir=str(run_dir), resolution=resolution,
                         train_batch_size=train_batch_size, train_text_encoder=train_text_encoder,
                         mixed_precision=mixed_precision,
                         report_to="none", seed=seed, max_train_steps=15000, torch_compile=torch_compile)
    return GORSTrainer(config, accelerator)


def copy_adapters(source: dict[str, torch.nn.Module], target: dict[str, torch.nn.Module]) -> None:
    """Give `target`'s LoRA weights the values of `source`'s (same component names and module trees)."""
    for name, module in source.items():
        weights = dict(target[name].named_parameters())
        for key, parameter in module.named_parameters():
            if "lora_" in key:
                weights[key].data.copy_(parameter.data)


def adapter_weights(modules: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{name}.{key}": p.detach().float().cpu().clone() for name, module in modules.items()
            for key, p in module.named_parameters() if "lora_" in key}


# ----- measuring ----------------------------------------------------------------------------------
class _QuietCast(logging.Filter):
    """Drops diffusers' warning on `ModelMixin.to(dtype=...)` (the reference casts as the script does), which
    fires even when no module has to stay in fp32 (`... kept in float32: []`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "should be kept in float32: []" not in record.getMessage()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def breakdown(loops: dict[str, GorsLoop | ReferenceLoop], steps: int) -> dict[str, tuple[dict[str, float], float]]:
    """Per loop, the median seconds of each phase over `steps` steps and the median seconds of a whole
    step (the loops' steps interleaved; the device synchronised around every phase)."""
    per_step: dict[str, list[tuple[dict[str, float], float]]] = {name: [] for name in loops}
    for _ in range(steps):
        for name, loop in loops.items():
            device = loop.accelerator.device
            loop.phases.seconds.clear()
            loop.phases.enabled = True
            synchronize(device)
            start = time.perf_counter()
            loop.step()
            synchronize(device)
            per_step[name].append((dict(loop.phases.seconds), time.perf_counter() - start))
            loop.phases.enabled = False
    medians = {}
    for name, records in per_step.items():
        phases = {phase: statistics.median(r[0].get(phase, 0.0) for r in records) for phase in records[0][0]}
        medians[name] = phases, statistics.median(r[1] for r in records)
    return medians


def print_breakdown(title: str, phases: dict[str, float], total: float) -> None:
    log(f"\n{title}: {1000 * total:.1f} ms per step")
    own = {"unet forward", "text encoder forward", "backward"}
    inner = phases.get("micro-batch loss (all)")
    if inner is not None:  # gors: what _micro_batch_loss spends beside the two forwards
        phases = dict(phases)
        phases["micro-batch preparation (latent draw, noise, indexing, loss)"] = (
            phases.pop("micro-batch loss (all)") - phases.get("unet forward", 0.0) - phases.get("text encoder forward", 0.0))
    phases["between the phases (median step minus the phases' medians)"] = total - sum(phases.values())
    for name, seconds in sorted(phases.items(), key=lambda item: -item[1]):
        mark = "" if name in own else "  <- not the models' own forward/backward"
        log(f"  {name:60s} {1000 * seconds:9.2f} ms  {100 * seconds / total:5.1f} %{mark}")
    other = sum(s for name, s in phases.items() if name not in own)
    log(f"  {'everything but the U-Net and text encoder forward and backward':60s} {1000 * other:9.2f} ms  "
        f"{100 * other / total:5.1f} %")


def profile(loop: GorsLoop, steps: int, rows: int) -> None:
    """torch.profiler over `steps` gors steps: the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if loop.accelerator.device.type == "cuda" else [])
    loop.phases.enabled = True
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            loop.step()
    loop.phases.enabled = False
    log(f"\ntorch.profiler, {steps} gors steps with both LoRAs, top {rows} ops by self CPU time:")
    log(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    parser = argparse.ArgumentParser(prog="train_step.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed pairs of steps per row")
    parser.add_argument("--full-size", action="store_true", help="SD-2-base's real U-Net, text encoder and VAE")
    parser.add_argument("--host-bound", action="store_true",
                        help="SD-2-base's layers, blocks and heads at the least widths, 64 px: on the CPU, the host's "
                             "work per step (what a launch-bound GPU step waits on)")
    parser.add_argument("--peft_layers", action="store_true",
                        help="gors with peft's own LoRA linear layers instead of its fused ones (gors.core.fused_lora), "
                             "to measure what the fused layers save")
    parser.add_argument("--resolution", type=int, default=None, help="image side; default 192 (reduced) / 512 (full)")
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None,
                        help="gors'; default fp16 on a GPU (gors' shipped GPU configs), no on a CPU")
    parser.add_argument("--reference_precision", choices=["no", "fp16", "bf16"], default="no",
                        help="the reference's: no (fp32, the default), as GORS' script trained (its own "
                             "--mixed_precision default 'no' overrides train.sh's accelerate launch "
                             "--mixed_precision=fp16), or gors' --mixed_precision for the ratio at equal precision")
    parser.add_argument("--torch_compile", default="no",
                        help="gors' torch.compile backend for the U-Net (the official train.sh: --dynamo_backend=no)")
    parser.add_argument("--steps_per_timing", type=positive_int, default=None,
                        help="consecutive steps in each timed call, the device synchronised only at its ends, as a "
                             "training loop runs them; default 3 on a GPU (where the host queues ahead), 1 on a CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gors_batch_size", type=positive_int, default=GORS_BATCH,
                        help=f"above {GORS_BATCH}: a third row, gors' step with both LoRAs at this per-process batch "
                             f"against the reference's at GORS' {GORS_BATCH}, per sample (the same global batch on "
                             "fewer GPUs); it prices `cost_model.py --train_batch_size` of the same size")
    parser.add_argument("--both_loras_only", action="store_true",
                        help="skip the U-Net-LoRA-only row (a compiling run then compiles half as much)")
    parser.add_argument("--profile", action="store_true",
                        help="also break a gors step with both LoRAs down by phase and print torch.profiler's top ops")
    parser.add_argument("--profile_steps", type=int, default=5, help="steps of each loop in the breakdown")
    args = parser.parse_args(argv)
    device = checked_device(parser, args)
    args.mixed_precision = args.mixed_precision or ("fp16" if device.type == "cuda" else "no")
    if args.reference_precision not in ("no", args.mixed_precision):
        parser.error(f"--reference_precision {args.reference_precision}: the reference runs in fp32 (no) or in gors' "
                     f"--mixed_precision ({args.mixed_precision}); accelerate holds one mixed precision per process")
    tolerance = max(LOSS_TOLERANCE[args.mixed_precision], LOSS_TOLERANCE[args.reference_precision])
    args.steps_per_timing = args.steps_per_timing or (3 if device.type == "cuda" else 1)

    from gors.core.distributed import make_accelerator, reset_process_state

    logging.getLogger("diffusers.models.modeling_utils").addFilter(_QuietCast())

    if args.full_size and args.host_bound:
        parser.error("--full-size and --host-bound are two sizes: pass one")
    sizes = sizes_for(args.full_size, args.resolution, args.host_bound)
    results = []
    with tempfile.TemporaryDirectory(prefix="train_step_") as tmp:
        root = Path(tmp)
        tokenizer = clip_tokenizer(root)
        model_dir = write_model_folder(root / "model", sizes, tokenizer)
        run_dir = root / "run"
        rows = write_selected_run(run_dir, sizes.resolution, seed=args.seed,
                                  images_per_prompt=max(2, -(-args.gors_batch_size // len(PROMPTS))))
        log(f"[train_step] building {sizes.label} at {sizes.resolution} px on {device} ...")
        base = build_models(sizes, device, args.seed)
        variant = "" if args.torch_compile == "no" else \
            f", gors' U-Net and trained text encoder compiled ({args.torch_compile})"
        variant += ", gors with peft's LoRA layers" if args.peft_layers else ""

        named = {"no": "fp32"}
        gors_precision = named.get(args.mixed_precision, args.mixed_precision)
        reference_precision = named.get(args.reference_precision, args.reference_precision)
        precisions = (gors_precision if reference_precision == gors_precision else
                      f"gors {gors_precision}, reference {reference_precision}")

        def size_text(batch: str) -> str:
            return (f"{sizes.label}: U-Net {millions(base['unet'])}, text encoder {millions(base['text_encoder'])}, "
                    f"VAE {millions(base['vae'])}; {sizes.resolution} px, batch {batch}, {len(rows)} selected images, "
                    f"{precisions}, {device.type}{variant}")

        reset_process_state()
        accelerator = make_accelerator(mixed_precision=args.mixed_precision)
        settings = [(True, GORS_BATCH)] if args.both_loras_only else [(False, GORS_BATCH), (True, GORS_BATCH)]
        if args.gors_batch_size != GORS_BATCH:
            settings.append((True, args.gors_batch_size))
        for train_text_encoder, gors_batch in settings:
            label = "U-Net + text-encoder LoRA (gors' default)" if train_text_encoder else "U-Net LoRA only"
            per_sample = gors_batch != GORS_BATCH
            if per_sample:
                label += f", gors at batch {gors_batch}, per sample"
            trainer = gors_trainer(model_dir, run_dir, accelerator, train_text_encoder=train_text_encoder,
                                   resolution=sizes.resolution, seed=args.seed, mixed_precision=args.mixed_precision,
                                   torch_compile=args.torch_compile, train_batch_size=gors_batch)
            with peft_lora_layers() if args.peft_layers else nullcontext():
                ours = GorsLoop(trainer, base)
            log(f"[train_step] {label}: gors' one-off caching (latents"
                f"{'' if train_text_encoder else ' and text embeddings'}, {len(rows)} images): {ours.cache_seconds:.2f} s")
            from diffusers import DDPMScheduler

            def reference_loop(order: Callable[[int], list[int]], batch: int) -> ReferenceLoop:
                return ReferenceLoop(
                    {name: copy.deepcopy(model) for name, model in base.items()}, tokenizer,
                    DDPMScheduler.from_pretrained(str(model_dir), subfolder="scheduler"), samples_dir(run_dir), rows,
                    order, accelerator, train_text_encoder=train_text_encoder, resolution=sizes.resolution,
                    precision=args.reference_precision, train_batch_size=batch)

            # gors' first steps against the official loop's on the same batches (for a per-sample row, the official
            # loop at gors' batch, untimed), untimed (also the warm-up: AdamW's state is made, graphs are compiled,
            # and CUDA graphs warmed up, recorded and, at the third, replayed), each from the same seed and draws.
            checking = reference_loop(trainer.schedule.indices, gors_batch)
            copy_adapters(ours.trained_modules(), checking.trained_modules())
            differences = []
            with same_draws():
                for step in range(AGREEMENT_STEPS):
                    torch.manual_seed(args.seed + step)
                    reference_loss = checking.step().item()
                    torch.manual_seed(args.seed + step)
                    gors_loss = ours.step().item()
                    log(f"[train_step] {label}: step {step + 1} from seed {args.seed + step}, same LoRA init and "
                        f"draws: reference loss {reference_loss:.7f}, gors loss {gors_loss:.7f}")
                    differences.append(abs(reference_loss - gors_loss) / max(abs(reference_loss), 1e-12))
            # The same steps of the same models on the same batches: the losses agree to float rounding.
            if max(differences) > tolerance:
                raise SystemExit(f"[train_step] {label}: the losses of the first {AGREEMENT_STEPS} steps differ by "
                                 f"up to {max(differences):.1e} (relative), more than {tolerance:g}: the two loops "
                                 "do not train alike")
            agreement = f"losses of the first {AGREEMENT_STEPS} steps {max(differences):.0e}"
            if per_sample:  # the timed reference trains GORS' batch, its first steps untimed as gors' were
                agreement += f" (against the official loop at batch {gors_batch})"
                checking.release()
                del checking
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                reference = reference_loop(pairs_in_order(len(rows)), GORS_BATCH)
                for _ in range(AGREEMENT_STEPS):
                    reference.step()
                ours.step()  # its first step after the checking loop's memory went back (pages faulted in anew)
            else:
                reference = checking
            seconds = {"reference": [], "gors": []}

            def clocked(name: str, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
                def run() -> torch.Tensor:
                    synchronize(device)
                    start = time.perf_counter()
                    for _ in range(args.steps_per_timing):
                        loss = step()
                    synchronize(device)
                    seconds[name].append(time.perf_counter() - start)
                    return loss
                return run

            ratios, _, _ = paired_ratios(clocked("reference", reference.step), clocked("gors", ours.step), device,
                                         args.repeats, warmup=0)
            # Per sample: a gors step trains gors_batch samples, a reference step GORS_BATCH.
            ratios = [ratio * gors_batch / GORS_BATCH for ratio in ratios]
            data = statistics.median(reference.data_seconds[-args.repeats * args.steps_per_timing:])
            per_step = {name: statistics.median(times[-args.repeats:]) / args.steps_per_timing
                        for name, times in seconds.items()}
            log(f"[train_step] {label}: step s (median, {args.steps_per_timing} per timing) reference "
                f"{per_step['reference']:.3f} (of which data loading {data:.3f}), gors {per_step['gors']:.3f}; "
                f"ratios {', '.join(f'{r:.2f}' for r in ratios)}")
            if args.torch_compile == "no":  # under a dispatch mode dynamo runs the eager code: no count of compiled
                operations = {name: dispatched_ops(loop.step, 2) for name, loop in (("reference", reference),
                                                                                     ("gors", ours))}
                log(f"[train_step] {label}: operations dispatched per step (views and allocations aside): reference "
                    f"{operations['reference']:.0f}, gors {operations['gors']:.0f}")
            if device.type == "cuda":
                for name, loop in (("reference", reference), ("gors", ours)):
                    per_step_syncs, sites = host_syncs(loop.step, 3)
                    log(f"[train_step] {label}: {name} synchronises host and device {per_step_syncs:g} times a step"
                        + (f", at {'; '.join(f'{site} ({n})' for site, n in sites)}" if sites else ""))
            results.append(SpeedResult(
                f"training step, {label}",
                "diffusers' `train_text_to_image_lora.py` loop as GORS ran it (images loaded by one worker and "
                "VAE-encoded every step)",
                size_text(f"{gors_batch} (gors) and {GORS_BATCH} (reference)" if per_sample else str(GORS_BATCH)),
                ratios, agreement,
                # The both-LoRA row at the asked batch prices training in `cost_model.py`.
                "train" if train_text_encoder and gors_batch == args.gors_batch_size else None, batch=gors_batch))
            if args.profile and train_text_encoder and not per_sample:
                medians = breakdown({"gors": ours, "reference": reference}, args.profile_steps)
                print_breakdown(f"gors step, both LoRAs, by phase (medians of {args.profile_steps})", *medians["gors"])
                print_breakdown(f"reference step, both LoRAs, by phase (medians of {args.profile_steps})",
                                *medians["reference"])
                profile(ours, 2, 25)
            del trainer, ours, reference
            accelerator.free_memory()
            gc.collect()
        reset_process_state()
    return results


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
