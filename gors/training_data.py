"""Training data: VAE latents (and frozen text encodings) cached once, and a resumable batch order.

The training loop never runs the VAE encoder: each selected image is encoded once, and its latent
distribution (mean and std of the diagonal Gaussian) is cached. Every step draws a fresh latent
from that distribution, exactly what encoding on the fly would give, for the cost of one randn.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate import Accelerator
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torchvision import transforms

from gors._moved import moved_names
from gors.core.distributed import main_process_decides, progress_bar
from gors.core.io import fsync_path, set_usual_permissions
from gors.core.logs import own_work_logger
from gors.core.memory import MORE_MEMORY, in_batches_that_fit
from gors.core.store import selection_identity

# 0.1 names that moved in 0.2 (CHANGELOG.md); they warn and forward until 0.3.
__getattr__ = moved_names(__name__, {
    "CACHE_DIR": "gors.core.run_folder:LATENT_CACHE_DIR",
})

logger = own_work_logger(__name__)  # this process's cache parts


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
    payload = json.dumps(selection_identity(selection) + [settings], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cache_damage(path: Path, rows: int | None = None) -> str | None:
    """What makes a cache file unusable (a header that does not read, e.g. a file cut short; tensors of
    other lengths than `rows`, or than each other), in words; None when it reads. Header only."""
    from safetensors import SafetensorError

    try:
        with safe_open(str(path), "pt") as handle:
            lengths = {handle.get_slice(key).get_shape()[0] for key in handle.keys()}
    except (SafetensorError, OSError, IndexError) as err:  # IndexError: a 0-d tensor, which no cache holds
        return f"{err}"
    if len(lengths) > 1 or (rows is not None and lengths != {rows}):
        return f"its tensors hold {sorted(lengths)} rows, {rows if rows is not None else 'all the same'} expected"
    return None


def _drop_damaged(path: Path, rows: int | None) -> None:
    """Delete a cache file that does not read, with a warning (from any process): it is computed again."""
    if path.exists() and (problem := cache_damage(path, rows)) is not None:
        logger.warning("%s is damaged (%s); computing it again", path, problem)
        path.unlink()


def sharded_cache(
    path: Path,
    num_items: int,
    compute: Callable[[list[int]], dict[str, torch.Tensor]],
    accelerator: Accelerator,
    batch_size: int,
    description: str,
) -> dict[str, torch.Tensor]:
    """Tensors computed once per item, in item order, cached in the safetensors file `path`.

    The items are computed `batch_size` at a time (`compute(indices)` returns each named tensor with one
    row per index). One process writes `path` itself, atomically; under several, each computes a contiguous
    share and writes its part atomically, and the main process merges the parts into `path`. A kill at any
    point loses at most the unfinished parts: a rerun reuses `path`, or the finished parts, and computes
    only the rest. A file that does not read (`cache_damage`) is computed again.
    """
    stem = path.name.removesuffix(".safetensors")

    def cached() -> bool:
        _drop_damaged(path, num_items)
        if not path.exists():
            return False
        _remove_parts(path.parent, stem)  # a launch killed between its merge and its clean-up left them
        return True

    # Decided once: processes that each looked at a network filesystem could disagree, and wait at other barriers.
    if main_process_decides(accelerator.state, cached):
        return load_file(str(path))
    world = accelerator.num_processes
    if world == 1:  # the one share is the whole cache, in item order: written as the cache itself
        cache = _write_share(path, list(range(num_items)), compute, accelerator, batch_size, description)
        _remove_parts(path.parent, stem)
        return cache
    part = path.with_name(f"{stem}.part-{accelerator.process_index:05d}-of-{world:05d}.safetensors")
    _drop_damaged(part, None)
    if not part.exists():
        with accelerator.split_between_processes(list(range(num_items))) as indices:
            _write_share(part, indices, compute, accelerator, batch_size, description, with_index=True)
    accelerator.wait_for_everyone()
    merged = None
    if accelerator.is_main_process:
        merged = _merge_parts(path, sorted(path.parent.glob(f"{stem}.part-*-of-{world:05d}.safetensors")), num_items)
        _remove_parts(path.parent, stem)
    accelerator.wait_for_everyone()
    return merged if merged is not None else load_file(str(path))


def _remove_parts(folder: Path, stem: str) -> None:
    """Delete the parts of cache `stem` (their temporary files too): this launch's, merged, and any a launch at
    another process count was killed before merging. A merge killed before its rename leaves `<stem>.tmp`, which
    the next write of the cache replaces (`_save_atomically`)."""
    for stale in folder.glob(f"{stem}.part-*"):
        stale.unlink(missing_ok=True)


def _write_share(target: Path, indices: list[int], compute: Callable[[list[int]], dict[str, torch.Tensor]],
                 accelerator: Accelerator, batch_size: int, description: str,
                 with_index: bool = False) -> dict[str, torch.Tensor]:
    """Compute the items `indices` and write them atomically to `target` (`with_index`: with an `index`
    tensor, for the merge); returns the tensors. Each tensor is joined as its batches are let go: a
    paper-size latent cache is gigabytes, held here about twice while it is written. A batch that runs the
    device out of memory is halved (FLUX's VAE encodes a 1024 px image in about 2.6 GB, beside the transformer);
    an item's values depend on it alone, so the cache holds the same ones at any batch size, to float rounding."""
    rows: dict[str, list[torch.Tensor]] = {}
    bar = progress_bar(len(indices), accelerator, description)

    def work(batch: list[int]) -> None:
        for name, value in compute(batch).items():
            rows.setdefault(name, []).append(value.cpu())
        bar.update(len(batch))

    in_batches_that_fit(indices, batch_size, work, f"caching ({description})", "items", None, MORE_MEMORY)
    bar.close()
    tensors = {"index": torch.tensor(indices, dtype=torch.long)} if with_index else {}
    for name in list(rows):
        tensors[name] = torch.cat(rows.pop(name)).contiguous()
    target.parent.mkdir(parents=True, exist_ok=True)
    _save_atomically(tensors, target)
    return tensors


def _merge_parts(path: Path, parts: list[Path], num_items: int) -> dict[str, torch.Tensor]:
    """The processes' `parts` joined in item order, written atomically to `path` and returned. Read one
    tensor at a time, so that no part is held whole beside the result."""
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(p), "pt")) for p in parts]
        handles = [h for h in handles if len(h.keys()) > 1]  # a process may have had no items
        index = torch.cat([h.get_tensor("index") for h in handles])
        # The shares are contiguous and in process order (`split_between_processes`).
        if not torch.equal(index, torch.arange(num_items)):
            raise RuntimeError(f"{path}: its parts hold {len(index)} rows, not items 0 to {num_items - 1} in order")
        merged = {name: torch.cat([h.get_tensor(name) for h in handles]) for name in handles[0].keys()
                  if name != "index"}
    _save_atomically(merged, path)
    return merged


def _save_atomically(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write `tensors` to the safetensors file `path` whole or not at all (beside it, flushed, then renamed): a
    power cut must not leave a cache whose header reads but whose tensors are zeros (`cache_damage` reads the
    header only)."""
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    fsync_path(tmp)
    set_usual_permissions(tmp)  # safetensors creates it owner-only
    tmp.replace(path)


def text_cache_name(component: str, prompts: list[str], tokens: torch.Tensor, model_id: str, revision: str | None,
                    dtype: torch.dtype, commit: str | None = None) -> str:
    """The cache file of one frozen text encoder's outputs: a hash of what they depend on (the model's
    version too, where known: `commit`, a Hub commit or a local folder's fingerprint, as the weights behind
    a name change when the Hub repository or the folder does)."""
    parts = [component, prompts, tokens.shape[1], model_id, revision, str(dtype)]
    if dtype == torch.float16:  # encoders load in fp16 with transformers' fp32 layers (T5's `wo`) since 0.2
        parts.append("keep_in_fp32")
    if commit is not None:  # absent otherwise, so that caches made before it was recorded stay valid
        parts.append(commit)
    payload = json.dumps(parts)
    return f"{component}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}.safetensors"


def crop_top_left(height: int, width: int, resolution: int, center_crop: bool) -> tuple[int, int]:
    """Where `image_transform` crops an image of this size: (top, left) in the resized image's pixels."""
    if not center_crop:
        return 0, 0
    short = min(height, width)
    # torchvision's Resize(resolution): the short side to `resolution`, the long one int(resolution * long / short).
    resized_height = resolution if height == short else int(resolution * height / short)
    resized_width = resolution if width == short else int(resolution * width / short)
    return int(round((resized_height - resolution) / 2.0)), int(round((resized_width - resolution) / 2.0))


def latent_cache_path(selection: list[dict[str, Any]], cache_root: Path, resolution: int, center_crop: bool,
                      model_id: str, revision: str | None = None, commit: str | None = None) -> Path:
    """The file `cached_latent_distributions` keeps these latents in (a hash of what they depend on, the
    model's version too where known: `text_cache_name`)."""
    settings = {"resolution": resolution, "center_crop": center_crop, "model": model_id, "sizes": True}
    if revision is not None:  # absent otherwise, so that caches made before it was recorded stay valid
        settings["revision"] = revision
    if commit is not None:  # the same
        settings["commit"] = commit
    return cache_root / f"{_fingerprint(selection, settings)}.safetensors"


@torch.no_grad()
def cached_latent_distributions(
    selection: list[dict[str, Any]],
    open_image: Callable[[dict[str, Any]], Image.Image],
    vae: torch.nn.Module,
    accelerator: Accelerator,
    cache_root: Path,
    resolution: int,
    center_crop: bool,
    model_id: str,
    batch_size: int = 8,
    revision: str | None = None,
    commit: str | None = None,
) -> dict[str, torch.Tensor]:
    """The VAE latent distribution of every selected image (`open_image(row)`), in selection order.

    `mean` and `std` of the diagonal Gaussian, plus each image's `original_size` (height, width)
    and `crop_top_left` (SDXL's micro-conditioning). Encoded once, sharded over the processes;
    reused on reruns while the selection, resolution, crop and model (its `revision`, and its Hub
    `commit` where known) are unchanged (the cache file name is a hash of them).
    """
    transform = image_transform(resolution, center_crop)

    def encode(indices: list[int]) -> dict[str, torch.Tensor]:
        images = [open_image(selection[i]) for i in indices]
        pixels = torch.stack([transform(image) for image in images])
        dist = vae.encode(pixels.to(accelerator.device, vae.dtype)).latent_dist
        sizes = [(image.height, image.width) for image in images]
        return {
            "mean": dist.mean.float(),
            "std": dist.std.float(),
            "original_size": torch.tensor(sizes, dtype=torch.long),
            "crop_top_left": torch.tensor([crop_top_left(h, w, resolution, center_crop) for h, w in sizes],
                                          dtype=torch.long),
        }

    path = latent_cache_path(selection, cache_root, resolution, center_crop, model_id, revision, commit)
    return sharded_cache(path, len(selection), encode, accelerator, batch_size, "encode latents")


@dataclass(frozen=True)
class BatchSchedule:
    """Which samples form micro-batch m, for any m, on this process.

    Epoch e is a permutation of the dataset seeded by (seed, e), cut into updates of
    `batch_size * num_processes * accumulation` samples; micro-batch m is part `m % accumulation` of
    update `m // accumulation`, and process r takes its slice of each part. The last update of an
    epoch wraps around to the permutation's start so every update is full. An update so holds the
    same samples however it is split into processes and micro-batches (2 per GPU x 8 GPUs, 2 x 8
    accumulated on one, 16 at once). A resumed run asks for micro-batch `step * accumulation` and gets
    exactly what the uninterrupted run would have.
    """

    num_samples: int
    batch_size: int
    num_processes: int
    process_index: int
    seed: int
    accumulation: int = 1

    @property
    def update_size(self) -> int:
        return self.batch_size * self.num_processes * self.accumulation

    @property
    def updates_per_epoch(self) -> int:
        return -(-self.num_samples // self.update_size)

    def indices(self, micro_batch: int) -> list[int]:
        update, part = divmod(micro_batch, self.accumulation)
        epoch, position = divmod(update, self.updates_per_epoch)
        order = epoch_order(self.num_samples, self.seed + epoch)
        start = position * self.update_size + (part * self.num_processes + self.process_index) * self.batch_size
        return [order[(start + j) % self.num_samples] for j in range(self.batch_size)]


@functools.lru_cache(maxsize=2)
def epoch_order(num_samples: int, seed: int) -> tuple[int, ...]:
    """The permutation of `range(num_samples)` seeded by `seed`, kept: each of an epoch's micro-batches
    reads it, and drawing it again for each took milliseconds per micro-batch at the paper's size."""
    return tuple(torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed)).tolist())
