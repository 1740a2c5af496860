"""GenEval-style training prompts: GenEval's templates, zero overlap with the 553 test prompts."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from evaluators.geneval import load_geneval_metadata
from evaluators.geneval_train_prompts import (
    TRAIN_TAGS,
    candidates,
    combination,
    generate_train_prompts,
    main,
    metadata_row,
    tag_shares,
)
from rewards.geneval_rules import check_metadata

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"


@pytest.fixture(autouse=True)
def data_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    if not (SHARED / "geneval" / "evaluation_metadata.jsonl").is_file():
        pytest.skip("needs ../shared/benchmarks")
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))
    return SHARED / "geneval"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return generate_train_prompts(1000, seed=0, evaluation_rows=json_rows())


def json_rows() -> list[dict]:
    path = SHARED / "geneval" / "evaluation_metadata.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Fixed:
    """An rng stand-in whose `random()` is always `value`: picks one wording of a combination."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_templates_reproduce_every_geneval_test_row() -> None:
    """GenEval's own rows come out of `metadata_row` (in one of the wordings), text and clauses alike."""
    test = load_geneval_metadata()
    tags = {row["tag"] for row in test} - {"single_object"}
    candidate_keys = {tag: set(candidates(tag)) for tag in tags}
    for row in test:
        if row["tag"] == "single_object":
            continue
        key = combination(row)
        assert key in candidate_keys[row["tag"]] or row["tag"] == "position"
        worded = [metadata_row(key, Fixed(value)) for value in (0.0, 0.9)]
        assert row in worded, row
    positions = {combination(r) for r in test if r["tag"] == "position"}
    assert positions <= candidate_keys["position"]


def test_zero_overlap_with_the_test_prompts(rows: list[dict]) -> None:
    test = load_geneval_metadata()
    assert len(rows) == 1000
    assert not {row["prompt"] for row in rows} & {row["prompt"] for row in test}
    assert not {combination(row) for row in rows} & {combination(row) for row in test}
    assert len({combination(row) for row in rows}) == 1000  # no prompt twice, in any wording
    # The stricter rule at work: a test scene in other words is no training prompt either.
    swapped = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                              {"class": "teddy bear", "count": 1, "position": ["left of", 0]}]}
    original = next(r for r in test if r["prompt"] == "a photo of a dog right of a teddy bear")
    assert combination(swapped) == combination(original)
    pair = next(r for r in test if r["tag"] == "two_object")
    assert combination({**pair, "include": pair["include"][::-1]}) == combination(pair)


def test_rows_are_valid_geneval_metadata_in_the_official_format(rows: list[dict]) -> None:
    test_keys = {tuple(row) for row in load_geneval_metadata()}
    for row in rows:
        check_metadata(row)
        assert tuple(row) in test_keys  # key order of evaluation_metadata.jsonl
        assert row["prompt"].startswith("a photo of ")
        assert row["tag"] != "counting" or row["exclude"] == [{"class": row["include"][0]["class"],
                                                                "count": row["include"][0]["count"] + 1}]
        assert "person" not in [c["class"] for c in row["include"] if "color" in c]


def test_tag_mix_is_equal_and_interleaved(rows: list[dict]) -> None:
    # Equal shares, but only 160 (class, count) combinations are no test prompt: the rest is shared.
    assert Counter(row["tag"] for row in rows) == {"two_object": 210, "counting": 160, "colors": 210, "position": 210,
                                                   "color_attr": 210}
    assert tag_shares(7, dict.fromkeys(TRAIN_TAGS, 10)) == {"two_object": 2, "counting": 2, "colors": 1,
                                                            "position": 1, "color_attr": 1}
    assert tag_shares(10, {"a": 1, "b": 2, "c": 100}) == {"a": 1, "b": 2, "c": 7}
    assert len({row["tag"] for row in rows[:20]}) == 5  # shuffled: the first N prompts keep the mix
    two = generate_train_prompts(10, tags=["counting", "colors"], evaluation_rows=json_rows())
    assert Counter(row["tag"] for row in two) == {"counting": 5, "colors": 5}


def test_deterministic_in_the_seed(rows: list[dict]) -> None:
    assert generate_train_prompts(1000, seed=0, evaluation_rows=json_rows()) == rows
    other = generate_train_prompts(1000, seed=1, evaluation_rows=json_rows())
    assert other != rows and len({r["prompt"] for r in other} & {r["prompt"] for r in rows}) < 500


def test_bad_requests_fail_before_any_work() -> None:
    test = json_rows()
    # 80 of the 240 (class, count) combinations are test prompts: 160 are left.
    generate_train_prompts(160, tags=["counting"], evaluation_rows=test)
    with pytest.raises(ValueError, match=r"num_prompts=161, but the tags \['counting'\] have only 160"):
        generate_train_prompts(161, tags=["counting"], evaluation_rows=test)
    with pytest.raises(ValueError, match="single_object has no combination left"):
        generate_train_prompts(10, tags=["single_object"], evaluation_rows=test)
    with pytest.raises(ValueError, match="num_prompts=0"):
        generate_train_prompts(0, evaluation_rows=test)
    with pytest.raises(ValueError, match="unknown GenEval tag 'shape'"):
        combination({"tag": "shape", "include": []})


def test_command_line_writes_jsonl(tmp_path: Path) -> None:
    path = main(["--output", str(tmp_path / "train.jsonl"), "--num_prompts", "12", "--seed", "3"])
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written == generate_train_prompts(12, seed=3)


def test_command_line_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match=r"^error: num_prompts=0"):
        main(["--output", str(tmp_path / "train.jsonl"), "--num_prompts", "0"])
    # Offline, without the GenEval metadata file: the download error and the command that fetches it.
    monkeypatch.delenv("GORS_DATA_DIR")
    monkeypatch.setenv("GORS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match=r"^error: evaluation_metadata.jsonl of djghosh13/geneval .* is not in the "
                                         r"cache .*\(`gors download evaluate --benchmarks geneval` fetches"):
        main(["--output", str(tmp_path / "train.jsonl"), "--num_prompts", "12"])
    assert not (tmp_path / "train.jsonl").exists()


# ---- the recipe ----

def test_recipe_help_runs() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "recipes/gors_geneval.py", "--help"], capture_output=True, text=True,
                            cwd=root, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--train_prompts" in result.stdout and "--reward_threshold" in result.stdout


def test_recipe_config_writes_the_training_prompts_once(tmp_path: Path, hub_cache) -> None:
    from gors.core.toy import PRETRAINED_DIR
    from gors.recipes import GENEVAL_TAU, geneval_recipe_config
    from gors.run import check_run_inputs
    from rewards.combined import reward_models

    hub_cache(*reward_models("geneval_graded").values())  # as a user's cache holds them

    out = tmp_path / "run"
    config = geneval_recipe_config(["--output_dir", str(out), "--images_per_prompt", "4"])
    path = out / "geneval_train_prompts.jsonl"
    assert config.train_prompts == str(path) and config.images_per_prompt == 4
    assert (config.reward, config.reward_threshold, config.validation_benchmark) == ("geneval_graded", GENEVAL_TAU,
                                                                                      "geneval")
    assert config.pretrained_model_name_or_path == "stabilityai/stable-diffusion-2-base"
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written == generate_train_prompts(700, seed=0)
    # The run's up-front check passes on them (on a local model of the same family: no Hub here).
    check_run_inputs(replace(config, pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline")))
    # A resumed run keeps the prompts it started with; other --train_prompts pass unchanged.
    path.write_text(json.dumps(written[0]) + "\n")
    assert geneval_recipe_config(["--output_dir", str(out)]).train_prompts == str(path)
    assert path.read_text() == json.dumps(written[0]) + "\n"
    own = geneval_recipe_config(["--output_dir", str(tmp_path / "b"), "--train_prompts", "mine.jsonl"])
    assert own.train_prompts == "mine.jsonl" and not (tmp_path / "b").exists()
    # tau 0.7 is the recipe's default selection, not a flag: the other selections replace it.
    top = geneval_recipe_config(["--output_dir", str(out), "--select_top_fraction", "0.1"])
    assert (top.reward_threshold, top.select_top_fraction) == (None, 0.1)
    scheduled = geneval_recipe_config(["--output_dir", str(out), "--rounds", "2", "--tau_schedule", "0.6", "0.8"])
    assert (scheduled.reward_threshold, scheduled.tau_schedule) == (None, [0.6, 0.8])


def test_a_geneval_recipe_run_refused_before_it_began_leaves_no_folder_of_prompts(tmp_path, hub_cache, capsys) -> None:
    from gors.recipes import GENEVAL_TRAIN_FILE, run_geneval_recipe
    from rewards.combined import reward_models

    hub_cache(*reward_models("geneval_graded").values())
    missing_model = ["--pretrained_model_name_or_path", str(tmp_path / "no_model")]
    with pytest.raises(SystemExit):
        run_geneval_recipe(["--output_dir", str(tmp_path / "new" / "run"), *missing_model])
    assert "no_model" in capsys.readouterr().err and not (tmp_path / "new").exists()
    # A folder that was there keeps what the recipe wrote into it: a rerun trains on the same prompts.
    (tmp_path / "old").mkdir()
    with pytest.raises(SystemExit):
        run_geneval_recipe(["--output_dir", str(tmp_path / "old"), *missing_model])
    assert [path.name for path in (tmp_path / "old").iterdir()] == [GENEVAL_TRAIN_FILE]
