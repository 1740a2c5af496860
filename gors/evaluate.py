"""`gors evaluate`: run benchmarks on a checkpoint (optionally with a LoRA) or on an image folder.

Each benchmark (and T2I-CompBench category) gets its own folder under `--output_dir` with
`samples/`, `scores/`, `results.jsonl` (per image: score, pass/fail, reason, details) and
`summary.json`; `summary.json` at the top collects them. Everything is resumable and runs on
any number of processes under `accelerate launch`. `--columns` chooses the further metric columns:
each benchmark's default ones, none, all, or the defaults plus optional (slow) ones by name, such as
T2I-CompBench's MLLM-CoT.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tabulate import tabulate

from evaluators import benchmark_label, build_benchmark_with_options, parse_benchmarks
from evaluators.base import SUMMARY_FILE, Benchmark, ScorerKey
from evaluators.results import UNIT_SCALE, metric_value
from gors.config import EvaluateConfig, sampling_overrides
from gors.core.backbones import (
    check_lora_fits,
    check_lora_loader,
    check_resolution,
    detect_backbone,
    family_precision,
)
from gors.core.distributed import make_accelerator, process_state
from gors.core.fingerprints import is_local_fingerprint
from gors.core.hub import cached_snapshot, looks_like_local_path, model_version
from gors.core.io import atomic_write_json, not_a_folder, read_json
from gors.core.lock import holding
from gors.core.lora_shapes import check_lora_fits_before_loading
from gors.core.pipeline import check_lora_path
from gors.core.run_folder import round_dir, samples_dir
from gors.core.store import (
    MODELS,
    SETTINGS,
    SampleStore,
    describe_version_change,
    recorded_model_commits,
    recorded_name,
    recorded_version,
    same_value,
)
from gors.core.toy import PRETRAINED_DIR
from gors.lora_sources import REMOTE_LORA_PREFIXES, resolve_lora
from gors.sd2_architecture import SD2_BASE
from rewards import Reward
from rewards.combined import download_reward_files


def _format(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def summary_table(summaries: list[dict[str, Any]]) -> str:
    """A markdown table: one row per benchmark (category), its primary metric with the scale of that
    value (from the summary's results block, e.g. "[0, 1]" or GenEval 2's "x100"), and the further
    columns, which are always mean rewards in [0, 1] (said in their header)."""
    rows = []
    for summary in summaries:
        metric = summary["primary_metric"]
        scale = summary["results"]["metrics"][metric]["scale"]
        columns = ", ".join(f"{k} {_format(v)}" for k, v in (summary.get("columns") or {}).items()) or "-"
        rows.append([summary["label"], metric, _format(metric_value(summary, metric)), scale, columns])
    # Values are formatted here (4 decimals) so that tabulate does not reformat them.
    return tabulate(rows, headers=["benchmark", "metric", "value", "scale", f"further columns, in {UNIT_SCALE}"],
                    tablefmt="github", disable_numparse=True)


def drop_unneeded(scorers: dict[ScorerKey, Reward], needed: set[ScorerKey]) -> None:
    """Free the cached scorers whose keys are not in `needed` (no later benchmark uses them)."""
    unneeded = [key for key in scorers if key not in needed]
    for key in unneeded:
        del scorers[key]
    if unneeded:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def extra_columns(config: EvaluateConfig, benchmarks: list[Benchmark]) -> list[list[str]]:
    """The optional columns each benchmark computes under `config.columns` (a name applies to the
    benchmarks that have it); a name no benchmark evaluated has is refused, naming those there are."""
    if config.columns == "all":
        return [list(benchmark.optional_columns()) for benchmark in benchmarks]
    available = {column for benchmark in benchmarks for column in benchmark.optional_columns()}
    unknown = [name for name in config.extra_columns if name not in available]
    default = sorted({name for name in unknown for benchmark in benchmarks if name in benchmark.columns()})
    if default:  # --columns names optional columns only; the default ones are always computed
        raise ValueError(f"--columns={config.columns!r}: {', '.join(default)} is computed by default (without "
                         f"--columns none); --columns adds optional columns: {', '.join(sorted(available)) or 'none'}")
    if unknown:
        raise ValueError(f"--columns={config.columns!r}: no benchmark evaluated has the optional column(s) {unknown}; "
                         f"they have {sorted(available) or 'none'}")
    return [[name for name in config.extra_columns if name in benchmark.optional_columns()]
            for benchmark in benchmarks]


@dataclass(frozen=True)
class BenchmarkPlan:
    """One benchmark (a T2I-CompBench category) of a `gors evaluate`: its folder and its scorers' options."""

    label: str
    folder: Path
    benchmark: Benchmark
    options: dict[str, Any]
    column_options: dict[str, dict[str, Any]] | None
    extra: list[str]
    with_columns: bool

    def scorer_specs(self) -> list[tuple[str | None, str, dict[str, Any]]]:
        """(column or None, reward, merged options) of every scorer it builds (`Benchmark.scorer_specs`)."""
        return self.benchmark.scorer_specs(self.options, self.column_options, self.extra, self.with_columns)


EVALUATE_LOCKS = ("evaluate",)  # what `evaluate` holds of its --output_dir


def evaluated_model(config: EvaluateConfig) -> str | None:
    """The model `gors evaluate` generates with: `--pretrained_model_name_or_path`, else the base model a run
    folder's `--lora` was trained on (`trained_base_model`, which says so), else the paper's SD-2-base, or the
    toy pipeline that ships with gors where the toy benchmark alone is evaluated (its world is drawn by that
    pipeline only). None for `--images` without a model: the images are scored as they are."""
    if config.images is not None or config.pretrained_model_name_or_path is not None:
        return config.pretrained_model_name_or_path
    trained = trained_base_model(config.lora) if config.lora is not None else None
    toy_only = all(name == "toy" for name, _ in parse_benchmarks(config.benchmarks))
    return trained or (str(PRETRAINED_DIR / "pipeline") if toy_only else SD2_BASE)


def plan_benchmarks(config: EvaluateConfig) -> list[BenchmarkPlan]:
    """The benchmarks `gors evaluate` runs under `config`, each with its scorers' options checked (offline,
    their models in the local cache) and their data files fetched: every mistake that can be found
    before a model loads or an image is generated."""
    specs = parse_benchmarks(config.benchmarks)
    if config.images is not None and len(specs) != 1:
        raise ValueError(
            f"--images scores one benchmark's folder, but --benchmarks={config.benchmarks!r} names {len(specs)} "
            f"({', '.join(benchmark_label(*s) for s in specs)}); name exactly one, e.g. t2i_compbench:color."
        )
    if config.images is not None and not Path(config.images).is_dir():  # before any benchmark data downloads
        raise FileNotFoundError(f"--images {config.images}: {not_a_folder(config.images)}; pass the folder of the "
                                "benchmark's images")
    if config.images is not None and sampling_overrides(config):
        # Images made elsewhere are scored as they are: the values would be recorded as if they made them.
        given = ", ".join(f"--{flag}" for flag in sampling_overrides(config))
        raise ValueError(f"{given} with --images: existing images are scored as they are; drop {given}, or drop "
                         "--images to generate with them")
    if config.images is not None and config.lora is not None:
        # The images are scored as they are: a LoRA would be ignored, yet recorded in summary.json.
        raise ValueError(f"--lora={config.lora!r} with --images: existing images are scored as they are; drop "
                         "--lora, or drop --images to generate with the LoRA")
    if config.lora is not None and not config.lora.startswith(REMOTE_LORA_PREFIXES):
        check_lora_path(config.lora)  # `gors download evaluate` too: a local LoRA is nothing to download
    benchmarks = [(spec, build_benchmark_with_options(
        *spec, config.benchmark_options, "--benchmark_options", max_prompts=config.max_prompts,
        images_per_prompt=config.images_per_prompt, batch_size=config.generation_batch_size,
        **sampling_overrides(config))) for spec in specs]
    # The subset as built (a default one included), so that e.g. toy and toy:train get two folders.
    subsets = [getattr(benchmark, benchmark.subset_field) if benchmark.subset_field else None
               for _, benchmark in benchmarks]
    labels = [benchmark_label(name, subset) for ((name, _), _), subset in zip(benchmarks, subsets)]
    for flag, options in (("--scorer_options", config.scorer_options), ("--benchmark_options", config.benchmark_options)):
        unknown = sorted(set(options) - {name for name, _ in specs} - set(labels))
        if unknown:
            raise ValueError(f"{flag} for {unknown}, which are not among the benchmarks evaluated ({', '.join(labels)}): "
                             "key them by those names (a module:Class benchmark by the name it registers)")
    if config.images is not None:
        benchmarks[0][1].check_images_readable()
    plans = []
    for ((name, _), benchmark), subset, label, extra in zip(benchmarks, subsets, labels,
                                                            extra_columns(config, [b for _, b in benchmarks])):
        options = {**config.scorer_options.get(name, {}), **config.scorer_options.get(label, {})}
        column_options = options.pop("columns", None)
        benchmark.check_scorer_options(label, options, column_options, extra, with_columns=config.columns != "none")
        for _, reward, merged in benchmark.scorer_specs(options, column_options, extra, config.columns != "none"):
            download_reward_files(reward, None, merged)  # fetched now, not once the images are generated
        plans.append(BenchmarkPlan(label, Path(config.output_dir) / name / (subset or ""), benchmark, options,
                                   column_options, extra, config.columns != "none"))
    return plans


def earlier_summaries(path: Path, summaries: list[dict[str, Any]], header: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmarks an earlier `gors evaluate` into the same folder recorded in `path` that this run did not
    evaluate, where they are of the same model and LoRA (`header`: this run's top-level fields) and their
    folders still hold their results: a run of some of the benchmarks keeps the others in the folder's summary.

    Each entry is rebuilt from its benchmark folder's own `summary.json` (the latest results there), found
    from `path`'s folder and its label, not the folder it recorded (relative to where that run started).
    Image folders (`--images`) are never merged, neither earlier ones nor this run's (which records a model
    given beside them): their images may be any model's. Nor are the results of another version of the
    model or LoRA at the same name (`generator_versions`: a LoRA retrained at its path, a local model
    overwritten, a Hub model updated); a LoRA file at another path with the same weights is the same LoRA
    (`same_lora`).
    """
    model, lora = summaries[0].get("model") if summaries else None, summaries[0].get("lora") if summaries else None
    if not path.is_file() or model is None or summaries[0].get("images") is not None:
        return []
    previous = read_json(path, "the summary `gors evaluate` writes (delete it: the next evaluation writes it again)")
    if not isinstance(previous, dict) or not same_value({k: v for k, v in previous.items() if k != "summaries"},
                                                        header):
        return []
    labels = {summary["label"] for summary in summaries}
    versions = generator_versions(Path(summaries[0]["folder"]))
    kept = []
    for entry in previous.get("summaries", []):
        label = entry.get("label") if isinstance(entry, dict) else None
        if not isinstance(label, str) or label in labels:
            continue
        name, _, subset = label.partition(":")
        folder = path.parent / name / subset
        current = read_json(folder / SUMMARY_FILE, "a benchmark's summary") if (folder / SUMMARY_FILE).is_file() \
            else None
        # An image folder's summary of an earlier gors recorded the default model too: `images` tells it apart.
        if isinstance(current, dict) and current.get("images") is None and same_value(current.get("model"), model) \
                and same_lora(current.get("lora"), lora, generator_versions(folder), versions):
            kept.append({"label": label, "primary_metric": entry.get("primary_metric"), "folder": str(folder),
                         **current})
    return kept


def generator_versions(folder: Path) -> dict[str, str | None]:
    """What generated a benchmark folder's images, beyond the names its summary records: the sha256 of the
    LoRA's weights and the version of the model (Hub commit, local fingerprint), from its sample store."""
    store = SampleStore(folder / "samples")
    settings = store.load_settings() or {}
    versions = recorded_model_commits(store.root)
    model = versions.get(recorded_name(versions, settings.get("model")))
    return {"lora_sha256": settings.get("lora_sha256"), "model": model}


def same_versions(earlier: dict[str, str | None], now: dict[str, str | None]) -> bool:
    """Whether two `generator_versions` can be of one generator: equal wherever both are known."""
    return all(earlier[key] is None or now[key] is None or earlier[key] == now[key] for key in now)


def same_lora(earlier: str | None, now: str | None, earlier_versions: dict[str, str | None],
              now_versions: dict[str, str | None]) -> bool:
    """Whether two benchmark folders' images are of one generator, as far as their LoRA (the paths their summaries
    record) and `generator_versions` tell: one path, or two holding the same weights (a Hub LoRA's file at
    another commit of its repository after a push that left the weights as they were)."""
    if not same_versions(earlier_versions, now_versions):
        return False
    return same_value(earlier, now) or earlier_versions["lora_sha256"] is not None \
        and earlier_versions["lora_sha256"] == now_versions["lora_sha256"]


def trained_base_model(lora: str) -> str | None:
    """The base model that the LoRA of a gors run folder (or of its `best/` or a checkpoint in it) was
    trained on, as its samples recorded it; None for a LoRA of another origin. A local model that is no
    longer at the recorded path is refused, naming the flag that gives it."""
    folder = Path(lora).expanduser()
    if lora.startswith(REMOTE_LORA_PREFIXES) or not folder.exists():  # a release, a Hub LoRA: no run
        return None
    folder = folder if folder.is_dir() else folder.parent  # a LoRA file: its folder
    # A --rounds run's LoRA is in its folder, its samples in its rounds' (each of the same base model).
    stores = [samples_dir(f) for candidate in (folder, folder.parent, folder.parent.parent)
              for f in (candidate, round_dir(candidate, 0))]
    store = next((s for s in stores if (s / SETTINGS).is_file()), None)
    if store is None:
        return None
    settings = SampleStore(store).load_settings() or {}
    model = settings.get("model")
    if not isinstance(model, str):
        return None
    # A local model by its path as typed then: elsewhere, or from another working directory, it is not there.
    commits = recorded_model_commits(store)
    local = looks_like_local_path(model) or is_local_fingerprint(recorded_version(commits, model))
    if local and not Path(model).expanduser().exists():
        raise FileNotFoundError(f"--lora={lora!r} was trained on local model {model!r} ({store / SETTINGS}), which is "
                                "not there from here: pass its base model with --pretrained_model_name_or_path")
    # The name alone may load other weights here: a folder overwritten in place, another one at a relative path
    # from this directory, another snapshot in this machine's cache, or not the --revision the samples used
    # (gors evaluate loads a Hub model's default revision). A model the cache does not hold yet is compared
    # with nothing here; its evaluation records the commit it loaded (results' `models`).
    recorded, now = recorded_version(commits, model), model_version(model)
    revision = settings.get("revision")
    if recorded is not None and now is not None and recorded != now:
        snapshot = None if is_local_fingerprint(recorded) else cached_snapshot(model, recorded)
        fix = ("a folder holding that version" if is_local_fingerprint(recorded) else
               f"its snapshot in this machine's cache, {snapshot}" if snapshot else
               f"a local copy of commit {recorded} (`hf download {model} --revision {recorded} --local-dir DIR`)")
        cause = (f"its samples used --revision {revision} ({recorded}), and gors evaluate loads the default one "
                 f"({now})" if revision else describe_version_change(model, recorded, now))
        raise ValueError(f"--lora={lora!r} was trained on {model!r} as {store / MODELS} records it, and here "
                         f"{cause}: evaluating the LoRA on another base model would measure something else. Pass "
                         f"--pretrained_model_name_or_path with {fix}")
    if process_state().is_main_process:
        unchecked = f" (its samples used --revision {revision}; this loads the default one)" \
            if revision and (recorded is None or now is None) else ""
        print(f"note: --pretrained_model_name_or_path {model}, the base model --lora {lora} was trained on{unchecked}")
    return model


def sample_counts(summary: dict[str, Any]) -> str:
    """"P prompts x K images" of a benchmark's summary, so that kept results of another size are seen as such."""
    samples = (summary.get("results") or {}).get("samples") or {}
    if not {"prompts", "images_per_prompt"} <= samples.keys():
        return "sample counts not recorded"
    images = samples["images_per_prompt"]
    return f"{samples['prompts']} prompts x {images} image{'' if images == 1 else 's'}"


def evaluate(config: EvaluateConfig, accelerator: Accelerator | None = None) -> list[dict[str, Any]]:
    """Run every benchmark of `config.benchmarks`; returns their summaries (also in summary.json). The
    benchmarks, options and LoRA are checked before `--output_dir` is locked (`EVALUATE_LOCKS`), so that a
    mistake leaves no folder behind."""
    config = replace(config, pretrained_model_name_or_path=evaluated_model(config))
    plans = plan_benchmarks(config)
    lora = resolve_lora(config.lora)  # official:<category> or hub:<org>/<name> -> a local LoRA, downloaded once
    if lora is not None:
        check_lora_path(lora)  # before any store records settings or any weights load
        if config.images is None:
            check_lora_loader(detect_backbone(config.pretrained_model_name_or_path), lora, shown=config.lora)
            check_lora_fits(config.pretrained_model_name_or_path, lora, shown=config.lora)
            check_lora_fits_before_loading(config.pretrained_model_name_or_path, lora)
    overrides = sampling_overrides(config)
    if config.images is None and config.resolution is not None:  # the family's VAE factor x patch size
        check_resolution(detect_backbone(config.pretrained_model_name_or_path), config.resolution)
    if overrides and config.images is None and process_state().is_main_process:
        given = ", ".join(f"--{flag} {value}" for flag, value in overrides.items())
        print(f"note: {given} in place of the benchmarks' protocols: the results record it, and they do not compare "
              "with numbers published under the protocols")
    if accelerator is None:
        precision = config.mixed_precision
        if config.images is None:  # SD3/3.5 and FLUX.1 generate in bf16 under an fp16 accelerate config
            precision = family_precision(detect_backbone(config.pretrained_model_name_or_path), precision)
        accelerator = make_accelerator(mixed_precision=precision)
    with holding(config.output_dir, EVALUATE_LOCKS, "gors evaluate"):
        return _evaluate_plans(config, plans, lora, accelerator)


def _evaluate_plans(config: EvaluateConfig, plans: list[BenchmarkPlan], lora: str | None,
                    accelerator: Accelerator) -> list[dict[str, Any]]:
    runs = [(plan, plan.benchmark.scorer_keys(accelerator, plan.options, config.scorer_batch_size, plan.column_options,
                                              plan.extra, with_columns=plan.with_columns)) for plan in plans]
    summaries: list[dict[str, Any]] = []
    scorers: dict = {}  # a reward model used by several benchmarks (e.g. B-VQA, CLIP) is loaded once
    dropout = {"lora_dropout": config.lora_dropout} if config.lora_dropout else {}
    path = Path(config.output_dir) / "summary.json"

    def write_summary() -> list[dict[str, Any]]:
        """The folder's summary.json with this run's benchmarks so far: written after each, so that it never
        holds older numbers of a benchmark whose folder a later failure or kill left newer ones in."""
        earlier = earlier_summaries(path, summaries, {"lora": config.lora, **dropout})
        atomic_write_json(path, {"lora": config.lora, **dropout, "summaries": earlier + summaries})
        return earlier

    earlier: list[dict[str, Any]] = []
    for index, (plan, _) in enumerate(runs):
        accelerator.print(f"[evaluate] {plan.label} -> {plan.folder}")
        summary = plan.benchmark.evaluate(
            config.pretrained_model_name_or_path, plan.folder, lora=lora, accelerator=accelerator,
            scorer_options=plan.options, images=config.images, scorer_batch_size=config.scorer_batch_size,
            column_options=plan.column_options, scorer_cache=scorers, torch_compile=config.torch_compile,
            with_columns=plan.with_columns, extra_columns=plan.extra, lora_dropout=config.lora_dropout,
        )
        summaries.append({"label": plan.label, "primary_metric": plan.benchmark.primary_metric,
                          "folder": str(plan.folder), **summary})
        if accelerator.is_main_process:
            earlier = write_summary()
        drop_unneeded(scorers, set().union(*(keys for _, keys in runs[index + 1 :])))
    if accelerator.is_main_process:
        if earlier:
            kept = ", ".join(f"{e['label']} ({sample_counts(e)})" for e in earlier)
            print(f"[evaluate] {path} keeps the earlier results of {kept} (same model and LoRA; not evaluated in "
                  "this run, and perhaps with another --max_prompts, --images_per_prompt or precision)")
        print(summary_table(summaries))
    accelerator.wait_for_everyone()
    return summaries
