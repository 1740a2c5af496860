"""Training data: VAE latents of the selected samples, cached once, and a resumable batch order.

The training loop never runs the VAE encoder: each selected image is encoded once, and its latent
distribution (mean and std of the diagonal Gaussian) is cached. Every step draws a fresh latent
from that distribution, exactly what encoding on the fly would give, for the cost of one randn.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from torchvision import transforms

from gors.core.distributed import batches, progress_bar
from gors.core.store import SampleStore


def image_transform(resolution: int, center_crop: bool) -> transforms.Compose:
    """Official GORS preprocessing: resize, centre crop, no flip, scale to [-1, 1]."""
    crop = transforms.CenterCrop(resolution) if center_crop else transforms.Resize((resolution, resolution))
    return transforms.Compose(
        [
            transforms.Resize(resolution, interpolation=transforms.InterpolationMode.BILINEAR),
            crop,
            transforms.ToTensor(),
            transforms.Normalize([0.5], [0.5]),
        ]
    )


def _fingerprint(selection: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    payload = json.dumps([[row["path"], row["reward"]] for row in selection] + [settings], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@torch.no_grad()
def cached_latent_distributions(
    selection: list[dict[str, Any]],
    store: SampleStore,
    vae: torch.nn.Module,
    accelerator: Accelerator,
    cache_root: Path,
    resolution: int,
    center_crop: bool,
    model_id: str,
    batch_size: int = 8,
) -> dict[str, torch.Tensor]:
    """`{"mean", "std"}` of the VAE latent distribution of every selected image, in selection order.

    Encoded once, sharded over the processes; reused on reruns while the selection, resolution,
    crop and model are unchanged (the cache file name is a hash of them).
    """
    key = _fingerprint(selection, {"resolution": resolution, "center_crop": center_crop, "model": model_id})
    final = cache_root / f"{key}.safetensors"
    if not final.exists():
        world = accelerator.num_processes
        part = cache_root / f"{key}.part-{accelerator.process_index:05d}-of-{world:05d}.safetensors"
        if not part.exists():
            transform = image_transform(resolution, center_crop)
            means, stds = [], []
            # A contiguous share of the selection per process; the merge below puts them back in order.
            with accelerator.split_between_processes(list(range(len(selection)))) as indices:
                bar = progress_bar(len(indices), accelerator, "encode latents")
                for batch in batches(indices, batch_size):
                    pixels = torch.stack([transform(store.open_image(selection[i])) for i in batch])
                    dist = vae.encode(pixels.to(accelerator.device, vae.dtype)).latent_dist
                    means.append(dist.mean.float().cpu())
                    stds.append(dist.std.float().cpu())
                    bar.update(len(batch))
                bar.close()
            tensors = {"index": torch.tensor(indices, dtype=torch.long)}
            if indices:
                tensors |= {"mean": torch.cat(means).contiguous(), "std": torch.cat(stds).contiguous()}
            cache_root.mkdir(parents=True, exist_ok=True)
            tmp = part.with_suffix(".tmp")
            save_file(tensors, str(tmp))
            tmp.replace(part)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            parts = sorted(cache_root.glob(f"{key}.part-*-of-{world:05d}.safetensors"))
            loaded = [load_file(str(p)) for p in parts]
            loaded = [t for t in loaded if "mean" in t]
            order = torch.cat([t["index"] for t in loaded]).argsort()
            merged = {name: torch.cat([t[name] for t in loaded])[order].contiguous() for name in ("mean", "std")}
            if len(order) != len(selection):
                raise RuntimeError(f"latent cache {key}: {len(order)} latents for {len(selection)} samples")
            tmp = final.with_suffix(".tmp")
            save_file(merged, str(tmp))
            tmp.replace(final)
            for p in parts:
                p.unlink()
        accelerator.wait_for_everyone()
    return load_file(str(final))


@dataclass(frozen=True)
class BatchSchedule:
    """Which samples form micro-batch m, for any m, on this process.

    Epoch e is a permutation of the dataset seeded by (seed, e), cut into global batches of
    `batch_size * num_processes`; process r takes its slice of each. The last global batch of an
    epoch wraps around to the permutation's start so every batch is full. A resumed run asks for
    micro-batch `step * accumulation` and gets exactly what the uninterrupted run would have.
    """

    num_samples: int
    batch_size: int
    num_processes: int
    process_index: int
    seed: int

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.num_processes

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.num_samples // self.global_batch)

    def indices(self, micro_batch: int) -> list[int]:
        epoch, position = divmod(micro_batch, self.batches_per_epoch)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.num_samples, generator=generator).tolist()
        start = position * self.global_batch + self.process_index * self.batch_size
        return [order[(start + j) % self.num_samples] for j in range(self.batch_size)]
