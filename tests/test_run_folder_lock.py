"""One writer per stage per run folder: a second writer is refused at once, a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gors.cli import COMMANDS, main
from gors.core.lock import LockError, lock_path, run_folder_lock
from gors.core.store import SampleStore, StoreError

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
# A lock holder in another process, as light as can be (no torch): it takes the lock and sleeps.
HOLDER = ("import sys, time; from pathlib import Path; from gors.core.lock import _acquire; "
          "[_acquire(Path(sys.argv[1]), stage, 'gors score') for stage in sys.argv[2:]]; print('held', flush=True); "
          "time.sleep(300)")


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def holder_pid(folder: Path, stage: str) -> int | None:
    try:
        return json.loads(lock_path(folder, stage).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def test_second_writer_in_one_process_is_refused_and_released_lock_is_empty(tmp_path):
    run = tmp_path / "run"
    with run_folder_lock(run, ["score"], "gors score"):
        record = json.loads(lock_path(run, "score").read_text())
        assert (record["stage"], record["command"], record["pid"]) == ("score", "gors score", os.getpid())
        with pytest.raises(LockError, match=rf"{run} is being written by `gors score` \(pid {os.getpid()} on host "
                                            r".*\); wait for it or stop it\. A stale lock is taken over"):
            with run_folder_lock(run, ["generate", "score"], "gors run"):
                pass
        with run_folder_lock(run, ["generate"], "gors generate"):  # another stage of the folder is free
            pass
    assert lock_path(run, "score").read_text() == ""  # released: no record left to read as stale
    # The refused `gors run` released the generate lock it had taken before meeting the held one.
    with run_folder_lock(run, ["generate", "score"], "gors run"):
        pass


def test_the_score_stage_called_from_python_is_refused_while_another_process_generates(tmp_path):
    """score(config) from a script is refused while another process holds the folder's generate stage, as gors score is."""
    from gors.config import ScoreConfig
    from gors.score import score

    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), "generate"], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LockError, match=rf"{run} is being written by `gors score` \(pid {holder.pid} "):
            score(ScoreConfig(output_dir=str(run)))
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_gors_score_is_refused_while_gors_generate_writes_the_folder(tmp_path, capsys):
    # score rewrites the metadata files that generate appends to: a line added meanwhile would be lost
    run = tmp_path / "run"
    with run_folder_lock(run, ["generate"], "gors generate"):
        with pytest.raises(SystemExit) as refused:
            main(["score", "--output_dir", str(run)])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {run} is being written by `gors generate`")


def test_lock_of_a_killed_holder_is_taken_over_with_one_note(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), "score", "select"], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LockError, match=rf"`gors score` \(pid {holder.pid} "):
            with run_folder_lock(run, ["score"], "gors score"):
                pass
        holder.kill()
        holder.wait()
        with run_folder_lock(run, ["score", "select"], "gors score"):
            assert holder_pid(run, "score") == holder_pid(run, "select") == os.getpid()
        notes = capsys.readouterr().err
        assert notes.count("taking over") == 1  # one holder of both stages: one note
        assert f"taking over the lock of `gors score` (pid {holder.pid} " in notes
        assert "which holds it no longer (it stopped, or this folder is a copy made while it ran)" in notes
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_two_gors_generate_on_one_folder(tiny_sd, prompts_file, tmp_path, capsys):
    """The second `gors generate` is refused at once (one line, exit 2) and does nothing; the first,
    paused meanwhile so that it surely still holds the folder, then finishes normally."""
    run = tmp_path / "run"
    flags = ["--output_dir", str(run), "--pretrained_model_name_or_path", str(tiny_sd), "--train_prompts",
             str(prompts_file), "--images_per_prompt", "2", "--num_inference_steps", "2", "--resolution", "32",
             "--generation_batch_size", "2", "--seed", "0"]
    first = subprocess.Popen([sys.executable, "-m", "gors.cli", "generate", *flags], cwd=tmp_path, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: holder_pid(run, "generate") == first.pid or first.poll() is not None)
        first.send_signal(signal.SIGSTOP)
        with pytest.raises(SystemExit) as refused:
            main(["generate", *flags])
        assert refused.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {run} is being written by `gors generate` (pid {first.pid} on host ")
        assert "\n" not in err and "Traceback" not in err
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    keys = [(r["prompt_index"], r["image_index"]) for r in SampleStore(run / "samples").records()]
    assert sorted(keys) == [(p, i) for p in range(3) for i in range(2)]  # each image once


def test_gors_select_is_refused_while_gors_train_reads_the_selection(tmp_path, capsys):
    # train's processes read selection.jsonl while it runs: a select meanwhile would change it under them
    run = tmp_path / "run"
    assert COMMANDS["train"].locks == ("select", "train")
    with run_folder_lock(run, COMMANDS["train"].locks, "gors train"):
        with pytest.raises(SystemExit) as refused:
            main(["select", "--output_dir", str(run), "--reward_threshold", "0.5"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {run} is being written by `gors train`")


def test_a_folder_the_lock_made_is_removed_when_the_command_fails_before_writing_anything(tmp_path):
    def fail_in(folder, write=None, error=ValueError("bad input")):
        with pytest.raises(type(error)):
            with run_folder_lock(folder, ("generate", "score"), "gors test"):
                if write:
                    (folder / write).write_text("work")
                raise error

    fail_in(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()  # no folder holding only .lock-* files
    fail_in(tmp_path / "mistyped" / "parent" / "run")
    assert not (tmp_path / "mistyped").exists()  # nor the parents it made
    fail_in(tmp_path / "interrupted", error=KeyboardInterrupt())
    assert not (tmp_path / "interrupted").exists()  # Ctrl-C (no Exception) too
    fail_in(tmp_path / "started", write="metadata.jsonl")
    assert sorted(p.name for p in (tmp_path / "started").iterdir()) == [".lock-generate", ".lock-score",
                                                                         "metadata.jsonl"]  # work is kept
    (tmp_path / "existing").mkdir()
    fail_in(tmp_path / "existing")
    assert (tmp_path / "existing").is_dir()  # a folder it did not make stays
    with run_folder_lock(tmp_path / "fine", ("generate",), "gors test"):
        pass
    assert (tmp_path / "fine").is_dir()


def test_a_made_folder_holding_some_or_none_of_the_named_files_is_removed_with_its_made_parents(tmp_path):
    from gors.core.io import remove_folder_holding_only

    # A command that failed before writing every file it names (a lock not yet taken, the recipe's prompt file not
    # yet written) leaves no folder either; a file of another name keeps it.
    for held in ([".lock-generate"], []):
        folder = tmp_path / "made" / "run"
        folder.mkdir(parents=True)
        for name in held:
            (folder / name).write_text("")
        remove_folder_holding_only(folder, [".lock-generate", ".lock-score"], tmp_path / "made")
        assert not (tmp_path / "made").exists()
    folder.mkdir(parents=True)
    (folder / "metadata.jsonl").write_text("work")
    remove_folder_holding_only(folder, [".lock-generate", ".lock-score"], tmp_path / "made")
    assert [p.name for p in folder.iterdir()] == ["metadata.jsonl"]


LOCKING_SCRIPT = """
import json, sys
from gors.core.distributed import process_state
from gors.core.lock import LockError, run_folder_lock

state = process_state()
try:
    with run_folder_lock(sys.argv[1], ["score"], "gors score"):
        outcome = "held"
except LockError as err:
    outcome = str(err)
with open(f"{sys.argv[2]}/{state.process_index}.json", "w") as f:
    json.dump(outcome, f)
state.wait_for_everyone()
state.destroy_process_group()
"""


def test_a_process_of_an_earlier_launch_still_writing_its_share_stops_every_process(tmp_path):
    """A launch died but one of its processes on another node still appends to its part file: the retry's
    process of that index would append to the same file. Every process of the retry stops, naming it; once
    it is gone the retry runs."""
    from two_processes import launch

    run, script = tmp_path / "run", tmp_path / "lock.py"
    script.write_text(LOCKING_SCRIPT)
    orphan = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), "score-process-00001"], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout.readline() == "held\n"
        launch([str(script), str(run), str(tmp_path)], tmp_path)
        outcomes = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
        assert outcomes[0] == outcomes[1]
        assert outcomes[0].startswith(f"{run} is being written by `gors score` (pid {orphan.pid} on host ")
        assert holder_pid(run, "score") is None  # the main process's lock was released on the refusal
    finally:
        orphan.kill()
        orphan.wait()
    result = launch([str(script), str(run), str(tmp_path)], tmp_path)
    assert [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)] == ["held", "held"]
    assert "taking over" not in result.stderr  # a dead launch's lock of a share is no news
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".lock")) == [
        ".lock-score", ".lock-score-process-00001"]


def test_a_retry_with_fewer_processes_locks_the_shares_beyond_its_own(tmp_path, capsys):
    """A 2-process launch died, its process 1 still appending; the retry runs on one process, which has
    no process 1 to lock that share: its main process does, and is refused while the stray one runs."""
    run = tmp_path / "run"
    stray = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), "score-process-00001"], cwd=REPO, env=ENV,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert stray.stdout.readline() == "held\n"
        with pytest.raises(LockError, match=rf"`gors score` \(pid {stray.pid} "):
            with run_folder_lock(run, ["score"], "gors score"):
                pass
        stray.kill()
        stray.wait()
        with run_folder_lock(run, ["score"], "gors score"):
            assert holder_pid(run, "score-process-00001") == os.getpid()  # held for the retry's whole run
        assert "taking over" not in capsys.readouterr().err
    finally:
        stray.kill()
        stray.wait()


def test_only_a_share_lock_file_is_taken_for_a_share_of_an_earlier_launch(tmp_path):
    """A file named as a share's lock file and then some (a copy, `.bak`) is no share: no lock is taken for it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock-score-process-00002.bak").write_text("")
    with run_folder_lock(run, ["score"], "gors score"):
        assert sorted(p.name for p in run.iterdir()) == [".lock-score", ".lock-score-process-00002.bak"]


def test_stage_functions_called_from_a_script_hold_the_folder_as_the_commands_do(tmp_path):
    """A script's `generate(config)` beside a running `gors generate` would write every sample twice."""
    from gors.config import EvaluateConfig, GenerateConfig, ScoreConfig, SelectConfig, TrainConfig
    from gors.evaluate import evaluate
    from gors.generate import generate
    from gors.score import score
    from gors.select import select
    from gors.train import train

    run = tmp_path / "run"
    calls = {"generate": lambda: generate(GenerateConfig(output_dir=str(run))),
             "score": lambda: score(ScoreConfig(output_dir=str(run))),
             "select": lambda: select(SelectConfig(output_dir=str(run), reward_threshold=0.5)),
             "train": lambda: train(TrainConfig(output_dir=str(run))),
             "evaluate": lambda: evaluate(EvaluateConfig(output_dir=str(run), benchmarks="toy"))}
    for stage, call in calls.items():
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), stage], cwd=REPO, env=ENV,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(LockError, match=rf"{run} is being written by `gors score` \(pid {holder.pid} "):
                call()
        finally:
            holder.kill()
            holder.wait()
            holder.stdout.close()
    # A stage that reads earlier stages' files refuses a mistyped folder rather than make it (and its parents).
    with pytest.raises(FileNotFoundError, match=r"no such run folder; `gors select` works on the folder of a run"):
        select(SelectConfig(output_dir=str(tmp_path / "typo" / "run"), reward_threshold=0.5))
    assert not (tmp_path / "typo").exists()
    # Under a command that holds the folder (`gors run`, the CLI), a stage takes no lock again: no refusal.
    with run_folder_lock(run, ["select"], "gors run"):
        with pytest.raises(StoreError):  # past the lock: the empty folder has no samples
            select(SelectConfig(output_dir=str(run), reward_threshold=0.5))


def test_a_lock_record_is_read_only_whole_and_its_holder_told_apart_from_a_later_process(tmp_path, monkeypatch):
    """A record without the fields a holder is named by (a foreign or cut-short file) is no record; a holder
    that started up to a second after its record's time (start times are kept to the clock tick) still runs;
    another user's process, whose start time cannot be read, is taken to be the holder."""
    import socket

    import psutil

    from gors.core import lock
    from gors.core.lock import holder_runs, lock_records

    (tmp_path / ".lock-train").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    assert lock_records(tmp_path) == {}
    record = {"stage": "train", "command": "gors train", "pid": os.getpid(), "host": socket.gethostname(),
              "started": psutil.Process().create_time() - 0.5}
    lock_path(tmp_path, "train").write_text(json.dumps(record))
    assert lock_records(tmp_path) == {"train": record}
    assert holder_runs(record)  # its start, rounded to a tick, may read up to a second after the record's time
    assert not holder_runs(record | {"started": record["started"] - 1.0})  # a later process took the pid

    def denied(pid):
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(lock.psutil, "Process", denied)
    assert holder_runs(record | {"started": 0.0})


def test_a_stale_record_longer_than_the_new_one_leaves_nothing_behind_it(tmp_path, capsys):
    """Taking over a killed holder's lock replaces its record whole: a longer stale record (a long command
    line) must not leave its tail after the new one, which would make the new record unreadable."""
    from gors.core.lock import lock_records

    run = tmp_path / "run"
    run.mkdir()
    stale = {"stage": "score", "command": "gors score " + "--flag " * 200, "pid": 1, "host": "elsewhere",
             "argv": ["x"] * 200, "started": 1.0e9}
    lock_path(run, "score").write_text(json.dumps(stale))
    with run_folder_lock(run, ["score"], "gors score"):
        assert lock_records(run)["score"]["pid"] == os.getpid()
    assert "taking over the lock" in capsys.readouterr().err


def test_a_stage_under_a_held_lock_takes_none_again_through_another_path_to_the_folder(tmp_path, monkeypatch):
    """The locks held are known by the folder's real path: a stage called with a relative path or a link to
    the folder of a command holding it takes no lock again (which its own lock would refuse)."""
    from gors.core.lock import holding

    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    with run_folder_lock(run, ["select"], "gors run"):
        with holding(tmp_path / "link", ["select"], "gors select"):
            pass
        with holding("run", ["select"], "gors select"):
            pass
    with run_folder_lock("link", ["select"], "gors run"):  # and the other way round
        with holding(run, ["select"], "gors select"):
            pass


def test_nested_locks_of_other_stages_add_to_the_stages_held(tmp_path):
    """A lock taken inside another (a command that holds `select`, then `train`) adds to what the call stack
    holds: a stage function of either takes no lock again there."""
    from gors.core.lock import holding

    run = tmp_path / "run"
    with run_folder_lock(run, ["select"], "gors run"):
        with run_folder_lock(run, ["train"], "gors run"):
            with holding(run, ["select", "train"], "gors select"):
                pass
        with holding(run, ["select"], "gors select"):
            pass
    # Under a lock of some of its stages, a stage function takes the others' locks only.
    with run_folder_lock(run, ["select"], "gors run"):
        with holding(run, ["select", "train"], "gors train"):
            assert holder_pid(run, "select") == holder_pid(run, "train") == os.getpid()


def test_a_refused_command_leaves_no_lock_file_open(tmp_path):
    """A refusal closes the lock file it opened: a command that waits and tries again (a script's loop) would
    otherwise run out of file descriptors."""
    run = tmp_path / "run"
    with run_folder_lock(run, ["score"], "gors score"):
        open_files = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            with pytest.raises(LockError):
                with run_folder_lock(run, ["score"], "gors score"):
                    pass
        assert len(os.listdir("/proc/self/fd")) == open_files


def test_each_dead_holder_of_a_folder_is_noted_once(tmp_path, capsys):
    """Two killed commands held two stages of the folder: taking both over names each of them (one note per
    holder, not per folder or host)."""
    run = tmp_path / "run"
    run.mkdir()
    for stage, pid in (("score", 101), ("select", 102)):
        lock_path(run, stage).write_text(json.dumps({"stage": stage, "command": f"gors {stage}", "pid": pid,
                                                     "host": "elsewhere", "started": 1.0e9}))
    with run_folder_lock(run, ["score", "select"], "gors run"):
        pass
    notes = capsys.readouterr().err
    assert notes.count("taking over") == 2
    assert "`gors score` (pid 101 on host elsewhere" in notes and "`gors select` (pid 102 on host elsewhere" in notes
