"""The whole pipeline on two CPU processes (gloo), launched as users launch it."""

import json
import logging
import os
import pickle
import signal
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import PartialState
from safetensors.torch import load_file
from two_processes import launch, launch_gors_jobs

from gors.core.io import NotSharedError
from gors.core.scoring import load_scores
from gors.core.store import SampleStore


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shares_are_contiguous_and_as_large_as_strided_ones(world):
    """The stages split work with `split_between_processes`: every item once, in order, and each
    process as many items as a strided split gave it (so batch sizes, and numbers, stay the same)."""
    for count in range(12):
        items = [f"item {i}" for i in range(count)]
        shares = []
        for rank in range(world):
            layout = SimpleNamespace(num_processes=world, process_index=rank)  # what the split reads
            with PartialState.split_between_processes(layout, items) as share:
                shares.append(share)
        assert [x for share in shares for x in share] == items
        assert [len(share) for share in shares] == [len(items[rank::world]) for rank in range(world)]


def test_a_command_s_end_leaves_the_process_group_to_the_process_s_exit(tmp_path, monkeypatch):
    """The trackers end with the command, the process group with the process: a script may run another command in
    the same launched processes (test_family_training's runs do), and torch cannot form a second default group over
    torchrun's store."""
    import atexit

    import torch.distributed as dist

    from gors.core import distributed

    registered, finished = [], []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(distributed, "_ending_group_at_exit", False)
    accelerator = SimpleNamespace(trackers=[SimpleNamespace(finish=lambda: finished.append("tracker"))])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for _ in range(2):
            distributed.end_training(accelerator)
        assert finished == ["tracker", "tracker"] and dist.is_initialized()
        assert registered == [distributed._destroy_process_group]  # once per process
        registered[0]()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# `gors evaluate`'s flags in test_two_process_evaluation_equals_one_process, less the output folder.
EVALUATION_FLAGS = ["--benchmarks", "toy:train", "--max_prompts", "6", "--images_per_prompt", "2"]


@dataclass(frozen=True)
class Launched:
    """The two-process commands of this module, run one after another in one launch (`launch_gors_jobs`)."""

    run_flags: list[str]  # of `gors run` (and, the first 14, of `gors generate`)
    evaluated: Path  # `gors evaluate`'s --output_dir
    stderr: str


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny_sd, tiny_blip, module_prompts_file) -> Launched:
    """A whole `gors run` of the tiny SD (3 prompts x 3 images, 2 steps), then `gors evaluate` of the toy model."""
    from gors.core.toy import PRETRAINED_DIR

    root = tmp_path_factory.mktemp("launched")
    run_flags = [
        "--output_dir", str(root / "run"), "--pretrained_model_name_or_path", str(tiny_sd),
        "--train_prompts", str(module_prompts_file), "--images_per_prompt", "3",
        "--num_inference_steps", "2", "--resolution", "32", "--generation_batch_size", "2",
        "--reward_model_name_or_path", str(tiny_blip), "--reward_batch_size", "2", "--reward_threshold", "0.0",
        "--max_train_steps", "2", "--checkpointing_steps", "1", "--seed", "0",
    ]
    evaluate = ["evaluate", "--pretrained_model_name_or_path", str(PRETRAINED_DIR / "pipeline"), *EVALUATION_FLAGS,
                "--output_dir", str(root / "evaluated")]
    # Scoring overlapped with generation here; the two-round run of test_rounds scores after it. The
    # processes anchor different rows to the base model (--anchor_below), so its forward must be their own.
    result = launch_gors_jobs([["run", *run_flags, "--overlap_scoring", "--anchor_below", "500"], evaluate], cwd=root)
    return Launched(run_flags, root / "evaluated", result.stderr)


@pytest.mark.slow
def test_two_processes_give_one_consistent_store_and_one_lora(launched):
    flags = launched.run_flags
    run_dir = Path(flags[1])
    # The tiny BLIP's resolution note is the same on both processes: the main one says it.
    assert launched.stderr.count("B-VQA on ") == 1, launched.stderr[-3000:]

    store = SampleStore(run_dir / "samples")
    keys = [(r["prompt_index"], r["image_index"]) for r in store.records()]
    assert keys == [(p, i) for p in range(3) for i in range(3)]  # each image exactly once
    assert {r["path"].split("/")[0] for r in store.records()} == {"part-00000", "part-00001"}  # both wrote
    assert sorted(load_scores(run_dir, "b_vqa")) == keys
    scores = {path.name: len(path.read_text().splitlines()) for path in (run_dir / "scores" / "b_vqa").glob("part-*")}
    assert scores == {"part-00000.jsonl": 5, "part-00001.jsonl": 4}  # each process scored its own images
    stages = json.loads((run_dir / "timings.json").read_text())["stages"]
    # Both processes' images counted once, the steps once (not per process), on the two processes.
    assert (stages["generate+score"]["work"], stages["train"]["work"]) == (9, 2)
    assert stages["generate+score"]["num_processes"] == stages["train"]["num_processes"] == 2
    # The main process's own share, whose pace `gors estimate` prices (its 5 images of 9; every step).
    assert (stages["generate+score"]["main_work"], stages["train"]["main_work"]) == (5, 2)
    assert len(list(run_dir.glob("*.safetensors"))) == 1
    assert any(k.startswith("unet.") for k in load_file(str(run_dir / "pytorch_lora_weights.safetensors")))
    checkpoint = run_dir / "checkpoints" / "checkpoint-2"
    assert sorted(p.name for p in checkpoint.glob("random_states_*.pkl")) == ["random_states_0.pkl",
                                                                              "random_states_1.pkl"]

    # A rerun (here in one process, which reads both processes' parts) finds every image done and adds none.
    from gors.cli import main

    images = {p: p.stat().st_mtime_ns for p in (run_dir / "samples").rglob("*.png")}
    main(["generate", *flags[:14], "--seed", "0"])
    assert len(SampleStore(run_dir / "samples").records()) == 9
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "samples").rglob("*.png")} == images


@pytest.mark.slow
def test_two_process_evaluation_equals_one_process(launched, tmp_path):
    """`gors evaluate` shards generation and scoring; the numbers do not depend on the process count."""
    from gors.cli import main
    from gors.core.toy import PRETRAINED_DIR

    main(["evaluate", "--pretrained_model_name_or_path", str(PRETRAINED_DIR / "pipeline"), *EVALUATION_FLAGS,
          "--output_dir", str(tmp_path / "one")])
    two = launched.evaluated / "toy" / "train"
    assert sorted(p.name for p in (two / "scores").glob("part-*.jsonl")) == ["part-00000.jsonl", "part-00001.jsonl"]
    summaries = [json.loads((folder / "toy" / "train" / "summary.json").read_text())
                 for folder in (tmp_path / "one", launched.evaluated)]
    assert summaries[0]["num_images"] == summaries[1]["num_images"] == 12
    assert summaries[0]["binding_accuracy"] == summaries[1]["binding_accuracy"]


def test_a_folder_other_processes_cannot_see_is_refused_at_the_start(tmp_path, monkeypatch):
    """Process 1 of a launch whose --output_dir is node-local sees nothing the main process writes:
    the check names it and its host instead of a later "no samples" error."""
    import accelerate.utils

    from gors.core import distributed

    written = tmp_path / "main-node"
    written.mkdir()
    elsewhere = tmp_path / "other-node"  # the same path on another node: an empty local folder
    elsewhere.mkdir()
    broadcast: list = []

    def fake_broadcast(objects):
        broadcast.extend(objects)
        return objects

    def fake_gather(objects):  # both processes' answers, as all_gather_object returns them
        return [(0, "node-a", True), *objects]

    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", fake_broadcast)
    monkeypatch.setattr(accelerate.utils, "gather_object", fake_gather)
    main = SimpleNamespace(num_processes=2, is_main_process=True, process_index=0, wait_for_everyone=lambda: None)
    other = SimpleNamespace(num_processes=2, is_main_process=False, process_index=1, wait_for_everyone=lambda: None)

    # The main process writes the token; a process that sees the same folder finds it.
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: objects)
    distributed.check_shared_folder(written, main)
    name = broadcast[0]
    assert name.startswith(distributed.SHARED_CHECK_PREFIX) and not (written / name).exists()  # removed after
    distributed.check_shared_folder(written, main)
    assert broadcast[2] != name  # each check its own file: two commands on one folder do not collide

    monkeypatch.setattr(accelerate.utils, "gather_object", fake_gather)
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda objects: broadcast[-2:])
    waits: list = []  # a network filesystem may show the file late: it is looked for again, for 30 s
    monkeypatch.setattr(distributed.time, "monotonic", lambda: sum(waits))
    monkeypatch.setattr(distributed.time, "sleep", waits.append)
    with pytest.raises(NotSharedError, match=r"process 1 on .*cannot see what the main process \(on node-a\) writes"
                                             r".*--output_dir must be on"):
        distributed.check_shared_folder(elsewhere, other)
    assert sum(waits) == distributed.SHARED_CHECK_WAIT_S == 30.0


def test_a_folder_the_main_process_cannot_write_stops_every_process(tmp_path, monkeypatch):
    """A full or read-only disk on the main process is told to all: none is left waiting for the others."""
    import accelerate.utils

    from gors.core import distributed, io, lock

    told: list = []
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda objects: told.append(objects) or objects)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io, "atomic_write_bytes", no_space)
    main = SimpleNamespace(num_processes=2, is_main_process=True, process_index=0, wait_for_everyone=lambda: None)
    with pytest.raises(io.PathError, match="cannot be written: No space left on device"):
        distributed.check_shared_folder(tmp_path, main)
    assert len(told) == 1 and "No space" in told[0][1]  # the refusal is what the others receive

    monkeypatch.setattr(lock, "_acquire", no_space)
    with pytest.raises(io.PathError, match="cannot be locked: No space left on device"):
        with lock.run_folder_lock(tmp_path, ["score"], "gors score"):
            pass


def test_a_run_folder_the_main_process_cannot_make_stops_every_process_with_its_reason(tmp_path, monkeypatch):
    """A file in the path of `--output_dir`: every process gets the main process's one line that says so."""
    import accelerate.utils

    from gors.core import distributed, io, lock

    told: list = []
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda objects: told.append(objects) or objects)
    monkeypatch.setattr(distributed, "process_state", lambda: SimpleNamespace(
        num_processes=2, is_main_process=True, process_index=0, wait_for_everyone=lambda: None))
    (tmp_path / "file").write_text("")
    reason = f"--output_dir='{tmp_path}/file/run' lies under a file, not a folder; pass a folder path that you can write to"
    with pytest.raises(io.PathError) as refused:
        with lock.run_folder_lock(tmp_path / "file" / "run", ["score"], "gors score"):
            pass
    assert str(refused.value) == reason and told == [[("PathError", reason)]]


AGREEMENT_SCRIPT = """
import json, sys
from gors.core.distributed import check_agreement, every_process_tries, main_process_decides, process_state

state = process_state()
out = {}
# Each process would find another checkpoint (a network filesystem showing files late): the main one's counts.
out["decided"] = main_process_decides(state, lambda: f"checkpoint-{10 + state.process_index}")
def refuse():
    raise ValueError("checkpoint-10 was made with other settings")
try:
    main_process_decides(state, refuse)
except ValueError as err:
    out["refused"] = str(err)
# Each process finds its own answer (the micro-batch its device fits), and a failure on one stops every process.
out["tried"] = every_process_tries(state, lambda: 2 * state.process_index + 1)
def fits_on_the_main_process_only():
    if state.process_index == 1:
        raise ValueError("nothing fits on process 1")
    return 4
try:
    every_process_tries(state, fits_on_the_main_process_only)
except ValueError as err:
    out["tried_refused"] = str(err)
check_agreement(state, {"commit": "a" * 40}, "the base model", "fix it")  # agreeing: nothing raised
check_agreement(state, None if state.process_index else {"commit": "a"}, "the base model", "fix it")  # no share
try:  # each node resolved the model in its own cache
    check_agreement(state, {"commit": "ab"[state.process_index] * 40}, "the base model", "Share one HF_HOME.")
except RuntimeError as err:
    out["disagreement"] = str(err)
with open(f"{sys.argv[1]}/{state.process_index}.json", "w") as f:
    json.dump(out, f)
state.wait_for_everyone()
state.destroy_process_group()  # as the commands end: a process leaving with its group open may abort on exit
"""


def test_decisions_and_disagreements_reach_every_process(tmp_path):
    """On two real processes: the main process's decision (or refusal) is every process's, each process's own
    answer reaches all (one process's error stops every one), and a value the processes disagree on stops all
    of them, naming it, each side and the fix (none left waiting)."""
    script = tmp_path / "agree.py"
    script.write_text(AGREEMENT_SCRIPT)
    launch([str(script), str(tmp_path)], tmp_path)
    outcomes = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["decided"] == "checkpoint-10"
    assert outcomes[0]["refused"] == "checkpoint-10 was made with other settings"
    assert outcomes[0]["tried"] == [1, 3]
    assert outcomes[0]["tried_refused"] == "nothing fits on process 1"
    message = outcomes[0]["disagreement"]
    assert message.startswith("the processes of this launch do not agree on the base model: commit ")
    assert f"'{'a' * 40}' on process 0" in message and f"'{'b' * 40}' on process 1" in message
    assert message.endswith("Share one HF_HOME.")


SINK_AGREEMENT_SCRIPT = """
import json, sys
from types import SimpleNamespace
from PIL import Image
from gors.core.distributed import make_accelerator
from gors.core.sampling import SamplingProtocol, generate_samples
from gors.core.store import SampleStore

accelerator = make_accelerator()
rank = accelerator.process_index

class Sink:  # scoring overlapped with generation, its reward resolved in each node's own cache
    model_commits = {}
    def open(self):
        self.model_commits = {"org/reward": "ab"[rank] * 40}
    def add(self, records, images):
        raise AssertionError("no image may be generated")
    def stop(self):
        pass

def pipeline(**kwargs):
    return SimpleNamespace(images=[Image.new("RGB", (8, 8))] * len(kwargs["prompt"]))

protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8)
store = SampleStore(sys.argv[1] + "/samples")
try:
    generate_samples(store, ["a red circle", "a blue square"], protocol, lambda: pipeline, accelerator,
                     settings={"model": "/local/pipeline"}, sink=Sink())
    outcome = "generated"
except RuntimeError as err:
    outcome = str(err)
with open(f"{sys.argv[1]}/{rank}.json", "w") as f:
    json.dump({"outcome": outcome, "records": len(store.records())}, f)
accelerator.wait_for_everyone()
accelerator.state.destroy_process_group()
"""


def test_processes_scoring_alongside_generation_with_other_reward_commits_stop_before_generating(tmp_path):
    """`--overlap_scoring` on two real processes whose caches hold other snapshots of the reward model: both
    stop before the first image, naming the model's commit on each side (scores of two models never mix)."""
    script = tmp_path / "sink.py"
    script.write_text(SINK_AGREEMENT_SCRIPT)
    launch([str(script), str(tmp_path)], tmp_path)
    outcomes = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["records"] == 0
    message = outcomes[0]["outcome"]
    assert message.startswith("the processes of this launch do not agree on the models that score: org/reward ")
    assert f"'{'a' * 40}' on process 0" in message and f"'{'b' * 40}' on process 1" in message


@pytest.fixture
def restored_loggers(monkeypatch):
    """[(logger, level, filters)] of the loggers `speak_once` sets up, each put back as it was after the test."""
    import gors.core.io  # noqa: F401  (their own-work loggers are made on import)
    import gors.core.memory  # noqa: F401
    import gors.training_data  # noqa: F401
    from gors.core import logs

    names = (*logs.PACKAGES, "gors.core.memory", "gors.core.io.writes", "gors.training_data", "made.later")
    saved = [(logger, logger.level, list(logger.filters)) for logger in map(logging.getLogger, names)]
    monkeypatch.setattr(logs, "_process", None)
    monkeypatch.setattr(logs, "_own_work", set(logs._own_work))
    yield saved
    for logger, level, filters in saved:
        logger.setLevel(level)
        logger.filters[:] = filters


def test_under_several_processes_shared_warnings_are_said_once_and_own_work_by_each_naming_itself(caplog,
                                                                                                restored_loggers):
    from gors.core import logs

    loggers = [logger for logger, _, _ in restored_loggers]
    logs.speak_once(1, 0)  # alone: unchanged
    assert [(logger.level, logger.filters) for logger in loggers] == [(level, f) for _, level, f in restored_loggers]
    for _ in range(2):  # idempotent: one name per message
        logs.speak_once(2, 1)
    logs.own_work_logger("made.later")  # a logger made after speak_once is set up as well
    with caplog.at_level(logging.WARNING):
        logging.getLogger("rewards.b_vqa").warning("a model's note")
        logging.getLogger("gors.core.io").warning("a shared file's cut line")
        logging.getLogger("gors.core.sampling").error("this process failed")
        logging.getLogger("gors.core.memory").warning("out of device memory")
        logging.getLogger("gors.core.io.writes").warning("cut its own part's line")
        logging.getLogger("gors.training_data").warning("its own cache part is damaged")
        logging.getLogger("made.later").warning("later")
    assert [record.getMessage() for record in caplog.records] == [
        "this process failed", "process 1: out of device memory", "process 1: cut its own part's line",
        "process 1: its own cache part is damaged", "process 1: later"]


def test_alone_every_warning_is_said_and_both_ways_to_start_watch_the_launcher(caplog, monkeypatch, restored_loggers):
    from gors.core import distributed

    watches = []
    monkeypatch.setattr(distributed, "die_with_launcher", lambda: watches.append("watch"))
    for start in (distributed.process_state, distributed.make_accelerator):
        start()
        distributed.reset_process_state()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("gors.core.io").warning("a shared file's cut line")
    assert [record.getMessage() for record in caplog.records] == ["a shared file's cut line"]
    assert watches == ["watch", "watch"]


def test_under_a_launcher_the_process_dies_with_it_and_alone_it_may_outlive_its_shell(monkeypatch):
    """`die_with_launcher`: nothing without a launcher's variables (a plain `gors ...` under nohup); under either,
    the kernel is told once to SIGKILL the process when its parent dies, a thread polls the parent where the kernel
    refuses, and a launcher that died before the call kills the process at once."""
    import gors
    from gors.core import distributed

    told, watched, killed = [], [], []
    refused = [False]
    libc = SimpleNamespace(prctl=lambda *args: told.append(args) or -refused[0])
    monkeypatch.setattr(distributed.ctypes, "CDLL", lambda name, use_errno: libc)
    monkeypatch.setattr(distributed.threading, "Thread",
                        lambda target, args, **kwargs: SimpleNamespace(start=lambda: watched.append((target, args))))
    monkeypatch.setattr(distributed.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(gors, "PARENT_AT_START", os.getppid())
    for variable in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)

    def started(variable: str | None = None) -> None:  # a fresh process, launched with `variable` set
        monkeypatch.setattr(distributed, "_watching_launcher", False)
        for name in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
            monkeypatch.delenv(name, raising=False)
        if variable:
            monkeypatch.setenv(variable, "0")

    started()
    distributed.die_with_launcher()
    assert not told
    started("LOCAL_RANK")
    for _ in range(2):  # idempotent
        distributed.die_with_launcher()
    assert told == [(distributed.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)] and not watched and not killed
    started("TORCHELASTIC_RUN_ID")
    refused[0] = True
    distributed.die_with_launcher()
    assert watched == [(distributed._watch_parent, (os.getppid(),))] and not killed
    started("LOCAL_RANK")
    monkeypatch.setattr(gors, "PARENT_AT_START", os.getppid() + 1)  # the launcher died while Python started
    distributed.die_with_launcher()
    assert killed == [(os.getpid(), signal.SIGKILL)]
    # The polling thread: the process ends (at once, as a SIGKILL would) when its parent changes.
    parents, exits = iter([7, 7, 1]), []
    monkeypatch.setattr(distributed.os, "getppid", lambda: next(parents))
    monkeypatch.setattr(distributed.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(distributed.os, "_exit", exits.append)
    distributed._watch_parent(7)
    assert exits == [1] and next(parents, None) is None


class Unpicklable(Exception):
    """An error that cannot be sent to another process (as one that holds a file handle)."""

    def __reduce__(self):
        raise TypeError("cannot pickle")


def _fails() -> None:
    raise Unpicklable("no room")


def test_an_error_that_does_not_pickle_reaches_the_other_processes_as_its_message(monkeypatch):
    """Alone, a decision's error is raised as it is; sent to other processes, one that does not pickle is a
    RuntimeError that tells it. A process that failed raises its own error, else that of the first that did."""
    import accelerate.utils

    from gors.core import distributed

    def travel(objects):  # as the collectives send them
        return pickle.loads(pickle.dumps(objects))

    with pytest.raises(Unpicklable):
        distributed.main_process_decides(SimpleNamespace(num_processes=1, is_main_process=True), _fails)
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", travel)
    with pytest.raises(RuntimeError, match=r"^Unpicklable: no room$"):
        distributed.main_process_decides(SimpleNamespace(num_processes=3, is_main_process=True), _fails)
    # Process 1 of three; processes 0 and 2 fail too.
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: [
        (None, ValueError("process 0's")), *travel(objects), (None, KeyError("process 2's"))])
    second = SimpleNamespace(num_processes=3, is_main_process=False, process_index=1)
    with pytest.raises(Unpicklable):
        distributed.every_process_tries(second, _fails)
    with pytest.raises(ValueError, match="process 0's"):
        distributed.every_process_tries(second, lambda: 4)


def test_a_value_only_some_processes_have_is_a_disagreement(monkeypatch):
    import accelerate.utils

    from gors.core import distributed

    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: [(0, "node-a", {"base": "a"}),
                                                                            (1, "node-b", {"base": "a", "lora": "b"})])
    with pytest.raises(RuntimeError, match=r"agree on the models: lora None on process 0 \(node-a\), 'b' on process 1 "
                                           r"\(node-b\)\. Fix it\.$"):
        distributed.check_agreement(SimpleNamespace(num_processes=2, process_index=0), {"base": "a"}, "the models",
                                    "Fix it.")


def test_the_progress_bar_is_the_main_processs_and_says_it_counts_its_share():
    from gors.core.distributed import progress_bar

    bars = [progress_bar(6, SimpleNamespace(num_processes=processes, is_main_process=main), "generate")
            for processes, main in ((1, True), (2, True), (2, False))]
    assert [bar.disable for bar in bars] == [False, False, True]
    assert [bar.desc for bar in bars[:2]] == ["generate", "generate (process 0 of 2)"]
    for bar in bars:
        bar.close()


def test_wait_until_visible_reads_again_until_complete_or_the_wait_is_over(monkeypatch):
    """Reads every 0.5 s until the answer is complete; after `wait_s` without one, the last answer is returned."""
    import gors.core.distributed as distributed

    clock = [0.0]
    monkeypatch.setattr(distributed.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(distributed.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    reads = iter(range(100))
    assert distributed.wait_until_visible(lambda: next(reads), lambda n: n >= 3, wait_s=10) == 3
    assert clock[0] == 1.5  # three waits of 0.5 s
    clock[0], reads = 0.0, iter(range(100))
    assert distributed.wait_until_visible(lambda: next(reads), lambda n: n >= 50, wait_s=2) == 4  # 2 s: 4 reads more
    clock[0], reads = 0.0, iter(range(100))
    assert distributed.wait_until_visible(lambda: next(reads), lambda n: False, wait_s=0) == 0  # one read only


def test_after_a_reset_the_next_run_starts_from_fresh_process_state(monkeypatch):
    """`reset_process_state` between two runs in one Python process: the next one neither keeps the device the
    first one's state chose, nor a gradient sync a training stopped in the middle of an update left off."""
    from gors.core.distributed import make_accelerator, process_state, reset_process_state

    accelerator = make_accelerator(gradient_accumulation_steps=2)
    accelerator.gradient_state._set_sync_gradients(False)  # stopped between two micro-batches of an update
    reset_process_state()
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:0")  # where the next run is told to go
    assert make_accelerator().sync_gradients and process_state().device == torch.device("cpu:0")
    reset_process_state()
