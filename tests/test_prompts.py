"""Offline tests for gors.core.prompts: verified fetching, caching, prompt parsing, GORS thresholds."""

from __future__ import annotations

import io
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gors.core import paper
from gors.core import prompts as P

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"
needs_shared = pytest.mark.skipif(not (SHARED / "t2i_compbench").is_dir(), reason="shared/benchmarks not present")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never touch the real cache or the network, whatever the caller's environment says."""
    monkeypatch.delenv("GORS_DATA_DIR", raising=False)
    monkeypatch.setenv("GORS_CACHE_DIR", str(tmp_path / "cache"))

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


@needs_shared
def test_hash_table_matches_sha256sums() -> None:
    listed = {}
    for line in (SHARED / "SHA256SUMS").read_text().splitlines():
        if "./t2i_compbench/" in line:
            digest, path = line.split()
            listed[path.rsplit("/", 1)[1]] = digest
    assert listed == P.T2I_COMPBENCH_SHA256


@needs_shared
def test_data_dir_loads_color_train(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))  # files live under t2i_compbench/
    ps = P.load_prompts("color")
    assert (ps.name, ps.category, len(ps.prompts)) == ("color_train", "color", 700)
    assert ps.prompts[0] == "a green bench and a red car"
    assert ps.source == P.t2i_compbench_url("color_train.txt")
    assert P.load_prompts("t2i_compbench:complex_val_spatial").category == "complex"
    assert P.load_prompts("non_spatial", split="val").name == "non_spatial_val"
    assert P.load_prompts("3d_spatial").category == "3d_spatial"


@needs_shared
def test_data_dir_flat_layout_and_corruption(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SHARED / "t2i_compbench" / "shape_val.txt", data / "shape_val.txt")
    monkeypatch.setenv("GORS_DATA_DIR", str(data))
    assert P.fetch_t2i_compbench_file("shape_val.txt") == data / "shape_val.txt"

    (data / "shape_val.txt").write_bytes((data / "shape_val.txt").read_bytes() + b"extra\r\n")
    with pytest.raises(P.ChecksumError) as err:
        P.fetch_t2i_compbench_file("shape_val.txt")
    assert "shape_val.txt" in str(err.value) and P.T2I_COMPBENCH_SHA256["shape_val.txt"] in str(err.value)

    with pytest.raises(FileNotFoundError, match="color_val.txt"):
        P.fetch_t2i_compbench_file("color_val.txt")


@needs_shared
def test_cache_hit_never_downloads(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "t2i_compbench" / P.T2I_COMPBENCH_COMMIT / "texture_val.txt"
    cached.parent.mkdir(parents=True)
    shutil.copy(SHARED / "t2i_compbench" / "texture_val.txt", cached)
    assert P.fetch_t2i_compbench_file("texture_val.txt") == cached  # urlopen raises if called


def test_failed_download_says_how_to_go_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, timeout: float) -> None:
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(P.DownloadError) as err:
        P.load_prompts("spatial")
    message = str(err.value)
    assert P.t2i_compbench_url("spatial_train.txt") in message
    assert "GORS_DATA_DIR" in message and "--train_prompts" in message


@needs_shared
def test_download_is_verified_and_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    payload = (SHARED / "t2i_compbench" / "color_val.txt").read_bytes()
    calls: list[str] = []

    def fake_urlopen(url: str, timeout: float) -> io.BytesIO:
        calls.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    path = P.fetch_t2i_compbench_file("color_val.txt")
    assert calls == [P.t2i_compbench_url("color_val.txt")]
    assert path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["color_val.txt"]  # no temp file left behind
    P.fetch_t2i_compbench_file("color_val.txt")
    assert len(calls) == 1  # second call served from the cache

    # A corrupted download is rejected and never written to the cache.
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"junk"))
    with pytest.raises(P.ChecksumError, match="shape_val.txt"):
        P.fetch_t2i_compbench_file("shape_val.txt")
    assert not (path.parent / "shape_val.txt").exists()


def test_read_prompt_file_crlf_and_blanks(tmp_path: Path) -> None:
    f = tmp_path / "mine.txt"
    f.write_bytes(b"  a red cube \r\n\r\n\na blue ball\n   \nlast one")
    assert P.read_prompt_file(f) == ["a red cube", "a blue ball", "last one"]
    ps = P.load_prompts(str(f))
    assert (ps.name, ps.category, ps.source) == ("mine", None, str(f))


def test_local_file_with_official_name_gets_category(tmp_path: Path) -> None:
    f = tmp_path / "texture_train.txt"
    f.write_text("a wooden table\n")
    assert P.load_prompts(str(f)).category == "texture"


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\r\n  \n")
    with pytest.raises(ValueError, match="empty.txt"):
        P.read_prompt_file(empty)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        P.read_prompt_file(tmp_path / "nope.txt")


def test_unknown_names() -> None:
    with pytest.raises(FileNotFoundError, match="does not exist") as err:
        P.load_prompts("colour")
    assert "color_val" in str(err.value) and "non_spatial" in str(err.value)
    with pytest.raises(FileNotFoundError, match="not a T2I-CompBench name"):
        P.load_prompts("t2i_compbench:colour")
    with pytest.raises(ValueError, match="color_train.txt"):
        P.fetch_t2i_compbench_file("colour_train.txt")


@pytest.mark.parametrize(
    "category, template, natural",
    [("color", 0.92, 0.7), ("shape", 0.85, 0.6), ("texture", 0.9, 0.65)],
)
def test_two_level_thresholds(category: str, template: float, natural: float) -> None:
    assert paper.selection_threshold(category, 0) == template
    assert paper.selection_threshold(category, paper.TEMPLATE_PROMPT_COUNT - 1) == template
    assert paper.selection_threshold(category, 560) == natural


@pytest.mark.parametrize("category, value", [("spatial", 0.8), ("non_spatial", 0.75), ("complex", 0.4)])
def test_single_thresholds(category: str, value: float) -> None:
    assert paper.selection_threshold(category, 0) == paper.selection_threshold(category, 699) == value


def test_threshold_unknown_category() -> None:
    with pytest.raises(ValueError, match="non_spatial"):
        paper.selection_threshold("numeracy", 0)
