import contextlib
import hashlib
import json

import datasets
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from gors.core.io import TornLineError, append_jsonl, read_jsonl
from gors.core.store import (
    IMAGE_HASH,
    SampleStore,
    StoreError,
    adopt_later_settings,
    same_image,
    sample_file_name,
    sample_seed,
    selection_identity,
)
from gors.training_data import BatchSchedule, epoch_order


def _record(p, i):
    return {"file_name": sample_file_name(p, i), "prompt": f"prompt {p}", "prompt_index": p, "image_index": i,
            "seed": sample_seed(42, p, i)}


def _fill(store, keys_by_rank):
    for rank, keys in keys_by_rank.items():
        for p, i in keys:
            store.append(rank, Image.new("RGB", (8, 8), (p * 40, i * 40, 0)), _record(p, i))


def test_seed_depends_only_on_prompt_and_image_index():
    seeds = {sample_seed(42, p, i) for p in range(50) for i in range(90)}
    assert len(seeds) == 50 * 90
    assert sample_seed(42, 3, 7) == 42 + 300_000 + 7


def test_records_merge_parts_sorted_and_load_as_imagefolder(tmp_path):
    store = SampleStore(tmp_path / "samples")
    _fill(store, {0: [(0, 0), (1, 0)], 1: [(0, 1), (1, 1)]})
    records = store.records()
    assert [(r["prompt_index"], r["image_index"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert records[1]["path"] == "part-00001/00000_001.png"
    dataset = datasets.load_dataset("imagefolder", data_dir=str(store.root), split="train")
    assert dataset.num_rows == 4
    assert sorted(dataset["seed"]) == sorted(r["seed"] for r in records)


def test_a_record_holds_the_hash_of_its_image_file(tmp_path):
    store = SampleStore(tmp_path / "samples")
    stored = store.append(0, Image.new("RGB", (8, 8), "red"), _record(0, 0))
    [record] = store.records()
    assert record["image_sha256"] == stored["image_sha256"] == \
        hashlib.sha256(store.image_path(record).read_bytes()).hexdigest()
    assert store.open_image(record).getpixel((0, 0)) == (255, 0, 0)


def test_a_batch_is_recorded_in_one_flushed_append_after_its_images(tmp_path, monkeypatch):
    import gors.core.store

    store = SampleStore(tmp_path / "samples")
    appends = []

    def append(path, rows):  # each image is on disk before the one append that records the batch
        appends.append([(row["file_name"], (store.part_dir(1) / row["file_name"]).is_file()) for row in rows])
        append_jsonl(path, rows)

    monkeypatch.setattr(gors.core.store, "append_jsonl", append)
    stored = store.append_batch(1, [(Image.new("RGB", (8, 8), color), _record(0, i)) for i, color in
                                    enumerate(("red", "blue", "green"))])
    assert appends == [[(sample_file_name(0, i), True) for i in range(3)]]
    assert [r["image_sha256"] for r in store.records()] == [r["image_sha256"] for r in stored]
    assert store.open_image(store.records()[1]).getpixel((0, 0)) == (0, 0, 255)


def test_a_file_whose_bytes_differ_from_its_record_is_refused(tmp_path):
    store = SampleStore(tmp_path / "samples")
    store.append(0, Image.new("RGB", (8, 8), "red"), _record(0, 0))
    [record] = store.records()
    Image.new("RGB", (8, 8), "blue").save(store.image_path(record))  # replaced by hand, or generated again
    with pytest.raises(StoreError, match="is not the image this row was made from .*rerun `gors score` and "
                                         "`gors select`"):
        store.open_image(record)
    unhashed = {k: v for k, v in record.items() if k != "image_sha256"}  # a row from before hashes were recorded
    assert store.open_image(unhashed).getpixel((0, 0)) == (0, 0, 255)


def test_selection_identity_adds_the_image_hash_only_where_recorded():
    before = [{"path": "part-00000/00000_000.png", "reward": 0.5}]
    assert selection_identity(before) == [["part-00000/00000_000.png", 0.5]]  # as before gors recorded hashes
    assert selection_identity([before[0] | {"image_sha256": None}]) == selection_identity(before)
    assert selection_identity([before[0] | {"image_sha256": "ab"}]) == [["part-00000/00000_000.png", 0.5, "ab"]]


def test_a_row_without_an_image_hash_is_not_of_a_record_that_has_one():
    # A score or selection row from before gors recorded hashes cannot say it is of an image generated again since
    # (which records one): only rows and records that both lack the hash match each other.
    assert same_image({}, {}) and same_image({IMAGE_HASH: "a"}, {IMAGE_HASH: "a"})
    assert not same_image({}, {IMAGE_HASH: "a"})
    assert not same_image({IMAGE_HASH: "a"}, {})
    assert not same_image({IMAGE_HASH: "a"}, {IMAGE_HASH: "b"})


def test_later_settings_are_adopted_only_where_the_record_lacks_them():
    recorded = {"model": "a", "dtype": "fp16"}
    completed, adopted = adopt_later_settings(recorded, {"model": "b", "dtype": "bf16", "lora": None, "call": {"n": 1}},
                                              ("dtype", "lora", "call", "absent"))
    # A recorded value is never replaced (a change stays a change); an unset adoption is not worth a warning.
    assert completed == {"model": "a", "dtype": "fp16", "lora": None, "call": {"n": 1}}
    assert adopted == ["call"] and recorded == {"model": "a", "dtype": "fp16"}


def test_torn_last_line_is_skipped_and_overwritten(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, [{"a": 1}])
    with open(path, "a") as handle:
        handle.write('{"a": 2, "b"')  # a crash in the middle of an append
    assert list(read_jsonl(path)) == [{"a": 1}]
    append_jsonl(path, [{"a": 3}])
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 3}]


def test_blank_lines_are_skipped(tmp_path):
    # A file edited by hand may hold empty or whitespace-only lines: they hold no record, and are no error.
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\n')
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]
    assert list(read_jsonl(path, whole=True)) == [{"a": 1}, {"a": 2}]


def test_a_whole_file_whose_last_line_lacks_its_newline_is_read_only_if_that_line_is_an_object(tmp_path):
    # A file written whole (e.g. selection.jsonl) may lack only its last line feed; a last line that is JSON but no
    # object (a number, a list, a string) is no record as gors writes them: the file was damaged or cut.
    path = tmp_path / "selection.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert list(read_jsonl(path, whole=True)) == [{"a": 1}, {"a": 2}]
    for last in ("12", "[1, 2]", '"text"', "null"):
        path.write_text('{"a": 1}\n' + last)
        with pytest.raises(TornLineError, match="cut short"):
            list(read_jsonl(path, whole=True))


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"log.jsonl:2"):
        list(read_jsonl(path))


def test_duplicate_record_is_an_error(tmp_path):
    store = SampleStore(tmp_path)
    _fill(store, {0: [(0, 0)], 1: [(0, 0)]})
    with pytest.raises(StoreError, match="recorded twice"):
        store.records()


def test_records_without_image_are_dropped(tmp_path):
    store = SampleStore(tmp_path)
    _fill(store, {0: [(0, 0), (0, 1), (0, 2)]})
    (store.part_dir(0) / sample_file_name(0, 1)).unlink()
    (store.part_dir(0) / sample_file_name(0, 2)).write_bytes(b"")  # a power cut before the disk wrote it
    assert store.drop_records_without_image() == 2
    assert [r["image_index"] for r in store.records()] == [0]


def test_corrupt_image_error_names_file_and_fix(tmp_path):
    store = SampleStore(tmp_path)
    _fill(store, {0: [(0, 0)]})
    (store.part_dir(0) / sample_file_name(0, 0)).write_bytes(b"not a png")
    with pytest.raises(StoreError, match=r"00000_000.png is not a readable image.*gors generate"):
        store.open_image(store.records()[0])


def test_add_columns_keeps_existing_fields(tmp_path):
    store = SampleStore(tmp_path)
    _fill(store, {0: [(0, 0), (0, 1)]})
    store.add_columns({(0, 1): {"reward_b_vqa": 0.75}})
    rows = [json.loads(line) for line in (store.part_dir(0) / "metadata.jsonl").read_text().splitlines()]
    assert rows[1]["reward_b_vqa"] == 0.75 and rows[1]["seed"] == sample_seed(42, 0, 1)
    assert "reward_b_vqa" not in rows[0]


@pytest.mark.parametrize("num_samples,batch,world", [(10, 2, 1), (10, 2, 2), (7, 3, 2)])
def test_batch_schedule_covers_each_epoch_and_processes_are_disjoint(num_samples, batch, world):
    schedules = [BatchSchedule(num_samples, batch, world, rank, seed=1) for rank in range(world)]
    per_epoch = schedules[0].updates_per_epoch  # one micro-batch per update here
    seen = [i for m in range(per_epoch) for s in schedules for i in s.indices(m)]
    assert set(seen) == set(range(num_samples))  # every sample once per epoch (plus wrap-around padding)
    assert len(seen) == per_epoch * batch * world
    first_global = [s.indices(0) for s in schedules]
    assert len({i for b in first_global for i in b}) == batch * world or num_samples < batch * world
    assert schedules[0].indices(per_epoch) != schedules[0].indices(0) or num_samples <= batch
    assert schedules[0].indices(5) == BatchSchedule(num_samples, batch, world, 0, seed=1).indices(5)


@pytest.mark.parametrize("num_samples", [10, 16, 37])
def test_an_update_holds_the_same_samples_however_it_is_split(num_samples):
    # 16 per update as the paper's 2 x 8 GPUs, 2 x 8 accumulated on one, 16 at once, 4 x 2 GPUs x 2 accumulated:
    # the same samples in every update, across epochs whose last update wraps around.
    def update(batch: int, world: int, accumulation: int, step: int) -> list[int]:
        return sorted(i for rank in range(world) for part in range(accumulation)
                      for i in BatchSchedule(num_samples, batch, world, rank, seed=3, accumulation=accumulation)
                      .indices(step * accumulation + part))

    for step in range(3 * -(-num_samples // 16)):  # three epochs
        expected = update(16, 1, 1, step)
        assert len(expected) == 16
        for split in [(2, 8, 1), (2, 1, 8), (4, 2, 2), (1, 4, 4)]:
            assert update(*split, step) == expected, (split, step)


def test_an_epochs_last_update_wraps_to_the_permutations_start_and_parts_are_laid_out_as_accelerates_shards():
    order = epoch_order(5, 0)
    # 5 samples in updates of 2: the third update is the permutation's last sample, then its first (as accelerate's
    # even_batches pads), so no sample is trained more than once more than another in an epoch.
    assert BatchSchedule(5, 2, 1, 0, seed=0).indices(2) == [order[4], order[0]]
    # Accumulated micro-batches on several processes: process r's part a of an update is the update's (a * W + r)-th
    # slice, as accelerate's BatchSamplerShard deals batches out to processes.
    order = epoch_order(16, 0)
    assert BatchSchedule(16, 2, 2, 0, seed=0, accumulation=2).indices(1) == [order[4], order[5]]
    assert BatchSchedule(16, 2, 2, 1, seed=0, accumulation=2).indices(0) == [order[2], order[3]]


def test_a_damaged_cache_file_is_computed_again(tmp_path, caplog):
    from accelerate import Accelerator

    from gors.training_data import sharded_cache

    accelerator = Accelerator(cpu=True)
    computed = []

    def compute(indices):
        computed.extend(indices)
        return {"value": torch.tensor(indices, dtype=torch.float32)[:, None] * 2}

    path = tmp_path / "cache" / "latents.safetensors"
    first = {name: value.clone() for name, value in  # not backed by the file, which the test overwrites
             sharded_cache(path, 5, compute, accelerator, batch_size=2, description="encode").items()}
    assert computed == [0, 1, 2, 3, 4]
    assert torch.equal(sharded_cache(path, 5, compute, accelerator, 2, "encode")["value"], first["value"])
    assert computed == [0, 1, 2, 3, 4]  # reused
    path.write_bytes(path.read_bytes()[:-8])  # cut short: safetensors' header no longer covers the file
    again = sharded_cache(path, 5, compute, accelerator, 2, "encode")
    assert torch.equal(again["value"], first["value"]) and computed == [0, 1, 2, 3, 4] * 2
    assert f"{path} is damaged (Error while deserializing header" in caplog.text
    part = path.with_name("latents.part-00000-of-00001.safetensors")  # a part an older gors left, garbled
    path.unlink()
    part.write_bytes(b"garbage" * 4)
    assert torch.equal(sharded_cache(path, 5, compute, accelerator, 2, "encode")["value"], first["value"])
    assert not part.exists()  # one process writes the cache itself, and removes what parts it finds
    save_file({"value": torch.zeros(3, 1)}, str(path))  # another selection's length
    assert torch.equal(sharded_cache(path, 5, compute, accelerator, 2, "encode")["value"], first["value"])
    assert "its tensors hold [3] rows, 5 expected" in caplog.text
    # Parts a 2-process launch was killed before merging, then run again on one process: merged away too.
    path.unlink()
    stale = [path.with_name(f"latents.part-0000{rank}-of-00002.{suffix}") for rank in (0, 1) for suffix in
             ("safetensors", "tmp")]
    for file in [*stale, path.with_suffix(".tmp")]:  # and a merge killed before its rename
        file.write_bytes(b"left by a killed launch")
    assert torch.equal(sharded_cache(path, 5, compute, accelerator, 2, "encode")["value"], first["value"])
    assert sorted(file.name for file in path.parent.iterdir()) == ["latents.safetensors"]
    # Parts a launch left when killed between its merge and its clean-up: removed when the cache is reused.
    for file in stale:
        file.write_bytes(b"merged already")
    assert torch.equal(sharded_cache(path, 5, compute, accelerator, 2, "encode")["value"], first["value"])
    assert sorted(file.name for file in path.parent.iterdir()) == ["latents.safetensors"]
    assert computed == [0, 1, 2, 3, 4] * 5  # reused, not computed again


def test_a_cache_part_whose_tensors_hold_different_numbers_of_rows_is_damaged(tmp_path):
    """A cache file (a part: no expected length) whose tensors disagree in length is damaged; equal ones are not."""
    from gors.training_data import cache_damage

    path = tmp_path / "latents.part-00000-of-00002.safetensors"
    save_file({"index": torch.arange(3), "value": torch.zeros(2, 1)}, str(path))
    assert cache_damage(path) == "its tensors hold [2, 3] rows, all the same expected"
    save_file({"index": torch.arange(3), "value": torch.zeros(3, 1)}, str(path))
    assert cache_damage(path) is None and cache_damage(path, 3) is None
    assert cache_damage(path, 4) == "its tensors hold [3] rows, 4 expected"


def test_a_cache_batch_that_runs_the_device_out_of_memory_is_halved(tmp_path, caplog):
    from accelerate import Accelerator

    from gors.training_data import sharded_cache

    batches = []

    def compute(indices):  # a device that holds 3 items at a time
        batches.append(len(indices))
        if len(indices) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.60 GiB")
        return {"value": torch.tensor(indices, dtype=torch.float32)[:, None] * 2}

    cache = sharded_cache(tmp_path / "latents.safetensors", 7, compute, Accelerator(cpu=True), 8, "encode latents")
    assert torch.equal(cache["value"][:, 0], torch.arange(7.0) * 2)  # every item once, in order
    assert batches == [7, 4, 2, 2, 2, 1]  # halved until a batch fits, then on at that size
    assert "out of device memory while caching (encode latents) at 4 items: going on at 2" in caplog.text


def _tiny_vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8,
                         sample_size=32).eval()


def test_cached_latents_are_the_vaes_distribution_of_the_official_preprocessing(tmp_path):
    """Each cached row is the VAE's mean and std of its image resized (bilinear), centre-cropped (or, without
    --center_crop, squeezed to the square), scaled to [-1, 1]."""
    import numpy as np
    from accelerate import Accelerator
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    from gors.training_data import cached_latent_distributions

    vae = _tiny_vae()
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((40, 56), (72, 40))]
    selection = [{"path": f"part-00000/{i}.png", "reward": 0.9} for i in range(len(images))]
    for center_crop, crops in ((True, [[0, 6], [12, 0]]), (False, [[0, 0], [0, 0]])):
        cache = cached_latent_distributions(selection, lambda row: images[selection.index(row)], vae,
                                            Accelerator(cpu=True), tmp_path, 32, center_crop, "tiny", batch_size=1)
        with torch.no_grad():
            for i, image in enumerate(images):
                resized = F.resize(image, 32, interpolation=InterpolationMode.BILINEAR)  # the short side to 32
                # Without the centre crop the whole image is kept, squeezed to the square.
                square = F.center_crop(resized, 32) if center_crop else F.resize(resized, [32, 32])
                dist = vae.encode((F.to_tensor(square) * 2 - 1)[None]).latent_dist
                assert torch.allclose(cache["mean"][i], dist.mean[0], atol=1e-5)
                assert torch.allclose(cache["std"][i], dist.std[0], atol=1e-5)
        assert cache["original_size"].tolist() == [[40, 56], [72, 40]]  # (height, width)
        assert cache["crop_top_left"].tolist() == crops


def test_a_training_caches_name_is_kept_and_changes_with_each_input_it_depends_on(tmp_path):
    """The cache names without a known commit stay those of earlier caches, and every input they hash changes them."""
    from gors.training_data import latent_cache_path, text_cache_name

    selection = [{"path": "part-00000/00000_000.png", "reward": 0.9}]
    latents = latent_cache_path(selection, tmp_path, 512, True, "org/model")
    assert latents == tmp_path / "3245b04c0c83f045.safetensors"  # caches on disk stay valid
    others = [latent_cache_path([{**selection[0], "reward": 0.8}], tmp_path, 512, True, "org/model"),
              latent_cache_path(selection, tmp_path, 256, True, "org/model"),
              latent_cache_path(selection, tmp_path, 512, False, "org/model"),
              latent_cache_path(selection, tmp_path, 512, True, "org/other")]
    assert len({latents, *others}) == 5
    tokens = torch.zeros(2, 77, dtype=torch.long)
    prompts = ["a red circle", ""]
    text = text_cache_name("text_encoder", prompts, tokens, "org/model", None, torch.float16)
    assert text == "text_encoder-0404a9b886c44264.safetensors"
    assert text_cache_name("text_encoder", prompts, tokens, "org/model", None, torch.float32) == (
        "text_encoder-b196b0b9ca1ee77b.safetensors")
    others = [text_cache_name("text_encoder_2", prompts, tokens, "org/model", None, torch.float16),
              text_cache_name("text_encoder", prompts[:1], tokens, "org/model", None, torch.float16),
              text_cache_name("text_encoder", prompts, torch.zeros(2, 128, dtype=torch.long), "org/model", None,
                              torch.float16),  # another --max_sequence_length
              text_cache_name("text_encoder", prompts, tokens, "org/other", None, torch.float16),
              text_cache_name("text_encoder", prompts, tokens, "org/model", "v2", torch.float16)]
    assert len({text, *others}) == 6


def test_two_spellings_of_one_local_folder_are_one_setting(tmp_path, monkeypatch):
    from gors.core.store import same_value, settings_changes

    (tmp_path / "model").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    assert same_value("model", f"{tmp_path}/model/") and same_value("./model", "model")
    assert not same_value("model", "other") and not same_value("org/model", "org/model/")  # Hub ids: as text
    assert same_value({"reward": {"model_name_or_path": "model/"}, "k": [1, "model"]},
                      {"reward": {"model_name_or_path": "model"}, "k": [1, "./model"]})
    assert not same_value({"a": 1}, {"a": 1, "b": None}) and not same_value([1], [1, 2]) and not same_value("", ".")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert same_value("~/model", f"{tmp_path}/model")  # a path typed with ~, recorded as loaded (expanded)
    assert settings_changes({"model": "model", "seed": 1}, {"model": "model/", "seed": 2}) == ["seed: 1 -> 2"]
    assert settings_changes({"seed": 1, "dtype": "float16"}, {"seed": 1}) == ["dtype: \"float16\" -> null"]


def test_a_score_folder_keeps_its_settings_when_a_model_path_is_spelled_otherwise(tmp_path, monkeypatch):
    from gors.core.distributed import make_accelerator
    from gors.core.scoring import SETTINGS_FILE, check_settings, open_score_folder

    (tmp_path / "blip").mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"reward": "b_vqa", "model_name_or_path": "blip"}))
    assert check_settings(tmp_path, {"reward": "b_vqa", "model_name_or_path": f"{tmp_path}/blip/"}, scored=True) is False
    with pytest.raises(StoreError, match="holds scores made with"):
        check_settings(tmp_path, {"reward": "b_vqa", "model_name_or_path": "other"}, scored=True)
    # Opening the scored folder with the other spelling keeps the record as it is.
    recorded = (tmp_path / SETTINGS_FILE).read_text()
    append_jsonl(tmp_path / "part-00000.jsonl", [{"prompt_index": 0, "image_index": 0, "prompt": "p", "reward": 0.5}])
    open_score_folder(tmp_path, [{"prompt_index": 0, "image_index": 0, "prompt": "p", "path": "p.png"}],
                      make_accelerator(), {"reward": "b_vqa", "model_name_or_path": f"{tmp_path}/blip/"})
    assert (tmp_path / SETTINGS_FILE).read_text() == recorded


def test_a_reward_specs_scores_folder_and_column_keep_its_dots_and_lose_its_outer_separators(tmp_path):
    """A reward spec's file-name-safe key: a module path keeps its dots, other characters become one `_`,
    none at either end; the scores folder and the store column are named by it."""
    from gors.core.run_folder import reward_column, reward_key, scores_dir

    assert reward_key("my.module:MyReward") == "my.module_MyReward"
    assert reward_key("b_vqa") == "b_vqa" and reward_key("clip-score") == "clip-score"
    assert reward_key(":hub:org/name ") == "hub_org_name"
    assert reward_column("my.module:MyReward") == "reward_my.module_MyReward"
    assert scores_dir(tmp_path, "/abs/reward.py:R") == tmp_path / "scores" / "abs_reward.py_R"


class _ThreadProcess:
    """One of `world` processes of a launch, played by a thread: the barrier stands in for the process group
    (an error on one thread breaks it for all, as a failed process ends a launch)."""

    def __init__(self, index: int, world: int, barrier) -> None:
        from types import SimpleNamespace

        self.process_index, self.num_processes, self.barrier = index, world, barrier
        self.is_main_process = index == 0
        self.state = SimpleNamespace(num_processes=1)  # each process reads the folder itself: no broadcast here

    def wait_for_everyone(self) -> None:
        self.barrier.wait()

    @contextlib.contextmanager
    def split_between_processes(self, items):
        share, extra = divmod(len(items), self.num_processes)  # accelerate's contiguous split
        start = self.process_index * share + min(self.process_index, extra)
        yield items[start:start + share + (self.process_index < extra)]


def _sharded_launch(path, num_items: int, world: int, compute) -> list:
    """`sharded_cache` run as `world` processes at once; each process's result, or the error it raised."""
    import threading

    from gors.training_data import sharded_cache

    barrier = threading.Barrier(world, timeout=60)
    results: list = [None] * world

    def process(index: int) -> None:
        try:
            results[index] = sharded_cache(path, num_items, compute, _ThreadProcess(index, world, barrier), 2, "encode")
        except Exception as err:  # noqa: BLE001 - handed to the test, which names what it expects
            results[index] = err
            barrier.abort()

    threads = [threading.Thread(target=process, args=(index,)) for index in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _doubled(indices):
    return {"value": torch.tensor(indices, dtype=torch.float32)[:, None] * 2}


def test_several_processes_merge_their_shares_in_item_order_even_with_empty_shares(tmp_path):
    """Under 3 processes, 5 items merge in order; 2 items leave one process an empty part, which the merge skips."""
    for num_items in (5, 2):
        path = tmp_path / f"{num_items}" / "latents.safetensors"
        for result in _sharded_launch(path, num_items, 3, _doubled):
            assert torch.equal(result["value"][:, 0], torch.arange(num_items) * 2.0)
        assert sorted(file.name for file in path.parent.iterdir()) == ["latents.safetensors"]


def test_a_garbled_part_of_a_killed_launch_is_computed_again(tmp_path):
    """A process's part that a killed launch left unreadable is computed again, not merged."""
    path = tmp_path / "latents.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name("latents.part-00001-of-00003.safetensors").write_bytes(b"garbage" * 4)
    for result in _sharded_launch(path, 5, 3, _doubled):
        assert torch.equal(result["value"][:, 0], torch.arange(5) * 2.0)


def test_what_a_killed_launch_at_another_process_count_left_is_not_merged_and_removed(tmp_path):
    """A launch of 2 processes killed in its merge left a part and the merge's temporary file; a launch of 3
    merges its own parts only, and nothing the killed one left stays (its merge's file is replaced by the new one's)."""
    path = tmp_path / "latents.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_bytes(b"half a merge")
    save_file({"index": torch.tensor([0, 1, 2]), "value": torch.full((3, 1), -1.0)},
              str(path.with_name("latents.part-00000-of-00002.safetensors")))
    for result in _sharded_launch(path, 5, 3, _doubled):
        assert torch.equal(result["value"][:, 0], torch.arange(5) * 2.0)
    assert sorted(file.name for file in path.parent.iterdir()) == ["latents.safetensors"]


def test_parts_that_do_not_cover_the_items_in_order_are_refused(tmp_path):
    """A readable part holding other items (another launch's) stops the merge with an error, not a shuffled cache."""
    path = tmp_path / "latents.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"index": torch.tensor([3, 4]), "value": torch.zeros(2, 1)},
              str(path.with_name("latents.part-00001-of-00003.safetensors")))
    results = _sharded_launch(path, 5, 3, _doubled)
    assert isinstance(results[0], RuntimeError) and "not items 0 to 4 in order" in str(results[0])
    assert not path.exists()
