"""`benchmarks/cost_model.py`'s pricing: the speed table's rows give `gors estimate` its official ratios.

The script itself (a calibration `gors run` on random-weight models, then `gors estimate`) is a
measurement, run by hand or by `benchmarks/gpu_session.sh`, not a test; what it reads is tested here.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    """`benchmarks/__main__.py`, `common.py` and `cost_model.py` (the scripts import each other as top-level modules)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name) for name in ("common", "cost_model")} | {
            "main": importlib.import_module("benchmarks.__main__")}
    finally:
        sys.path[:] = [entry for entry in sys.path if entry != str(BENCHMARKS)]  # __main__ adds it too


def write_table(scripts, path: Path, rows: list) -> str:
    data = scripts["main"].table_data(rows, {"b_vqa_passes": 1.0}, "cpu", False)
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_each_stage_is_priced_by_the_median_of_its_row_and_a_later_table_wins(scripts, tmp_path):
    result = scripts["common"].SpeedResult
    first = write_table(scripts, tmp_path / "speed.json", [
        result("B-VQA", "8 passes", "sizes", [6.0, 8.0, 7.0], "1e-07", "score"),
        result("training step, U-Net LoRA only", "loop", "sizes", [2.5], "0e+00"),  # prices nothing
        result("training step, both LoRAs", "loop", "sizes", [1.2, 1.4], "0e+00", "train"),
        result("GenEval mask boxes", "mask2bbox", "sizes", [1.1], "identical"),
    ])
    measured = scripts["cost_model"].measured_speedups
    assert measured([first]) == {"score": 7.0, "train": pytest.approx(1.3)}
    later = write_table(scripts, tmp_path / "again.json", [result("B-VQA", "8 passes", "sizes", [5.0], "0", "score")])
    assert measured([first, later]) == {"score": 5.0, "train": pytest.approx(1.3)}
    assert measured([]) == {}  # gors estimate's defaults then


def test_a_file_that_is_not_a_speed_table_is_named(scripts, tmp_path):
    measured = scripts["cost_model"].measured_speedups
    (tmp_path / "speed.md").write_text("| stage | ... |\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"--speedups .*speed\.md: not the JSON of a speed table \(`python -m "
                                         r"benchmarks --output X\.md` writes X\.json\)"):
        measured([str(tmp_path / "speed.md")])
    with pytest.raises(SystemExit, match=r"missing\.json: not the JSON of a speed table"):
        measured([str(tmp_path / "missing.json")])


def test_gors_estimate_takes_the_speed_tables_json_for_its_official_column(scripts, tmp_path):
    from gors.estimate import CPU_MEASURED_SPEEDUPS, EstimateConfig

    result = scripts["common"].SpeedResult
    table = write_table(scripts, tmp_path / "speed.json", [
        result("B-VQA", "8 passes", "sizes", [9.0, 11.0, 10.0], "1e-07", "score"),
        result("GenEval mask boxes", "mask2bbox", "sizes", [1.1], "identical")])
    config = EstimateConfig(timings=["runs/x"], reference_speedups=table)
    assert config.reference_speedups == CPU_MEASURED_SPEEDUPS | {"score": 10.0}  # the other stages keep theirs
    assert config.given_speedups == {"score"}
    (tmp_path / "other.json").write_text('{"stages": {}}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"other\.json: not the JSON of a speed table"):
        EstimateConfig(timings=["runs/x"], reference_speedups=str(tmp_path / "other.json"))
    for text in ('{"rows": [1]}', '{"rows": {"a": 1}}', '[1]', '{"generate": 2.0}'):  # were tracebacks or "'rows'"
        (tmp_path / "other.json").write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=r"other\.json: not the JSON of a speed table .*: no 'rows' list of rows"):
            EstimateConfig(timings=["runs/x"], reference_speedups=str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match=r"for ratios by stage, give them as text: --reference_speedups"):
        EstimateConfig(timings=["runs/x"], reference_speedups=str(tmp_path / "other.json"))
    with pytest.raises(FileNotFoundError, match=r"--reference_speedups .*gone\.json: no such file"):
        EstimateConfig(timings=["runs/x"], reference_speedups=str(tmp_path / "gone.json"))


def test_a_training_ratio_measured_at_another_gors_batch_than_the_calibrations_is_refused(scripts, tmp_path, capsys):
    # One GPU at batch 16 trains GORS' global batch of 2 x 8; its ratio per sample prices only a calibration
    # at 16: a batch-2 calibration priced with it would make the official column too high.
    result = scripts["common"].SpeedResult
    at_16 = write_table(scripts, tmp_path / "train16.json", [
        result("training step, both LoRAs", "loop", "sizes", [1.2], "0e+00", None, batch=2),
        result("training step, both LoRAs, gors at batch 16, per sample", "loop", "sizes", [4.0], "-", "train",
               batch=16)])
    older = write_table(scripts, tmp_path / "speed.json", [
        result("training step, both LoRAs", "loop", "sizes", [1.2], "0e+00", "train")])  # no batch recorded: 2
    cost_model = scripts["cost_model"]
    assert cost_model.training_batch([older]) == 2
    assert cost_model.training_batch([older, at_16]) == 16  # the later table's row wins, as in the pricing
    assert cost_model.training_batch([]) is None
    with pytest.raises(SystemExit) as stop:
        cost_model.main(["--speedups", at_16])
    assert stop.value.code == 2
    assert ("prices training with gors at batch 16, but the calibration trains at --train_batch_size 2: measure "
            "train_step with --gors_batch_size 2, or calibrate at 16") in capsys.readouterr().err
    with pytest.raises(SystemExit):  # gors estimate's default training ratio is of gors at batch 2
        cost_model.main(["--train_batch_size", "16"])
    assert "--train_batch_size 16 needs its training ratio" in capsys.readouterr().err


def test_gors_estimate_checks_the_batch_of_the_training_row_whose_ratio_it_prices(scripts, tmp_path):
    """Of two training rows in one speed table, the later one prices training, and its batch is the one checked."""
    from gors.estimate import speed_table_ratios, speed_table_train_batch

    result = scripts["common"].SpeedResult
    table = write_table(scripts, tmp_path / "speed.json", [
        result("training step, both LoRAs", "loop", "sizes", [1.2], "0e+00", "train", batch=2),
        result("training step, both LoRAs, gors at batch 16, per sample", "loop", "sizes", [4.0], "-", "train",
               batch=16)])
    assert speed_table_ratios(table) == {"train": 4.0} and speed_table_train_batch(table) == 16


def test_the_default_ratios_are_the_kept_cpu_tables_medians():
    # `gors estimate`'s default official column must come from a speed table kept in the repository, not from
    # numbers typed in: the defaults are its medians, rounded as printed.
    from gors.estimate import CPU_MEASURED_SPEEDUPS, CPU_MEASURED_TABLE, speed_table_ratios

    kept = speed_table_ratios(BENCHMARKS.parent / CPU_MEASURED_TABLE)
    assert {stage: round(ratio, 2) for stage, ratio in kept.items()} == CPU_MEASURED_SPEEDUPS


def test_ratios_measured_on_another_machine_are_named(scripts, tmp_path):
    result = scripts["common"].SpeedResult
    here = write_table(scripts, tmp_path / "here.json", [result("B-VQA", "8 passes", "sizes", [6.0], "0", "score")])
    h200 = str(BENCHMARKS / "results" / "2026-12-04-h200" / "b_vqa_passes.json")
    other_machines = scripts["cost_model"].other_machines
    this_machine = scripts["common"].machine("cpu")
    assert other_machines([here], this_machine) == []  # the table written here names this machine
    assert other_machines([here, h200], this_machine) == [f"{h200} (NVIDIA H200)"]
