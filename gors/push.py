"""`gors push`: a run's LoRA to the Hugging Face Hub, with a model card that says how it was made.

One commit of three files, put together in `<output_dir>/hub_upload/` first (`--dry_run` stops
there, for a look before anything leaves the machine):

- `pytorch_lora_weights.safetensors`: the run's final LoRA (`--lora final`) or the best one of its
  validation (`--lora best`), as gors wrote it: diffusers' `load_lora_weights(repo_id)` reads it, and
  `gors evaluate --lora hub:<repo_id>` evaluates it;
- `README.md`: the model card: the base model, how the samples were made, scored and selected, the
  training, and with `--evaluation` the main metric of each `gors evaluate` result of this LoRA and of
  its base model (with the paper's numbers beside them, as `gors report` shows them);
- `gors_run.json`: the same facts as the run folder records them, for programs.

Every fact comes from the run folder's own records (samples/settings.json, selection_summary.json,
the reward's scores/<reward>/settings.json, the checkpoint the LoRA was saved with); the card never
holds a number of another LoRA: an evaluation whose images were made with other weights is refused.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gors import __version__
from gors.core.backbones import LORA_WEIGHT_NAME, detect_backbone
from gors.core.hub import is_repo_id, looks_like_local_path, network_error, offline_setting, one_line
from gors.core.io import atomic_write_bytes, files_sha256, publish_folder, read_json, recover_folder
from gors.core.run_folder import (
    BEST_DIR,
    BEST_FILE,
    CHECKPOINT_MARKER,
    CHECKPOINTS_DIR,
    ROUNDS_FILE,
    SELECTION_SUMMARY_FILE,
    round_dir,
    samples_dir,
    scores_dir,
)
from gors.core.store import SETTINGS, recorded_model_commits, recorded_version, same_value

# gors.report, gors.evaluate and gors.validation import torch: they are imported where used, so that
# `gors push --help` answers at once.

UPLOAD_DIR = "hub_upload"
CARD_FILE = "README.md"
RECORD_FILE = "gors_run.json"
LORA_CHOICES = ("final", "best")
# The Hub's tags of each family gors trains, beside text-to-image, diffusers, lora and gors.
FAMILY_TAGS = {"sd": ["stable-diffusion", "stable-diffusion-diffusers"], "sdxl": ["stable-diffusion-xl"],
               "sd3": ["sd3", "sd3-diffusers"], "flux": ["flux", "flux-diffusers"]}
BASE_ROW, LORA_ROW = "base model", "this LoRA"


@dataclass
class PushConfig:
    """`gors push --output_dir RUN --repo_id ORG/NAME`: the run's LoRA and a model card to the Hugging Face Hub."""

    output_dir: str = field(metadata={"help": "The run folder (of `gors run`, a recipe or `gors train`; a --rounds "
                                              "folder too) whose LoRA is pushed."})
    repo_id: str = field(metadata={"help": "The Hub model repository, ORG/NAME (created if missing)."})
    lora: str = field(default="final", metadata={"help": "Which LoRA: `final` (the last step's) or `best` (the best "
                                                         "of --validation_benchmark, in best/).",
                                                 "choices": list(LORA_CHOICES)})
    evaluation: list[str] = field(default_factory=list, metadata={
        "help": "`gors evaluate` output folders of this LoRA and/or of its base model, whose main metrics the card "
                "tables."})
    base_model: str | None = field(default=None, metadata={
        "help": "The base model's Hub id for the card, where the run trained on a local folder (default: the "
                "model the run recorded)."})
    license: str | None = field(default=None, metadata={"help": "The card's license, usually the base model's "
                                                                "(SD 2: openrail++)."})
    private: bool = field(default=False, metadata={"help": "Create the repository private."})
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing; default "
                                                                 "main)."})
    commit_message: str | None = field(default=None, metadata={"help": "Default: 'gors: <which> LoRA of <run>'."})
    dry_run: bool = field(default=False, metadata={"help": f"Write the files into <output_dir>/{UPLOAD_DIR}/ and "
                                                           "stop, uploading nothing."})

    def __post_init__(self) -> None:
        self.output_dir = os.path.expanduser(self.output_dir)
        self.evaluation = [os.path.expanduser(folder) for folder in self.evaluation]
        if not is_repo_id(self.repo_id):
            raise ValueError(f"--repo_id={self.repo_id!r}: give a Hugging Face Hub model repository, ORG/NAME")
        if self.base_model is not None and looks_like_local_path(self.base_model):
            raise ValueError(f"--base_model={self.base_model!r}: give the base model's Hub id (ORG/NAME), which the "
                             "card links; a local folder means nothing on the Hub")


@dataclass
class RunFacts:
    """What a run folder records of how its LoRA was made; None where it records nothing."""

    lora: str  # final or best
    lora_sha256: str
    step: int | None
    generation: dict[str, Any]
    model_commit: str | None
    prompts: dict[str, Any] | None
    selection: dict[str, Any] | None
    reward: dict[str, Any] | None
    training: dict[str, Any] | None
    best: dict[str, Any] | None
    rounds: int | None


def _json(path: Path, what: str) -> Any:
    return read_json(path, what) if path.is_file() else None


def lora_file(run: Path, which: str) -> Path:
    """The file of the run's `which` LoRA (`LORA_CHOICES`), or an error that says why there is none."""
    path = (run / BEST_DIR if which == "best" else run) / LORA_WEIGHT_NAME
    if which == "best":
        recover_folder(run / BEST_DIR)  # a kill between publish_folder's renames
    if path.is_file():
        return path
    if which == "best":
        raise FileNotFoundError(f"{run} holds no best LoRA ({BEST_DIR}/{LORA_WEIGHT_NAME}): it is kept by "
                                "--validation_benchmark during training; push the final LoRA (--lora final)")
    raise FileNotFoundError(f"{run} holds no final LoRA ({LORA_WEIGHT_NAME}): its training has not finished. Run "
                            f"the same command again to finish it, or push the best LoRA so far (--lora best)")


def _checkpoints(run: Path) -> list[dict[str, Any]]:
    """The records (`checkpoint.json`) of the run's checkpoints, a --rounds run's of every round, newest first."""
    folders = [run, *sorted(run.glob("round-*"))]
    markers = [marker for folder in folders for marker in (folder / CHECKPOINTS_DIR).glob(f"*/{CHECKPOINT_MARKER}")]
    records = [_json(marker, "a checkpoint's record, which gors writes last") for marker in markers]
    found = [record for record in records if isinstance(record, dict) and isinstance(record.get("fingerprint"), dict)]
    return sorted(found, key=lambda record: record.get("step") or 0, reverse=True)


def _training(run: Path, sha256: str, best: dict[str, Any] | None) -> dict[str, Any] | None:
    """The checkpoint the LoRA was saved with: the one holding the same weights (the final LoRA is the last
    step's checkpoint's) or, for the best LoRA, the newest of the training its `best.json` names."""
    from gors.validation import training_identity

    for record in _checkpoints(run):
        weights = (record.get("files") or {}).get(LORA_WEIGHT_NAME) or {}
        if weights.get("sha256") == sha256:
            return record
        if best is not None and best.get("training") in (training_identity(record["fingerprint"]),
                                                         training_identity(record["fingerprint"], False)):
            return record
    return None


def run_facts(run: Path, which: str, lora: Path) -> RunFacts:
    """What `run` records of how its `which` LoRA (the file `lora`) was made."""
    rounds = _json(run / ROUNDS_FILE, "the record of the finished rounds")
    first = round_dir(run, 0) if rounds is not None else run  # every round samples from the one base model
    store = samples_dir(first)
    generation = _json(store / SETTINGS, "the generation settings of the samples") or {}
    if not generation:
        raise FileNotFoundError(f"{store / SETTINGS} is missing: {run} is no gors run folder (give the --output_dir "
                                "of `gors run`, a recipe or `gors train`)")
    versions = recorded_model_commits(store)
    last = round_dir(run, len(rounds["rounds"]) - 1) if rounds and rounds.get("rounds") else run
    selection = _json(last / SELECTION_SUMMARY_FILE, "the summary gors select writes")
    reward = None
    if isinstance(selection, dict) and isinstance(selection.get("reward"), str):
        reward = _json(scores_dir(last, selection["reward"]) / SETTINGS, "the settings of the reward's scores")
    best = _json(run / BEST_DIR / BEST_FILE, "the record of the best LoRA") if which == "best" else None
    sha256 = files_sha256([lora])
    training = _training(run, sha256, best)
    step = best.get("step") if best else training.get("step") if training else None
    return RunFacts(
        lora=which, lora_sha256=sha256, step=step, generation=generation,
        model_commit=recorded_version(versions, generation["model"]) if generation.get("model") else None,
        prompts=_json(store / "prompts.json", "the prompt set of the samples"),
        selection=selection, reward=reward, training=(training or {}).get("fingerprint"), best=best,
        rounds=len(rounds["rounds"]) if rounds else None,
    )


def _same_model(name: Any, version: str | None, run_name: Any, run_version: str | None) -> bool:
    """Whether an evaluation's model is the run's: one version (Hub commit, local folder's fingerprint) where
    both are recorded, else one name (`same_value`: a local folder however its path is spelled)."""
    if version is not None and run_version is not None:
        return version == run_version
    return same_value(name, run_name)


def evaluation_rows(folders: list[str], facts: RunFacts) -> tuple[dict[str, dict[str, float | None]], list[str]]:
    """The card's evaluation table (row -> column -> main metric) of `gors evaluate` folders, each of this
    LoRA or of the base model without a LoRA, and the notes on columns measured otherwise (`protocol_notes`).
    A folder of another model or other weights is refused: the card would give its numbers as this LoRA's."""
    from gors.evaluate import generator_versions
    from gors.report import evaluation_protocols, evaluation_values, protocol_notes, read_summaries

    rows: dict[str, dict[str, float | None]] = {}
    protocols: dict[str, dict[str, Any]] = {}
    model = facts.generation.get("model")
    for folder in map(Path, folders):
        summaries = read_summaries(folder)
        if summaries is None:
            raise FileNotFoundError(f"--evaluation {folder}: no summary.json; give the --output_dir of `gors evaluate`")
        for summary in summaries:
            label = summary.get("label") if isinstance(summary, dict) else None
            if summary.get("images") is not None:
                raise ValueError(f"--evaluation {folder}: {label} scored an image folder ({summary['images']}), whose "
                                 "images may be any model's: evaluate the LoRA itself (gors evaluate --lora ...)")
            name, _, subset = str(label).partition(":")
            versions = generator_versions(folder / name / subset)  # where `gors evaluate` puts a benchmark
            if not _same_model(summary.get("model"), versions["model"], model, facts.model_commit):
                raise ValueError(f"--evaluation {folder}: {label} is of the model {summary.get('model')} (version "
                                 f"{versions['model']}), the run's is {model} (version {facts.model_commit})")
            sha256 = versions["lora_sha256"]
            if summary.get("lora") is None:
                row = BASE_ROW
            elif sha256 == facts.lora_sha256:
                row = LORA_ROW
            else:
                raise ValueError(f"--evaluation {folder}: {label} is of other weights than the pushed LoRA "
                                 f"({summary['lora']}: sha256 {str(sha256)[:12]}..., the pushed one "
                                 f"{facts.lora_sha256[:12]}...); evaluate the pushed LoRA, or push the one evaluated")
            values = evaluation_values(folder / "summary.json", [summary])
            rows.setdefault(row, {}).update(values)
            protocols.setdefault(row, {}).update(evaluation_protocols([summary]))
    return rows, protocol_notes(protocols)


def family_tags(model: str | None, revision: str | None) -> list[str]:
    """The Hub tags of the base model's family (`FAMILY_TAGS`); none where its model_index.json cannot be
    read here (a push from another machine than the training's, offline): tags only help search."""
    if model is None or (looks_like_local_path(model) and not Path(model).expanduser().is_dir()):
        return []
    try:
        return FAMILY_TAGS.get(detect_backbone(model, revision).name, [])
    except (OSError, ValueError):
        return []


def _share(count: Any, total: Any) -> str:
    return f"{count} of {total}" + (f" ({100 * count / total:.0f} %)" if total else "")


def card_rows(facts: RunFacts, base_model: str | None) -> list[tuple[str, str]]:
    """(what, value) rows of the card's "How it was made" table: only what the run folder records."""
    g, rows = facts.generation, []
    commit = f" at {facts.model_commit}" if facts.model_commit and not facts.model_commit.startswith("sha256:") else ""
    read_from = f" (read from {g.get('model')})" if base_model and base_model != g.get("model") else ""
    rows.append(("base model", f"{base_model or g.get('model')}{commit}{read_from}"))
    prompts = (facts.prompts or {}).get("prompts")
    if isinstance(prompts, list):
        named = facts.prompts.get("category") or facts.prompts.get("name")
        rows.append(("training prompts", f"{len(prompts)}" + (f" ({named})" if named else "")))
    count = (facts.selection or {}).get("num_samples")
    per_prompt = f"{count // len(prompts)} per prompt, " if count and prompts and count % len(prompts) == 0 else ""
    rows.append(("samples", f"{per_prompt}{g.get('num_inference_steps')} steps of {g.get('scheduler')}, guidance "
                            f"{g.get('guidance_scale')}, {g.get('resolution')} px, {g.get('dtype')}, seed {g.get('seed')}"))
    if facts.rounds:
        rows.append(("online rounds", f"{facts.rounds} (each round samples from the LoRA of the round before)"))
    if facts.reward:
        options = facts.reward.get("options") or {}
        rows.append(("reward", f"{facts.reward.get('reward')} ({facts.reward.get('model_name_or_path') or 'no model'})"
                               + (f", options {json.dumps(options, sort_keys=True)}" if options else "")))
    s = facts.selection
    if s:
        rows.append(("selection", f"{s.get('threshold')}: kept {_share(s.get('num_selected'), s.get('num_samples'))} "
                                  f"samples, mean reward {s['selected']['mean']:.3f} kept, {s['all']['mean']:.3f} all"))
    t = facts.training
    if t:
        per_update = t["train_batch_size"] * t["gradient_accumulation_steps"] * t["num_processes"]
        lr = f"learning rate {t['learning_rate']:g} ({t['lr_scheduler']})"
        precision = {"no": "fp32"}.get(t.get("mixed_precision"), t.get("mixed_precision"))
        rows.append(("training", f"{per_update} samples per update, {lr}, {precision}, "
                                 f"{t['num_processes']} process{'es' if t['num_processes'] > 1 else ''}"))
        trained = [f"{key.removesuffix('_target_modules')} ({', '.join(value)})" for key, value in t.items()
                   if key.endswith("_target_modules") and not key.startswith("text_encoder")]
        if t.get("train_text_encoder"):
            trained.append(f"text_encoder ({', '.join(t['text_encoder_target_modules'])}, learning rate "
                           f"{t['text_encoder_learning_rate']:g})")
        rows.append(("LoRA", f"rank {t['rank']} on " + "; ".join(trained)))
        options = {key: t[key] for key in ("anchor_below", "timestep_range") if t.get(key) is not None}
        if options:
            rows.append(("training options", ", ".join(f"--{key} {' '.join(map(str, value)) if isinstance(value, list) else value}"
                                                       for key, value in options.items())))
    else:
        rows.append(("training", "not recorded here: no checkpoint of this LoRA's training is left in the run folder"))
    if facts.best:
        b = facts.best
        rows.append(("this LoRA", f"the best of validation: step {b.get('step')}, {b.get('benchmark')} "
                                  f"{b.get('metric')} {b.get('value'):.4f}"))
    elif facts.step is not None:
        rows.append(("this LoRA", f"the final one, step {facts.step}"))
    return rows


def model_card(config: PushConfig, facts: RunFacts, evaluation: dict[str, dict[str, float | None]],
               notes: list[str], base_model: str | None, tags: list[str]) -> str:
    """The README.md of the repository: YAML metadata the Hub reads, then the card."""
    from huggingface_hub import ModelCardData

    from gors.report import markdown_table

    metadata = ModelCardData(base_model=base_model, base_model_relation="adapter" if base_model else None,
                             license=config.license, library_name="diffusers", pipeline_tag="text-to-image",
                             tags=["text-to-image", "diffusers", "lora", "gors", *tags])
    table = "\n".join(["| | |", "|---|---|", *(f"| {what} | {value} |" for what, value in card_rows(facts, base_model))])
    base = base_model or "BASE_MODEL"  # a local base model: the user names it
    lines = [
        "---", metadata.to_yaml(), "---", "",
        f"# {config.repo_id.split('/')[-1]}", "",
        f"A LoRA of {f'[{base_model}](https://huggingface.co/{base_model})' if base_model else 'a local model'} "
        f"fine-tuned with GORS (reward-driven sample selection, Huang et al., T2I-CompBench, NeurIPS 2023) by gors "
        f"{__version__}: samples of the base model scored by a reward, those above the threshold kept, and a LoRA "
        "trained on them with the reward-weighted denoising loss.", "",
        "## How it was made", "", table, "",
    ]
    if evaluation:
        lines += ["## Evaluation", "",
                  "The main metric of each benchmark, from `gors evaluate` (the paper's rows in italics, where it has "
                  "the benchmark):", "", markdown_table(evaluation), ""]
        lines += [f"{note}  " for note in notes] + ([""] if notes else [])
    lines += [
        "## Use", "",
        "```python", "import torch", "from diffusers import AutoPipelineForText2Image", "",
        f'pipeline = AutoPipelineForText2Image.from_pretrained("{base}", torch_dtype=torch.float16).to("cuda")',
        f'pipeline.load_lora_weights("{config.repo_id}")', 'image = pipeline("a red book and a yellow vase").images[0]',
        "```", "",
        "Evaluated with gors:", "", "```bash",
        f"gors evaluate --pretrained_model_name_or_path {base} --lora hub:{config.repo_id} --benchmarks all", "```", "",
    ]
    return "\n".join(lines)


def stage_upload(config: PushConfig) -> Path:
    """Put the pushed files together in `<output_dir>/hub_upload/` (replaced whole); returns the folder."""
    run = Path(config.output_dir)
    lora = lora_file(run, config.lora)
    facts = run_facts(run, config.lora, lora)
    recorded = facts.generation.get("model")
    base_model = config.base_model or (recorded if recorded and not looks_like_local_path(recorded) else None)
    if base_model is None:
        print(f"note: the run's base model is a local folder ({recorded}): the card names no base model; pass "
              "--base_model ORG/NAME, its Hub id, to link it")
    evaluation, notes = evaluation_rows(config.evaluation, facts)
    tags = family_tags(recorded, facts.generation.get("revision"))
    staging = run / f".{UPLOAD_DIR}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copyfile(lora, staging / LORA_WEIGHT_NAME)
    card = model_card(config, facts, evaluation, notes, base_model, tags)
    atomic_write_bytes(staging / CARD_FILE, card.encode("utf-8"))
    record = {"gors_version": __version__, "base_model": base_model, **asdict(facts),
              "evaluation": evaluation}
    atomic_write_bytes(staging / RECORD_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    publish_folder(staging, run / UPLOAD_DIR)
    return run / UPLOAD_DIR


def _push_hint(err: BaseException, repo_id: str) -> str:
    status = getattr(getattr(err, "response", None), "status_code", None)
    if status == 401:
        return "the token was refused: log in again (`hf auth login`) or set HF_TOKEN to a valid token"
    if status == 403:
        return (f"the token may not write to {repo_id.split('/')[0]}: use a token with write access to that user or "
                "organisation, or another --repo_id")
    if network_error(err) is not None:
        return "the Hugging Face Hub could not be reached: check your network, then run the same command again"
    return "run the same command again; the files are ready in the upload folder"


def check_push_access(where: str) -> None:
    """Refuse a push that cannot start: offline mode on, or no Hugging Face token. `where`: what the user
    has meanwhile (the staged files, or a run not started yet)."""
    offline = offline_setting()
    if offline:
        raise ValueError(f"{offline} is set: pushing needs the network. Unset it to push; {where}")
    from huggingface_hub import get_token

    if get_token() is None:
        raise ValueError(f"no Hugging Face token: log in with `hf auth login` (a token with write access) or set "
                         f"HF_TOKEN; {where}")


def upload(config: PushConfig, folder: Path) -> str:
    """Upload `folder` as one commit to `config.repo_id` (created if missing); returns the commit's URL."""
    check_push_access(f"the files are in {folder}")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    message = config.commit_message or f"gors push: the {config.lora} LoRA of {Path(config.output_dir).name}"
    try:
        api.create_repo(config.repo_id, private=config.private, exist_ok=True)
        if config.revision:
            api.create_branch(config.repo_id, branch=config.revision, exist_ok=True)
        info = api.upload_folder(repo_id=config.repo_id, folder_path=folder, commit_message=message,
                                 revision=config.revision)
    except Exception as err:  # the Hub's refusals and the network's failures, with what to do
        if not isinstance(err, HfHubHTTPError) and network_error(err) is None:
            raise
        raise ValueError(f"pushing to {config.repo_id} failed: {one_line(err)}. {_push_hint(err, config.repo_id)}") \
            from err
    return info.commit_url


def push(config: PushConfig) -> Path:
    """`gors push`: stage the run's LoRA, card and record, and upload them unless `--dry_run`; returns the
    upload folder."""
    folder = stage_upload(config)
    files = ", ".join(sorted(path.name for path in folder.iterdir()))
    if config.dry_run:
        print(f"[push] --dry_run: {files} are in {folder}; nothing was uploaded")
        return folder
    commit_url = upload(config, folder)
    print(f"[push] the {config.lora} LoRA of {config.output_dir}, with {files}, is at {commit_url}")
    return folder
