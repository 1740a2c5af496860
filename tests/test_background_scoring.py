"""`gors run --overlap_scoring`: scoring each batch while the next one generates, on tiny models.

The overlapped path must give the rows `gors score` gives after generation, stop generation when
the reward fails, and leave a resumable run folder after a crash.
"""

import json
import logging
import shutil

import pytest
import torch
from PIL import Image

import gors.core.store
import gors.score
import rewards.combined
from gors.config import RunConfig
from gors.core.background_scoring import BackgroundScorer
from gors.core.distributed import make_accelerator
from gors.core.run_folder import samples_dir, scores_dir
from gors.core.scoring import load_scores
from gors.core.store import SampleStore
from gors.generate import generate
from gors.run import run
from gors.score import score, scoring_while_generating
from gors.timings import read_timings


class Interrupt(RuntimeError):
    pass


def _fail_on_call(monkeypatch, owner, name, call, message):
    """Make `owner.name` raise `Interrupt(message)` on call number `call` (only that one)."""
    original = getattr(owner, name)
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise Interrupt(message)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def _overlapped(config):
    with scoring_while_generating(config, make_accelerator()) as sink:
        generate(config, sink=sink)
    return load_scores(config.output_dir, config.reward)


def _sequential(config):
    generate(config)
    return score(config)


def _count_reward_builds(monkeypatch):
    built = []
    original = rewards.combined.build_reward

    def counting(*args, **kwargs):
        built.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr("gors.score.build_reward", counting)
    return built


@pytest.mark.parametrize("generation_batch_size, reward_batch_size", [(2, 2), (4, 3)])
def test_overlapped_scores_equal_scoring_after_generation(make_run_config, tmp_path, generation_batch_size,
                                                          reward_batch_size, monkeypatch):
    sizes = dict(generation_batch_size=generation_batch_size, reward_batch_size=reward_batch_size)
    expected = _sequential(make_run_config(output_dir=str(tmp_path / "sequential"), **sizes))
    built = _count_reward_builds(monkeypatch)
    config = make_run_config(**sizes)
    overlapped = _overlapped(config)
    assert len(built) == 1
    assert overlapped == expected  # every row: reward, B-VQA's questions and probabilities, paths
    # The score stage after it finds every sample scored and builds no reward.
    assert score(config) == expected
    assert len(built) == 1


def test_a_reward_that_cannot_be_built_fails_before_any_image(make_run_config):
    config = make_run_config(reward_model_name_or_path="/nonexistent/blip")
    with pytest.raises(Exception, match="nonexistent"):
        _overlapped(config)
    assert SampleStore(samples_dir(config.output_dir)).records() == []


def test_a_reward_failing_mid_run_stops_generation_and_keeps_finished_work(make_run_config, monkeypatch):
    from rewards.b_vqa import BVQAReward

    config = make_run_config()  # 6 images in batches of 2, scored in batches of 2
    _fail_on_call(monkeypatch, BVQAReward, "_score", 2, "the reward broke")
    with pytest.raises(RuntimeError, match="scoring overlapped with generation failed: the reward broke"):
        _overlapped(config)
    # Generation stopped at the next batch it handed over, or at the end if it was ahead (timing);
    # every image it wrote is complete, and the first batch's rows are kept.
    store = SampleStore(samples_dir(config.output_dir))
    assert len(store.records()) >= 2
    assert len(load_scores(config.output_dir, "b_vqa")) == 2

    monkeypatch.undo()
    _overlapped(config)  # the rerun generates what is missing and scores it meanwhile...
    assert len(store.records()) == 6
    assert len(score(config)) == 6  # ... and the score stage scores the images the failure left unscored


def test_a_crash_in_generation_stops_at_once_and_the_rerun_completes(make_run_config, tmp_path, monkeypatch):
    config = make_run_config()
    _fail_on_call(monkeypatch, gors.core.store, "atomic_save_image", 4, "killed")  # the second batch's second image
    with pytest.raises(Interrupt, match="killed"):  # generation's error, not one of the scorer's
        _overlapped(config)
    # The first batch (2 images) is in the store and was handed over: scored if the worker had taken it,
    # dropped from the queue if not (the score stage scores it on the rerun). The second is not recorded.
    assert len(SampleStore(samples_dir(config.output_dir)).records()) == 2
    assert len(load_scores(config.output_dir, "b_vqa")) in (0, 2)
    monkeypatch.undo()
    _overlapped(config)
    resumed = score(config)
    # The same store scored afresh after generation: the same rows (up to the reward's float noise
    # between batch compositions).
    fresh = make_run_config(output_dir=str(tmp_path / "fresh"))
    shutil.copytree(samples_dir(config.output_dir), samples_dir(fresh.output_dir))
    expected = score(fresh)
    assert resumed.keys() == expected.keys()
    for key, row in expected.items():
        assert resumed[key]["details"]["questions"] == row["details"]["questions"]
        assert resumed[key]["reward"] == pytest.approx(row["reward"], rel=1e-4, abs=1e-6)


def test_a_sample_generated_again_while_scoring_overlaps_is_scored_again(make_run_config, monkeypatch, caplog):
    config = make_run_config()
    first = _overlapped(config)
    store = SampleStore(samples_dir(config.output_dir))
    lost = next(r for r in store.records() if (r["prompt_index"], r["image_index"]) == (2, 1))
    store.image_path(lost).unlink()
    original = SampleStore.append_batch

    def black(self, rank, items):  # the image made again differs from the lost one
        return original(self, rank, [(Image.new("RGB", image.size, "black"), record) for image, record in items])

    monkeypatch.setattr(SampleStore, "append_batch", black)
    again = _overlapped(config)
    monkeypatch.undo()
    [new] = [r for r in store.records() if (r["prompt_index"], r["image_index"]) == (2, 1)]
    assert again[(2, 1)]["image_sha256"] == new["image_sha256"] != first[(2, 1)]["image_sha256"]
    assert {k: v for k, v in again.items() if k != (2, 1)} == {k: v for k, v in first.items() if k != (2, 1)}
    part = scores_dir(config.output_dir, "b_vqa") / "part-00000.jsonl"
    assert len(part.read_text().splitlines()) == 7  # the stale row stays until the score stage opens the folder
    with caplog.at_level(logging.WARNING):
        assert score(config) == again  # nothing left to score
    assert "held 1 scores not of the samples' current image files" in caplog.text
    assert len(part.read_text().splitlines()) == 6


def test_an_image_generated_again_with_the_same_pixels_is_not_scored_again_while_generating(make_run_config):
    """Overlapped scoring skips a sample generated again whose image file is bit-identical to the one it scored."""
    config = make_run_config(generation_batch_size=1)  # batches alike: the image made again has the same bytes
    _overlapped(config)
    store = SampleStore(samples_dir(config.output_dir))
    store.image_path(store.records()[0]).unlink()
    _overlapped(config)
    assert len(store.records()) == 6
    part = scores_dir(config.output_dir, "b_vqa") / "part-00000.jsonl"
    assert len(part.read_text().splitlines()) == 6  # no second row of the same image


class _RecordingScorer:
    """A stand-in for `BackgroundScorer` that records how it was made and which way it was stopped."""

    made: list[dict] = []

    def __init__(self, *args, **kwargs):
        self.made.append(kwargs)
        self.stopped = kwargs["stops"] = []

    def close(self):
        self.stopped.append("close")

    def abandon(self):
        self.stopped.append("abandon")


def _recording_scorers(monkeypatch, tmp_path):
    """The kwargs of each scorer `scoring_while_generating` makes, and a run config of three prompts with metadata rows."""
    prompts = tmp_path / "rows.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"a cat number {i}", "tag": f"t{i}"}) + "\n" for i in range(3)))
    monkeypatch.setattr(gors.score, "BackgroundScorer", _RecordingScorer)
    monkeypatch.setattr(_RecordingScorer, "made", [])
    return _RecordingScorer.made, RunConfig(output_dir=str(tmp_path / "run"), train_prompts=str(prompts),
                                            max_prompts=2, reward="b_vqa")


def test_overlapped_scoring_hands_the_scorer_the_metadata_rows_of_the_prompts(tmp_path, monkeypatch):
    """scoring_while_generating gives its scorer each prompt's metadata row, as the score stage gives the reward."""
    made, config = _recording_scorers(monkeypatch, tmp_path)
    with scoring_while_generating(config, make_accelerator()):
        pass
    assert [[row["tag"] for row in kwargs["prompt_metadata"]] for kwargs in made] == [["t0", "t1"]]
    assert made[0]["stops"] == ["close"]


def test_a_generation_error_abandons_the_overlapped_scorer_rather_than_finishing_its_queue(tmp_path, monkeypatch):
    """When generation fails, the scorer's queue is dropped (abandon) and generation's error raised, nothing scored on."""
    made, config = _recording_scorers(monkeypatch, tmp_path)
    with pytest.raises(Interrupt, match="generation failed"):
        with scoring_while_generating(config, make_accelerator()):
            raise Interrupt("generation failed")
    assert made[0]["stops"] == ["abandon"]


def test_done_must_be_the_rows_not_a_set_of_keys(tmp_path):
    with pytest.raises(TypeError, match="not a set of keys"):
        BackgroundScorer(tmp_path, lambda: None, 2, 0, "cpu", done={(0, 0)})


def test_a_plain_cuda_device_is_given_the_current_gpus_index_for_the_worker_thread(tmp_path, monkeypatch):
    # accelerate names a single process's GPU "cuda"; the worker's torch.cuda.set_device refused it
    # (found on an H200: `gors run --overlap_scoring` failed at its first batch).
    monkeypatch.setattr("torch.cuda.current_device", lambda: 3)
    assert BackgroundScorer(tmp_path, lambda: None, 2, 0, "cuda").device == torch.device("cuda", 3)
    assert BackgroundScorer(tmp_path, lambda: None, 2, 0, "cuda:1").device == torch.device("cuda", 1)


def test_gors_run_with_overlap_times_one_stage_and_trains_on_the_same_scores(make_run_config, tmp_path):
    sequential = make_run_config(output_dir=str(tmp_path / "sequential"))
    run(sequential)
    config = make_run_config(overlap_scoring=True)
    run(config)
    assert load_scores(config.output_dir, "b_vqa") == load_scores(sequential.output_dir, "b_vqa")
    stages = read_timings(config.output_dir)["stages"]
    assert set(stages) == {"generate+score", "select", "train"}  # the score stage found nothing left
    assert stages["generate+score"]["work"] == 6
    assert stages["generate+score"]["settings"]["overlap_scoring"] is True
    assert (scores_dir(config.output_dir, "b_vqa") / "settings.json").is_file()


def test_the_workers_error_keeps_its_kind_so_an_expected_one_stays_one_line(tmp_path):
    from types import SimpleNamespace

    from PIL import Image

    from gors.core.background_scoring import BackgroundScorer
    from rewards.base import RewardError

    def broken(images, prompts, metadata=None):
        raise RewardError("Big returned 1.5 for image 0, outside [0.0, 1.0]")

    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=broken), 1, 0, "cpu")
    scorer.open()
    scorer.add([{"prompt_index": 0, "image_index": 0, "prompt": "p", "path": "0.png"}], [Image.new("RGB", (8, 8))])
    with pytest.raises(RewardError, match=r"overlapped with generation failed: Big returned 1.5 .* rerun"):
        scorer.close()


def test_a_disk_error_of_the_worker_is_still_a_one_line_disk_message(tmp_path, monkeypatch):
    import errno
    from types import SimpleNamespace

    from PIL import Image

    import gors.core.scoring
    from gors.cli import _disk_problem
    from gors.core.background_scoring import BackgroundScorer

    def over_quota(path, rows):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(path))

    monkeypatch.setattr(gors.core.scoring, "append_jsonl", over_quota)
    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=lambda images, prompts, metadata=None:
                                                                SimpleNamespace(scores=[0.5], details=[{}])), 1, 0, "cpu")
    scorer.open()
    scorer.add([{"prompt_index": 0, "image_index": 0, "prompt": "p", "path": "0.png"}], [Image.new("RGB", (8, 8))])
    with pytest.raises(OSError) as raised:
        scorer.close()
    assert _disk_problem(raised.value).startswith(f"disk quota exceeded writing {scorer.out_file}")


def test_a_worker_that_cannot_start_stops_generation_rather_than_blocking_it(tmp_path):
    from types import SimpleNamespace

    from PIL import Image

    from gors.core.background_scoring import BackgroundScorer

    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=None), 1, 0, "cpu", max_pending=1)
    scorer.device = torch.device("cuda", 0)  # this machine has no GPU: the thread's set-up fails
    scorer.open()
    batch = ([{"prompt_index": 0, "image_index": 0, "prompt": "p", "path": "0.png"}], [Image.new("RGB", (8, 8))])
    with pytest.raises(Exception, match="scoring overlapped with generation failed"):
        for _ in range(5):  # the queue holds one: without the error recorded the third add would wait forever
            scorer.add(*batch)
            scorer._thread.join(10)


def test_abandoning_after_an_interrupt_logs_the_workers_error_of_any_kind(tmp_path, caplog):
    from types import SimpleNamespace

    from PIL import Image

    from gors.core.background_scoring import BackgroundScorer

    def broken(images, prompts, metadata=None):
        raise ValueError("no colour in the prompt")

    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=broken), 1, 0, "cpu")
    scorer.open()
    scorer.add([{"prompt_index": 0, "image_index": 0, "prompt": "p", "path": "0.png"}], [Image.new("RGB", (8, 8))])
    scorer._thread.join(10)
    scorer.abandon()  # as after Ctrl-C: the interrupt stays the error raised
    assert "scoring overlapped with generation failed: no colour in the prompt" in caplog.text


def test_an_interrupted_generation_writes_its_batch_without_waiting_for_a_full_scorer(tmp_path):
    import threading
    from types import SimpleNamespace

    from gors.core.distributed import reset_process_state
    from gors.core.sampling import SamplingProtocol, generate_samples

    class FullScorer:  # a reward slower than generation: `add` waits for room until told to stop
        model_commits: dict = {}

        def __init__(self) -> None:
            self.stopped, self.added = threading.Event(), []

        def open(self) -> None:
            pass

        def add(self, records, images) -> None:
            self.added.append(len(records))
            assert self.stopped.wait(10), "generation's interrupt waited on the scorer"

        def stop(self) -> None:
            self.stopped.set()

    def pipeline(**kwargs):
        calls.append(kwargs["prompt"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second batch denoises
        return SimpleNamespace(images=[Image.new("RGB", (8, 8), "red")] * len(kwargs["prompt"]))

    calls: list = []
    sink, store = FullScorer(), SampleStore(tmp_path / "samples")
    protocol = SamplingProtocol(images_per_prompt=2, num_inference_steps=2, guidance_scale=7.5, resolution=8,
                                batch_size=2)
    try:
        with pytest.raises(KeyboardInterrupt):
            generate_samples(store, ["a red circle", "a blue square"], protocol, lambda: pipeline, make_accelerator(),
                             settings={"model": "/local/pipeline"}, sink=sink)
    finally:
        reset_process_state()
    assert sink.stopped.is_set() and sink.added == [2]
    assert sorted((r["prompt_index"], r["image_index"]) for r in store.records()) == [(0, 0), (0, 1)]  # written


def test_a_stopped_scorer_takes_no_more_batches_and_a_waiting_add_returns(tmp_path):
    import threading
    from types import SimpleNamespace

    release = threading.Event()

    def slow(images, prompts, metadata=None):  # the reward holds its first batch until released
        assert release.wait(10)
        return SimpleNamespace(scores=[0.5] * len(images), details=[{}] * len(images))

    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=slow), 1, 0, "cpu", max_pending=1)
    scorer.open()
    batch = lambda i: ([{"prompt_index": i, "image_index": 0, "prompt": "p", "path": f"{i}.png"}],  # noqa: E731
                       [Image.new("RGB", (8, 8))])
    scorer.add(*batch(0))  # being scored
    scorer.add(*batch(1))  # waits in the queue: it is full now
    waiting = threading.Thread(target=scorer.add, args=batch(2))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # no room
    scorer.stop()
    waiting.join(5)
    assert not waiting.is_alive()  # returned without queueing
    scorer.add(*batch(3))  # and later batches are left to the score stage at once
    release.set()
    scorer.abandon()


def test_a_reward_batch_that_does_not_fit_beside_generation_is_halved_and_one_that_cannot_is_one_line(
        make_run_config, monkeypatch, caplog):
    import torch

    from gors.core.memory import DeviceMemoryError
    from rewards.b_vqa import BVQAReward

    config = make_run_config(overlap_scoring=True)  # 6 images in batches of 2, scored in batches of 2
    original = BVQAReward._score

    def fits_one(self, images, *args, **kwargs):
        if len(images) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return original(self, images, *args, **kwargs)

    monkeypatch.setattr(BVQAReward, "_score", fits_one)
    with caplog.at_level(logging.WARNING, logger="gors.core.memory"):
        scores = _overlapped(config)
    assert len(scores) == 6
    assert "scoring at 2 images per reward call: going on at 1 (pass --reward_batch_size 1 to start there)" in caplog.text

    def never_fits(self, images, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(BVQAReward, "_score", never_fits)
    with pytest.raises(DeviceMemoryError) as err:
        _overlapped(make_run_config(overlap_scoring=True, output_dir=config.output_dir + "-2"))
    assert str(err.value).startswith(
        "scoring overlapped with generation failed: out of device memory while scoring one at a time: drop "
        "--overlap_scoring (the pipeline and the reward share the device), or run the same command again on a device "
        "with more memory or with its other processes stopped. What was finished is kept (torch: CUDA out of memory. "
        "Tried to allocate 1.00 GiB)")
    assert "\n" not in str(err.value)


def test_an_image_that_does_not_fit_beside_a_scorer_names_the_overlap_too(make_run_config, monkeypatch):
    import torch

    import gors.core.sampling
    from gors.core.memory import DeviceMemoryError

    def out_of_memory(seeds):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(gors.core.sampling, "cpu_generators", out_of_memory)
    with pytest.raises(DeviceMemoryError, match=r"^out of device memory while generating 32 px images one at a time: "
                                                r"drop --overlap_scoring \(the pipeline and the reward share the device\), "
                                                r"or run the same command again on a device with more memory .*; or "
                                                r"generate in half precision"):
        _overlapped(make_run_config(overlap_scoring=True))


def _one(i: int):
    return [{"prompt_index": i, "image_index": 0, "prompt": "p", "path": f"{i}.png"}], [Image.new("RGB", (8, 8))]


def test_abandoning_scores_nothing_still_queued_but_finishes_the_batch_being_scored(tmp_path):
    # After generation failed, the queued batches are left to the score stage of the rerun: not scored on the way out.
    import json
    import threading
    from types import SimpleNamespace

    release = threading.Event()

    def slow(images, prompts, metadata=None):
        assert release.wait(10)
        return SimpleNamespace(scores=[0.5] * len(images), details=[{}] * len(images))

    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=slow), 1, 0, "cpu", max_pending=1)
    scorer.open()
    scorer.add(*_one(0))  # being scored
    scorer.add(*_one(1))  # returns once batch 0 was taken: batch 1 waits in the queue
    close = scorer.close

    def release_then_close() -> None:  # batch 0's scoring ends only once abandon emptied the queue
        release.set()
        close()

    scorer.close = release_then_close
    scorer.abandon()
    rows = [json.loads(line) for line in scorer.out_file.read_text().splitlines()]
    assert [row["prompt_index"] for row in rows] == [0]


def test_the_workers_error_raised_by_add_is_not_raised_again_by_close(tmp_path):
    # Generation stopped at `add`'s error; the `close` on its way out must not raise the same failure a second time.
    from types import SimpleNamespace

    def broken(images, prompts, metadata=None):
        raise ValueError("no colour in the prompt")

    scorer = BackgroundScorer(tmp_path, lambda: SimpleNamespace(score=broken), 1, 0, "cpu")
    scorer.open()
    scorer.add(*_one(0))
    scorer._thread.join(10)
    with pytest.raises(ValueError, match="overlapped with generation failed"):
        scorer.add(*_one(1))
    scorer.close()


def test_opening_twice_builds_one_reward_and_one_worker(tmp_path):
    from types import SimpleNamespace

    built = []

    def make():
        built.append(1)
        return SimpleNamespace(score=lambda images, prompts, metadata=None:
                               SimpleNamespace(scores=[0.5] * len(images), details=[{}] * len(images)))

    scorer = BackgroundScorer(tmp_path, make, 1, 0, "cpu")
    scorer.open()
    thread = scorer._thread
    scorer.open()
    assert built == [1] and scorer._thread is thread
    scorer.add(*_one(0))
    scorer.close()
    assert len(scorer.out_file.read_text().splitlines()) == 1
