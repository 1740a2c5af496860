"""Loading the text-to-image pipeline that generates samples: any diffusers pipeline, by its model family."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator

from gors.core.backbones import (
    FAMILIES,
    LORA_WEIGHT_NAME,
    Backbone,
    check_lora_fits,
    check_lora_loader,
    detect_backbone,
    half_precision_warning,
)
from gors.core.compiling import NO_COMPILE, compile_module
from gors.core.fused_lora import fuse_lora_forward
from gors.core.hub import from_pretrained, is_hub_id
from gors.core.io import files_sha256
from gors.core.logs import first_time
from gors.core.lora_shapes import (
    check_lora_shapes,
    file_lora_layer_counts,
    loaded_lora_layers,
    lora_components,
    lora_layers_left_out,
    model_name,
    read_lora_shapes,
)
from gors.core.memory import is_out_of_memory

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

logger = logging.getLogger(__name__)

# What a store records when the family samples with the checkpoint's own scheduler.
CHECKPOINT_SCHEDULER = "the checkpoint's"


def inference_dtype(accelerator: Accelerator, mixed_precision: str | None) -> torch.dtype:
    """fp16/bf16 on GPU when asked (or when the accelerate config says so); fp32 on CPU. A GPU left in fp32
    because nothing chose a precision (a command run without `accelerate launch` or --mixed_precision) is
    said once: T2I-CompBench's sampling script and gors' accelerate configs generate in fp16."""
    precision = mixed_precision or accelerator.mixed_precision
    if accelerator.device.type != "cuda":
        return torch.float32
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    if dtype == torch.float32 and "ACCELERATE_MIXED_PRECISION" not in os.environ and first_time("fp32 on a GPU"):
        logger.warning("generating in float32 on a GPU: neither --mixed_precision nor an accelerate launch chose a "
                       "precision. T2I-CompBench's sampling script and gors' accelerate configs generate in fp16, "
                       "about twice as fast: pass --mixed_precision fp16 (SD3/3.5 and FLUX.1 then "
                       "take bf16), or run under `accelerate launch --config_file accelerate_configs/<yours>.yaml`")
    return dtype


def load_pipeline(
    pretrained_model_name_or_path: str,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    revision: str | None = None,
    lora: str | None = None,
    backbone: Backbone | None = None,
    torch_compile: str = NO_COMPILE,
    lora_dropout: float = 0.0,
) -> DiffusionPipeline:
    """The checkpoint's diffusers pipeline, with its family's sampler (`gors.core.backbones`).

    Stable Diffusion 1/2 samples with DDIM (the T2I-CompBench protocol) and without its safety
    checker, which replaces flagged images with black ones that would silently become low-reward
    samples; other families keep the checkpoint's own scheduler. `lora`: a folder with a
    diffusers-format LoRA (e.g. a gors run folder) loaded on top. `backbone`: the family when it
    is already known (it is read from `model_index.json` otherwise). `torch_compile`: a
    `torch.compile` backend for the denoiser, with inductor's mode after a colon (`compile_module`),
    "no" for none. `lora_dropout`: sample with dropout on the LoRA's output (`LoraOutputDropout`; the
    pipeline returned then reseeds it per call).
    """
    import diffusers

    backbone = backbone or detect_backbone(pretrained_model_name_or_path, revision)
    warning = half_precision_warning(backbone, dtype)
    if warning is not None:
        logger.warning(warning)
    if lora is not None:
        check_lora_path(lora)  # before any weights load
        check_lora_loader(backbone, lora)
        check_lora_fits(pretrained_model_name_or_path, lora, revision)
    pipeline_class = getattr(diffusers, backbone.pipeline_class)
    pipeline = from_pretrained(pipeline_class.from_pretrained, pretrained_model_name_or_path,
                               "--pretrained_model_name_or_path", revision=revision, dtype=dtype,
                               **backbone.pipeline_kwargs)
    if backbone.sampling.scheduler is not None:
        pipeline.scheduler = getattr(diffusers, backbone.sampling.scheduler).from_config(pipeline.scheduler.config)
    if lora is not None:
        load_lora(pipeline, lora)
    pipeline.set_progress_bar_config(disable=True)
    pipeline = pipeline.to(device)
    if torch_compile != NO_COMPILE:
        denoiser = getattr(pipeline, "unet", None) or getattr(pipeline, "transformer", None)
        if denoiser is None:
            raise ValueError(f"--torch_compile={torch_compile!r}: a {backbone.pipeline_class} has no unet or "
                             "transformer to compile; generate without the flag")
        compile_module(denoiser, torch_compile)
    if lora_dropout:
        if lora is None:
            raise ValueError(f"lora_dropout={lora_dropout} without a LoRA: there is nothing to drop")
        return LoraOutputDropout(pipeline, lora_dropout)
    return pipeline


class LoraOutputDropout:
    """A pipeline that samples with dropout on its LoRA's output, as T2I-CompBench's `inference_eval.py`
    samples the official GORS checkpoints.

    lora_diffusion's injected layers compute ``linear(x) + dropout(up(down(x))) * scale`` with p = 0.1,
    and that script leaves them in training mode, so the dropout is active while it samples. Here a
    forward hook on every LoRA up-projection (peft's `lora_B`) drops its output elements with
    probability `p` and rescales the rest by 1 / (1 - p), which is the same place and rule.

    Each image's masks come from a generator of its own, seeded from its image seed and its prompt
    (`mask_seed`), and drawn for its rows of every batch (row r of a call's n images is image r mod n: the
    prompts' encodings, and both halves of a classifier-free-guidance batch). So an image is the same at
    any batch size, process count or resume, and its masks are independent of other prompts' (T2I-CompBench's
    seeds 42 + n repeat over prompts), as the script's draws from one running stream are; they are not the
    script's own draws. A call whose prompts and seeds do not pair up (other pipelines) draws from one
    generator seeded from all of them, and a layer whose rows are no multiple of the call's images from the
    first image's.

    Calls pass through to the pipeline; its attributes are read through.
    """

    def __init__(self, pipeline: Any, p: float) -> None:
        from peft.tuners.lora import LoraLayer

        if not 0.0 < p < 1.0:
            raise ValueError(f"lora_dropout must be in (0, 1), got {p}")
        self.pipeline, self.p = pipeline, p
        layers = [module for component in pipeline.components.values() if isinstance(component, torch.nn.Module)
                  for module in component.modules() if isinstance(module, LoraLayer)]
        if not layers:
            raise ValueError("lora_dropout: the pipeline has no LoRA layers to drop")
        # Where the LoRA's output is not lora_B's output of the input, the hook would drop the wrong thing or none.
        unlike = [type(layer).__name__ for layer in layers
                  if getattr(layer, "merged", False) or not layer.lora_B or any(getattr(layer, "use_dora", {}).values())]
        if unlike:
            raise ValueError(f"lora_dropout: {len(unlike)} LoRA layers ({sorted(set(unlike))}) are merged, DoRA or "
                             "embedding layers, whose output the dropout cannot reach as lora_diffusion's does; "
                             "evaluate that LoRA without --lora_dropout")
        for layer in layers:
            for up in layer.lora_B.values():
                up.register_forward_hook(self._drop)
        self._seeds: list[int] = [0]  # one per image of the current call
        self._generators: dict[tuple[int, torch.device], torch.Generator] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "pipeline":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return getattr(self.pipeline, name)

    def __call__(self, *args: Any, generator: Any = None, **kwargs: Any) -> Any:
        generators = generator if isinstance(generator, list) else [generator]
        seeds = [g.initial_seed() if isinstance(g, torch.Generator) else 0 for g in generators]
        prompt = kwargs.get("prompt", args[0] if args else None)
        prompts = [prompt] if prompt is None or isinstance(prompt, str) else list(prompt)
        if len(prompts) == 1:
            prompts *= len(seeds)
        if len(prompts) == len(seeds):
            self._seeds = [mask_seed(seed, str(text)) for seed, text in zip(seeds, prompts)]
        else:  # the images cannot be told apart: one stream for the call
            self._seeds = [mask_seed(seeds[0], repr((seeds, prompts)))]
        self._generators.clear()
        return self.pipeline(*args, generator=generator, **kwargs)

    def _generator(self, image: int, device: torch.device) -> torch.Generator:
        key = (image, device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device).manual_seed(self._seeds[image])
        return self._generators[key]

    def _drop(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        keep = torch.empty_like(output)
        images = len(self._seeds) if output.shape[0] % len(self._seeds) == 0 else 1
        for image in range(images):  # its rows, r mod images == image: as many for any batching
            keep[image::images].bernoulli_(1.0 - self.p, generator=self._generator(image, output.device))
        return output * keep / (1.0 - self.p)


# How `LoraOutputDropout` seeds its masks, recorded beside `lora_dropout`: images a gors sampled with the masks of
# each call's first seed (which depended on the batching) are not mixed with these.
DROPOUT_MASKS = "per image and prompt"


def mask_seed(image_seed: int, prompt: str) -> int:
    """The seed of an image's dropout masks (`LoraOutputDropout`): its image seed and prompt, hashed to 63 bits."""
    digest = hashlib.sha256(f"{image_seed}\0{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def component_dtypes(pipeline: Any) -> dict[str, torch.dtype]:
    """The dtype of each module component of `pipeline` that has parameters, by component name (none for a
    pipeline without diffusers' `components`, such as a function that makes images)."""
    components = getattr(pipeline, "components", None)
    return {name: parameter.dtype for name, component in (components if isinstance(components, dict) else {}).items()
            if isinstance(component, torch.nn.Module)
            and (parameter := next(component.parameters(), None)) is not None}


@contextlib.contextmanager
def dtypes_restored_on_out_of_memory(pipeline: Any, dtypes: dict[str, torch.dtype]) -> Iterator[None]:
    """Cast back to `dtypes` the components that a call running out of memory left in another: an fp16 SDXL
    pipeline upcasts its VAE to float32 for the decode (its memory peak at 1024 px) and casts it back only after,
    so the halved retry would feed fp16 latents to a float32 VAE."""
    try:
        yield
    except RuntimeError as err:
        if not is_out_of_memory(err):
            raise
        now = component_dtypes(pipeline)
        for name, dtype in dtypes.items():
            if now.get(name, dtype) != dtype:
                pipeline.components[name].to(dtype)
        raise


def _not_a_component_warning(record: logging.LogRecord) -> bool:
    # diffusers warns of every component a LoRA leaves alone (a U-Net-only LoRA: the text encoder); what
    # loaded where is checked and logged after the load instead.
    return not record.getMessage().startswith("No LoRA keys associated to")


def load_lora(pipeline: DiffusionPipeline, lora: str) -> None:
    """`pipeline.load_lora_weights(lora)`, refusing in one line a LoRA trained on another base model of the
    same family: a local diffusers-format file is checked against the pipeline's layers first
    (`check_lora_shapes`); for other LoRAs torch's 60-line size-mismatch error is cut to one line. A LoRA
    that adapted no layer is refused, and one of another format (kohya) whose file adapts more layers of a
    component than loaded is warned of: diffusers skips the names it cannot place without a word. The LoRA
    linear layers then run fused (`gors.core.fused_lora`)."""
    file = local_lora_file(lora)
    # A local safetensors file's header (no tensor), read once for both checks; diffusers reads any other.
    shapes = read_lora_shapes(file) if file is not None and file.suffix == ".safetensors" else None
    if shapes is not None:
        check_lora_shapes(pipeline, shapes, lora)
    peft_logger = logging.getLogger("diffusers.loaders.peft")  # logs the whole error before raising it
    base_logger = logging.getLogger("diffusers.loaders.lora_base")
    level = peft_logger.level
    peft_logger.setLevel(logging.CRITICAL)
    base_logger.addFilter(_not_a_component_warning)
    try:
        pipeline.load_lora_weights(lora)
    except RuntimeError as err:
        mismatch = re.search(r"size mismatch for ([^:\s]+)", str(err))
        if mismatch is None:
            raise
        raise ValueError(f"LoRA {lora} was trained on another base model ({mismatch.group(1)}); pass the model it "
                         "was trained on") from err
    except ValueError as err:  # peft's NoMatchingPeftModuleError: no name of the file is a layer of the model
        if type(err).__name__ != "NoMatchingPeftModuleError":
            raise
        # peft's first line lists every target module, thousands of characters for a real model: cut it short.
        cause = str(err).splitlines()[0]
        cause = cause if len(cause) <= 200 else cause[:200] + " ..."
        raise ValueError(f"LoRA {lora} matches no layer of {model_name(pipeline)} ({cause}): it "
                         "was trained on another model; pass the model it was trained on") from None
    finally:
        peft_logger.setLevel(level)
        base_logger.removeFilter(_not_a_component_warning)
    loaded = loaded_lora_layers(pipeline)
    if not loaded:
        raise ValueError(f"LoRA {lora} adapted no layer of {model_name(pipeline)}: none of its weight names is a "
                         "layer of this model; pass the model it was trained on (or a LoRA in diffusers' format)")
    if shapes is not None:
        denoiser = "transformer" if isinstance(getattr(pipeline, "transformer", None), torch.nn.Module) else "unet"
        left_out = lora_layers_left_out(file_lora_layer_counts(shapes, denoiser, lora_components(pipeline)), loaded)
        if left_out:
            logger.warning("LoRA %s loaded in part (%s): diffusers left out the names it could not place in %s, "
                           "so samples show a part of the LoRA", lora, "; ".join(left_out), model_name(pipeline))
    logger.info("LoRA %s loaded into %s", lora, ", ".join(f"{count} layers of {name}" for name, count in loaded.items()))
    # Base and adapter matmuls as one operation: peft's values in float32, each sum rounded once in half precision.
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            fuse_lora_forward(component)


# The files `load_lora_weights(folder)` reads, in its order: a gors LoRA is the first.
LORA_WEIGHT_FILES = (LORA_WEIGHT_NAME, "pytorch_lora_weights.bin")
# LoRA files that diffusers reads with `torch.load` (any other file but .safetensors is refused).
TORCH_LORA_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


# The text-encoder file beside a lora_diffusion checkpoint's `<name>.pt` (T2I-CompBench's GORS LoRAs).
LORA_DIFFUSION_TEXT_ENCODER_SUFFIX = ".text_encoder.pt"


def _convert_first(lora: str, flag: str) -> str:
    return (f"{flag}={lora!r} is a lora_diffusion checkpoint (T2I-CompBench's GORS LoRAs are): diffusers reads no "
            f"such file. Convert it first, `gors convert-lora {lora} OUT` (`official:<category>` for the official "
            "ones), then pass OUT")


def check_lora_path(lora: str, flag: str = "--lora") -> None:
    """Refuse, before any work, a LoRA path that does not exist, a folder that holds no LoRA weights, and a
    lora_diffusion checkpoint (to convert first, `gors convert-lora`)."""
    path = Path(lora).expanduser()
    if not path.exists():
        # diffusers' `load_lora_weights` would take a Hub id; gors reads a LoRA from disk, to hash and check it
        # (`gors evaluate --lora hub:<id>` downloads one first).
        hub = "" if not is_hub_id(lora) or path.parent.is_dir() else (
            f"; if {lora} is a LoRA on the Hugging Face Hub, `gors evaluate --lora hub:{lora}` downloads it (elsewhere "
            f"pass a local copy: `hf download {lora} --local-dir DIR`)")
        raise FileNotFoundError(f"{flag}={lora!r}: no such file or folder; pass a LoRA folder (e.g. a gors run "
                                f"folder, which holds {LORA_WEIGHT_NAME}) or the weights file itself{hub}")
    if path.is_dir() and not any((path / name).is_file() for name in LORA_WEIGHT_FILES):
        if any(path.glob(f"*{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX}")):
            raise FileNotFoundError(_convert_first(lora, flag))
        if any((path / name).exists() for name in ("samples", "selection.jsonl", ".lock-train")):
            raise FileNotFoundError(f"{flag}={lora!r} is a run folder that holds no LoRA yet ({LORA_WEIGHT_NAME}): its "
                                    f"training has not finished (`gors status {lora}` says how far it has come)")
        raise FileNotFoundError(f"{flag}={lora!r} is not a LoRA folder (it holds no {LORA_WEIGHT_NAME}); pass a folder "
                                "a gors run or `save_lora_weights` wrote, or the weights file itself")
    if path.is_file() and path.suffix != ".safetensors" and path.suffix not in TORCH_LORA_SUFFIXES:
        raise ValueError(f"{flag}={lora!r} is not a LoRA file: pass a .safetensors file (or a torch "
                         f"{', '.join(TORCH_LORA_SUFFIXES)} file), or the folder a gors run wrote")
    if path.is_file() and path.suffix in TORCH_LORA_SUFFIXES:
        _check_torch_lora(path, lora, flag)
    _check_safetensors(path / LORA_WEIGHT_NAME if path.is_dir() else path, lora, flag)


def _check_torch_lora(file: Path, lora: str, flag: str) -> None:
    """Refuse a torch LoRA file that is not a state dict (a name -> tensor mapping, which diffusers reads):
    a lora_diffusion checkpoint's list of tensors, or a file that does not read as tensors."""
    try:
        # weights_only: a downloaded pickle cannot run code; a LoRA is a few MB.
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several unrelated types for a file that is not a checkpoint
        raise ValueError(f"{flag}={lora!r}: torch.load cannot read {file} as tensors ({type(err).__name__}: cut "
                         "short, or another format); pass the folder or file a gors run wrote") from None
    if isinstance(state, (list, tuple)):
        raise ValueError(_convert_first(lora, flag))
    if not isinstance(state, dict):
        raise ValueError(f"{flag}={lora!r}: {file} holds a {type(state).__name__}, not a LoRA's state dict (layer "
                         "name -> tensor); pass the folder or file a gors run wrote")


def _check_safetensors(file: Path, lora: str, flag: str) -> None:
    """Refuse a LoRA file whose safetensors header does not read (cut short, or another format)."""
    if not file.is_file() or file.suffix != ".safetensors":  # a torch pickle is diffusers' to read
        return
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), "pt") as handle:
            handle.keys()
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{flag}={lora!r}: {file} is not a readable safetensors LoRA ({err}: cut short, or "
                         "another format); pass the folder or file a gors run wrote") from None


def local_lora_file(lora: str) -> Path | None:
    """The weights file `load_lora_weights(lora)` reads when `lora` is a local file or folder; None for a
    Hub id or a folder without LoRA weights."""
    path = Path(lora).expanduser()
    if path.is_file():
        return path
    return next((path / name for name in LORA_WEIGHT_FILES if (path / name).is_file()), None)


def lora_sha256(lora: str | None) -> str | None:
    """sha256 of a local LoRA's weights (the file, or a folder's weight files), so that a sample store
    notices a LoRA retrained at the same path; None without a LoRA or for one that is not local."""
    if lora is None:
        return None
    path = Path(lora).expanduser()
    files = [path] if path.is_file() else [path / name for name in LORA_WEIGHT_FILES if (path / name).is_file()]
    return files_sha256(files) if files else None


def pipeline_settings(
    pretrained_model_name_or_path: str | None,
    dtype: torch.dtype,
    revision: str | None = None,
    lora: str | None = None,
    backbone: Backbone | None = None,
    recorded_lora: str | None = None,
    lora_dropout: float = 0.0,
) -> dict[str, Any]:
    """What `load_pipeline` with these arguments generates with, as a sample store records it
    (`backbone` None: Stable Diffusion 1/2, or a pipeline in memory). The LoRA is recorded by its
    path (`recorded_lora` where given, e.g. relative to a run folder) and by the sha256 of its weights,
    so that images of a LoRA retrained at the same path are never mixed with the new LoRA's. A
    `lora_dropout` is recorded where it is used (stores made without one record nothing new)."""
    return {
        "model": pretrained_model_name_or_path,
        "revision": revision,
        "lora": recorded_lora if recorded_lora is not None else lora,
        "lora_sha256": lora_sha256(lora),
        "scheduler": sampler_name(backbone or FAMILIES["StableDiffusionPipeline"]),
        "dtype": str(dtype).removeprefix("torch."),
    } | ({"lora_dropout": lora_dropout, "lora_dropout_masks": DROPOUT_MASKS} if lora_dropout else {})


def sampler_name(backbone: Backbone) -> str:
    """The scheduler `backbone` samples with, as settings record it: a diffusers class name, or
    `CHECKPOINT_SCHEDULER` for the checkpoint's own."""
    return backbone.sampling.scheduler or CHECKPOINT_SCHEDULER


def cpu_generators(seeds: list[int]) -> list[torch.Generator]:
    """One generator per image, on the CPU so an image depends on its seed and not on the device."""
    return [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
