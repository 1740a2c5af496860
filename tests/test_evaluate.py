"""`gors evaluate`: benchmark specs, folders, summaries, resume and bad input (toy benchmark, packaged model)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from PIL import Image

from evaluators import build_benchmark, parse_benchmarks
from gors.cli import main, parse_config
from gors.config import EvaluateConfig
from gors.core.distributed import make_accelerator
from gors.core.fingerprints import local_fingerprint
from gors.core.store import StoreError
from gors.core.toy import PRETRAINED_DIR
from gors.evaluate import drop_unneeded, evaluate
from rewards.combined import build_reward

TOY_MODEL = str(PRETRAINED_DIR / "pipeline")


def cells(line: str) -> list[str]:
    """The cells of one markdown table line, without their padding."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_benchmark_specs():
    assert parse_benchmarks("geneval") == [("geneval", None)]
    assert parse_benchmarks("t2i_compbench:color,shape, geneval") == [
        ("t2i_compbench", "color"), ("t2i_compbench", "shape"), ("geneval", None)]
    everything = parse_benchmarks("all")
    assert ("t2i_compbench", "numeracy") in everything and ("t2i_compbench", "3d_spatial") in everything
    assert [b for b, _ in everything].count("t2i_compbench") == 8 and ("lpg_bench", None) in everything
    assert parse_benchmarks("toy,toy") == [("toy", None)]
    # Its default subset named or not is one benchmark, evaluated once under the first spelling.
    assert parse_benchmarks("toy,toy:held_out") == [("toy", None)]
    assert parse_benchmarks("toy:held_out,toy,toy:train") == [("toy", "held_out"), ("toy", "train")]
    for bad in ("", "genevel", "color"):
        with pytest.raises(ValueError, match="--benchmarks"):
            parse_benchmarks(bad)


def test_subsets_and_quick_run_sizes_reach_the_benchmark():
    benchmark = build_benchmark("toy", "train", max_prompts=5, images_per_prompt=None)
    assert benchmark.split == "train" and benchmark.images_per_prompt == 4 and len(benchmark.prompts()) <= 5
    with pytest.raises(ValueError, match="split"):
        build_benchmark("toy", "heldout").prompts()


def test_evaluate_writes_one_folder_per_benchmark_and_resumes(tmp_path, capsys, monkeypatch):
    import evaluators.base

    built = []
    monkeypatch.setattr(evaluators.base, "build_reward",
                        lambda name, **kwargs: built.append(name) or build_reward(name, **kwargs))
    argv = ["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy,toy:train",
            "--max_prompts", "3", "--num_inference_steps", "2", "--images_per_prompt", "1", "--output_dir",
            str(tmp_path)]
    main(argv)
    assert built == ["toy_oracle"]  # both splits score with one oracle
    out = capsys.readouterr().out
    table = [cells(line) for line in out.splitlines() if line.startswith("|")]
    assert table[0] == ["benchmark", "metric", "value", "scale", "further columns, in [0, 1]"]
    assert [row[:2] for row in table[2:]] == [["toy:held_out", "binding_accuracy"], ["toy:train", "binding_accuracy"]]
    combined = json.loads((tmp_path / "summary.json").read_text())
    assert [s["label"] for s in combined["summaries"]] == ["toy:held_out", "toy:train"]
    for row, summary in zip(table[2:], combined["summaries"]):
        assert row[2:4] == [f"{summary['binding_accuracy']:.4f}", "[0, 1]"]
    for split in ("held_out", "train"):
        rows = [json.loads(line) for line in (tmp_path / "toy" / split / "results.jsonl").open()]
        assert len(rows) == 3 and all({"score", "correct", "reason", "details"} <= row.keys() for row in rows)
        assert all(row["correct"] == (row["reason"] == "") for row in rows)
    main(argv)  # everything exists: nothing is generated or scored again
    assert "0 to generate" in capsys.readouterr().out
    # One benchmark again: the folder's summary keeps the other's results (they are of the same model and LoRA).
    main([*argv[:4], "toy:train", *argv[5:]])
    assert "summary.json keeps the earlier results of toy:held_out (3 prompts x 1 image)" in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text()) == combined
    # More images, and the run stopped in its second benchmark: the folder's summary already holds the first's new
    # results, as its own folder does, not the numbers of before.
    evaluate_benchmark = evaluators.base.Benchmark.evaluate

    def stopped_in_train(self, model, output_dir, *args, **kwargs):
        if Path(output_dir).name == "train":
            raise KeyboardInterrupt
        return evaluate_benchmark(self, model, output_dir, *args, **kwargs)

    monkeypatch.setattr(evaluators.base.Benchmark, "evaluate", stopped_in_train)
    with pytest.raises(SystemExit):
        main([*argv[:-4], "--images_per_prompt", "2", *argv[-2:]])
    monkeypatch.undo()
    entries = {e["label"]: e for e in json.loads((tmp_path / "summary.json").read_text())["summaries"]}
    held_out = json.loads((tmp_path / "toy" / "held_out" / "summary.json").read_text())
    assert entries["toy:held_out"]["results"]["samples"] == held_out["results"]["samples"]
    assert held_out["results"]["samples"]["images_per_prompt"] == 2 and entries["toy:train"] == combined["summaries"][1]
    # Another --max_prompts is another subset of the prompts (every n-th): refused, naming that flag.
    with pytest.raises(SystemExit):
        main([*argv[:-4], "--max_prompts", "5", *argv[-2:]])
    assert "Use a new --output_dir, or the --max_prompts that made it." in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, message",
    [({"images": "somewhere", "benchmarks": "toy,toy:train"}, "name exactly one"),
     ({"scorer_options": '{"geneval": {}}'}, "not among the benchmarks"),
     ({"benchmarks": "toy,toy:nope"}, r"toy split 'nope'; choose one of train, held_out, ")],
)
def test_bad_evaluate_input(tmp_path, overrides, message):
    values = {"benchmarks": "toy", "output_dir": str(tmp_path), **overrides}
    with pytest.raises(ValueError, match=message):
        evaluate(EvaluateConfig(**values))
    assert not (tmp_path / "toy").exists()  # refused before the first benchmark generates


def test_images_folder_for_a_benchmark_without_an_official_layout(tmp_path):
    (tmp_path / "images").mkdir()
    config = parse_config(EvaluateConfig, ["--benchmarks", "toy", "--images", str(tmp_path / "images"),
                                           "--output_dir", str(tmp_path / "out")])
    # Refused before any work, naming the benchmarks that do read a folder.
    with pytest.raises(ValueError, match="toy cannot read an image folder; use --images with geneval, geneval2, "
                                         "t2i_compbench"):
        evaluate(config)
    assert not (tmp_path / "out").exists()


def test_lora_with_images_is_refused_before_any_work(tmp_path):
    (tmp_path / "images").mkdir()
    config = parse_config(EvaluateConfig, ["--benchmarks", "t2i_compbench:color", "--images", str(tmp_path / "images"),
                                           "--lora", str(tmp_path), "--output_dir", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="--lora=.* with --images: existing images are scored as they are; drop"):
        evaluate(config)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make, message", [(lambda path: None, "no such file or folder"),
                                           (lambda path: path.mkdir(), "is not a LoRA folder")])
def test_a_missing_or_non_lora_folder_is_refused_before_any_store_is_written(tmp_path, make, message):
    make(tmp_path / "lora")
    config = parse_config(EvaluateConfig, ["--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy",
                                           "--lora", str(tmp_path / "lora"), "--output_dir", str(tmp_path / "out")])
    with pytest.raises(FileNotFoundError, match=message):
        evaluate(config)
    assert not (tmp_path / "out").exists()


def test_report_tables_and_plots_evaluations_and_training_runs(tmp_path):
    from gors.report import markdown_table, report

    table = [cells(line) for line in markdown_table({"mine": {"t2i_compbench:color": 0.61, "toy:train": 0.5}})
             .splitlines()]
    assert table[0] == ["checkpoint", "t2i_compbench:color", "toy:train"]
    assert table[2] == ["mine", "0.6100", "0.5000"]
    assert table[3] == ["*SD-2-base (T2I-CompBench paper)*", "0.5065", "-"]
    assert table[4][0] == "*GORS (T2I-CompBench paper)*"

    evaluation = tmp_path / "eval_a"
    evaluation.mkdir()
    (evaluation / "summary.json").write_text(json.dumps({"summaries": [
        {"label": "toy:held_out", "primary_metric": "binding_accuracy", "binding_accuracy": 0.25}]}))
    run = tmp_path / "run_b"
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(run / "logs" / "gors")) as writer:
        for step in (1, 2, 3):
            writer.add_scalar("train/loss", 1.0 / step, step)
            writer.add_scalar("validation/toy:train/binding_accuracy", 0.1 * step, step)
    path = report([evaluation, run], tmp_path / "report")
    text = path.read_text()
    assert ["eval_a", "0.2500"] in [cells(line) for line in text.splitlines() if line.startswith("|")]
    assert "training_curves.png" in text
    assert (tmp_path / "report" / "benchmarks.png").stat().st_size > 0
    assert (tmp_path / "report" / "training_curves.png").stat().st_size > 0
    with pytest.raises(ValueError, match="neither a summary.json"):
        report([tmp_path / "report"], tmp_path / "other")
    # Two folders of one name (each run's eval/) keep a row each, named by the tail that tells them apart.
    for run_name, value in (("runA", 0.25), ("runB", 0.75)):
        folder = tmp_path / run_name / "eval"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"summaries": [
            {"label": "toy:held_out", "primary_metric": "binding_accuracy", "binding_accuracy": value}]}))
    rows = [cells(line) for line in report([tmp_path / "runA" / "eval", tmp_path / "runB" / "eval"],
                                           tmp_path / "both").read_text().splitlines() if line.startswith("|")]
    assert ["runA/eval", "0.2500"] in rows and ["runB/eval", "0.7500"] in rows
    with pytest.raises(ValueError, match="a folder is given twice"):
        report([evaluation, evaluation], tmp_path / "twice")


def test_the_papers_table_2_is_shown_as_published():
    from gors.core.paper import PUBLISHED

    # T2I-CompBench (NeurIPS 2023), Table 2: colour, shape, texture, spatial, non-spatial, complex.
    categories = ["color", "shape", "texture", "spatial", "non_spatial", "complex"]
    assert {name: [row[f"t2i_compbench:{c}"] for c in categories] for name, row in PUBLISHED.items()} == {
        "SD-2-base (T2I-CompBench paper)": [0.5065, 0.4221, 0.4922, 0.1342, 0.3096, 0.3386],
        "GORS (T2I-CompBench paper)": [0.6603, 0.4785, 0.6287, 0.1815, 0.3193, 0.3328],
    }


def test_dropping_the_score_of_an_image_generated_again_keeps_the_rows_of_samples_not_asked_for(tmp_path):
    """When a score folder drops the rows of images generated again, rows of samples not asked for now stay on disk."""
    from gors.core.distributed import make_accelerator
    from gors.core.io import append_jsonl, read_jsonl
    from gors.core.scoring import open_score_folder

    def record(p, digest):
        return {"prompt_index": p, "image_index": 0, "prompt": f"prompt {p}", "path": f"{p}.png", "image_sha256": digest}

    folder = tmp_path / "scores"
    append_jsonl(folder / "part-00000.jsonl", [record(p, d) | {"reward": 0.5, "details": {}} for p, d in enumerate("abc")])
    accelerator = make_accelerator()
    assert list(open_score_folder(folder, [record(0, "a"), record(1, "new")], accelerator)) == [(0, 0)]
    assert [row["prompt_index"] for row in read_jsonl(folder / "part-00000.jsonl")] == [0, 2]  # 1's old image's row gone
    later = [record(0, "a"), record(1, "new"), record(2, "c")]  # prompt 2 asked for again: its score is still there
    assert sorted(open_score_folder(folder, later, accelerator)) == [(0, 0), (2, 0)]


def test_opening_a_score_folder_cuts_a_torn_row_in_a_part_no_process_appends_to_now(tmp_path):
    """A torn last row in another process's score part is cut when the folder is opened, not left torn on disk."""
    from gors.core.distributed import make_accelerator
    from gors.core.io import append_jsonl
    from gors.core.scoring import open_score_folder

    records = [{"prompt_index": p, "image_index": 0, "prompt": f"prompt {p}", "path": f"{p}.png"} for p in range(2)]
    folder = tmp_path / "scores"
    append_jsonl(folder / "part-00001.jsonl", [records[0] | {"reward": 0.5, "details": {}}])
    with open(folder / "part-00001.jsonl", "a") as part:
        part.write('{"prompt_index": 1, "image_index": 0, "pro')  # a kill while process 1 wrote
    assert list(open_score_folder(folder, records, make_accelerator())) == [(0, 0)]
    assert (folder / "part-00001.jsonl").read_text().endswith('"details": {}}\n')


def test_a_reward_sees_each_images_record_over_its_prompts_metadata_row(tmp_path):
    """The metadata a reward gets per image is its prompt's row with the store record's fields winning where both have one."""
    from types import SimpleNamespace

    from gors.core.scoring import score_rows

    seen = []

    def score(images, prompts, metadata=None):
        seen.extend(metadata)
        return SimpleNamespace(scores=[0.5] * len(images), details=[{} for _ in images])

    record = {"prompt_index": 1, "image_index": 0, "prompt": "a cat", "path": "1.png", "seed": 3}
    rows = [{"tag": "one"}, {"tag": "two", "path": "elsewhere.png", "seed": 0}]
    score_rows(SimpleNamespace(score=score), [record], [Image.new("RGB", (8, 8))], rows)
    assert seen == [{"tag": "two", "path": "1.png", "seed": 3, "prompt_index": 1, "image_index": 0, "prompt": "a cat"}]


def test_scores_of_another_run_are_refused_and_unasked_ones_left_out(tmp_path):
    from gors.core.distributed import make_accelerator
    from gors.core.io import append_jsonl
    from gors.core.scoring import score_samples
    from rewards import RewardOutput

    class Samples:
        def __init__(self, prompts):
            self.prompts = prompts

        def records(self):
            return [{"prompt_index": p, "image_index": 0, "prompt": t, "path": f"{p}.png"}
                    for p, t in enumerate(self.prompts)]

    folder = tmp_path / "scores"
    append_jsonl(folder / "part-00000.jsonl", [
        {"prompt_index": 0, "image_index": 0, "prompt": "a red circle", "path": "0.png", "reward": 1.0, "details": {}},
        {"prompt_index": 1, "image_index": 0, "prompt": "a blue square", "path": "1.png", "reward": 0.0, "details": {}},
    ])
    accelerator = make_accelerator()
    never = lambda: pytest.fail("nothing is left to score")  # noqa: E731
    rows = score_samples(Samples(["a red circle"]), folder, never, 1, accelerator)
    assert list(rows) == [(0, 0)]  # the score of prompt 1, not asked for now, stays out of the results
    with pytest.raises(StoreError, match="belongs to another run"):
        score_samples(Samples(["a green triangle"]), folder, lambda: RewardOutput([0.5]), 1, accelerator)


def test_scores_of_other_scorer_settings_are_refused(tmp_path, capsys):
    argv = ["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy", "--max_prompts", "2",
            "--images_per_prompt", "1", "--output_dir", str(tmp_path)]
    main(argv)
    settings = json.loads((tmp_path / "toy" / "held_out" / "scores" / "settings.json").read_text())
    assert settings == {"reward": "toy_oracle", "options": {}, "dtype": "float32"}  # CPU: float32
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # an expected error: one line, exit 2
        main(argv + ["--scorer_options", '{"toy": {"checks": "all"}}'])
    assert exit_info.value.code == 2
    assert re.search(r'^error: .*holds scores made with other settings than asked for now \(options: \{\} -> '
                     r'\{"checks": "all"\}\)', capsys.readouterr().err, re.M)


def test_old_toy_scores_without_a_binding_verdict_are_a_clear_error():
    row = {"prompt": "a red circle", "details": {"correct": True, "reasons": []}}
    with pytest.raises(ValueError, match="older toy_oracle. Delete the scores/ folder"):
        build_benchmark("toy").judge(row)


def test_scorers_are_shared_only_with_equal_options_and_dropped_when_no_longer_needed(tmp_path, monkeypatch):
    import evaluators.base

    built = []
    monkeypatch.setattr(evaluators.base, "build_reward",
                        lambda name, **kwargs: built.append((name, kwargs["options"])) or build_reward(name, **kwargs))
    main(["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy,toy:train",
          "--max_prompts", "2", "--images_per_prompt", "1", "--num_inference_steps", "2", "--output_dir", str(tmp_path),
          "--scorer_options", '{"toy:train": {"checks": "all"}}'])
    assert built == [("toy_oracle", {}), ("toy_oracle", {"checks": "all"})]
    # A scorer is shared at its own batch size only: another size loads one of its own.
    toy, accelerator, cache = build_benchmark("toy"), make_accelerator(), {}
    small, large = (toy.make_scorer(accelerator, batch_size=size, cache=cache) for size in (2, 8))
    assert small is not large and (small.batch_size, large.batch_size) == (2, 8)
    assert toy.make_scorer(accelerator, batch_size=2, cache=cache) is small
    cache = {"a": object(), "b": object()}
    drop_unneeded(cache, {"b", "c"})
    assert list(cache) == ["b"]


def test_columns_flag_adds_optional_columns_where_a_benchmark_has_them(tmp_path):
    from gors.evaluate import extra_columns

    color, toy = build_benchmark("t2i_compbench", "color"), build_benchmark("toy")
    assert extra_columns(EvaluateConfig(), [color, toy]) == [[], []]  # default: today's columns only
    assert extra_columns(EvaluateConfig(columns="none"), [color, toy]) == [[], []]
    assert extra_columns(EvaluateConfig(columns="all"), [color, toy]) == [["MLLM-CoT"], []]
    config = parse_config(EvaluateConfig, ["--benchmarks", "t2i_compbench:color,toy", "--columns", "MLLM-CoT"])
    assert config.extra_columns == ["MLLM-CoT"]
    assert extra_columns(config, [color, toy]) == [["MLLM-CoT"], []]
    # The scorers kept loaded between benchmarks: the main one, the columns', and without columns the main one only.
    accelerator = make_accelerator()
    assert len(color.scorer_keys(accelerator)) == 1 + len(color.columns())
    assert len(color.scorer_keys(accelerator, extra_columns=["MLLM-CoT"])) == 2 + len(color.columns())
    assert len(color.scorer_keys(accelerator, extra_columns=["MLLM-CoT"], with_columns=False)) == 1
    with pytest.raises(ValueError, match="--columns"):
        EvaluateConfig(columns=" , ")
    # A column no benchmark evaluated has is refused before anything is generated.
    with pytest.raises(ValueError, match=r"no benchmark evaluated has the optional column\(s\) \['MLLM-CoT'\]"):
        evaluate(EvaluateConfig(benchmarks="toy", columns="MLLM-CoT", output_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())
    # From the command line too: checked before the folder is locked, so a refusal leaves no lock file (which
    # under several processes kept a folder holding nothing else).
    from gors.cli import main

    with pytest.raises(SystemExit):
        main(["evaluate", "--benchmarks", "toyy", "--output_dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())
    # A default column is not "absent": it is computed without the flag.
    with pytest.raises(ValueError, match=r"--columns='B-CLIP': B-CLIP is computed by default \(without --columns "
                                         r"none\); --columns adds optional columns: MLLM-CoT$"):
        extra_columns(EvaluateConfig(columns="B-CLIP"), [color, toy])


def test_columns_none_skips_the_default_columns(tmp_path, monkeypatch):
    import evaluators.base

    calls = []
    original = evaluators.base.Benchmark.evaluate
    monkeypatch.setattr(evaluators.base.Benchmark, "evaluate",
                        lambda self, *args, **kwargs: calls.append(kwargs) or original(self, *args, **kwargs))
    for columns in ("none", "default"):
        evaluate(EvaluateConfig(pretrained_model_name_or_path=TOY_MODEL, benchmarks="toy", max_prompts=2,
                                images_per_prompt=1, num_inference_steps=2, output_dir=str(tmp_path / columns),
                                columns=columns))
    assert [(c["with_columns"], c["extra_columns"]) for c in calls] == [(False, []), (True, [])]


def test_sampling_flags_replace_the_protocols_and_are_recorded(tmp_path, capsys):
    """A distilled checkpoint (SDXL-Turbo: a few steps, no guidance, 512 px) is evaluated at its own settings."""
    main(["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy", "--max_prompts", "2",
          "--images_per_prompt", "1", "--num_inference_steps", "3", "--guidance_scale", "0", "--resolution", "48",
          "--output_dir", str(tmp_path)])
    assert ("note: --num_inference_steps 3, --guidance_scale 0.0, --resolution 48 in place of the benchmarks' "
            "protocols") in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())["summaries"][0]
    config = summary["results"]["config"]
    assert (config["num_inference_steps"], config["guidance_scale"], config["resolution"]) == (3, 0.0, 48)
    import torch
    import transformers

    libraries = summary["results"]["libraries"]  # what made and scored the images, for comparing runs
    assert libraries["torch"] == torch.__version__.split("+")[0] and libraries["transformers"] == transformers.__version__
    with Image.open(next((tmp_path / "toy" / "held_out" / "samples").rglob("*.png"))) as image:
        assert image.size == (48, 48)
    with pytest.raises(SystemExit, match=r"--resolution=50: use a multiple of 8"):
        parse_config(EvaluateConfig, ["--resolution", "50"])
    # Images made elsewhere are scored as they are: no sampling values to record for them.
    with pytest.raises(ValueError, match=r"^--num_inference_steps with --images: existing images are scored as they "
                                         r"are; drop --num_inference_steps"):
        evaluate(EvaluateConfig(benchmarks="toy", images=str(tmp_path), num_inference_steps=3,
                                output_dir=str(tmp_path / "external")))


def test_score_folder_from_before_the_dtype_was_recorded_resumes(tmp_path, capsys, caplog):
    argv = ["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy", "--max_prompts", "2",
            "--images_per_prompt", "1", "--output_dir", str(tmp_path)]
    main(argv)
    settings = tmp_path / "toy" / "held_out" / "scores" / "settings.json"
    settings.write_text(json.dumps({"reward": "toy_oracle", "options": {}}))  # as an older gors wrote it
    main(argv)  # no error: a missing dtype is adopted, said and recorded
    assert "scored before gors recorded the scorer's dtype" in caplog.text
    assert json.loads(settings.read_text()) == {"reward": "toy_oracle", "options": {}, "dtype": "float32"}
    settings.write_text(json.dumps({"reward": "toy_oracle", "options": {"other": 1}}))
    with pytest.raises(SystemExit):  # an older folder with other settings is still refused
        main(argv)
    assert "holds scores made with" in capsys.readouterr().err
    capsys.readouterr()
    settings.write_text(json.dumps({"reward": "toy_oracle", "options": {}, "dtype": "bfloat16"}))
    with pytest.raises(SystemExit):
        main(argv)
    assert "holds scores made with" in capsys.readouterr().err


def test_scorers_run_in_their_benchmarks_dtype_on_cuda_and_in_float32_on_cpu():
    import torch

    from evaluators.base import scorer_dtype, scorer_key

    class Fake:
        def __init__(self, device, mixed_precision):
            self.device, self.mixed_precision = torch.device(device), mixed_precision

    gpu = Fake("cuda", "fp16")
    assert scorer_dtype("soft_tifa", gpu) == torch.bfloat16  # GenEval 2 loads Qwen3-VL in bf16
    assert scorer_dtype("vqascore", gpu) == scorer_dtype("tifa", gpu) == torch.bfloat16
    assert scorer_dtype("tit_score", gpu) == torch.bfloat16
    assert scorer_dtype("clip_score", Fake("cuda", "no")) == torch.float16  # clip.load keeps fp16 on a GPU
    assert scorer_dtype("toy_oracle", gpu) == torch.float16  # no official dtype: the generation precision
    assert scorer_dtype("soft_tifa", Fake("cpu", "fp16")) == torch.float32
    assert scorer_key("soft_tifa", {}, 8, gpu)[-1] == "torch.bfloat16"
    # The official scripts run BLIP and GenEval's Mask2Former in float32; the UniDet rules' detectors (other
    # models than the official scripts' UniDet, which runs under fp16 autocast) and 3-in-1 score in float32 too.
    assert {scorer_dtype(name, gpu) for name in ("b_vqa", "geneval", "spatial_rule", "spatial_3d", "numeracy",
                                                 "three_in_one")} == {torch.float32}


def test_training_rewards_run_in_the_generation_precision_but_never_a_bf16_model_in_fp16():
    import torch

    from rewards.combined import member_dtypes, reward_dtype

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert reward_dtype("b_vqa", cuda, torch.float16, benchmark=False) == torch.float16  # no published number to meet
    assert reward_dtype("clip_score", cuda, torch.bfloat16, benchmark=False) == torch.bfloat16
    for name in ("soft_tifa", "tifa", "vqascore", "tit_score", "mllm_cot"):  # Qwen3-VL, trained in bf16
        assert reward_dtype(name, cuda, torch.float16, benchmark=False) == torch.bfloat16
        assert reward_dtype(name, cuda, torch.float32, benchmark=False) == torch.float32
    # A list is given the generation precision; its bfloat16-trained members move to bfloat16 alone.
    assert reward_dtype("soft_tifa:0.5,clip_score:0.5", cuda, torch.float16, benchmark=False) == torch.float16
    assert member_dtypes("soft_tifa:0.5,clip_score:0.5", torch.float16) == {"soft_tifa": torch.bfloat16,
                                                                            "clip_score": torch.float16}
    assert reward_dtype("b_vqa:0.5,clip_score:0.5", cuda, torch.float16, benchmark=False) == torch.float16
    assert reward_dtype("soft_tifa", cpu, torch.float16, benchmark=False) == torch.float32


def test_an_evaluation_scores_its_own_number_of_images_per_prompt(tmp_path, caplog):
    # A folder an earlier evaluation filled with 2 images per prompt, evaluated again at 1: the official
    # scripts score a fixed number per prompt, so the second summary counts 1 per prompt, not 2.
    argv = ["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy", "--max_prompts", "2",
            "--output_dir", str(tmp_path)]
    main(argv + ["--images_per_prompt", "2"])
    main(argv + ["--images_per_prompt", "1"])
    folder = tmp_path / "toy" / "held_out"
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert sorted((r["prompt_index"], r["image_index"]) for r in rows) == [(0, 0), (1, 0)]
    results = json.loads((folder / "summary.json").read_text())["results"]["samples"]
    assert (results["images"], results["images_per_prompt"]) == (2, 1)
    assert "the evaluation scores the first --images_per_prompt of each prompt" in caplog.text


def test_score_folders_record_scoring_versions_and_refuse_older_scores(tmp_path):
    from evaluators.base import scorer_settings
    from gors.core.scoring import check_settings
    from gors.core.store import StoreError

    assert scorer_settings("clip_score", {}) == {"reward": "clip_score", "options": {}}  # version 1: none recorded
    settings = scorer_settings("b_vqa:0.5,spatial_rule:0.5", {})
    # B-VQA's BLIP resize, eps and quotient; the spatial rule's UniDet rule, token-mean labels, official nouns,
    # UniDet's label space
    assert settings["scoring_versions"] == {"b_vqa": 2, "spatial_rule": 5}
    (tmp_path / "settings.json").write_text(json.dumps({"reward": "b_vqa:0.5,spatial_rule:0.5", "options": {}}))
    with pytest.raises(StoreError, match="delete .* to score again"):  # scored with the 0.5 threshold
        check_settings(tmp_path, settings, scored=True)


def test_gors_score_records_its_rewards_scoring_versions(tmp_path):
    """The settings `gors score` records hold each reward's scoring_version, so that scores of an older one are refused."""
    from gors.config import ScoreConfig
    from gors.score import score_settings

    reward = "b_vqa:0.5,spatial_rule:0.5"
    settings = score_settings(ScoreConfig(output_dir=str(tmp_path)), make_accelerator(), reward)
    assert settings["scoring_versions"] == {"b_vqa": 2, "spatial_rule": 5}
    assert "scoring_versions" not in score_settings(ScoreConfig(output_dir=str(tmp_path)), make_accelerator(),
                                                    "clip_score")  # version 1: none recorded


def test_gors_score_records_the_reward_model_it_was_given(tmp_path):
    """The settings `gors score` records name --reward_model_name_or_path, so that scores of another model are refused."""
    from gors.config import ScoreConfig
    from gors.score import score_settings

    config = ScoreConfig(output_dir=str(tmp_path), reward_model_name_or_path=str(tmp_path / "blip"))
    assert score_settings(config, make_accelerator(), "b_vqa")["model_name_or_path"] == str(tmp_path / "blip")


def test_the_score_stages_reward_is_built_with_the_configs_model_options_and_batch_size(tmp_path, monkeypatch):
    """gors score builds its reward with --reward_model_name_or_path, --reward_options and --reward_batch_size."""
    import gors.score
    from gors.config import ScoreConfig

    built = []
    monkeypatch.setattr(gors.score, "build_reward", lambda reward, **kwargs: built.append((reward, kwargs)))
    config = ScoreConfig(output_dir=str(tmp_path), reward_model_name_or_path=str(tmp_path / "blip"),
                         reward_options={"max_questions": 1}, reward_batch_size=3)
    gors.score.reward_builder(config, make_accelerator(), "b_vqa")()
    [(reward, kwargs)] = built
    assert reward == "b_vqa" and kwargs["model_name_or_path"] == str(tmp_path / "blip")
    assert kwargs["options"] == {"max_questions": 1} and kwargs["batch_size"] == 3


def test_scores_without_a_record_of_their_settings_are_taken_with_a_warning(tmp_path, caplog):
    from gors.core.scoring import check_settings

    settings = {"reward": "toy_oracle", "options": {"checks": "all"}}
    assert check_settings(tmp_path, settings, scored=False) is True and not caplog.records  # nothing scored yet
    assert check_settings(tmp_path, settings, scored=True) is True  # scored, the settings file deleted
    assert (f"{tmp_path} holds scores but no record of the scorer settings that made them (an older gors, or the "
            "file deleted); they are taken to have been made with the current ones") in caplog.text


def test_an_option_no_scorer_takes_is_refused_before_any_image(tmp_path):

    config = EvaluateConfig(pretrained_model_name_or_path=TOY_MODEL, benchmarks="toy", max_prompts=2,
                            images_per_prompt=1, output_dir=str(tmp_path), scorer_options={"toy": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"--scorer_options: toy:held_out's scorer 'toy_oracle' has no option 'bogus'"):
        evaluate(config)
    assert not list(tmp_path.rglob("*.png"))


def test_a_bad_option_value_is_refused_before_any_image_naming_scorer_options(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--pretrained_model_name_or_path", TOY_MODEL, "--benchmarks", "toy", "--max_prompts", "2",
              "--output_dir", str(tmp_path), "--scorer_options", '{"toy": {"checks": "al"}}'])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: --scorer_options: toy:held_out's scorer 'toy_oracle': checks='al'; choose")
    assert "--reward_options" not in error
    assert not list(tmp_path.rglob("*.png")) and not (tmp_path / "toy").exists()


def test_an_image_folder_that_is_not_the_benchmarks_set_is_refused(tmp_path):
    from pathlib import Path

    from evaluators.base import BenchmarkPrompt, ImageEntry, ImageFolderSamples, check_complete

    entries = [ImageEntry(p, i, tmp_path / f"{p}_{i}.png") for p in range(2) for i in range(2)]
    check_complete(entries, 2, 2, tmp_path)  # exactly the set: accepted
    with pytest.raises(ValueError, match=r"expected 2 prompts x 2 images, found 3; 1 missing \(first: prompt 1, "
                                         r"image 1\). Complete the folder"):
        check_complete(entries[:3], 2, 2, tmp_path)
    with pytest.raises(ValueError, match=r"1 not in the benchmark \(first: prompt 2, image 0\)"):
        check_complete([*entries, ImageEntry(2, 0, tmp_path / "2_0.png")], 2, 2, tmp_path)
    with pytest.raises(StoreError, match=r"lists one \(prompt, image\) twice"):
        ImageFolderSamples([entries[0], entries[0]], [BenchmarkPrompt("a"), BenchmarkPrompt("b")])
    (tmp_path / "0_0.png").symlink_to(tmp_path / "moved.png")  # a file listed that cannot be read: named, with the fix
    with pytest.raises(StoreError, match=r"0_0.png cannot be read \(No such file or directory\); fix its permissions "
                                         r"or remove it"):
        ImageFolderSamples(entries[:1], [BenchmarkPrompt("a")])
    benchmark = build_benchmark("toy", max_prompts=1)
    with pytest.raises(ValueError, match="give a model .* or an image folder"):
        benchmark.evaluate(None, Path(tmp_path / "out"), accelerator=make_accelerator())


def test_evaluate_from_python_refuses_what_its_arguments_cannot_mean_before_any_work(tmp_path, monkeypatch):
    """LoRA dropout applies only to a pipeline `evaluate` loads, not to one `pipeline_loader` gives (validation's,
    during training) nor to images read from a folder; options of a column the benchmark lacks are refused also
    where a loaded `scorer` is given (and the scorers' own checks are skipped); an image folder that is none is
    named."""
    benchmark, accelerator = build_benchmark("toy", max_prompts=1), make_accelerator()
    for given in ({"pipeline_loader": lambda: None}, {"images": tmp_path}):
        with pytest.raises(ValueError, match="lora_dropout applies to the pipeline evaluate loads, not to one given"):
            benchmark.evaluate(None, tmp_path / "out", accelerator=accelerator, lora_dropout=0.1, **given)
    with pytest.raises(ValueError, match=r"options for columns \['B-CLIP'\] of toy, which has \[\]"):
        benchmark.evaluate(None, tmp_path / "out", accelerator=accelerator, pipeline_loader=lambda: None,
                           scorer=object(), column_options={"B-CLIP": {}})
    monkeypatch.setattr(type(benchmark), "read_images", lambda self, folder: [])  # a benchmark that reads folders
    with pytest.raises(FileNotFoundError, match=r"--images .*nosuch: no such folder"):
        benchmark.evaluate(None, tmp_path / "out", accelerator=accelerator, images=tmp_path / "nosuch", scorer=object())
    assert not (tmp_path / "out").exists()


def test_an_image_folder_file_changed_after_listing_is_refused_not_scored_under_its_old_hash(tmp_path):
    from PIL import Image

    from evaluators.base import BenchmarkPrompt, ImageEntry, ImageFolderSamples

    path = tmp_path / "0_0.png"
    Image.new("RGB", (4, 4), "red").save(path)
    samples = ImageFolderSamples([ImageEntry(0, 0, path)], [BenchmarkPrompt("a red cube")])
    record = samples.records()[0]
    assert samples.open_image(record).getpixel((0, 0)) == (255, 0, 0)
    Image.new("RGB", (4, 4), "blue").save(path)  # e.g. a generation script still writing the folder
    with pytest.raises(StoreError, match=r"0_0.png changed while it was being evaluated"):
        samples.open_image(record)


def test_a_mistyped_images_folder_is_refused_before_the_benchmark_data_is_read(tmp_path, monkeypatch):
    import evaluators.geneval

    def no_data(*args, **kwargs):
        raise AssertionError("the benchmark's data was read before the folder was checked")

    monkeypatch.setattr(evaluators.geneval.GenEvalBenchmark, "cached_prompts", no_data)
    config = parse_config(EvaluateConfig, ["--benchmarks", "geneval", "--images", str(tmp_path / "nosuch"),
                                           "--output_dir", str(tmp_path / "out")])
    with pytest.raises(FileNotFoundError, match=r"--images .*nosuch: no such folder"):
        evaluate(config)
    (tmp_path / "image.png").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"--images .*image.png: a file, not a folder; pass the folder"):
        evaluate(replace(config, images=str(tmp_path / "image.png")))


def test_scoring_takes_the_precision_the_samples_were_generated_in(tmp_path):
    import torch

    from gors.config import ScoreConfig
    from gors.core.run_folder import samples_dir
    from gors.core.store import SampleStore
    from gors.score import training_reward_dtype

    class Fake:
        def __init__(self, device, mixed_precision):
            self.device, self.mixed_precision = torch.device(device), mixed_precision

    store = SampleStore(samples_dir(tmp_path))
    store.root.mkdir(parents=True)
    store.save_settings({"dtype": "bfloat16"})  # an SD3 or FLUX.1 run under an fp16 accelerate config
    gpu = Fake("cuda", "fp16")
    # `gors score` on its own (the config's fp16) scores as `gors run` did: in the samples' bf16.
    assert training_reward_dtype(ScoreConfig(output_dir=str(tmp_path)), gpu, "b_vqa") == torch.bfloat16
    assert training_reward_dtype(ScoreConfig(output_dir=str(tmp_path), mixed_precision="fp16"), gpu,
                                 "b_vqa") == torch.float16  # asked for
    assert training_reward_dtype(ScoreConfig(output_dir=str(tmp_path / "none")), gpu, "b_vqa") == torch.float16
    assert training_reward_dtype(ScoreConfig(output_dir=str(tmp_path)), Fake("cpu", "fp16"), "b_vqa") == torch.float32


def test_a_store_recording_no_generation_dtype_gors_uses_leaves_the_accelerators_precision(tmp_path):
    """A sample store whose recorded dtype is none of gors's generation dtypes is scored in the accelerator's precision."""
    from types import SimpleNamespace

    from gors.config import ScoreConfig
    from gors.core.run_folder import samples_dir
    from gors.core.store import SampleStore
    from gors.score import training_reward_dtype

    store = SampleStore(samples_dir(tmp_path))
    store.root.mkdir(parents=True)
    gpu = SimpleNamespace(device=torch.device("cuda"), mixed_precision="fp16")
    for recorded in ("float64", "fp8", None):
        store.save_settings({"dtype": recorded})
        assert training_reward_dtype(ScoreConfig(output_dir=str(tmp_path)), gpu, "b_vqa") == torch.float16


def test_two_lora_paths_are_one_lora_only_when_their_weights_hashes_are_known_and_equal():
    # Results of another LoRA path are merged only on a recorded, equal sha256: two unrecorded hashes (None)
    # say nothing about the weights, and must not make two LoRAs one.
    from gors.evaluate import same_lora

    unknown = {"lora_sha256": None, "model": None}
    hashed = {"lora_sha256": "a" * 64, "model": None}
    assert same_lora("runs/a", "runs/a", unknown, unknown)
    assert not same_lora("runs/a", "runs/b", unknown, unknown)
    assert same_lora("runs/a", "runs/b", hashed, dict(hashed))
    assert not same_lora("runs/a", "runs/b", hashed, {"lora_sha256": "b" * 64, "model": None})


def test_earlier_results_are_kept_only_for_the_same_model_and_lora_with_their_folder(tmp_path, monkeypatch):
    from gors.evaluate import earlier_summaries

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"model": "m/", "lora": None, "value": 2}))
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "summary.json"
    stale = {"label": "a", "primary_metric": "value", "folder": "elsewhere/a", "model": "m", "lora": None, "value": 1}
    path.write_text(json.dumps({"lora": None, "summaries": [stale, {**stale, "label": "b"}]}))
    now = [{"label": "c", "folder": str(tmp_path / "c"), "model": "m", "lora": None}]
    # Rebuilt from a's own folder (its latest value, found from the summary's folder); b's folder is gone.
    assert earlier_summaries(path, now, {"lora": None}) == [
        {"label": "a", "primary_metric": "value", "folder": str(tmp_path / "a"), "model": "m/", "lora": None,
         "value": 2}]
    assert earlier_summaries(path, [{**now[0], "model": "other"}], {"lora": None}) == []
    assert earlier_summaries(path, now, {"lora": "x", "lora_dropout": 0.1}) == []
    assert earlier_summaries(path, [{**now[0], "label": "a"}], {"lora": None}) == []  # evaluated again now
    assert earlier_summaries(path, [{**now[0], "model": None}], {"lora": None}) == []  # --images: any model's
    # --images with a model given beside it: the model is recorded, the images are still any model's.
    assert earlier_summaries(path, [{**now[0], "images": "imgs"}], {"lora": None}) == []
    # Another version of the LoRA (retrained at its path) or of the model (another commit, local files written
    # since) made a's images: they are not this generator's results.
    for folder, lora_sha256, commit in (("a", "1" * 64, "a" * 40), ("c", "2" * 64, "a" * 40)):
        (tmp_path / folder / "samples").mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "samples" / "settings.json").write_text(json.dumps({"model": "m", "lora_sha256": lora_sha256}))
        (tmp_path / folder / "samples" / "models.json").write_text(json.dumps({"m": commit}))
    assert earlier_summaries(path, now, {"lora": None}) == []
    (tmp_path / "c" / "samples" / "settings.json").write_text(json.dumps({"model": "m", "lora_sha256": "1" * 64}))
    assert [e["label"] for e in earlier_summaries(path, now, {"lora": None})] == ["a"]
    (tmp_path / "c" / "samples" / "models.json").write_text(json.dumps({"m/": "b" * 40}))
    assert earlier_summaries(path, now, {"lora": None}) == []
    (tmp_path / "c" / "samples" / "models.json").write_text(json.dumps({}))  # a version unknown: no difference
    assert [e["label"] for e in earlier_summaries(path, now, {"lora": None})] == ["a"]
    # A Hub LoRA read at another commit of its repository (`hub:` in both headers, another snapshot path in the
    # summaries): the same weights are the same LoRA, other weights another.
    snapshot = "hub/models--u--l/snapshots/{}/pytorch_lora_weights.safetensors"
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"model": "m/", "lora": snapshot.format("1"), "value": 2}))
    at_push = [{**now[0], "lora": snapshot.format("2")}]
    assert [e["label"] for e in earlier_summaries(path, at_push, {"lora": None})] == ["a"]
    (tmp_path / "c" / "samples" / "settings.json").write_text(json.dumps({"model": "m", "lora_sha256": "2" * 64}))
    assert earlier_summaries(path, at_push, {"lora": None}) == []
    (tmp_path / "a" / "samples" / "settings.json").write_text(json.dumps({"model": "m", "lora_sha256": None}))
    assert earlier_summaries(path, at_push, {"lora": None}) == []  # weights unknown: the paths decide
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"model": "m/", "lora": None, "value": 2}))
    # An image folder scored by an earlier gors, which recorded the default model beside its images.
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"model": "m/", "lora": None, "images": "imgs", "value": 2}))
    assert earlier_summaries(path, now, {"lora": None}) == []


def test_without_a_model_the_toy_benchmark_renders_with_the_toy_pipeline_and_others_with_sd2_base(tmp_path):
    from gors.evaluate import evaluated_model

    # The toy world is drawn only by the pipeline that ships with gors: SD 2 base (needing a download) there
    # would score nothing meaningful.
    config = EvaluateConfig(output_dir=str(tmp_path / "toy"), benchmarks="toy", max_prompts=1, images_per_prompt=1)
    assert config.pretrained_model_name_or_path is None
    assert evaluated_model(config) == str(PRETRAINED_DIR / "pipeline")
    [summary] = evaluate(config)
    assert summary["model"] == str(PRETRAINED_DIR / "pipeline") and summary["num_images"] == 1
    assert config.pretrained_model_name_or_path is None  # the caller's config is left as given
    both = EvaluateConfig(output_dir=str(tmp_path / "both"), benchmarks="toy,t2i_compbench:color")
    assert evaluated_model(both) == "stabilityai/stable-diffusion-2-base"
    given = EvaluateConfig(output_dir=str(tmp_path / "given"), benchmarks="toy", pretrained_model_name_or_path="m/x")
    assert evaluated_model(given) == "m/x"
    images = EvaluateConfig(output_dir=str(tmp_path / "images"), benchmarks="toy", images=str(tmp_path))
    assert evaluated_model(images) is None  # scored as they are


def test_without_a_model_a_run_folders_lora_is_evaluated_on_the_base_model_it_was_trained_on(tmp_path, capsys,
                                                                                                monkeypatch):
    from safetensors.torch import save_file

    from gors.evaluate import evaluated_model, trained_base_model

    base = tmp_path / "my_sdxl"
    base.mkdir()
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    (run / "samples" / "settings.json").write_text(json.dumps({"model": str(base), "revision": None}))
    for folder in (run, run / "best", run / "checkpoints" / "checkpoint-10"):
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"unet.a.lora_A.weight": torch.zeros(4, 8)}, str(folder / "pytorch_lora_weights.safetensors"))
        assert trained_base_model(str(folder)) == str(base)  # the run folder, its best/ and its checkpoints
    assert trained_base_model(str(run / "pytorch_lora_weights.safetensors")) == str(base)  # the file itself
    config = EvaluateConfig(output_dir=str(tmp_path / "eval"), benchmarks="toy", lora=str(run / "best"))
    assert evaluated_model(config) == str(base)
    assert f"note: --pretrained_model_name_or_path {base}, the base model --lora" in capsys.readouterr().out
    # A LoRA from elsewhere keeps the default; a Hub id is taken as it is; a local model gone is named.
    assert trained_base_model(str(tmp_path)) is None
    (run / "samples" / "settings.json").write_text(json.dumps({"model": "someone/sdxl", "revision": "v2"}))
    assert trained_base_model(str(run)) == "someone/sdxl"
    # Not in the cache: nothing to compare with yet, and the note says which revision the samples used.
    assert "(its samples used --revision v2; this loads the default one)" in capsys.readouterr().out
    monkeypatch.setattr("gors.evaluate.model_version", lambda name: "b" * 40)  # cached, but nothing recorded
    assert trained_base_model(str(run)) == "someone/sdxl"
    assert "(its samples used --revision v2; this loads the default one)" in capsys.readouterr().out
    # The version the samples record against the one the name loads here: the cache's default snapshot.
    (run / "samples" / "models.json").write_text(json.dumps({"someone/sdxl": "a" * 40}))
    monkeypatch.setattr("gors.evaluate.model_version", lambda name: "a" * 40)
    assert trained_base_model(str(run)) == "someone/sdxl"
    monkeypatch.setattr("gors.evaluate.model_version", lambda name: "b" * 40)
    with pytest.raises(ValueError, match=r"was trained on 'someone/sdxl' as .*models.json records it, and here its "
                                         r"samples used --revision v2 \(a{40}\), and gors evaluate loads the default "
                                         r"one \(b{40}\).*Pass --pretrained_model_name_or_path with a local copy of "
                                         r"commit a{40} \(`hf download someone/sdxl --revision a{40} --local-dir DIR`\)"):
        trained_base_model(str(run))
    (run / "samples" / "settings.json").write_text(json.dumps({"model": "someone/sdxl", "revision": None}))
    monkeypatch.setattr("gors.evaluate.cached_snapshot", lambda name, commit: tmp_path / "snapshots" / commit)
    with pytest.raises(ValueError, match=r"and here someone/sdxl was at commit a{40}, now b{40}: updated on the Hub "
                                         r"since.*Pass --pretrained_model_name_or_path with its snapshot in this "
                                         r"machine's cache, .*snapshots/a{40}$"):
        trained_base_model(str(run))
    monkeypatch.undo()
    (run / "samples" / "models.json").unlink()
    # A local base model overwritten in place since.
    (base / "weights.bin").write_bytes(b"one")
    (run / "samples" / "settings.json").write_text(json.dumps({"model": str(base)}))
    (run / "samples" / "models.json").write_text(json.dumps({str(base): local_fingerprint(base)}))
    assert trained_base_model(str(run)) == str(base)
    (base / "weights.bin").write_bytes(b"two")
    with pytest.raises(ValueError, match=r"the files of local model .*my_sdxl changed since .*Pass "
                                         r"--pretrained_model_name_or_path with a folder holding that version"):
        trained_base_model(str(run))
    (run / "samples" / "models.json").unlink()
    # A release or a Hub id is no run folder, even where the working directory is one.
    monkeypatch.chdir(run)
    assert trained_base_model("official:color") is None and trained_base_model("someone/sd2-lora") is None
    # A --rounds run: its LoRA in its folder, its samples in its rounds'.
    rounds = tmp_path / "rounds"
    (rounds / "round-000" / "samples").mkdir(parents=True)
    (rounds / "round-000" / "samples" / "settings.json").write_text(json.dumps({"model": "someone/sdxl"}))
    save_file({"unet.a.lora_A.weight": torch.zeros(4, 8)}, str(rounds / "pytorch_lora_weights.safetensors"))
    assert trained_base_model(str(rounds)) == "someone/sdxl"
    # A local model recorded by a relative path (its fingerprint says local), looked for from elsewhere.
    (run / "samples" / "settings.json").write_text(json.dumps({"model": "models/sdxl"}))
    (run / "samples" / "models.json").write_text(json.dumps({"models/sdxl": "sha256:" + "0" * 64}))
    with pytest.raises(FileNotFoundError, match=r"was trained on local model 'models/sdxl'"):
        trained_base_model(str(run))
    (run / "samples" / "models.json").unlink()
    (run / "samples" / "settings.json").write_text(json.dumps({"model": str(tmp_path / "gone")}))
    with pytest.raises(FileNotFoundError, match=r"--lora=.* was trained on .*gone' \(.*settings.json\), which is not "
                                                r"there from here: pass its base model with --pretrained_model_name"):
        trained_base_model(str(run))
