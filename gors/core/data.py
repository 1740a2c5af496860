"""Files pinned by commit and sha256 (benchmark data, official checkpoints), fetched once and cached.

Nothing of the benchmarks ships with the package. `fetch_pinned_file` returns a verified local
copy of one file of a `PinnedSource`:

- with `GORS_DATA_DIR` set, only that folder is read (`<dir>/<file>` or `<dir>/<source name>/<file>`)
  and the network is never touched;
- otherwise `$GORS_CACHE_DIR` (default `~/.cache/gors`)`/<source name>/<commit>/<file>`, downloaded
  there first if absent or corrupted. `pooch` does the download: retried on failure, streamed to a
  temporary file beside the target, hash-checked, then moved into place, so neither a partial nor
  a bad download ever lands in the cache. With huggingface_hub's offline switch set
  (`HF_HUB_OFFLINE=1`, as on compute nodes after `gors download`) nothing is downloaded: an absent or
  corrupted copy is an error that says how to fetch it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pooch
import requests

from gors.core.hub import offline_setting

DOWNLOAD_TIMEOUT_S = 60.0  # per connection attempt and per read, not for the whole file
DOWNLOAD_RETRIES = 3  # after the first attempt; pooch waits 1, 2, 3 s between them
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
        sha256: file name (relative to `folder`) -> sha256 of its bytes, or, where the publisher
            gives only that (mmdetection, torch.hub's `check_hash`), its first 8 or more hex digits.
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
        """Where `filename` (relative to `folder`) is downloaded from."""
        return self.url_pattern.format(repository=self.repository, commit=self.commit, path=self.folder + filename)


def cache_root() -> Path:
    """`$GORS_CACHE_DIR`, default `~/.cache/gors`: where downloads and conversions are kept."""
    return Path(os.environ.get("GORS_CACHE_DIR") or Path.home() / ".cache" / "gors").expanduser()


def sha256_of(data: bytes) -> str:
    """The sha256 hex digest of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_matches(actual: str, pinned: str) -> bool:
    """Whether the sha256 hex digest `actual` is `pinned`: equal, or starting with a pin of 8 to 63 hex digits."""
    return len(pinned) >= 8 and actual.lower().startswith(pinned.lower())


def _check_hash(source: PinnedSource, filename: str, path: Path, where: str,
                fix: str = "Replace it with the official file") -> None:
    expected, actual = source.sha256[filename], pooch.file_hash(str(path), alg="sha256")
    if not sha256_matches(actual, expected):
        raise ChecksumError(
            f"{filename} ({where}) has sha256 {actual}, expected {expected}{'...' if len(expected) < 64 else ''}: "
            f"the file is corrupted or not from {source.repository} commit {source.commit}. {fix}."
        )


def _verifying_downloader(source: PinnedSource, filename: str) -> Callable[[str, str, pooch.Pooch], None]:
    """pooch's HTTP download, followed by our hash check of the temporary file.

    pooch checks the hash too, but its error does not say which pinned commit the file should come
    from; a `ChecksumError` is a `ValueError`, which pooch retries like its own hash mismatch.
    """
    http = pooch.HTTPDownloader(timeout=DOWNLOAD_TIMEOUT_S, progressbar=False)

    def download(url: str, output_file: str, pup: pooch.Pooch) -> None:
        http(url, output_file, pup)
        _check_hash(source, filename, Path(output_file), url,
                    fix=f"The server sent another file: download it from {source.repository} at commit "
                        f"{source.commit} yourself and point GORS_DATA_DIR at its folder")

    return download


def fetch_pinned_file(source: PinnedSource, filename: str) -> Path:
    """A local, sha256-verified copy of `filename` of `source` (see the module docstring)."""
    if filename not in source.sha256:
        raise ValueError(f"Unknown {source.name} file {filename!r}; known files: {', '.join(source.sha256)}")
    data_dir = os.environ.get("GORS_DATA_DIR")
    if data_dir:
        candidates = [Path(data_dir) / filename, Path(data_dir) / source.name / filename]
        for path in candidates:
            if path.is_file():
                _check_hash(source, filename, path, str(path))
                return path
        raise FileNotFoundError(
            f"GORS_DATA_DIR={data_dir!r} does not contain {filename}: looked for "
            f"{' and '.join(map(str, candidates))}. Copy the file there or unset GORS_DATA_DIR to download it."
        )
    folder = cache_root() / source.name / source.commit
    offline = offline_setting()
    if offline is not None:  # declared offline: a missing file is one line now, not four failed attempts
        cached = folder / filename
        fetch = (f"{offline} is set: run the command once where there is internet and this cache is shared (`gors "
                 f"download` with the same command and flags fetches it for run, generate, score, train and "
                 f"evaluate), or set GORS_DATA_DIR to a folder holding {filename}"
                 f"{'; ' + source.offline_hint if source.offline_hint else ''}")
        if not cached.is_file():
            raise DownloadError(f"{filename} of {source.repository} (commit {source.commit}) is not in the cache "
                                f"({cached}), and {fetch}.")
        _check_hash(source, filename, cached, str(cached), fix=f"Delete it; {fetch}")
        return cached
    # pooch reuses a cached copy only if its hash still matches; a corrupted one is fetched again.
    pup = pooch.create(
        path=folder,
        base_url=source.url(""),
        # pooch knows only whole hashes: a prefix pin is checked by our downloader and below.
        registry={name: f"sha256:{digest}" if len(digest) == 64 else None for name, digest in source.sha256.items()},
        urls={name: source.url(name) for name in source.sha256},
        retry_if_failed=DOWNLOAD_RETRIES,
    )
    try:
        path = Path(pup.fetch(filename, downloader=_verifying_downloader(source, filename)))
        if len(source.sha256[filename]) < 64:  # pooch reuses any cached copy it has no hash for
            try:
                _check_hash(source, filename, path, str(path))
            except ChecksumError:
                path.unlink()
                path = Path(pup.fetch(filename, downloader=_verifying_downloader(source, filename)))
        return path
    except requests.exceptions.RequestException as err:
        raise DownloadError(
            f"Could not download {source.url(filename)}: {err}. To run offline, set GORS_DATA_DIR to a folder "
            f"holding {filename}{'; ' + source.offline_hint if source.offline_hint else ''}."
        ) from err
