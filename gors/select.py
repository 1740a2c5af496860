"""Stage 3, `gors select`: keep the samples whose reward exceeds tau (GORS), or each prompt's best.

Writes `selection.jsonl` (one row per kept sample: path, image_sha256, prompt, prompt and image
index, reward, and tau, none with --select_top_fraction) and `selection_summary.json` (counts, the
rule, reward statistics of kept and dropped samples).
"""

from __future__ import annotations

import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gors._moved import moved_names
from gors.config import RunConfig, SelectConfig
from gors.core.io import (
    TornLineError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_jsonl,
    is_json_number,
    read_json,
    read_jsonl,
)
from gors.core.lock import holds_stages
from gors.core.prompts import TOY_CATEGORY, check_category, recorded_category
from gors.core.run_folder import (
    CHECKPOINTS_DIR,
    SCORES_DIR,
    SELECTION_FILE,
    SELECTION_SUMMARY_FILE,
    reward_key,
    samples_dir,
    scores_dir,
)
from gors.core.scoring import SETTINGS_FILE, load_scores
from gors.core.store import IMAGE_HASH, SampleStore, StoreError, sample_key
from rewards.combined import check_reward
from rewards.paper import THRESHOLD_CATEGORIES, selection_threshold

# 0.1 names that moved in 0.2 (CHANGELOG.md); they warn and forward until 0.3.
__getattr__ = moved_names(__name__, {
    "SUMMARY_FILE": "gors.core.run_folder:SELECTION_SUMMARY_FILE",
})


def threshold_fn(config: SelectConfig | RunConfig,
                 prompt_set_category: str | None) -> tuple[Callable[[int], float], str]:
    """tau as a function of the prompt index, and a description of where it came from: --reward_threshold,
    else the category's (`rewards.paper.selection_threshold`: the paper's, or the toy world's for the reward)."""
    if config.reward_threshold is not None:  # --reward_threshold, a recipe's default, or a round's --tau_schedule value
        return (lambda _index: config.reward_threshold), f"tau = {config.reward_threshold:g}"
    category = config.category or prompt_set_category
    if category is None:
        raise ValueError(
            "No threshold: the prompts are not a T2I-CompBench category, so the paper's tau does not apply. "
            f"Pass --reward_threshold (e.g. 0.8) or --category ({', '.join(THRESHOLD_CATEGORIES)})."
        )
    reward = config.reward_name(category)
    selection_threshold(category, reward, 0)  # an unknown category (or toy reward) fails here, naming the known ones
    source = f"toy world's tau for reward {reward!r}" if category == TOY_CATEGORY \
        else f"paper's tau for category {category!r}"
    return (lambda index: selection_threshold(category, reward, index)), source


def top_fraction(rewards: list[tuple[int, int, float]], fraction: float) -> set[tuple[int, int]]:
    """The (prompt index, image index) pairs in the top `fraction` of each prompt's images by reward.

    `rewards`: (prompt index, image index, reward in [0, 1]) triples. Each prompt keeps
    ceil(fraction x its image count) images, at least one; equal rewards go to the lower image index.
    """
    by_prompt: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for prompt, image, value in rewards:
        by_prompt[prompt].append((value, image))
    kept = set()
    for prompt, values in by_prompt.items():
        # Rounded first: 0.07 x 100 is 7.000000000000001 in floating point, which ceil would make 8.
        count = max(1, math.ceil(round(fraction * len(values), 9)))
        best = sorted(values, key=lambda item: (-item[0], item[1]))[:count]
        kept |= {(prompt, image) for _, image in best}
    return kept


def reward_statistics(values: list[float]) -> dict[str, float]:
    """Count, mean, std, min, quartiles and max of rewards in [0, 1] (NaN-free; empty -> count 0)."""
    if not values:
        return {"count": 0}
    array = np.asarray(values, dtype=np.float64)
    q = np.quantile(array, [0.0, 0.25, 0.5, 0.75, 1.0])
    return {
        "count": int(array.size),
        "mean": float(array.mean()),
        "std": float(array.std()),
        "min": float(q[0]),
        "q25": float(q[1]),
        "median": float(q[2]),
        "q75": float(q[3]),
        "max": float(q[4]),
    }


def _histogram(values: list[float], bins: int = 10) -> str:
    counts, edges = np.histogram(values, bins=bins, range=(0.0, 1.0))
    return "\n".join(f"  [{edges[i]:.1f}, {edges[i + 1]:.1f}) {'#' * min(int(c), 50)} {int(c)}" for i, c in enumerate(counts))


def scored_rewards(output_dir: str | Path) -> list[str]:
    """The rewards a run folder has score folders of, sorted, each as `--reward` takes it: the "reward" its
    `settings.json` records (a weighted list's folder is named `toy_oracle_0.5_...`, its reward
    `toy_oracle:0.5,...`), else the folder's name (an older gors's plain reward)."""
    folder = Path(output_dir) / SCORES_DIR
    folders = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    return sorted(read_json(p / SETTINGS_FILE, "the scorer settings gors wrote there").get("reward", p.name)
                  if (p / SETTINGS_FILE).is_file() else p.name for p in folders)


def _scored_hint(config: SelectConfig | RunConfig, reward: str) -> str:
    """What to run when `reward` has no scores: score with it, or, when the reward was not chosen
    (`--reward` left out), select by a reward the folder has scores of. A `reward` that names no
    reward is refused first (`rewards.combined.check_reward`), with the known ones: no advice to
    score with a mistyped name."""
    check_reward(reward)
    command = f"Run `gors score --output_dir {config.output_dir} --reward {shlex.quote(reward)}` first"
    scored = [name for name in scored_rewards(config.output_dir) if reward_key(name) != reward_key(reward)]
    if config.reward is not None or config.unbiased or not scored:
        return command + "."
    return f"{reward} is the default reward; this folder has scores of {', '.join(scored)}: pass --reward " \
           f"{shlex.quote(scored[0])}, or {command[0].lower()}{command[1:]}."


def _check_zero_rewards(kept: list[dict[str, Any]], reward: str, warn: bool) -> None:
    """The loss is weighted by the reward: a kept sample whose reward is 0 trains nothing."""
    zeros = sum(row["reward"] <= 0 for row in kept)
    if zeros == len(kept):
        raise ValueError(f"every one of the {len(kept)} samples --select_top_fraction keeps has {reward} 0, and the "
                         "loss is weighted by the reward: training would learn nothing. Generate more images per "
                         "prompt, or select by another reward.")
    if zeros and warn:
        print(f"[select] warning: {zeros} of the {len(kept)} kept samples have {reward} 0 and train nothing (the "
              "loss is weighted by the reward)", file=sys.stderr)


def _is_reward(value: Any) -> bool:
    """Whether `value` is a reward as gors writes them: a number in [0, 1] (not NaN)."""
    return is_json_number(value) and 0.0 <= value <= 1.0


def _check_reward_value(row: dict[str, Any], folder: Path) -> None:
    """Refuse a score row whose reward is no number in [0, 1] (a file edited or written by other code): tau
    would compare it wrongly, or training would weight its loss by it."""
    if not _is_reward(row.get("reward")):
        value = row.get("reward")
        raise StoreError(f"{folder} holds reward {value!r} for {row.get('path')}; rewards are numbers in [0, 1], as "
                         f"gors writes them. Delete that row (\"prompt_index\": {row.get('prompt_index')}, "
                         f"\"image_index\": {row.get('image_index')}) from its part-*.jsonl file there and run "
                         "`gors score` again: it scores that sample again")


@holds_stages("select", reads_run=True)
def select(config: SelectConfig | RunConfig, write: bool = True,
           extra_rows: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Select samples with reward > tau; returns the summary written to `selection_summary.json`.

    Read-only unless `write`: under several processes all of them select (and fail alike), one writes.
    `extra_rows` are written after the selected ones (an online round's replayed samples of earlier rounds).
    A selection that checkpoints in the folder were trained on is kept aside when another replaces it
    (`keep_trained_selection`).
    """
    store = SampleStore(samples_dir(config.output_dir))
    prompt_info = store.load_prompts()
    records = store.records()
    if not records:
        raise StoreError(f"no samples in {store.root}: run `gors generate --output_dir {config.output_dir}` first.")
    category = recorded_category(prompt_info)
    check_category(config, category, f"the samples in {store.root}")
    reward = config.reward_name(category)
    scores = load_scores(config.output_dir, reward, records)
    unscored = [r["path"] for r in records if sample_key(r) not in scores]
    if unscored:
        raise StoreError(
            f"{len(unscored)} of {len(records)} samples have no {reward!r} score (e.g. {unscored[0]}). "
            f"{_scored_hint(config, reward)}"
        )
    for row in scores.values():
        _check_reward_value(row, scores_dir(config.output_dir, reward))
    fraction = config.select_top_fraction
    if fraction is None:
        tau, tau_source = threshold_fn(config, category)
    else:
        best = top_fraction([(r["prompt_index"], r["image_index"], scores[sample_key(r)]["reward"]) for r in records],
                            fraction)
        tau_source = f"--select_top_fraction={fraction} of each prompt's images"

    kept, dropped = [], []
    for record in records:
        value = scores[sample_key(record)]["reward"]
        row = {
            "path": record["path"],
            IMAGE_HASH: record.get(IMAGE_HASH),
            "prompt": record["prompt"],
            "prompt_index": record["prompt_index"],
            "image_index": record["image_index"],
            "reward": value,
        }
        if fraction is None:
            row["threshold"] = tau(record["prompt_index"])
            keep = value > row["threshold"]
        else:
            keep = (record["prompt_index"], record["image_index"]) in best
        (kept if keep else dropped).append(row)

    if fraction is not None:
        _check_zero_rewards(kept, reward, write)
    all_values = [row["reward"] for row in kept + dropped]
    if not kept:
        raise ValueError(
            f"No sample has {reward} > tau ({tau_source}; tau ranges "
            f"{min(tau(r['prompt_index']) for r in records):.2f}-{max(tau(r['prompt_index']) for r in records):.2f}). "
            f"Reward distribution of the {len(records)} samples:\n{_histogram(all_values)}\n"
            f"Lower tau (--reward_threshold; with --rounds, this round's value in a --tau_schedule that keeps the "
            f"finished rounds' taus), or generate more images per prompt (with --rounds, in a new --output_dir)."
        )
    summary = {
        "reward": reward,
        "threshold": tau_source,
        "num_samples": len(records),
        "num_selected": len(kept),
        "num_prompts_with_selection": len({row["prompt_index"] for row in kept}),
        "selected": reward_statistics([row["reward"] for row in kept]),
        "dropped": reward_statistics([row["reward"] for row in dropped]),
        "all": reward_statistics(all_values),
    }
    if not write:
        return summary
    rows = kept + list(extra_rows)
    aside = keep_trained_selection(config.output_dir, rows)
    atomic_write_jsonl(Path(config.output_dir) / SELECTION_FILE, rows)
    atomic_write_json(Path(config.output_dir) / SELECTION_SUMMARY_FILE, summary)
    print(
        f"[select] kept {len(kept)} of {len(records)} samples ({tau_source}); "
        f"mean reward kept {summary['selected']['mean']:.3f}, all {summary['all']['mean']:.3f}"
    )
    if aside is not None:
        print(f"[select] the checkpoints in {Path(config.output_dir) / CHECKPOINTS_DIR} were trained on the selection "
              f"this one replaces: it is kept as {aside.name}; a training now trains on the new one (setting those "
              "checkpoints aside as it starts)")
    return summary


# Where `keep_trained_selection` keeps a selection that checkpoints were trained on (n from 1).
PREVIOUS_SELECTION = "selection.previous-{number}.jsonl"


def keep_trained_selection(output_dir: str | Path, rows: list[dict[str, Any]]) -> Path | None:
    """Copy `selection.jsonl` (and its summary) to `selection.previous-<n>.jsonl` (`selection_summary.previous-<n>
    .json`) before `rows` replace it, where a complete checkpoint of the folder was trained on it (its fingerprint's
    `selection_sha256`) and `rows` differ from it: the record of what that training's LoRA learnt from is kept.
    Returns the copy, else None."""
    from gors.checkpoints import complete_checkpoints, selection_fingerprint

    path = Path(output_dir) / SELECTION_FILE
    if not path.is_file():
        return None
    try:
        current = selection_fingerprint(list(read_jsonl(path, whole=True)))
    except (TornLineError, ValueError):  # a file cut short or edited into no selection: nothing trained on it as it is
        return None
    trained = {marker["fingerprint"].get("selection_sha256")
               for _, marker in complete_checkpoints(output_dir, replaced=True)}  # a killed save's kept too
    if current not in trained or selection_fingerprint(rows) == current:
        return None
    number = 1
    while (aside := path.with_name(PREVIOUS_SELECTION.format(number=number))).exists():
        number += 1
    summary = path.with_name(SELECTION_SUMMARY_FILE)
    if summary.is_file():  # kept as written, as the selection is
        atomic_write_bytes(path.with_name(f"selection_summary.previous-{number}.json"), summary.read_bytes())
    atomic_write_bytes(aside, path.read_bytes())
    return aside


def load_selection(output_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of `selection.jsonl`, with a clear error when select has not run, when the file lost lines
    since (its last one cut short, or fewer rows than `selection_summary.json` counts), when it holds no
    row or when a row's reward (the loss weight) is no number in [0, 1]."""
    path = Path(output_dir) / SELECTION_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: run `gors select --output_dir {output_dir}` first.")
    again = f"run `gors select --output_dir {output_dir}` again"
    try:  # select writes the file whole (atomically): a line missing since would otherwise train on the rest unnoticed
        rows = list(read_jsonl(path, whole=True))
    except TornLineError:
        raise StoreError(f"{path} is cut short (its last line is incomplete; gors select writes it whole): "
                         f"{again}") from None
    if not rows:
        raise StoreError(f"{path} holds no sample (gors select writes none so: the file was emptied): {again}")
    summary_path = path.with_name(SELECTION_SUMMARY_FILE)
    summary = read_json(summary_path, f"the summary gors select writes; {again}") if summary_path.is_file() else {}
    selected = summary.get("num_selected") if isinstance(summary, dict) else None
    if isinstance(selected, int) and len(rows) < selected:  # more is a rounds run's replayed rows
        raise StoreError(f"{path} holds {len(rows)} samples, {summary_path.name} says gors select kept {selected}: the "
                         f"file lost lines since (or gors select was stopped between writing the two); {again}")
    for number, row in enumerate(rows, start=1):
        missing = [key for key in ("path", "prompt") if not isinstance(row.get(key), str)]
        if missing:
            raise StoreError(f"{path}:{number} has no {' and no '.join(missing)} text, which gors select writes in "
                             f"every row: {again}")
        if not _is_reward(row.get("reward")):
            raise StoreError(f"{path} holds reward {row.get('reward')!r} for {row.get('path')}; rewards are numbers in "
                             f"[0, 1]: {again}")
    return rows
