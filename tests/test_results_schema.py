"""The results schema of summary.json: bootstrap statistics as pure functions (no model), the
shared protocol fields of every benchmark, and the "Adding a benchmark" example of docs/extending.md run on
the packaged toy model."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

from evaluators import available_benchmarks, benchmark_class, build_benchmark
from evaluators.base import spread_evenly
from evaluators.geneval import geneval_summary
from evaluators.results import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    Metric,
    bootstrap,
    bootstrap_draws,
    bootstrap_settings,
    group_by_prompt,
    metric_results,
    metric_value,
    percentile_interval,
    resampled_rows,
    standard_error,
    summary_problem,
)
from gors.core.store import sample_seed

EXTENDING = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def rows_of(prompt_scores: list[list[float]]) -> list[dict]:
    """Result rows: image i of prompt p scores prompt_scores[p][i]."""
    return [{"prompt_index": p, "image_index": i, "prompt": f"p{p}", "score": score}
            for p, scores in enumerate(prompt_scores) for i, score in enumerate(scores)]


def mean_score(drawn: list[list[dict]]) -> dict[str, float]:
    rows = resampled_rows(drawn)
    return {"score": float(np.mean([row["score"] for row in rows]))}


# --------------------------------------------------------------------------------------------
# Pure functions, against a reference.


def test_stderr_of_a_plain_mean_is_the_standard_error_over_prompt_means() -> None:
    rng = np.random.default_rng(7)
    scores = rng.uniform(0, 1, size=(60, 4)).tolist()
    groups = group_by_prompt(rows_of(scores))
    replicates = [r["score"] for r in bootstrap(groups, mean_score, num_resamples=2000, seed=3)]
    prompt_means = np.mean(scores, axis=1)
    reference = np.std(prompt_means, ddof=1) / np.sqrt(len(prompt_means))
    assert standard_error(replicates) == pytest.approx(reference, rel=0.1)
    low, high = percentile_interval(replicates)
    value = float(np.mean(scores))
    assert low < value < high
    # The normal interval of the mean, within Monte Carlo error.
    assert (low, high) == pytest.approx((value - 1.96 * reference, value + 1.96 * reference), abs=0.3 * reference)


def test_bootstrap_is_deterministic_for_a_fixed_seed() -> None:
    groups = group_by_prompt(rows_of([[0.1], [0.9], [0.4], [0.7]]))
    first = bootstrap(groups, mean_score, num_resamples=50, seed=11)
    assert first == bootstrap(groups, mean_score, num_resamples=50, seed=11)
    assert first != bootstrap(groups, mean_score, num_resamples=50, seed=12)
    assert np.array_equal(bootstrap_draws(4, 50, 11), bootstrap_draws(4, 50, 11))
    assert bootstrap_draws(4, 50, 11).shape == (50, 4)
    assert set(bootstrap_draws(3, 200, 0).ravel().tolist()) == {0, 1, 2}  # every group, none beyond
    with pytest.raises(ValueError, match="at least one group"):
        bootstrap_draws(0)


def test_bootstrap_defaults_are_the_settings_summary_json_records() -> None:
    """Without arguments the bootstrap draws what bootstrap_settings() says: BOOTSTRAP_RESAMPLES resamples from a
    generator seeded with BOOTSTRAP_SEED (1000 and 0), so a summary's recorded settings reproduce its stderr."""
    groups = group_by_prompt(rows_of([[0.1], [0.9], [0.4], [0.7], [0.2]]))
    replicates = bootstrap(groups, mean_score)
    assert len(replicates) == BOOTSTRAP_RESAMPLES == bootstrap_settings()["resamples"] == 1000
    assert BOOTSTRAP_SEED == bootstrap_settings()["seed"] == 0
    assert replicates == bootstrap(groups, mean_score, num_resamples=1000, seed=0)


def test_bootstrap_settings_describe_the_defaults() -> None:
    assert bootstrap_settings() == {"unit": "prompt", "resamples": 1000, "seed": 0, "confidence": 0.95,
                                    "interval": "percentile"}
    assert bootstrap_settings(200, 3, 0.9) == {"unit": "prompt", "resamples": 200, "seed": 3, "confidence": 0.9,
                                               "interval": "percentile"}


def test_a_prompt_drawn_twice_counts_twice() -> None:
    """GenEval's share of prompts with a correct image, recomputed on a resample: the duplicate of a
    prompt is a prompt of its own (it would vanish if resampled rows kept their prompt_index)."""
    rows = [{"prompt_index": p, "tag": "single_object", "correct": p == 0} for p in range(2) for _ in range(2)]
    groups = group_by_prompt(rows)
    drawn = [groups[0], groups[0], groups[1]]
    resampled = resampled_rows(drawn)
    assert [row["prompt_index"] for row in resampled] == [0, 0, 1, 1, 2, 2]
    assert geneval_summary(resampled)["correct_prompts"] == pytest.approx(2 / 3)
    assert rows[0]["prompt_index"] == 0 and groups[1][0]["prompt_index"] == 1  # the inputs are left as they were


def test_metric_block_lookup_absent_and_undefined_metrics() -> None:
    summary = {"overall": 0.5, "columns": {"B-CLIP": 0.7}, "undefined": None}
    replicates = [{"overall": v, "columns": {"B-CLIP": 0.7}, "undefined": None} for v in (0.4, 0.5, 0.6)]
    metrics = (Metric("overall"), Metric("columns.B-CLIP"), Metric("columns.CLIPScore"),
               Metric("undefined", higher_is_better=False, scale="x100"))
    block = metric_results(metrics, summary, replicates)
    assert list(block) == ["overall", "columns.B-CLIP", "undefined"]  # CLIPScore was not computed
    assert block["overall"]["stderr"] == pytest.approx(0.1)
    assert block["overall"]["ci95"] == pytest.approx([0.405, 0.595])
    assert block["columns.B-CLIP"]["value"] == 0.7 and block["columns.B-CLIP"]["stderr"] == pytest.approx(0.0)
    assert block["undefined"] == {"value": None, "higher_is_better": False, "scale": "x100", "stderr": None,
                                  "ci95": None, "help": ""}
    assert metric_value(summary, "columns.B-CLIP") == 0.7 and metric_value(summary, "columns.nothing") is None
    assert metric_value(summary, "overall.B-CLIP") is None  # a number has no keys: the metric is absent
    # Resamples where a metric is undefined are left out; fewer than two defined values give no statistics.
    assert standard_error([0.5, None, 0.7]) == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert standard_error([0.5, None]) is None and percentile_interval([None, 0.5]) is None
    with pytest.raises(ValueError, match="confidence"):
        percentile_interval([0.1, 0.2], confidence=95)


def test_a_summary_is_checked_against_its_declared_scales() -> None:
    metrics = (Metric("share"), Metric("percent", scale="x100"), Metric("cosine", scale="[-1, 1] (cosine)"),
               Metric("columns.B-CLIP"))
    fine = {"share": 1.0, "percent": 100, "cosine": -0.5, "columns": {"B-CLIP": 0.0}}
    assert summary_problem(fine, metrics) is None
    assert summary_problem({**fine, "share": None}, metrics) is None  # undefined
    assert summary_problem({**fine, "share": 1.0000001}, metrics) is None  # rounding
    assert "outside its declared scale x100" in summary_problem({**fine, "percent": 100.1}, metrics)
    assert "'columns.B-CLIP', outside its declared scale [0, 1]" in summary_problem(
        {**fine, "columns": {"B-CLIP": -0.1}}, metrics)
    assert "returned True for 'share', not a finite number" in summary_problem({**fine, "share": True}, metrics)
    assert "returned nan for 'share'" in summary_problem({**fine, "share": float("nan")}, metrics)
    assert "JSON cannot hold" in summary_problem({**fine, "extra": {1, 2}}, metrics)


# --------------------------------------------------------------------------------------------
# The shared protocol of the benchmarks.


def test_every_benchmark_declares_its_primary_metric_and_protocol() -> None:
    seeds = {}
    for name in ("t2i_compbench", "geneval", "geneval2", "lpg_bench", "toy"):
        assert name in available_benchmarks()
        cls = benchmark_class(name)
        bench = cls()
        keys = [metric.key for metric in cls.metrics]
        assert cls.primary_metric in keys and len(set(keys)) == len(keys), name
        assert bench.higher_is_better is True
        protocol = bench.protocol()
        assert protocol.images_per_prompt == bench.num_images == cls.official_images_per_prompt
        seeds[name] = [protocol.seed_fn(protocol.seed, p, i) for p, i in [(0, 0), (3, 1)]]
    # T2I-CompBench and GenEval: seed 42 + image index for every prompt; the others: a seed per image.
    assert seeds["t2i_compbench"] == seeds["geneval"] == [42, 43]
    assert seeds["geneval2"] == seeds["lpg_bench"] == [sample_seed(42, 0, 0), sample_seed(42, 3, 1)]
    assert seeds["toy"] == [sample_seed(2024, 0, 0), sample_seed(2024, 3, 1)]
    # The metric that ranks checkpoints: GenEval's mean of task means, not its share of correct images.
    assert {name: benchmark_class(name).primary_metric for name in seeds} == {
        "t2i_compbench": "score", "geneval": "overall", "geneval2": "soft_tifa_gm", "lpg_bench": "tit_score",
        "toy": "binding_accuracy"}
    official = {name: benchmark_class(name)().protocol() for name in ("t2i_compbench", "geneval", "toy")}
    assert [(p.num_inference_steps, p.guidance_scale, p.resolution, p.batch_size) for p in official.values()] == [
        (30, 7.5, 512, 8), (50, 9.0, 512, 4), (20, 4.0, 64, 32)]


def test_results_record_the_resolved_protocol_and_tell_prompt_sets_apart() -> None:
    """config holds the sampling values the images were made with (the official 50 steps, guidance 9, 512 px
    where the fields were left None); images made elsewhere keep the fields as given and say "external".
    prompts_sha256 separates prompt sets whose texts only join alike (one hash per prompt list, lines apart)."""
    from evaluators.base import BenchmarkPrompt
    from evaluators.geneval import GenEvalBenchmark

    rows = [{"prompt_index": p, "image_index": 0, "tag": "single_object", "correct": p == 0} for p in range(2)]

    def results(texts: list[str], protocol: bool = True) -> dict:
        bench = GenEvalBenchmark(max_prompts=2, images_per_prompt=1)
        bench.__dict__["_prompts"] = [BenchmarkPrompt(text) for text in texts]  # no data is read
        return bench.results(rows, bench.aggregate(rows), bench.protocol() if protocol else None)

    config = results(["ab", "c"])["config"]
    assert (config["num_inference_steps"], config["guidance_scale"], config["resolution"]) == (50, 9.0, 512)
    assert "images" not in config
    external = results(["ab", "c"], protocol=False)["config"]
    assert (external["num_inference_steps"], external["resolution"], external["images"]) == (None, None, "external")
    assert results(["ab", "c"])["data"]["prompts_sha256"] != results(["a", "bc"])["data"]["prompts_sha256"]


@pytest.mark.parametrize("name", ["t2i_compbench", "geneval", "geneval2", "lpg_bench", "toy"])
@pytest.mark.parametrize("field, value", [("images_per_prompt", 0), ("max_prompts", 0), ("num_inference_steps", 0),
                                          ("batch_size", 0), ("resolution", 0)])
def test_protocol_fields_are_checked_once_for_every_benchmark(name: str, field: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"{field} must be >= 1"):
        build_benchmark(name, **{field: value})


def test_max_prompts_keeps_exactly_that_many_spread_over_the_list() -> None:
    assert spread_evenly(list(range(10)), 3) == [0, 3, 6]
    assert spread_evenly(range(300), 16) == [i * 300 // 16 for i in range(16)] and spread_evenly(range(300), 16)[-1] == 281
    # 100 of 150 is 100 (every 2nd one was 75), each prompt once, in order
    chosen = spread_evenly(range(150), 100)
    assert len(chosen) == len(set(chosen)) == 100 and chosen == sorted(chosen) and chosen[:4] == [0, 1, 3, 4]
    assert spread_evenly([1, 2], 5) == [1, 2] and spread_evenly([1, 2], None) == [1, 2]


# --------------------------------------------------------------------------------------------
# docs/extending.md's example.

# Kept equal to the code block under "## Adding a benchmark" in docs/extending.md (checked below).
EXAMPLE = '''
from dataclasses import dataclass

from evaluators import Benchmark, BenchmarkPrompt, Metric, get_benchmark, register_benchmark
from gors.core.toy import PRETRAINED_DIR


@register_benchmark("two_objects")  # get_benchmark("two_objects") knows it once this module is imported
@dataclass
class TwoObjectsBenchmark(Benchmark):
    """Two toy-world prompts; each image is judged by the exact toy oracle."""

    # The shared protocol fields, with this benchmark's official defaults.
    num_inference_steps: int = 20
    guidance_scale: float = 4.0
    resolution: int = 64
    official_images_per_prompt = 2  # what images_per_prompt=None means
    scorer = "toy_oracle"  # a reward of the rewards registry scores every image
    primary_metric = "accuracy"
    metrics = (Metric("accuracy", higher_is_better=True, scale="[0, 1]", help="share of correctly bound images"),)

    def prompts(self) -> list[BenchmarkPrompt]:
        texts = ["a red circle and a blue triangle", "a yellow square on the left of a green triangle"]
        return self.subsample([BenchmarkPrompt(text) for text in texts])  # honours max_prompts

    def summarize(self, rows: list[dict]) -> dict:
        return {"accuracy": sum(row["details"]["bound"] for row in rows) / len(rows), "num_images": len(rows)}


if __name__ == "__main__":
    summary = get_benchmark("two_objects").evaluate(str(PRETRAINED_DIR / "pipeline"), "eval/two_objects")
    print(summary["accuracy"], summary["results"]["metrics"]["accuracy"]["ci95"])
'''.lstrip()


def test_readme_example_runs_on_the_packaged_toy_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "two_objects.py"
    script.write_text(EXAMPLE)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    summary = json.loads((tmp_path / "eval" / "two_objects" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "eval" / "two_objects" / "results.jsonl").open()]
    assert len(rows) == 4 and summary["num_images"] == 4
    assert summary["accuracy"] == pytest.approx(np.mean([row["details"]["bound"] for row in rows]))
    results = summary["results"]
    assert results["samples"] == {"prompts": 2, "images": 4, "images_per_prompt": 2}
    assert results["metrics"]["accuracy"]["value"] == summary["accuracy"]
    low, high = results["metrics"]["accuracy"]["ci95"]
    assert low <= summary["accuracy"] <= high
    assert results["config"]["num_inference_steps"] == 20 and results["benchmark"] == "two_objects"
    assert str(summary["accuracy"]) in capsys.readouterr().out


def test_readme_example_is_the_tested_one() -> None:
    text = EXTENDING.read_text(encoding="utf-8")
    assert "## Adding a benchmark" in text
    section = text.split("## Adding a benchmark", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block is not None and block.group(1) == EXAMPLE
