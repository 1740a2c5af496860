"""The model card of a run's LoRA: what the run folder records of how it was made, and its README.md.

`run_facts` gathers the records (samples/settings.json, the checkpoint the LoRA was saved with,
selection_summary.json and the reward's scores/<reward>/settings.json of the folder that trained it,
rounds.json, best/best.json); `card_rows` states them, `model_card` writes the card. Nothing is
stated that the records do not hold: the trained components are read from the LoRA file itself, a
selection that no longer matches the training's fingerprint is left out, and an evaluation of other
weights or another model is refused (`evaluation_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gors.core.backbones import LORA_WEIGHT_NAME, detect_backbone
from gors.core.hub import looks_like_local_path
from gors.core.io import files_sha256, read_json_if_present
from gors.core.paper import T2I_COMPBENCH_BIBTEX
from gors.core.run_folder import (
    BEST_FILE,
    ROUNDS_FILE,
    SELECTION_SUMMARY_FILE,
    best_folder,
    is_rounds_folder,
    round_dir,
    samples_dir,
    scores_dir,
)
from gors.core.store import SETTINGS, SampleStore, recorded_model_commits, recorded_version, same_value

# gors.report, gors.evaluate, gors.select and gors.validation import torch: they are imported where
# used, so that `gors push --help` answers at once.

# The Hub's tags of each family gors trains, beside text-to-image, diffusers, lora and gors.
FAMILY_TAGS = {"sd": ["stable-diffusion", "stable-diffusion-diffusers"], "sdxl": ["stable-diffusion-xl"],
               "sd3": ["sd3", "sd3-diffusers"], "flux": ["flux", "flux-diffusers"]}
BASE_ROW, LORA_ROW = "base model", "this LoRA"


@dataclass
class RunFacts:
    """What a run folder records of how one of its LoRAs was made; None where it records nothing.

    `trained_in`: the folder whose selection the LoRA was trained on (a --rounds run's round);
    `components`: the model components the LoRA file holds weights for (`unet`, `text_encoder`, ...);
    `notes`: what the card leaves out, and why."""

    lora: str  # final or best
    lora_sha256: str
    components: list[str]
    step: int | None
    gors_version: str | None
    generation: dict[str, Any]
    model_commit: str | None
    prompts: dict[str, Any] | None
    selection: dict[str, Any] | None
    reward: dict[str, Any] | None
    training: dict[str, Any] | None
    best: dict[str, Any] | None
    rounds: int | None
    trained_in: str
    notes: list[str]


def lora_components(lora: Path) -> list[str]:
    """The components a diffusers-format LoRA file holds weights for: its keys' first names, in order."""
    from safetensors import safe_open

    with safe_open(lora, framework="numpy") as weights:
        return list(dict.fromkeys(key.split(".", 1)[0] for key in weights.keys()))


def _checkpoints(run: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(training folder, marker) of the run's complete checkpoints, a --rounds run's of every round, newest
    first."""
    from gors.checkpoints import complete_checkpoints

    found = [(folder, marker) for folder in (run, *sorted(run.glob("round-*")))
             for _, marker in complete_checkpoints(folder)]
    return sorted(found, key=lambda entry: entry[1]["step"], reverse=True)


def _trained_with(run: Path, sha256: str, best: dict[str, Any] | None) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint the LoRA was saved with, and the folder of its training: one holding the same weights
    (the final LoRA is the last step's checkpoint's), else, for the best LoRA, the first checkpoint at or after
    its step of the training its `best.json` names (by any identity `training_identity` has given; a --rounds
    run's best names all rounds, and the first checkpoint at or after its step is of the round it was in)."""
    from gors.validation import training_identity

    checkpoints = _checkpoints(run)
    for folder, record in checkpoints:
        if ((record.get("files") or {}).get(LORA_WEIGHT_NAME) or {}).get("sha256") == sha256:
            return folder, record
    if best is None or not isinstance(best.get("step"), int):
        return None
    for folder, record in reversed(checkpoints):  # oldest first
        identities = {training_identity(record["fingerprint"], with_selection, by_path)
                      for with_selection in (True, False) for by_path in (False, True)}
        if best.get("training") in identities and record["step"] >= best["step"]:
            return folder, record
    return None


def _selection(folder: Path, training: dict[str, Any] | None, notes: list[str]) -> dict[str, Any] | None:
    """`folder`'s selection summary where its selection is the one `training` (a fingerprint) trained on."""
    from gors.checkpoints import selection_fingerprint
    from gors.select import load_selection

    summary = read_json_if_present(folder / SELECTION_SUMMARY_FILE, "the summary gors select writes")
    if summary is None or training is None:
        return summary
    if selection_fingerprint(load_selection(folder)) != training.get("selection_sha256"):
        notes.append(f"the selection in {folder} is not the one this LoRA was trained on (selected again since): "
                     "the card leaves it out")
        return None
    return summary


def run_facts(run: Path, which: str, lora: Path) -> RunFacts:
    """What `run` records of how its `which` LoRA (`final`, `best`; the file `lora`) was made."""
    rounds = read_json_if_present(run / ROUNDS_FILE, "the record of the finished rounds")
    store = samples_dir(round_dir(run, 0) if is_rounds_folder(run) else run)  # every round's base model is one
    generation = read_json_if_present(store / SETTINGS, "the generation settings of the samples") or {}
    if not generation:
        raise FileNotFoundError(f"{store / SETTINGS} is missing: {run} is no gors run folder (give the --output_dir "
                                "of `gors run`, a recipe or `gors train`)")
    notes: list[str] = []
    best_record = best_folder(run) if which == "best" else None
    best = read_json_if_present(best_record / BEST_FILE, "the record of the best LoRA") if best_record is not None else None
    sha256 = files_sha256([lora])
    found = _trained_with(run, sha256, best)
    finished = (rounds or {}).get("rounds") or []
    trained_in, checkpoint = found or (round_dir(run, len(finished) - 1) if finished else run, {})
    training = checkpoint.get("fingerprint")
    if found is None:
        notes.append("no checkpoint of this LoRA's training is left in the run folder: the card gives no training "
                     "settings, and its selection is not checked against the training")
    selection = _selection(trained_in, training, notes)
    reward = None
    if isinstance(selection, dict) and isinstance(selection.get("reward"), str):
        reward = read_json_if_present(scores_dir(trained_in, selection["reward"]) / SETTINGS, "the settings of the reward's scores")
    model = generation.get("model")
    return RunFacts(
        lora=which, lora_sha256=sha256, components=lora_components(lora),
        step=best.get("step") if best else checkpoint.get("step"), gors_version=checkpoint.get("gors_version"),
        generation=generation,
        model_commit=recorded_version(recorded_model_commits(store), model) if isinstance(model, str) else None,
        prompts=read_json_if_present(store / "prompts.json", "the prompt set of the samples"), selection=selection, reward=reward,
        training=training, best=best, rounds=len(finished) if is_rounds_folder(run) else None,
        trained_in=str(trained_in.relative_to(run)) if trained_in != run else ".", notes=notes,
    )


def _same_model(name: Any, version: str | None, run_name: Any, run_version: str | None) -> bool:
    """Whether an evaluation's model is the run's: one version (Hub commit, local folder's fingerprint) where
    both are recorded, else one name (`same_value`: a local folder however its path is spelled)."""
    if version is not None and run_version is not None:
        return version == run_version
    return same_value(name, run_name)


def evaluation_rows(folders: list[str], facts: RunFacts) -> tuple[dict[str, dict[str, float | None]], list[str]]:
    """The card's evaluation table (row -> column -> main metric) of `gors evaluate` folders, each of this
    LoRA (a row of its own per `--lora_dropout`) or of the base model without a LoRA, and the notes on
    columns measured otherwise (`protocol_notes`) and on quick runs or other sampling set beside the paper's
    numbers (`quick_run_notes`). A folder of another model or other weights is refused: the card would give its
    numbers as this LoRA's."""
    from gors.evaluate import generator_versions
    from gors.report import evaluation_protocols, evaluation_values, protocol_notes, quick_run_notes, summary_folders

    rows: dict[str, dict[str, float | None]] = {}
    quick: list[str] = []
    protocols: dict[str, dict[str, Any]] = {}
    model = facts.generation.get("model")
    for folder in map(Path, folders):
        found = summary_folders(folder)
        if not found:
            raise FileNotFoundError(f"--evaluation {folder}: no summary.json; give the --output_dir of `gors evaluate`")
        for summary, benchmark_folder in found:
            if not isinstance(summary, dict) or not isinstance(summary.get("label"), str):
                raise ValueError(f"--evaluation {folder}: its summary.json lists an entry without a label; rerun "
                                 "`gors evaluate` there to write it again")
            label = summary["label"]
            if summary.get("images") is not None:
                raise ValueError(f"--evaluation {folder}: {label} scored an image folder ({summary['images']}), whose "
                                 "images may be any model's: evaluate the LoRA itself (gors evaluate --lora ...)")
            versions = generator_versions(benchmark_folder)
            if not _same_model(summary.get("model"), versions["model"], model, facts.model_commit):
                raise ValueError(f"--evaluation {folder}: {label} is of the model {summary.get('model')} (version "
                                 f"{versions['model']}), the run's is {model} (version {facts.model_commit})")
            if summary.get("lora") is None:
                row = BASE_ROW
            elif versions["lora_sha256"] == facts.lora_sha256:
                dropout = summary.get("lora_dropout")
                row = f"{LORA_ROW}, sampled with --lora_dropout {dropout}" if dropout else LORA_ROW
            else:
                raise ValueError(f"--evaluation {folder}: {label} is of other weights than the pushed LoRA "
                                 f"({summary['lora']}: sha256 {str(versions['lora_sha256'])[:12]}..., the pushed one "
                                 f"{facts.lora_sha256[:12]}...); evaluate the pushed LoRA, or push the one evaluated")
            rows.setdefault(row, {}).update(evaluation_values(folder / "summary.json", [summary]))
            protocols.setdefault(row, {}).update(evaluation_protocols([summary]))
            quick += quick_run_notes([summary], row)
    return rows, protocol_notes(protocols) + quick


def lora_samples(folders: list[str], facts: RunFacts, count: int = 4) -> list[tuple[str, Path]]:
    """(prompt, image file) of up to `count` images of the pushed LoRA from its `--evaluation` folders: the
    first image of the first prompts of the first benchmark evaluated with it (without `--lora_dropout`), as
    the benchmark sampled them; none without such an evaluation. Each file is checked against the sha256 its
    record holds (`SampleStore.open_image`)."""
    from gors.report import summary_folders

    for folder in map(Path, folders):
        for summary, benchmark_folder in summary_folders(folder):
            store = SampleStore(benchmark_folder / "samples")
            if summary.get("lora") is None or summary.get("lora_dropout") or \
                    (store.load_settings() or {}).get("lora_sha256") != facts.lora_sha256:
                continue
            firsts = sorted((r for r in store.records() if r["image_index"] == 0), key=lambda r: r["prompt_index"])
            for record in firsts[:count]:
                store.open_image(record)
            return [(record["prompt"], store.image_path(record)) for record in firsts[:count]]
    return []


def family_tags(model: str | None, revision: str | None) -> list[str]:
    """The Hub tags of the base model's family (`FAMILY_TAGS`); none where its model_index.json cannot be
    read here (a push from another machine than the training's, offline): tags only help search."""
    if model is None or (looks_like_local_path(model) and not Path(model).expanduser().is_dir()):
        return []
    try:
        return FAMILY_TAGS.get(detect_backbone(model, revision).name, [])
    except (OSError, ValueError):
        return []


def _shown_path(name: Any) -> str:
    """A model as the card names it: a Hub id as it is, a local folder by its name only (its path says where
    on the training machine it was, which the card has no use for; gors_run.json keeps it)."""
    if isinstance(name, str) and looks_like_local_path(name):
        return f"a local folder ({Path(name).name})"
    return str(name)


def _share(count: Any, total: Any) -> str:
    return f"{count} of {total}" + (f" ({100 * count / total:.0f} %)" if total else "")


def _training_rows(t: dict[str, Any], components: list[str]) -> list[tuple[str, str]]:
    """The training's rows: batch, learning rate, precision, processes; the LoRA's components with targets."""
    per_update = t["train_batch_size"] * t["gradient_accumulation_steps"] * t["num_processes"]
    precision = {"no": "fp32"}.get(t.get("mixed_precision"), t.get("mixed_precision"))
    rows = [("training", f"{per_update} samples per update, learning rate {t['learning_rate']:g} "
                         f"({t['lr_scheduler']}), {precision}, {t['num_processes']} "
                         f"process{'es' if t['num_processes'] > 1 else ''}")]
    trained = []
    for component in components:
        targets = t.get(f"{component}_target_modules") or (t.get("text_encoder_target_modules")
                                                            if component.startswith("text_encoder") else None)
        rate = f", learning rate {t['text_encoder_learning_rate']:g}" if component.startswith("text_encoder") else ""
        trained.append(f"{component} ({', '.join(targets or ['?'])}{rate})")
    rows.append(("LoRA", f"rank {t['rank']} on " + "; ".join(trained)))
    options = {key: t[key] for key in ("anchor_below", "timestep_range") if t.get(key) is not None}
    if options:
        rows.append(("training options", ", ".join(
            f"--{key} {' '.join(map(str, value)) if isinstance(value, list) else value}" for key, value in options.items())))
    return rows


def card_rows(facts: RunFacts, base_model: str | None) -> list[tuple[str, str]]:
    """(what, value) rows of the card's "How it was made" table: only what the run folder records."""
    g, recorded = facts.generation, facts.generation.get("model")
    if base_model and not same_value(base_model, recorded):
        shown = f"{base_model} (the run read {_shown_path(recorded)})"
    else:
        commit = facts.model_commit
        shown = _shown_path(recorded) + (f" at {commit}" if commit and not commit.startswith("sha256:") else "")
    rows = [("base model", shown)]
    prompts = (facts.prompts or {}).get("prompts")
    if isinstance(prompts, list):
        named = facts.prompts.get("category") or facts.prompts.get("name")
        rows.append(("training prompts", f"{len(prompts)}" + (f" ({named})" if named else "")))
    count = (facts.selection or {}).get("num_samples")
    per_prompt = f"{count // len(prompts)} per prompt, " if count and prompts and count % len(prompts) == 0 else ""
    rows.append(("samples", f"{per_prompt}{g.get('num_inference_steps')} steps of {g.get('scheduler')}, guidance "
                            f"{g.get('guidance_scale')}, {g.get('resolution')} px, {g.get('dtype')}, seed {g.get('seed')}"))
    if facts.rounds:
        rows.append(("online rounds", f"{facts.rounds}: each round samples from the LoRA of the round before; this "
                                      f"LoRA was trained in {facts.trained_in}"))
    if facts.reward:
        options = facts.reward.get("options") or {}
        model = facts.reward.get("model_name_or_path")
        rows.append(("reward", f"{facts.reward.get('reward')}" + (f" ({_shown_path(model)})" if model else "")
                               + (f", options {options}" if options else "")))
    s = facts.selection
    if s:
        rows.append(("selection", f"{s.get('threshold') or 'top fraction'}: kept "
                                  f"{_share(s.get('num_selected'), s.get('num_samples'))} samples, mean reward "
                                  f"{s['selected']['mean']:.3f} kept, {s['all']['mean']:.3f} all"))
    if facts.training:
        rows += _training_rows(facts.training, facts.components)
    else:
        rows.append(("LoRA", "on " + ", ".join(facts.components)))
    if facts.best:
        b = facts.best
        rows.append(("this LoRA", f"the best of validation: step {b.get('step')}, {b.get('benchmark')} "
                                  f"{b.get('metric')} {b.get('value'):.4f}"))
    elif facts.step is not None:
        rows.append(("this LoRA", f"the final one, step {facts.step}"))
    if facts.gors_version:
        rows.append(("trained by", f"gors {facts.gors_version}"))
    return rows


def model_card(repo_id: str, facts: RunFacts, evaluation: dict[str, dict[str, float | None]], notes: list[str],
               base_model: str | None, tags: list[str], license: str | None = None,
               revision: str | None = None, samples: list[tuple[str, str]] = ()) -> str:
    """The README.md of repository `repo_id`: the Hub's metadata (`ModelCardData`), then the card.
    `samples`: (prompt, image path in the repository) shown on the Hub's page (its widget) and in the card."""
    from huggingface_hub import ModelCardData

    from gors.report import markdown_table

    metadata = ModelCardData(base_model=base_model, base_model_relation="adapter" if base_model else None,
                             license=license, library_name="diffusers", pipeline_tag="text-to-image",
                             tags=["text-to-image", "diffusers", "lora", "gors", *tags],
                             widget=[{"text": prompt, "output": {"url": path}} for prompt, path in samples] or None)
    table = "\n".join(["| | |", "|---|---|", *(f"| {what} | {value} |" for what, value in card_rows(facts, base_model))])
    base = base_model or "BASE_MODEL"  # a local base model: the user names it
    at = f', revision="{revision}"' if revision else ""
    lines = [
        "---", metadata.to_yaml(), "---", "",
        f"# {repo_id.split('/')[-1]}", "",
        f"A LoRA of {f'[{base_model}](https://huggingface.co/{base_model})' if base_model else 'a local model'} "
        "fine-tuned with GORS (reward-driven sample selection, Huang et al., T2I-CompBench, NeurIPS 2023): "
        "generated samples scored by a reward, the best of them kept, and a LoRA trained on them with the "
        "reward-weighted denoising loss.", "",
        "## How it was made", "", table, "",
    ]
    if facts.notes:
        lines += [f"Left out: {note}.  " for note in facts.notes] + [""]
    if samples:
        lines += ["## Samples", "", "Images of this LoRA as its first `--evaluation` benchmark sampled them:", "",
                  "| " + " | ".join(prompt.replace("|", "/") for prompt, _ in samples) + " |",
                  "|" + "---|" * len(samples),
                  "| " + " | ".join(f"![{index}]({path})" for index, (_, path) in enumerate(samples)) + " |", ""]
    if evaluation:
        lines += ["## Evaluation", "",
                  "The main metric of each benchmark, from `gors evaluate` (the paper's rows in italics, where it has "
                  "the benchmark):", "", markdown_table(evaluation), ""]
        lines += [f"{note}  " for note in notes] + ([""] if notes else [])
    lines += [
        "## Use", "",
        "```python", "import torch", "from diffusers import AutoPipelineForText2Image", "",
        f'pipeline = AutoPipelineForText2Image.from_pretrained("{base}", torch_dtype=torch.float16).to("cuda")',
        f'pipeline.load_lora_weights("{repo_id}"{at})', 'image = pipeline("a red book and a yellow vase").images[0]',
        "```", "",
    ]
    if not revision:  # `hub:` reads the main branch
        lines += ["Evaluate it with gors:", "", "```bash",
                  f"gors evaluate --pretrained_model_name_or_path {base} --lora hub:{repo_id} --benchmarks all",
                  "```", ""]
    lines += ["## Citation", "", "GORS and T2I-CompBench:", "", "```bibtex", T2I_COMPBENCH_BIBTEX, "```", ""]
    return "\n".join(lines)
