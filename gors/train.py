"""Stage 4, `gors train`: reward-weighted LoRA fine-tuning on the selected samples.

The order follows diffusers' `train_text_to_image_lora.py`: Accelerator with a project config,
seed, freeze and cast, LoRA, optimizer, `prepare`, save/load hooks that keep only the adapters,
steps gated on `sync_gradients`, checkpoints pruned past a limit, validation, `end_training`.
Checkpoints are saved atomically and resumed only under the settings that made them
(`gors.checkpoints`).

The loop is the same for every model family; what differs (the components, prompt encoding, the
loss, the LoRA targets) is asked of the family (`gors.families`). Frozen text encoders run once
over the selection's prompts and their outputs are cached, as the VAE latents are, so a frozen T5
is not loaded while training (unless --no_cache_text_embeddings).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, ProjectConfiguration, set_seed
from PIL import Image

from gors._moved import moved_names
from gors.checkpoints import (
    BASE_MODEL_COMMIT,
    INCOMPLETE_CHECKPOINT,
    bring_back,
    check_intact,
    check_resumable,
    checkpoint_step,
    find_checkpoint,
    fingerprint_differences,
    later_checkpoint,
    own_checkpoint,
    prune_checkpoints,
    read_marker,
    recorded_micro_batch,
    recover_replaced_checkpoints,
    restore_own_training,
    set_aside_checkpoints,
    set_aside_logs,
    set_aside_other_trainings,
    training_fingerprint,
    utc_now,
    write_checkpoint,
)
from gors.config import RunConfig, TrainConfig, accumulation_steps, check_anchor_below
from gors.core.backbones import check_trainable, detect_backbone, family_precision, half_precision_warning
from gors.core.clock import units_done, untimed, work_starts
from gors.core.compiling import NO_COMPILE, compile_module, uses_cuda_graphs, without_cuda_graphs
from gors.core.distributed import (
    check_agreement,
    every_process_tries,
    main_process_decides,
    make_accelerator,
    process_state,
    progress_bar,
)
from gors.core.fingerprints import is_local_fingerprint
from gors.core.fused_lora import AdapterCast
from gors.core.hub import ModelLoadError, from_pretrained, model_version
from gors.core.lock import holds_stages
from gors.core.memory import (
    MORE_MEMORY,
    BatchLimit,
    DeviceMemoryError,
    in_batches_that_fit,
    largest_that_fits,
    micro_batch_sizes,
    out_of_memory_advice,
)
from gors.core.pipeline import cpu_generators
from gors.core.run_folder import CHECKPOINTS_DIR, LATENT_CACHE_DIR, TEXT_EMBEDDING_CACHE_DIR, samples_dir
from gors.core.store import (
    SampleStore,
    StoreError,
    describe_version_change,
    moved_local_model,
    recorded_model_commits,
    recorded_name,
    same_value,
)
from gors.core.transfer import HostValue, to_device
from gors.families import TRAINING_FAMILIES, BasePrediction, Batch, TextEncoder, TrainingFamily, resolve_training
from gors.lora import (
    LORA_WEIGHT_NAME,
    adapters_disabled,
    add_lora,
    load_lora,
    lora_parameters,
    save_lora,
)
from gors.select import load_selection, reward_statistics
from gors.training_data import (
    BatchSchedule,
    cached_latent_distributions,
    latent_cache_path,
    sharded_cache,
    text_cache_name,
)
from gors.validation import (
    BEST_DIR,
    VALIDATION_DIR,
    BenchmarkValidation,
    discard_validation_results,
    kept_steps,
    preserved_rng,
    training_identity,
)

if TYPE_CHECKING:
    from diffusers import SchedulerMixin

# 0.1 names that moved in 0.2 (CHANGELOG.md); they warn and forward until 0.3.
__getattr__ = moved_names(__name__, {
    "CHECKPOINTS": "gors.core.run_folder:CHECKPOINTS_DIR",
})

# Where processes disagree on the training: each node resolved the model in its own cache, or sees another folder.
SAME_TRAINING_FIX = ("Every node must resolve each model to the same snapshot (point HF_HOME at one shared cache, or "
                     "pass --revision <commit>), find the same files in a local model folder, and see the same "
                     "--output_dir")
LOGS_DIR = "logs"  # the trackers' folder in the run folder (TensorBoard: logs/gors/)


def resolve_accumulation(config: TrainConfig | RunConfig, num_processes: int) -> None:
    """Set `config.gradient_accumulation_steps` from `--global_batch_size` (where given) for `num_processes`;
    with `--auto_train_batch_size`, `train_batch_size` too, to the size tried first (`GORSTrainer._fit_micro_batch`):
    each process's share of an update as one micro-batch."""
    if config.auto_train_batch_size:
        if config.global_batch_size % num_processes:
            raise ValueError(f"--global_batch_size={config.global_batch_size} does not split evenly over "
                             f"{num_processes} processes: launch a number of processes that divides it")
        config.train_batch_size = config.global_batch_size // num_processes
    if config.global_batch_size is not None:
        # A 1 is the default (an explicit 1 is checked against the batch as the flags are parsed: `check_given`).
        given = config.gradient_accumulation_steps if config.gradient_accumulation_steps != 1 else None
        config.gradient_accumulation_steps = accumulation_steps(config.global_batch_size, config.train_batch_size,
                                                                num_processes, given)
    accumulation = config.gradient_accumulation_steps
    if accumulation > 1 and uses_cuda_graphs(config.torch_compile):
        # The replayed backward hands its gradients out of the graph's own memory, which the next micro-batch's
        # replay overwrites (torch raises on the accumulation). Stable gradient buffers made before the graphs would
        # allow it, but would also give weights no layer used a zero gradient that AdamW then steps, unlike eager.
        per_update = config.train_batch_size * accumulation
        one_batch = (f"--train_batch_size {per_update}, with --global_batch_size unchanged) or on more processes"
                     if config.global_batch_size is not None else
                     f"--train_batch_size {per_update} --gradient_accumulation_steps 1)")
        raise ValueError(f"--torch_compile={config.torch_compile} replays the backward as a CUDA graph, and gors does "
                         f"not accumulate {accumulation} micro-batches per update into its gradients: train the "
                         f"update's {per_update} samples per process as one batch ({one_batch}, or compile without "
                         f"CUDA graphs (--torch_compile {without_cuda_graphs(config.torch_compile)})")


def training_accelerator(config: TrainConfig | RunConfig) -> Accelerator:
    """The Accelerator of a training run: accumulation, precision, trackers and the run folder.

    Its DDP options look for parameters without a gradient where the family's text-encoder adapters
    have some (SDXL reads CLIP-L's penultimate layer, so the last layer's LoRA never gets one);
    `GORSTrainer.prepare` gives them to those encoders alone.
    """
    resolve_accumulation(config, process_state().num_processes)  # a batch that does not divide fails at once
    check_samples_model(config)  # before `detect_backbone` may go to the Hub for a model the samples are not of
    project = ProjectConfiguration(project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / LOGS_DIR))
    backbone = detect_backbone(config.pretrained_model_name_or_path, config.revision)
    family = TRAINING_FAMILIES.get(backbone.name)
    unused = family is not None and family.encoders_without_gradient and config.train_text_encoder is not False
    return make_accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=family_precision(backbone, config.mixed_precision),
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=project,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)] if unused else None,
    )


def check_data_parallel(accelerator: Accelerator) -> None:
    """Refuse a launch config that shards the model (DeepSpeed, FSDP): gors trains with DDP only.

    Accelerate's DeepSpeed takes one model per `Accelerator` (gors trains the denoiser and the text
    encoder together) and gors' LoRA saving does not gather FSDP's sharded weights: either would fail
    late or save partial adapters, so the launch stops before any model is loaded.
    """
    sharded = {DistributedType.DEEPSPEED: "DeepSpeed", DistributedType.FSDP: "FSDP"}.get(accelerator.distributed_type)
    if sharded is not None:
        raise ValueError(f"gors trains with data parallelism (DDP) only, and this launch uses {sharded}: launch with "
                         "accelerate_configs/multi_gpu.yaml (or multi_node.yaml, single_gpu.yaml), or a config of your "
                         "own with distributed_type: MULTI_GPU. Rank-4 LoRA leaves little optimizer state to shard.")


def _optimizer_class(use_8bit_adam: bool) -> type[torch.optim.Optimizer]:
    if not use_8bit_adam:
        return torch.optim.AdamW
    try:
        import bitsandbytes
    except ImportError:
        raise ValueError("--use_8bit_adam needs bitsandbytes: `pip install gors[bnb]` (or `pip install "
                          "bitsandbytes`), or train without the flag.") from None
    return bitsandbytes.optim.AdamW8bit


def check_generating_model(config: TrainConfig | RunConfig, generated: dict[str, Any],
                           versions: dict[str, str | None] | None = None, loaded: str | None = None,
                           samples: Path | None = None) -> None:
    """Refuse to train another base model than the one that generated the samples (`generated`: the
    store's `settings.json`; a store made before gors recorded it, or by a pipeline in memory, names none),
    or the same name at another version than the one `versions` (the store's `models.json`) records: a Hub
    model updated since, a local folder retrained or overwritten in place. `loaded`: the version the base
    model loaded at (a Hub model the cache did not hold before has one only then); by default what the
    cache and the local files say now (`model_version`). A `--revision` naming the commit that generated
    the samples is their model. `samples`: the store's folder, for the message (default the run folder's)."""
    model, revision = generated.get("model"), generated.get("revision")
    if model is None:
        return
    samples = samples or samples_dir(config.output_dir)
    recorded = (versions or {}).get(recorded_name(versions or {}, model))
    now = loaded or model_version(config.pretrained_model_name_or_path, config.revision)
    pinned = config.revision is not None and recorded is not None and now == recorded
    if same_value(model, config.pretrained_model_name_or_path) and (revision == config.revision or pinned):
        if recorded is None or now is None or recorded == now:
            return
        raise ValueError(
            f"--pretrained_model_name_or_path={config.pretrained_model_name_or_path!r}: the samples in {samples} were "
            f"generated by another version of it ({describe_version_change(model, recorded, now)}); training it on "
            "them would fit it to another model's images. Generate again with it as it is now, in a new --output_dir"
            + ("" if is_local_fingerprint(recorded) else
               f"; or, with `gors train`, pass --revision {recorded} to train the version that generated them") + "."
        )
    if revision is None and config.revision is None and \
            moved_local_model(model, config.pretrained_model_name_or_path, versions or {}):
        return
    made_by = f"{model!r}" + (f" at revision {revision!r}" if revision else "")
    given = f"{config.pretrained_model_name_or_path!r}" + (f" at revision {config.revision!r}" if config.revision else "")
    raise ValueError(
        f"--pretrained_model_name_or_path={given}: the samples in {samples} were generated by "
        f"{made_by} (samples/settings.json); training another base model on them would fit it to another model's "
        f"images. Pass the model that generated them (--pretrained_model_name_or_path {model}"
        + (f" --revision {revision}" if revision else "") + "), or generate again with this one in a new --output_dir."
    )


def check_samples_model(config: TrainConfig | RunConfig, loaded: str | None = None,
                        output_dir: str | Path | None = None) -> None:
    """`check_generating_model` against the run folder's `samples/settings.json` and `models.json`, if there
    are any: local files only, so that a wrong (or default) `--pretrained_model_name_or_path` is named before
    any Hub call; again with the version the base model `loaded` at. `output_dir`: another run folder than
    the config's (an online round's)."""
    store = SampleStore(samples_dir(output_dir or config.output_dir))
    check_generating_model(config, store.load_settings() or {}, recorded_model_commits(store.root), loaded,
                           store.root)


def load_training_scheduler(family: TrainingFamily) -> SchedulerMixin:
    """The family's noise schedule (its config only, no weights), after checking that `--anchor_below`
    leaves some timestep that training draws to learn from."""
    scheduler = family.load_scheduler()  # checks --timestep_range against the schedule
    if family.settings["anchor_below"] is not None:
        check_anchor_below(family.settings["anchor_below"], family.settings["timestep_range"],
                           scheduler.config.num_train_timesteps)
    return scheduler


def selected_image_store(row: dict[str, Any], output_dir: Path) -> Path:
    """The sample store of a selection row: the run folder's own, or, for a row replayed from an earlier
    round, the store its `samples` field names (relative to `output_dir`)."""
    return output_dir / row["samples"] if "samples" in row else samples_dir(output_dir)


def missing_selected_images(selection: list[dict[str, Any]], output_dir: Path) -> list[Path]:
    """The files of selected images that do not exist (existence only: decoding waits for the VAE pass)."""
    stores: dict[Path, SampleStore] = {}
    missing = []
    for row in selection:
        root = selected_image_store(row, output_dir)
        path = stores.setdefault(root, SampleStore(root)).image_path(row)
        if not path.is_file():
            missing.append(path)
    return missing


def check_selected_images(selection: list[dict[str, Any]], output_dir: Path) -> None:
    """Refuse a selection whose image files are gone (deleted since `gors select`), naming them and the
    stages that make them again."""
    missing = missing_selected_images(selection, output_dir)
    if missing:
        shown = ", ".join(map(str, missing[:3])) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise StoreError(
            f"{len(missing)} of the {len(selection)} selected images are missing ({shown}): deleted since "
            "`gors select`? Rerun `gors generate` with the same --output_dir (it generates missing images again), "
            "then `gors score` and `gors select` (or `gors run`, which runs all three), and train again.")


def _listed(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"


class AutocastPipeline:
    """A pipeline whose calls run under `autocast()` (a context-manager factory); its attributes are the
    pipeline's. Validation hands this to a benchmark so that generation autocasts and scoring does not."""

    def __init__(self, pipeline: Any, autocast: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.pipeline = pipeline
        self.autocast = autocast

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.autocast():
            return self.pipeline(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipeline, name)


def decode_in_float32_as_the_pipeline_would(pipeline: Any, weight_dtype: torch.dtype) -> None:
    """Under fp16, make a validation pipeline's `vae.decode` run in float32 outside autocast where the pipeline
    itself upcasts an fp16 VAE whose config says `force_upcast` (SDXL's, whose decoder overflows fp16): the
    trainer's VAE is float32, so the pipeline's own upcast does not apply, and validation's autocast would run
    the decoder's convolutions in fp16 (NaN or black images, scored by --validation_benchmark). `gors generate`
    and `gors evaluate`, which load the pipeline in fp16 without autocast, decode so through the pipeline."""
    vae = pipeline.vae
    if weight_dtype != torch.float16 or not hasattr(pipeline, "upcast_vae") or not vae.config.get("force_upcast"):
        return
    decode = type(vae).decode.__get__(vae)  # the class's: a VAE kept over several validations is wrapped once

    def float32_decode(latents: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(latents.device.type, enabled=False):
            return decode(latents.to(vae.dtype), *args, **kwargs)

    vae.decode = float32_decode


class GORSTrainer:
    """Reward-weighted LoRA training on `selection.jsonl` of a run folder, for every trainable model family."""

    def __init__(self, config: TrainConfig | RunConfig, accelerator: Accelerator | None = None,
                 continue_from: Path | None = None, reset_optimizer: bool = False,
                 validation_dir: Path | None = None, schedule_steps: int | None = None) -> None:
        """`continue_from`: a checkpoint of another run folder (online GORS: the previous round's last) to
        go on from, on this folder's selection: its adapters and step, and its optimizer, LR scheduler
        and RNG state unless `reset_optimizer`. A checkpoint of this folder (`--resume_from_checkpoint`)
        takes precedence. `validation_dir`: where `--validation_benchmark` keeps its results and the
        best LoRA instead of this folder (online GORS: the top folder, so that every round's LoRA
        competes). `schedule_steps`: the length of the LR schedule in optimizer updates (default
        `--max_train_steps`); online rounds pass the whole run's, so that a decaying schedule runs once
        across the rounds."""
        check_samples_model(config)  # before `detect_backbone` may go to the Hub
        backbone = detect_backbone(config.pretrained_model_name_or_path, config.revision)
        check_trainable(backbone, config.pretrained_model_name_or_path)  # every check before any weights load
        generated = SampleStore(samples_dir(config.output_dir)).load_settings() or {}
        self.config, self.family = resolve_training(config, backbone, generated.get("guidance_scale"),
                                                    generated.get("resolution"))
        self.optimizer_class = _optimizer_class(config.use_8bit_adam)
        self.backbone = backbone
        self.resolution = self.config.resolution
        # Validation renders as the samples were generated (their steps; guidance and side are resolved above).
        self.sampling_steps = generated.get("num_inference_steps") or backbone.sampling.num_inference_steps
        self.accelerator = accelerator or training_accelerator(config)
        check_data_parallel(self.accelerator)
        resolve_accumulation(self.config, self.accelerator.num_processes)
        if self.config.auto_train_batch_size:  # this training sets it (`_use_micro_batch`), as an earlier round's did
            self.accelerator.gradient_accumulation_steps = self.config.gradient_accumulation_steps
        # Whether the denoiser replays as CUDA graphs: no joint adapter cast, two warm-up steps, no accumulation.
        self.cuda_graphs = uses_cuda_graphs(self.config.torch_compile)
        if self.accelerator.gradient_accumulation_steps != self.config.gradient_accumulation_steps:
            raise ValueError(f"the Accelerator given accumulates {self.accelerator.gradient_accumulation_steps} "
                             f"micro-batch(es) per update and the training {self.config.gradient_accumulation_steps}: "
                             "make it with gors.train.training_accelerator(config)")
        self.output_dir = Path(config.output_dir)
        self.continue_from, self.reset_optimizer = continue_from, reset_optimizer
        self.validation_dir = validation_dir
        self.schedule_steps = schedule_steps or self.config.max_train_steps
        self.noise_scheduler = None  # loaded by `train` before any checkpoint is touched, or by `_setup_models`
        self.fingerprint: dict[str, Any] = {}  # what its checkpoints are bound to, set by `train`
        self.since: dict[str, Any] | None = None  # the step and time `train`'s loop started from
        self._render_limit = BatchLimit()  # halved by a validation that ran out of memory

    # ----- set-up -------------------------------------------------------------------------
    def _setup_models(self) -> None:
        config, accelerator, family = self.config, self.accelerator, self.family
        self.weight_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(accelerator.mixed_precision, torch.float32)
        warning = half_precision_warning(self.backbone, self.weight_dtype)
        if warning is not None:
            accelerator.print(f"[train] warning: {warning}")
        # Base weights load in the mixed-precision dtype (`_load_frozen`), adapters train in fp32. The VAE
        # only encodes once, in fp32 for an exact cache.
        if self.noise_scheduler is None:
            self.noise_scheduler = family.load_scheduler()
        self.vae = family.load("vae").requires_grad_(False).to(accelerator.device)
        self.denoiser = self._load_frozen(family.denoiser)
        self.tokenizers = {e.tokenizer: family.load(e.tokenizer) for e in family.text_encoders}
        trained = family.trained_text_encoders(config.train_text_encoder)
        self.trained = ([family.denoiser] if config.train_unet else []) + [e.component for e in trained]
        # Encoders that run every step: the trained ones, and all of them without --cache_text_embeddings.
        self.text_encoders = {e.component: self._load_frozen(e.component) for e in family.text_encoders
                              if e in trained or not config.cache_text_embeddings}
        self._validation_encoders: dict[str, torch.nn.Module] | None = None
        if config.train_unet:
            add_lora(self.denoiser, family.denoiser_lora_targets, config.rank)
        for encoder in trained:
            add_lora(self.text_encoders[encoder.component], family.text_encoder_lora_targets, config.rank)
        for module in self.trained_modules().values():
            for param in lora_parameters(module):
                param.data = param.data.float()  # adapters train in fp32 under mixed precision
        # Under autocast, a pass casts all the adapters' weights at once (`_micro_batch_loss`). Not for models that
        # replay as CUDA graphs: the cast weights would be fresh inputs, copied into the graph's buffers at every
        # replay, where autocast's own casts run inside the graph.
        self.adapter_cast = (AdapterCast(list(self.trained_modules().values()), self.weight_dtype)
                             if self.weight_dtype != torch.float32 and accelerator.native_amp
                             and not self.cuda_graphs else None)
        if config.gradient_checkpointing:
            self.denoiser.enable_gradient_checkpointing()
            for encoder in trained:
                self.text_encoders[encoder.component].activation_checkpointing_enable()
        # The text encoders that run every step too: at GORS' batch of 2 a step on a large GPU waits on kernel
        # launches (benchmarks/README.md), and the trained encoder's forward and backward are a fifth of them. Without
        # CUDA graphs, though: a graph's outputs live in its memory until the next compiled call starts anew, and an
        # encoder's outputs are read after other compiled calls (SDXL's first encoder's while the second runs, a
        # frozen encoder's by the U-Net, validation's prompt embeddings).
        compile_module(self.denoiser, config.torch_compile)
        for module in self.text_encoders.values():
            compile_module(module, without_cuda_graphs(config.torch_compile))

    def _load_frozen(self, component: str) -> torch.nn.Module:
        """A component's base weights: frozen, in the mixed-precision dtype, on this process's device.

        Loaded in that dtype, converted as they load, so that no copy of the whole model in fp32 is ever
        made (FLUX.1's transformer is 48 GB in fp32, 24 GB in bf16) and transformers keeps in fp32 what it
        keeps for that dtype (T5's `wo` layers under fp16), as the sampling pipeline loads them.
        """
        return self.family.load(component, dtype=self.weight_dtype).requires_grad_(False).to(self.accelerator.device)

    def trained_modules(self) -> dict[str, torch.nn.Module]:
        """The modules that carry LoRA adapters, by component name (as prepared: maybe wrapped for DDP)."""
        return {name: self.denoiser if name == self.family.denoiser else self.text_encoders[name]
                for name in self.trained}

    def _bare_trained_modules(self) -> dict[str, torch.nn.Module]:
        """`trained_modules` without DDP's wrappers: the names that LoRA files use."""
        return {name: self.accelerator.unwrap_model(module) for name, module in self.trained_modules().items()}

    def _fused_kwargs(self) -> dict[str, bool]:
        """torch AdamW's fused kernel where asked for and the device has one (bitsandbytes' has its own)."""
        try:  # private torch API: without it, the plain per-parameter update
            from torch.optim.optimizer import _get_fused_kernels_supported_devices
        except ImportError:
            return {}
        fused = (self.config.fused_adam and self.optimizer_class is torch.optim.AdamW
                 and self.accelerator.device.type in _get_fused_kernels_supported_devices())
        return {"fused": True} if fused else {}

    def _optimizer(self, groups: list[dict], **kwargs: Any) -> torch.optim.Optimizer:
        config = self.config
        # `lr` is every group's own; as the default it is the rate diffusers' polynomial schedule decays from.
        return self.optimizer_class(groups, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                    weight_decay=config.adam_weight_decay, eps=config.adam_epsilon, **kwargs)

    def _lr_schedule(self, optimizer: torch.optim.Optimizer):
        from diffusers.optimization import get_scheduler

        # A prepared scheduler steps once per process per update, hence the scaling.
        n = self.accelerator.num_processes
        return get_scheduler(self.config.lr_scheduler, optimizer=optimizer,
                             num_warmup_steps=self.config.lr_warmup_steps * n,
                             num_training_steps=self.schedule_steps * n)

    def _setup_optimizer(self) -> None:
        config = self.config
        groups = [{"params": lora_parameters(module),
                   "lr": config.learning_rate if name == self.family.denoiser else config.text_encoder_learning_rate}
                  for name, module in self.trained_modules().items()]
        self.optimizer = self._optimizer(groups, **self._fused_kwargs())
        self.lr_scheduler = self._lr_schedule(self.optimizer)

    def _register_hooks(self) -> None:
        modules = self.trained_modules()
        pipeline_class = self.backbone.pipeline_class
        accelerator = self.accelerator

        def save_hook(models: list, weights: list, output_dir: str) -> None:
            if accelerator.is_main_process:
                save_lora(output_dir, modules, pipeline_class, self.family.peft_lora_names)
            weights.clear()  # only the adapters are saved, never the frozen base weights

        def load_hook(models: list, input_dir: str) -> None:
            load_lora(input_dir, modules, pipeline_class)
            models.clear()

        # Removed when training ends: a later training on the same Accelerator (the next online round)
        # saves and loads its own modules.
        self._hooks = [accelerator.register_save_state_pre_hook(save_hook),
                       accelerator.register_load_state_pre_hook(load_hook)]

    def _load_data(self) -> None:
        config = self.config
        self.latents = cached_latent_distributions(
            self.selection,
            self._open_selected,
            self.vae,
            self.accelerator,
            self.output_dir / LATENT_CACHE_DIR,
            self.resolution,
            config.center_crop,
            config.pretrained_model_name_or_path,
            revision=config.revision,
            commit=self.fingerprint.get(BASE_MODEL_COMMIT),
        )
        self.vae.to("cpu")  # not needed again during training
        # Each distinct prompt once, and the empty prompt last (caption dropout).
        self.prompts = sorted({row["prompt"] for row in self.selection}) + [""]
        position = {prompt: i for i, prompt in enumerate(self.prompts)}
        self.prompt_index = torch.tensor([position[row["prompt"]] for row in self.selection])
        self.empty_index = len(self.prompts) - 1
        self.tokens = {e.component: self.family.tokenize(e, self.tokenizers[e.tokenizer], self.prompts)
                       for e in self.family.text_encoders}
        self.cached = {e.component: self._cached_encoding(e) for e in self.family.text_encoders
                       if e.component not in self.text_encoders}
        # `--anchor_below`'s base pass needs the base encoders' outputs, which no training changes: once per
        # prompt here instead of a text-encoder forward every step.
        self.base_encodings = {}
        if self.family.settings["anchor_below"] is not None:
            unwrap = self.accelerator.unwrap_model
            self.base_encodings = {e.component: self.cached[e.component] if e.component in self.cached
                                   else self._cached_encoding(e, unwrap(self.text_encoders[e.component]))
                                   for e in self.family.text_encoders}
        self.rewards = torch.tensor([row["reward"] for row in self.selection], dtype=torch.float32)
        self.schedule = self._batch_schedule()

    def _check_images(self) -> None:
        """Refuse missing selected images before any checkpoint is set aside: unless their latents are
        cached already, training reads every one of them."""
        config = self.config
        cache = latent_cache_path(self.selection, self.output_dir / LATENT_CACHE_DIR, self.resolution,
                                  config.center_crop, config.pretrained_model_name_or_path, config.revision,
                                  self.fingerprint.get(BASE_MODEL_COMMIT))
        if not cache.is_file():
            check_selected_images(self.selection, self.output_dir)

    @torch.no_grad()
    def _open_selected(self, row: dict) -> Image.Image:
        """A selected image, from its store (`selected_image_store`)."""
        return SampleStore(selected_image_store(row, self.output_dir)).open_image(row)

    def _cached_encoding(self, encoder: TextEncoder, loaded: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
        """The base encoder's outputs for every prompt, computed once: by `loaded` (an encoder being trained,
        its adapters off), or by a frozen copy loaded only for that."""
        config, family = self.config, self.family
        tokens = self.tokens[encoder.component]
        name = text_cache_name(encoder.component, self.prompts, tokens, config.pretrained_model_name_or_path,
                               config.revision, self.weight_dtype, self.fingerprint.get(BASE_MODEL_COMMIT))
        path = self.output_dir / TEXT_EMBEDDING_CACHE_DIR / name
        model = loaded

        def encode(indices: list[int]) -> dict[str, torch.Tensor]:
            nonlocal model
            if model is None:
                model = self._load_frozen(encoder.component)
            with torch.no_grad(), adapters_disabled(model):
                return family.encode(encoder, model, tokens[indices].to(self.accelerator.device))

        cached = sharded_cache(path, len(self.prompts), encode, self.accelerator, batch_size=8,
                               description=f"encode prompts ({encoder.component})")
        del model
        return cached

    # ----- one micro-batch ----------------------------------------------------------------
    def _micro_batch_loss(self, micro_batch: int) -> torch.Tensor:
        device, family = self.accelerator.device, self.family
        index = torch.tensor(self.schedule.indices(micro_batch))
        mean = to_device(self.latents["mean"][index], device)
        if self.config.sample_latents:
            mean = mean + to_device(self.latents["std"][index], device) * torch.randn_like(mean)
        latents = family.scale_latents(mean, self.vae.config)
        noise, position = family.sample_noise(latents, self.noise_scheduler)
        prompts = self.prompt_index[index]
        dropped = torch.zeros(len(index), dtype=torch.bool)
        if self.config.caption_dropout > 0:
            dropped = torch.rand(len(index)) < self.config.caption_dropout
            prompts = torch.where(dropped, self.empty_index, prompts)
        batch = Batch(latents, to_device(self.rewards[index], device),
                      to_device(self.latents["original_size"][index], device),
                      to_device(self.latents["crop_top_left"][index], device))
        with self.adapter_cast() if self.adapter_cast else contextlib.nullcontext():
            conditioning = family.drop_captions(family.condition(self._encodings(prompts), batch, self.weight_dtype),
                                                dropped)
            return family.loss(self.denoiser, self.noise_scheduler, batch, conditioning, noise, position,
                               self.weight_dtype, base_prediction=self._base_prediction(prompts, dropped, batch))

    def _encodings(self, prompts: torch.Tensor, cached: dict[str, dict[str, torch.Tensor]] | None = None
                   ) -> dict[str, dict[str, torch.Tensor]]:
        """Every text encoder's outputs for these prompt indices: taken from `cached` (default
        `self.cached`), or run by the encoders as prepared."""
        device, family = self.accelerator.device, self.family
        cached = self.cached if cached is None else cached
        encodings = {}
        for encoder in family.text_encoders:
            name = encoder.component
            if name in cached:
                encodings[name] = {k: to_device(v[prompts], device) for k, v in cached[name].items()}
            else:
                encodings[name] = family.encode(encoder, self.text_encoders[name],
                                                to_device(self.tokens[name][prompts], device))
        return encodings

    def _base_prediction(self, prompts: torch.Tensor, dropped: torch.Tensor, batch: Batch) -> BasePrediction:
        """`--anchor_below`'s target: the base model's prediction for some rows of the micro-batch, the
        adapters of the denoiser off and the base text encoders' outputs (`dropped`: caption dropout's rows)."""
        def predict(noisy: torch.Tensor, timesteps: torch.Tensor, rows: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            # Unwrapped: a DDP forward would run collectives that the other processes, whose rows differ,
            # do not run.
            denoiser = self.accelerator.unwrap_model(self.denoiser)
            anchored = len(rows)
            if self.config.torch_compile != NO_COMPILE and anchored < len(prompts):
                # A compiled denoiser compiles once per batch shape: the pass takes the whole micro-batch's shape, the
                # other rows (their conditioning, copies of the first anchored row's latents and timestep) dropped after.
                other = torch.ones(len(prompts), dtype=torch.bool)
                other[rows] = False
                others = other.nonzero().flatten()
                rows, at = torch.cat([rows, others]), torch.cat([at, to_device(others, at.device)])
                fill = len(others)
                noisy = torch.cat([noisy, noisy[:1].expand(fill, *noisy.shape[1:])])
                timesteps = torch.cat([timesteps, timesteps[:1].expand(fill)])
            with torch.no_grad(), adapters_disabled(denoiser):
                encodings = self._encodings(prompts[rows], self.base_encodings)
                conditioning = self.family.drop_captions(
                    self.family.condition(encodings, batch.rows(at), self.weight_dtype), dropped[rows])
                return self.family.predict(denoiser, noisy, timesteps, conditioning)[:anchored]

        return predict

    # ----- logging --------------------------------------------------------------------------
    def _tensorboard(self):
        for tracker in self.accelerator.trackers:
            if tracker.name == "tensorboard":
                return tracker.writer
        return None

    def _log_selection(self, step: int) -> None:
        values = self.rewards.tolist()
        stats = reward_statistics(values)
        self.accelerator.log({f"selected/reward_{k}": v for k, v in stats.items()}, step=step)
        writer = self._tensorboard()
        if writer is not None:
            writer.add_histogram("selected/reward", np.asarray(values), step)

    def _pipeline(self, scheduler: str | None):
        """The family's pipeline over the models being trained (and `validation_encoders`; they and the VAE
        move to the device while it is used), sampling with the diffusers scheduler class `scheduler`
        (None: the checkpoint's own)."""
        import diffusers

        unwrap = self.accelerator.unwrap_model
        device = self.accelerator.device
        components = {self.family.denoiser: unwrap(self.denoiser), "vae": self.vae.to(device)}
        components |= {name: unwrap(module) for name, module in self.text_encoders.items()}
        components |= {name: module.to(device) for name, module in self.validation_encoders().items()}
        components |= self.tokenizers
        if scheduler is not None:
            components["scheduler"] = getattr(diffusers, scheduler).from_config(self.noise_scheduler.config)
        pipeline_class = getattr(diffusers, self.backbone.pipeline_class)
        pipeline = from_pretrained(pipeline_class.from_pretrained, self.config.pretrained_model_name_or_path,
                                   "--pretrained_model_name_or_path", revision=self.config.revision,
                                   dtype=self.weight_dtype, **self.backbone.pipeline_kwargs, **components)
        pipeline.set_progress_bar_config(disable=True)
        decode_in_float32_as_the_pipeline_would(pipeline, self.weight_dtype)
        return pipeline.to(self.accelerator.device)

    def validation_encoders(self) -> dict[str, torch.nn.Module]:
        """The frozen text encoders that training does not hold (`--cache_text_embeddings`) but validation
        renders need, by component: loaded at the first validation, then kept on the CPU between
        validations, so that a T5-XXL (9.5 GB in bf16) is read from disk once per training, not once per
        validation."""
        if self._validation_encoders is None:
            self._validation_encoders = {
                e.component: self.family.load(e.component, dtype=self.weight_dtype).requires_grad_(False).eval()
                for e in self.family.text_encoders if e.component not in self.text_encoders}
        return self._validation_encoders

    def _save_lora(self, directory: Path) -> Path:
        return save_lora(directory, self._bare_trained_modules(), self.backbone.pipeline_class,
                         self.family.peft_lora_names)

    @contextlib.contextmanager
    def _validating(self) -> Iterator[None]:
        """Validation's surroundings: every module in the forward pass in eval mode (no dropout) and the
        global RNG streams saved, both restored on exit, and the VAE and `validation_encoders` back on the
        CPU; so that validating leaves the training exactly as it was."""
        modes = {module: module.training for module in (self.denoiser, *self.text_encoders.values())}
        for module in modes:
            module.eval()
        try:
            with preserved_rng(self.accelerator.device):
                yield
        finally:
            self.vae.to("cpu")
            for module in (self._validation_encoders or {}).values():
                module.to("cpu")
            for module, training in modes.items():
                module.train(training)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to the mixed-precision dtype for a validation pipeline, as diffusers' scripts validate:
        its modules mix dtypes (the fp32 VAE and adapters beside bf16/fp16 frozen weights)."""
        if self.weight_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.accelerator.device.type, dtype=self.weight_dtype)

    @torch.no_grad()
    def validate_on_benchmark(self, step: int) -> dict:
        """`--validation_benchmark` with the current LoRA, on every process; see `gors.validation`."""
        with self._validating():
            # Only generation autocasts: the benchmark's scorer runs in its own (official) dtype.
            pipeline = self._pipeline(self.validation.backbone.sampling.scheduler)  # the benchmark's sampler
            return self.validation.run(step, AutocastPipeline(pipeline, self._autocast), self._save_lora)

    @torch.no_grad()
    def log_validation(self, step: int) -> list:
        """Render `--validation_prompts` with the current LoRA (own generators, and the training RNG and
        modes restored: `_validating`)."""
        config = self.config
        prompts = list(config.validation_prompts or [])
        # T5 families: the length trained on (`resolve_training` keeps it the pipeline's default).
        length = self.family.settings["max_sequence_length"]
        images: list = []

        def render(indices: list[int]) -> None:
            with self._autocast():
                images.extend(pipeline(
                    prompt=[prompts[i] for i in indices],
                    height=self.resolution,
                    width=self.resolution,
                    num_inference_steps=self.sampling_steps,
                    guidance_scale=self.family.settings["guidance_scale"],
                    generator=cpu_generators([config.seed + i for i in indices]),
                    **(self.backbone.call_kwargs | ({"max_sequence_length": length} if length is not None else {})),
                ).images)

        with self._validating():
            pipeline = self._pipeline(self.backbone.sampling.scheduler)
            # All in one call, or in halves while they do not fit beside the models in training (the size that
            # fit is kept for the next validation).
            in_batches_that_fit(
                list(range(len(prompts))), len(prompts), render,
                f"rendering --validation_prompts at {self.resolution} px", "prompts per pipeline call", None,
                f"drop --validation_prompts, or {MORE_MEMORY}", self._render_limit)
        writer = self._tensorboard()
        if writer is not None:
            writer.add_images("validation", np.stack([np.asarray(im) for im in images]), step, dataformats="NHWC")
            for prompt in prompts:
                writer.add_text("validation/prompts", prompt, step)
        return images

    # ----- the loop ---------------------------------------------------------------------------
    def train(self) -> Path:
        """Train to `max_train_steps`, resuming if asked; returns the path of the saved LoRA."""
        config, accelerator = self.config, self.accelerator
        checkpoint = self._set_up()
        global_step = self._resume(checkpoint)
        self._start_logging(global_step, resumed=checkpoint is not None)

        models = list(self.trained_modules().values())
        params = [p for m in models for p in m.parameters() if p.requires_grad]
        accumulation = config.gradient_accumulation_steps
        bar = progress_bar(config.max_train_steps, accelerator, "train")
        bar.update(global_step)
        for module in models:
            module.train()
        # The step this training starts from, not the folder's latest checkpoint (the stage's default): those
        # checkpoints may be another training's, set aside, and a resume may start from another folder's.
        # Under CUDA graphs the second step records the graphs, a one-off like the first step's compiling
        # (after an --auto_train_batch_size trial, which compiled already, a step earlier: the pace then
        # leaves out one ordinary step).
        work_starts(done_before=global_step, warmup_units=2 if self.cuda_graphs else 1)
        first_step = global_step
        self.since = {"step": global_step, "time": utc_now()}  # each checkpoint's marker records it
        # fp16's loss scaler skips an update whose loss overflowed, and the training goes on.
        log = LossLog(accelerator, self.trained, bar,
                      stop_with=None if accelerator.scaler else self.learning_rate_flags())
        updates = Updates(self.optimizer, self.lr_scheduler)
        doing = f"training, {config.train_batch_size} samples per micro-batch on each process"
        advice = self._memory_advice()
        while global_step < config.max_train_steps:
            losses = []
            for micro in range(accumulation):
                with accelerator.accumulate(*models), out_of_memory_advice(doing, advice):
                    loss = self._micro_batch_loss(global_step * accumulation + micro)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(params, config.max_grad_norm)
                    updates.step(accelerator.scaler, accelerator.sync_gradients)
                    self.optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
            if not accelerator.sync_gradients:
                raise RuntimeError("gradient accumulation went out of step with the update count")
            global_step += 1
            bar.update(1)
            log.add(global_step, losses, updates.lrs)
            units_done(global_step - first_step)  # before validating and saving: the last step's are wrap-up

            validating = global_step % config.validation_steps == 0 or global_step == config.max_train_steps
            checkpointing = global_step % config.checkpointing_steps == 0 or global_step == config.max_train_steps
            if validating or checkpointing:
                log.flush()  # a run resumed from this checkpoint has every step's loss logged
                updates.settle()  # the checkpoint saves the LR schedule after this update
            # The last step too: the final LoRA is a best/ candidate even off the --validation_steps grid.
            # Validation comes before the step's checkpoint (it leaves RNG and modes as they were): a run
            # killed while validating resumes before this step and validates it, not after it.
            if validating:
                self._validate(global_step, with_prompts=True)
            if checkpointing:
                self.save_checkpoint(global_step)
        if (first_step == config.max_train_steps and self.validation is not None
                and not self.validation.validated(first_step)):
            # Resumed at its last step with benchmark validation newly on (or on other settings): the LoRA it
            # saves is validated, as a training that ran to this step with these flags would have.
            accelerator.print(f"[validation] step {first_step}, the last, has no validation of these settings: "
                              "validating it")
            self.validation.discard_unrelated(first_step)
            self._validate(first_step, with_prompts=False)
        bar.close()
        return self._finish(global_step)

    def _validate(self, step: int, with_prompts: bool) -> None:
        """Validate the LoRA at `step` on the benchmark, and render `--validation_prompts` where `with_prompts`."""
        config, accelerator = self.config, self.accelerator
        self.check_finite(step)  # a diverged LoRA is neither validated nor kept as best/
        with untimed():  # validation's images are no training steps in the stage's timing
            if with_prompts and config.validation_prompts and accelerator.is_main_process \
                    and self._tensorboard() is not None:
                self.log_validation(step)
            if self.validation is not None:
                self.validate_on_benchmark(step)
        accelerator.wait_for_everyone()

    def _set_up(self) -> Path | None:
        """Every check that can refuse, then the models, optimizer and data, prepared (and the micro-batch
        tried where --auto_train_batch_size has none recorded); the checkpoint to resume from, if any."""
        config, accelerator = self.config, self.accelerator
        set_seed(config.seed, device_specific=True)
        self.selection = load_selection(config.output_dir)  # fail before loading any model
        self.fingerprint = self._fingerprint()
        # --auto_train_batch_size: the micro-batch this training found before, else tried at the first step.
        recorded = config.auto_train_batch_size and self._adopt_recorded_micro_batch()
        check_agreement(accelerator.state, self.fingerprint, "the training", SAME_TRAINING_FIX)
        # Every check that can refuse comes before `_checkpoint_to_resume` may set this folder's checkpoints
        # aside: a refused run leaves them where they were, and a corrected rerun goes on from them.
        self._check_continue_from()
        config.check_optimizer()  # again: a config changed after it was made
        self.noise_scheduler = load_training_scheduler(self.family)
        self._check_images()
        self.validation = (BenchmarkValidation(config, accelerator, self.backbone, self.validation_dir)
                           if config.validation_benchmark else None)
        checkpoint = self._checkpoint_to_resume()  # a refused resume, too, fails before loading any model
        self._setup_models()
        self._check_base_commit()
        self._setup_optimizer()
        self._register_hooks()
        self._load_data()

        self.prepare()
        if config.auto_train_batch_size and not recorded:
            self._fit_micro_batch()
        return checkpoint

    def _resume(self, checkpoint: Path | None) -> int:
        """Load `checkpoint` (or the LoRA --continue_from names); the step training goes on from."""
        config, accelerator = self.config, self.accelerator
        global_step = 0
        if checkpoint is not None:
            accelerator.load_state(str(checkpoint))
            global_step = checkpoint_step(checkpoint)
            accelerator.print(f"[train] resumed from {checkpoint} at step {global_step}")
            own = checkpoint.parent.resolve() == (Path(config.output_dir) / CHECKPOINTS_DIR).resolve()
            if accelerator.is_main_process and own:  # never another run folder's, which --resume_from_checkpoint may name
                prune_checkpoints(checkpoint, config.checkpoints_total_limit)
            if global_step == config.max_train_steps:
                accelerator.print(f"[train] the checkpoint is at --max_train_steps={global_step}: nothing to train; "
                                  "saving its LoRA")
        elif self.continue_from is not None:
            global_step = self._continue(self.continue_from)
        return global_step

    def _start_logging(self, global_step: int, resumed: bool) -> None:
        """Validation's record, the trackers, the selection's statistics (a training's first start only)
        and what is left to train."""
        config, accelerator = self.config, self.accelerator
        if global_step == 0:
            self._set_aside_logs()  # before the trackers start writing this training's
        self._start_validation(global_step)
        if accelerator.is_main_process:
            tracker_config = {k: v for k, v in asdict(config).items() if isinstance(v, (int, float, str, bool))}
            accelerator.init_trackers("gors", config=tracker_config)
            if config.validation_prompts and self._tensorboard() is None:
                accelerator.print(f"[train] warning: --validation_prompts renders go to TensorBoard, which "
                                  f"--report_to={config.report_to} does not write: not rendered")
        if not resumed:
            self._log_selection(global_step)
        if global_step < config.max_train_steps:
            accelerator.print(f"[train] {len(self.selection)} selected samples: {self._steps_to_train(global_step)} of "
                              f"{config.train_batch_size} x {accelerator.num_processes} x "
                              f"{config.gradient_accumulation_steps}")
            update = config.train_batch_size * accelerator.num_processes * config.gradient_accumulation_steps
            if len(self.selection) < update:  # every update is full: the epoch wraps around (`BatchSchedule`)
                accelerator.print(f"[train] note: the {len(self.selection)} selected samples are fewer than an update's "
                                  f"{update}: each update takes some of them more than once")
            if config.gradient_accumulation_steps > 1 and not config.auto_train_batch_size:
                # Small micro-batches leave a large GPU waiting on the host (benchmarks/README.md).
                whole = config.train_batch_size * config.gradient_accumulation_steps
                accelerator.print(f"[train] note: each update accumulates {config.gradient_accumulation_steps} "
                                  f"micro-batches of {config.train_batch_size}; where memory allows, "
                                  f"--train_batch_size {whole} trains as many samples per update in one step, in "
                                  "less time per sample")

    def _finish(self, global_step: int) -> Path:
        """Save the final LoRA (main process) and close the trackers and hooks; the LoRA's path."""
        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        self.check_finite(global_step)
        if accelerator.is_main_process:
            path = self._save_lora(self.output_dir)
            accelerator.print(f"[train] LoRA saved to {path}")
        # Trackers close here; the process group stays up for whatever the caller runs next
        # (e.g. an evaluation), and ends with the process (`gors.core.distributed.end_training`).
        for tracker in accelerator.trackers:
            tracker.finish()
        accelerator.trackers.clear()
        for hook in self._hooks:
            hook.remove()
        return self.output_dir / LORA_WEIGHT_NAME

    def _batch_schedule(self) -> BatchSchedule:
        config, accelerator = self.config, self.accelerator
        return BatchSchedule(len(self.selection), config.train_batch_size, accelerator.num_processes,
                             accelerator.process_index, config.seed, config.gradient_accumulation_steps)

    def _fingerprint(self) -> dict[str, Any]:
        return training_fingerprint(self.config, self.selection, self.accelerator.num_processes,
                                    self.family.fingerprint(), self.schedule_steps, self.accelerator.mixed_precision)

    def _use_micro_batch(self, size: int) -> None:
        """Train each process's share of an update (`train_batch_size` as `resolve_accumulation` set it) in
        micro-batches of `size`, which divides it; the fingerprint follows."""
        config = self.config
        share = config.train_batch_size * config.gradient_accumulation_steps
        config.train_batch_size, config.gradient_accumulation_steps = size, share // size
        self.accelerator.gradient_accumulation_steps = config.gradient_accumulation_steps
        self.fingerprint = self._fingerprint()

    def _adopt_recorded_micro_batch(self) -> bool:
        """Take the micro-batch size a checkpoint of this training recorded (`recorded_micro_batch`): a resume
        goes on, and a later round trains, as it started. Whether there was one."""
        config = self.config
        size = main_process_decides(self.accelerator.state, lambda: recorded_micro_batch(
            self.fingerprint, config.output_dir, config.resume_from_checkpoint, self.continue_from,
            config.max_train_steps))
        if size is None:
            return False
        share = config.train_batch_size
        if self.cuda_graphs and size < share:
            raise ValueError(f"this training's checkpoints record micro-batches of {size}, {share // size} accumulated "
                             f"per update (--auto_train_batch_size), which --torch_compile={config.torch_compile} does "
                             "not do: it replays the backward as a CUDA graph. Go on with --torch_compile "
                             f"{without_cuda_graphs(config.torch_compile)}, or start again in a new --output_dir")
        self._use_micro_batch(size)
        self.accelerator.print(f"[train] --auto_train_batch_size: {size} sample{'s' if size > 1 else ''} per "
                               "micro-batch, as this training's checkpoints record (a new --output_dir tries the "
                               "sizes again)")
        return True

    def _fit_micro_batch(self) -> None:
        """`--auto_train_batch_size` at a training's start: the largest micro-batch size of `micro_batch_sizes`
        at which one micro-batch's forward and backward (`_trial_step`) fits on every process (under CUDA
        graphs only the whole share, as they accumulate nothing)."""
        config, accelerator, share = self.config, self.accelerator, self.config.train_batch_size
        sizes = [share] if self.cuda_graphs else micro_batch_sizes(share)
        for module in self.trained_modules().values():
            module.train()  # as in the steps: dropout and gradient checkpointing act in training mode only
        # Each process tries alone (None: no size fit there), and all take the largest that fit everywhere.
        fitted = every_process_tries(accelerator.state, lambda: largest_that_fits(
            sizes, self._trial_step, "trying a training micro-batch"))
        if None in fitted:
            failed = fitted.count(None)
            where = "each process" if failed == len(fitted) else f"{failed} of {len(fitted)} processes"
            doing = (f"training {share} samples as one micro-batch on {where} (under CUDA graphs "
                     "--auto_train_batch_size tries no other size)" if self.cuda_graphs else
                     f"training a micro-batch of 1 on {where} (--auto_train_batch_size tried "
                     f"{', '.join(map(str, sizes))})")
            raise DeviceMemoryError(f"out of device memory while {doing}: {self._memory_advice(trying=True)}")
        agreed = min(fitted)
        if config.torch_compile != NO_COMPILE and fitted[accelerator.process_index] != agreed:
            self._trial_step(agreed)  # compiled here for the size it trains at, as on the other processes
        self._use_micro_batch(agreed)
        self.schedule = self._batch_schedule()
        accumulated = f", {share // agreed} accumulated per update" if agreed < share else ""
        samples = f"{agreed} sample{'s' if agreed > 1 else ''}"
        accelerator.print(f"[train] --auto_train_batch_size: {samples} per micro-batch on each process"
                          f"{accumulated} (tried {', '.join(str(size) for size in sizes if size >= agreed)})")

    def _trial_step(self, size: int) -> None:
        """One forward and backward of a micro-batch of `size` samples, as training runs it (the modules in
        training mode, each autocast by its own prepared forward) but outside DDP, whose collectives would wait
        for the other processes' tries, which may be of other sizes; gradients, RNG states and the batch
        schedule are left as they were. A compiled module compiles here for `size`, and the graph of the size
        trained at serves the training's steps: under DDP one graph, not split at DDP's gradient buckets
        (dynamo splits only what it compiles inside DDP's forward), so the adapters' few megabytes of gradients
        all-reduce after the backward instead of during it."""
        accelerator = self.accelerator
        prepared = self.denoiser, dict(self.text_encoders), self.schedule
        share = self.schedule.batch_size * self.schedule.accumulation
        self.schedule = replace(self.schedule, batch_size=size, accumulation=share // size)
        try:
            with preserved_rng(accelerator.device):
                self.denoiser = accelerator.unwrap_model(self.denoiser)
                self.text_encoders = {name: accelerator.unwrap_model(module)
                                      for name, module in self.text_encoders.items()}
                self._micro_batch_loss(0).backward()
        finally:
            self.denoiser, self.text_encoders, self.schedule = prepared
            self.optimizer.zero_grad(set_to_none=True)

    def _memory_advice(self, trying: bool = False) -> str:
        """What to change when a micro-batch does not fit the device, and how the training goes on then;
        `trying`: where `--auto_train_batch_size` found no size that fits."""
        config, advice = self.config, []
        again = "the training starts again from step 0, its checkpoints set aside"
        # CUDA graphs refuse the accumulation a smaller batch needs (`resolve_accumulation`).
        graphs = (f" --torch_compile {without_cuda_graphs(config.torch_compile)}, which accumulates micro-batches "
                  "where CUDA graphs do not" if self.cuda_graphs else "")
        if config.auto_train_batch_size:
            share = config.train_batch_size * config.gradient_accumulation_steps
            if not trying and config.train_batch_size > 1:
                smaller = next(size for size in micro_batch_sizes(share) if size < config.train_batch_size)
                advice.append(f"drop --auto_train_batch_size for --train_batch_size {smaller}"
                              f"{' and' + graphs if graphs else ''} (the training's steps at "
                              f"{config.train_batch_size} do not fit; {again})")
            elif self.cuda_graphs and share > 1:
                advice.append(f"compile without CUDA graphs (--torch_compile {without_cuda_graphs(config.torch_compile)}), "
                              "so that --auto_train_batch_size may accumulate smaller micro-batches")
        elif config.train_batch_size > 1:
            # With --global_batch_size the accumulation follows the batch by itself.
            raise_too = ("" if config.global_batch_size is not None else
                         " and raise --gradient_accumulation_steps as much")
            advice.append(f"lower --train_batch_size{raise_too}{' with' + graphs if graphs else ''} (as many samples "
                          f"per update; {again})")
        if not config.gradient_checkpointing:
            advice.append("pass --gradient_checkpointing (the training resumes from its last checkpoint)")
        return ", or ".join(advice + [MORE_MEMORY])

    def _steps_to_train(self, step: int) -> str:
        """The updates this invocation trains from `step` on, in words: a resumed run or a later online
        round trains only those after `step` (to --max_train_steps, counted over all rounds)."""
        end = self.config.max_train_steps
        return f"{end - step} steps" + (f" (steps {step + 1} to {end})" if step else "")

    def _set_aside_logs(self) -> None:
        """A training starting at step 0 moves the logs in its logging folder aside (`set_aside_logs`), so
        that `gors report` draws this training's curves alone; resumed runs and later rounds keep theirs."""
        logs = self.accelerator.logging_dir
        if logs is None:
            return
        if self.accelerator.is_main_process:
            aside = set_aside_logs(Path(logs))
            if aside is not None:
                self.accelerator.print(f"[train] {logs} held the logs of an earlier training: moved to {aside}, so "
                                       "that they do not mix with this training's")
        self.accelerator.wait_for_everyone()

    def _start_validation(self, step: int) -> None:
        """Set up `--validation_benchmark` for a run at `step` (see `BenchmarkValidation.start`). Without it,
        a fresh start (step 0) still discards the folder's earlier validation results: a later resume of
        this training with validation on must not find another training's best LoRA there."""
        folder = self.validation_dir or self.output_dir
        if self.validation is not None:
            # Online rounds (`validation_dir`) train one LoRA on one selection per round: one training.
            with_selection = self.validation_dir is None
            self.validation.start(step, training_identity(self.fingerprint, with_selection),
                                  recorded_as=[training_identity(self.fingerprint, with_selection, by_path=True)],
                                  keep=self._kept_validation_steps())
        elif step == 0:
            keep = self._kept_validation_steps()
            if self.accelerator.is_main_process:
                discard_validation_results(folder, keep)
            self.accelerator.wait_for_everyone()

    def _kept_validation_steps(self) -> range:
        """The validation steps of a longer run of this training whose checkpoints stay past --max_train_steps
        (`kept_steps`), decided by the main process; none for online rounds, whose results are the top folder's,
        where no round's checkpoints are."""
        if self.validation_dir is not None:
            return range(0)
        later = main_process_decides(self.accelerator.state, lambda: later_checkpoint(
            self.output_dir, self.fingerprint, self.config.max_train_steps))
        return kept_steps(self.config.max_train_steps, checkpoint_step(later) if later is not None else None)

    def prepare(self) -> None:
        """`accelerator.prepare` the trained modules, the optimizer and the LR scheduler, in place.

        DDP looks for parameters without a gradient, a walk over the autograd graph at every backward, only
        in the encoders that have some (`encoders_without_gradient`), not in the denoiser: accelerate wraps a
        module with the DDP options it holds as the module is prepared, so the modules are prepared one at a
        time, in the order that checkpoints number them.
        """
        unused_parameters = self.accelerator.ddp_handler
        try:
            for name, module in self.trained_modules().items():
                self.accelerator.ddp_handler = (unused_parameters if name in self.family.encoders_without_gradient
                                                else None)
                if name == self.family.denoiser:
                    self.denoiser = self.accelerator.prepare(module)
                else:
                    self.text_encoders[name] = self.accelerator.prepare(module)
        finally:
            self.accelerator.ddp_handler = unused_parameters
        self.optimizer, self.lr_scheduler = self.accelerator.prepare(self.optimizer, self.lr_scheduler)

    def _check_continue_from(self) -> None:
        """Refuse `continue_from` (another folder's checkpoint) made with other settings or at or past this
        training's end, before anything in this folder changes."""
        checkpoint = self.continue_from
        if checkpoint is None:
            return
        step = checkpoint_step(checkpoint)
        marker = read_marker(checkpoint)
        if marker is None:
            raise ValueError(f"cannot continue training from {checkpoint}: it is incomplete ({INCOMPLETE_CHECKPOINT}); "
                             "continue from a complete checkpoint of that run")
        # Its selection is another folder's: the settings must match, the data may not.
        differences = fingerprint_differences(marker["fingerprint"], self.fingerprint, "there", with_selection=False)
        if differences:
            raise ValueError(f"cannot continue training from {checkpoint}: it was trained with other settings "
                             f"({'; '.join(differences)}). Use the settings of that run, or a new --output_dir.")
        if step >= self.config.max_train_steps:
            raise ValueError(f"{checkpoint} is at step {step}, not before this training's end at step "
                             f"{self.config.max_train_steps}")
        # Decided once: processes that each read a network filesystem could disagree, and wait at other barriers.
        only_adapters = [LORA_WEIGHT_NAME] if self.reset_optimizer else None  # what `_continue` reads then
        main_process_decides(self.accelerator.state, lambda: check_intact(checkpoint, "continue", only_adapters))

    def _continue(self, checkpoint: Path) -> int:
        """Go on from another folder's checkpoint (see `__init__`; checked by `_check_continue_from`); returns
        its step."""
        accelerator = self.accelerator
        step = checkpoint_step(checkpoint)
        if self.reset_optimizer:
            load_lora(checkpoint, self._bare_trained_modules(), self.backbone.pipeline_class)
            # A random stream of the round's own: --seed alone would repeat round 0's noise, timesteps and dropout.
            set_seed(self.config.seed + step, device_specific=True)
        else:
            accelerator.load_state(str(checkpoint))
        state = "adapters only" if self.reset_optimizer else "adapters, optimizer, LR scheduler and RNG"
        accelerator.print(f"[train] continuing from {checkpoint} at step {step} ({state})")
        return step

    def _check_base_commit(self) -> None:
        """The base model loaded at the version the fingerprint (so every checkpoint of this run) records:
        online, a newer snapshot downloaded while loading would train other weights than they say; so would
        a local folder written while it loaded."""
        config = self.config
        recorded = self.fingerprint.get(BASE_MODEL_COMMIT)
        loaded = model_version(config.pretrained_model_name_or_path, config.revision)
        check_agreement(self.accelerator.state, {"the loaded base model's version": loaded}, "the base model",
                        SAME_TRAINING_FIX)
        check_samples_model(config, loaded)  # a model the cache lacked at the start had no version to compare
        if recorded is not None and loaded != recorded and is_local_fingerprint(recorded):
            raise ModelLoadError(
                f"--pretrained_model_name_or_path={config.pretrained_model_name_or_path!r}: its files changed while it "
                f"loaded (fingerprint {recorded[:19]}..., now {str(loaded)[:19]}...). Rerun once nothing writes to "
                "the folder.")
        if recorded is not None and loaded != recorded:
            raise ModelLoadError(
                f"--pretrained_model_name_or_path={config.pretrained_model_name_or_path!r} moved from commit {recorded} "
                f"to {loaded} while it loaded (a newer snapshot was downloaded). Rerun to train on the new one (a "
                f"checkpoint of the old one is then set aside), or pass --revision {recorded} to go on with the old.")

    def _checkpoint_to_resume(self) -> Path | None:
        """The checkpoint to go on from, checked against this run: the one `--resume_from_checkpoint`
        names, or, without the flag, the newest of this same training (`own_checkpoint`, after
        another training's checkpoints are set aside); None to start at step 0 (or from
        `continue_from`)."""
        # The main process decides, for every process: one that read the folder for itself could train from
        # another step (a network filesystem shows new files late).
        return main_process_decides(self.accelerator.state, self._find_checkpoint_to_resume)

    def _find_checkpoint_to_resume(self) -> Path | None:
        """`_checkpoint_to_resume`'s decision, made on the main process."""
        config, accelerator = self.config, self.accelerator
        recover_replaced_checkpoints(config.output_dir)
        # Its best LoRA and validation results go with them (online rounds keep theirs in the top folder).
        # Its logs too, unless they are a --rounds run's (in the top folder).
        with_folders = (BEST_DIR, VALIDATION_DIR, LOGS_DIR) if self.validation_dir is None else ()
        if not config.resume_from_checkpoint:
            moved = set_aside_other_trainings(config.output_dir, self.fingerprint, with_folders)
            if moved is not None:
                kept = [name for name in with_folders if (moved[0] / name).is_dir()]
                accelerator.print(f"[train] {CHECKPOINTS_DIR}/ held checkpoints of a training with other settings "
                                  f"({'; '.join(moved[1])}): moved to {moved[0]}"
                                  + (f", with its {_listed([f'{name}/' for name in kept])}" if kept else ""))
            self._restore_own_training(with_folders)
            checkpoint = own_checkpoint(config.output_dir, self.fingerprint, config.max_train_steps)
            later = later_checkpoint(config.output_dir, self.fingerprint, config.max_train_steps)
            if later is not None:
                accelerator.print(f"[train] {later} of this same training is past --max_train_steps="
                                  f"{config.max_train_steps}: it stays (--max_train_steps {checkpoint_step(later)} "
                                  f"goes on from it), while this shorter run's LoRA replaces the folder's")
            if checkpoint is not None:
                check_intact(checkpoint)
                accelerator.print(f"[train] {checkpoint} is a checkpoint of this same training (settings and "
                                  "selection): going on from it")
            return checkpoint
        if config.resume_from_checkpoint == "latest":  # as without the flag, where no checkpoint of any training is
            self._restore_own_training(with_folders)
        checkpoint = find_checkpoint(config.output_dir, config.resume_from_checkpoint,
                                     warn=lambda message: accelerator.print(f"[train] warning: {message}"))
        if checkpoint is None:
            start = "its LoRA so far" if self.continue_from is not None else "step 0"
            accelerator.print(f"[train] no checkpoint of this folder to resume from; starting from {start}")
        else:
            check_resumable(checkpoint, self.fingerprint, config.max_train_steps, config.output_dir)
            check_intact(checkpoint, config.resume_from_checkpoint)
            checkpoint = self._bring_back_training_of(checkpoint)
        return checkpoint

    def _restore_own_training(self, with_folders: Sequence[str]) -> None:
        """`restore_own_training`: this training's checkpoints back from the `checkpoints.previous-<n>/` a
        training with other settings set them aside to, where `checkpoints/` holds no complete checkpoint."""
        restored = restore_own_training(self.config.output_dir, self.fingerprint, self.config.max_train_steps,
                                        with_folders)
        if restored is not None:
            self.accelerator.print(f"[train] {restored} held checkpoints of this same training, set aside by a "
                                   f"training with other settings since: moved back to {CHECKPOINTS_DIR}/")

    def _bring_back_training_of(self, checkpoint: Path) -> Path:
        """`checkpoint` where training goes on from it: one that a training with other settings set aside
        (`checkpoints.previous-<n>/`) goes back to `checkpoints/` with its whole training (`bring_back`), and
        that training to another `checkpoints.previous-<n>/`: the resumed one saves, prunes and validates beside
        its own steps, not over another training's."""
        aside = checkpoint.parent
        if aside.resolve() not in {folder.resolve() for folder in set_aside_checkpoints(self.config.output_dir)}:
            return checkpoint
        with_folders = (BEST_DIR, VALIDATION_DIR, LOGS_DIR) if self.validation_dir is None else ()
        moved = bring_back(self.config.output_dir, aside, with_folders)
        self.accelerator.print(f"[train] {aside} (this training's, set aside by one with other settings) is "
                               f"{CHECKPOINTS_DIR}/ again" + (f"; what {CHECKPOINTS_DIR}/ held moved to {moved}"
                                                              if moved is not None else ""))
        return Path(self.config.output_dir) / CHECKPOINTS_DIR / checkpoint.name

    def save_checkpoint(self, step: int) -> Path:
        """Full training state (adapters, optimizer, LR scheduler, RNG) at `checkpoints/checkpoint-<step>`."""
        self.check_finite(step)
        return write_checkpoint(self.accelerator, self.output_dir, step, self.fingerprint,
                                self.config.checkpoints_total_limit, self.config.max_train_steps,
                                self.since)

    def check_finite(self, step: int) -> None:
        """Refuse to save adapters with a NaN or infinite weight (one wait for the device): a diverged training."""
        named = [(f"{name}.{key}", param) for name, module in self._bare_trained_modules().items()
                 for key, param in module.named_parameters() if param.requires_grad]
        if torch.stack([torch.isfinite(param).all() for _, param in named]).all().item():
            return
        first = next(key for key, param in named if not torch.isfinite(param).all())
        raise TrainingDiverged(f"the LoRA's weights are not finite at step {step} (NaN or infinite, first {first})",
                               self.learning_rate_flags())

    def learning_rate_flags(self) -> str:
        """The flags of the learning rates that train something, with their values ("--learning_rate (now 1e-4) and
        ..."): what `TrainingDiverged` says to lower."""
        config = self.config
        flags = [("learning_rate", config.learning_rate)] if config.train_unet else []
        if self.family.trained_text_encoders(config.train_text_encoder):
            flags.append(("text_encoder_learning_rate", config.text_encoder_learning_rate))
        return " and ".join(f"--{flag} (now {value:g})" for flag, value in flags)


class TrainingDiverged(ValueError):
    """A training whose loss or weights became NaN or infinite: what went wrong, and what to rerun."""

    def __init__(self, what: str, rates: str) -> None:
        """`rates`: the flags of the learning rates that train something (`GORSTrainer.learning_rate_flags`)."""
        super().__init__(f"training diverged: {what}; nothing of this step was saved. Rerun with a lower {rates} and "
                         "without --resume_from_checkpoint: the training starts over from step 0, the folder's "
                         "checkpoints set aside (with --rounds after a finished round, in a new --output_dir)")


class LossLog:
    """Each update's mean loss (over micro-batches and processes) and the learning rates it used, sent to the trackers
    and the progress bar one update late: reading a loss waits for the device to compute it, and by the
    next update the host has queued that update's work behind it, so the device does not idle meanwhile.

    A loss that is NaN or infinite stops the training (`TrainingDiverged`, naming the rates `stop_with`),
    except under fp16's loss scaler (`stop_with` None), which skips an update that overflowed and goes on.
    """

    def __init__(self, accelerator: Accelerator, trained: list[str], bar: Any = None,
                 stop_with: str | None = None) -> None:
        self.accelerator, self.trained, self.bar, self.stop_with = accelerator, trained, bar, stop_with
        self._pending: tuple[int, HostValue, list[float]] | None = None

    def add(self, step: int, losses: list[torch.Tensor], lrs: list[float]) -> None:
        """Log the update before this one, and hold update `step`'s (`losses`: its micro-batches')."""
        self.flush()
        loss = self.accelerator.gather(torch.stack(losses).mean()[None]).mean()
        self._pending = (step, HostValue(loss), lrs)

    def flush(self) -> None:
        """Log the update held, if any."""
        if self._pending is None:
            return
        step, loss, lrs = self._pending
        self._pending = None
        value = loss.get().item()
        if self.stop_with is not None and not math.isfinite(value):
            raise TrainingDiverged(f"the loss of step {step} is {value}", self.stop_with)
        self.accelerator.log({"train/loss": value} | {f"train/lr_{name}": lr for name, lr in zip(self.trained, lrs)},
                             step=step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{value:.4f}")


class Updates:
    """Each micro-batch's optimizer and LR-scheduler steps: at an update, the optimizer's step, then the LR
    scheduler's unless fp16's loss scaler skipped the update.

    A skipped update (gradients that overflowed in fp16) must not advance the LR schedule, or warm-up
    and decay end early. Accelerate holds the schedule back only when the optimizer's `step` was not
    called at all, but the scaler calls fused AdamW's `step` even then (the kernel skips the update
    itself); the scaler lowering its scale is what tells, whichever the optimizer. That verdict is on
    the device: it is read at the next update, before the optimizer step whose learning rate it
    decides, or at `settle()` (before a checkpoint saves the schedule), so that the host does not wait
    for the device at every update.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> None:
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.lrs: list[float] = lr_scheduler.get_last_lr()  # the learning rates of the latest update
        self._lowered: HostValue | None = None  # whether the scaler lowered its scale at the update not settled

    def step(self, scaler: torch.amp.GradScaler | None, update: bool) -> None:
        """The steps of one micro-batch; `update`: it ends an update (it syncs gradients; Accelerate's
        wrappers step only then); `scaler`: fp16's loss scaler, or None."""
        if update:
            self.settle()
            self.lrs = self.lr_scheduler.get_last_lr()
        scale = scaler._get_scale_async() if update and scaler is not None else None  # a device tensor: no wait
        if scale is None:
            self.optimizer.step()
            self.lr_scheduler.step()
            return
        before = scale.clone()
        self.optimizer.step()
        self._lowered = HostValue(scaler._get_scale_async() < before)

    def settle(self) -> None:
        """Step the LR schedule for the update whose verdict is pending, unless the scaler skipped it."""
        if self._lowered is not None:
            lowered, self._lowered = bool(self._lowered.get()), None
            if not lowered:
                self.lr_scheduler.step()


@holds_stages("select", "train")
def train(config: TrainConfig | RunConfig, accelerator: Accelerator | None = None, continue_from: Path | None = None,
          reset_optimizer: bool = False, validation_dir: Path | None = None, schedule_steps: int | None = None) -> Path:
    """Run GORS training for a run folder that has `selection.jsonl`; returns the LoRA file (see
    `GORSTrainer` for `continue_from`, `reset_optimizer`, `validation_dir` and `schedule_steps`)."""
    return GORSTrainer(config, accelerator, continue_from, reset_optimizer, validation_dir, schedule_steps).train()
