"""Fingerprints of local model files: what a run folder records of a model that has no Hub commit, so
that the work of a model retrained or overwritten at the same path is never mixed with the old one's."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from gors.core.io import atomic_write_json

# How a local model's fingerprint is written where a Hub model's commit would be (`models.json`, a
# checkpoint's fingerprint): never a 40-digit commit.
LOCAL_PREFIX = "sha256:"
# Files beside a model's weights and configuration that change no output: documents and pictures.
NOT_MODEL_SUFFIXES = frozenset({".md", ".rst", ".pdf", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".lock", ".log"})
FINGERPRINTS_DIR = "fingerprints"
_CHUNK = 1 << 20
_NOTED_SIZE = 1 << 30  # hashing a model this large takes seconds: say so

logger = logging.getLogger(__name__)


def model_files(path: Path) -> list[Path]:
    """The files of local model `path` whose contents decide what it computes: the file itself, or every
    file under the folder, in name order, but hidden ones (`.cache/`, `.git/`: huggingface_hub's and
    git's bookkeeping) and documents and pictures (`NOT_MODEL_SUFFIXES`)."""
    if path.is_file():
        return [path]
    found = []
    for folder, subfolders, names in os.walk(path, followlinks=True):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        found += [Path(folder) / name for name in sorted(names)
                  if not name.startswith(".") and Path(name).suffix.lower() not in NOT_MODEL_SUFFIXES]
    return found


def local_fingerprint(path: str | Path) -> str | None:
    """`LOCAL_PREFIX` + the sha256 of the relative names and contents of `model_files(path)`; None where
    `path` does not exist.

    Hashed again only when a file's size or modification time changed: the digest is kept under
    `$GORS_CACHE_DIR/fingerprints/` beside the sizes and times it was computed at, as a model's
    files take seconds to read (a copy made without keeping the times is hashed once more, to the
    same digest).
    """
    path = Path(path).expanduser().resolve()
    if not path.exists():
        return None
    files = model_files(path)
    # A folder's files by their names in it (a rename is another model); a single file by no name.
    signature = [[file.relative_to(path).as_posix() if file != path else "",
                  (stat := file.stat()).st_size, stat.st_mtime_ns] for file in files]
    cache = _cache_file(path)
    try:
        kept = json.loads(cache.read_text())
        if kept["files"] == signature:
            return kept["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept, or unreadable: hash
    size = sum(entry[1] for entry in signature)
    if size >= _NOTED_SIZE:
        logger.info("fingerprinting local model %s (%.1f GB; once, until its files change)", path, size / 1e9)
    digest = hashlib.sha256()
    for (name, _, _), file in zip(signature, files):
        digest.update(name.encode() + b"\0")
        _update_with_file(digest, file)
    fingerprint = LOCAL_PREFIX + digest.hexdigest()
    _keep(cache, {"path": str(path), "files": signature, "fingerprint": fingerprint})
    return fingerprint


def is_local_fingerprint(version: str | None) -> bool:
    """Whether a recorded model version is a local model's fingerprint rather than a Hub commit."""
    return version is not None and version.startswith(LOCAL_PREFIX)


def files_sha256(files: Iterable[Path]) -> str:
    """The sha256 hex digest of the contents of `files`, one after the other."""
    digest = hashlib.sha256()
    for file in files:
        _update_with_file(digest, file)
    return digest.hexdigest()


def _cache_file(path: Path) -> Path:
    # Imported here: gors.core.data imports gors.core.hub, which imports this module.
    from gors.core.data import cache_root

    return cache_root() / FINGERPRINTS_DIR / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")


def _keep(cache: Path, entry: dict) -> None:
    try:
        atomic_write_json(cache, entry)
    except OSError:
        pass  # a cache that cannot be written (read-only home) only costs hashing again next time


def _update_with_file(digest: hashlib._Hash, file: Path) -> None:
    # A MiB at a time: a model's files are gigabytes.
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
