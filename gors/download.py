"""`gors download COMMAND [flags]`: fetch, on a machine with internet, everything `gors COMMAND` with
the same flags would load, so that it then runs offline (`HF_HUB_OFFLINE=1`, e.g. on compute nodes
without internet that share the login node's caches).

What a command needs is read from its config, not from a list kept here:

- the diffusion model (`--pretrained_model_name_or_path`, `--revision`): the files its pipeline
  loads (diffusers' `DiffusionPipeline.download`, without the components gors leaves out, such as
  Stable Diffusion's safety checker);
- every model of the reward and of the benchmarks' scorers (`Reward.models`; the validation
  benchmark's for `run` and `train`), whole but for the weight formats their loaders do not read;
- the files gors itself fetches, pinned (`gors.core.data`): T2I-CompBench prompt files, benchmark
  data, rewards' data (`Reward.download_files`) and `--lora official:<category>` with its conversion or `--lora hub:<org>/<name>`.

Hub models go to the Hugging Face cache (`HF_HOME`/`HF_HUB_CACHE`), gors' files to `GORS_CACHE_DIR`.
Run on one process; a model already cached is checked against the Hub and completed, not fetched again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gors.core.hub import (
    ModelLoadError,
    check_model_path,
    load_hint,
    looks_like_local_path,
    offline_setting,
    one_line,
    raise_if_gated,
)

# The commands whose needs `gors download` knows.
DOWNLOADABLE = ("run", "generate", "score", "train", "evaluate")

# Weight formats no gors loader reads (transformers, diffusers and open_clip read safetensors, else
# PyTorch pickles), left out of a Hub model's download.
OTHER_FORMATS = ("*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.ot", "*.tflite", "*.gguf", "*.mlmodel",
                 "onnx/*", "openvino/*", "coreml/*", "flax_model*", "tf_model*")
# PyTorch pickles, left out where a safetensors twin is there (which every loader prefers).
PICKLES = (".bin", ".pt", ".pth", ".ckpt")


@dataclass(frozen=True)
class ModelNeed:
    """A Hub model a command loads: the option that names it, its id, and how it is loaded."""

    option: str
    name: str
    pipeline: bool = False  # a diffusers pipeline (only the files it loads), else a whole repository
    revision: str | None = None


def _reward_needs(reward: str, model_name_or_path: str | None, options: dict[str, Any] | None,
                  what: str) -> list[ModelNeed]:
    from rewards.combined import reward_models

    return [ModelNeed(f"{what} {option}", name) for option, name in
            reward_models(reward, model_name_or_path, options).items()]


def _scorer_needs(specs: list[tuple[str | None, str, dict[str, Any]]], label: str) -> list[ModelNeed]:
    return [need for column, reward, options in specs
            for need in _reward_needs(reward, None, options, f"{label} {column or 'scorer'} {reward!r}")]


def plan(command: str, config: Any) -> tuple[list[ModelNeed], list[tuple[str, Any]]]:
    """What `gors <command>` with `config` loads: its Hub models, and (description, fetch function) of
    the files gors fetches itself. Checks the config as the command would before its first download."""
    if command not in DOWNLOADABLE:
        raise ValueError(f"gors download {command}: it downloads for one of {', '.join(DOWNLOADABLE)}")
    models: list[ModelNeed] = []
    files: list[tuple[str, Any]] = []
    if command == "evaluate":
        from gors.evaluate import evaluated_model, plan_benchmarks
        from gors.lora_sources import resolve_lora

        config = replace(config, pretrained_model_name_or_path=evaluated_model(config))
        for benchmark in plan_benchmarks(config):  # which fetches the scorers' data files
            files.append((f"{benchmark.label} prompts", benchmark.benchmark.prompts))
            models += _scorer_needs(benchmark.scorer_specs(), benchmark.label)
        if config.images is None:
            models.insert(0, ModelNeed("--pretrained_model_name_or_path", config.pretrained_model_name_or_path, True))
        if config.lora is not None:
            files.append((f"--lora {config.lora}", lambda: resolve_lora(config.lora)))
        return models, files
    if command in ("run", "generate", "train"):
        models.append(ModelNeed("--pretrained_model_name_or_path", config.pretrained_model_name_or_path, True,
                                config.revision))
    category = None
    if command in ("run", "generate"):
        from gors.core.prompts import load_prompts

        category = load_prompts(config.train_prompts).category  # a T2I-CompBench name: fetched now
    if command == "score":
        category = _scored_category(config)
    if command in ("run", "score"):
        from rewards.combined import check_reward_options

        reward = config.reward_name(category)
        check_reward_options(reward, config.reward_options, model_name_or_path=config.reward_model_name_or_path)
        model, options = config.reward_model_name_or_path, config.reward_options
        models += _reward_needs(reward, model, options, f"--reward {reward}")
        files.append((f"--reward {reward} data", _files_of(reward, model, options)))
    if command in ("run", "train") and config.validation_benchmark:
        from gors.validation import validation_target

        target = validation_target(config)
        specs = target.benchmark.scorer_specs(config.validation_scorer_options, with_columns=False)
        files.append((f"{target.label} prompts", target.benchmark.prompts))
        models += _scorer_needs(specs, target.label)
        files += [(f"{target.label} {reward!r} data", _files_of(reward, None, options))
                  for _, reward, options in specs]
    return models, files


def _scored_category(config: Any) -> str | None:
    """The category `gors score` takes its default reward from: the one its run folder's samples
    recorded. A folder without samples yet must be told the reward (or category) it will be scored with."""
    from gors.core.prompts import recorded_category
    from gors.core.run_folder import samples_dir
    from gors.core.store import SampleStore

    store = SampleStore(samples_dir(config.output_dir))
    if (store.root / "prompts.json").is_file():
        return recorded_category(store.load_prompts())
    if config.reward is None and config.category is None:
        raise ValueError(f"gors download score: {config.output_dir} holds no samples yet, so the reward `gors score` "
                         "takes from their category is unknown; give --reward or --category")
    return None


def _files_of(reward: str, model_name_or_path: str | None, options: dict[str, Any] | None):
    """The fetch function of the files reward `reward` reads besides its models."""
    from rewards.combined import download_reward_files

    return lambda: download_reward_files(reward, model_name_or_path, options)


def download_model(need: ModelNeed) -> str:
    """Fetch `need` into the Hugging Face cache; its local folder. A gated or unreachable repository
    is a `ModelLoadError` saying what to do."""
    try:
        if need.pipeline:
            import diffusers

            from gors.core.backbones import detect_backbone

            backbone = detect_backbone(need.name, need.revision)
            pipeline_class = getattr(diffusers, backbone.pipeline_class)
            return str(pipeline_class.download(need.name, revision=need.revision, **backbone.pipeline_kwargs))
        from huggingface_hub import HfApi, snapshot_download

        files = HfApi().list_repo_files(need.name, revision=need.revision)
        ignore = list(OTHER_FORMATS) + pickles_with_safetensors(files)
        return snapshot_download(need.name, revision=need.revision, ignore_patterns=ignore)
    except ModelLoadError:
        raise
    except Exception as err:  # the Hub's and the loaders' errors, which only the chain tells apart
        raise_if_gated(err, need.name, need.option)
        raise ModelLoadError(f"{need.option}={need.name!r} could not be downloaded ({type(err).__name__}: "
                             f"{one_line(err)}). {load_hint(need.name, err)}") from err


def pickles_with_safetensors(files: list[str]) -> list[str]:
    """The PyTorch pickles among a repository's `files` that have a safetensors twin, which every loader
    reads instead: the same name (`diffusion_pytorch_model.bin`), or with `pytorch_model` read as `model`
    (transformers' `pytorch_model-00001-of-00002.bin`, open_clip's `open_clip_pytorch_model.bin`). A
    pickle without one is a repository's only copy of those weights and is kept."""
    present = set(files)
    twins = []
    for name in files:
        stem, dot, suffix = name.rpartition(".")
        if dot and f".{suffix}" in PICKLES and (
                f"{stem}.safetensors" in present or f"{stem.replace('pytorch_model', 'model')}.safetensors" in present):
            twins.append(name)
    return twins


def download(command: str, config: Any) -> list[str]:
    """`gors download COMMAND`: fetch what `gors COMMAND` with `config` loads (see the module docstring);
    returns the Hub models fetched, in order. Local folders are used as they are."""
    offline = offline_setting()
    if offline is not None:
        raise ValueError(f"gors download fetches from the Hub, but {offline} is set: unset it on a machine with "
                         "internet")
    models, files = plan(command, config)
    for need in models:  # a local folder is used as it is: it must be there, or the command fails later
        if looks_like_local_path(need.name):
            check_model_path(need.name, need.option, example=None)
    unique = list({(need.name, need.revision): need for need in models
                   if not looks_like_local_path(need.name)}.values())
    for need in unique:
        print(f"[download] {need.option}: {need.name}" + (f" @ {need.revision}" if need.revision else ""), flush=True)
        print(f"[download]   -> {download_model(need)}", flush=True)
    for description, fetch in files:
        print(f"[download] {description}", flush=True)
        fetch()
    print(f"[download] done: {len(unique)} model(s) and {len(files)} file set(s); `gors {command}` with these "
          "flags now runs with HF_HUB_OFFLINE=1 on machines that share these caches", flush=True)
    return [need.name for need in unique]
