"""Files pinned by commit and sha256 (benchmark data, official checkpoints), fetched once and cached.

Nothing of the benchmarks ships with the package. `fetch_pinned_file` returns a verified local
copy of one file of a `PinnedSource`:

- with `GORS_DATA_DIR` set, only that folder is read (`<dir>/<file>` or `<dir>/<source name>/<file>`)
  and the network is never touched;
- otherwise `$GORS_CACHE_DIR` (default `~/.cache/gors`)`/<source name>/<commit>/<file>`, downloaded
  there first if absent or corrupted, written atomically.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gors.core.io import atomic_write_bytes

DOWNLOAD_TIMEOUT_S = 60.0
GITHUB_RAW = "https://raw.githubusercontent.com/{repository}/{commit}/{path}"


class ChecksumError(ValueError):
    """A file's bytes do not match the pinned sha256."""


class DownloadError(OSError):
    """A pinned file could not be downloaded."""


@dataclass(frozen=True)
class PinnedSource:
    """Files of one repository folder at one commit, each with its sha256.

    Attributes:
        name: cache and `GORS_DATA_DIR` sub-folder, e.g. "t2i_compbench".
        repository, commit, folder: where the files live (`folder` ends with "/" or is "").
        sha256: file name (relative to `folder`) -> sha256 of its bytes.
        offline_hint: what to do instead of downloading (added to download errors).
        url_pattern: format string with {repository}, {commit}, {path}; GitHub raw by default.
    """

    name: str
    repository: str
    commit: str
    folder: str
    sha256: Mapping[str, str]
    offline_hint: str = ""
    url_pattern: str = GITHUB_RAW

    def url(self, filename: str) -> str:
        return self.url_pattern.format(repository=self.repository, commit=self.commit, path=self.folder + filename)


def cache_root() -> Path:
    """`$GORS_CACHE_DIR`, default `~/.cache/gors`: where downloads and conversions are kept."""
    return Path(os.environ.get("GORS_CACHE_DIR") or Path.home() / ".cache" / "gors").expanduser()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_hash(source: PinnedSource, filename: str, data: bytes, where: str) -> None:
    expected, actual = source.sha256[filename], sha256_of(data)
    if actual != expected:
        raise ChecksumError(
            f"{filename} ({where}) has sha256 {actual}, expected {expected}: the file is corrupted or "
            f"not from {source.repository} commit {source.commit}. Replace it with the official file."
        )


def fetch_pinned_file(source: PinnedSource, filename: str) -> Path:
    """A local, sha256-verified copy of `filename` of `source` (see the module docstring)."""
    if filename not in source.sha256:
        raise ValueError(f"Unknown {source.name} file {filename!r}; known files: {', '.join(source.sha256)}")
    data_dir = os.environ.get("GORS_DATA_DIR")
    if data_dir:
        candidates = [Path(data_dir) / filename, Path(data_dir) / source.name / filename]
        for path in candidates:
            if path.is_file():
                _check_hash(source, filename, path.read_bytes(), str(path))
                return path
        raise FileNotFoundError(
            f"GORS_DATA_DIR={data_dir!r} does not contain {filename}: looked for "
            f"{' and '.join(map(str, candidates))}. Copy the file there or unset GORS_DATA_DIR to download it."
        )
    target = cache_root() / source.name / source.commit / filename
    # A cached copy is trusted only if its hash still matches; a bad one is fetched again.
    if target.is_file() and sha256_of(target.read_bytes()) == source.sha256[filename]:
        return target
    url = source.url(filename)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        raise DownloadError(
            f"Could not download {url}: {err}. To run offline, set GORS_DATA_DIR to a folder holding "
            f"{filename}{'; ' + source.offline_hint if source.offline_hint else ''}."
        ) from err
    _check_hash(source, filename, data, url)  # verify before caching so a bad download never lands on disk
    atomic_write_bytes(target, data)  # concurrent readers never see a partial file
    return target
