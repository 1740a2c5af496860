"""Config parsing (flags, YAML, recipe defaults), the gors command, the demo, and bad input."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gors.cli import COMMANDS, main, parse_config
from gors.config import EvaluateConfig, RunConfig, TrainConfig
from gors.generate import generate
from gors.recipes import recipe_defaults
from gors.score import score

SHARED_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


def test_flags_override_yaml_which_overrides_defaults(tmp_path):
    config_file = tmp_path / "train.yaml"
    config_file.write_text("max_train_steps: 7\nlearning_rate: 0.001\nvalidation_prompts: [a red cube, a blue ball]\n")
    config = parse_config(TrainConfig, ["--config", str(config_file), "--learning_rate", "0.5"],
                          defaults={"max_train_steps": 3, "rank": 8})
    assert config.max_train_steps == 7  # YAML beats the recipe default
    assert config.learning_rate == 0.5  # the flag beats YAML
    assert config.rank == 8  # recipe default beats the dataclass default
    assert config.validation_prompts == ["a red cube", "a blue ball"]
    assert config.text_encoder_learning_rate == 5e-6  # paper default untouched


def test_none_unsets_a_number_that_a_yaml_file_or_recipe_set(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("reward_threshold: 0.5\ntimestep_range: [0, 500]\n")
    required = ["--pretrained_model_name_or_path", "m", "--output_dir", str(tmp_path / "run")]
    # Without `none` the file's threshold and the top fraction conflict; the refusal says which flag the file set.
    with pytest.raises(SystemExit, match="select by one of them") as refused:
        parse_config(RunConfig, ["--config", str(config_file), "--select_top_fraction", "0.1", *required])
    assert str(refused.value).endswith(f" (--reward_threshold set in {config_file})")
    with pytest.raises(SystemExit, match=r"select by one of them[^(]*$"):  # both on the command line: no file named
        parse_config(RunConfig, ["--reward_threshold", "0.5", "--select_top_fraction", "0.1", *required])
    config_file.write_text("train_unet: false\n")  # named in the refusal by its negation
    with pytest.raises(SystemExit, match=rf"leave nothing to train \(--train_unet set in {config_file}\)$"):
        parse_config(RunConfig, ["--config", str(config_file), "--no_train_text_encoder", *required])
    config = parse_config(RunConfig, ["--config", str(config_file), "--reward_threshold", "none",
                                      "--select_top_fraction", "0.1", "--timestep_range", "null", *required])
    assert config.reward_threshold is None and config.select_top_fraction == 0.1 and config.timestep_range is None
    assert parse_config(TrainConfig, ["--global_batch_size", "None"], defaults={"global_batch_size": 16}).global_batch_size is None
    with pytest.raises(SystemExit, match="invalid float value: 'nothing'"):
        parse_config(RunConfig, ["--reward_threshold", "nothing", *required])
    with pytest.raises(SystemExit, match="--timestep_range: `none` unsets the field; give it alone"):
        parse_config(RunConfig, ["--timestep_range", "0", "none", *required])


def test_none_unsets_text_a_recipe_or_yaml_file_set_and_a_file_gives_required_flags(tmp_path):
    from gors.push import PushConfig

    required = ["--pretrained_model_name_or_path", "m", "--output_dir", str(tmp_path / "run")]
    recipe = {"validation_benchmark": "geneval", "category": "color", "validation_prompts": ["a cat"]}
    config = parse_config(RunConfig, [*required, "--validation_benchmark", "none", "--category", "null",
                                      "--validation_prompts", "none"], defaults=recipe)
    assert (config.validation_benchmark, config.category, config.validation_prompts) == (None, None, None)
    # A field whose value may be "none" keeps it, from a flag and from a file.
    assert parse_config(TrainConfig, ["--weighting_scheme", "none", "--output_dir", "x"]).weighting_scheme == "none"
    scheme_file = tmp_path / "scheme.yaml"
    scheme_file.write_text("weighting_scheme: none\n")
    assert parse_config(TrainConfig, ["--config", str(scheme_file), "--output_dir", "x"]).weighting_scheme == "none"
    # A required flag (`gors push --output_dir --repo_id`) may come from the file.
    config_file = tmp_path / "push.yaml"
    config_file.write_text(f"output_dir: {tmp_path / 'run'}\nrepo_id: you/x\ndry_run: true\n")
    config = parse_config(PushConfig, ["--config", str(config_file)])
    assert (config.repo_id, config.dry_run) == ("you/x", True)
    with pytest.raises(SystemExit, match="required: --repo_id"):
        parse_config(PushConfig, ["--output_dir", "x"])
    # A list flag given twice would keep its last values alone.
    with pytest.raises(SystemExit, match=r"--evaluation given 2 times: give all its values after one --evaluation"):
        parse_config(PushConfig, ["--config", str(config_file), "--evaluation", "a", "--evaluation=b"])
    assert parse_config(PushConfig, ["--config", str(config_file), "--evaluation", "a", "b"]).evaluation == ["a", "b"]


def test_config_file_given_with_an_equals_sign(tmp_path):
    config_file = tmp_path / "train.yaml"
    config_file.write_text("max_train_steps: 7\n")
    assert parse_config(TrainConfig, [f"--config={config_file}"]).max_train_steps == 7
    with pytest.raises(SystemExit, match="--config needs a YAML file path"):
        parse_config(TrainConfig, ["--config", "--learning_rate", "0.5"])
    # As for any flag, the last --config wins; a --config that ends the command line names no file.
    first = tmp_path / "first.yaml"
    first.write_text("max_train_steps: 3\n")
    assert parse_config(TrainConfig, ["--config", str(first), f"--config={config_file}"]).max_train_steps == 7
    assert parse_config(TrainConfig, [f"--config={config_file}", "--config", str(first)]).max_train_steps == 3
    with pytest.raises(SystemExit, match="--config needs a YAML file path"):
        parse_config(TrainConfig, ["--config"])


def test_yaml_values_are_checked_against_the_flags_choices(tmp_path):
    # argparse checks `choices` only on flags typed on the command line
    config_file = tmp_path / "run.yaml"
    config_file.write_text("weighting_scheme: logit-normal\n")
    with pytest.raises(SystemExit, match=r"--weighting_scheme='logit-normal'; choose one of .*logit_normal"):
        parse_config(RunConfig, ["--config", str(config_file)])


def test_load_failures_say_whether_the_model_was_missing_or_of_another_kind(tmp_path, monkeypatch):
    from gors.cli import EXPECTED_ERRORS
    from gors.core.hub import ModelLoadError, from_pretrained

    class Loader:
        @classmethod
        def from_pretrained(cls, name, **kwargs):
            raise exception

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exception = OSError("not in the cache")
    with pytest.raises(ModelLoadError, match=r"--model='org/name' could not be loaded: not in the cache. HF_HUB_OFFLINE=1"):
        from_pretrained(Loader.from_pretrained, "org/name", "--model")
    # A local folder that is no model: no advice about the Hub, which was never asked.
    with pytest.raises(ModelLoadError) as refused:
        from_pretrained(Loader.from_pretrained, str(tmp_path), "--model")
    assert "HF_HUB_OFFLINE" not in str(refused.value) and "Hub id" in str(refused.value)
    assert ModelLoadError in EXPECTED_ERRORS
    exception = ValueError("unrecognized configuration class")
    with pytest.raises(ValueError, match=r"--model='org/name' was found but could not be loaded as Loader: "
                                         r"unrecognized configuration class\. Check that it is a checkpoint"):
        from_pretrained(Loader.from_pretrained, "org/name", "--model")


def test_one_yaml_drives_every_stage_and_flags_win_before_its_values_are_checked(tmp_path):
    from gors.config import GenerateConfig

    config_file = tmp_path / "run.yaml"
    config_file.write_text("images_per_prompt: 2\nmax_train_steps: 10\nreward: toy_oracle\n")
    generate_config = parse_config(GenerateConfig, ["--config", str(config_file)])  # train's keys are left out
    assert generate_config.images_per_prompt == 2
    assert parse_config(TrainConfig, ["--config", str(config_file)]).max_train_steps == 10
    config_file.write_text("images_per_prompt: many\nbogus: 1\n")
    with pytest.raises(SystemExit, match=rf"--config {config_file}: unknown keys \['bogus'\] for GenerateConfig"):
        parse_config(GenerateConfig, ["--config", str(config_file)])
    config_file.write_text("images_per_prompt: many\n")
    assert parse_config(GenerateConfig, ["--config", str(config_file), "--images_per_prompt", "3"]).images_per_prompt == 3
    assert parse_config(GenerateConfig, ["--config", str(config_file), "--images_per_prompt=4"]).images_per_prompt == 4
    with pytest.raises(SystemExit, match="images_per_prompt: 'many' is not a whole number"):
        parse_config(GenerateConfig, ["--config", str(config_file)])


def test_unknown_yaml_key_is_rejected(tmp_path):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text("max_train_step: 7\n")
    with pytest.raises(SystemExit, match="max_train_step"):
        parse_config(TrainConfig, ["--config", str(config_file)])
    config_file.write_text("no_train_unet: true\nno_center_crop: false\nno_revision: x\n")
    with pytest.raises(SystemExit, match=r"unknown keys \['no_center_crop', 'no_revision', 'no_train_unet'\] .*; "
                                         r"no_center_crop is the command line's flag: write center_crop: true; "
                                         r"no_train_unet is the command line's flag: write train_unet: false; see --help"):
        parse_config(TrainConfig, ["--config", str(config_file)])


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path):
    config_file = tmp_path / "twice.yaml"
    config_file.write_text("seed: 1\nrank: 4\nseed: 2\n")  # PyYAML alone keeps seed: 2
    with pytest.raises(SystemExit, match=r"twice.yaml: YAML syntax error at line 3, column 1: 'seed' is given twice "
                                         r"\(first on line 1\); keep one"):
        parse_config(TrainConfig, ["--config", str(config_file)])
    with pytest.raises(SystemExit, match=r"'a' is given twice"):
        parse_config(RunConfig, ["--reward_options", '{"a": 1, "a": 2}'])
    config_file.write_text("reward_options: {b_vqa: &b {batch_size: 2, dtype: x}, clip_score: {<<: *b, dtype: y}}\n")
    options = parse_config(RunConfig, ["--config", str(config_file)]).reward_options  # a merge key may be overridden
    assert options["clip_score"] == {"batch_size": 2, "dtype": "y"}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--images_per_prompt", "0"], "--images_per_prompt=0"),
        (["--images_per_prompt", "100000"], r"--images_per_prompt=100000: must be in \[1, 99 999\]"),
        (["--mixed_precision", "fp8"], "--mixed_precision='fp8'"),
        (["--reward_threshold", "1.5"], "--reward_threshold=1.5"),
        (["--reward_threshold", "1.0"], r"--reward_threshold=1.0: use a tau in \[0, 1\)"),
        (["--resolution", "500"], "--resolution=500"),
        (["--resolution", "0"], "--resolution=0: use a multiple of 8"),  # 0 is a multiple of 8, yet no image side
        (["--no_train_unet", "--no_train_text_encoder"], "nothing to train"),
        (["--caption_dropout", "1.0"], "--caption_dropout=1.0"),
        (["--anchor_below", "-1"], "--anchor_below=-1: give a timestep >= 1"),
        (["--lr_scheduler", "cosin"], "--lr_scheduler='cosin'; choose one of linear, cosine, "),
        (["--lr_scheduler", "piecewise_constant"], "--lr_scheduler='piecewise_constant'; choose one of"),
        (["--lr_scheduler", "polynomial", "--learning_rate", "1e-8"], "polynomial decays --learning_rate to 1e-7"),
        # At 1e-7 too: diffusers refuses a rate at or below the end it decays to.
        (["--lr_scheduler", "polynomial", "--learning_rate", "1e-7"], "polynomial decays --learning_rate to 1e-7"),
        (["--max_prompts", "0"], "--max_prompts=0: must be >= 1"),  # no prompt: nothing would be generated
        (["--checkpoints_total_limit", "0"], "--checkpoints_total_limit=0: keep at least 1"),
        (["--adam_beta1", "1.0"], r"--adam_beta1=1.0: use a value in \[0, 1\)"),
        (["--adam_beta2", "-0.1"], "--adam_beta2=-0.1"),
        (["--adam_epsilon", "0"], "--adam_epsilon=0.0: must be > 0"),
        (["--adam_weight_decay", "-1"], "--adam_weight_decay=-1.0: must be >= 0"),
        # An infinite rate or decay trained a LoRA of NaNs to the end and saved it.
        (["--adam_weight_decay", "inf"], "--adam_weight_decay=inf: must be >= 0 and finite"),
        (["--adam_epsilon", "inf"], "--adam_epsilon=inf: must be > 0 and finite"),
        (["--learning_rate", "inf"], "--learning_rate=inf: must be > 0 and finite"),
        (["--text_encoder_learning_rate", "inf"], "--text_encoder_learning_rate=inf: must be > 0 and finite"),
        (["--guidance_scale", "inf"], "--guidance_scale=inf: must be >= 0 and finite"),
        (["--logit_std", "nan"], "--logit_std=nan: must be finite"),
        (["--mode_scale", "inf"], "--mode_scale=inf: must be finite"),
        (["--lr_warmup_steps", "-1"], "--lr_warmup_steps=-1: must be >= 0"),
        (["--lr_warmup_steps", "100", "--max_train_steps", "100", "--lr_scheduler", "cosine"],
         "the learning rate would never leave its warm-up"),
        (["--max_grad_norm", "-1"], "--max_grad_norm=-1.0: must be > 0"),
        (["--max_grad_norm", "0"], "--max_grad_norm=0.0: must be > 0"),
        (["--guidance_scale", "-2"], "--guidance_scale=-2.0: must be >= 0"),
        (["--seed", "-1"], r"--seed=-1: must be in \[0, 2147483647\]"),
        # The upper bound too: seed + process index seeds numpy, which takes [0, 2**32); 2**31 leaves room for them.
        (["--seed", "2147483648"], r"--seed=2147483648: must be in \[0, 2147483647\]"),
        (["--reward_options", ""], r"--reward_options='': expected a mapping"),  # was "=None"
        (["--reward_options", "[1]"], r"--reward_options='\[1\]': expected a mapping"),  # numpy's seed would fail when training
        (["--train_prompts", ""], "--train_prompts='': give a T2I-CompBench category"),  # was "Prompt file '.'"
        (["--pretrained_model_name_or_path", ".", "--revision", "v1"],  # diffusers ignored it for a folder
         r"--revision='v1' with the local folder --pretrained_model_name_or_path='\.': .*drop --revision"),
    ],
)
def test_bad_values_name_the_flag(flags, message):
    with pytest.raises(SystemExit, match=message):
        parse_config(RunConfig, flags)


def test_anchor_below_0_turns_a_default_anchor_off():
    assert parse_config(RunConfig, ["--anchor_below", "0"], defaults={"anchor_below": 500}).anchor_below is None
    assert parse_config(RunConfig, [], defaults={"anchor_below": 500}).anchor_below == 500


def test_recipes_carry_the_paper_defaults(tmp_path):
    config = parse_config(RunConfig, ["--images_per_prompt", "2"], defaults=recipe_defaults("texture"))
    assert (config.train_prompts, config.category, config.reward_name()) == ("texture", "texture", "b_vqa")
    assert config.pretrained_model_name_or_path == "stabilityai/stable-diffusion-2-base"
    assert (config.rank, config.learning_rate, config.text_encoder_learning_rate) == (4, 1e-4, 5e-6)
    assert (config.train_batch_size, config.max_train_steps, config.seed) == (2, 15000, 42)
    assert config.global_batch_size == 16  # 2 x 8 GPUs, accumulated on fewer
    # The output folder follows the category and --unbiased (a biased and an unbiased run never share one),
    # unless a flag or the config file gives it.
    assert config.output_dir == "runs/gors_texture"
    unbiased = parse_config(RunConfig, ["--unbiased"], defaults=recipe_defaults("texture"))
    assert unbiased.output_dir == "runs/gors_texture_unbiased"
    given = parse_config(RunConfig, ["--unbiased", "--output_dir", "mine"], defaults=recipe_defaults("texture"))
    assert given.output_dir == "mine"
    yaml_file = tmp_path / "shape.yaml"
    yaml_file.write_text("category: shape\ntrain_prompts: shape\n")
    assert parse_config(RunConfig, ["--config", str(yaml_file)], defaults=recipe_defaults("texture")).output_dir == \
        "runs/gors_shape"
    off = parse_config(RunConfig, ["--global_batch_size", "0"], defaults=recipe_defaults("texture"))
    assert off.global_batch_size is None  # an older run's own batch, e.g. to resume it
    assert config.images_per_prompt == 2
    with pytest.raises(ValueError, match="Unknown category"):
        recipe_defaults("colour")
    # A mistyped --category stops at parsing (it read as another category's prompts before).
    with pytest.raises(SystemExit, match=r"^error: --category='colour' \(given, or set by a recipe or a --config "
                                         r"file\) is no category: give one of color, .* \(did you mean 'color'\?\)"):
        parse_config(RunConfig, ["--category", "colour"], defaults=recipe_defaults("color"))


def test_max_train_steps_beside_steps_per_round_is_refused():
    with pytest.raises(SystemExit, match=r"^error: --max_train_steps=100 with --steps_per_round=1, which sets the "
                                         r"updates \(--rounds x --steps_per_round = 2\): drop one of the two$"):
        parse_config(RunConfig, ["--rounds", "2", "--steps_per_round", "1", "--max_train_steps", "100"])
    assert parse_config(RunConfig, ["--rounds", "2", "--steps_per_round", "1"]).round_steps() == 1


def test_the_geneval_recipe_refuses_an_output_dir_that_is_a_file_in_one_line(tmp_path):
    from gors.core.io import PathError
    from gors.recipes import geneval_recipe_config

    (tmp_path / "afile").write_text("")
    with pytest.raises(PathError, match=r"^--output_dir='.*afile' is a file, not a folder"):
        geneval_recipe_config(["--output_dir", str(tmp_path / "afile")])


def test_a_link_to_a_missing_folder_is_named_as_such(tmp_path):
    from gors.core.io import PathError, make_folder

    (tmp_path / "scratch").symlink_to(tmp_path / "unmounted" / "runs")
    with pytest.raises(PathError, match=r"^--output_dir='.*scratch' is a link to .*unmounted/runs, which does not "
                                        r"exist \(not mounted\?\); pass a folder"):
        make_folder(tmp_path / "scratch", "--output_dir")
    with pytest.raises(PathError, match=r"^--output_dir='.*scratch/run1' lies under .*scratch, which is a link to "
                                        r".*unmounted/runs, which does not exist"):
        make_folder(tmp_path / "scratch" / "run1", "--output_dir")


def test_a_folder_path_is_checked_before_slow_work_with_the_error_making_it_would_give(tmp_path):
    from gors.core.io import PathError, check_folder_path, make_folder

    (tmp_path / "afile").write_text("")
    (tmp_path / "scratch").symlink_to(tmp_path / "unmounted" / "runs")
    for path in ("afile", "afile/run1", "scratch", "scratch/run1"):
        with pytest.raises(PathError) as checked:
            check_folder_path(tmp_path / path, "--output_dir")
        with pytest.raises(PathError) as made:
            make_folder(tmp_path / path, "--output_dir")
        assert str(checked.value) == str(made.value), path
    check_folder_path(tmp_path / "new" / "run1")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile", "scratch"]  # it creates nothing


def test_unbiased_says_which_categories_have_an_unbiased_reward_and_where_a_reward_came_from():
    from gors.recipes import geneval_recipe_defaults

    config = parse_config(RunConfig, ["--train_prompts", "numeracy", "--category", "numeracy", "--unbiased"])
    with pytest.raises(ValueError, match=r"^--unbiased: the paper has no unbiased reward for numeracy prompts \(only "
                                         r"for color, .*complex\); name the reward with --reward$"):
        config.reward_name()
    assert parse_config(RunConfig, ["--category", "numeracy"]).reward_name() == "numeracy"  # its metric
    with pytest.raises(SystemExit, match=r"--reward='geneval_graded' \(given, or set by a recipe or a --config "
                                         r"file\) and --unbiased both choose the reward"):
        parse_config(RunConfig, ["--unbiased"], defaults=geneval_recipe_defaults())


def test_gors_rewards_lists_b_vqa(capsys):
    main(["rewards"])
    out = capsys.readouterr().out
    assert "b_vqa" in out and "Salesforce/blip-vqa-capfilt-large" in out and "[0, 1]" in out


def test_gors_benchmarks_lists_each_with_its_subsets_scorer_and_main_metric(capsys):
    main(["benchmarks"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line and not line.startswith(" ")}
    assert rows["t2i_compbench"] == ["t2i_compbench:<category>", "by", "subset", "score", "[0,", "1]"]
    assert rows["geneval2"] == ["-", "soft_tifa", "soft_tifa_gm", "x100"]
    assert rows["toy"] == ["toy:<split>", "toy_oracle", "binding_accuracy", "[0,", "1]"]
    assert {"geneval", "lpg_bench"} <= set(rows)


def test_recipe_script_help_runs():
    result = subprocess.run([sys.executable, "recipes/gors_color.py", "--help"], capture_output=True, text=True,
                            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert result.returncode == 0 and "--reward_threshold" in result.stdout and "--train_prompts" in result.stdout


def test_missing_prompt_file_is_a_clear_error(make_run_config, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        generate(make_run_config(train_prompts=str(tmp_path / "missing.txt")))


def test_empty_prompt_file_is_a_clear_error(make_run_config, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\r\n\n")
    with pytest.raises(ValueError, match="empty.txt"):
        generate(make_run_config(train_prompts=str(empty)))


def test_model_path_that_does_not_exist(make_run_config, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--pretrained_model_name_or_path=.*no such folder"):
        generate(make_run_config(pretrained_model_name_or_path=str(tmp_path / "no-model")))


def test_unknown_reward_lists_known_ones_and_keeps_samples(make_run_config):
    config = make_run_config(reward="bvqa")
    store = generate(config)
    with pytest.raises(ValueError, match=r"Unknown reward 'bvqa'.*b_vqa"):
        score(config)
    assert len(store.records()) == 6


def test_reward_model_path_that_does_not_exist(make_run_config, tmp_path):
    config = make_run_config(reward_model_name_or_path=str(tmp_path / "no-blip"))
    generate(config)
    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        score(config)


def test_user_reward_registered_with_a_decorator_works_in_score(make_run_config, monkeypatch):
    import numpy as np

    import rewards.registry
    from gors.core.run_folder import samples_dir
    from gors.core.store import SampleStore, sample_key
    from rewards import Reward, RewardOutput, register_reward

    monkeypatch.setattr(rewards.registry, "_REGISTERED", {})  # the registration stays in this test

    @register_reward("test_cli_brightness")
    class Brightness(Reward):
        def _score(self, images, prompts, metadata):
            values = [float(np.asarray(image).mean() / 255) for image in images]
            return RewardOutput(values, [{"brightness": v} for v in values])

    config = make_run_config(reward="test_cli_brightness")
    generate(config)
    scores = score(config)
    assert len(scores) == 6
    store = SampleStore(samples_dir(config.output_dir))
    for record in store.records():  # the registered class scored each image: its mean brightness
        expected = np.asarray(store.open_image(record).convert("RGB")).mean() / 255
        assert scores[sample_key(record)]["reward"] == pytest.approx(expected)


# ---- one parser for every subcommand ------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_parses_its_config_and_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gors {command}") and "--config" in out


def test_a_negated_flag_says_it_turns_its_flag_off(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    # A flag on by default (HfArgumentParser repeated its help with "default: False") and one whose default is
    # the family's (None): each negation says what it turns off, and only that.
    assert "--no_cache_text_embeddings, --no-cache-text-embeddings --cache_text_embeddings off. --max" in out
    assert "--no_train_text_encoder, --no-train-text-encoder --train_text_encoder off. --train_text_encoder_2" in out
    # Also where a recipe (or a --config file) sets the flag's value.
    from gors.toy.demo import toy_defaults

    with pytest.raises(SystemExit):
        parse_config(RunConfig, ["--help"], defaults=toy_defaults())
    out = " ".join(capsys.readouterr().out.split())
    assert "--no_sample_latents, --no-sample-latents --sample_latents off. --checkpointing_steps" in out


def test_gors_help_lists_every_command(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    with pytest.raises(SystemExit) as exit_info:
        main(["toi"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: gors: unknown command 'toi'; did you mean gors toy?\n"
                                              "usage: gors COMMAND")


def test_positional_fields_and_yaml_for_report(tmp_path, capsys):
    from gors.report import ReportConfig

    config = parse_config(ReportConfig, ["a", "b", "--output_dir", "out"])
    assert (config.folders, config.output_dir) == (["a", "b"], "out")
    folder = tmp_path / "eval_a"
    folder.mkdir()
    (folder / "summary.json").write_text(
        '{"summaries": [{"label": "toy:held_out", "primary_metric": "binding_accuracy", "binding_accuracy": 0.25}]}')
    config_file = tmp_path / "report.yaml"
    config_file.write_text(f"output_dir: {tmp_path / 'report'}\n")
    main(["report", str(folder), "--config", str(config_file)])
    assert f"[report] wrote {tmp_path / 'report' / 'report.md'}" in capsys.readouterr().out
    # a positional field in the YAML file: the command line may leave it out, or give it instead
    config_file.write_text(f"folders: [{folder}]\n")
    assert parse_config(ReportConfig, ["--config", str(config_file)]).folders == [str(folder)]
    assert parse_config(ReportConfig, ["x", "--config", str(config_file)]).folders == ["x"]


def test_numbers_in_exponent_form_are_numbers_in_mapping_flags_and_yaml_files(tmp_path):
    from gors.estimate import EstimateConfig

    # JSON's and YAML 1.2's reading; PyYAML (YAML 1.1) alone reads 1e2 as text, which was then refused as no number.
    config = parse_config(EstimateConfig, ["runs/x", "--reference_speedups", '{"train": 1e2, "score": 1.5E1}'])
    assert config.reference_speedups["train"] == 100.0 and config.reference_speedups["score"] == 15.0
    config_file = tmp_path / "run.yaml"
    config_file.write_text("learning_rate: 3e-4\nreward_options:\n  weight: 1e-3\n  name: '1e-3'\n")
    config = parse_config(RunConfig, ["--config", str(config_file)])
    assert config.learning_rate == 3e-4 and config.reward_options == {"weight": 1e-3, "name": "1e-3"}  # quoted: text


def test_mapping_options_are_dicts_from_flags_and_yaml(tmp_path):
    assert parse_config(RunConfig, []).reward_options == {}
    config = parse_config(RunConfig, ["--validation_benchmark", "toy:train", "--validation_scorer_options",
                                      "{checks: all}"])
    assert config.validation_scorer_options == {"checks": "all"}
    config_file = tmp_path / "evaluate.yaml"
    config_file.write_text("scorer_options:\n  geneval:\n    model_name_or_path: x\n")
    config = parse_config(EvaluateConfig, ["--config", str(config_file)])
    assert config.scorer_options == {"geneval": {"model_name_or_path": "x"}}
    with pytest.raises(SystemExit, match="--scorer_options='3': expected a mapping"):
        parse_config(EvaluateConfig, ["--scorer_options", "3"])


def test_run_config_has_every_stage_flag_without_being_a_stage_config():
    from dataclasses import fields

    from gors.config import GenerateConfig, ScoreConfig, SelectConfig

    run = parse_config(RunConfig, ["--images_per_prompt", "3", "--reward_threshold", "0.5", "--rank", "8"])
    from gors.config import PipelineFields, RoundFields

    stages = (GenerateConfig, ScoreConfig, SelectConfig, TrainConfig)
    # Every stage's flags, and `gors run`'s own: the online rounds and how the stages chain.
    own = (RoundFields, PipelineFields)
    assert {f.name for f in fields(RunConfig)} == {f.name for stage in (*stages, *own) for f in fields(stage)}
    assert not any(issubclass(RunConfig, stage) for stage in stages)  # no diamond of stage configs
    for stage in stages:  # each stage reads the same values from a RunConfig as from its own config
        own = stage(**{f.name: getattr(run, f.name) for f in fields(stage)})
        assert all(getattr(own, f.name) == getattr(run, f.name) for f in fields(stage))
    assert "dataloader_num_workers" not in {f.name for f in fields(RunConfig)}


# ---- expected errors: one line, exit status 2; anything else keeps its traceback -----------------


def one_error_line(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_expected_errors_are_one_line_and_exit_2(make_run_config, tmp_path, capsys):
    config = make_run_config()
    run = ["--output_dir", config.output_dir]
    message = one_error_line(capsys, ["generate", *run, "--train_prompts", str(tmp_path / "no" / "such.txt")])
    assert "such.txt" in message
    generate(config)
    capsys.readouterr()
    assert "Unknown reward 'nope'" in one_error_line(capsys, ["score", *run, "--reward", "nope"])
    assert "no 'b_vqa' score" in one_error_line(capsys, ["select", *run, "--reward_threshold", "0.5"])
    assert "--images_per_prompt=0" in one_error_line(capsys, ["generate", *run, "--images_per_prompt", "0"])
    message = one_error_line(capsys, ["generate", "--no_such_flag", "1"])
    assert message == "error: gors generate: unrecognized arguments: --no_such_flag 1 (see gors generate --help)\n"


def test_another_process_names_itself_and_gors_traceback_lets_errors_through(monkeypatch, capsys, tmp_path):
    import gors.cli

    def refused(config):
        raise ValueError("a bad value")

    monkeypatch.setattr("gors.report.write_report", refused)
    # Process 1 of a launch: it speaks only after the grace period, naming itself (the main process,
    # meeting the same error, would have spoken and stopped the launch by then).
    monkeypatch.setattr(gors.cli, "_process_index", lambda: 1)
    monkeypatch.setattr(gors.cli, "REPORT_GRACE_S", 0.0)
    assert one_error_line(capsys, ["report", str(tmp_path)]) == "error: process 1: a bad value\n"
    monkeypatch.setenv("GORS_TRACEBACK", "1")  # debugging: the error as raised, with its traceback
    with pytest.raises(ValueError, match="a bad value"):
        main(["report", str(tmp_path)])


def test_interrupt_is_one_line(monkeypatch, capsys, tmp_path):
    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr("gors.report.write_report", interrupted)
    message = one_error_line(capsys, ["report", str(tmp_path)])
    assert message == "error: interrupted; run the same command again to resume where it stopped\n"
    # Only what trains resumes from a checkpoint.
    monkeypatch.setattr("gors.cli.run_train", interrupted)
    (tmp_path / "samples").mkdir()
    message = one_error_line(capsys, ["train", "--output_dir", str(tmp_path)])
    assert message.endswith("resume where it stopped (finished images and scores are kept; training goes on from its "
                            "last checkpoint)\n")
    # Another process of a launch: the launcher passed Ctrl-C to every process, and the main one says it.
    monkeypatch.setattr("gors.cli._process_index", lambda: 1)
    monkeypatch.setattr("gors.cli.time.sleep", lambda seconds: pytest.fail("waited before exiting"))
    with pytest.raises(SystemExit) as stopped:
        main(["report", str(tmp_path)])
    assert stopped.value.code == 2 and capsys.readouterr().err == ""


def test_a_command_group_lists_its_subcommands(capsys):
    main(["toy", "--help"])
    assert capsys.readouterr().out.splitlines()[2:] == [
        "subcommands:", "  pretrain     toy world: train the packaged toy model and its classifier from scratch"]
    assert one_error_line(capsys, ["toy", "foo"]) == ("error: gors toy: unknown subcommand 'foo'; give one of "
                                                      "gors toy pretrain\n")


def test_an_error_after_a_progress_bar_starts_its_own_line(monkeypatch, capsys, tmp_path):
    from tqdm.auto import tqdm

    def fails_mid_bar(config):
        bar = tqdm(total=3, desc="score")
        bar.update(1)
        raise ValueError("a bad value")  # the bar stays open: the frame holding it is kept by the error

    monkeypatch.setattr("gors.report.write_report", fails_mid_bar)
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err
    assert "\nerror: a bad value\n" in err and not err.startswith("error")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: always a line of its own
    monkeypatch.setattr("gors.report.write_report", lambda config: (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path)])
    assert capsys.readouterr().err == "\nerror: bad\n"


@pytest.mark.parametrize(
    ("returned", "message"),
    [(1.5, r"error: Big returned 1.5 for image 0 \('.*'\), outside \[0.0, 1.0\]; clip or rescale"),
     (None, r"error: Big returned None for image 0 \('.*'\), not a number"),
     (object, r"error: Big's details for image 0 cannot be written as JSON .* for prompt '.*'; give plain")],
)
def test_a_reward_that_breaks_the_protocol_is_a_one_line_error(make_run_config, monkeypatch, capsys, returned,
                                                               message):
    import rewards.registry
    from rewards import Reward, RewardOutput, register_reward

    monkeypatch.setattr(rewards.registry, "_REGISTERED", {})  # the registration stays in this test

    @register_reward("test_cli_big")
    class Big(Reward):
        def _score(self, images, prompts, metadata):
            if returned is object:  # details that JSON cannot write
                return RewardOutput([0.5] * len(images), [{"x": object()} for _ in images])
            return RewardOutput([returned] * len(images))

    config = make_run_config(reward="test_cli_big")
    generate(config)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["score", "--output_dir", config.output_dir, "--reward", "test_cli_big"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.match(message, err.splitlines()[-1]), err
    assert "\nerror: " in err  # the bar drawn before it does not share its line


def test_unexpected_error_keeps_its_traceback(monkeypatch, tmp_path):
    def broken(config):
        raise RuntimeError("a bug")

    monkeypatch.setattr("gors.report.write_report", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["report", str(tmp_path)])


def test_expected_error_of_a_real_command_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gors.cli", "select", "--output_dir", str(tmp_path / "run"),
                             "--reward_threshold", "0.5"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_commands_computed_defaults_apply_under_python_m_gors_cli(tmp_path):
    # `python -m gors.cli` (what accelerate launches) runs the module as __main__: `gors train`'s defaults computed
    # from the run folder (`gors.config.train_defaults`) must still be known as such, not taken as values.
    (tmp_path / "run").mkdir()
    result = subprocess.run([sys.executable, "-m", "gors.cli", "train", "--output_dir", str(tmp_path / "run"),
                             "--pretrained_model_name_or_path", str(tmp_path)], capture_output=True, text=True,
                            cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert result.stderr.strip() == f"error: {tmp_path / 'run' / 'selection.jsonl'} does not exist: run `gors select " \
                                    f"--output_dir {tmp_path / 'run'}` first."


@pytest.mark.parametrize("command", ["run", "generate"])
def test_the_toy_worlds_prompts_sample_the_packaged_toy_model_unless_a_model_is_given(command, tmp_path):
    from gors.cli import command_config
    from gors.core.toy import PRETRAINED_DIR

    def model(*flags: str) -> str:
        return command_config(command, ["--output_dir", str(tmp_path), *flags], f"gors {command}").pretrained_model_name_or_path

    assert model("--train_prompts", "toy:train") == str(PRETRAINED_DIR / "pipeline")
    assert model("--train_prompts", "color") == model() == "stabilityai/stable-diffusion-2-base"
    assert model("--train_prompts", "toy:train", "--pretrained_model_name_or_path", "mine") == "mine"
    config = tmp_path / "run.yaml"
    config.write_text("train_prompts: toy:held_out\npretrained_model_name_or_path: from_the_file\n")
    assert model("--config", str(config)) == "from_the_file"
    config.write_text("train_prompts: toy:held_out\n")
    assert model("--config", str(config)) == str(PRETRAINED_DIR / "pipeline")


def test_unusable_folders_and_config_paths_are_one_line(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    message = one_error_line(capsys, ["select", "--output_dir", str(a_file), "--reward_threshold", "0.5"])
    assert f"--output_dir='{a_file}' is a file, not a folder" in message
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    (evaluation / "summary.json").write_text('{"summaries": [{"label": "toy:held_out", "primary_metric": "binding_accuracy", '
                                             '"binding_accuracy": 0.5}]}')
    message = one_error_line(capsys, ["report", str(evaluation), "--output_dir", str(a_file / "x")])
    assert f"--output_dir='{a_file / 'x'}' lies under a file" in message
    assert f"--config {tmp_path}: is a directory" in one_error_line(capsys, ["select", "--config", str(tmp_path)])
    assert "--output_dir='': give the run folder" in one_error_line(capsys, ["select", "--output_dir", ""])
    assert "--output_dir='': give the evaluation folder" in one_error_line(
        capsys, ["evaluate", "--benchmarks", "toy", "--output_dir", ""])
    assert "--output_dir='': give the folder the report" in one_error_line(
        capsys, ["report", str(evaluation), "--output_dir", " "])


@pytest.mark.parametrize("text, message", [
    ("max_train_steps: {a: b\n", r"bad.yaml: YAML syntax error at line 2, column 1: expected .,. or .}."),
    ("validation_prompts: a red circle\n", "validation_prompts: 'a red circle' is not a list: use a YAML list"),
    ("images_per_prompt: 2.5\n", "images_per_prompt: 2.5 is not a whole number: give a whole number, or leave the "
                                "key out for its default$"),  # no advice to quote: the field takes no text
    ("images_per_prompt: [1, 2]\n", r"images_per_prompt: \[1, 2\] is not a whole number"),
    ("images_per_prompt: null\n", r"images_per_prompt: None \(null\) is not allowed"),
    ("lr_scheduler: no\n", r"lr_scheduler: False reads as the YAML boolean false \(YAML 1\.1 reads yes, no, on and "
                            r"off so\): quote the text you meant; lr_scheduler: diffusers' get_scheduler name "
                            r"\(constant, linear, cosine, \.\.\.\)$"),
    # Only `no` reads back as "no" for a field that takes it: `yes` is no "no".
    ("mixed_precision: yes\n", r"mixed_precision: True reads as the YAML boolean true"),
    # Not a suggestion of "off", which it does not take either: what it takes.
    ("report_to: off\n", r"report_to: False reads as .*; report_to: One Accelerate tracker \(tensorboard, wandb, "
                          r"mlflow, \.\.\.: accelerate's LoggerType names\), all \(every installed one\) or none$"),
    ("train_unet: 1\n", "train_unet: 1 is not true or false: give true or false, or leave"),
    ("output_dir: 12\n", r"output_dir: 12 is not text: give text \(quote text\), or leave"),
    ("learning_rate: 1e-4x\n", "learning_rate: '1e-4x' is not a number"),
    ("images_per_prompt: '2.5'\n", "images_per_prompt: '2.5' is not a whole number"),
])
def test_yaml_values_are_checked_against_the_field_types(tmp_path, text, message):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(text)
    with pytest.raises(SystemExit, match=message):
        parse_config(RunConfig, ["--config", str(config_file)])


def test_yaml_no_is_no_and_numbers_are_floats_for_float_fields(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("mixed_precision: no\ntorch_compile: no\nreward_threshold: 0\n"
                           "validation_prompts: [a red circle]\n")
    config = parse_config(RunConfig, ["--config", str(config_file)])
    assert (config.mixed_precision, config.torch_compile, config.reward_threshold) == ("no", "no", 0.0)
    assert config.validation_prompts == ["a red circle"]


def test_yaml_number_text_is_a_number(tmp_path):
    # PyYAML reads 1e-4 (no dot) as text; the command line's --learning_rate 1e-4 is a number too.
    config_file = tmp_path / "run.yaml"
    config_file.write_text("learning_rate: 1e-4\nimages_per_prompt: '3'\n")
    config = parse_config(RunConfig, ["--config", str(config_file)])
    assert (config.learning_rate, config.images_per_prompt) == (1e-4, 3)


def test_yaml_whole_numbers_read_as_the_same_text_as_a_flag(tmp_path):
    # YAML 1.1 (PyYAML) reads 0042 as octal 34 and 1:30 as 90; `--seed 0042` is 42 and `--max_train_steps 1:30` refused.
    config_file = tmp_path / "run.yaml"
    config_file.write_text("seed: 0042\ncheckpointing_steps: 1_000\nlearning_rate: 5.0e-6\nadam_epsilon: 1e-8\n")
    config = parse_config(RunConfig, ["--config", str(config_file)])
    assert (config.seed, config.checkpointing_steps, config.learning_rate, config.adam_epsilon) == (42, 1000, 5e-6, 1e-8)
    assert parse_config(RunConfig, ["--seed", "0042"]).seed == 42
    for text in ("1:30", "0x1F", "0o17"):  # base 60, hexadecimal, octal: the flag refuses them too
        config_file.write_text(f"max_train_steps: {text}\n")
        with pytest.raises(SystemExit, match=f"max_train_steps: '{text}' is not a whole number"):
            parse_config(RunConfig, ["--config", str(config_file)])
    config_file.write_text("learning_rate: 1:30.5\n")
    with pytest.raises(SystemExit, match="learning_rate: '1:30.5' is not a number"):
        parse_config(RunConfig, ["--config", str(config_file)])


@pytest.mark.parametrize("text, message", [
    ("on: true\n", r"keys must be field names, got True: quote a key YAML reads as a boolean or number"),
    ("seed: 1\n2: x\n", r"keys must be field names, got 2:"),
    ("[]\n", r"expected a mapping of RunConfig fields, got list"),
    ("false\n", r"expected a mapping of RunConfig fields, got bool"),
    ("0\n", r"expected a mapping of RunConfig fields, got int"),
    ("learning_rat: 1e-4\n", r"unknown keys \['learning_rat'\] .*; learning_rat: did you mean learning_rate\?"),
    ("learning-rate: 1e-4\n", r"unknown keys \['learning-rate'\] .*; learning-rate: did you mean learning_rate\?"),
])
def test_a_config_file_that_is_no_mapping_of_field_names_is_refused_in_one_line(tmp_path, text, message):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(text)
    with pytest.raises(SystemExit, match=message):
        parse_config(RunConfig, ["--config", str(config_file)])
    config_file.write_text("# comments only\n")
    assert parse_config(RunConfig, ["--config", str(config_file)]) == parse_config(RunConfig, [])


def test_an_evaluation_config_file_with_training_keys_names_them_and_a_mistyped_key_its_match(tmp_path):
    config_file = tmp_path / "evaluate.yaml"
    config_file.write_text("benchmarks: toy\nreward_threshold: 0.5\nmax_train_steps: 10\nbenchmrks: toy\n")
    with pytest.raises(SystemExit, match=r"unknown keys \['benchmrks', 'max_train_steps', 'reward_threshold'\] for "
                                         r"EvaluateConfig; max_train_steps, reward_threshold: settings of `gors run` "
                                         r"and its stages, which EvaluateConfig does not take; benchmrks: did you mean "
                                         r"benchmarks\?; see --help"):
        parse_config(EvaluateConfig, ["--config", str(config_file)])


def test_mapping_flags_with_keys_that_are_not_text_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--reward_options='\{1: 2, foo: 3\}': keys must be text, got 1; quote them"):
        parse_config(RunConfig, ["--reward_options", "{1: 2, foo: 3}"])


def test_a_mistyped_flag_is_named_with_the_closest_one():
    with pytest.raises(SystemExit, match=r"unrecognized arguments: --learning_rat 1e-4; did you mean --learning_rate\?"):
        parse_config(RunConfig, ["--learning_rat", "1e-4"])


def test_a_flag_of_another_stage_or_by_the_papers_name_says_so(capsys):
    # Not "did you mean --reward_batch_size?": the flag is right, the command is not.
    for argv, said in [(["score", "--output_dir", "x", "--reward_threshold", "0.5"],
                        "--reward_threshold 0.5; --reward_threshold is a flag of gors select, gors run (see"),
                       (["select", "--output_dir", "x", "--tau", "0.5"], "--tau 0.5; --tau is --reward_threshold here"),
                       (["train", "--output_dir", "x", "--k", "3"], "--k is --images_per_prompt, a flag of gors generate"),
                       (["select", "--output_dir", "x", "--reward_treshold", "0.5"],
                        "did you mean --reward_threshold?"),
                       # A positional argument of another command is no flag of it.
                       (["evaluate", "--benchmark", "toy"], "--benchmark toy; did you mean --benchmarks? (see"),
                       (["run", "--batch_size", "4"], "--batch_size is a flag of gors toy pretrain; here, did you mean "
                                                      "--train_batch_size?"),
                       (["run", "--lr", "1e-4"], "--lr is --learning_rate here"),
                       (["run", "--model_name_or_path", "m"], "--model_name_or_path is --pretrained_model_name_or_path "
                                                              "here")]:
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err


def test_an_explicit_accumulation_of_one_is_checked_against_a_recipes_global_batch(monkeypatch):
    recipe = {"global_batch_size": 16}  # the recipes' paper batch: 8 micro-batches of 2 on one process
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match=r"--gradient_accumulation_steps=1 with --global_batch_size=16: that batch "
                                         r"takes 8 micro-batch\(es\) of 2 on 1 process\(es\)"):
        parse_config(RunConfig, ["--gradient_accumulation_steps", "1"], defaults=recipe)
    assert parse_config(RunConfig, [], defaults=recipe).gradient_accumulation_steps == 1  # resolved by training
    assert parse_config(RunConfig, ["--gradient_accumulation_steps", "8"], defaults=recipe).global_batch_size == 16
    with pytest.raises(SystemExit, match="with --auto_train_batch_size, which sets it"):
        parse_config(RunConfig, ["--gradient_accumulation_steps", "1", "--auto_train_batch_size"], defaults=recipe)
    with pytest.raises(SystemExit, match=r"takes 8 micro-batch\(es\) of 2 on 1 process\(es\); give one of the two "
                                         r"flags \(--global_batch_size 0 is off\); --global_batch_size=16 is the "
                                         r"recipe's: --global_batch_size 0 sets the accumulation by hand"):
        parse_config(RunConfig, ["--gradient_accumulation_steps", "2"], defaults=recipe)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")  # an MPI launch: Accelerate reads it, and so does the check
    assert parse_config(RunConfig, ["--gradient_accumulation_steps", "1"], defaults=recipe).global_batch_size == 16
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "8")  # the official 2 x 8 GPUs: one micro-batch per update, as said
    assert parse_config(RunConfig, ["--gradient_accumulation_steps", "1"], defaults=recipe).global_batch_size == 16
    # Both flags the user's own: the refusal does not call the global batch the recipe's.
    with pytest.raises(SystemExit, match=r"on 8 process\(es\); give one of the two flags \(--global_batch_size 0 is "
                                         r"off\)$"):
        parse_config(RunConfig, ["--global_batch_size", "16", "--gradient_accumulation_steps", "2"], defaults=recipe)


def test_a_yaml_files_values_count_as_given_for_the_flags_another_flag_overrides(tmp_path, monkeypatch):
    # A value set in --config is the user's as much as a flag's: --auto_train_batch_size refuses the file's
    # train_batch_size, and the file's accumulation is checked against a recipe's global batch.
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    config_file = tmp_path / "run.yaml"
    config_file.write_text("train_batch_size: 1\n")
    with pytest.raises(SystemExit, match=rf"--train_batch_size=1 with --auto_train_batch_size, which sets it.* "
                                         rf"\(--train_batch_size set in {config_file}\)$"):
        parse_config(RunConfig, ["--config", str(config_file), "--global_batch_size", "4", "--auto_train_batch_size"])
    config_file.write_text("gradient_accumulation_steps: 1\n")
    with pytest.raises(SystemExit, match=r"--gradient_accumulation_steps=1 with --global_batch_size=16: that batch "
                                         r"takes 8 micro-batch\(es\)"):
        parse_config(RunConfig, ["--config", str(config_file)], defaults={"global_batch_size": 16})


def test_flags_that_another_flag_overrides_or_that_cannot_draw_a_timestep_are_refused():
    with pytest.raises(SystemExit, match=r"--train_batch_size=1 with --auto_train_batch_size, which sets it"):
        parse_config(RunConfig, ["--global_batch_size", "4", "--auto_train_batch_size", "--train_batch_size", "1"])
    assert parse_config(RunConfig, ["--global_batch_size", "4", "--auto_train_batch_size"]).auto_train_batch_size
    with pytest.raises(SystemExit, match=r"--logit_std=-1.0: must be > 0 \(a standard deviation\)"):
        parse_config(RunConfig, ["--logit_std", "-1"])
    for scale in ("10", "-2"):
        with pytest.raises(SystemExit, match=rf"--mode_scale={float(scale)}: must lie in \[-1, 1.752\]"):
            parse_config(RunConfig, ["--mode_scale", scale])
    assert parse_config(RunConfig, ["--mode_scale", "-1"]).mode_scale == -1.0  # the interval's ends are defined
    assert parse_config(RunConfig, ["--no-train-text-encoder", "--no-train-text-encoder-2"]).train_text_encoder is False
    with pytest.raises(SystemExit, match=r"--validation_steps=100 without --validation_benchmark or "
                                         r"--validation_prompts: there is no validation to run"):
        parse_config(RunConfig, ["--validation_steps", "100"])
    assert parse_config(RunConfig, ["--validation_steps", "100", "--validation_prompts", "a red cube"])
    from gors.toy.demo import ToyRunConfig

    with pytest.raises(SystemExit, match=r"--eval_split='bogus': choose one of train, held_out, "):
        parse_config(ToyRunConfig, ["--eval_split", "bogus"])
    # A validation fold beside training prompts that hold it would measure trained prompts.
    with pytest.raises(SystemExit, match=r"--eval_split=val with --train_prompts toy:train: .* pass --train_prompts "
                                         r"toy:fit with it"):
        parse_config(ToyRunConfig, ["--eval_split", "val"], defaults={"train_prompts": "toy:train"})
    with pytest.raises(SystemExit, match=r"pass --train_prompts toy:fit_square with it"):
        parse_config(ToyRunConfig, ["--eval_split", "val_square", "--train_prompts", "toy:fit"])
    with pytest.raises(SystemExit, match=r"--train_prompts toy:held_out with --eval_split held_out"):
        parse_config(ToyRunConfig, ["--train_prompts", "toy:held_out"])
    assert parse_config(ToyRunConfig, ["--eval_split", "val_square", "--train_prompts", "toy:fit_square"])


def test_interrupt_before_accelerate_is_imported_is_one_line(monkeypatch, capsys, tmp_path):
    import gors.cli

    monkeypatch.delitem(sys.modules, "accelerate", raising=False)
    assert gors.cli._process_index() == 0
    assert "accelerate" not in sys.modules  # the handler imports nothing


def test_abbreviated_flags_are_refused(tmp_path):
    # argparse would take --conf for --config, which the YAML reader looks for by its full name.
    config_file = tmp_path / "run.yaml"
    config_file.write_text("images_per_prompt: 7\n")
    with pytest.raises(SystemExit, match="unrecognized arguments: --conf"):
        parse_config(RunConfig, ["--conf", str(config_file)])
    assert parse_config(RunConfig, ["--config", str(config_file)]).images_per_prompt == 7


def test_a_corrupt_store_file_is_named(tmp_path, capsys):
    samples = tmp_path / "run" / "samples"
    samples.mkdir(parents=True)
    (samples / "prompts.json").write_text('{"prompts": [')
    message = one_error_line(capsys, ["select", "--output_dir", str(tmp_path / "run"), "--reward_threshold", "0.5"])
    assert f"{samples / 'prompts.json'}: not valid JSON" in message
    assert message.endswith("the prompt set `gors generate` records: run it again with the flags that made the "
                            "samples, which writes the file anew, or restore it\n")
    (samples / "prompts.json").write_text("[1, 2]")
    message = one_error_line(capsys, ["select", "--output_dir", str(tmp_path / "run"), "--reward_threshold", "0.5"])
    assert message == (f"error: {samples / 'prompts.json'} holds no prompt list, which `gors generate` records: run "
                       "it again with the flags that made the samples, which writes the file anew, or restore it\n")


@pytest.mark.parametrize("command", ["score", "select", "train"])
def test_a_mistyped_run_folder_is_refused_and_not_created(command, tmp_path, capsys):
    typo = tmp_path / "runs" / "typo"
    message = one_error_line(capsys, [command, "--output_dir", str(typo)])
    assert message.startswith(f"error: --output_dir {typo}: no such run folder; `gors {command}` works on")
    assert not typo.exists()


@pytest.mark.skipif(not (SHARED_BENCHMARKS / "t2i_compbench").is_dir(), reason="shared/benchmarks not present")
def test_a_category_recipe_runs_the_whole_loop_on_its_train_prompts(tiny_sd, tiny_blip, tmp_path, monkeypatch,
                                                                    capsys):
    """recipes/gors_color.py's `run_recipe` at tiny size: color's train prompts, B-VQA, selection, the LoRA;
    a bad flag is one `error:` line and exit status 2, as from `gors`."""
    import json

    from gors.core.distributed import reset_process_state
    from gors.recipes import run_recipe

    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED_BENCHMARKS))
    out = tmp_path / "run"
    config = run_recipe("color", [
        "--output_dir", str(out), "--pretrained_model_name_or_path", str(tiny_sd), "--max_prompts", "2",
        "--images_per_prompt", "2", "--num_inference_steps", "2", "--resolution", "32",
        "--reward_model_name_or_path", str(tiny_blip), "--reward_threshold", "0.0", "--max_train_steps", "1",
        "--report_to", "none"])
    reset_process_state()
    assert (config.category, config.reward_name()) == ("color", "b_vqa")
    prompts = [json.loads(line)["prompt"] for line in (out / "selection.jsonl").read_text().splitlines()]
    train_file = (SHARED_BENCHMARKS / "t2i_compbench" / "color_train.txt").read_text().splitlines()
    assert set(prompts) <= set(train_file[:2]) and prompts
    assert json.loads((out / "selection_summary.json").read_text())["reward"] == "b_vqa"
    assert Path(out / "pytorch_lora_weights.safetensors").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_recipe("color", ["--output_dir", str(tmp_path / "bad"), "--images_per_prompt", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: --images_per_prompt=0")


@pytest.mark.parametrize("error, message", [
    (OSError(28, "No space left on device", "run/samples/part-0/7.png"),
     "error: no space left on the device writing run/samples/part-0/7.png: free some space and run the same command "
     "again; what was finished is kept"),
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors'
     "error: no space left on the device: free some space and run the same command again"),
    (OSError(122, "Disk quota exceeded", "run/checkpoints"), "error: disk quota exceeded writing run/checkpoints: "),
    # torch.save's zip writer on a full disk (a checkpoint's optimizer.bin on a small tmpfs, seen so).
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 155264 vs 155152"),
     "error: a file could not be written whole (torch.save: [enforce fail at inline_container.cc:672] . unexpected "
     "pos 155264 vs 155152): the disk is probably full or over quota; free some space and run the same command"),
    (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
     "error: a file could not be written whole (torch.save: PytorchStreamWriter failed writing file data/0"),
    (OSError(30, "Read-only file system", "out/summary.json"),
     "error: read-only file system writing out/summary.json: pass a folder on a filesystem you can write to"),
    (PermissionError(13, "Permission denied", "run/checkpoints/.checkpoint-3.tmp"),
     "error: permission denied on run/checkpoints/.checkpoint-3.tmp: give this user access to it (chmod, chown) and "
     "run the same command again, or use another folder; what was finished is kept"),
])
def test_a_full_or_read_only_disk_is_one_line_that_says_how_to_go_on(error, message, capsys):
    from gors.cli import expected_errors

    with pytest.raises(SystemExit) as exit_info:
        with expected_errors():
            raise error
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith(message)


def test_the_main_process_losing_a_failed_process_in_a_collective_is_one_line_not_a_traceback(capsys, monkeypatch):
    from gors.cli import expected_errors

    gloo = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                        "[127.0.0.1]:43415. This is typically caused by a remote worker crashing.")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        with expected_errors():
            raise gloo
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err == [
        "error: another process of this launch stopped while this one waited for it: its error (above), or the "
        "launcher's report of its exit, says why"]
    # A download's reset connection is no lost process: its own message stays.
    with pytest.raises(RuntimeError, match="Connection aborted"):
        with expected_errors():
            raise RuntimeError("could not download it (('Connection aborted.', ConnectionResetError(104, "
                               "'Connection reset by peer')))")
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: no peer to lose, a bug of its own
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        with expected_errors():
            raise gloo


def test_a_mistyped_checkpoint_to_resume_from_stops_a_run_before_any_image(make_run_config, tmp_path):
    from gors.core.run_folder import samples_dir
    from gors.run import run

    config = make_run_config(output_dir=str(tmp_path / "run"), resume_from_checkpoint="checkpoint-5OO")
    with pytest.raises(FileNotFoundError, match=r"--resume_from_checkpoint='checkpoint-5OO': no such checkpoint "
                                                r"folder; pass 'latest' or a folder such as"):
        run(config)
    assert not samples_dir(config.output_dir).exists()  # nothing generated


def test_a_mistyped_reward_model_folder_stops_a_run_before_any_image(make_run_config, tmp_path):
    from gors.core.run_folder import samples_dir
    from gors.run import run
    from rewards.combined import check_reward_options

    config = make_run_config(output_dir=str(tmp_path / "run"), reward_model_name_or_path=str(tmp_path / "tiny_bilp"))
    with pytest.raises(FileNotFoundError, match=r"--reward_model_name_or_path=.*tiny_bilp': no such folder\. .*Hub id "
                                                r"such as 'Salesforce/blip-vqa-capfilt-large'"):
        run(config)
    assert not samples_dir(config.output_dir).exists()  # nothing generated
    with pytest.raises(FileNotFoundError, match=r"--reward_model_name_or_path=.*tiny_bilp': no such folder"):
        check_reward_options("b_vqa", {}, model_name_or_path=str(tmp_path / "tiny_bilp"))  # as `gors score` checks
    # In options too, a member's of a composite reward included.
    with pytest.raises(FileNotFoundError, match=r"--reward_options clip_model_name_or_path='\./clip': no such folder\. "
                                                r".*such as 'openai/clip-vit-base-patch32'"):  # the option's default
        check_reward_options("blip_clip", {"clip_model_name_or_path": "./clip"})
    with pytest.raises(FileNotFoundError, match=r"--reward_options model_name_or_path='\./blip': no such folder"):
        check_reward_options("three_in_one", {"b_vqa": {"model_name_or_path": "./blip"}})
    check_reward_options("blip_clip", {"clip_model_name_or_path": "openai/clip-vit-base-patch16"})  # a Hub id: later


def test_a_paper_tau_above_the_rewards_scale_stops_a_run_before_any_image(make_run_config, tmp_path):
    from gors.core.run_folder import samples_dir
    from gors.run import run

    # The non_spatial recipe's metric reward: CLIPScore's raw cosine never reaches the paper's 0.75.
    config = make_run_config(output_dir=str(tmp_path / "run"), reward=None, category="non_spatial",
                             reward_model_name_or_path=None, reward_threshold=None, select_top_fraction=None)
    with pytest.raises(ValueError, match=r"^the paper's non_spatial tau \(0.75\) is above what clip_score scores "
                                         r"\(CLIPScore's raw cosine, .*\), so no sample would be kept .* pass "
                                         r"--reward_threshold, or --select_top_fraction .* or --unbiased$"):
        run(config)
    assert not samples_dir(config.output_dir).exists()  # nothing generated


def test_a_run_says_what_it_will_do_as_the_flags_resolved_it(make_run_config, tmp_path):
    from gors.run import run_plan

    config = make_run_config(output_dir=str(tmp_path / "run"))
    plan = run_plan(config, num_processes=2)
    assert plan.startswith(f"[run] {config.pretrained_model_name_or_path} on {config.train_prompts}: "
                           "3 prompts x 2 images, reward b_vqa, "  # the prompt file's 3 (a blank line is none)
                           "kept: reward > tau (tau = 0); 2 updates of 4 samples (2 per process x 2 x 1)")
    assert plan.endswith(f"-> {config.output_dir}")
    top = run_plan(make_run_config(reward_threshold=None, select_top_fraction=0.25), num_processes=1)
    assert "kept: each prompt's top 0.25 by reward; 2 updates of 2 samples (2 per process x 1 x 1)" in top
    rounds = run_plan(make_run_config(rounds=2, steps_per_round=3, replay="none"), num_processes=1)
    assert "; 6 updates of 2 samples (2 per process x 1 x 1), 2 rounds ->" in rounds  # not --max_train_steps
    # --max_prompts' share of the file, and --global_batch_size's samples per update, the micro-batch found by training.
    auto = run_plan(make_run_config(max_prompts=2, global_batch_size=8, auto_train_batch_size=True), num_processes=2)
    assert ": 2 prompts x 2 images," in auto and "; 2 updates of 8 samples (found before the first step) ->" in auto


def test_a_mistyped_option_on_a_scored_folder_is_named_not_blamed_on_the_folder(tmp_path):
    from gors.config import GenerateConfig, ScoreConfig
    from gors.core.toy import PRETRAINED_DIR
    from gors.generate import generate as generate_stage

    run = str(tmp_path / "run")
    generate_stage(GenerateConfig(output_dir=run, pretrained_model_name_or_path=str(PRETRAINED_DIR / "pipeline"),
                                  train_prompts="toy:train", max_prompts=1, images_per_prompt=1, num_inference_steps=2))
    score(ScoreConfig(output_dir=run, reward="toy_oracle"))
    with pytest.raises(ValueError, match=r"reward 'toy_oracle' has no option 'check'; its options: checks"):
        score(ScoreConfig(output_dir=run, reward="toy_oracle", reward_options={"check": "all"}))


def test_a_mapping_option_that_does_not_parse_is_one_line(capsys):
    from gors.config import ScoreConfig

    with pytest.raises(SystemExit) as err:
        parse_config(ScoreConfig, ["--reward_options", "{checks: all"])
    assert "\n" not in err.value.code
    assert err.value.code.startswith("error: --reward_options='{checks: all' is not valid JSON/YAML: line 1, column 13: ")


def test_sigterm_stops_a_command_as_ctrl_c_does_and_the_error_is_the_last_line(capsys):
    import os
    import signal

    from tqdm import tqdm

    from gors.cli import INTERRUPTED, expected_errors

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        with expected_errors():
            bar = tqdm(total=10, desc="generate")
            bar.update(3)
            os.kill(os.getpid(), signal.SIGTERM)  # as `timeout`, `kill` or Slurm's scancel send it
            pytest.fail("SIGTERM did not stop the command")
    bar.close()  # as the interpreter closes a bar left open on its way out: it must not redraw below the error
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "generate:" in err
    assert err.rstrip("\n").splitlines()[-1] == f"error: {INTERRUPTED}"
    assert signal.getsignal(signal.SIGTERM) == before  # the command's handler is gone with it


def test_an_interrupted_toy_pretraining_says_it_starts_over_and_bare_commands_say_what_they_need(
        tmp_path, monkeypatch, capsys):
    import gors.toy.pretrain

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(gors.toy.pretrain, "pretrain_and_report", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main(["toy", "pretrain", "--output_dir", str(tmp_path / "toy")])
    assert exit_info.value.code == 2
    # It has no checkpoints: "resume where it stopped" would promise what a rerun does not do.
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: interrupted; --output_dir is as it was. The pretraining keeps no checkpoints: run the same command "
        "again to start it over")
    assert one_error_line(capsys, ["toy"]) == "error: gors toy: give its subcommand: gors toy pretrain\n"
    with pytest.raises(SystemExit) as exit_info:  # was its usage, and exit status 0
        main(["download"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: gors download: give the command to download for\nusage: ")


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback(monkeypatch, capsys):
    class ClosedPipe:  # stdout of `gors rewards | head` once head has exited
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise io.UnsupportedOperation("fileno")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    with pytest.raises(SystemExit) as exit_info:
        main(["rewards"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == ""


def test_under_a_multi_process_launch_sigterm_keeps_its_default(monkeypatch):
    # torchrun sends SIGTERM to the other processes when one fails: they end silently, leaving its error.
    import signal

    from gors.cli import expected_errors

    monkeypatch.setenv("WORLD_SIZE", "2")
    before = signal.getsignal(signal.SIGTERM)
    with expected_errors():
        assert signal.getsignal(signal.SIGTERM) == before


def test_the_hub_argument_warning_of_diffusers_config_loading_is_silenced_for_gors_commands(monkeypatch):
    import warnings

    from diffusers import DiffusionPipeline

    from gors.cli import quiet_dependency_warnings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def loading_warnings(silenced: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            if silenced:
                quiet_dependency_warnings()
            with pytest.raises(Exception):  # offline, and not in this machine's cache
                DiffusionPipeline.load_config("stabilityai/stable-diffusion-2-base")
        return [str(w.message) for w in caught if "local_dir_use_symlinks" in str(w.message)]

    assert loading_warnings(silenced=False)  # the dependencies still warn (else this test checks nothing)
    assert loading_warnings(silenced=True) == []


def test_a_home_folder_tilde_in_an_output_or_image_folder_is_expanded_as_a_shell_would(tmp_path, monkeypatch):
    from gors.config import EvaluateConfig, GenerateConfig
    from gors.report import ReportConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text("output_dir: ~/runs/toy\n")
    assert parse_config(GenerateConfig, ["--config", str(tmp_path / "config.yaml")]).output_dir == \
        str(tmp_path / "runs" / "toy")
    evaluation = parse_config(EvaluateConfig, ["--output_dir", "~/eval", "--images", "~/images"])
    assert (evaluation.output_dir, evaluation.images) == (str(tmp_path / "eval"), str(tmp_path / "images"))
    assert ReportConfig(folders=["~/eval"], output_dir="~/report").folders == [str(tmp_path / "eval")]
    from gors.convert_detector import ConvertDetectorConfig
    from gors.official_lora import ConvertLoraConfig
    from gors.toy.pretrain import ToyPretrainConfig

    assert ConvertLoraConfig(source="official:color", output_dir="~/lora").output_dir == str(tmp_path / "lora")
    assert ConvertDetectorConfig("geneval", "official", "~/detector").output_dir == str(tmp_path / "detector")
    assert ToyPretrainConfig(output_dir="~/toy").output_dir == str(tmp_path / "toy")


def test_version_a_mistyped_command_and_help_on_one_process_only(capsys, monkeypatch):
    main(["--version"])
    assert capsys.readouterr().out.startswith("gors ")
    with pytest.raises(SystemExit):
        main(["generat"])
    assert "unknown command 'generat'; did you mean gors generate?" in capsys.readouterr().err
    monkeypatch.setenv("LOCAL_RANK", "1")  # a launched process other than the first: that one prints the help
    with pytest.raises(SystemExit) as stopped:
        parse_config(RunConfig, ["--help"])
    assert stopped.value.code == 0 and capsys.readouterr().out == ""


def test_a_config_made_from_python_refuses_a_value_of_another_type_naming_its_field(tmp_path):
    for fields_, said in [({"images_per_prompt": 4.5}, "--images_per_prompt=4.5 is not a whole number"),
                          ({"max_train_steps": "100"}, "--max_train_steps='100' is not a whole number"),
                          ({"learning_rate": "1e-4"}, "--learning_rate='1e-4' is not a number"),
                          ({"train_prompts": ["a", "b"]}, r"--train_prompts=\['a', 'b'\] is not text"),
                          ({"train_text_encoder": 1}, "--train_text_encoder=1 is not true or false"),
                          ({"validation_prompts": ["a", 2]}, "--validation_prompts: item 2 is not text"),
                          ({"learning_rate": None}, "--learning_rate=None: give a number")]:
        with pytest.raises(ValueError, match=said):
            RunConfig(**fields_)
    with pytest.raises(ValueError, match="--max_prompts='4' is not a whole number"):
        EvaluateConfig(max_prompts="4")
    # What Python code passes naturally: a path for text, a tuple for a list, a whole number for a number, NumPy's
    # numbers, None for no options.
    config = RunConfig(output_dir=tmp_path / "run", validation_prompts=("a red cube",), learning_rate=1,
                       max_train_steps=np.int64(8), adam_epsilon=np.float32(1e-8), reward_options=None)
    assert config.output_dir == str(tmp_path / "run") and config.validation_prompts == ["a red cube"]
    assert type(config.max_train_steps) is int and type(config.adam_epsilon) is float and config.reward_options == {}


def test_the_other_commands_configs_made_from_python_check_their_values_as_their_flags_are():
    from gors.estimate import EstimateConfig
    from gors.official_lora import ConvertLoraConfig
    from gors.push import PushConfig
    from gors.report import ReportConfig
    from gors.status import StatusConfig
    from gors.toy.pretrain import ToyPretrainConfig

    # Before, `lora="middle"` pushed the final LoRA under a commit message naming "the middle LoRA".
    with pytest.raises(ValueError, match=r"^--lora='middle'; choose one of final, best$"):
        PushConfig(output_dir="run", repo_id="me/lora", lora="middle")
    with pytest.raises(ValueError, match=r"^--evaluation='eval' is not a list"):
        PushConfig(output_dir="run", repo_id="me/lora", evaluation="eval")
    with pytest.raises(ValueError, match=r"^--folders='run' is not a list"):
        StatusConfig(folders="run")
    for make, field_ in [(lambda: ReportConfig(folders=["run"], output_dir=3), "--output_dir=3 is not text"),
                         (lambda: EstimateConfig(timings=["run"], num_prompts=7.5),
                          "--num_prompts=7.5 is not a whole number"),
                         (lambda: ConvertLoraConfig(source="color", output_dir=1), "--output_dir=1 is not text"),
                         (lambda: ToyPretrainConfig(num_scenes="100"), "--num_scenes='100' is not a whole number")]:
        with pytest.raises(ValueError, match=field_):
            make()


def test_a_refusal_names_only_the_file_set_flags_it_names_not_those_whose_name_begins_another():
    from gors.cli import _file_source

    # `--validation_steps` is named; `--validation_steps_extra` is no mention of it (nor `--no_train_unet` of
    # `--train_unet_x`), and `--no_<flag>` is a mention.
    message = "--validation_steps_extra=3 is refused; --no_train_unet leaves nothing to train"
    assert _file_source(message, {"validation_steps", "train_unet"}, "run.yaml") == " (--train_unet set in run.yaml)"
    assert _file_source("--validation_steps=0: must be >= 1", {"validation_steps"}, "run.yaml") == \
        " (--validation_steps set in run.yaml)"
    assert _file_source("nothing named", {"validation_steps"}, "run.yaml") == ""
