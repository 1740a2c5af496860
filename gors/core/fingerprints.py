"""Fingerprints of local model files: what a run folder records of a model that has no Hub commit, so
that the work of a model retrained or overwritten at the same path is never mixed with the old one's."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from gors.core.io import atomic_write_json, hash_file_into

# How a local model's fingerprint is written where a Hub model's commit would be (`models.json`, a
# checkpoint's fingerprint): never a 40-digit commit.
LOCAL_PREFIX = "sha256:"
# The files of a model that its loaders read: weights (safetensors, torch pickles, ...), configs, tokenizer
# files (sentencepiece `.model`, `.tiktoken`, `vocab.txt`, `merges.txt`), chat templates and remote code.
MODEL_SUFFIXES = frozenset({".json", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".npz", ".npy", ".h5",
                            ".msgpack", ".gguf", ".onnx", ".model", ".tiktoken", ".jinja", ".py", ".yaml", ".yml"})
TOKENIZER_TEXT_FILES = ("vocab", "merges")  # a `.txt` file is a model's when its name holds one of these
# The subfolder transformers reads more chat templates from (one of them may replace the folder's own).
CHAT_TEMPLATES_DIR = "additional_chat_templates"
FINGERPRINTS_DIR = "fingerprints"
_NOTED_SIZE = 1 << 30  # hashing a model this large takes seconds: say so

logger = logging.getLogger(__name__)

# The fingerprints this process computed, by path and signature: a stage asks for one several times.
_computed: dict[tuple[str, str], str] = {}


def model_files(path: Path) -> list[Path]:
    """The files of local model `path` that its loader reads: the file itself; or, in a diffusers pipeline
    (`model_index.json`), that file, its code and the model files of the component folders it names; or
    the folder's model files (`MODEL_SUFFIXES`, with its chat templates' subfolder). Regular files only (no
    dangling link, no pipe), in name order. Anything else changes no output and is left out: documents,
    pictures, logs, hidden files, other subfolders (a run folder kept inside the model's, `.git/`)."""
    if path.is_file():
        return [path]
    components = _pipeline_components(path)
    if components is None:
        return _model_files_in(path)
    return (_regular_files(path, lambda name: name == "model_index.json" or name.endswith(".py"))
            + [file for name in sorted(components) if not name.startswith(".") and (path / name).is_dir()
               for file in _model_files_in(path / name)])


def local_fingerprint(path: str | Path) -> str | None:
    """`LOCAL_PREFIX` + the sha256 of the relative names and contents of `model_files(path)`; None where
    `path` does not exist. A file that cannot be read counts as such (the loader may not need it).

    Hashed again only when a file's size, modification or status-change time or inode changed: the digest
    is kept under `$GORS_CACHE_DIR/fingerprints/` (per machine) beside them, as a model's files take
    seconds to read. No tool sets a status-change time, so files written again always count, even with
    their old modification times kept (`cp -p`, `rsync -a`, an archive); a copy is hashed once more, to
    the same digest.
    """
    path = Path(path).expanduser().resolve()
    if not path.exists():
        return None
    files = []
    signature = []
    for file in model_files(path):
        try:
            stat = file.stat()
        except OSError:
            continue  # gone since it was listed
        files.append(file)
        # A folder's files by their names in it (a rename is another model); a single file by no name.
        signature.append([file.relative_to(path).as_posix() if file != path else "", stat.st_size,
                          stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino])
    key = (str(path), json.dumps(signature))
    if key in _computed:
        return _computed[key]
    cache = _cache_file(path)
    try:
        kept = json.loads(cache.read_text())
        if kept["files"] == signature:
            return _computed.setdefault(key, kept["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept, or unreadable: hash
    size = sum(entry[1] for entry in signature)
    if size >= _NOTED_SIZE:
        logger.info("fingerprinting local model %s (%.1f GB; once, until its files change)", path, size / 1e9)
    digest = hashlib.sha256()
    for (name, *_), file in zip(signature, files):
        digest.update(name.encode() + b"\0")
        try:
            hash_file_into(digest, file)
        except OSError:
            digest.update(b"\0unreadable\0")
    fingerprint = _computed[key] = LOCAL_PREFIX + digest.hexdigest()
    _keep(cache, {"path": str(path), "files": signature, "fingerprint": fingerprint})
    return fingerprint


def is_local_fingerprint(version: str | None) -> bool:
    """Whether a recorded model version is a local model's fingerprint rather than a Hub commit."""
    return version is not None and version.startswith(LOCAL_PREFIX)


def _pipeline_components(path: Path) -> list[str] | None:
    """The component folders a diffusers pipeline's `model_index.json` names; None for another model."""
    try:
        index = json.loads((path / "model_index.json").read_text())
    except (OSError, ValueError):
        return None
    return [name for name in index if not name.startswith("_")] if isinstance(index, dict) else None


def _model_files_in(folder: Path) -> list[Path]:
    """The model files of one model's folder (`MODEL_SUFFIXES`), and its extra chat templates."""
    def is_model_file(name: str) -> bool:
        suffix = Path(name).suffix.lower()
        return suffix in MODEL_SUFFIXES or (suffix == ".txt" and any(word in name for word in TOKENIZER_TEXT_FILES))

    return _regular_files(folder, is_model_file) + _regular_files(folder / CHAT_TEMPLATES_DIR, is_model_file)


def _regular_files(folder: Path, wanted: Callable[[str], bool]) -> list[Path]:
    if not folder.is_dir():
        return []
    return [folder / name for name in sorted(os.listdir(folder))
            if not name.startswith(".") and wanted(name) and (folder / name).is_file()]


def _cache_file(path: Path) -> Path:
    # Imported here: gors.core.data imports gors.core.hub, which imports this module.
    from gors.core.data import cache_root

    # Per machine: nodes that share a home but each hold their own copy of a model at one path would
    # otherwise replace each other's entry, and hash at every start.
    name = hashlib.sha256(f"{socket.gethostname()}\0{path}".encode()).hexdigest()[:32]
    return cache_root() / FINGERPRINTS_DIR / f"{name}.json"


def _keep(cache: Path, entry: dict) -> None:
    try:
        atomic_write_json(cache, entry)
    except OSError:
        pass  # a cache that cannot be written (read-only home) only costs hashing again in the next process
