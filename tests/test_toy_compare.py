"""The paired comparison of two toy evaluations (`recipes/toy_compare.py`), on hand-made results."""

import json

import numpy as np
import pytest

from gors.toy.compare import compare, main, paired_difference, per_prompt_accuracy, per_prompt_results


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
