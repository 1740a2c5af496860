"""The tiny SDXL, SD3, FLUX.1 and PixArt-Sigma pipelines: they load as the real classes and generate.

Each family is built once per module (a parametrised module-scoped fixture); the pipelines run
2 steps at 32 x 32 on the CPU, with each family's default text lengths (SD3: 256 T5 tokens,
FLUX: 512, PixArt: 300).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.flux import build_tiny_flux_pipeline
from gors.testing.pixart import build_tiny_pixart_pipeline
from gors.testing.sd3 import build_tiny_sd3_pipeline
from gors.testing.sdxl import build_tiny_sdxl_pipeline
from gors.testing.t5 import EXTRA_IDS, WORDS, build_t5_tokenizer

PROMPTS = ["a red cat on the left of a blue dog", "Two wooden chairs, 3 cups!"]
SIZE = 32


@dataclass(frozen=True)
class Family:
    """How to build one family and call its pipeline."""

    builder: Callable[..., Path]
    class_name: str
    denoiser: str
    call_kwargs: dict[str, Any] = field(default_factory=dict)


FAMILIES = {
    "sdxl": Family(build_tiny_sdxl_pipeline, "StableDiffusionXLPipeline", "unet"),
    "sd3": Family(build_tiny_sd3_pipeline, "StableDiffusion3Pipeline", "transformer"),
    "flux": Family(build_tiny_flux_pipeline, "FluxPipeline", "transformer"),
    "pixart": Family(
        build_tiny_pixart_pipeline,
        "PixArtSigmaPipeline",
        "transformer",
        # Resolution bins exist only for the real sample sizes; bs4 is not a dependency.
        dict(use_resolution_binning=False, clean_caption=False),
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def built(request, tmp_path_factory) -> tuple[Family, Path]:
    """One family and the folder of its tiny pipeline, built once for the module."""
    family = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(f"tiny_{request.param}")
    assert family.builder(path, seed=0) == path
    return family, path


def _load(path: Path, pipeline_class: type | None = None):
    """Load the pipeline at `path` (with `DiffusionPipeline` unless a class is given), quietly."""
    from diffusers import DiffusionPipeline

    pipeline = (pipeline_class or DiffusionPipeline).from_pretrained(path)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _generate(pipeline, seed: int, **kwargs) -> list[Image.Image]:
    """Two 2-step images of `PROMPTS` at `SIZE` x `SIZE` from a seeded CPU generator."""
    generator = torch.Generator("cpu").manual_seed(seed)
    return pipeline(PROMPTS, height=SIZE, width=SIZE, num_inference_steps=2, generator=generator, **kwargs).images


def _file_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_model_index_names_the_pipeline_class(built):
    family, path = built
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == family.class_name


def test_loads_as_the_generic_and_the_specific_class(built):
    import diffusers

    family, path = built
    pipeline_class = getattr(diffusers, family.class_name)
    assert type(_load(path)) is pipeline_class
    assert type(_load(path, pipeline_class)) is pipeline_class


def test_generates_two_images_reproducibly(built):
    family, path = built
    pipeline = _load(path)
    images = _generate(pipeline, seed=0, **family.call_kwargs)
    assert len(images) == 2
    assert all(isinstance(image, Image.Image) and image.size == (SIZE, SIZE) for image in images)
    arrays = [np.asarray(image) for image in images]
    again = [np.asarray(image) for image in _generate(pipeline, seed=0, **family.call_kwargs)]
    other = [np.asarray(image) for image in _generate(pipeline, seed=1, **family.call_kwargs)]
    assert all(np.array_equal(a, b) for a, b in zip(arrays, again))
    assert not np.array_equal(arrays[0], other[0])


def test_same_seed_same_files_other_seed_other_weights(built, tmp_path):
    family, path = built
    same = family.builder(tmp_path / "same", seed=0)
    assert _file_bytes(same) == _file_bytes(path)
    other = family.builder(tmp_path / "other", seed=1)
    weights = f"{family.denoiser}/diffusion_pytorch_model.safetensors"
    assert (other / weights).read_bytes() != (path / weights).read_bytes()


def test_flux_schnell_has_no_guidance_embedding_and_a_fixed_shift(tmp_path):
    from diffusers import FluxPipeline

    pipeline = _load(build_tiny_flux_pipeline(tmp_path, seed=0, schnell=True), FluxPipeline)
    assert not pipeline.transformer.config.guidance_embeds
    assert not pipeline.scheduler.config.use_dynamic_shifting
    assert pipeline.scheduler.config.shift == 1.0
    images = _generate(pipeline, seed=0, guidance_scale=0.0, max_sequence_length=256)
    assert [image.size for image in images] == [(SIZE, SIZE)] * 2


def test_t5_tokenizer_keeps_t5_conventions_and_pads_to_the_pipelines_lengths(tmp_path):
    from transformers import T5TokenizerFast

    tokenizer = build_t5_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.model_max_length == 512
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == len(tokenizer) - 1
    assert tokenizer.convert_tokens_to_ids(f"<extra_id_{EXTRA_IDS - 1}>") == len(tokenizer) - EXTRA_IDS
    # Known words are one piece each; other ASCII is spelt out, never <unk>.
    assert tokenizer.tokenize("a red cat") == ["▁a", "▁red", "▁cat"]
    for text in [WORDS, *PROMPTS]:
        ids = tokenizer(text).input_ids
        assert ids[-1] == tokenizer.eos_token_id and tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    for length in (256, 300, 512):
        batch = tokenizer(PROMPTS, padding="max_length", max_length=length, truncation=True)
        assert [len(ids) for ids in batch.input_ids] == [length, length]
        assert batch.input_ids[0][-1] == tokenizer.pad_token_id and batch.attention_mask[0][-1] == 0
    tokenizer.save_pretrained(tmp_path)
    reloaded = T5TokenizerFast.from_pretrained(tmp_path)
    assert reloaded(PROMPTS).input_ids == tokenizer(PROMPTS).input_ids
    assert reloaded.model_max_length == 512


def test_a_clip_tokenizer_is_read_once_and_one_a_test_changed_is_read_anew(tiny_sd):
    """conftest's `clip_tokenizers_read_once` hands no test another test's changes."""
    from transformers import CLIPTokenizer

    first = CLIPTokenizer.from_pretrained(tiny_sd, subfolder="tokenizer")
    assert CLIPTokenizer.from_pretrained(tiny_sd, subfolder="tokenizer") is first
    first.padding_side = "left"
    again = CLIPTokenizer.from_pretrained(tiny_sd, subfolder="tokenizer")
    assert again is not first and again.padding_side == "right"
