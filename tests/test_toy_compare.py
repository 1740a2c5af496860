"""The paired comparison of two toy evaluations (`recipes/toy_compare.py`), on hand-made results."""

import json

import numpy as np
import pytest

from gors.toy.compare import compare, main, paired_difference, per_prompt_accuracy, per_prompt_results, results_file


def _rows(correct: dict[str, list[bool]]) -> list[dict]:
    return [{"prompt": prompt, "image_index": i, "correct": value}
            for prompt, values in correct.items() for i, value in enumerate(values)]


def _evaluation(folder, correct: dict[str, list[bool]], run_folder: bool = False):
    target = folder / "eval_gors" if run_folder else folder
    target.mkdir(parents=True)
    (target / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in _rows(correct)))
    return folder


def test_per_prompt_accuracy_and_the_paired_difference():
    a = per_prompt_accuracy(per_prompt_results(_rows({"p": [True, False], "q": [False, False]})))
    b = per_prompt_accuracy(per_prompt_results(_rows({"p": [True, True], "q": [True, False]})))
    assert a == {"p": 0.5, "q": 0.0} and b == {"p": 1.0, "q": 0.5}
    mean, error = paired_difference(a, b)
    assert mean == pytest.approx(0.5) and error == pytest.approx(0.0)  # every prompt gains the same
    mean, error = paired_difference({"p": 0.0, "q": 0.0}, {"p": 1.0, "q": 0.0}, resamples=4000)
    assert mean == pytest.approx(0.5) and error == pytest.approx(0.5 / np.sqrt(2), abs=0.02)  # sd / sqrt(n)
    with pytest.raises(ValueError, match=r"differ in their prompts \(1 in one only\)"):
        paired_difference({"p": 0.0}, {"p": 0.0, "q": 1.0})


def test_pairs_of_run_and_evaluation_folders_and_their_mean(tmp_path, capsys):
    one = [_evaluation(tmp_path / f"one{s}", {"p": [True, False], "q": [False, False]}, run_folder=True)
           for s in (0, 1)]
    rounds = [_evaluation(tmp_path / f"rounds{s}", {"p": [True, True], "q": [s == 1, False]}) for s in (0, 1)]
    table = compare([one[0], rounds[0], one[1], rounds[1]])
    assert [row[3] for row in table] == pytest.approx([0.25, 0.5, 0.375])
    assert table[-1][0] == "mean of the pairs" and table[-1][1:3] == pytest.approx([0.25, 0.625])
    main([str(one[0]), str(rounds[0])])
    assert "+0.250" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([str(one[0]), str(rounds[0]), str(one[1])])
    assert exit_info.value.code == 2 and "error: 3 folders: give pairs A B" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), str(rounds[0])])
    assert "holds neither results.jsonl nor eval_gors/results.jsonl" in capsys.readouterr().err


def test_evaluations_of_other_prompts_or_images_per_prompt_are_refused(tmp_path, capsys):
    a = _evaluation(tmp_path / "a", {"p": [True, False, True], "q": [False, False, True]})
    fewer = _evaluation(tmp_path / "fewer", {"p": [True], "q": [False]})  # the first image of each, same seeds
    other = _evaluation(tmp_path / "other", {"p": [True, True, True], "r": [True, True, True]})
    b = _evaluation(tmp_path / "b", {"p": [True, True, True], "q": [True, True, True]})
    with pytest.raises(ValueError, match=r"fewer was evaluated with other images per prompt than .*a: compare "
                                         r"evaluations made with one --eval_images_per_prompt"):
        compare([a, fewer])
    with pytest.raises(SystemExit) as exit_info:  # a second pair of other prompts: one line, not a KeyError
        main([str(a), str(b), str(other), str(b)])
    assert exit_info.value.code == 2 and "other was evaluated on other prompts than" in capsys.readouterr().err


def test_a_prompts_accuracy_is_the_mean_over_all_its_images():
    """Three images, one right: 1/3 (a median or the first image would say 0)."""
    results = per_prompt_results(_rows({"p": [True, False, False], "q": [False, True, True]}))
    assert results == {"p": [1.0, 0.0, 0.0], "q": [0.0, 1.0, 1.0]}
    assert per_prompt_accuracy(results) == pytest.approx({"p": 1 / 3, "q": 2 / 3})


def test_the_paired_difference_pairs_prompts_by_name_whatever_their_order():
    """The same prompts written in another order give the same mean and the same bootstrap error, and a
    same-sized evaluation of other prompts is refused rather than paired by position."""
    a = {"p": 0.0, "q": 0.25, "r": 0.5, "s": 1.0}
    b = {"p": 1.0, "q": 0.25, "r": 0.0, "s": 1.0}
    reordered_a, reordered_b = dict(reversed(a.items())), dict(sorted(b.items(), key=lambda item: item[1]))
    assert paired_difference(a, b) == paired_difference(reordered_a, reordered_b)
    assert paired_difference(a, b)[0] == pytest.approx(0.125)  # b - a, not a - b
    with pytest.raises(ValueError, match=r"differ in their prompts \(2 in one only\)"):
        paired_difference({"p": 0.0}, {"q": 0.0})


def test_the_bootstrap_error_follows_its_seed_and_is_precise_at_the_default_resamples():
    """The seed is the bootstrap's: one seed repeats its error, others draw other resamples; with the default
    number of resamples every seed's error is within a few percent of sd / sqrt(n)."""
    a = {f"p{i:02d}": 0.0 for i in range(40)}
    b = {f"p{i:02d}": (i % 4) / 4 for i in range(40)}
    expected = np.std(list(b.values())) / np.sqrt(len(b))
    errors = [paired_difference(a, b, seed=seed)[1] for seed in range(10)]
    assert paired_difference(a, b, seed=3) == paired_difference(a, b, seed=3)
    assert len(set(errors)) == len(errors)  # each seed its own resamples
    assert errors == pytest.approx([expected] * len(errors), rel=0.06)


def test_the_table_names_each_pair_by_b_and_gives_a_then_b(tmp_path):
    """One pair: one row, named after its B folder, A's accuracy before B's; several pairs: the mean row
    averages every pair's A and every pair's B prompt by prompt."""
    a0 = _evaluation(tmp_path / "a0", {"p": [False, False], "q": [False, False]})
    b0 = _evaluation(tmp_path / "b0", {"p": [True, True], "q": [True, False]})
    a1 = _evaluation(tmp_path / "a1", {"p": [True, True], "q": [True, False]})
    b1 = _evaluation(tmp_path / "b1", {"p": [True, True], "q": [True, True]})
    table = compare([a0, b0])
    assert len(table) == 1 and table[0][0] == str(b0) and table[0][1:4] == pytest.approx([0.0, 0.75, 0.75])
    table = compare([a0, b0, a1, b1])
    assert [row[0] for row in table] == [str(b0), str(b1), "mean of the pairs"]
    assert table[1][1:4] == pytest.approx([0.75, 1.0, 0.25])
    assert table[2][1:4] == pytest.approx([0.375, 0.875, 0.5])  # A: (0 + 0.75) / 2, B: (0.75 + 1) / 2


def test_fewer_prompts_or_more_images_on_any_prompt_are_refused_too(tmp_path):
    """A subset of the first's prompts, more images per prompt, or other images on one prompt only: each
    measures another sample; no pairs at all is refused as an odd count is."""
    a = _evaluation(tmp_path / "a", {"p": [True, False], "q": [False, False]})
    subset = _evaluation(tmp_path / "subset", {"p": [True, True]})
    more = _evaluation(tmp_path / "more", {"p": [True, True, True], "q": [True, True, True]})
    one_prompt = _evaluation(tmp_path / "one_prompt", {"p": [True, True], "q": [True, True, True]})
    with pytest.raises(ValueError, match=r"subset was evaluated on other prompts than .*a \(1 in one only\)"):
        compare([a, subset])
    for other in (more, one_prompt):
        with pytest.raises(ValueError, match=f"{other.name} was evaluated with other images per prompt"):
            compare([a, other])
    with pytest.raises(ValueError, match="0 folders: give pairs A B"):
        compare([])


def test_a_run_folder_whose_results_name_is_a_folder_reads_its_final_evaluation(tmp_path):
    """Only a file counts as an evaluation's results: a folder of that name is passed over."""
    run = _evaluation(tmp_path / "run", {"p": [True]}, run_folder=True)
    (run / "results.jsonl").mkdir()
    assert results_file(run) == run / "eval_gors" / "results.jsonl"
