"""Checkpoint folders: complete only with their marker, published atomically, resumed only under their settings.

Training itself (kills, resumes, refusals on a real run) is tested in tests/test_train.py.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from gors.checkpoints import (
    check_intact,
    check_resumable,
    checkpoint_step,
    complete_checkpoints,
    find_checkpoint,
    later_checkpoint,
    own_checkpoint,
    prune_checkpoints,
    restore_own_training,
    set_aside_logs,
    set_aside_other_trainings,
    training_fingerprint,
    write_checkpoint,
)
from gors.config import TrainConfig
from gors.core.io import discard_folder, publish_folder, recover_folder
from gors.core.run_folder import CHECKPOINT_MARKER


def _checkpoint(root: Path, name: str, fingerprint: dict | None = None) -> Path:
    """A checkpoint folder; complete (with its marker) when a fingerprint is given."""
    path = root / "checkpoints" / name
    path.mkdir(parents=True)
    if fingerprint is not None:
        (path / CHECKPOINT_MARKER).write_text(json.dumps({"fingerprint": fingerprint}))
    return path


def test_checkpoint_names():
    assert checkpoint_step("runs/x/checkpoints/checkpoint-500") == 500
    for name in ("checkpoint-best", "checkpoint-5-old", "best", ".checkpoint-5.tmp"):
        with pytest.raises(ValueError, match="names are checkpoint-<step>"):
            checkpoint_step(name)


def test_latest_passes_over_incomplete_folders_and_names_them(tmp_path):
    _checkpoint(tmp_path, "checkpoint-2", {})
    newest = _checkpoint(tmp_path, "checkpoint-10", {})  # by step, not by name
    _checkpoint(tmp_path, "checkpoint-12")  # e.g. `mkdir`, or a save killed by an older gors
    _checkpoint(tmp_path, "checkpoint-best", {})  # not a checkpoint name: not a candidate
    (tmp_path / "checkpoints" / ".checkpoint-14.tmp").mkdir()  # a save in progress or killed
    warnings = []
    assert find_checkpoint(tmp_path, "latest", warn=warnings.append) == newest
    assert len(warnings) == 1 and "checkpoint-12" in warnings[0] and "incomplete" in warnings[0]
    assert find_checkpoint(tmp_path / "no_run", "latest") is None


def test_an_explicit_checkpoint_must_be_complete_and_well_named(tmp_path):
    complete = _checkpoint(tmp_path, "checkpoint-4", {})
    assert find_checkpoint(tmp_path, "checkpoint-4") == complete
    assert find_checkpoint(tmp_path, str(complete)) == complete
    _checkpoint(tmp_path, "checkpoint-6")
    with pytest.raises(ValueError, match=r"checkpoint-6 is incomplete \(no checkpoint.json.*pass 'latest'"):
        find_checkpoint(tmp_path, "checkpoint-6")
    _checkpoint(tmp_path, "best", {})
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint='best': .*names are checkpoint-<step>"):
        find_checkpoint(tmp_path, "best")
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        find_checkpoint(tmp_path, "checkpoint-8")


def test_a_resume_under_other_settings_or_past_max_train_steps_is_refused(tmp_path):
    recorded = {"rank": 4, "selection_sha256": "aaaa", "num_processes": 2}
    checkpoint = _checkpoint(tmp_path, "checkpoint-6", recorded)
    assert check_resumable(checkpoint, recorded, max_train_steps=6) == 6
    with pytest.raises(ValueError, match=r"rank 4 in the checkpoint, 8 now; selection_sha256 'aaaa' in the checkpoint, "
                                         r"'bbbb' now.*new --output_dir"):
        check_resumable(checkpoint, recorded | {"rank": 8, "selection_sha256": "bbbb"}, max_train_steps=6)
    with pytest.raises(ValueError, match=r"at step 6, past --max_train_steps=5.*--max_train_steps 6 or more"):
        check_resumable(checkpoint, recorded, max_train_steps=5)


def test_a_run_goes_on_from_its_own_checkpoint_and_sets_another_trainings_aside(tmp_path):
    fingerprint = {"rank": 4, "selection_sha256": "aaaa"}
    assert own_checkpoint(tmp_path, fingerprint, max_train_steps=10) is None  # no checkpoints
    _checkpoint(tmp_path, "checkpoint-2", fingerprint)
    newest = _checkpoint(tmp_path, "checkpoint-4", fingerprint)
    _checkpoint(tmp_path, "checkpoint-6")  # incomplete: passed over
    assert set_aside_other_trainings(tmp_path, fingerprint) is None  # the same training: nothing moves
    assert own_checkpoint(tmp_path, fingerprint, max_train_steps=10) == newest
    assert own_checkpoint(tmp_path, fingerprint, max_train_steps=3).name == "checkpoint-2"  # a shorter run
    other = fingerprint | {"rank": 8}
    aside, differences = set_aside_other_trainings(tmp_path, other)
    assert aside == tmp_path / "checkpoints.previous-1" and differences == ["rank 4 in the checkpoint, 8 now"]
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]  # kept
    assert own_checkpoint(tmp_path, other, max_train_steps=10) is None
    _checkpoint(tmp_path, "checkpoint-2", fingerprint)
    assert set_aside_other_trainings(tmp_path, other)[0] == tmp_path / "checkpoints.previous-2"  # never overwritten


def test_a_checkpoint_is_bound_to_the_base_models_commit_where_both_know_it(tmp_path, monkeypatch):
    import gors.checkpoints
    from gors.validation import training_identity

    config = TrainConfig(output_dir=str(tmp_path), pretrained_model_name_or_path="org/model")
    monkeypatch.setattr(gors.checkpoints, "model_version", lambda name, revision=None: None)
    unknown = training_fingerprint(config, [], 1, {})  # a model the cache does not hold
    assert "base_model_commit" not in unknown
    monkeypatch.setattr(gors.checkpoints, "model_version", lambda name, revision=None: "a" * 40)
    at_a = training_fingerprint(config, [], 1, {})
    assert at_a["base_model_commit"] == "a" * 40
    checkpoint = _checkpoint(tmp_path, "checkpoint-2", at_a)
    assert check_resumable(checkpoint, at_a, max_train_steps=4) == 2
    # A checkpoint made before the commit was recorded, or a model whose commit is unknown now: no difference.
    assert check_resumable(_checkpoint(tmp_path, "checkpoint-1", unknown), at_a, max_train_steps=4) == 1
    assert check_resumable(checkpoint, unknown, max_train_steps=4) == 2
    at_b = at_a | {"base_model_commit": "b" * 40}
    with pytest.raises(ValueError, match=f"base_model_commit '{'a' * 40}' in the checkpoint, '{'b' * 40}' now"):
        check_resumable(checkpoint, at_b, max_train_steps=4)
    assert set_aside_other_trainings(tmp_path, at_b)[1] == [f"base_model_commit '{'a' * 40}' in the checkpoint, "
                                                            f"'{'b' * 40}' now"]
    assert training_identity(at_a) == training_identity(unknown)  # a best LoRA stays its training's


def test_a_local_base_model_moved_elsewhere_keeps_its_checkpoints_and_best_lora(tmp_path, monkeypatch):
    import gors.checkpoints
    from gors.checkpoints import fingerprint_differences
    from gors.validation import training_identity

    files = "sha256:" + "1" * 64
    monkeypatch.setattr(gors.checkpoints, "model_version", lambda name, revision=None: files)
    before = training_fingerprint(TrainConfig(output_dir=str(tmp_path), pretrained_model_name_or_path="/a/m"), [], 1, {})
    moved = training_fingerprint(TrainConfig(output_dir=str(tmp_path), pretrained_model_name_or_path="/b/m"), [], 1, {})
    assert fingerprint_differences(before, moved) == []
    assert training_identity(before) == training_identity(moved)
    assert training_identity(before, by_path=True) != training_identity(moved, by_path=True)  # as recorded before
    other = moved | {"base_model_commit": "sha256:" + "2" * 64}  # other files: the path counts again
    assert fingerprint_differences(before, other) == [
        f"base_model_commit '{files}' in the checkpoint, 'sha256:{'2' * 64}' now",
        "pretrained_model_name_or_path '/a/m' in the checkpoint, '/b/m' now"]
    unrecorded = {key: value for key, value in before.items() if key != "base_model_commit"}  # an older checkpoint
    assert fingerprint_differences(unrecorded, moved) == [
        "pretrained_model_name_or_path '/a/m' in the checkpoint, '/b/m' now"]


def test_a_checkpoint_is_bound_to_its_mixed_precision_where_recorded(tmp_path):
    """fp16 keeps a loss scaler that bf16 and fp32 lack, and each computes other gradients: a checkpoint
    resumes only under its own precision. One made before it was recorded resumes as before."""
    from gors.validation import training_identity

    config = TrainConfig(output_dir=str(tmp_path))
    unknown = training_fingerprint(config, [], 1, {})
    fp16 = training_fingerprint(config, [], 1, {}, mixed_precision="fp16")
    assert "mixed_precision" not in unknown and fp16["mixed_precision"] == "fp16"
    checkpoint = _checkpoint(tmp_path, "checkpoint-2", fp16)
    assert check_resumable(checkpoint, fp16, max_train_steps=4) == 2
    assert check_resumable(_checkpoint(tmp_path, "checkpoint-1", unknown), fp16, max_train_steps=4) == 1
    bf16 = training_fingerprint(config, [], 1, {}, mixed_precision="bf16")
    with pytest.raises(ValueError, match="mixed_precision 'fp16' in the checkpoint, 'bf16' now"):
        check_resumable(checkpoint, bf16, max_train_steps=4)
    assert training_identity(fp16) == training_identity(unknown)  # a best LoRA recorded before stays its training's


def test_another_trainings_best_lora_is_set_aside_with_its_checkpoints_even_after_a_kill(tmp_path):
    fingerprint, other = {"rank": 4}, {"rank": 8}
    _checkpoint(tmp_path, "checkpoint-2", fingerprint)
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text("{}")
    # As if killed between the two renames: best/ already went into checkpoints/, which is still in place.
    (tmp_path / "best").rename(tmp_path / "checkpoints" / "best")
    (tmp_path / "validation").mkdir()
    aside, _ = set_aside_other_trainings(tmp_path, other, with_folders=("best", "validation"))
    assert sorted(p.name for p in aside.iterdir()) == ["best", "checkpoint-2", "validation"]
    assert (aside / "best" / "best.json").is_file() and not (tmp_path / "best").exists()
    # Killed so, then rerun with the checkpoints' own settings: nothing is set aside, and best/ goes back.
    aside.rename(tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "validation").rename(tmp_path / "validation")
    assert set_aside_other_trainings(tmp_path, fingerprint, with_folders=("best", "validation")) is None
    assert (tmp_path / "best" / "best.json").is_file() and (tmp_path / "validation").is_dir()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-2"]


def test_the_same_training_again_goes_on_from_its_checkpoints_that_another_set_aside(tmp_path):
    mine, slip = {"rank": 4}, {"rank": 8}
    _checkpoint(tmp_path, "checkpoint-2", mine)
    _checkpoint(tmp_path, "checkpoint-4", mine)
    (tmp_path / "best").mkdir()
    set_aside_other_trainings(tmp_path, slip, with_folders=("best",))  # a run with a mistyped flag
    _checkpoint(tmp_path, "checkpoint-2", slip)
    assert set_aside_other_trainings(tmp_path, mine, with_folders=("best",))[0].name == "checkpoints.previous-2"
    # The first command again: its checkpoints come back, with its best LoRA, and it goes on from step 4.
    assert restore_own_training(tmp_path, mine, 10, with_folders=("best",)) == tmp_path / "checkpoints.previous-1"
    assert own_checkpoint(tmp_path, mine, max_train_steps=10).name == "checkpoint-4"
    assert (tmp_path / "best").is_dir() and not (tmp_path / "checkpoints" / "best").exists()
    assert restore_own_training(tmp_path, mine, 10) is None  # checkpoints/ holds them already
    # A training killed before its first checkpoint left a checkpoints/ of nothing complete: kept aside, not deleted.
    set_aside_other_trainings(tmp_path, slip)
    _checkpoint(tmp_path, "checkpoint-8")
    assert restore_own_training(tmp_path, mine, 1) is None  # none of this training at or before step 1
    assert restore_own_training(tmp_path, mine, 10).name == "checkpoints.previous-1"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.glob("checkpoints.previous-*")) == [
        "checkpoints.previous-2", "checkpoints.previous-3"]
    assert [p.name for p in (tmp_path / "checkpoints.previous-3").iterdir()] == ["checkpoint-8"]
    assert restore_own_training(tmp_path, slip, 10) is None  # another training's checkpoints are in place


def test_a_restore_sets_the_folders_of_the_training_in_between_aside(tmp_path):
    mine, slip, kept = {"rank": 4}, {"rank": 8}, ("logs", "validation")

    def folders_of(training: str) -> None:
        for name in kept:
            (tmp_path / name).mkdir()
            (tmp_path / name / training).write_text("")

    _checkpoint(tmp_path, "checkpoint-2", mine)
    folders_of("mine")
    set_aside_other_trainings(tmp_path, slip, with_folders=kept)
    folders_of("slip")  # the slip logged and validated, then stopped before its first checkpoint
    assert restore_own_training(tmp_path, mine, 10, with_folders=kept) == tmp_path / "checkpoints.previous-1"
    assert all(sorted(p.name for p in (tmp_path / name).iterdir()) == ["mine"] for name in kept)
    assert all((tmp_path / "checkpoints.previous-2" / name / "slip").is_file() for name in kept)
    # A checkpoint of this folder set aside is this folder's own: refused for its settings, not as another folder's.
    with pytest.raises(ValueError, match="it belongs to a run with other settings: rank 4 in the checkpoint, 8 now"):
        check_resumable(tmp_path / "checkpoints" / "checkpoint-2", slip, 10, output_dir=tmp_path)
    # The training set aside is named where a resume asks for a checkpoint of other settings.
    run = tmp_path / "run"
    _checkpoint(run, "checkpoint-3", mine)
    set_aside_other_trainings(run, slip)
    slips = _checkpoint(run, "checkpoint-1", slip)
    with pytest.raises(ValueError, match=r"other settings: rank 8 in the checkpoint, 4 now\. \S*checkpoints.previous-1/"
                                         r"checkpoint-3 is a checkpoint of these settings, set aside by that run: rerun "
                                         r"without --resume_from_checkpoint to go on from it"):
        check_resumable(slips, mine, 10, output_dir=run)


def test_a_decaying_lr_schedule_binds_a_checkpoint_to_the_runs_length(tmp_path):
    # diffusers' schedulers save only their step: resumed under another length, a cosine would jump
    selection = [{"path": "part-00000/00000_000.png", "reward": 0.9}]
    cosine = TrainConfig(output_dir=str(tmp_path), lr_scheduler="cosine", max_train_steps=100)
    recorded = training_fingerprint(cosine, selection, 1, {})
    assert recorded["lr_schedule_steps"] == 100
    assert training_fingerprint(cosine, selection, 1, {}, schedule_steps=300)["lr_schedule_steps"] == 300
    checkpoint = _checkpoint(tmp_path, "checkpoint-90", recorded)
    longer = training_fingerprint(replace(cosine, max_train_steps=200), selection, 1, {})
    with pytest.raises(ValueError, match=r"--lr_scheduler cosine decays over the run's --max_train_steps: resume "
                                         r"with the number the run started with\): lr_schedule_steps 100 in the "
                                         r"checkpoint, 200 now"):
        check_resumable(checkpoint, longer, max_train_steps=200)
    constant = replace(cosine, lr_scheduler="constant")  # its LR is the same at any length: runs may grow
    assert "lr_schedule_steps" not in training_fingerprint(constant, selection, 1, {})
    # Another schedule is the difference itself: no hint about the run's length.
    linear = training_fingerprint(replace(cosine, lr_scheduler="linear", max_train_steps=200), selection, 1, {})
    with pytest.raises(ValueError, match=r"other settings: lr_schedule_steps 100 in the checkpoint, 200 now; "
                                         r"lr_scheduler 'cosine' in the checkpoint, 'linear' now") as refused:
        check_resumable(checkpoint, linear, max_train_steps=200)
    assert "decays over" not in str(refused.value)


def test_objective_settings_bind_a_checkpoint_only_where_they_are_set(tmp_path):
    selection = [{"path": "part-00000/00000_000.png", "reward": 0.9}]
    default = training_fingerprint(TrainConfig(output_dir=str(tmp_path)), selection, 1, {})
    assert not {"caption_dropout", "sample_latents", "max_grad_norm"} & default.keys()  # as before they were recorded
    set_ = training_fingerprint(TrainConfig(output_dir=str(tmp_path), caption_dropout=0.1, sample_latents=False,
                                            max_grad_norm=0.5), selection, 1, {})
    assert (set_["caption_dropout"], set_["sample_latents"], set_["max_grad_norm"]) == (0.1, False, 0.5)
    # A refusal names the default a fingerprint without the key holds, not None.
    checkpoint = _checkpoint(tmp_path, "checkpoint-2", set_)
    with pytest.raises(ValueError, match=r"caption_dropout 0.1 in the checkpoint, 0.0 now; max_grad_norm 0.5 in the "
                                         r"checkpoint, 1.0 now; sample_latents False in the checkpoint, True now"):
        check_resumable(checkpoint, default, max_train_steps=2)
    # An explicit default (as a fingerprint of older code could hold it) is the same setting as none.
    explicit = _checkpoint(tmp_path / "explicit", "checkpoint-2",
                           default | {"caption_dropout": 0.0, "max_grad_norm": 1.0, "sample_latents": True})
    assert own_checkpoint(tmp_path / "explicit", default, 2) == explicit


def test_write_checkpoint_publishes_a_complete_folder_and_prunes_only_then(tmp_path, monkeypatch):
    import accelerate.accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters()))
    root = tmp_path / "checkpoints"
    _checkpoint(tmp_path, "checkpoint-2", {})
    partial = _checkpoint(tmp_path, "checkpoint-3")  # what an older gors left when killed mid-save
    (partial / "model.safetensors").write_bytes(b"torn")
    (root / ".checkpoint-9.tmp").mkdir()  # a save killed earlier
    aside = _checkpoint(tmp_path, "checkpoint-1", {})
    aside.rename(root / ".checkpoint-1.old")  # a re-save of step 1 killed between publish_folder's renames
    during_save = []
    original = accelerate.accelerator.save_accelerator_state
    monkeypatch.setattr(accelerate.accelerator, "save_accelerator_state",
                        lambda *args, **kwargs: (during_save.append(sorted(p.name for p in root.iterdir())),
                                                 original(*args, **kwargs))[1])

    path = write_checkpoint(accelerator, tmp_path, 3, {"rank": 4}, total_limit=1)
    # The old one is kept meanwhile, and the one set aside is back in place rather than deleted.
    assert during_save == [[".checkpoint-3.tmp", "checkpoint-1", "checkpoint-2", "checkpoint-3"]]
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-3"]  # then pruned; nothing stale is left
    marker = json.loads((path / CHECKPOINT_MARKER).read_text())
    assert marker["step"] == 3 and marker["fingerprint"] == {"rank": 4}
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= {p.name for p in path.iterdir()}
    assert (path / "model.safetensors").read_bytes() != b"torn"


def test_a_shorter_run_keeps_the_longer_run_s_checkpoints_past_its_steps(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters()))
    fingerprint = {"rank": 4}
    _checkpoint(tmp_path, "checkpoint-1", fingerprint)
    longer = _checkpoint(tmp_path, "checkpoint-3", fingerprint)
    assert later_checkpoint(tmp_path, fingerprint, max_train_steps=2) == longer
    assert later_checkpoint(tmp_path, fingerprint, max_train_steps=3) is None
    assert later_checkpoint(tmp_path, {"rank": 8}, max_train_steps=2) is None
    write_checkpoint(accelerator, tmp_path, 2, fingerprint, total_limit=1)
    # checkpoint-1 is pruned as before; the longer run's checkpoint-3 is not counted and stays.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-3"]


def test_a_prune_killed_while_deleting_leaves_no_checkpoint_that_reads_as_complete(tmp_path, monkeypatch,
                                                                                   killed_while_deleting):
    for step in (1, 2, 3):
        (_checkpoint(tmp_path, f"checkpoint-{step}", {"rank": 4}) / "optimizer.bin").write_bytes(b"state")
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(tmp_path / "checkpoints" / "checkpoint-3", 2)
    monkeypatch.undo()
    # checkpoint-1 was renamed out of the checkpoints' names before its files went: no resume takes it.
    assert [checkpoint_step(path) for path, _ in complete_checkpoints(tmp_path)] == [3, 2]


def test_a_published_folder_is_the_old_one_or_the_new_one(tmp_path):
    final = tmp_path / "best"
    final.mkdir()
    (final / "best.json").write_text("old")
    staging = tmp_path / ".best.tmp"
    staging.mkdir()
    (staging / "best.json").write_text("new")
    publish_folder(staging, final)
    assert (final / "best.json").read_text() == "new" and not staging.exists()
    assert not (tmp_path / ".best.old").exists()
    # Killed between its two renames: no folder, the old one aside, which recovery puts back.
    final.rename(tmp_path / ".best.old")
    recover_folder(final)
    assert (final / "best.json").read_text() == "new" and not (tmp_path / ".best.old").exists()
    recover_folder(final)  # nothing to recover: nothing changes
    assert (final / "best.json").read_text() == "new"
    # Killed after its second rename, before the aside copy was deleted: the new folder stands and is kept.
    (tmp_path / ".best.old").mkdir()
    (tmp_path / ".best.old" / "best.json").write_text("old")
    recover_folder(final)
    assert (final / "best.json").read_text() == "new"


def test_a_discarded_folder_takes_the_copy_an_interrupted_publish_left_aside_with_it(tmp_path):
    # Else a later `recover_folder` would put the discarded folder's old copy back.
    for name, text in (("best", "new"), (".best.old", "old")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "best.json").write_text(text)
    discard_folder(tmp_path / "best")
    recover_folder(tmp_path / "best")
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    (tmp_path / ".best.old").mkdir()  # only the aside copy left (killed between publish's renames)
    discard_folder(tmp_path / "best")
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_logs_are_set_aside_only_when_they_hold_a_file(tmp_path):
    logs = tmp_path / "logs"
    assert set_aside_logs(logs) is None  # none yet
    (logs / "gors").mkdir(parents=True)
    assert set_aside_logs(logs) is None and logs.is_dir()  # an empty folder is no training's
    (tmp_path / "logs.previous-1").mkdir()  # taken
    (logs / "gors" / "events.out.tfevents.1").write_bytes(b"x")
    assert set_aside_logs(logs) == tmp_path / "logs.previous-2"
    assert not logs.exists() and (tmp_path / "logs.previous-2" / "gors" / "events.out.tfevents.1").is_file()


def test_a_garbled_checkpoint_marker_names_its_file_and_the_fix(tmp_path):
    checkpoint = _checkpoint(tmp_path, "checkpoint-2", {"rank": 4})
    (checkpoint / CHECKPOINT_MARKER).write_text("{garbage")
    with pytest.raises(ValueError, match=r"checkpoint-2/checkpoint.json: not valid JSON .*delete .*checkpoint-2 "
                                         r"\(training goes on from the checkpoint before it\)"):
        own_checkpoint(tmp_path, {"rank": 4}, max_train_steps=10)


def test_a_checkpoint_damaged_since_its_save_is_named_with_the_checkpoint_to_go_on_from(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters()))
    first = write_checkpoint(accelerator, tmp_path, 1, {"rank": 4}, total_limit=None)
    second = write_checkpoint(accelerator, tmp_path, 2, {"rank": 4}, total_limit=None)
    files = json.loads((second / CHECKPOINT_MARKER).read_text())["files"]
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= files.keys()
    assert files["optimizer.bin"]["bytes"] == (second / "optimizer.bin").stat().st_size
    check_intact(second)
    rng = (second / "random_states_0.pkl").read_bytes()
    (second / "random_states_0.pkl").write_bytes(bytes(len(rng)))  # accelerate would pass over it without a word
    fix = rf"Delete that folder \(training goes on from {first}\), or restore it from a backup$"
    with pytest.raises(ValueError, match=rf"^{second} is damaged since it was saved: random_states_0.pkl holds "
                                         rf"other bytes than were saved\. {fix}"):
        check_intact(second)
    (second / "random_states_0.pkl").write_bytes(rng)
    optimizer = (second / "optimizer.bin").read_bytes()
    (second / "optimizer.bin").write_bytes(optimizer[:10])
    with pytest.raises(ValueError, match=rf"optimizer.bin holds 10 bytes, {len(optimizer)} were saved\. {fix}"):
        check_intact(second)
    with pytest.raises(ValueError, match=rf"optimizer.bin holds 10 bytes, .*\. Delete that folder and pass "
                                         rf"--resume_from_checkpoint {first}, or restore it from a backup$"):
        check_intact(second, "checkpoint-2")  # named by the flag: deleting it alone would leave the flag naming nothing
    check_intact(second, names=["model.safetensors"])  # what a fresh optimizer reads is whole
    (first / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"model.safetensors is missing\. Delete that folder \(training starts "
                                         r"again from step 0\)"):
        check_intact(first)
    with pytest.raises(ValueError, match=r"model.safetensors is missing\. Delete that folder and train without "
                                         r"--resume_from_checkpoint"):
        check_intact(first, str(first))
    with pytest.raises(ValueError, match=r"model.safetensors is missing\. The next round trains on from it: restore "
                                         r"it from a backup, or run the rounds again in a new --output_dir$"):
        check_intact(first, "continue")
    (first / CHECKPOINT_MARKER).write_text(json.dumps({"fingerprint": {"rank": 4}}))  # saved before files were recorded
    check_intact(first)


def test_a_damaged_checkpoint_names_the_newest_complete_one_before_it(tmp_path):
    """With several checkpoints before a damaged one, the fix names the newest complete one (the one
    training goes on from), not the oldest; an incomplete folder in between is passed over."""
    from gors.checkpoints import file_digests

    for step in (1, 3, 4, 6):
        checkpoint = _checkpoint(tmp_path, f"checkpoint-{step}")
        (checkpoint / "optimizer.bin").write_bytes(b"state")
        if step != 4:  # checkpoint-4 stays incomplete
            (checkpoint / CHECKPOINT_MARKER).write_text(json.dumps({"fingerprint": {"rank": 4},
                                                                    "files": file_digests(checkpoint)}))
    damaged = tmp_path / "checkpoints" / "checkpoint-6"
    (damaged / "optimizer.bin").write_bytes(b"stale")
    newest_before = tmp_path / "checkpoints" / "checkpoint-3"
    with pytest.raises(ValueError, match=rf"Delete that folder \(training goes on from {newest_before}\)"):
        check_intact(damaged)
    with pytest.raises(ValueError, match=rf"pass --resume_from_checkpoint {newest_before}, or restore"):
        check_intact(damaged, "checkpoint-6")


def test_the_micro_batch_of_a_set_aside_checkpoint_counts_up_to_max_train_steps_itself(tmp_path):
    """`restore_own_training` brings back a set-aside checkpoint at `max_train_steps` itself: the micro-batch
    `--auto_train_batch_size` found for it is this training's up to that step included, not past it."""
    from gors.checkpoints import recorded_micro_batch

    found = {"rank": 4, "train_batch_size": 2, "gradient_accumulation_steps": 2}
    aside = tmp_path / "checkpoints.previous-1" / "checkpoint-5"
    aside.mkdir(parents=True)
    (aside / CHECKPOINT_MARKER).write_text(json.dumps({"fingerprint": found}))
    fingerprint = found | {"train_batch_size": 4, "gradient_accumulation_steps": 1}  # an update as one micro-batch
    assert recorded_micro_batch(fingerprint, tmp_path, max_train_steps=5) == 2
    assert recorded_micro_batch(fingerprint, tmp_path, max_train_steps=4) is None  # a longer run's: not this one's
    assert recorded_micro_batch(fingerprint | {"rank": 8}, tmp_path, max_train_steps=5) is None


def test_the_8bit_optimizer_binds_a_checkpoint_and_its_absence_matches_older_ones(tmp_path, monkeypatch):
    """`--use_8bit_adam` keeps another optimizer state: a checkpoint of it is not resumed without it (and the
    reverse), while a checkpoint made before the flag (no key) is one without it."""
    import gors.checkpoints

    monkeypatch.setattr(gors.checkpoints, "model_version", lambda name, revision=None: None)
    config = TrainConfig(output_dir=str(tmp_path), pretrained_model_name_or_path="org/model")
    plain = training_fingerprint(config, [], 1, {})
    eight_bit = training_fingerprint(replace(config, use_8bit_adam=True), [], 1, {})
    assert "use_8bit_adam" not in plain and eight_bit["use_8bit_adam"] is True
    checkpoint = _checkpoint(tmp_path, "checkpoint-2", eight_bit)
    assert check_resumable(checkpoint, eight_bit, max_train_steps=4) == 2
    with pytest.raises(ValueError, match="use_8bit_adam True in the checkpoint, False now"):
        check_resumable(checkpoint, plain, max_train_steps=4)
    assert check_resumable(_checkpoint(tmp_path, "checkpoint-1", plain), plain | {"use_8bit_adam": False},
                           max_train_steps=4) == 1


def test_the_furthest_set_aside_checkpoint_of_this_training_is_brought_back_from_any_folder(tmp_path):
    """Checkpoints of this training set aside twice: the folder with the furthest one comes back, whatever
    the order of the set-aside folders' names."""
    fingerprint = {"rank": 4}
    _checkpoint(tmp_path, "checkpoint-2", fingerprint)
    (tmp_path / "checkpoints").rename(tmp_path / "checkpoints.previous-1")
    _checkpoint(tmp_path, "checkpoint-4", fingerprint)
    _checkpoint(tmp_path, "checkpoint-6", fingerprint)  # past max_train_steps: not this run's
    (tmp_path / "checkpoints").rename(tmp_path / "checkpoints.previous-2")
    assert restore_own_training(tmp_path, fingerprint, max_train_steps=5) == tmp_path / "checkpoints.previous-2"
    assert own_checkpoint(tmp_path, fingerprint, max_train_steps=5).name == "checkpoint-4"


def test_set_aside_checkpoints_come_in_the_order_they_were_set_aside(tmp_path):
    from gors.checkpoints import set_aside_checkpoints

    for number in (10, 2, 1):
        (tmp_path / f"checkpoints.previous-{number}").mkdir()
    assert [p.name for p in set_aside_checkpoints(tmp_path)] == [
        "checkpoints.previous-1", "checkpoints.previous-2", "checkpoints.previous-10"]


def test_a_file_named_like_a_checkpoint_is_no_checkpoint(tmp_path):
    """Only folders are checkpoints: a stray file `checkpoint-<n>` (a download, a `touch`) is passed over by
    'latest', the listing and pruning, not read as a folder."""
    newest = _checkpoint(tmp_path, "checkpoint-2", {"rank": 4})
    (tmp_path / "checkpoints" / "checkpoint-7").write_text("not a folder")
    assert find_checkpoint(tmp_path, "latest") == newest
    assert [path for path, _ in complete_checkpoints(tmp_path)] == [newest]
    prune_checkpoints(newest, 1)
    assert (tmp_path / "checkpoints" / "checkpoint-7").is_file()


def test_the_selection_fingerprint_is_stable_and_covers_paths_rewards_and_image_hashes():
    """Checkpoints record `selection_sha256`: its value for a given selection must not change between gors
    versions (every earlier checkpoint would read as another training's and be set aside), and it changes
    with any row's path, reward or recorded image hash (a re-scored selection is another training)."""
    from gors.checkpoints import selection_fingerprint

    rows = [{"path": "part-00000/00000_000.png", "reward": 0.9, "prompt": "a red cube"},
            {"path": "part-00000/00001_000.png", "reward": 0.5, "image_sha256": "ab" * 32}]
    assert selection_fingerprint(rows) == "92b4541e9bed8118"
    assert selection_fingerprint([rows[0] | {"prompt": "edited"}, rows[1]]) == "92b4541e9bed8118"  # not identity
    for changed in ({"reward": 0.8}, {"path": "part-00000/00002_000.png"}):
        assert selection_fingerprint([rows[0] | changed, rows[1]]) != "92b4541e9bed8118"
    assert selection_fingerprint([rows[0], rows[1] | {"image_sha256": "cd" * 32}]) != "92b4541e9bed8118"
    assert selection_fingerprint(rows[::-1]) != "92b4541e9bed8118"  # the order is the batches'


def test_a_checkpoint_is_bound_to_the_number_of_processes_that_saved_it(tmp_path):
    """Each process keeps its own RNG state and the processes split the batches: a checkpoint of a 2-process
    launch is not resumed by one process."""
    config = TrainConfig(output_dir=str(tmp_path))
    two = training_fingerprint(config, [], 2, {})
    assert two["num_processes"] == 2
    checkpoint = _checkpoint(tmp_path, "checkpoint-2", two)
    with pytest.raises(ValueError, match="num_processes 2 in the checkpoint, 1 now"):
        check_resumable(checkpoint, training_fingerprint(config, [], 1, {}), max_train_steps=4)


def test_a_constant_schedule_after_warmup_lets_a_run_grow(tmp_path):
    """`constant_with_warmup` holds its LR once warmed up: like `constant`, its checkpoints do not record the
    run's length, so a resume with a larger --max_train_steps goes on."""
    config = TrainConfig(output_dir=str(tmp_path), lr_scheduler="constant_with_warmup", lr_warmup_steps=2,
                         max_train_steps=10)
    recorded = training_fingerprint(config, [], 1, {})
    assert "lr_schedule_steps" not in recorded
    checkpoint = _checkpoint(tmp_path, "checkpoint-10", recorded)
    longer = training_fingerprint(replace(config, max_train_steps=20), [], 1, {})
    assert check_resumable(checkpoint, longer, max_train_steps=20) == 10


def test_two_hub_models_at_one_commit_are_still_two_models():
    """Only a local model's files fingerprint makes another path the same model (a folder moved); two Hub ids
    are compared by name even where the recorded commits agree."""
    from gors.checkpoints import fingerprint_differences

    commit = "a" * 40
    recorded = {"pretrained_model_name_or_path": "org/model", "base_model_commit": commit}
    now = {"pretrained_model_name_or_path": "me/mirror", "base_model_commit": commit}
    assert fingerprint_differences(recorded, now) == [
        "pretrained_model_name_or_path 'org/model' in the checkpoint, 'me/mirror' now"]


def test_the_furthest_set_aside_checkpoint_wins_whichever_folder_was_set_aside_last(tmp_path):
    """A training set aside at step 4, rerun shorter (to step 2) and set aside again: the full command then brings
    back the folder with step 4, though the one with step 2 was set aside later."""
    fingerprint = {"rank": 4}
    _checkpoint(tmp_path, "checkpoint-4", fingerprint)
    (tmp_path / "checkpoints").rename(tmp_path / "checkpoints.previous-1")
    _checkpoint(tmp_path, "checkpoint-2", fingerprint)
    (tmp_path / "checkpoints").rename(tmp_path / "checkpoints.previous-2")
    assert restore_own_training(tmp_path, fingerprint, max_train_steps=10) == tmp_path / "checkpoints.previous-1"
    assert own_checkpoint(tmp_path, fingerprint, max_train_steps=10).name == "checkpoint-4"


def test_an_incomplete_folder_does_not_count_towards_the_checkpoint_limit(tmp_path):
    """`checkpoints_total_limit` counts complete checkpoints: an incomplete `checkpoint-<n>` (an older gors's
    torn save) takes no place of one, so the limit still keeps that many to resume from."""
    _checkpoint(tmp_path, "checkpoint-1", {"rank": 4})
    _checkpoint(tmp_path, "checkpoint-2")  # no marker
    newest = _checkpoint(tmp_path, "checkpoint-3", {"rank": 4})
    prune_checkpoints(newest, 2)
    assert [path.name for path, _ in complete_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-1"]


def test_the_limit_prunes_only_after_the_new_checkpoint_is_published(tmp_path, monkeypatch):
    """A kill between the save and its publication (the rename) must leave the older checkpoints: pruning for
    `checkpoints_total_limit` comes after the new folder stands under its name."""
    import gors.checkpoints

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters()))
    write_checkpoint(accelerator, tmp_path, 1, {"rank": 4}, total_limit=1)

    def killed(staging, final):
        raise KeyboardInterrupt

    monkeypatch.setattr(gors.checkpoints, "publish_folder", killed)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(accelerator, tmp_path, 2, {"rank": 4}, total_limit=1)
    monkeypatch.undo()
    assert find_checkpoint(tmp_path, "latest").name == "checkpoint-1"


def test_a_fingerprint_is_computed_as_its_marker_holds_it(tmp_path):
    """A family's settings given as tuples are recorded as JSON lists: the fingerprint a run computes is the one
    its checkpoints' markers hold, so the same training goes on from its own checkpoint."""
    config = TrainConfig(output_dir=str(tmp_path))
    fingerprint = training_fingerprint(config, [], 1, {"unet_target_modules": ("to_q", "to_k")})
    assert fingerprint["unet_target_modules"] == ["to_q", "to_k"]
    _checkpoint(tmp_path, "checkpoint-2", fingerprint)
    assert own_checkpoint(tmp_path, fingerprint, max_train_steps=2).name == "checkpoint-2"


def test_a_local_base_model_spelled_otherwise_is_the_same_setting(tmp_path, monkeypatch):
    """`--pretrained_model_name_or_path models/sd/` and the absolute path of that folder are one setting: a
    resume that types the path otherwise is not refused; another folder is a difference."""
    from gors.checkpoints import fingerprint_differences

    (tmp_path / "models" / "sd").mkdir(parents=True)
    (tmp_path / "models" / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    recorded = {"pretrained_model_name_or_path": "models/sd/"}
    assert fingerprint_differences(recorded, {"pretrained_model_name_or_path": str(tmp_path / "models" / "sd")}) == []
    assert fingerprint_differences(recorded, {"pretrained_model_name_or_path": "models/other"}) == [
        "pretrained_model_name_or_path 'models/sd/' in the checkpoint, 'models/other' now"]
