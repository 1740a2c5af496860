"""Sampling a prompt set into a sample store: k images per prompt, resumable, sharded over processes.

What an image depends on: its prompt and seed, the settings the store records (model, revision,
LoRA, scheduler, dtype, resolution, steps, guidance, seed rule, gors version), the device, the
library versions and the number of CPU threads, and the batch it is generated in (its size and the
prompts beside it: kernels split their work over the batch dimension), by one 1/255 step in a few
pixels on CPU. Two runs on one machine that batch an image alike (the same missing samples, batch
size, number of processes and threads) give it bit-identical; a resumed run or another number of
processes may batch it differently. docs/run_folders.md ("Output layout") says what was measured.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from accelerate import Accelerator
from PIL import Image

import gors
from gors.core.clock import units_done, work_starts
from gors.core.distributed import (
    NOT_VISIBLE,
    SAME_SNAPSHOT_FIX,
    check_agreement,
    main_process_decides,
    progress_bar,
    wait_until_visible,
)
from gors.core.hub import recording_loads
from gors.core.io_threads import OrderedWorker
from gors.core.memory import DROP_OVERLAP, MORE_MEMORY, BatchLimit, in_batches_that_fit
from gors.core.pipeline import component_dtypes, cpu_generators, dtypes_restored_on_out_of_memory
from gors.core.prompts import clean_prompt
from gors.core.store import (
    SETTINGS,
    SampleStore,
    StoreError,
    adopt_later_settings,
    check_cached_commits,
    check_model_commits,
    moved_local_model,
    record_moved_model,
    recorded_model_commits,
    same_value,
    sample_file_name,
    sample_key,
    sample_seed,
    settings_changes,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreFlags:
    """What a refusal tells the user to change: the flags that chose the prompts, and those a
    store may change (the defaults are `gors generate`'s; `gors evaluate` passes its own)."""

    prompts: str = "the --train_prompts that made this store"
    may_change: str = "--images_per_prompt and --max_prompts"
    # What happens to images beyond --images_per_prompt; None: refused, as the stages after this one would use them all.
    extra_images: str | None = None
    batch_flag: str | None = "--generation_batch_size"  # sets the images per pipeline call; None: no such flag


def _check_same_prompts(store: SampleStore, records: Sequence[dict[str, Any]], prompts: list[str],
                        flags: StoreFlags) -> None:
    """Refuse to mix samples of two prompt sets in one store (`records`: its `SampleStore.records()`)."""
    held = 1 + max((record["prompt_index"] for record in records), default=-1)
    if held > len(prompts) and all(prompts[r["prompt_index"]] == r["prompt"] for r in records
                                   if r["prompt_index"] < len(prompts)):
        raise StoreError(
            f"{store.root} holds samples of {held} prompts and {len(prompts)} are asked for: the later stages would "
            f"use all {held}. Ask for {held} or more (--max_prompts {held} or more, with {flags.prompts}), or use a "
            "new --output_dir."
        )
    for record in records:
        index = record["prompt_index"]
        if index < len(prompts) and record["prompt"] != prompts[index] == clean_prompt(record["prompt"]):
            raise StoreError(
                f"{store.root} holds samples of prompt {index} as an older gors read it, {record['prompt']!r}, with "
                f"invisible characters at its ends that gors now strips ({prompts[index]!r}): generate into a new "
                "--output_dir (this store's images stay as they are)"
            )
        if index >= len(prompts) or prompts[index] != record["prompt"]:
            found = prompts[index] if index < len(prompts) else "<no such prompt>"
            raise StoreError(
                f"{store.root} holds samples of another prompt set (prompt {index}: {record['prompt']!r}, "
                f"now {found!r}). Use a new --output_dir, or {flags.prompts}."
            )


class SampleSink(Protocol):
    """Takes each generated batch as it lands in the store (e.g. `gors.core.background_scoring`)."""

    model_commits: dict[str, str | None]
    """After `open`: the version of each model the sink loaded (`gors.core.hub.model_version`)."""

    def open(self) -> None:
        """This process has images to generate; called before the pipeline loads."""

    def add(self, records: list[dict[str, Any]], images: list[Image.Image]) -> None:
        """A batch is in the store: its records (with their `path` in the store) and images."""

    def stop(self) -> None:
        """Generation failed or was interrupted: take no more batches, and return at once from an
        `add` that waits (on another thread)."""


@dataclass(frozen=True)
class SamplingProtocol:
    """How images are generated: k per prompt, sampler settings, and the seed of each image."""

    images_per_prompt: int
    num_inference_steps: int
    guidance_scale: float
    resolution: int
    batch_size: int = 8
    seed: int = 42
    seed_fn: Callable[[int, int, int], int] = sample_seed  # (base seed, prompt index, image index) -> seed
    # Further pipeline-call arguments the model family needs (e.g. PixArt's `use_resolution_binning`).
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """The fields that decide what an image is; not how many there are, nor the batch size."""
        return {
            "resolution": self.resolution,
            "num_inference_steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
            "seed": self.seed,
            "seed_rule": self.seed_fn.__name__,
        } | ({"call_kwargs": dict(self.call_kwargs)} if self.call_kwargs else {})


# Settings keys a later gors added: a store recorded before it lacks them and is taken
# to have been made with the current value (as a store without settings is), with a warning.
LATER_SETTINGS = ("lora_sha256", "call_kwargs")
# Settings a store records but does not compare: the gors that last added images. A release that changes what
# an image is under the same settings says so with a settings key of its own (as `lora_sha256` came), not by
# its version number, which would refuse every store an earlier release made.
INFORMATIONAL_SETTINGS = ("gors_version",)


def _check_same_settings(store: SampleStore, records: Sequence[dict[str, Any]], wanted: dict[str, Any],
                         flags: StoreFlags) -> list[str]:
    """Refuse to add images made with other settings to a store (`records`: its `SampleStore.records()`);
    returns the keys the recorded settings lacked and take from `wanted` (`LATER_SETTINGS`). A local base
    model moved elsewhere (`moved_local_model`) is the same model.

    A store without settings is adopted; so is one without records (the settings file is written
    before the first image, so a run stopped before it, or one that failed on a bad seed or LoRA,
    must not bind a corrected rerun to its settings).
    """
    recorded = store.load_settings()
    if recorded is None or not records:
        return []
    # The same weights, moved or copied elsewhere, by the sha256 the store itself recorded (one adopted
    # below from `wanted` says nothing): the store takes their new path.
    if recorded.get("lora_sha256") is not None and recorded["lora_sha256"] == wanted.get("lora_sha256"):
        recorded = {**recorded, "lora": wanted.get("lora")}
    recorded, adopted = adopt_later_settings(recorded, wanted, LATER_SETTINGS)
    recorded = {**recorded, **{key: wanted[key] for key in INFORMATIONAL_SETTINGS if key in wanted}}
    if recorded.get("revision") is None and wanted.get("revision") is None and \
            moved_local_model(recorded.get("model"), wanted.get("model"), recorded_model_commits(store.root)):
        recorded = {**recorded, "model": wanted.get("model")}
    changes = settings_changes(recorded, wanted)
    if changes:
        raise StoreError(
            f"{store.root} holds images generated with other settings ({'; '.join(changes)}). Generate into a "
            f"new --output_dir, or rerun with the settings that made it ({store.root / SETTINGS} lists them); "
            f"only {flags.may_change} may change in a store."
        )
    return adopted


# What `torch.Generator.manual_seed` accepts.
SEED_RANGE = (-(2**63), 2**64 - 1)


def check_seed_range(protocol: SamplingProtocol, num_prompts: int) -> None:
    """Refuse, before anything is written, a base seed that gives some image a seed torch cannot take."""
    seeds = [protocol.seed_fn(protocol.seed, p, i)
             for p in (0, num_prompts - 1) for i in (0, protocol.images_per_prompt - 1)]
    low, high = SEED_RANGE
    if min(seeds) < low or max(seeds) > high:
        least, most = low - (min(seeds) - protocol.seed), high - (max(seeds) - protocol.seed)
        raise ValueError(f"--seed={protocol.seed} gives image seeds in [{min(seeds)}, {max(seeds)}], outside the "
                         f"[{low}, {high}] torch accepts; pass a --seed in [{least}, {most}]")


def _prepare_store(store: SampleStore, prompts: list[str], protocol: SamplingProtocol, settings: Mapping[str, Any],
                   prompt_info: dict[str, Any] | None, accelerator: Accelerator, flags: StoreFlags) -> dict[str, Any]:
    """Check that `store` may take images of `prompts` under `protocol` and the pipeline `settings`, repair what an
    interruption left, and record the prompts and settings (main process); the settings the images are made with."""
    wanted = json.loads(json.dumps(
        {**protocol.settings(), "gors_version": gors.__version__, **settings}, sort_keys=True, default=str
    ))
    # On every process, so that all of them stop on a mismatch.
    check_seed_range(protocol, len(prompts))
    records = store.records()  # read once for both checks: at the paper's 63,000 records a parse takes about 0.4 s
    _check_same_prompts(store, records, prompts, flags)
    adopted = _check_same_settings(store, records, wanted, flags)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        store.cut_torn_records()  # their images are generated again, as their records are gone
        dropped = store.drop_records_without_image()
        if dropped:
            logger.warning("%d records had no image file and will be generated again", dropped)
        if store.load_settings() is None and store.records():
            logger.warning("%s was made before gors recorded generation settings; it is taken to have been made "
                           "with the current ones: %s", store.root, json.dumps(wanted, sort_keys=True))
        if adopted:
            logger.warning("%s was made before gors recorded %s; its images are taken to have been made with the "
                           "current value: %s", store.root, ", ".join(adopted),
                           json.dumps({key: wanted[key] for key in adopted}))
        store.save_prompts({**(prompt_info or {}), "prompts": prompts})
        # A path spelled otherwise now (`same_value`) keeps its recorded spelling, which the other stages compare with.
        recorded = store.load_settings() or {}
        store.save_settings({key: recorded[key] if key in recorded and same_value(recorded[key], value) else value
                             for key, value in wanted.items()})
        if isinstance(wanted.get("model"), str) and wanted.get("revision") is None:
            record_moved_model(store.root, wanted["model"])  # checked at its new path only from now on
    accelerator.wait_for_everyone()
    return wanted


def generate_samples(
    store: SampleStore,
    prompts: list[str],
    protocol: SamplingProtocol,
    pipeline_loader: Callable[[], Any],
    accelerator: Accelerator,
    prompt_info: dict[str, Any] | None = None,
    record_extras: dict[str, Any] | None = None,
    desc: str = "generate",
    settings: Mapping[str, Any] | None = None,
    sink: SampleSink | None = None,
    flags: StoreFlags = StoreFlags(),
    limit: BatchLimit | None = None,
) -> SampleStore:
    """Add the missing images of `protocol` for `prompts` to `store`, sharded over processes.

    Resumable: samples already in the store are skipped, so a rerun after an interruption only
    generates what is missing. The pipeline is loaded (by `pipeline_loader`) only if there is work.

    `settings` describe the pipeline (model, revision, LoRA, scheduler, dtype: see
    `gors.core.pipeline.pipeline_settings`); by default the `model` and `lora` of `prompt_info`.
    With the protocol's settings and the gors version they are recorded in `settings.json`
    before the first image, and a store that records other ones is refused, so that images of
    two models or protocols never mix.

    `sink` gets every batch once it is in the store (its `open` first, on processes with work).
    `flags` name, in a refusal or when the device runs out of memory, the flags to change. `limit`: the batch
    size that fit in an earlier call, and where this one's halvings go (`gors.core.memory.in_batches_that_fit`).
    """
    if settings is None:
        settings = {key: (prompt_info or {}).get(key) for key in ("model", "lora")}
    wanted = _prepare_store(store, prompts, protocol, settings, prompt_info, accelerator, flags)

    def plan() -> tuple[int, list[tuple[int, int]]]:
        done = {sample_key(record) for record in store.records()}
        most = 1 + max((i for _, i in done), default=-1)
        if most > protocol.images_per_prompt and flags.extra_images is None:
            raise StoreError(f"{store.root} holds up to {most} images per prompt and --images_per_prompt="
                             f"{protocol.images_per_prompt} is asked for: the later stages would use all of them. Ask "
                             f"for {most} or more, or use a new --output_dir.")
        if most > protocol.images_per_prompt:
            logger.warning("%s holds up to %d images per prompt, more than --images_per_prompt=%d; %s", store.root,
                           most, protocol.images_per_prompt, flags.extra_images)
        todo = [(p, i) for p in range(len(prompts)) for i in range(protocol.images_per_prompt) if (p, i) not in done]
        print(f"[{desc}] {len(done)} samples exist, {len(todo)} to generate into {store.root}")
        return len(done), todo

    # The main process's reading of the store for all: a node shown another process's new part late would split
    # another list, generating some images twice (recorded twice: every later stage stops) and some never.
    done, todo = main_process_decides(accelerator.state, plan)

    # Batches too large for the device are halved until they fit (`in_batches_that_fit`); if one image does not:
    at_one = MORE_MEMORY
    if sink is not None:
        at_one = f"{DROP_OVERLAP}, or {at_one}"
    if wanted.get("dtype") == "float32":
        at_one += ("; or generate in half precision (--mixed_precision fp16 or bf16), in a new --output_dir once "
                   "images are stored (a store keeps its precision)")
    # A contiguous share per process; the seed of an image never depends on the process (its batch may).
    with accelerator.split_between_processes(todo) as mine:
        loads = scoring_loads = None
        if mine:
            if sink is not None:
                sink.open()
                scoring_loads = dict(sink.model_commits)
            check_cached_commits(store.root, bool(done), "images", {str(settings.get("model")): settings.get("revision")})
            with recording_loads() as loads:
                pipeline = pipeline_loader()
            check_model_commits(store.root, loads, bool(done), "images")
        # Nodes whose own caches hold other snapshots of the model would mix two models' images in one store.
        check_agreement(accelerator.state, loads, "the models that generate", SAME_SNAPSHOT_FIX)
        if sink is not None:  # a sink on every process or on none
            check_agreement(accelerator.state, scoring_loads, "the models that score", SAME_SNAPSHOT_FIX)
        if mine:
            work_starts()
            bar = progress_bar(len(mine), accelerator, desc)

            def write(item: tuple[list[tuple[int, int]], list[int], list[Image.Image]]) -> None:
                batch, seeds, images = item
                records = [{
                    "file_name": sample_file_name(p, i),
                    "prompt": prompts[p],
                    "prompt_index": p,
                    "image_index": i,
                    "seed": seed,
                    "num_inference_steps": protocol.num_inference_steps,
                    "guidance_scale": protocol.guidance_scale,
                    "resolution": protocol.resolution,
                    **(record_extras or {}),
                } for (p, i), seed in zip(batch, seeds)]
                rank = accelerator.process_index
                written = [stored | {"path": store.relative_path(rank, stored)}
                           for stored in store.append_batch(rank, list(zip(images, records)))]
                if sink is not None:
                    sink.add(written, images)
                bar.update(len(batch))

            dtypes = component_dtypes(pipeline)  # as loaded: an out-of-memory call may leave one cast otherwise

            def generate(batch: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[int], list[Image.Image]]:
                seeds = [protocol.seed_fn(protocol.seed, p, i) for p, i in batch]
                with torch.inference_mode(), dtypes_restored_on_out_of_memory(pipeline, dtypes):
                    images = pipeline(
                        prompt=[prompts[p] for p, _ in batch],
                        height=protocol.resolution,
                        width=protocol.resolution,
                        num_inference_steps=protocol.num_inference_steps,
                        guidance_scale=protocol.guidance_scale,
                        generator=cpu_generators(seeds),
                        **protocol.call_kwargs,
                    ).images
                return batch, seeds, images

            generated = 0

            def hand_over(batch: list[tuple[int, int]]) -> None:
                nonlocal generated
                writer.put(generate(batch))
                generated += len(batch)
                units_done(generated)

            # Each batch is written (PNG, hash, fsync) while the next one denoises; a batch that runs out of
            # memory is handed to the writer only when it has been generated whole.
            with OrderedWorker(write, name="gors-sample-writer") as writer:
                try:
                    in_batches_that_fit(mine, protocol.batch_size, hand_over,
                                        f"generating {protocol.resolution} px images", "images per pipeline call",
                                        flags.batch_flag, at_one, limit)
                except BaseException:
                    if sink is not None:  # the batches in hand are still written, not waited on to be scored
                        sink.stop()
                    raise
            bar.close()
    accelerator.wait_for_everyone()
    if accelerator.num_processes > 1:  # one process wrote them all itself: nothing to wait for
        made = set(todo)
        visible = wait_until_visible(lambda: {sample_key(record) for record in store.records()},
                                     lambda keys: made <= keys)
        if not made <= visible:
            raise StoreError(f"{len(made - visible)} of the {len(made)} images generated now are not visible in "
                             f"{store.root} from {socket.gethostname()}: {NOT_VISIBLE}")
    return store
