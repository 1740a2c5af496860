"""The sample store: generated images and their metadata, as a Hugging Face image folder.

Layout (every process writes only its own part, so no two processes touch one file)::

    samples/
      prompts.json                 the prompt set the store was generated from
      settings.json                what made its images: model, LoRA, dtype, scheduler, protocol, gors version
      models.json                  the version of each model that made them (Hub commit or local fingerprint)
      part-00000/metadata.jsonl    one record per image: file_name, prompt, prompt_index, image_index, seed,
                                   image_sha256, ...
      part-00000/00000_000.png
      part-00001/...

`datasets.load_dataset("imagefolder", data_dir="samples")` reads it. A sample is identified by
(prompt_index, image_index); which part holds it depends only on the run that made it, so a
rerun with another number of processes skips what exists and adds what is missing. A rerun with
other settings is refused (`settings_changes`), so one store never holds images of two models or
two protocols.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from PIL import Image, UnidentifiedImageError

from gors.core.fingerprints import is_local_fingerprint
from gors.core.hub import model_version
from gors.core.io import (
    append_jsonl,
    atomic_save_image,
    atomic_write_json,
    atomic_write_jsonl,
    filter_jsonl,
    read_json,
    read_jsonl,
    repair_jsonl,
)

logger = logging.getLogger(__name__)

SampleKey = tuple[int, int]
METADATA = "metadata.jsonl"
SETTINGS = "settings.json"
MODELS = "models.json"  # the version of each model that made a folder's images or scores (Hub commit, local fingerprint)
# A record's hash of its image file's bytes; stores made before gors recorded it lack the field.
IMAGE_HASH = "image_sha256"


def sample_key(record: dict[str, Any]) -> SampleKey:
    """What identifies a sample across runs and process layouts: (prompt index, image index)."""
    return int(record["prompt_index"]), int(record["image_index"])


def sample_file_name(prompt_index: int, image_index: int) -> str:
    """The image file of a sample within its part folder, e.g. `00012_003.png` (sorts by prompt, then image)."""
    return f"{prompt_index:05d}_{image_index:03d}.png"


# Seeds between prompt p's first image and prompt p + 1's (`sample_seed`).
SAMPLE_SEED_STRIDE = 100_000


def sample_seed(base_seed: int, prompt_index: int, image_index: int) -> int:
    """Seed of one image: a function of (prompt index, image index) only, never of the process layout.

    Image i of prompt p uses `base_seed + 100_000 * p + i`, so with k < 100 000 images per prompt
    every image has its own seed, and growing k later keeps the seeds of the existing images.
    """
    return base_seed + SAMPLE_SEED_STRIDE * prompt_index + image_index


class StoreError(RuntimeError):
    """A sample store that cannot be used as it is; the message says how to fix it."""


def read_image(path: Path, to_rgb: Callable[[Image.Image], Image.Image] | None = None) -> tuple[Image.Image, bytes]:
    """The image file at `path` as RGB (`to_rgb` of it where given, else PIL's ``convert("RGB")``), and its bytes
    (whose sha256 a record holds); OSError or UnidentifiedImageError when it does not read as an image."""
    data = path.read_bytes()
    with Image.open(io.BytesIO(data)) as image:
        return (image.convert("RGB") if to_rgb is None else to_rgb(image)), data


class SampleStore:
    """An append-only image folder of generated samples (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def part_dir(self, rank: int) -> Path:
        """The folder process `rank` writes its images and metadata into (no two processes share one)."""
        return self.root / f"part-{rank:05d}"

    def _metadata_files(self) -> list[Path]:
        return sorted(self.root.glob(f"part-*/{METADATA}"))

    def records(self) -> list[dict[str, Any]]:
        """All finished records, sorted by (prompt_index, image_index), each with `path` relative to the root."""
        records: dict[SampleKey, dict[str, Any]] = {}
        for metadata in self._metadata_files():
            for record in sample_rows(metadata, needs=("file_name", "prompt")):
                key = sample_key(record)
                record["path"] = f"{metadata.parent.name}/{record['file_name']}"
                if key in records:
                    raise StoreError(
                        f"Sample {key} is recorded twice ({records[key]['path']} and {record['path']}): remove a "
                        "part folder copied beside the others, else one of the two lines from its metadata.jsonl."
                    )
                records[key] = record
        return [records[key] for key in sorted(records)]

    def image_path(self, record: dict[str, Any]) -> Path:
        """The image file of a metadata record (its `path` is relative to the store's root)."""
        return self.root / record["path"]

    def open_image(self, record: dict[str, Any]) -> Image.Image:
        """Load a sample as RGB, with an error that names the file and how to regenerate it.

        `record` is a store record or a row made from one (a selection row); when it holds the image's
        hash, a file whose bytes differ (replaced, damaged, or generated again since the row was
        made) is refused rather than read as the image the row describes.
        """
        path = self.image_path(record)
        regenerate = ("rerun `gors generate` with the same --output_dir: only the missing images are generated again, "
                      "and finished work is kept.")
        try:
            rgb, data = read_image(path)
        except (OSError, UnidentifiedImageError) as err:
            raise StoreError(f"{path} is not a readable image ({err}). Delete it and {regenerate}") from err
        expected = record.get(IMAGE_HASH)
        if expected is not None and hashlib.sha256(data).hexdigest() != expected:
            raise StoreError(
                f"{path} is not the image this row was made from (its sha256 differs from the recorded "
                f"{expected[:12]}...): the file was replaced, damaged or generated again since. If it was generated "
                f"again, rerun `gors score` and `gors select` (or `gors run`) on the run folder; otherwise delete it and {regenerate}"
            )
        return rgb

    def relative_path(self, rank: int, record: dict[str, Any]) -> str:
        """Where process `rank` keeps a record's image, relative to the root: a record's `path`."""
        return f"{self.part_dir(rank).name}/{record['file_name']}"

    def append(self, rank: int, image: Image.Image, record: dict[str, Any]) -> dict[str, Any]:
        """Write one image, then its metadata line (`append_batch` of one)."""
        return self.append_batch(rank, [(image, record)])[0]

    def append_batch(self, rank: int, items: Sequence[tuple[Image.Image, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Write the images, then their metadata lines in one flushed append: a record exists only once its
        image does, and a batch costs one flush to disk, not one per image (a kill between the two leaves
        images without records, which are generated again).

        Returns the records as stored, with `image_sha256` (each file's hash): score rows copy it, so a
        score is known to be of this very file, not of an image generated before under the same key.
        """
        part = self.part_dir(rank)
        stored = [record | {IMAGE_HASH: atomic_save_image(image, part / record["file_name"])} for image, record in items]
        append_jsonl(part / METADATA, stored)
        return stored

    def cut_torn_records(self) -> int:
        """Cut the torn last line of each metadata file (see `repair_jsonl`); returns how many.

        Only while no process appends: the image of such a line is generated again, as its record is missing.
        """
        return sum(repair_jsonl(metadata) for metadata in self._metadata_files())

    def drop_records_without_image(self) -> int:
        """Forget records whose image file is gone (e.g. deleted because corrupt) or empty (what a power cut
        can leave of a file the disk had not written yet); returns how many. Their images are generated again."""
        return sum(filter_jsonl(metadata, lambda row, part=metadata.parent: has_bytes(part / row["file_name"]))
                   for metadata in self._metadata_files())

    def add_columns(self, columns: dict[SampleKey, dict[str, Any]]) -> None:
        """Merge per-sample columns (e.g. a reward) into the metadata files, atomically per file."""
        for metadata in self._metadata_files():
            rows = list(sample_rows(metadata))
            for row in rows:
                row.update(columns.get(sample_key(row), {}))
            atomic_write_jsonl(metadata, rows)

    # The prompt set is saved beside the samples so later stages need no --train_prompts.
    def save_prompts(self, info: dict[str, Any]) -> None:
        """Record the prompt set the store is generated from (`prompts.json`), atomically."""
        atomic_write_json(self.root / "prompts.json", info)

    def load_prompts(self) -> dict[str, Any]:
        """The recorded prompt set; StoreError when the folder holds no samples yet."""
        path = self.root / "prompts.json"
        if not path.exists():
            raise StoreError(f"No samples in {self.root}: run `gors generate --output_dir {self.root.parent}` (or "
                             "`gors run`) first.")
        info = read_json(path, "the prompt set `gors generate` records: run it again with the flags that made the "
                               "samples, which writes the file anew, or restore it")
        if not isinstance(info, dict) or not isinstance(info.get("prompts"), list):
            raise StoreError(f"{path} holds no prompt list, which `gors generate` records: run it again with the flags "
                             "that made the samples, which writes the file anew, or restore it")
        return info

    # The generation settings, so that a rerun cannot add images of another model or protocol.
    def save_settings(self, settings: dict[str, Any]) -> None:
        """Record what makes the store's images (`settings.json`), atomically."""
        atomic_write_json(self.root / SETTINGS, settings)

    def load_settings(self) -> dict[str, Any] | None:
        """The recorded generation settings; None for a new store or one made before gors recorded them."""
        path = self.root / SETTINGS
        if not path.is_file():
            return None
        fix = ("restore the file, or delete it and run `gors generate` with the flags that made the images, which "
               "records them again (unchecked: it cannot know they made them)")
        settings = read_json(path, f"the generation settings `gors generate` records: {fix}")
        if not isinstance(settings, dict):
            raise StoreError(f"{path} holds no settings mapping, which `gors generate` records: {fix}")
        return settings


def has_bytes(path: Path) -> bool:
    """Whether the file exists and is not empty (what a power cut can leave of a file not yet on disk)."""
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def same_image(row: dict[str, Any], record: dict[str, Any]) -> bool:
    """Whether a row made from a sample (a score, a selection) is of the record's image file as it is now.

    A sample generated again (its file lost, then made anew) has a new hash, so rows of the old
    file no longer count. Rows and records from before gors recorded the hash match each other.
    """
    return row.get(IMAGE_HASH) == record.get(IMAGE_HASH)


def selection_identity(selection: Iterable[dict[str, Any]]) -> list[list[Any]]:
    """What identifies selected samples for training: each row's path and reward, and its image hash where recorded
    (rows from before gors recorded it keep the identity, and so the caches and checkpoints, they had)."""
    return [[row["path"], row["reward"]] + ([row[IMAGE_HASH]] if row.get(IMAGE_HASH) else []) for row in selection]


def adopt_later_settings(recorded: dict[str, Any], wanted: dict[str, Any],
                         later: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """`recorded` completed with the keys of `later` it lacks, taken from `wanted`; and those of them whose value is set.

    Later versions of gors record settings earlier ones did not: a folder recorded before a key
    existed is taken to have been made with its current value, as a folder without any settings is.
    The caller warns with the names returned (adopting an unset value changes nothing worth a warning).
    """
    adopted = [key for key in later if key not in recorded and key in wanted]
    return {**recorded, **{key: wanted[key] for key in adopted}}, [key for key in adopted if wanted[key] is not None]


def recorded_model_commits(folder: str | Path) -> dict[str, str | None]:
    """The version of each model that filled `folder` (`check_model_commits`: a Hub commit, a local
    model's "sha256:..." fingerprint); {} when none is recorded (nothing made yet, or made before gors
    0.2 recorded them)."""
    path = Path(folder) / MODELS
    fix = "restore the file, or delete it: the next run records the models it loads (unchecked against earlier ones)"
    versions = read_json(path, f"the versions of the models that made this folder's contents; {fix}") \
        if path.is_file() else {}
    if not isinstance(versions, dict):
        raise StoreError(f"{path} holds no mapping of models to versions, which gors writes there; {fix}")
    return versions


def recorded_name(recorded: Mapping[str, Any], name: str) -> str | None:
    """The key of `recorded` (e.g. `models.json`) that names model `name`, however its path is spelled
    (`same_value`); None when none does."""
    return next((known for known in recorded if same_value(known, name)), None)


def recorded_version(versions: Mapping[str, str | None], name: str) -> str | None:
    """The version `versions` (a `models.json`) records for model `name`, however its path is spelled: settings
    keep a path as typed (`~/m`), `models.json` as it was loaded (expanded)."""
    return versions.get(recorded_name(versions, name) or recorded_name(versions, os.path.expanduser(name)) or name)


def moved_local_model(recorded: Any, wanted: Any, versions: Mapping[str, str | None]) -> bool:
    """Whether local model path `wanted`, another than the `recorded` one, holds the very files that a folder's
    `models.json` (`versions`) records for `recorded`: the model moved or copied elsewhere (a fingerprint reads
    the files' names relative to the folder and their contents, never where the folder is), so the same model."""
    if not (isinstance(recorded, str) and isinstance(wanted, str)) or same_value(recorded, wanted):
        return False
    version = recorded_version(versions, recorded)
    return is_local_fingerprint(version) and model_version(wanted) == version


def record_moved_model(folder: str | Path, model: str) -> None:
    """Record local model `model` in `folder`'s `models.json` at its path only: a key of another path that records
    the very files `model` holds now (the model moved or copied there) is renamed to `model`, so that whatever is
    put at the old path later is not taken for the folder's model. Idempotent: also tidies a folder left between
    two writes, or one that took the model at a new path before it held any image."""
    versions = recorded_model_commits(folder)
    moved = [key for key, version in versions.items() if is_local_fingerprint(version) and not same_value(key, model)]
    if not moved:
        return
    now = model_version(model)
    moved = [key for key in moved if versions[key] == now]
    if moved:
        atomic_write_json(Path(folder) / MODELS,
                          {key: version for key, version in versions.items() if key not in moved} | {model: now})


def check_model_commits(folder: str | Path, commits: dict[str, str | None], filled: bool, what: str) -> None:
    """Record in `folder/models.json` the version of each model loaded to fill it (`commits`: name ->
    `gors.core.hub.model_version`, from `recording_loads`: a Hub commit, a local folder's fingerprint);
    refuse, when the folder already holds `what` (e.g. "images", "scores": `filled`), a model now at
    another version than the one recorded, so that the work of two versions of a model (updated on the
    Hub, another snapshot in this machine's cache, a local folder retrained or overwritten in place)
    never mixes. A local model is matched however its path is spelled (`same_value`).

    Called by each process that loaded its models, before it works: they load the same snapshots and
    write the same file. A version unknown on either side (None: not in the cache, or recorded before
    gors recorded it) is no conflict; a local model recorded without a fingerprint takes its current
    one, with a warning.
    """
    recorded = recorded_model_commits(folder)
    spelled = {name: recorded_name(recorded, name) or name for name in commits}
    changed = {
        name: (recorded[spelled[name]], commit) for name, commit in commits.items()
        if filled and recorded.get(spelled[name]) is not None and commit is not None
        and recorded[spelled[name]] != commit
    }
    if changed:
        raise StoreError(
            f"{folder} holds {what} made with other versions of the models loaded now "
            f"({'; '.join(describe_version_change(name, *versions) for name, versions in changed.items())}). The {what} of "
            f"two versions are not mixed: delete {folder} to make them all again with the models loaded now, or run "
            "with the recorded versions (the Hub snapshots in the cache, the local files as they were)."
        )
    adopted = [name for name, commit in commits.items()
               if filled and is_local_fingerprint(commit) and spelled[name] in recorded
               and recorded[spelled[name]] is None]
    if adopted:
        logger.warning("%s holds %s made before gors recorded local models' fingerprints: they are taken to have "
                       "been made by the files now at %s", folder, what, ", ".join(adopted))
    merged = {**recorded, **{spelled[name]: commit for name, commit in commits.items()
                             if commit is not None or spelled[name] not in recorded}}
    if merged != recorded:
        atomic_write_json(Path(folder) / MODELS, merged)


def describe_version_change(name: str, old: str, new: str) -> str:
    """One model's change of version (`model_version`), with its likely cause, for a refusal."""
    if is_local_fingerprint(old) and is_local_fingerprint(new):
        # A relative path names another folder from another working directory.
        elsewhere = "" if Path(name).expanduser().is_absolute() else \
            f", or another folder than then: from here it is {Path(name).expanduser().resolve()}"
        return (f"the files of local model {name} changed since (fingerprint {old[:19]}..., now {new[:19]}...): "
                f"retrained or overwritten in place{elsewhere}")
    if is_local_fingerprint(old) or is_local_fingerprint(new):
        then, now = ("a local folder", f"the Hub model at commit {new}") if is_local_fingerprint(old) else \
            (f"the Hub model at commit {old}", "a local folder")
        return f"{name} named {then}, and names {now} (a folder at that path made or removed since)"
    return (f"{name} was at commit {old}, now {new}: updated on the Hub since, or this machine's Hugging Face "
            "cache holds another snapshot")


def check_cached_commits(folder: str | Path, filled: bool, what: str,
                         revisions: dict[str, str | None] | None = None) -> None:
    """`check_model_commits` before any model loads, with the versions the recorded models have now: the
    commits this machine's Hugging Face cache resolves them to (`revisions`: a model's revision, where one
    was asked for), local folders' fingerprints; so that a folder of another version is refused before
    minutes of loading. A download while loading can still move a branch: the check after loading stays."""
    if filled:
        recorded = recorded_model_commits(folder)
        cached = {name: model_version(name, (revisions or {}).get(name)) for name in recorded}
        check_model_commits(folder, cached, filled, what)


def same_value(recorded: Any, wanted: Any) -> bool:
    """Whether two recorded settings are one: equal, or two spellings of one existing local file or folder
    (`runs/model/` and `runs/model`, a relative and an absolute path), as a model path is often typed;
    dicts and lists item by item."""
    if recorded == wanted:
        return True
    if isinstance(recorded, dict) and isinstance(wanted, dict):  # e.g. a reward's options
        return recorded.keys() == wanted.keys() and all(same_value(recorded[k], wanted[k]) for k in recorded)
    if isinstance(recorded, list) and isinstance(wanted, list):
        return len(recorded) == len(wanted) and all(same_value(a, b) for a, b in zip(recorded, wanted))
    if not (isinstance(recorded, str) and isinstance(wanted, str) and recorded and wanted):
        return False
    try:
        return os.path.samefile(os.path.expanduser(recorded), os.path.expanduser(wanted))
    except OSError:  # either does not exist here (a Hub id, a name)
        return False


def settings_changes(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """The fields that differ (`same_value`), each as "name: old -> new" (a field one side lacks counts as None)."""
    return [
        f"{name}: {json.dumps(recorded.get(name))} -> {json.dumps(wanted.get(name))}"
        for name in sorted(set(recorded) | set(wanted))
        if not same_value(recorded.get(name), wanted.get(name))
    ]


def sample_rows(path: Path, needs: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """The rows of one of a store's or a score folder's jsonl files, each with its sample's indices and the text
    fields in `needs`, as gors writes them; a row edited without them is a ValueError naming the file and row."""
    for number, row in enumerate(read_jsonl(path), start=1):
        try:
            sample_key(row)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}, row {number}: no integer prompt_index and image_index, which gors writes in "
                             "every row; fix or delete that line") from None
        missing = [key for key in needs if not isinstance(row.get(key), str)]
        if missing:
            raise ValueError(f"{path}, row {number}: no {missing[0]} text, which gors writes in every row; fix or "
                             "delete that line")
        yield row


def read_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Records of several jsonl shards, in file order."""
    return [row for path in paths for row in sample_rows(path)]
