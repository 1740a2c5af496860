"""Two toy settings compared on the same prompts and seeds: the paired difference in binding accuracy.

    python recipes/toy_compare.py ONE_s0 ROUNDS_s0 ONE_s1 ROUNDS_s1 ...

Each argument is a run folder of `recipes/gors_toy.py` (its final LoRA's evaluation, `eval_gors/`) or
an evaluation folder (with `results.jsonl`); they come in pairs (A, B) of one training seed each, all
evaluated on one prompt set with one `--eval_images_per_prompt`. For each pair it prints both binding
accuracies and B - A with its standard error over prompts (a bootstrap: the prompts are the evaluation's
sample, the images of a prompt share its difficulty), and the same for the mean over pairs. The
training seeds' own spread is not in that error: compare the pairs' differences for it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tabulate import tabulate

RESULTS = "results.jsonl"
FINAL_EVALUATION = "eval_gors"


def results_file(folder: str | Path) -> Path:
    """The `results.jsonl` of an evaluation folder, or of a toy run folder's final evaluation."""
    folder = Path(folder)
    for candidate in (folder / RESULTS, folder / FINAL_EVALUATION / RESULTS):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{folder} holds neither {RESULTS} nor {FINAL_EVALUATION}/{RESULTS}: pass a run folder "
                            "of recipes/gors_toy.py or one of its evaluation folders")


def per_prompt_results(rows: Sequence[Mapping]) -> dict[str, list[float]]:
    """Each prompt's images' results: 1.0 where every binding is right, else 0.0."""
    images: dict[str, list[float]] = {}
    for row in rows:
        images.setdefault(row["prompt"], []).append(float(row["correct"]))
    return images


def per_prompt_accuracy(results: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Binding accuracy of each prompt (the share of its images with every binding right), in [0, 1]."""
    return {prompt: float(np.mean(values)) for prompt, values in results.items()}


def check_comparable(results: Sequence[Mapping[str, Sequence[float]]], folders: Sequence[str | Path]) -> None:
    """Refuse evaluations of other prompt sets or other images per prompt than the first's: their accuracies
    measure other samples (fewer images per prompt are the first of the others', on the same seeds)."""
    first = results[0]
    for other, folder in zip(results[1:], folders[1:]):
        if other.keys() != first.keys():
            raise ValueError(f"{folder} was evaluated on other prompts than {folders[0]} "
                             f"({len(other.keys() ^ first.keys())} in one only): compare evaluations of one prompt set")
        if any(len(other[prompt]) != len(first[prompt]) for prompt in first):
            raise ValueError(f"{folder} was evaluated with other images per prompt than {folders[0]}: compare "
                             "evaluations made with one --eval_images_per_prompt")


def paired_difference(a: Mapping[str, float], b: Mapping[str, float], resamples: int = 2000,
                      seed: int = 0) -> tuple[float, float]:
    """Mean over prompts of b - a, and its bootstrap standard error over prompts; both sides must hold the
    same prompts."""
    if a.keys() != b.keys():
        raise ValueError(f"the two evaluations differ in their prompts ({len(a.keys() ^ b.keys())} in one only): "
                         "compare evaluations of one prompt set")
    differences = np.array([b[prompt] - a[prompt] for prompt in sorted(a)])
    draws = np.random.default_rng(seed).integers(0, len(differences), size=(resamples, len(differences)))
    return float(differences.mean()), float(differences[draws].mean(axis=1).std())


def compare(folders: Sequence[str | Path]) -> list[list]:
    """The printed table's rows: one per (A, B) pair, then their mean when there are several."""
    if len(folders) < 2 or len(folders) % 2:
        raise ValueError(f"{len(folders)} folders: give pairs A B (one per training seed), A first")
    results = [per_prompt_results([json.loads(line) for line in results_file(f).read_text().splitlines()])
               for f in folders]
    check_comparable(results, folders)
    accuracies = [per_prompt_accuracy(prompt_results) for prompt_results in results]
    pairs = list(zip(accuracies[::2], accuracies[1::2]))
    table = []
    for (a, b), name in zip(pairs, folders[1::2]):
        mean, error = paired_difference(a, b)
        table.append([str(name), np.mean(list(a.values())), np.mean(list(b.values())), mean, error])
    if len(pairs) > 1:
        a = {prompt: float(np.mean([pair[0][prompt] for pair in pairs])) for prompt in pairs[0][0]}
        b = {prompt: float(np.mean([pair[1][prompt] for pair in pairs])) for prompt in pairs[0][0]}
        mean, error = paired_difference(a, b)
        table.append(["mean of the pairs", np.mean(list(a.values())), np.mean(list(b.values())), mean, error])
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="A B pairs: run or evaluation folders, one pair per training seed")
    args = parser.parse_args(argv)
    try:
        table = compare(args.folders)
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"error: {err}\n")  # as the gors commands: 2 for a mistake in the input
    print(tabulate(table, headers=["pair (B)", "binding A", "binding B", "B - A", "SE over prompts"],
                   floatfmt=("", ".3f", ".3f", "+.3f", ".3f")))


if __name__ == "__main__":
    main()
