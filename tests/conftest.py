"""Shared fixtures: tiny random models of the real classes, built once per test session."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Set before anything imports huggingface_hub, which reads it once: tests never reach the Hub, whatever
# the caller's environment says.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread in every process the tests start too (a user's script, `python -m gors.cli`, launched
# workers), read by torch's OpenMP as it loads: the tiny models gain nothing from more, and on a shared CPU the
# idle threads' spinning takes the cores from the other tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Caches that `datasets` (its Arrow files) and gors (downloads, conversions) would write under the
# user's home go to a folder of this test session instead (subprocesses inherit it), removed at its end.
_CACHES = tempfile.mkdtemp(prefix="gors-test-caches-")
os.environ["HF_DATASETS_CACHE"] = os.path.join(_CACHES, "datasets")
os.environ["GORS_CACHE_DIR"] = os.path.join(_CACHES, "gors")

from gors.core.distributed import reset_process_state  # noqa: E402

SHARED_BENCHMARKS = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHES, ignore_errors=True)


# The modules that take longest (launched processes, compiled graphs, whole runs: 30-110 s of a worker each in
# `--durations=0` on 2 cores), longest first. pytest-xdist's loadscope hands modules to its workers in collection
# order (the Makefile passes --no-loadscope-reorder, whose default orders them by their number of tests), so these
# start first and the many short modules even out the workers' ends, instead of a long one starting last while the
# other worker has nothing left to do.
LONGEST_MODULES = ("test_rounds", "test_family_training", "test_speed_paths", "test_auto_train_batch", "test_train",
                   "test_distributed", "test_families", "test_toy_gors", "test_faults", "test_hub_lora",
                   "test_validation", "test_out_of_memory", "test_run_folder_lock", "test_docs_python_api")


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))  # stable: in-module order kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With GORS_REQUIRE_SHARED=1 (CI, which has ../shared beside the checkout), a test skipped for
    want of the reference copies in ../shared fails instead: coverage is not lost silently."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("GORS_REQUIRE_SHARED") == "1" and report.skipped and "shared" in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"GORS_REQUIRE_SHARED=1, but the test was skipped: {report.longrepr}"


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread: on a small CPU torch's pool oversubscribes the cores (and other jobs'),
    and the tiny models gain nothing from more threads."""
    from gors.core.threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session", autouse=True)
def clip_tokenizers_read_once():
    """Each folder's CLIP tokenizer parsed once per test process, while its files and its settings stay as they
    were: parsing the real 49,408-token vocabulary takes about 0.4 s on 2 cores, and a full run loads the tiny
    pipelines' tokenizers about 500 times, 460 of them from a folder it has read before. Only `CLIPTokenizer`,
    which gors never changes; one whose settings a caller changed is loaded anew, so that no test sees another's
    change."""
    from transformers import CLIPTokenizer
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    original = vars(PreTrainedTokenizerBase)["from_pretrained"]  # the classmethod itself, to put back
    loaded = {}

    def settings(tokenizer) -> tuple:
        return (tokenizer.padding_side, tokenizer.truncation_side, tokenizer.model_max_length, len(tokenizer),
                tuple(sorted(tokenizer.special_tokens_map.items())))

    def from_pretrained(cls, path, *args, **kwargs):
        folder = os.path.join(str(path), kwargs.get("subfolder") or "")
        if cls is not CLIPTokenizer or args or not os.path.isdir(folder):
            return original.__func__(cls, path, *args, **kwargs)
        files = tuple(sorted((entry.name, entry.stat().st_size, entry.stat().st_mtime_ns)
                             for entry in os.scandir(folder) if entry.is_file()))
        key = (os.path.realpath(folder), files, repr(sorted(kwargs.items())))
        if key in loaded and settings(loaded[key][0]) == loaded[key][1]:
            return loaded[key][0]
        tokenizer = original.__func__(cls, path, *args, **kwargs)
        loaded[key] = (tokenizer, settings(tokenizer))
        return tokenizer

    PreTrainedTokenizerBase.from_pretrained = classmethod(from_pretrained)
    yield
    PreTrainedTokenizerBase.from_pretrained = original


@pytest.fixture(autouse=True)
def seeded():
    """Each test's random inputs from a fixed seed (torch's global generator, which tests draw from
    without one of their own): a failure reproduces whichever tests ran before it on its worker."""
    import torch

    torch.manual_seed(0)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache of this test's own, offline (as every test is): `hub_cache(*repo_ids)` puts
    models in it as `hf download` leaves them (a main ref and its snapshot folder, empty: enough for
    the offline check before generating, not to load them) and returns the cache folder."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def put(*repo_ids: str) -> Path:
        commit = "c" * 40
        for repo_id in repo_ids:
            folder = cache / ("models--" + repo_id.replace("/", "--"))
            (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
            (folder / "refs").mkdir(exist_ok=True)
            (folder / "refs" / "main").write_text(commit)
        return cache

    return put


@pytest.fixture(scope="session")
def tiny_sd(tmp_path_factory) -> Path:
    """Folder of a tiny random StableDiffusionPipeline (32 x 32 images, real CLIP tokenizer)."""
    from gors.testing.sd import build_tiny_sd_pipeline

    path = tmp_path_factory.mktemp("tiny_sd")
    build_tiny_sd_pipeline(path, seed=0, resolution=32)
    return path


@pytest.fixture(scope="session")
def tiny_sd_lora(tiny_sd, tmp_path_factory) -> Path:
    """The file of a U-Net LoRA of `tiny_sd` with non-zero up-projections (a trained one's shape), as `save_lora`
    writes it: it changes the images."""
    import torch
    from diffusers import UNet2DConditionModel

    from gors.lora import UNET_TARGET_MODULES, add_lora, save_lora

    unet = UNet2DConditionModel.from_pretrained(tiny_sd, subfolder="unet")
    add_lora(unet, UNET_TARGET_MODULES, rank=4)
    # Both projections from a seeded generator: `add_lora` initialises lora_A from the global RNG, whose state
    # depends on the tests that ran before in the process.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in unet.named_parameters():
            if "lora_A" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5)
            elif "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return save_lora(tmp_path_factory.mktemp("tiny_sd_lora"), {"unet": unet})


@pytest.fixture(scope="session")
def tiny_sdxl(tmp_path_factory) -> Path:
    """Folder of a tiny random StableDiffusionXLPipeline (CLIP-L and bigG, size conditions)."""
    from gors.testing.sdxl import build_tiny_sdxl_pipeline

    return build_tiny_sdxl_pipeline(tmp_path_factory.mktemp("tiny_sdxl"), seed=0)


@pytest.fixture(scope="session")
def tiny_sd3(tmp_path_factory) -> Path:
    """Folder of a tiny random StableDiffusion3Pipeline (CLIP-L, bigG and a tiny T5)."""
    from gors.testing.sd3 import build_tiny_sd3_pipeline

    return build_tiny_sd3_pipeline(tmp_path_factory.mktemp("tiny_sd3"), seed=0)


@pytest.fixture(scope="session")
def tiny_flux(tmp_path_factory) -> Path:
    """Folder of a tiny random FluxPipeline, FLUX.1-dev style (guidance embedding, dynamic shift)."""
    from gors.testing.flux import build_tiny_flux_pipeline

    return build_tiny_flux_pipeline(tmp_path_factory.mktemp("tiny_flux"), seed=0)


@pytest.fixture(scope="session")
def tiny_pixart(tmp_path_factory) -> Path:
    """Folder of a tiny random PixArtSigmaPipeline: a family gors evaluates but does not train."""
    from gors.testing.pixart import build_tiny_pixart_pipeline

    return build_tiny_pixart_pipeline(tmp_path_factory.mktemp("tiny_pixart"), seed=0)


@pytest.fixture(scope="session")
def tiny_blip(tmp_path_factory) -> Path:
    """Folder of a tiny random BlipForQuestionAnswering with its processor."""
    from gors.testing.blip import build_tiny_blip_vqa

    path = tmp_path_factory.mktemp("tiny_blip")
    build_tiny_blip_vqa(path, seed=0)
    return path


@pytest.fixture(scope="session")
def selected_run(tmp_path_factory, tiny_sd, tiny_blip):
    """The RunConfig of a run folder after generate, score and select on the tiny SD pipeline (3 prompts x 2
    images, 32 px), shared by the training tests: read-only, copy it to train."""
    from gors.config import RunConfig
    from gors.core.distributed import reset_process_state
    from gors.generate import generate
    from gors.score import score
    from gors.select import select

    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a red circle and a blue square\na green triangle\na yellow circle\n")
    config = RunConfig(
        output_dir=str(tmp_path_factory.mktemp("selected")), pretrained_model_name_or_path=str(tiny_sd),
        train_prompts=str(prompts), images_per_prompt=2, num_inference_steps=2, resolution=32, reward="b_vqa",
        reward_model_name_or_path=str(tiny_blip), reward_threshold=0.0, seed=0,
    )
    generate(config)
    score(config)
    select(config)
    reset_process_state()
    return config


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    """Three prompts with CRLF endings and a blank line, as users' files often have."""
    return _write_prompts(tmp_path / "prompts.txt")


@pytest.fixture(scope="module")
def module_prompts_file(tmp_path_factory) -> Path:
    """`prompts_file` for module fixtures."""
    return _write_prompts(tmp_path_factory.mktemp("prompts") / "prompts.txt")


def _write_prompts(path: Path) -> Path:
    path.write_bytes(b"a red circle and a blue square\r\n\r\na green triangle\r\na yellow circle\r\n")
    return path


@pytest.fixture
def killed_while_deleting(monkeypatch):
    """`shutil.rmtree` raising Ctrl-C where it would delete (its clean-ups with `ignore_errors` still run): a
    kill in the middle of deleting a folder. `monkeypatch.undo()` ends it."""
    real_rmtree = shutil.rmtree

    def killed(path, ignore_errors=False):
        if not ignore_errors:
            raise KeyboardInterrupt
        real_rmtree(path, ignore_errors=True)

    monkeypatch.setattr(shutil, "rmtree", killed)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each test builds its own Accelerator; the state singletons must not leak between tests."""
    yield
    reset_process_state()


def _run_config_maker(folder: Path, tiny_sd: Path, tiny_blip: Path, prompts: Path):
    """The builder of `make_run_config`: a complete but tiny GORS run (2 images per prompt, 32 px, 2 steps), whose
    benchmark validation, if any, samples at that size too (the toy protocol's 20 steps at 64 px are 40 times the work)."""
    from gors.config import RunConfig

    def make(**overrides) -> RunConfig:
        values = dict(
            output_dir=str(folder / "run"),
            pretrained_model_name_or_path=str(tiny_sd),
            train_prompts=str(prompts),
            images_per_prompt=2,
            num_inference_steps=2,
            resolution=32,
            generation_batch_size=2,
            reward="b_vqa",
            reward_model_name_or_path=str(tiny_blip),
            reward_batch_size=2,
            reward_threshold=0.0,
            max_train_steps=2,
            checkpointing_steps=1,
            train_batch_size=2,
            seed=0,
        )
        if overrides.get("validation_benchmark"):
            values.update(validation_num_inference_steps=2, validation_resolution=32)
        values.update(overrides)
        return RunConfig(**values)

    return make


@pytest.fixture
def make_run_config(tmp_path, tiny_sd, tiny_blip, prompts_file):
    """Build the RunConfig of a complete but tiny GORS run (2 images per prompt, 32 px, 2 steps)."""
    return _run_config_maker(tmp_path, tiny_sd, tiny_blip, prompts_file)


@pytest.fixture(scope="module")
def make_module_run_config(tmp_path_factory, tiny_sd, tiny_blip):
    """`make_run_config` for module fixtures: runs shared by a module's tests, in a folder of the module's."""
    folder = tmp_path_factory.mktemp("module_run")
    return _run_config_maker(folder, tiny_sd, tiny_blip, _write_prompts(folder / "prompts.txt"))
