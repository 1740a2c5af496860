"""generate, score and select on tiny models: outputs, resume after an interruption, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gors.core.store
from gors.core.io import atomic_write_jsonl
from gors.core.scoring import load_scores
from gors.core.store import SampleStore, StoreError, sample_seed
from gors.generate import generate
from gors.score import score
from gors.select import select


class Interrupt(RuntimeError):
    pass


def _interrupt_after(monkeypatch, owner, name, calls):
    """Make `owner.name` raise on call number `calls + 1`, as a crash at that point would."""
    original = getattr(owner, name)
    count = {"n": 0}

    def wrapped(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise Interrupt(f"interrupted after {calls} calls")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def _keys(store):
    return [(r["prompt_index"], r["image_index"]) for r in store.records()]


def test_generate_writes_an_imagefolder_with_seeds(make_run_config):
    config = make_run_config()
    store = generate(config)
    records = store.records()
    assert _keys(store) == [(p, i) for p in range(3) for i in range(2)]
    assert records[0]["prompt"] == "a red circle and a blue square"  # CRLF and blank line handled
    assert all(r["seed"] == sample_seed(0, r["prompt_index"], r["image_index"]) for r in records)
    assert Image.open(store.image_path(records[0])).size == (32, 32)
    assert json.loads((store.root / "prompts.json").read_text())["prompts"][2] == "a yellow circle"


def test_generate_given_a_seed_seeds_its_images_from_it_and_records_the_model(make_run_config):
    """generate's `seed` argument (an online round's) is every image's base seed instead of config.seed; records name the model."""
    config = make_run_config(max_prompts=1)
    records = generate(config, seed=7).records()
    assert all(r["model"] == config.pretrained_model_name_or_path for r in records)
    assert [r["seed"] for r in records] == [sample_seed(7, 0, i) for i in range(2)] != [sample_seed(0, 0, i) for i in range(2)]


def test_generate_records_the_metadata_of_the_prompts_it_generates_only(make_run_config, tmp_path):
    """With --max_prompts, the store's prompts.json keeps the metadata rows of the prompts generated, not the whole set's."""
    prompts = tmp_path / "rows.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"a cat number {i}", "tag": f"t{i}"}) + "\n" for i in range(3)))
    config = make_run_config(train_prompts=str(prompts), max_prompts=1, images_per_prompt=1)
    store = generate(config)
    info = json.loads((store.root / "prompts.json").read_text())
    assert info["prompts"] == ["a cat number 0"] and [row["tag"] for row in info["metadata"]] == ["t0"]


def test_generate_resumes_without_duplicates_or_losses(make_run_config, tmp_path, monkeypatch):
    reference = generate(make_run_config(output_dir=str(tmp_path / "reference")))
    monkeypatch.undo()
    config = make_run_config()
    # A crash while the second batch of 2 is written: its first image is on disk, neither has a record.
    _interrupt_after(monkeypatch, gors.core.store, "atomic_save_image", 3)
    with pytest.raises(Interrupt):
        generate(config)
    assert len(SampleStore(tmp_path / "run" / "samples").records()) == 2  # the finished batch's records kept
    monkeypatch.undo()
    store = generate(config)
    assert _keys(store) == _keys(reference)
    for got, want in zip(store.records(), reference.records()):
        a = np.asarray(store.open_image(got), dtype=int)
        b = np.asarray(reference.open_image(want), dtype=int)
        assert np.abs(a - b).max() <= 1  # same seed; another batch moves a pixel by at most 1/255


def test_generate_refuses_a_store_of_other_prompts(make_run_config, tmp_path):
    generate(make_run_config())
    other = tmp_path / "other.txt"
    other.write_text("a purple hexagon\n")
    with pytest.raises(StoreError, match="another prompt set"):
        generate(make_run_config(train_prompts=str(other)))


def test_generate_regenerates_a_deleted_image(make_run_config):
    store = generate(make_run_config())
    victim = store.records()[2]
    store.image_path(victim).unlink()
    store = generate(make_run_config())
    assert len(store.records()) == 6 and store.image_path(victim).exists()


def test_score_writes_details_and_resumes(make_run_config, monkeypatch):
    from rewards.b_vqa import BVQAReward

    config = make_run_config()
    generate(config)
    _interrupt_after(monkeypatch, BVQAReward, "score", 1)
    with pytest.raises(Interrupt):
        score(config)
    assert len(load_scores(config.output_dir, "b_vqa")) == 2  # the finished batch is kept
    monkeypatch.undo()
    scores = score(config)
    assert sorted(scores) == [(p, i) for p in range(3) for i in range(2)]
    row = scores[(0, 0)]
    assert 0.0 <= row["reward"] <= 1.0
    assert row["details"]["questions"] == ["a red circle?", "a blue square?"]
    assert row["reward"] == round(np.prod([round(p, 4) for p in row["details"]["p_yes"]]), 4)  # as the official
    lines = (config.output_dir + "/scores/b_vqa/part-00000.jsonl")
    assert sum(1 for _ in open(lines)) == 6  # nothing scored twice
    metadata = SampleStore(config.output_dir + "/samples").records()
    assert metadata[0]["reward_b_vqa"] == row["reward"]
    # The folder records what made its scores; other reward options are refused, not mixed in.
    settings = json.loads(Path(config.output_dir, "scores", "b_vqa", "settings.json").read_text())
    assert settings["reward"] == "b_vqa" and settings["options"] == {} and settings["dtype"] == "float32"
    config.reward_options = {"max_questions": 1}
    with pytest.raises(StoreError, match="holds scores made with"):
        score(config)


def test_score_stops_on_a_corrupt_image_and_keeps_finished_scores(make_run_config):
    config = make_run_config()
    store = generate(config)
    store.image_path(store.records()[4]).write_bytes(b"\x89PNG broken")
    with pytest.raises(StoreError, match=r"00002_000.png is not a readable image"):
        score(config)
    assert len(load_scores(config.output_dir, "b_vqa")) == 4


def _fake_scored_run(tmp_path, category, rewards_by_prompt):
    """A run folder with samples and 'b_vqa' scores, written by hand (no model needed)."""
    store = SampleStore(tmp_path / "samples")
    n = max(rewards_by_prompt) + 1
    store.save_prompts({"name": "x", "category": category, "source": "test", "prompts": [f"p{i}" for i in range(n)]})
    rows = []
    for p, reward in rewards_by_prompt.items():
        record = {"file_name": f"{p:05d}_000.png", "prompt": f"p{p}", "prompt_index": p, "image_index": 0, "seed": p}
        stored = store.append(0, Image.new("RGB", (8, 8)), record)
        rows.append({"prompt_index": p, "image_index": 0, "path": f"part-00000/{p:05d}_000.png", "reward": reward,
                     "image_sha256": stored["image_sha256"]})
    atomic_write_jsonl(tmp_path / "scores" / "b_vqa" / "part-00000.jsonl", rows)


def test_a_mistyped_reward_option_is_named_as_such_before_the_folders_scores_are_compared(tmp_path):
    """score names an option its reward does not take, rather than calling it a mismatch with the folder's scores."""
    from gors.config import ScoreConfig

    _fake_scored_run(tmp_path, None, {0: 0.5, 1: 0.6})
    (tmp_path / "scores" / "b_vqa" / "settings.json").write_text(json.dumps({"reward": "b_vqa", "options": {}}))
    config = ScoreConfig(output_dir=str(tmp_path), reward="b_vqa", reward_options={"max_question": 1})
    with pytest.raises(ValueError, match=r"--reward_options: reward 'b_vqa' has no option 'max_question'"):
        score(config)


def test_score_refuses_a_category_other_than_the_samples(tmp_path):
    """score with --category other than the generated prompts' is refused before any work, naming both categories."""
    from gors.config import ScoreConfig

    _fake_scored_run(tmp_path, "color", {0: 0.5, 1: 0.6})
    with pytest.raises(ValueError, match=r"--category='spatial' .*but the samples in .*samples are 'color' prompts"):
        score(ScoreConfig(output_dir=str(tmp_path), category="spatial"))


def test_select_uses_template_and_natural_thresholds(tmp_path, make_run_config):
    # color: tau 0.92 for the 560 template prompts, 0.7 for natural prompts after them
    _fake_scored_run(tmp_path, "color", {0: 0.95, 1: 0.8, 560: 0.8, 561: 0.6})
    summary = select(make_run_config(output_dir=str(tmp_path), reward_threshold=None))
    kept = [json.loads(line) for line in (tmp_path / "selection.jsonl").read_text().splitlines()]
    assert [(row["prompt_index"], row["threshold"]) for row in kept] == [(0, 0.92), (560, 0.7)]
    assert summary["num_selected"] == 2 and summary["selected"]["mean"] == pytest.approx(0.875)


def test_select_with_explicit_threshold_and_strict_inequality(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, None, {0: 0.5, 1: 0.6})
    summary = select(make_run_config(output_dir=str(tmp_path), reward_threshold=0.5))
    assert summary["num_selected"] == 1  # reward > tau, not >=


def test_select_with_a_threshold_other_than_one_half_and_its_summary(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, None, {0: 0.5, 1: 0.6, 2: 0.3, 3: 0.1})
    summary = select(make_run_config(output_dir=str(tmp_path), reward_threshold=0.4))
    kept = [json.loads(line) for line in (tmp_path / "selection.jsonl").read_text().splitlines()]
    assert [(row["prompt_index"], row["threshold"]) for row in kept] == [(0, 0.4), (1, 0.4)]
    assert summary["threshold"] == "tau = 0.4"
    assert (summary["num_samples"], summary["num_selected"], summary["num_prompts_with_selection"]) == (4, 2, 2)
    assert summary["all"]["count"] == 4 and summary["dropped"]["mean"] == pytest.approx(0.2)
    assert summary["selected"]["mean"] == pytest.approx(0.55)


def test_the_summary_counts_the_prompts_with_a_selection_not_their_samples(tmp_path, make_run_config):
    store = SampleStore(tmp_path / "samples")
    store.save_prompts({"name": "x", "category": None, "source": "test", "prompts": ["p0", "p1"]})
    rows = []
    for p, i, reward in ((0, 0, 0.9), (0, 1, 0.8), (1, 0, 0.1)):
        stored = store.append(0, Image.new("RGB", (8, 8)), {"file_name": f"{p:05d}_{i:03d}.png", "prompt": f"p{p}",
                                                            "prompt_index": p, "image_index": i, "seed": i})
        rows.append({"prompt_index": p, "image_index": i, "path": f"part-00000/{p:05d}_{i:03d}.png", "reward": reward,
                     "image_sha256": stored["image_sha256"]})
    atomic_write_jsonl(tmp_path / "scores" / "b_vqa" / "part-00000.jsonl", rows)
    summary = select(make_run_config(output_dir=str(tmp_path), reward_threshold=0.5))
    assert (summary["num_selected"], summary["num_prompts_with_selection"]) == (2, 1)  # two images of one prompt


def test_select_without_survivors_shows_distribution_and_threshold(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, "spatial", {0: 0.1, 1: 0.35})
    with pytest.raises(ValueError) as error:
        select(make_run_config(output_dir=str(tmp_path), reward_threshold=None))
    message = str(error.value)
    assert "category 'spatial'" in message and "0.80" in message
    assert "[0.1, 0.2) # 1" in message and "[0.3, 0.4) # 1" in message
    assert not (tmp_path / "selection.jsonl").exists()


def test_select_needs_a_threshold_for_custom_prompts(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, None, {0: 0.9})
    with pytest.raises(ValueError, match="--reward_threshold"):
        select(make_run_config(output_dir=str(tmp_path), reward_threshold=None))


def test_select_refuses_unscored_samples(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, None, {0: 0.9})
    SampleStore(tmp_path / "samples").append(
        0, Image.new("RGB", (8, 8)), {"file_name": "00000_001.png", "prompt": "p0", "prompt_index": 0, "image_index": 1}
    )
    with pytest.raises(StoreError, match="gors score"):
        select(make_run_config(output_dir=str(tmp_path)))


def test_select_on_an_empty_store_says_to_generate(tmp_path, make_run_config):
    SampleStore(tmp_path / "samples").save_prompts({"name": "x", "category": None, "source": "test", "prompts": ["p"]})
    with pytest.raises(StoreError, match=f"no samples in {tmp_path / 'samples'}: run `gors generate"):
        select(make_run_config(output_dir=str(tmp_path)))


def test_select_without_reward_names_the_rewards_the_folder_has_scores_of(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, None, {0: 0.9})
    (tmp_path / "scores" / "b_vqa").rename(tmp_path / "scores" / "toy_oracle")
    with pytest.raises(StoreError, match="b_vqa is the default reward; this folder has scores of toy_oracle: pass "
                                         "--reward toy_oracle"):
        select(make_run_config(output_dir=str(tmp_path), reward=None))
    with pytest.raises(StoreError, match=r"Run `gors score --output_dir .* --reward b_vqa` first\.$"):
        select(make_run_config(output_dir=str(tmp_path), reward="b_vqa"))  # chosen: no other suggestion
    # The default reward's own folder, scored for some samples only, is no suggestion: the other reward is.
    partial = tmp_path / "partial"
    _fake_scored_run(partial, None, {0: 0.9, 1: 0.5})
    scores = partial / "scores" / "b_vqa" / "part-00000.jsonl"
    (partial / "scores" / "toy_oracle").mkdir()
    (partial / "scores" / "toy_oracle" / "part-00000.jsonl").write_text(scores.read_text())
    scores.write_text(scores.read_text().splitlines()[0] + "\n")
    with pytest.raises(StoreError, match="1 of 2 samples have no 'b_vqa' score .* b_vqa is the default reward; this "
                                         "folder has scores of toy_oracle: pass --reward toy_oracle, or run"):
        select(make_run_config(output_dir=str(partial), reward=None))


def test_the_rewards_a_folder_has_scores_of_are_listed_sorted(tmp_path):
    from gors.select import scored_rewards

    # Sorted, whatever order the filesystem lists the folders in (a suggestion's first reward is stable); a folder
    # whose settings.json records its reward is listed by it, as --reward takes it.
    for name in ("a_reward", "b_vqa", "clip", "d_reward", "e_reward"):
        (tmp_path / "scores" / name).mkdir(parents=True)
    (tmp_path / "scores" / "b_vqa" / "settings.json").write_text(json.dumps({"reward": "b_vqa:0.5,clip:0.5"}))
    assert scored_rewards(tmp_path) == ["a_reward", "b_vqa:0.5,clip:0.5", "clip", "d_reward", "e_reward"]


def test_select_with_unbiased_gives_only_the_command_to_score_with_its_reward(tmp_path, make_run_config):
    """--unbiased chose the reward: no advice to select by the folder's other scores instead."""
    _fake_scored_run(tmp_path, "color", {0: 0.95})
    with pytest.raises(StoreError, match=r"no 'grounded_sam' score .* Run `gors score --output_dir .* --reward "
                                         r"grounded_sam` first\.$"):
        select(make_run_config(output_dir=str(tmp_path), reward=None, unbiased=True, reward_threshold=None))


def test_select_refuses_a_category_other_than_the_samples(tmp_path, make_run_config):
    _fake_scored_run(tmp_path, "color", {0: 0.95})
    with pytest.raises(ValueError, match=r"--category='shape' .*but the samples in .*samples are 'color' prompts"):
        select(make_run_config(output_dir=str(tmp_path), reward=None, category="shape", reward_threshold=None))


def test_a_process_that_does_not_write_selects_silently_and_writes_nothing(tmp_path, make_run_config, capsys):
    """Under several processes all select and one writes: the others print no warning and leave no file."""
    _fake_scored_run(tmp_path, None, {0: 0.0, 1: 0.5})
    summary = select(make_run_config(output_dir=str(tmp_path), reward_threshold=None, select_top_fraction=1.0),
                     write=False)
    assert summary["num_selected"] == 2 and capsys.readouterr().err == ""
    assert not (tmp_path / "selection.jsonl").exists() and not (tmp_path / "selection_summary.json").exists()


def test_select_top_fraction_warns_of_zero_rewards_and_refuses_only_zeros(tmp_path, make_run_config, capsys):
    _fake_scored_run(tmp_path, None, {0: 0.0, 1: 0.5})
    select(make_run_config(output_dir=str(tmp_path), reward_threshold=None, select_top_fraction=1.0))
    assert "1 of the 2 kept samples have b_vqa 0 and train nothing" in capsys.readouterr().err
    _fake_scored_run(tmp_path / "zeros", None, {0: 0.0, 1: 0.0})
    with pytest.raises(ValueError, match="every one of the 2 samples --select_top_fraction keeps has b_vqa 0"):
        select(make_run_config(output_dir=str(tmp_path / "zeros"), reward_threshold=None, select_top_fraction=1.0))


def test_top_fraction_keeps_each_prompts_best_images():
    from gors.select import top_fraction

    rewards = [(0, 0, 0.2), (0, 1, 0.9), (0, 2, 0.5), (0, 3, 0.9), (1, 0, 0.1), (1, 1, 0.3)]
    assert top_fraction(rewards, 0.5) == {(0, 1), (0, 3), (1, 1)}  # ceil(0.5 x 4) = 2 and ceil(0.5 x 2) = 1
    assert top_fraction(rewards, 0.25) == {(0, 1), (1, 1)}  # a tie of 0.9: the lower image index
    assert top_fraction(rewards, 0.01) == {(0, 1), (1, 1)}  # at least one per prompt
    # ... also where fraction x count rounds to 0 images (the rounding that keeps 0.07 x 100 at 7)
    assert top_fraction(rewards, 1e-12) == {(0, 1), (1, 1)}
    assert top_fraction(rewards, 1.0) == {(p, i) for p, i, _ in rewards}
    hundred = [(0, i, i / 100) for i in range(100)]
    assert len(top_fraction(hundred, 0.07)) == 7  # 0.07 x 100 is 7.000000000000001 in floating point
    assert top_fraction([(0, i, i / 10) for i in range(4)], 0.3) == {(0, 2), (0, 3)}  # ceil(1.2) = 2, rounded up


def test_each_replaced_selection_that_checkpoints_were_trained_on_is_kept_under_its_own_number(tmp_path, monkeypatch):
    import gors.checkpoints
    from gors.checkpoints import selection_fingerprint
    from gors.select import keep_trained_selection

    # Checkpoints trained on every selection written so far (as a run retrained after each select would have).
    trained = []
    monkeypatch.setattr(gors.checkpoints, "complete_checkpoints", lambda output_dir, **_: [
        (tmp_path / "checkpoints" / f"checkpoint-{n}", {"fingerprint": {"selection_sha256": sha}})
        for n, sha in enumerate(trained)])

    def write(reward):
        rows = [{"path": "part-00000/00000_000.png", "prompt": "p", "reward": reward}]
        atomic_write_jsonl(tmp_path / "selection.jsonl", rows)
        (tmp_path / "selection_summary.json").write_text(json.dumps({"num_selected": 1, "reward": reward}))
        trained.append(selection_fingerprint(rows))
        return rows

    first = write(0.6)
    second = [{**first[0], "reward": 0.7}]
    assert keep_trained_selection(tmp_path, first) is None  # the same rows again: nothing to keep
    assert keep_trained_selection(tmp_path, second) == tmp_path / "selection.previous-1.jsonl"
    write(0.7)
    assert keep_trained_selection(tmp_path, [{**first[0], "reward": 0.8}]) == tmp_path / "selection.previous-2.jsonl"
    # The first kept selection is never overwritten by a later one.
    assert [json.loads(line)["reward"] for name in ("selection.previous-1.jsonl", "selection.previous-2.jsonl")
            for line in (tmp_path / name).read_text().splitlines()] == [0.6, 0.7]
    assert json.loads((tmp_path / "selection_summary.previous-1.json").read_text())["reward"] == 0.6


def test_a_rounds_reselection_with_the_same_replayed_rows_keeps_no_copy(tmp_path, make_run_config, monkeypatch):
    """A round's checkpoints trained on its own rows and the replayed ones: selecting the same again changes nothing."""
    import gors.checkpoints
    from gors.checkpoints import selection_fingerprint

    _fake_scored_run(tmp_path, None, {0: 0.9, 1: 0.6})
    replayed = [{"path": "part-00000/00000_000.png", "prompt": "p0", "reward": 0.8, "samples": "../round-000/samples",
                 "round": 0}]
    config = make_run_config(output_dir=str(tmp_path), reward_threshold=0.5)
    select(config, extra_rows=replayed)
    trained_on = selection_fingerprint([json.loads(line) for line in (tmp_path / "selection.jsonl").open()])
    monkeypatch.setattr(gors.checkpoints, "complete_checkpoints", lambda output_dir, **_: [
        (tmp_path / "checkpoints" / "checkpoint-2", {"fingerprint": {"selection_sha256": trained_on}})])
    select(config, extra_rows=replayed)
    assert not list(tmp_path.glob("selection.previous-*"))
    select(config)  # without the replayed rows: another selection, and the trained one is kept
    assert [json.loads(line)["prompt"] for line in (tmp_path / "selection.previous-1.jsonl").open()] == \
        ["p0", "p1", "p0"]


def test_reward_statistics():
    from gors.select import reward_statistics

    assert reward_statistics([0.0, 0.25, 0.5, 0.75, 1.0]) == {
        "count": 5, "mean": 0.5, "std": pytest.approx(0.3535533905932738), "min": 0.0, "q25": 0.25, "median": 0.5,
        "q75": 0.75, "max": 1.0}
    assert reward_statistics([]) == {"count": 0}


def test_select_top_fraction_ignores_tau(tmp_path, make_run_config):
    # spatial's tau is 0.8: no sample passes it, but each prompt keeps its best
    _fake_scored_run(tmp_path, "spatial", {0: 0.1, 1: 0.35})
    summary = select(make_run_config(output_dir=str(tmp_path), reward_threshold=None, select_top_fraction=0.5))
    kept = [json.loads(line) for line in (tmp_path / "selection.jsonl").read_text().splitlines()]
    assert [(row["prompt_index"], row["reward"]) for row in kept] == [(0, 0.1), (1, 0.35)]
    assert "threshold" not in kept[0]
    assert summary["threshold"] == "--select_top_fraction=0.5 of each prompt's images" and summary["num_selected"] == 2


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_select_top_fraction_outside_0_1_is_refused(make_run_config, fraction):
    with pytest.raises(ValueError, match=rf"--select_top_fraction={fraction}: use a fraction in \(0, 1\]"):
        make_run_config(reward_threshold=None, select_top_fraction=fraction)


def test_select_top_fraction_and_a_threshold_are_refused_together(make_run_config):
    with pytest.raises(ValueError, match="select by one of them"):
        make_run_config(reward_threshold=0.5, select_top_fraction=0.5)


@pytest.mark.parametrize("overrides, message", [
    ({"weighting_scheme": "mode"}, "--weighting_scheme=mode: .* trains with the DDPM loss"),
    ({"train_text_encoder_2": True}, "--train_text_encoder_2: .* has no second CLIP text encoder"),
    ({"max_sequence_length": 77}, "--max_sequence_length: .* has no T5 encoder"),
    ({"reward_options": {"nope": 1}}, "--reward_options: reward 'b_vqa' has no option 'nope'"),
    ({"validation_benchmark": "toy:train", "validation_scorer_options": {"nope": 1}},
     "--validation_scorer_options: toy:train's scorer 'toy_oracle' has no option 'nope'"),
    ({"validation_benchmark": "toy:train", "validation_metric": "acuracy"},
     "--validation_metric='acuracy' is not a metric of toy:train"),
    ({"reward_threshold": None}, "No threshold: the prompts are not a T2I-CompBench category"),
    ({"reward_threshold": None, "category": "numeracy"}, "No GORS threshold for category 'numeracy'; known categories"),
])
def test_run_refuses_what_training_would_before_generating(make_run_config, overrides, message):
    from gors.run import run

    config = make_run_config(**overrides)
    with pytest.raises(ValueError, match=message):
        run(config)
    assert not (Path(config.output_dir) / "samples").exists()  # refused before any image


@pytest.mark.parametrize("sharding", ["DEEPSPEED", "FSDP"])
def test_run_refuses_a_sharded_launch_before_generating(make_run_config, monkeypatch, sharding):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    import gors.run

    monkeypatch.setattr(gors.run, "training_accelerator",
                        lambda config: SimpleNamespace(distributed_type=getattr(DistributedType, sharding)))
    config = make_run_config()
    with pytest.raises(ValueError, match=r"data parallelism \(DDP\) only.*multi_gpu.yaml"):
        gors.run.run(config)
    assert not (Path(config.output_dir) / "samples").exists()
