"""Crash-safe file writes: atomic replaces and append-only JSON lines.

Every long stage writes through these helpers, so an interruption at any instant leaves either
the old file or the new one, and at worst one torn last line in a jsonl log. Readers report such
a line and leave its record out; the stage that wrote the file cuts it (`repair_jsonl`) and
writes the record again. Files get the usual permissions (0666 less the umask), as `open` gives
them, not the owner-only ones of `tempfile`.

"Any instant" is any moment a process can be killed (`kill -9` included). A power cut can also
lose what the OS had not yet written: the jsonl logs, atomic writes and published folders are
flushed (fsync) before they count, while images are not (one flush per image would slow
generation), so after a power cut an image whose record survived may be empty; reading it then
fails with a message that says to delete it, and the next run generates it again.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from PIL import Image

from gors.core.logs import first_time, own_work_logger

logger = logging.getLogger(__name__)
# This process's own writes (the part files it appends to): every process says its own.
writes_logger = own_work_logger(f"{__name__}.writes")

# What the OS says when a path given by the user is unusable: a file where a folder belongs (or the
# reverse), or no permission. The user fixes these from the message; any other OSError is a fault.
UNUSABLE_PATH = (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


class PathError(OSError):
    """A path the user gave cannot be used as given; the message names it, and the flag when known."""


class NotSharedError(PathError):
    """Some processes of a launch do not see the run folder the main process writes (not a shared filesystem)."""


def first_missing(folder: Path) -> Path:
    """The outermost of `folder` and its parents that does not exist: what making `folder` creates."""
    missing = folder
    for parent in folder.parents:
        if parent.exists():
            break
        missing = parent
    return missing


def remove_folder_holding_only(folder: Path, names: Iterable[str], made: Path) -> None:
    """Remove `folder` when it holds nothing but files of `names`, and then the parents it was made with up to
    `made` while they are empty: a command that made it and failed before writing its work (e.g. on a mistyped
    flag) leaves no empty run folder behind. Anything else in it keeps it (another process's files, or work)."""
    names = set(names)
    try:
        if {path.name for path in folder.iterdir()} <= names:
            for name in names:
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
            while folder != made and not any(folder.parent.iterdir()):
                folder = folder.parent
                folder.rmdir()
    except OSError:  # another process wrote there meanwhile, or it cannot be removed: leave it
        pass


def unusable_path(err: OSError, path: str | Path, flag: str | None = None) -> PathError:
    """`err` (one of `UNUSABLE_PATH`) as one line naming the path, the flag that gave it and the fix."""
    given = f"{flag}={str(path)!r}" if flag else str(path)
    failed = Path(err.filename or path)  # the path itself, or the one of its parents that failed
    if isinstance(err, FileExistsError) and failed.is_symlink() and not failed.exists():
        where = "is" if failed == Path(path) else f"lies under {failed}, which is"
        problem = f"{where} a link to {os.readlink(failed)}, which does not exist (not mounted?)"
    elif isinstance(err, FileExistsError):
        problem = "is a file, not a folder"
    elif isinstance(err, NotADirectoryError):
        problem = "lies under a file, not a folder"
    elif isinstance(err, IsADirectoryError):
        problem = "is a folder, not a file"
    else:
        problem = f"cannot be written: {(err.strerror or str(err)).lower()} on {err.filename or path}"
    return PathError(f"{given} {problem}; pass a folder path that you can write to")


def not_a_folder(path: str | Path) -> str:
    """Why an existing-folder argument is none, for a message: "a file, not a folder" or "no such folder"."""
    return "a file, not a folder" if Path(path).exists() else "no such folder"


def check_folder_path(folder: str | Path, flag: str | None = None) -> None:
    """Raise the `PathError` that `make_folder` would for a path that is, or lies under, a file or a broken link,
    creating nothing: a check to make before slow work whose results go there."""
    folder = Path(folder)
    existing = next((path for path in (folder, *folder.parents) if path.exists() or path.is_symlink()), None)
    if existing is None or existing.is_dir():
        return
    kind = FileExistsError if existing == folder or not existing.exists() else NotADirectoryError  # not: a broken link
    raise unusable_path(kind(0, "", str(existing)), folder, flag)


def make_folder(folder: str | Path, flag: str | None = None) -> Path:
    """Create `folder` and its parents if missing; a `PathError` naming it (and `flag`) when it cannot be."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except UNUSABLE_PATH as err:
        raise unusable_path(err, folder, flag) from None
    return folder


@functools.cache
def _umask() -> int:
    """The process umask. Reading it means setting it, so it is read once; the value set for that
    instant is owner-only, so a file another thread creates meanwhile is at worst private."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def set_usual_permissions(path: str | Path) -> None:
    """Give a file 0666 and a folder 0777, less the umask, as `open` and `mkdir` would.

    `tempfile.mkstemp` and `mkdtemp` create owner-only entries; call this before renaming one into
    place, so that images, metadata and LoRAs stay readable by colleagues and servers under umask 022.
    """
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks (`hashlib.file_digest` needs Python 3.11)."""
    return files_sha256([path])


def files_sha256(paths: Iterable[str | Path]) -> str:
    """The sha256 hex digest of the contents of `paths`, one after the other."""
    digest = hashlib.sha256()
    for path in paths:
        hash_file_into(digest, path)
    return digest.hexdigest()


def hash_file_into(digest: hashlib._Hash, path: str | Path) -> None:
    """Feed the contents of file `path` to `digest`, in 1 MiB blocks (model files are gigabytes)."""
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def is_json_number(value: Any) -> bool:
    """Whether a value read from JSON is a number: an int or a float (NaN and infinities included), not
    true or false, which Python counts as ints."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value in `path`, or a ValueError naming the file and saying what it should be (`what`)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); expected {what}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file; expected {what}") from None


def read_json_if_present(path: str | Path, what: str) -> Any:
    """`read_json` of `path` where the file exists, else None (a record an earlier stage may not have written)."""
    return read_json(path, what) if Path(path).is_file() else None


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and `os.replace`."""
    path = Path(path)
    make_folder(path.parent)
    if path.is_dir():  # os.replace would fail only after the data is written
        raise PathError(f"{path}: is a folder, where a file is to be written; move it away or pass another path")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except UNUSABLE_PATH as err:
        raise unusable_path(err, path.parent) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        set_usual_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Atomically write `obj` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Atomically replace a jsonl file with `rows`."""
    atomic_write_bytes(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def filter_jsonl(path: str | Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Atomically drop the rows of a jsonl file that `keep` rejects (the file is left alone when
    it rejects none); returns how many were dropped."""
    rows = list(read_jsonl(path))
    kept = [row for row in rows if keep(row)]
    if len(kept) != len(rows):
        atomic_write_jsonl(path, kept)
    return len(rows) - len(kept)


def atomic_save_image(image: Image.Image, path: str | Path) -> str:
    """Save a PIL image atomically (format from the suffix); returns the sha256 (hex) of the file's bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encoded = io.BytesIO()
    image.save(encoded, format=Image.registered_extensions()[path.suffix.lower()])
    data = encoded.getvalue()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        set_usual_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def fsync_path(path: str | Path) -> None:
    """Flush a file or folder to disk: a rename must not publish data still only in the page cache."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def aside_copy(final: str | Path) -> Path:
    """Where `publish_folder` renames the folder it replaces until the new one is in place: `.<name>.old`."""
    final = Path(final)
    return final.with_name(f".{final.name}.old")


def left_aside(parent: str | Path, pattern: str) -> list[tuple[Path, Path]]:
    """(folder, its `aside_copy`) for each folder of `parent` matching `pattern` that an interrupted
    `publish_folder` left only as its aside copy (what `recover_folder` would put back)."""
    parent = Path(parent)
    found = [(parent / aside.name.removeprefix(".").removesuffix(".old"), aside)
             for aside in parent.glob(f".{pattern}.old") if aside.is_dir()]
    return [(final, aside) for final, aside in found if not final.exists()]


def publish_folder(staging: str | Path, final: str | Path) -> None:
    """Rename the complete folder `staging` to `final`, replacing any folder there only after.

    An existing `final` is renamed aside (`.<name>.old`) first and deleted last; a kill between the
    two renames leaves no `final` and the aside copy, which `recover_folder` puts back.
    """
    staging, final = Path(staging), Path(final)
    for path in (*staging.rglob("*"), staging):
        fsync_path(path)
    aside = aside_copy(final)
    if final.exists():
        if aside.exists():
            shutil.rmtree(aside)
        final.rename(aside)
    staging.rename(final)
    fsync_path(final.parent)
    if aside.exists():
        shutil.rmtree(aside)


def recover_folder(final: str | Path) -> None:
    """Put back the folder that an interrupted `publish_folder` left renamed aside, if any."""
    final = Path(final)
    aside = aside_copy(final)
    if not final.exists() and aside.is_dir():
        aside.rename(final)


def discard_folder(folder: str | Path) -> None:
    """Delete `folder`, and the copy of it that an interrupted `publish_folder` left aside (`.<name>.old`,
    which `recover_folder` would put back). Each is renamed to `.<name>.discarded` before it is deleted:
    a kill leaves the folder whole or gone, never half deleted (the next discard deletes the rest)."""
    folder = Path(folder)
    trash = folder.with_name(f".{folder.name}.discarded")
    shutil.rmtree(trash, ignore_errors=True)
    for path in (aside_copy(folder), folder):
        if path.exists():
            path.rename(trash)
            shutil.rmtree(trash)


# A staging folder untouched this long is a killed writer's, not a concurrent one's (whose files land in seconds).
STALE_STAGING_S = 3600.0


def remove_stale_staging(parent: str | Path, pattern: str, older_than_s: float = STALE_STAGING_S) -> None:
    """Delete the folders of `parent` matching `pattern` (a writer's staging folders, e.g. ".hub_upload.*.tmp")
    whose last change is more than `older_than_s` seconds old: what a killed writer left, never a running one's."""
    for stale in Path(parent).glob(pattern):
        try:
            old = stale.is_dir() and time.time() - stale.stat().st_mtime > older_than_s
        except FileNotFoundError:  # another writer removed it meanwhile
            continue
        if old:
            shutil.rmtree(stale, ignore_errors=True)


def publish_files(staging: str | Path, folder: str | Path) -> None:
    """Move every file of the folder `staging` into `folder`, each by an atomic `os.replace` after
    flushing it: a reader finds each file whole, the old one or the new one."""
    folder = Path(folder)
    for path in sorted(Path(staging).iterdir()):
        fsync_path(path)
        set_usual_permissions(path)
        os.replace(path, folder / path.name)
    fsync_path(folder)


def _torn_tail_start(data: bytes) -> int | None:
    """Offset of a last line without its newline (an interrupted append, a copy cut short), or None."""
    if data and not data.endswith(b"\n"):
        return data.rfind(b"\n") + 1
    return None


def repair_jsonl(path: str | Path) -> bool:
    """Cut a torn last line from a jsonl file, with a warning; returns whether there was one.

    One `truncate` of the same file, so a crash leaves it either torn or cut, and a handle
    appending to it stays valid. Only the stage that writes the file calls this, while nothing
    appends to it: the record of that line is missing afterwards and is written again.
    """
    path = Path(path)
    with open(path, "rb+") as handle:
        # The last byte says whether the file is whole: a store's metadata grows to tens of megabytes and is
        # checked before every append, so only a torn file is read in full.
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return False
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return False
        handle.seek(0)
        start = _torn_tail_start(handle.read())
        handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())
    writes_logger.warning("%s: cut its incomplete last line (an interrupted write); that record is written again", path)
    return True


def append_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows to a jsonl file and fsync, so a finished record survives a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        repair_jsonl(path)  # a torn line left in place would glue itself to the first new row
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class TornLineError(ValueError):
    """A jsonl file written whole (atomically) ends in a line cut short: it was damaged since."""


def read_jsonl(path: str | Path, whole: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the complete records of a jsonl file.

    A torn last line is left out with a warning (once per process and file state) and the file is
    not touched: a reader cannot know whether a writer is still appending to it. With `whole` (a
    file written atomically, which no writer appends to) it is a `TornLineError` instead, unless the
    line is a whole JSON object (a file edited by a script that left out the last line feed). A
    malformed line before the last one, or one that is no JSON object, is an error that names the
    file and line.
    """
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith("\n"):
                if whole:
                    last = _json_or_none(line)
                    if not isinstance(last, dict):
                        raise TornLineError(f"{path}:{number} is cut short (its last line is incomplete)")
                    yield last
                    return
                # Once per file state: a stage reads a file several times.
                if first_time("torn line", str(path), os.fstat(handle.fileno()).st_size):
                    logger.warning(
                        "%s:%d is incomplete (an interrupted write or a copy cut short): its record is left out. "
                        "Rerun the stage that wrote the file (with the same --output_dir): it cuts the line and "
                        "generates or scores that sample again.", path, number,
                    )
                return
            if line.strip():
                yield _json_object(line, path, number)


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _json_object(line: str, path: str | Path, number: int) -> dict[str, Any]:
    """Line `number` of jsonl file `path` as the JSON object it must be; ValueError naming the line."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{number} is not valid JSON ({err}); fix or delete that line") from err
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{number} is {line.strip()[:60]!r}, not a JSON object as gors writes each line; fix "
                         "or delete that line")
    return row
