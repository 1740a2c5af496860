"""Reward option values are checked without any model (`Reward.check_options`), before any work."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest

from evaluators import build_benchmark
from rewards.base import Reward, check_choice, check_number
from rewards.combined import check_reward_options
from rewards.registry import get_reward_class


@pytest.mark.parametrize(
    ("reward", "options", "message"),
    [
        ("toy_oracle", {"checks": "al"}, r"reward 'toy_oracle': checks='al'; choose 'binding'.*or 'all'"),
        ("toy_oracle", {"model_name_or_path": "x"}, "no model to load"),
        ("grounded_sam", {"box_threshold": 1.5}, r"box_threshold must be in \[0, 1\], got 1.5"),
        ("grounded_sam", {"text_threshold": "0.3"}, r"text_threshold='0.3': expected float or None"),  # its type
        ("grounded_sam", {"noun_phrase_backend": "nltk"}, "noun_phrase_backend='nltk'; choose 'auto'"),
        ("grounded_detection", {"threshold": -0.1}, r"threshold must be in \[0, 1\]"),
        ("grounded_detection", {"text_threshold": 0.2, "nms_iou": 0.5}, "give one of them"),
        ("spatial_rule", {"floor": float("nan")}, r"floor must be in \[0, 1\]"),
        ("spatial_rule", {"distance_threshold": 0}, "distance_threshold must be > 0, got 0"),
        ("spatial_3d", {"iou_threshold": 0.0}, r"iou_threshold must be in \(0, 1\]"),
        ("numeracy", {"threshold": 2}, r"threshold must be in \[0, 1\]"),
        ("mllm_cot", {}, "category=None.*color"),
        ("mllm_cot", {"category": "colour"}, "category='colour'"),
        ("mllm_cot", {"category": "color", "max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ("clip_score", {"preprocess": "timm"}, "preprocess='timm'; choose 'openai' or 'transformers'"),
        ("clip_score", {"noun_phrase_backend": "nltk"}, "noun_phrase_backend='nltk'; choose 'auto'"),
        ("spatial_rule", {"noun_rule": "first"}, "noun_rule='first'; choose 'official' or 'head'"),
        ("blip_clip", {"min_length": 40}, "0 <= min_length <= max_length"),
        ("soft_tifa", {"aggregation": "mean"}, "aggregation='mean'; choose 'am' or 'gm'"),
        ("soft_tifa", {"multi_token": "all"}, "multi_token='all'"),
        ("b_vqa", {"decimals": -1}, "decimals must be >= 0 or None, got -1"),
        ("b_vqa", {"max_questions": -2}, "max_questions must be >= 0"),
        ("b_vqa", {"question_start": "bos"}, "question_start='bos'; choose 'enc' or 'cls'"),
        ("b_vqa", {"noun_phrase_backend": "bogus"}, "noun_phrase_backend='bogus'; choose 'auto'"),  # was after BLIP
        ("b_vqa", {"image_size": "big"}, "image_size='big': expected int or None"),  # was a TypeError in resizing
        ("b_vqa", {"image_size": 8}, "image_size must be >= 16 or None, got 8"),
        ("b_vqa", {"model_name_or_path": 5}, "model_name_or_path=5: expected str or None"),
        ("b_vqa", {"max_questions": True}, "max_questions=True: expected int"),
        ("geneval", {"threshold": 1.0}, r"threshold=1.0: .* \[0, 1\)"),
        ("geneval", {"counting_threshold": "high"}, r"counting_threshold='high': expected float"),
        ("geneval", {"max_objects": 0}, "max_objects must be >= 1, got 0"),
        ("geneval", {"detector_image_size": 800}, "detector_image_size=800: give"),
    ],
)
def test_a_bad_value_is_refused_without_a_model_naming_the_flag(reward, options, message):
    with pytest.raises(ValueError, match=message) as caught:
        check_reward_options(reward, options, flag="--some_flag")
    assert str(caught.value).startswith(f"--some_flag: reward {reward!r}: ")


@pytest.mark.parametrize(
    ("reward", "options"),
    [("toy_oracle", {"checks": "all"}), ("grounded_sam", {"text_threshold": None, "box_threshold": 1}),
     ("spatial_rule", {"threshold": None, "text_threshold": 0.25, "iou_threshold": 0.2}),
     ("mllm_cot", {"category": "spatial"}), ("blip_clip", {"max_length": 40}), ("tifa", {"aggregation": "am"}),
     ("b_vqa", {}), ("b_vqa", {"decimals": None, "question_start": "cls"}),
     ("b_vqa", {"model_name_or_path": Path("blip"), "image_size": 480, "max_questions": numpy.int64(3)}),
     ("spatial_rule", {"complex": numpy.bool_(True), "iou_threshold": numpy.float32(0.5)}),
     ("geneval", {"threshold": 0.5, "detector_image_size": None}), ("geneval", {"detector_image_size": [512, 1024]})],
)
def test_good_values_pass(reward, options):
    check_reward_options(reward, options)


def test_the_default_hook_checks_nothing_and_the_helpers_refuse_non_numbers():
    Reward.check_options({"anything": object()})
    with pytest.raises(ValueError, match="x must be >= 1, got True"):
        check_number("x", True, 1, float("inf"))
    with pytest.raises(ValueError, match=r"x=\[1\]; choose 'a' or 'b'"):
        check_choice("x", [1], ("a", "b"))
    # None is a value only where the option says so.
    with pytest.raises(ValueError, match=r"x must be in \[0, 1\], got None"):
        check_number("x", None)
    check_number("x", None, optional=True)
    with pytest.raises(ValueError, match=r"x=None; choose 'a' or 'b'"):
        check_choice("x", None, ("a", "b"))
    check_choice("x", None, ("a", None))


def test_members_of_a_reward_list_are_checked():
    with pytest.raises(ValueError, match="--reward_options: reward 'toy_oracle': checks='al'"):
        check_reward_options("toy_oracle:0.5,toy_classifier:0.5", {"toy_oracle": {"checks": "al"}})


def test_init_runs_the_same_check():
    cls = get_reward_class("toy_oracle")
    with pytest.raises(ValueError, match="checks='al'"):
        cls(checks="al")


def test_benchmark_scorers_and_columns_are_checked_with_the_flag_given():
    toy = build_benchmark("toy", None)
    with pytest.raises(ValueError, match=r"^--validation_scorer_options: toy's scorer 'toy_oracle': checks='x'"):
        toy.check_scorer_options("toy", {"checks": "x"}, flag="--validation_scorer_options")
    color = build_benchmark("t2i_compbench", "color")
    with pytest.raises(ValueError, match=r"--scorer_options: .*MLLM-CoT scorer 'mllm_cot': max_new_tokens"):
        color.check_scorer_options("t2i_compbench:color", {}, {"MLLM-CoT": {"max_new_tokens": 0}},
                                   extra_columns=["MLLM-CoT"])


@pytest.mark.parametrize(("columns", "extra", "with_columns", "message"), [
    (3, [], True, r"color's columns options are 3; give a mapping of column name to its options"),  # was a traceback
    ({"B-CLIP": 3}, [], True, r"the options of t2i_compbench:color's column 'B-CLIP' are 3; give a mapping"),
    ({"Nope": {}}, [], True, r"column 'Nope', which this evaluation does not compute \(it has no such column; its "
                             r"columns: B-CLIP, CLIPScore, MLLM-CoT\)"),
    ({"MLLM-CoT": {}}, [], True, r"'MLLM-CoT', .*\(it is optional and --columns does not ask for it;"),
    ({"CLIPScore": {}}, [], False, r"'CLIPScore', .*\(--columns none computes no column;"),  # was ignored
])
def test_column_options_of_no_computed_column_or_no_mapping_are_refused(columns, extra, with_columns, message):
    color = build_benchmark("t2i_compbench", "color")
    with pytest.raises(ValueError, match=rf"^--scorer_options: .*{message}"):
        color.check_scorer_options("t2i_compbench:color", {}, columns, extra_columns=extra, with_columns=with_columns)


def test_scorer_options_may_be_keyed_by_the_label_of_a_default_subset(tmp_path):
    from gors.config import EvaluateConfig
    from gors.evaluate import plan_benchmarks

    config = EvaluateConfig(benchmarks="toy", output_dir=str(tmp_path), scorer_options={"toy:held_out": {"checks": "x"}})
    with pytest.raises(ValueError, match=r"toy:held_out's scorer 'toy_oracle': checks='x'"):  # was "not evaluated"
        plan_benchmarks(config)
    config = EvaluateConfig(benchmarks="toy", output_dir=str(tmp_path), scorer_options={"toy:train": {}})
    with pytest.raises(ValueError, match=r"--scorer_options for \['toy:train'\], which are not among the benchmarks "
                                         r"evaluated \(toy:held_out\)"):
        plan_benchmarks(config)
    # Keyed by the benchmark's name and by its subset's label, the label's value wins: it is the narrower key.
    config = EvaluateConfig(benchmarks="toy:held_out", output_dir=str(tmp_path),
                            scorer_options={"toy": {"checks": "binding"}, "toy:held_out": {"checks": "all"}})
    (plan,) = plan_benchmarks(config)
    assert plan.options == {"checks": "all"}


@pytest.mark.parametrize(
    ("reward", "options", "message"),
    [
        ("tit_score", {"judge": "vlm"}, "judge='vlm'; choose 'embedding' or 'llm'"),
        ("tit_score", {"mapping": "linear"}, "mapping='linear'"),
        ("tit_score", {"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ("tit_score", {"embedding_dtype": "int8"}, "embedding_dtype='int8' is not a dtype"),
        ("three_in_one", {"subsplits": "all"}, "subsplits='all'; choose 'official' or 'none'"),
        ("three_in_one", {"model_name_or_path": "x"}, "combines three models"),
        ("three_in_one", {"b_vqa": {"decimals": -1}}, "b_vqa: decimals must be >= 0"),
        ("three_in_one", {"spatial_rule": {"floor": 2}}, r"spatial_rule: floor must be in \[0, 1\]"),
        ("three_in_one", {"clip_score": {"bogus": 1}}, "clip_score has no option 'bogus'"),
        ("three_in_one", {"questions": "a.json", "b_vqa": {"questions": "b.json"}}, "two question tables"),
        # A member's options that are no mapping are named as such (not a TypeError or AttributeError).
        ("three_in_one", {"spatial_rule": 5}, "spatial_rule: its options are 5; give a mapping"),
        ("three_in_one", {"b_vqa": "table.json"}, "b_vqa: its options are 'table.json'; give a mapping"),
    ],
)
def test_tit_score_and_three_in_one_values_are_refused_without_a_model(reward, options, message):
    with pytest.raises(ValueError, match=message):
        check_reward_options(reward, options, flag="--some_flag")
    check_reward_options(reward, {})


def test_the_reward_model_flag_and_a_lists_options_are_checked_before_any_work():
    with pytest.raises(ValueError, match=r"^--reward_model_name_or_path='m': toy_oracle has no model to load"):
        check_reward_options("toy_oracle", {}, model_name_or_path="m")
    with pytest.raises(ValueError, match=r"--reward_model_name_or_path='m' and --reward_options model_name_or_path="
                                         r"'n' disagree"):
        check_reward_options("b_vqa", {"model_name_or_path": "n"}, model_name_or_path="m")
    with pytest.raises(ValueError, match=r"--reward_model_name_or_path='m' is ambiguous for the reward list"):
        check_reward_options("toy_oracle:0.5,toy_classifier:0.5", {}, model_name_or_path="m")
    with pytest.raises(ValueError, match=r"^--reward_options: 'checks' names no member of the reward list "
                                         r"'toy_oracle:0.5,toy_classifier:0.5' \('toy_oracle', 'toy_classifier'\): its "
                                         r"options are keyed by member, e.g. '\{\"toy_oracle\": \{\"checks\": ...\}\}'$"):
        check_reward_options("toy_oracle:0.5,toy_classifier:0.5", {"checks": "all"})
    # A member's name mistyped, or a `module:Class` member named by its class alone: that member is suggested.
    with pytest.raises(ValueError, match=r"'toy_orcale' names no member .* e.g. '\{\"toy_oracle\": \{...\}\}'$"):
        check_reward_options("toy_oracle:0.5,toy_classifier:0.5", {"toy_orcale": {"checks": "all"}})
    with pytest.raises(ValueError, match=r"'GenEvalGradedReward' names no member .* e.g. "
                                         r"'\{\"rewards.geneval_graded:GenEvalGradedReward\": \{...\}\}'$"):
        check_reward_options("toy_oracle:0.5,rewards.geneval_graded:GenEvalGradedReward:0.5",
                             {"GenEvalGradedReward": {}})
    with pytest.raises(ValueError, match=r"'geneval_graded_reward' names no member .* e.g. "
                                         r"'\{\"rewards.geneval_graded:GenEvalGradedReward\": \{...\}\}'$"):
        check_reward_options("toy_oracle:0.5,rewards.geneval_graded:GenEvalGradedReward:0.5",
                             {"geneval_graded_reward": {}})
    check_reward_options("toy_oracle:0.5,toy_classifier:0.5", {"toy_oracle": {"checks": "all"}})
