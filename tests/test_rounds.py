"""Online GORS (`--rounds`) on tiny models: each round samples from the LoRA so far, selects, and
trains the same LoRA on; a run stopped mid-round resumes there; bad settings fail before any work."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from two_processes import launch_gors

from gors.core.distributed import reset_process_state
from gors.core.run_folder import CHECKPOINT_MARKER, CHECKPOINTS_DIR, ROUNDS_FILE, SELECTION_FILE, round_dir
from gors.core.store import SampleStore, sample_seed
from gors.generate import generate
from gors.lora import LORA_WEIGHT_NAME
from gors.rounds import ROUND_SEED_STRIDE, replayed_rows, round_config, round_seed
from gors.run import run
from gors.select import load_selection
from gors.timings import TIMINGS_FILE, read_timings
from gors.train import GORSTrainer, train

ROUNDS = dict(rounds=2, max_train_steps=4, checkpointing_steps=1, learning_rate=1e-1, text_encoder_learning_rate=1e-1,
              replay="last", report_to="none")


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _pixels(store: SampleStore) -> dict[tuple[int, int], np.ndarray]:
    return {(r["prompt_index"], r["image_index"]): np.asarray(store.open_image(r), dtype=np.int16)
            for r in store.records()}


def _launch_run(flags: dict, cwd: Path) -> subprocess.CompletedProcess:
    return launch_gors(["run", *[part for name, value in flags.items() for part in (f"--{name}", str(value))]], cwd)


@pytest.fixture(scope="module")
def two_process_flags(tmp_path_factory, tiny_sd, tiny_blip) -> dict:
    """The flags of `gors run --rounds 2 --reset_optimizer` on two processes (3 prompts x 2 images a round, 2 steps a
    round)."""
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a red circle and a blue square\na green triangle\na yellow circle\n")
    return {"pretrained_model_name_or_path": tiny_sd, "train_prompts": prompts, "images_per_prompt": 2,
            "num_inference_steps": 2, "resolution": 32, "generation_batch_size": 2,
            "reward_model_name_or_path": tiny_blip, "reward_batch_size": 2, "reward_threshold": 0.0,
            "train_batch_size": 1, "seed": 0, **ROUNDS, "reset_optimizer": True}


@dataclass(frozen=True)
class Launched:
    run_dir: Path
    stdout: str


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory, two_process_flags) -> Launched:
    """That run, uninterrupted (read-only: tests that write copy it). With a fresh optimizer per round, round 1 loads
    round 0's adapters into the DDP-wrapped modules (the one-process tests below have no wrapper); a resume loads a
    whole checkpoint into them, as round 1 does under the default."""
    root = tmp_path_factory.mktemp("rounds")
    result = _launch_run({"output_dir": root / "run", **two_process_flags}, cwd=root)
    return Launched(root / "run", result.stdout)


@pytest.fixture(scope="module")
def one_process_rounds(make_module_run_config) -> Path:
    """`run --rounds 2` uninterrupted in one process: the reference of the resume and optimizer tests (read-only)."""
    config = make_module_run_config(**ROUNDS)
    run(config)
    reset_process_state()
    return Path(config.output_dir)


@pytest.mark.slow
def test_each_round_samples_from_the_lora_so_far_and_trains_it_on(two_rounds, make_run_config, tmp_path):
    run_dir = two_rounds.run_dir
    assert "at step 2 (adapters only)" in two_rounds.stdout  # round 1 went on from round 0's adapters
    rounds = json.loads((run_dir / ROUNDS_FILE).read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1] and [r["last_step"] for r in rounds] == [2, 4]
    assert rounds[0]["lora"] is None and rounds[1]["lora"] == "round-000"
    assert all(r["num_samples"] == 6 and r["num_selected"] == 6 for r in rounds)  # tau 0 keeps all

    # Round 1's images: new seeds, a pure function of (seed, round, prompt, image), and drawn with round 0's LoRA.
    first, second = SampleStore(run_dir / "round-000" / "samples"), SampleStore(run_dir / "round-001" / "samples")
    for store, index in ((first, 0), (second, 1)):
        assert {(r["prompt_index"], r["image_index"]): r["seed"] for r in store.records()} == {
            (p, i): sample_seed(round_seed(0, index), p, i) for p in range(3) for i in range(2)}
        assert {r["path"].split("/")[0] for r in store.records()} == {"part-00000", "part-00001"}  # both processes
    # The store records round 0's LoRA relative to itself, so that the run folder can move.
    assert first.load_settings()["lora"] is None and second.load_settings()["lora"] == "../round-000"
    base = make_run_config(output_dir=str(tmp_path / "base"), seed=0, resolution=32)
    generate(base, seed=round_seed(0, 1))  # the base model, round 1's seeds
    reset_process_state()
    with_lora, without = _pixels(second), _pixels(SampleStore(tmp_path / "base" / "samples"))
    assert with_lora.keys() == without.keys()
    assert max(np.abs(with_lora[k] - without[k]).max() for k in with_lora) > 8  # the LoRA changed the samples

    # Round 1 trained the same LoRA on from round 0's last checkpoint (step 2), on its own and replayed samples.
    assert sorted(p.name for p in (run_dir / "round-001" / "checkpoints").iterdir()) == ["checkpoint-3", "checkpoint-4"]
    assert read_timings(run_dir / "round-001")["stages"]["train"]["work"] == 2  # the round's own steps
    pool = load_selection(run_dir / "round-001")
    replayed = [row for row in pool if "samples" in row]
    assert len(pool) == 12 and len(replayed) == 6 and {row["samples"] for row in replayed} == {"../round-000/samples"}
    final = (run_dir / "pytorch_lora_weights.safetensors").read_bytes()
    assert final == (run_dir / "round-001" / "pytorch_lora_weights.safetensors").read_bytes()
    round0, round1 = (load_file(str(run_dir / f"round-00{k}" / "pytorch_lora_weights.safetensors")) for k in (0, 1))
    assert round0.keys() == round1.keys() and any((round0[k] != round1[k]).any() for k in round0)


@pytest.mark.slow
def test_two_processes_stopped_in_round_1_resume_there_as_if_never_stopped(two_rounds, two_process_flags, tmp_path):
    # The folder as a kill right after round 1's first checkpoint (step 3) leaves it: what a resumed run adds
    # after that point is removed (the one-process test below finds the same list with a real interruption).
    stopped = tmp_path / "stopped"
    shutil.copytree(two_rounds.run_dir, stopped)
    shutil.rmtree(stopped / "round-001" / "checkpoints" / "checkpoint-4")
    for name in (LORA_WEIGHT_NAME, TIMINGS_FILE):
        (stopped / "round-001" / name).unlink()
    shutil.copy(stopped / "round-000" / LORA_WEIGHT_NAME, stopped / LORA_WEIGHT_NAME)
    record = json.loads((stopped / ROUNDS_FILE).read_text())
    (stopped / ROUNDS_FILE).write_text(json.dumps({**record, "rounds": record["rounds"][:1]}))
    round0 = _hashes(stopped / "round-000")

    result = _launch_run({"output_dir": stopped, **two_process_flags, "resume_from_checkpoint": "latest"}, tmp_path)
    assert f"resumed from {stopped / 'round-001' / 'checkpoints' / 'checkpoint-3'} at step 3" in result.stdout
    assert _hashes(stopped / "round-000") == round0  # the finished round is not run again
    assert [r["round"] for r in json.loads((stopped / ROUNDS_FILE).read_text())["rounds"]] == [0, 1]
    uninterrupted, resumed = (load_file(str(run / LORA_WEIGHT_NAME)) for run in (two_rounds.run_dir, stopped))
    assert uninterrupted.keys() == resumed.keys()
    for key in uninterrupted:
        assert torch.allclose(uninterrupted[key], resumed[key], atol=1e-6), key


def test_a_run_stopped_in_round_1_resumes_there_as_if_never_stopped(one_process_rounds, make_run_config, tmp_path,
                                                                    monkeypatch):
    settings = dict(ROUNDS, resume_from_checkpoint="latest")
    reference_dir, stopped_dir = one_process_rounds, tmp_path / "stopped"

    save = GORSTrainer.save_checkpoint

    def stop_after_step_3(self, step):
        path = save(self, step)
        if step == 3:
            raise KeyboardInterrupt("stopped in round 1")
        return path

    monkeypatch.setattr(GORSTrainer, "save_checkpoint", stop_after_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(make_run_config(output_dir=str(stopped_dir), **settings))
    reset_process_state()
    monkeypatch.setattr(GORSTrainer, "save_checkpoint", save)
    assert len(json.loads((stopped_dir / ROUNDS_FILE).read_text())["rounds"]) == 1
    round0 = _hashes(stopped_dir / "round-000")
    run(make_run_config(output_dir=str(stopped_dir), **ROUNDS))  # the same command: no flag needed to go on
    reset_process_state()
    assert _hashes(stopped_dir / "round-000") == round0  # the finished round is not run again
    # A round's updates came from --max_train_steps / --rounds: the message names the flag that keeps them.
    with pytest.raises(ValueError, match=r"finished rounds were made with other settings \(steps_per_round: 2 -> 3"
                                         r".*; to grow --rounds, pass --steps_per_round 2 \(else"):
        run(make_run_config(output_dir=str(stopped_dir), **{**settings, "max_train_steps": 6}))
    reset_process_state()
    assert load_file(str(stopped_dir / "pytorch_lora_weights.safetensors")).keys() == load_file(
        str(reference_dir / "pytorch_lora_weights.safetensors")).keys()
    assert (stopped_dir / "pytorch_lora_weights.safetensors").read_bytes() == (
        reference_dir / "pytorch_lora_weights.safetensors").read_bytes()


def test_a_round_goes_on_from_the_step_the_round_before_ended_not_from_its_newest_checkpoint(
        one_process_rounds, make_run_config, tmp_path, monkeypatch):
    # Rounds of 3 steps, stopped once round 0 trained (before rounds.json recorded it); rerun with rounds of 2
    # steps: round 0 ends at step 2 again, and round 1 must go on from checkpoint-2, not from the longer run's 3.
    import gors.rounds

    run_dir = tmp_path / "run"

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("stopped before rounds.json")

    monkeypatch.setattr(gors.rounds, "round_summary", stopped)
    with pytest.raises(KeyboardInterrupt):
        run(make_run_config(output_dir=str(run_dir), **{**ROUNDS, "max_train_steps": 6}))
    reset_process_state()
    monkeypatch.undo()
    assert (round_dir(run_dir, 0) / CHECKPOINTS_DIR / "checkpoint-3").is_dir()
    run(make_run_config(output_dir=str(run_dir), **ROUNDS))
    reset_process_state()
    assert (run_dir / LORA_WEIGHT_NAME).read_bytes() == (one_process_rounds / LORA_WEIGHT_NAME).read_bytes()
    # Without the step a round ended on, whole (its save interrupted) or at all, the next one does not start from
    # another, and generates nothing.
    shutil.rmtree(round_dir(run_dir, 1))
    rounds = json.loads((run_dir / ROUNDS_FILE).read_text())
    (run_dir / ROUNDS_FILE).write_text(json.dumps({**rounds, "rounds": rounds["rounds"][:1]}))
    ended = round_dir(run_dir, 0) / CHECKPOINTS_DIR / "checkpoint-2"
    for damage in (lambda: (ended / CHECKPOINT_MARKER).unlink(), lambda: shutil.rmtree(ended)):
        damage()
        with pytest.raises(FileNotFoundError, match=r"round-000 has no complete checkpoint at step 2, where its round "
                                                    r"ended and the next round goes on from"):
            run(make_run_config(output_dir=str(run_dir), **ROUNDS))
        reset_process_state()
        assert not round_dir(run_dir, 1).exists()


@pytest.mark.parametrize("problem", ["other settings", "incomplete"])
def test_a_refused_continue_leaves_the_rounds_own_checkpoints_in_place(problem, one_process_rounds, make_run_config,
                                                                       tmp_path):
    # Round 1 going on from round 0's checkpoint is refused before its own checkpoints are set aside, so the rerun
    # with the original settings goes on from them: a checkpoint trained with other settings (as another
    # --num_processes would be), or one whose save never finished (no marker: `train(continue_from=...)` from
    # Python, where `gors run --rounds` checks it first).
    run_dir = tmp_path / "run"
    shutil.copytree(one_process_rounds, run_dir)
    config = make_run_config(output_dir=str(run_dir), **ROUNDS)
    checkpoints = round_dir(run_dir, 1) / CHECKPOINTS_DIR
    before = _hashes(checkpoints)
    previous = round_dir(run_dir, 0) / CHECKPOINTS_DIR / "checkpoint-2"
    this_round = round_config(config, 1)
    if problem == "incomplete":
        (previous / CHECKPOINT_MARKER).unlink()
        why = rf"it is incomplete \(no {CHECKPOINT_MARKER}: an interrupted save"
    else:
        this_round = replace(this_round, rank=8)
        why = r"it was trained with other settings \(rank 4 there, 8 now\)"
    with pytest.raises(ValueError, match=rf"cannot continue training from {previous}: {why}"):
        train(this_round, continue_from=previous, schedule_steps=config.round_steps() * config.rounds)
    reset_process_state()
    assert _hashes(checkpoints) == before
    assert not list(round_dir(run_dir, 1).glob(f"{CHECKPOINTS_DIR}.previous-*"))


def test_a_round_refuses_to_go_on_from_a_damaged_checkpoint_of_the_round_before(one_process_rounds, make_run_config,
                                                                                tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_process_rounds, run_dir)
    config = make_run_config(output_dir=str(run_dir), **ROUNDS)
    shutil.rmtree(round_dir(run_dir, 1) / CHECKPOINTS_DIR)
    previous = round_dir(run_dir, 0) / CHECKPOINTS_DIR / "checkpoint-2"
    (previous / "optimizer.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^{previous} is damaged since it was saved: optimizer.bin holds 0 bytes, "
                                         r"\d+ were saved\. The next round trains on from it"):
        train(round_config(config, 1), continue_from=previous, schedule_steps=config.round_steps() * config.rounds)
    # A fresh optimizer per round reads only the adapters, which are whole: it goes on.
    lora = train(round_config(config, 1), continue_from=previous, reset_optimizer=True,
                 schedule_steps=config.round_steps())
    reset_process_state()
    assert lora.is_file()


def test_a_fresh_optimizer_per_round_and_validation_at_each_rounds_end(one_process_rounds, make_run_config, tmp_path,
                                                                        monkeypatch):
    kept, reset = one_process_rounds, tmp_path / "reset"
    draws = []  # the first draw of the global stream at each micro-batch, left as it was

    def drawing(trainer, micro_batch):
        state = torch.random.get_rng_state()
        draws.append(torch.randn(4))
        torch.random.set_rng_state(state)
        return micro_batch_loss(trainer, micro_batch)

    micro_batch_loss = GORSTrainer._micro_batch_loss
    monkeypatch.setattr(GORSTrainer, "_micro_batch_loss", drawing)
    run(make_run_config(output_dir=str(reset), **{**ROUNDS, "report_to": "tensorboard"}, reset_optimizer=True,
                        validation_benchmark="toy:train", validation_num_prompts=2, validation_steps=100))
    reset_process_state()
    # Round 0 trains alike (validation leaves training as it is); round 1 starts from a fresh AdamW.
    assert (kept / "round-000" / "pytorch_lora_weights.safetensors").read_bytes() == (
        reset / "round-000" / "pytorch_lora_weights.safetensors").read_bytes()
    assert (kept / "round-001" / "pytorch_lora_weights.safetensors").read_bytes() != (
        reset / "round-001" / "pytorch_lora_weights.safetensors").read_bytes()
    # Each round draws its own noise and timesteps: not round 0's stream again from --seed.
    assert len(draws) == 4 and not any(torch.equal(draws[i], draws[i + 2]) for i in range(2))

    # Validated at each round's last step (not every 100), in the top folder, where the best LoRA of all rounds is.
    assert sorted(p.name for p in (reset / "validation").iterdir()) == ["step-000002", "step-000004"]
    best = json.loads((reset / "best" / "best.json").read_text())
    assert best["step"] in (2, 4) and (reset / "best" / "pytorch_lora_weights.safetensors").is_file()
    assert not (reset / "round-000" / "best").exists()

    from gors.report import report

    text = report([reset], tmp_path / "report").read_text()
    assert "## Rounds" in text and (tmp_path / "report" / "rounds.png").is_file()
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert "validation/toy:train/binding_accuracy" in table[0] and len(table) == 4  # header, rule, 2 rounds
    rounds = json.loads((reset / ROUNDS_FILE).read_text())["rounds"]
    assert f"{rounds[1]['mean_reward']:.4f}" in table[3]


def test_one_round_is_the_papers_run_stage_by_stage(make_run_config, tmp_path):
    """`--rounds 1` (the default) is GORS as published: the same files as the four stage commands in turn."""
    from gors.score import score
    from gors.select import select
    from gors.train import train

    one_round = make_run_config(output_dir=str(tmp_path / "one_round"), rounds=1, report_to="none")
    run(one_round)
    reset_process_state()
    staged = make_run_config(output_dir=str(tmp_path / "staged"), report_to="none")
    for stage in (generate, score, select, train):
        stage(staged)
        reset_process_state()
    assert not list(Path(one_round.output_dir).glob("round-*")) and not (tmp_path / "one_round" / ROUNDS_FILE).exists()
    for name in ("samples", "scores"):
        assert _hashes(tmp_path / "one_round" / name) == _hashes(tmp_path / "staged" / name), name
    for name in (SELECTION_FILE, LORA_WEIGHT_NAME):
        assert (tmp_path / "one_round" / name).read_bytes() == (tmp_path / "staged" / name).read_bytes(), name


def test_each_round_takes_its_tau_and_the_replay_asked_for(make_run_config, tmp_path):
    config = make_run_config(output_dir=str(tmp_path), rounds=3, max_train_steps=6, reward_threshold=None,
                             tau_schedule=[0.2, 0.5, 0.8], replay="all")
    assert [round_config(config, r).reward_threshold for r in range(3)] == [0.2, 0.5, 0.8]
    assert [round_config(config, r).max_train_steps for r in range(3)] == [2, 4, 6]  # each round trains on
    for r in range(2):  # two finished rounds' selections
        folder = round_dir(tmp_path, r)
        folder.mkdir()
        rows = [{"path": f"part-00000/{r}_{i}.png", "prompt": "p", "reward": 0.9} for i in range(r + 1)]
        (folder / SELECTION_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    everything = replayed_rows(tmp_path, 2, "all")
    assert [(row["round"], row["samples"]) for row in everything] == [(0, "../round-000/samples")] + [
        (1, "../round-001/samples")] * 2
    assert [row["round"] for row in replayed_rows(tmp_path, 2, "last")] == [1, 1]
    assert replayed_rows(tmp_path, 2, "none") == [] and replayed_rows(tmp_path, 0, "all") == []


def _fake_round_stages(calls: list):
    """A `run_stages` that records each round's config and inputs and writes only what `run_rounds` reads of a
    round's folder: its selection (its own row and the replayed ones), summary, LoRA and end checkpoint."""
    def fake(config, accelerator, command, inputs):
        calls.append((config, inputs))
        out = Path(config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows = [{"path": "part-00000/00000_000.png", "prompt": "p", "reward": 0.9}, *inputs.replay]
        (out / SELECTION_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
        (out / "selection_summary.json").write_text(json.dumps({
            "threshold": config.reward_threshold, "num_samples": 4, "num_selected": 1, "all": {"mean": 0.5},
            "selected": {"mean": 0.9}}))
        (out / LORA_WEIGHT_NAME).write_bytes(out.name.encode())
        checkpoint = out / CHECKPOINTS_DIR / f"checkpoint-{config.max_train_steps}"
        checkpoint.mkdir(parents=True)
        (checkpoint / CHECKPOINT_MARKER).write_text(json.dumps({"step": config.max_train_steps}))
    return fake


@pytest.mark.parametrize("reset, report_to", [(False, "none"), (True, "tensorboard"), (False, "all")])
def test_each_of_three_rounds_takes_the_lora_checkpoint_and_seed_of_the_round_just_before(make_run_config, tmp_path,
                                                                                         monkeypatch, reset, report_to):
    """Round r generates with round r-1's LoRA and its own seeds, trains on from r-1's end; a rerun redoes no round."""
    from accelerate import Accelerator

    import gors.rounds

    calls: list = []
    monkeypatch.setattr(gors.rounds, "run_stages", _fake_round_stages(calls))
    config = make_run_config(output_dir=str(tmp_path / "run"), rounds=3, steps_per_round=2, seed=7, replay="all",
                             reset_optimizer=reset, report_to=report_to)
    out = Path(config.output_dir)
    rounds = gors.rounds.run_rounds(config, Accelerator(cpu=True))
    assert [inputs.lora for _, inputs in calls] == [None, str(round_dir(out, 0)), str(round_dir(out, 1))]
    assert [inputs.seed for _, inputs in calls] == [7, 7 + ROUND_SEED_STRIDE, 7 + 2 * ROUND_SEED_STRIDE]
    assert [inputs.continue_from for _, inputs in calls] == [None] + [
        round_dir(out, r) / CHECKPOINTS_DIR / f"checkpoint-{2 * (r + 1)}" for r in (0, 1)]
    assert [(c.output_dir, c.max_train_steps) for c, _ in calls] == [(str(round_dir(out, r)), 2 * (r + 1))
                                                                     for r in range(3)]
    assert [inputs.reset_optimizer for _, inputs in calls] == [reset] * 3
    assert [inputs.schedule_steps for _, inputs in calls] == [2 if reset else 6] * 3
    assert [[row["round"] for row in inputs.replay] for _, inputs in calls] == [[], [0], [0, 1]]
    assert [(r["round"], r["lora"], r["last_step"], r["num_replayed"]) for r in rounds] == [
        (0, None, 2, 0), (1, "round-000", 4, 1), (2, "round-001", 6, 2)]
    assert (out / LORA_WEIGHT_NAME).read_bytes() == b"round-002"  # the last round's LoRA, copied to the run folder
    record = json.loads((out / ROUNDS_FILE).read_text())
    assert record["rounds"] == rounds
    # Under --report_to tensorboard (or all, tensorboard being installed with gors) each round's reward and selection
    # are scalars over rounds (`logs/rounds`).
    assert bool(list((out / "logs" / "rounds").glob("events.out.tfevents.*"))) == (report_to != "none")

    # Stopped after round 0: the rerun goes on in round 1, with the same inputs as the uninterrupted run's.
    (out / ROUNDS_FILE).write_text(json.dumps({**record, "rounds": record["rounds"][:1]}))
    for r in (1, 2):
        shutil.rmtree(round_dir(out, r))
    again: list = []
    monkeypatch.setattr(gors.rounds, "run_stages", _fake_round_stages(again))
    assert gors.rounds.run_rounds(config, Accelerator(cpu=True)) == rounds
    assert [(c, inputs) for c, inputs in again] == calls[1:]


def test_round_seeds_do_not_meet_for_any_prompt_or_image():
    assert round_seed(42, 0) == 42
    last_of_round_0 = sample_seed(round_seed(42, 0), 9_999, 99_999)
    assert last_of_round_0 < sample_seed(round_seed(42, 1), 0, 0) == 42 + ROUND_SEED_STRIDE


@pytest.mark.parametrize("overrides, message", [
    (dict(rounds=0), r"--rounds=0: must be >= 1"),
    (dict(rounds=3, max_train_steps=4), r"--max_train_steps=4 does not split into --rounds=3"),
    (dict(rounds=2, tau_schedule=[0.5]), r"--tau_schedule has 1 values for --rounds=2"),
    (dict(rounds=2, tau_schedule=[0.5, 1.5]), r"rewards lie in \[0, 1\]"),
    (dict(rounds=2, tau_schedule=[0.5, 0.6], reward_threshold=0.5), r"select by one of them"),
    (dict(rounds=2, steps_per_round=0), r"--steps_per_round=0: must be >= 1"),
    (dict(replay="all"), r"need --rounds >= 2"),
    (dict(tau_schedule=[0.5]), r"--tau_schedule and --steps_per_round .* need --rounds >= 2"),
    (dict(steps_per_round=10), r"--tau_schedule and --steps_per_round .* need --rounds >= 2"),
    (dict(rounds=2, replay="evrything"), r"--replay='evrything'; choose one of none, last, all"),
])
def test_bad_round_settings_fail_before_any_work(make_run_config, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_run_config(output_dir=str(tmp_path / "run"), **overrides)
    assert not (tmp_path / "run").exists()


def test_the_lr_schedule_runs_once_over_all_rounds_or_again_with_each_fresh_optimizer(make_run_config, tmp_path):
    # A linear decay over 4 steps in 2 rounds: continued, the LR after steps 1-4 is that of one
    # 4-step run; with a fresh optimizer per round, each round decays over its own 2 steps.
    for reset, expected in ((False, [0.75, 0.5, 0.25, 0.0]), (True, [0.5, 0.0, 0.5, 0.0])):
        out = tmp_path / f"reset-{reset}"
        run(make_run_config(output_dir=str(out), **{**ROUNDS, "lr_scheduler": "linear"}, reset_optimizer=reset))
        reset_process_state()
        lrs = []
        for step in range(1, 5):
            checkpoint = round_dir(out, (step - 1) // 2) / CHECKPOINTS_DIR / f"checkpoint-{step}"
            state = torch.load(checkpoint / "scheduler.bin", weights_only=False)
            lrs.append(state["_last_lr"][0] / state["base_lrs"][0])
        assert lrs == pytest.approx(expected), f"reset_optimizer={reset}"
    # More rounds would lay the decay out over more steps, under the finished rounds' too: refused
    grown = make_run_config(output_dir=str(tmp_path / "reset-False"),
                            **{**ROUNDS, "lr_scheduler": "linear", "rounds": 3, "max_train_steps": 6})
    with pytest.raises(ValueError, match=r"--lr_scheduler linear laid out over --rounds=2; --rounds=3 would"):
        run(grown)


def test_a_changed_training_setting_is_refused_before_the_next_round_generates(one_process_rounds, make_run_config,
                                                                             tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_process_rounds, run_dir)
    grown = {**ROUNDS, "rounds": 3, "max_train_steps": 6}
    with pytest.raises(ValueError, match=r"other settings \(learning_rate: 0\.1 -> 0\.05\)"):
        run(make_run_config(output_dir=str(run_dir), **{**grown, "learning_rate": 5e-2}))
    reset_process_state()
    # The precision the rounds generate and train in, too (the launch's resolved one: an accelerate config's).
    with pytest.raises(ValueError, match=r"other settings \(mixed_precision: 'no' -> 'bf16'\)"):
        run(make_run_config(output_dir=str(run_dir), **{**grown, "mixed_precision": "bf16"}))
    reset_process_state()
    assert not round_dir(run_dir, 2).exists()  # nothing generated for round 2
    with pytest.raises(ValueError, match=r"holds a --rounds run \(rounds\.json, round-000\); one round there would "
                                         r"train over"):
        run(make_run_config(output_dir=str(run_dir), **{**ROUNDS, "rounds": 1, "replay": "none"}))
    reset_process_state()
    (run_dir / ROUNDS_FILE).unlink()  # a --rounds run stopped in round 0 has none yet
    with pytest.raises(ValueError, match=r"holds a --rounds run \(round-000\); one round there would train over"):
        run(make_run_config(output_dir=str(run_dir), **{**ROUNDS, "rounds": 1, "replay": "none"}))
    reset_process_state()
    assert not (run_dir / "samples").exists()
    one_round = tmp_path / "one_round"
    (one_round / "checkpoints").mkdir(parents=True)
    (one_round / "selection.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"holds a run of one round \(selection\.jsonl, checkpoints\); --rounds 3 "
                                         r"there would replace its LoRA"):
        run(make_run_config(output_dir=str(one_round), **grown))
    reset_process_state()
    assert sorted(p.name for p in one_round.iterdir()) == ["checkpoints", "selection.jsonl"]  # nothing added


PROMPTS = ["a red circle", "a blue square"]


def _finished(config, num_processes: int, prompts: list[str], reward: str) -> list:
    from gors.rounds import finished_rounds, round_settings

    return finished_rounds(config, round_settings(config, num_processes, prompts, reward))


def _recorded_rounds(config, count: int, **settings) -> None:
    from gors.rounds import round_settings

    recorded = round_settings(config, 1, PROMPTS, "b_vqa") | settings
    rounds = [{"round": index} for index in range(count)]
    (Path(config.output_dir) / ROUNDS_FILE).write_text(json.dumps({"settings": recorded, "rounds": rounds}))


def test_rounds_json_checks_shrinking_a_growing_tau_schedule_and_older_files(make_run_config, tmp_path, caplog):
    config = make_run_config(output_dir=str(tmp_path), **{**ROUNDS, "rounds": 3, "max_train_steps": 6})
    Path(config.output_dir).mkdir(exist_ok=True)
    _recorded_rounds(config, 3, rounds=3)
    with pytest.raises(ValueError, match=r"3 rounds are finished, more than --rounds=2; rerun with --rounds=3"):
        _finished(replace(config, rounds=2, max_train_steps=4), 1, PROMPTS, "b_vqa")

    scheduled = replace(config, reward_threshold=None, tau_schedule=[0.2, 0.5, 0.8])
    _recorded_rounds(scheduled, 2, rounds=2, tau_schedule=[0.2, 0.5])
    assert len(_finished(scheduled, 1, PROMPTS, "b_vqa")) == 2  # the finished rounds' taus stay: --rounds may grow
    with pytest.raises(ValueError, match=r"the taus of the 2 finished round\(s\): 0\.2, 0\.5 -> 0\.3, 0\.5"):
        _finished(replace(scheduled, tau_schedule=[0.3, 0.5, 0.8]), 1, PROMPTS, "b_vqa")
    # The taus of the rounds still to come may change: e.g. lowered for a round that selected nothing.
    assert len(_finished(replace(scheduled, tau_schedule=[0.2, 0.5, 0.1]), 1, PROMPTS, "b_vqa")) == 2
    _recorded_rounds(scheduled, 1, rounds=3, tau_schedule=[0.2, 0.99])
    assert len(_finished(scheduled, 1, PROMPTS, "b_vqa")) == 1  # round 1's 0.99 -> 0.5
    # A hand-edited file whose schedule is shorter than its finished rounds: a difference named, not an IndexError.
    _recorded_rounds(scheduled, 2, rounds=3, tau_schedule=[0.2])
    with pytest.raises(ValueError, match=r"the taus of the 2 finished round\(s\): 0\.2, the paper's -> 0\.2, 0\.5"):
        _finished(scheduled, 1, PROMPTS, "b_vqa")
    # One tau for every round (--reward_threshold) goes on as a schedule that starts with it, not as another tau.
    _recorded_rounds(scheduled, 1, rounds=3, tau_schedule=None, reward_threshold=0.2)
    assert len(_finished(scheduled, 1, PROMPTS, "b_vqa")) == 1
    with pytest.raises(ValueError, match=r"finished round\(s\): 0\.2 -> 0\.3\); rerun .* pass --tau_schedule with the finished"):
        _finished(replace(scheduled, tau_schedule=None, reward_threshold=0.3), 1, PROMPTS, "b_vqa")
    _recorded_rounds(scheduled, 1, rounds=3, tau_schedule=None, reward_threshold=None)
    with pytest.raises(ValueError, match=r"finished round\(s\): the paper's -> 0\.2"):
        _finished(scheduled, 1, PROMPTS, "b_vqa")
    with pytest.raises(ValueError, match=r"num_processes: 1 -> 2"):
        _finished(scheduled, 2, PROMPTS, "b_vqa")

    # A rerun that names its own --steps_per_round is not told to pass one.
    _recorded_rounds(config, 1)
    with pytest.raises(ValueError, match=r"other settings \(steps_per_round: 2 -> 3\); rerun") as refused:
        _finished(replace(config, steps_per_round=3), 1, PROMPTS, "b_vqa")
    assert "to grow --rounds" not in str(refused.value)

    _recorded_rounds(config, 2, rounds=2)
    record = json.loads((tmp_path / ROUNDS_FILE).read_text())
    del record["settings"]["learning_rate"], record["settings"]["reward"]  # as an older gors wrote it
    (tmp_path / ROUNDS_FILE).write_text(json.dumps(record))
    assert len(_finished(config, 1, PROMPTS, "b_vqa")) == 2
    with pytest.raises(ValueError, match=r"prompts_sha256: "):
        _finished(config, 1, PROMPTS[:1], "b_vqa")
    assert "does not record reward, learning_rate (an older gors)" in caplog.text
    # Rounds recorded before scoring versions were scored by version 1 of every reward: a reward whose
    # scores changed since (the UniDet rule of spatial_rule, BLIP's own transform for b_vqa) is refused, the
    # others go on.
    del record["settings"]["scoring_versions"]
    (tmp_path / ROUNDS_FILE).write_text(json.dumps(record))
    assert len(_finished(config, 1, PROMPTS, "clip_score")) == 2
    with pytest.raises(ValueError, match=r"scoring_versions: \{\} -> \{'spatial_rule': 5\}"):
        _finished(config, 1, PROMPTS, "spatial_rule")
    with pytest.raises(ValueError, match=r"scoring_versions: \{\} -> \{'b_vqa': 2\}"):
        _finished(config, 1, PROMPTS, "b_vqa")


def test_a_later_round_says_the_steps_it_trains_and_a_finished_run_says_so(one_process_rounds, make_run_config,
                                                                          tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(one_process_rounds, run_dir)
    config = make_run_config(output_dir=str(run_dir), **ROUNDS)
    capsys.readouterr()
    run(config)  # every round finished: nothing runs, and it says where the results are
    reset_process_state()
    out = capsys.readouterr().out
    assert (f"[rounds] all 2 rounds are finished ({run_dir / ROUNDS_FILE}), trained to step 4: nothing to run. "
            f"The last round's LoRA is {run_dir / LORA_WEIGHT_NAME}") in out and "round 0 of" not in out
    shutil.rmtree(round_dir(run_dir, 1) / CHECKPOINTS_DIR)  # round 1 trained again, on from round 0's end
    train(round_config(config, 1), continue_from=round_dir(run_dir, 0) / CHECKPOINTS_DIR / "checkpoint-2",
          schedule_steps=config.round_steps() * config.rounds)
    reset_process_state()
    assert "selected samples: 2 steps (steps 3 to 4) of 2 x 1 x 1" in capsys.readouterr().out


def test_a_garbled_rounds_json_says_to_delete_it_and_the_rerun_redoes_no_work(one_process_rounds, make_run_config,
                                                                             tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_process_rounds, run_dir)
    config = make_run_config(output_dir=str(run_dir), **ROUNDS)
    fix = (r"delete it: `gors run --rounds` then goes through the rounds again, each reusing its folder's finished "
           r"samples, scores and checkpoints$")
    (run_dir / ROUNDS_FILE).write_text('{"settings": {')
    with pytest.raises(ValueError, match=rf"rounds.json: not valid JSON .*; expected the rounds gors recorded there; "
                                         rf"{fix}"):
        run(config)
    for garbled in ("[]", '{"settings": ["rounds"], "rounds": []}'):
        (run_dir / ROUNDS_FILE).write_text(garbled)
        with pytest.raises(ValueError, match=rf"rounds.json: not a rounds file \(no 'settings' and 'rounds'\); {fix}"):
            run(config)
    before = _hashes(run_dir)
    written = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*.png")}
    (run_dir / ROUNDS_FILE).unlink()
    run(config)
    reset_process_state()
    after = _hashes(run_dir)
    samples_and_loras = [name for name in before if name.endswith((".png", ".safetensors")) and "cache" not in name]
    assert samples_and_loras and all(after[name] == before[name] for name in samples_and_loras)
    assert written and all(path.stat().st_mtime_ns == mtime for path, mtime in written.items())  # not generated again
    rounds = json.loads((run_dir / ROUNDS_FILE).read_text())["rounds"]
    assert rounds == json.loads((one_process_rounds / ROUNDS_FILE).read_text())["rounds"]


@pytest.mark.slow
def test_a_local_base_model_moved_elsewhere_is_the_same_model_and_its_rounds_go_on(make_run_config, tmp_path):
    """Moved (or copied) with its files unchanged, the base model of a finished run is the one its samples, its
    checkpoints and rounds.json record: the run grows by a round from the new path, redoing nothing; a model
    of other files at that path is still another model."""
    from gors.core.store import SETTINGS, SampleStore
    from gors.testing.sd import build_tiny_sd_pipeline

    model = tmp_path / "model"
    shutil.copytree(make_run_config().pretrained_model_name_or_path, model)
    config = make_run_config(pretrained_model_name_or_path=str(model), images_per_prompt=1, **ROUNDS)
    run(config)
    reset_process_state()
    first = SampleStore(round_dir(config.output_dir, 0) / "samples").records()
    moved = tmp_path / "elsewhere" / "model"
    moved.parent.mkdir()
    model.rename(moved)
    grown = {**ROUNDS, "rounds": 3, "max_train_steps": 6}
    run(make_run_config(pretrained_model_name_or_path=str(moved), images_per_prompt=1, **grown))
    reset_process_state()
    rounds = json.loads((Path(config.output_dir) / ROUNDS_FILE).read_text())
    assert [entry["round"] for entry in rounds["rounds"]] == [0, 1, 2]
    assert rounds["settings"]["pretrained_model_name_or_path"] == str(moved)
    assert SampleStore(round_dir(config.output_dir, 0) / "samples").records() == first  # kept, none made again
    round_2 = round_dir(config.output_dir, 2) / "samples"
    assert json.loads((round_2 / SETTINGS).read_text())["model"] == str(moved)
    build_tiny_sd_pipeline(model, seed=1, resolution=32)  # other files at the old path
    with pytest.raises(ValueError, match=r"round-000/samples were generated by another version of it \(the files of "
                                         r"local model .*/model changed since"):
        run(make_run_config(pretrained_model_name_or_path=str(model), images_per_prompt=1,
                            **{**grown, "rounds": 4, "max_train_steps": 8}))
    reset_process_state()


def test_gors_push_of_a_rounds_folder_stages_its_latest_round_lora_with_that_rounds_training(one_process_rounds, tmp_path):
    """The top-level LoRA is the last round's: the card gives its step, the selection of that round, and the rounds."""
    from gors.push import CARD_FILE, RECORD_FILE, PushConfig, push

    folder = tmp_path / "run"
    shutil.copytree(one_process_rounds, folder)
    staged = push(PushConfig(output_dir=str(folder), repo_id="me/rounds", dry_run=True))
    record = json.loads((staged / RECORD_FILE).read_text())
    last = json.loads((round_dir(folder, 1) / "selection_summary.json").read_text())
    assert record["rounds"] == 2 and record["step"] == ROUNDS["max_train_steps"]
    assert record["selection"] == last
    assert record["training"]["learning_rate"] == ROUNDS["learning_rate"]
    assert record["trained_in"] == "round-001"
    assert ("| online rounds | 2: each round samples from the LoRA of the round before; this LoRA was trained in "
            "round-001 |") in (staged / CARD_FILE).read_text()


def test_gors_status_of_a_rounds_folder_gives_the_finished_rounds_and_the_latest_one(one_process_rounds):
    from gors.status import folder_status

    rows = dict(folder_status(one_process_rounds))
    assert rows["rounds"] == "2 of 2 finished"
    assert rows["round-001 samples"] == "6 images of 3 prompts (2 each)"
    assert rows["round-001 training"].startswith(f"step {ROUNDS['max_train_steps']} of {ROUNDS['max_train_steps']} ")
    assert rows["final LoRA"] == "pytorch_lora_weights.safetensors (round 1's)"


@pytest.mark.parametrize("schedule, reset, grows", [("linear", False, False), ("linear", True, True),
                                                    ("constant", False, True)])
def test_rounds_may_grow_under_a_decaying_lr_only_with_a_fresh_optimizer_each_round(make_run_config, tmp_path,
                                                                                    schedule, reset, grows):
    """Growing --rounds re-lays a decay over more steps, refused; with --reset_optimizer each round has its own."""
    config = make_run_config(output_dir=str(tmp_path), **{**ROUNDS, "rounds": 3, "max_train_steps": 6},
                             lr_scheduler=schedule, reset_optimizer=reset)
    _recorded_rounds(config, 1, rounds=2)
    if grows:
        assert len(_finished(config, 1, PROMPTS, "b_vqa")) == 1
    else:
        with pytest.raises(ValueError, match=r"--lr_scheduler linear laid out over --rounds=2; --rounds=3 would"):
            _finished(config, 1, PROMPTS, "b_vqa")


@pytest.mark.parametrize("change, shown", [({"reset_optimizer": True}, "reset_optimizer: False -> True"),
                                           ({"anchor_below": 500}, "anchor_below: None -> 500")])
def test_a_rerun_that_would_train_the_rounds_to_come_otherwise_is_refused(make_run_config, tmp_path, change, shown):
    """A fresh optimizer per round, or anchoring low rewards to the base model, changes what the rounds still to come
    train on from the finished ones: refused as the finished rounds' other settings are."""
    config = make_run_config(output_dir=str(tmp_path), **{**ROUNDS, "rounds": 3, "max_train_steps": 6})
    _recorded_rounds(config, 1)
    assert len(_finished(config, 1, PROMPTS, "b_vqa")) == 1
    with pytest.raises(ValueError, match=rf"other settings \({shown}\)"):
        _finished(replace(config, **change), 1, PROMPTS, "b_vqa")


def test_rounds_take_up_to_ten_thousand_prompts_whose_seeds_stay_apart():
    """10,000 prompts (at most 99,999 images each) keep a round's seeds below the next round's; 10,001 are refused."""
    from gors.core.store import sample_seed
    from gors.rounds import check_round_seed_room

    check_round_seed_room(10_000)
    assert sample_seed(round_seed(0, 0), 9_999, 99_999) < sample_seed(round_seed(0, 1), 0, 0)
    with pytest.raises(ValueError, match=r"--rounds with 10001 prompts: rounds share image seeds beyond 10000"):
        check_round_seed_room(10_001)


def test_finished_rounds_of_another_prompt_set_of_the_same_size_are_refused(make_run_config, tmp_path):
    """The recorded prompts are compared by their text, not only their number."""
    config = make_run_config(output_dir=str(tmp_path), **{**ROUNDS, "rounds": 3, "max_train_steps": 6})
    _recorded_rounds(config, 1, rounds=2)
    with pytest.raises(ValueError, match=r"prompts_sha256: "):
        _finished(config, 1, ["a red circle", "a green square"], "b_vqa")
