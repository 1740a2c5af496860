"""`gors report` on the folders runs really leave: rounds without logs, logs without curves, resumed
runs' repeated steps, malformed files; and its PNGs written atomically, an earlier report's removed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import gors.report
from gors.report import load_scalars, report

ROUNDS = {"settings": {}, "rounds": [
    {"round": 0, "mean_reward": 0.5, "selected_fraction": 0.2, "mean_reward_selected": 0.8, "num_replayed": 0,
     "last_step": 2},
    {"round": 1, "mean_reward": 0.6, "selected_fraction": 0.0, "mean_reward_selected": None, "num_replayed": 3,
     "last_step": 4}]}


def _table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]


def _log(folder: Path, points: dict[str, list[tuple[int, float]]], walltime: float = 1000.0) -> None:
    """TensorBoard scalars in a new event file under `folder/logs/gors`, at `walltime` (+ step) seconds."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder / "logs" / "gors"), filename_suffix=f".{walltime:.0f}") as writer:
        for tag, series in points.items():
            for step, value in series:
                writer.add_scalar(tag, value, step, walltime=walltime + step)


def _evaluation(folder: Path, value: float = 0.25) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"summaries": [
        {"label": "toy:held_out", "primary_metric": "binding_accuracy", "binding_accuracy": value}]}))
    return folder


def test_a_rounds_run_without_logs_is_reported_from_its_rounds_json(tmp_path):
    run = tmp_path / "run"  # `--rounds 2 --report_to none`: rounds.json, no TensorBoard logs
    run.mkdir()
    (run / "rounds.json").write_text(json.dumps(ROUNDS))
    text = report([run], tmp_path / "report").read_text()
    rows = _table_rows(text)
    assert rows[0][:2] == ["round", "mean_reward"] and [row[1] for row in rows[2:]] == ["0.5000", "0.6000"]
    assert (tmp_path / "report" / "rounds.png").stat().st_size > 0
    assert "## Training" not in text


def test_a_rounds_row_shows_only_the_validation_logged_at_its_last_step(tmp_path):
    from gors.report import round_rows

    # Round 0 ended at step 2, where nothing was validated: the step-1 value is not that round's.
    (tmp_path / "rounds.json").write_text(json.dumps(ROUNDS))
    rows = round_rows(tmp_path, {"validation/acc": [(1, 0.1), (4, 0.4)], "train/loss": [(2, 0.9), (4, 0.5)]})
    assert "validation/acc" not in rows[0] and rows[1]["validation/acc"] == 0.4
    assert all("train/loss" not in row for row in rows)


@pytest.mark.parametrize("points", [
    {"selected/reward_mean": [(0, 0.7)]},  # a run stopped at step 0: its selection logged, no loss yet
    {"rounds/mean_reward": [(0, 0.5), (1, 0.6)]},  # a rounds run whose logs hold rounds/* only
])
def test_logs_without_a_loss_or_validation_curve_give_no_empty_plot(tmp_path, points):
    run = tmp_path / "run"
    _log(run, points)
    (run / "rounds.json").write_text(json.dumps(ROUNDS))
    text = report([run], tmp_path / "report").read_text()
    assert "run: no training loss or validation metric in its logs" in text
    assert "training_curves.png" not in text and not (tmp_path / "report" / "training_curves.png").exists()
    assert (tmp_path / "report" / "rounds.png").is_file()


def test_each_folders_rounds_are_read_once(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _log(run, {"train/loss": [(2, 1.0), (4, 0.5)]})
    (run / "rounds.json").write_text(json.dumps(ROUNDS))
    calls = []
    real = gors.report.round_rows
    monkeypatch.setattr(gors.report, "round_rows", lambda *args: calls.append(args) or real(*args))
    report([run], tmp_path / "report")
    assert len(calls) == 1


def _two_sources(tmp_path: Path) -> tuple[Path, Path]:
    """An evaluation folder and a rounds run with a loss curve: a report of them writes all three PNGs."""
    evaluation, run = _evaluation(tmp_path / "eval"), tmp_path / "run"
    _log(run, {"train/loss": [(1, 1.0), (2, 0.5)]})
    (run / "rounds.json").write_text(json.dumps(ROUNDS))
    return evaluation, run


def test_the_pngs_are_rendered_in_memory_and_written_atomically(tmp_path, monkeypatch):
    evaluation, run = _two_sources(tmp_path)
    out = tmp_path / "report"
    written = []
    real = gors.report.atomic_write_bytes
    monkeypatch.setattr(gors.report, "atomic_write_bytes", lambda path, data: written.append(Path(path).name)
                        or real(path, data))
    report([evaluation, run], out)
    # Through a temporary file and a rename: a report stopped while plotting never leaves a torn PNG.
    assert sorted(written) == ["benchmarks.png", "report.md", "rounds.png", "training_curves.png"]
    assert all((out / name).read_bytes().startswith(b"\x89PNG") for name in written if name.endswith(".png"))
    assert sorted(p.name for p in out.iterdir()) == sorted(written)  # no temporary file left


def test_an_earlier_reports_pngs_that_this_one_does_not_write_are_removed(tmp_path):
    evaluation, run = _two_sources(tmp_path)
    out = tmp_path / "report"
    report([evaluation, run], out)
    (out / "mine.png").write_bytes(b"a picture of the user's, not the report's")
    report([evaluation], out)  # the same folder, evaluations only
    assert sorted(p.name for p in out.iterdir()) == ["benchmarks.png", "mine.png", "report.md"]
    assert "training_curves.png" not in (out / "report.md").read_text()
    # A file named like a plot that no report in the folder showed is the user's own.
    own = tmp_path / "figs"
    own.mkdir()
    (own / "rounds.png").write_bytes(b"the user's")
    report([evaluation], own)
    assert (own / "rounds.png").read_bytes() == b"the user's"


def test_a_resumed_runs_repeated_steps_keep_the_latest_event(tmp_path):
    run = tmp_path / "run"
    _log(run, {"train/loss": [(1, 0.9), (2, 0.8), (3, 0.7)], "validation/toy:train/binding_accuracy": [(2, 0.1)]},
         walltime=1000.0)
    # Stopped after step 3 with its checkpoint at 1: the resumed run logs steps 2 and 3 again, later.
    _log(run, {"train/loss": [(2, 0.4), (3, 0.3), (4, 0.2)], "validation/toy:train/binding_accuracy": [(2, 0.5)]},
         walltime=2000.0)
    scalars = load_scalars(run)
    assert scalars["train/loss"] == [(1, pytest.approx(0.9)), (2, pytest.approx(0.4)), (3, pytest.approx(0.3)),
                                     (4, pytest.approx(0.2))]
    assert scalars["validation/toy:train/binding_accuracy"] == [(2, pytest.approx(0.5))]


@pytest.mark.parametrize("name, content, message", [
    ("summary.json", {"summaries": 3}, "is not a `gors evaluate` summary"),
    ("summary.json", {"summaries": [{"label": "x"}]}, r"summaries\[0\] has no 'primary_metric'"),
    ("summary.json", {"summaries": ["x"]}, r"summaries\[0\] has no 'label' or 'primary_metric'"),
    ("summary.json", {"summaries": [{"label": "x", "primary_metric": "m", "m": "high"}]},
     r"summaries\[0\] \(x\): its main metric 'm' is 'high', not a number"),
    ("rounds.json", {"rounds": [{"round": 0}]},
     r"rounds\[0\] lacks mean_reward, selected_fraction, mean_reward_selected, num_replayed, last_step"),
    ("rounds.json", {"rounds": [ROUNDS["rounds"][0] | {"mean_reward": None}]},
     r"rounds\[0\]: mean_reward=None is not a number"),
    ("rounds.json", {"rounds": [3]}, r"rounds\[0\] lacks round, mean_reward"),
    ("summary.json", {"benchmark": "nowhere", "score": 0.5},
     "is a summary of benchmark 'nowhere', which is not known here"),
])
def test_a_malformed_summary_or_rounds_file_is_an_error_naming_it(tmp_path, name, content, message):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / name).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=f"^{re.escape(str(folder / name))}:? {message}"):
        report([folder], tmp_path / "report")


def test_a_quick_run_set_beside_published_numbers_is_noted(tmp_path):
    def evaluation(name: str, max_prompts: int | None, per_prompt: int | None, **sampling) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        config = {"max_prompts": max_prompts, "images_per_prompt": per_prompt, "num_inference_steps": 30,
                  "guidance_scale": 7.5, "resolution": 512, **sampling}
        summary = {"label": "t2i_compbench:color", "primary_metric": "b_vqa", "b_vqa": 0.5,
                   "results": {"config": config, "samples": {"prompts": max_prompts or 300}}}
        (folder / "summary.json").write_text(json.dumps({"summaries": [summary]}))
        return folder

    text = report([evaluation("quick", 2, 2), evaluation("fewer", None, 4), evaluation("full", None, None),
                   evaluation("all", 300, None), evaluation("steps", None, None, num_inference_steps=20)],
                  tmp_path / "report").read_text()
    assert ("note: quick's t2i_compbench:color is a quick run (2 prompts x 2 images; the protocol's: 300 x 10): it "
            "does not compare with the published numbers") in text
    assert "fewer's t2i_compbench:color is a quick run (300 prompts x 4 images" in text
    # Any image side is the protocol's (the checkpoint's own); other steps are not.
    assert ("note: steps's t2i_compbench:color was sampled otherwise than the benchmark's protocol "
            "(num_inference_steps 20 (the protocol's 30)): it does not compare with the published numbers") in text
    assert "full's" not in text and "all's" not in text  # --max_prompts 300 cuts none of the 300


def test_evaluations_of_one_benchmark_measured_otherwise_are_noted(tmp_path):
    def evaluation(name: str, prompts: int, per_prompt: int = 4, prompt_set: str = "a", **summary_keys) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        summary = {"label": "toy:held_out", "primary_metric": "binding_accuracy", "binding_accuracy": 0.5,
                   **summary_keys, "results": {
                       "samples": {"prompts": prompts, "images": prompts * per_prompt, "images_per_prompt": per_prompt},
                       "data": {"prompts_sha256": prompt_set}, "config": {"batch_size": prompts, "seed": 0}}}
        (folder / "summary.json").write_text(json.dumps({"summaries": [summary]}))
        return folder

    text = report([evaluation("quick", 4), evaluation("full", 150)], tmp_path / "report").read_text()
    assert ("note: toy:held_out was measured otherwise for these checkpoints (prompts: quick 4, full 150): those "
            "values do not compare exactly") in text
    # As many images, on other prompts (6 x 3 against 9 x 2): noted too.
    text = report([evaluation("six", 6, 3, "b"), evaluation("nine", 9, 2, "c")], tmp_path / "report").read_text()
    assert "(prompts: six 6, nine 9; images per prompt: six 3, nine 2; prompt set)" in text
    # Another judge (LPG-Bench's embedding and LLM judges share a label).
    text = report([evaluation("embedding", 4, judge="x", metric="tit_score"),
                   evaluation("llm", 4, metric="tit_score_llm")], tmp_path / "report").read_text()
    assert "(judge: embedding tit_score, llm tit_score_llm)" in text
    # Measured alike, whatever the batch size: no note.
    text = report([evaluation("again", 150), tmp_path / "full"], tmp_path / "report").read_text()
    assert "note:" not in text
    # A LoRA sampled with dropout against one sampled without: noted. Not against the base model (no LoRA to
    # drop), nor against images made elsewhere (`--images`, no sampling recorded), as the paper compares them.
    dropout = evaluation("dropout", 150, lora="gors_color", lora_dropout=0.1)
    text = report([dropout, evaluation("plain", 150, lora="gors_color")], tmp_path / "report").read_text()
    assert "(LoRA dropout: dropout 0.1, plain 0.0)" in text
    assert "note:" not in report([dropout, tmp_path / "full"], tmp_path / "report").read_text()
    external = evaluation("external", 150)
    summary = json.loads((external / "summary.json").read_text())
    summary["summaries"][0]["results"]["config"] = {"images": "external", "seed": None, "batch_size": 8}
    (external / "summary.json").write_text(json.dumps(summary))
    assert "note:" not in report([external, tmp_path / "full"], tmp_path / "report").read_text()
    assert "note:" not in report([external, dropout], tmp_path / "report").read_text()
    # Another scorer (options, dtype, scoring version) or generating precision: noted; a summary of an older gors
    # that recorded neither ("full") is compared on what it recorded.
    def recorded(name: str, scorer: dict, dtype: str) -> Path:
        folder = evaluation(name, 150)
        summary = json.loads((folder / "summary.json").read_text())
        summary["summaries"][0]["results"] |= {"scorer": scorer}
        summary["summaries"][0]["results"]["config"]["dtype"] = dtype
        (folder / "summary.json").write_text(json.dumps(summary))
        return folder

    scorer = {"reward": "toy_binding", "options": {}, "dtype": "float32"}
    same = [recorded("a", scorer, "float16"), recorded("b", scorer, "float16"), tmp_path / "full"]
    assert "note:" not in report(same, tmp_path / "report").read_text()
    other = recorded("c", scorer | {"options": {"model_name_or_path": "other"}}, "float16")
    assert "(scorer)" in report([same[0], other], tmp_path / "report").read_text()
    assert "(sampling)" in report([same[0], recorded("d", scorer, "bfloat16")], tmp_path / "report").read_text()
    # Scoring versions all 1 are not recorded (`versioned`): a bump to 2 is noted against them.
    bumped = recorded("e", scorer | {"scoring_versions": {"toy_binding": 2}}, "float16")
    assert "(scorer)" in report([same[0], bumped], tmp_path / "report").read_text()
    # The question table's path is no scorer difference (its contents are compared as `questions`).
    moved = [recorded(name, scorer | {"options": {"questions": path}}, "float16")
             for name, path in (("f", "questions.json"), ("g", "/home/u/questions.json"))]
    assert "note:" not in report(moved, tmp_path / "report").read_text()
    # A plugin reward's source hash is informational (a comment edit changes it): no scorer difference.
    edited = [recorded(name, scorer | {"plugin_sources": {"toy_binding": digest}}, "float16")
              for name, digest in (("h", "a" * 64), ("i", "b" * 64))]
    assert "note:" not in report(edited, tmp_path / "report").read_text()
    # Summaries written before `results.scorer`: the judge models a benchmark's fields name are compared.
    def judged(name: str, model: str) -> Path:
        folder = evaluation(name, 150)
        summary = json.loads((folder / "summary.json").read_text())
        summary["summaries"][0]["results"]["config"]["vlm_model_name_or_path"] = model
        (folder / "summary.json").write_text(json.dumps(summary))
        return folder

    text = report([judged("qwen8b", "Qwen/Qwen3-VL-8B-Instruct"), judged("qwen2b", "Qwen/Qwen3-VL-2B-Instruct")],
                  tmp_path / "report").read_text()
    assert "(judge models)" in text
    # B-VQA's questions made by another parser (the built-in one against spaCy's): noted, whatever the image counts.
    builtin = {"source": "parser", "parser": {"name": "builtin", "version": 1}}
    spacy = {"source": "parser", "parser": {"name": "spacy", "model": "en_core_web_sm"}}
    text = report([evaluation("builtin", 150, questions=[builtin | {"images": 600}]),
                   evaluation("builtin_again", 150, questions=[builtin | {"images": 1500}]),
                   evaluation("spacy", 150, questions=[spacy | {"images": 600}])], tmp_path / "report").read_text()
    assert "(questions)" in text
    assert "(questions)" not in report([tmp_path / "builtin", tmp_path / "builtin_again"], tmp_path / "report").read_text()


def test_question_sources_recorded_in_another_order_are_one_protocol():
    from gors.report import evaluation_protocols, protocol_notes

    def protocols(questions):
        return evaluation_protocols([{"label": "mine:set", "primary_metric": "score", "score": 0.5,
                                      "questions": questions}])

    # The same parser and table, listed in another order and over other image counts: nothing to note.
    one = protocols([{"parser": "builtin", "images": 10}, {"table": "t.json", "images": 5}])
    two = protocols([{"table": "t.json", "images": 3}, {"parser": "builtin", "images": 2}])
    assert one == two and protocol_notes({"one": one, "two": two}) == []
    other = protocols([{"parser": "spacy", "images": 2}, {"table": "t.json", "images": 5}])
    assert protocol_notes({"one": one, "other": other}) == [
        "note: mine:set was measured otherwise for these checkpoints (questions): those values do not compare exactly"]


def test_report_columns_keep_names_scales_and_dotted_metrics_as_recorded(tmp_path):
    def evaluation(name: str, summary: dict) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"summaries": [summary]}))
        return folder

    nested = {"label": "mine", "primary_metric": "accuracy.binding", "accuracy": {"binding": 0.25}}
    percent = {"label": "geneval2", "primary_metric": "soft_tifa_gm", "soft_tifa_gm": 41.37,
               "results": {"metrics": {"soft_tifa_gm": {"scale": "x100"}}}}
    missing = {"label": "mine", "primary_metric": "accuracy.binding", "accuracy": None}
    text = report([evaluation("7.5", nested), evaluation("0500", percent), evaluation("none", missing)],
                  tmp_path / "report").read_text()
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ")}
    assert rows["checkpoint"] == ["geneval2 (x100)", "mine"]  # the scale in the header of values in x100
    assert rows["7.5"] == ["-", "0.2500"] and rows["0500"] == ["41.3700", "-"]  # names as written
    assert rows["none"] == ["-", "-"]  # a folder whose summary holds no value is a row, not dropped
    # A GenEval 2 summary written before the results block: its benchmark declares the scale.
    old = {"label": "geneval2", "primary_metric": "soft_tifa_gm", "soft_tifa_gm": 40.0}
    text = report([evaluation("old", old), tmp_path / "0500"], tmp_path / "report").read_text()
    assert [line for line in text.splitlines() if line.startswith("| checkpoint")] == [
        "| checkpoint   |   geneval2 (x100) |"]


def test_the_summaries_of_an_evaluation_and_of_one_benchmarks_folder(tmp_path):
    from gors.report import column_scale, evaluation_protocols, summary_folders

    # `gors evaluate`'s file: the LoRA dropout it records once goes with each summary that records none itself.
    (tmp_path / "summary.json").write_text(json.dumps({"lora_dropout": 0.1, "benchmark": "not read", "summaries": [
        {"label": "toy:held_out", "primary_metric": "binding_accuracy"},
        {"label": "t2i_compbench:color", "primary_metric": "b_vqa", "lora_dropout": 0.2}]}))
    assert [(summary["lora_dropout"], folder) for summary, folder in summary_folders(tmp_path)] == [
        (0.1, tmp_path / "toy" / "held_out"), (0.2, tmp_path / "t2i_compbench" / "color")]
    # One benchmark's own folder (the toy demo's eval_base/): the label its subset gives it.
    own = tmp_path / "eval_base"
    own.mkdir()
    (own / "summary.json").write_text(json.dumps({"benchmark": "toy", "split": "held_out", "binding_accuracy": 0.5}))
    [(summary, folder)] = summary_folders(own)
    assert (summary["label"], summary["primary_metric"], folder) == ("toy:held_out", "binding_accuracy", own)
    # A scale the results block records wins over the benchmark's declared one.
    assert column_scale({"label": "geneval2", "primary_metric": "soft_tifa_gm",
                         "results": {"metrics": {"soft_tifa_gm": {"scale": "[0, 1]"}}}}) == "[0, 1]"
    # No judge model among the recorded settings: none is compared (a summary of an older gors recorded none).
    [protocol] = evaluation_protocols([{"label": "toy:held_out", "primary_metric": "binding_accuracy",
                                        "results": {"config": {"seed": 0}}}]).values()
    assert "judge models" not in protocol


def test_a_folder_with_nothing_to_report_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="nor TensorBoard logs nor the rounds.json of a --rounds run"):
        report([tmp_path / "empty"], tmp_path / "report")
    with pytest.raises(FileNotFoundError, match=r"missing: no such folder \(give `gors evaluate`"):
        report([tmp_path / "missing"], tmp_path / "report")
    (tmp_path / "empty" / "summary.json").write_text('{"summaries": []}')
    with pytest.raises(ValueError, match=r"empty/summary.json lists no benchmark \(its 'summaries' list is empty\)"):
        report([tmp_path / "empty"], tmp_path / "report")
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"summary.json: a file, not a folder \(give `gors evaluate`"):
        report([tmp_path / "summary.json"], tmp_path / "report")


def _loss_steps(folder: Path) -> list[int]:
    return [step for step, _ in load_scalars(folder)["train/loss"]]


def test_the_curves_show_one_training_a_resumed_one_joined(selected_run, tmp_path):
    from dataclasses import replace

    from gors.core.distributed import reset_process_state
    from gors.train import train

    run = tmp_path / "run"
    run.mkdir()
    for name in ("samples", "scores"):
        shutil.copytree(Path(selected_run.output_dir) / name, run / name)
    shutil.copy(Path(selected_run.output_dir) / "selection.jsonl", run)
    config = replace(selected_run, output_dir=str(run), max_train_steps=3, checkpointing_steps=1,
                     report_to="tensorboard")
    train(config)
    reset_process_state()
    # Another training sets the first one's checkpoints aside, and its logs with them.
    other = replace(config, rank=8, max_train_steps=2)
    train(other)
    reset_process_state()
    assert _loss_steps(run) == [1, 2]  # not steps 1-2 of this training joined to step 3 of the other
    assert _loss_steps(run / "checkpoints.previous-1") == [1, 2, 3]
    train(replace(other, max_train_steps=3))  # the same training, resumed from its checkpoint-2
    reset_process_state()
    assert _loss_steps(run) == [1, 2, 3]


def test_a_curve_longer_than_tensorboards_default_sample_keeps_every_step(tmp_path):
    """TensorBoard's reader keeps 10 000 points per tag unless told otherwise: a 15 000-step run's loss
    lost a third of its steps at random."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "logs" / "gors"))
    for step in range(10_050):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.close()
    assert _loss_steps(tmp_path) == list(range(10_050))
