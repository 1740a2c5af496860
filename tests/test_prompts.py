"""Offline tests for gors.core.prompts: verified fetching, caching, prompt parsing, GORS thresholds."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pinned_http import FileServer, file_server, forbid_internet, github_url, local_source, record_retry_waits

from gors.core import paper
from gors.core import prompts as P
from gors.core.data import PinnedSource, cache_root, fetch_pinned_file, sha256_matches, sha256_of

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"
needs_shared = pytest.mark.skipif(not (SHARED / "t2i_compbench").is_dir(), reason="shared/benchmarks not present")
GITHUB_DATASET = f"https://raw.githubusercontent.com/Karine-Huang/T2I-CompBench/{P.T2I_COMPBENCH_COMMIT}/examples/dataset/"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[float]:
    """Never touch the real cache or the network, whatever the caller's environment says; pooch's
    waits between download attempts are instant, and the list of them is returned."""
    monkeypatch.delenv("GORS_DATA_DIR", raising=False)
    monkeypatch.setenv("GORS_CACHE_DIR", str(tmp_path / "cache"))
    forbid_internet(monkeypatch)
    return record_retry_waits(monkeypatch)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FileServer]:
    """T2I-CompBench downloads go to a server on 127.0.0.1, at the files' GitHub paths."""
    with file_server() as running:
        monkeypatch.setattr(P, "T2I_COMPBENCH", local_source(P.T2I_COMPBENCH, running.url))
        yield running


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
    assert P.fetch_t2i_compbench_file("texture_val.txt") == cached  # any request would fail the test


def test_failed_download_says_how_to_go_offline(monkeypatch: pytest.MonkeyPatch, _isolated: list[float]) -> None:
    with file_server() as gone:
        pass  # nothing listens on its port any more: every connection is refused
    monkeypatch.setattr(P, "T2I_COMPBENCH", local_source(P.T2I_COMPBENCH, gone.url))
    with pytest.raises(P.DownloadError) as err:
        P.load_prompts("spatial")
    message = str(err.value)
    assert P.t2i_compbench_url("spatial_train.txt") in message
    assert "GORS_DATA_DIR" in message and "the path of a prompt file instead of the T2I-CompBench name" in message
    assert _isolated == [1, 2, 3]  # tried four times, waiting longer each time
    assert not list(cache_root().rglob("spatial_train.txt"))


@needs_shared
def test_download_is_verified_and_cached(server: FileServer, _isolated: list[float]) -> None:
    payload = (SHARED / "t2i_compbench" / "color_val.txt").read_bytes()
    served = server.put(P.T2I_COMPBENCH, "color_val.txt", payload)
    path = P.fetch_t2i_compbench_file("color_val.txt")
    assert [github_url(p) for p in server.requests] == [GITHUB_DATASET + "color_val.txt"]
    assert path == cache_root() / "t2i_compbench" / P.T2I_COMPBENCH_COMMIT / "color_val.txt"
    assert path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["color_val.txt"]  # no temp file left behind
    P.fetch_t2i_compbench_file("color_val.txt")
    assert server.requests == [served]  # second call served from the cache

    # A corrupted cached copy is not trusted: it is downloaded again.
    path.write_bytes(payload[:-5])
    assert P.fetch_t2i_compbench_file("color_val.txt") == path
    assert path.read_bytes() == payload and server.requests == [served, served]

    # A corrupted download is rejected (after the retries) and never written to the cache.
    bad = server.put(P.T2I_COMPBENCH, "shape_val.txt", b"junk")
    with pytest.raises(P.ChecksumError, match="shape_val.txt") as err:
        P.fetch_t2i_compbench_file("shape_val.txt")
    assert P.T2I_COMPBENCH_SHA256["shape_val.txt"] in str(err.value)
    assert "The server sent another file" in str(err.value) and "GORS_DATA_DIR" in str(err.value)
    assert server.requests[2:] == [bad] * 4
    assert [p.name for p in path.parent.iterdir()] == ["color_val.txt"]
    assert _isolated == [1, 2, 3]


@needs_shared
def test_transient_failures_are_retried(server: FileServer, _isolated: list[float]) -> None:
    payload = (SHARED / "t2i_compbench" / "texture_val.txt").read_bytes()
    served = server.put(P.T2I_COMPBENCH, "texture_val.txt", payload)
    server.failures = 2  # two 503 answers, then the file
    assert P.fetch_t2i_compbench_file("texture_val.txt").read_bytes() == payload
    assert server.requests == [served] * 3 and _isolated == [1, 2]

    # A server that keeps failing: four attempts, then a DownloadError that names the URL; nothing cached.
    server.failures = 10
    server.put(P.T2I_COMPBENCH, "texture_train.txt", b"never served")
    with pytest.raises(P.DownloadError, match="503") as err:
        P.fetch_t2i_compbench_file("texture_train.txt")
    assert P.t2i_compbench_url("texture_train.txt") in str(err.value)
    assert len(server.requests) == 3 + 4
    assert not (cache_root() / "t2i_compbench" / P.T2I_COMPBENCH_COMMIT / "texture_train.txt").exists()


@needs_shared
def test_offline_a_missing_or_corrupted_file_is_one_error_and_no_request(server: FileServer, monkeypatch,
                                                                         _isolated: list[float]) -> None:
    payload = (SHARED / "t2i_compbench" / "color_val.txt").read_bytes()
    server.put(P.T2I_COMPBENCH, "color_val.txt", payload)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on a compute node after `gors download`
    cached = cache_root() / "t2i_compbench" / P.T2I_COMPBENCH_COMMIT / "color_val.txt"
    with pytest.raises(P.DownloadError) as err:
        P.fetch_t2i_compbench_file("color_val.txt")
    message = str(err.value)
    assert str(cached) in message and "HF_HUB_OFFLINE=1 is set" in message and "`gors download` with the same" in message
    assert "GORS_DATA_DIR" in message and "the path of a prompt file" in message
    assert server.requests == [] and _isolated == []  # no attempt, no waits

    cached.parent.mkdir(parents=True)
    cached.write_bytes(payload)
    assert P.fetch_t2i_compbench_file("color_val.txt") == cached
    cached.write_bytes(payload[:-5])  # corrupted: not fetched again offline, and not used
    with pytest.raises(P.ChecksumError, match="Delete it; HF_HUB_OFFLINE=1 is set: run the command once where there is internet"):
        P.fetch_t2i_compbench_file("color_val.txt")
    assert server.requests == []

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # switched off, as huggingface_hub reads it: downloaded again
    assert P.fetch_t2i_compbench_file("color_val.txt").read_bytes() == payload
    assert len(server.requests) == 1


def test_read_prompt_file_crlf_and_blanks(tmp_path: Path) -> None:
    f = tmp_path / "mine.txt"
    f.write_bytes(b"  a red cube \r\n\r\n\na blue ball\n   \nlast one")
    assert P.read_prompt_file(f) == ["a red cube", "a blue ball", "last one"]
    ps = P.load_prompts(str(f))
    assert (ps.name, ps.category, ps.source) == ("mine", None, str(f))


def test_prompts_are_cut_at_line_feeds_only_and_lose_invisible_characters_at_their_ends(tmp_path: Path) -> None:
    joined = tmp_path / "joined.txt"  # two files saved with a BOM, joined by `cat`; a form feed, U+0085, U+2028
    joined.write_text("\ufeffa red cube\n\ufeffa blue ball\u200b\na cat\x0cnear a dog\x85and\u2028more\u3000\n",
                      encoding="utf-8")  # U+3000: the ideographic space, the highest whitespace character
    assert P.read_prompt_file(joined) == ["a red cube", "a blue ball", "a cat\x0cnear a dog\x85and\u2028more"]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"prompt": "a red cube"}\n\ufeff{"prompt": "a dog\u2028and a cat\u200b"}\n', encoding="utf-8")
    assert P.read_prompt_jsonl(jsonl)[0] == ["a red cube", "a dog\u2028and a cat"]


def test_json_csv_and_yaml_files_are_refused_and_a_capitalised_jsonl_is_json_lines(tmp_path: Path) -> None:
    listed = tmp_path / "prompts.json"
    listed.write_text('[\n "a red circle and a blue square"\n]\n')
    with pytest.raises(ValueError, match=r"prompts.json' is a .json file, which gors would read line by line as "
                                         r"prompts: pass a text file .* or a .jsonl file"):
        P.load_prompts(str(listed))
    for name in ("p.csv", "p.YAML"):
        (tmp_path / name).write_text("prompt\na cat\n")
        with pytest.raises(ValueError, match=rf"{name}' is a "):
            P.load_prompts(str(tmp_path / name))
    upper = tmp_path / "UP.JSONL"
    upper.write_text('{"prompt": "a red circle"}\n')
    assert P.load_prompts(str(upper)).prompts == ["a red circle"]


def test_each_official_file_is_of_the_category_its_name_begins_with() -> None:
    cases = {"non_spatial_val": "non_spatial", "3d_spatial_train": "3d_spatial", "spatial": "spatial",
             "complex_val_spatial": "complex", "color_val_unseen": "color", "new_objects": None, "colour_val": None}
    assert {stem: P.category_of(stem) for stem in cases} == cases


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


def test_an_existing_file_named_with_its_suffix_wins_over_a_benchmark_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("color.txt").write_text("my own prompt\n")
    prompt_set = P.load_prompts("color.txt")  # no download: the file here, not T2I-CompBench's color_train.txt
    assert (prompt_set.prompts, prompt_set.source) == (["my own prompt"], "color.txt")


def test_a_folder_or_non_utf8_prompt_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"Prompt file '{tmp_path}' is a folder"):
        P.load_prompts(str(tmp_path))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("un cube rouge \xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=f"Prompt file '{latin}' is not UTF-8 text"):
        P.load_prompts(str(latin))
    with pytest.raises(ValueError, match="latin.jsonl' is not UTF-8 text"):
        P.load_prompts(str(latin.rename(tmp_path / "latin.jsonl")))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"a red car\nblue\x00cat\n")  # valid UTF-8, yet no text
    with pytest.raises(ValueError, match=r"Prompt file '.*binary.txt' holds a NUL byte \(line 2\): it is a binary "
                                         r"file or UTF-16 text; save it as UTF-8 text$"):
        P.load_prompts(str(binary))


def test_unknown_names() -> None:
    with pytest.raises(FileNotFoundError, match=r"Prompt file 'colour' does not exist \(did you mean 'color'\?\)") as err:
        P.load_prompts("colour")
    assert "color_val" in str(err.value) and "non_spatial" in str(err.value) and "<category>_train.txt" in str(err.value)
    assert str(err.value).endswith("or the toy world's toy:train and toy:held_out.")
    for name in ("t2i_compbench:colour", "t2i_compbench:LICENSE", "t2i_compbench:rows.jsonl"):  # no prompt file of theirs
        with pytest.raises(FileNotFoundError, match="not a T2I-CompBench name"):
            P.load_prompts(name)
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


def test_toy_prompt_sets_are_of_the_toy_category() -> None:
    from gors.core.toy.world import SPLITS

    for split in SPLITS:
        prompt_set = P.load_prompts(f"toy:{split}")
        assert prompt_set.category == P.TOY_CATEGORY == "toy"
        assert prompt_set.info()["category"] == "toy"  # what a store records, and score and select read


def test_recorded_category_of_a_toy_store_from_before_toy_sets_had_one() -> None:
    assert P.recorded_category({"name": "toy:train", "category": None}) == "toy"
    assert P.recorded_category({"name": "toy:train", "category": "color"}) == "color"  # a recorded one stands
    assert P.recorded_category({"name": "toy:fit_square"}) == "toy"
    assert P.recorded_category({"name": "color_train", "category": "color"}) == "color"
    assert P.recorded_category({"name": "my_prompts", "category": None}) is None
    assert P.recorded_category({"name": "toy_prompts", "category": None}) is None  # a file, not the toy world


def test_another_category_is_refused_only_where_it_would_decide_the_reward_or_tau() -> None:
    from types import SimpleNamespace

    given_reward = SimpleNamespace(category="spatial", reward="b_vqa")
    P.check_category(given_reward, "color", "the samples", tau=False)  # scoring: the reward is given, no tau
    with pytest.raises(ValueError, match=r"--category='spatial' .*but the samples are 'color' prompts: spatial's tau "
                                         r"would judge them"):
        P.check_category(given_reward, "color", "the samples")
    P.check_category(SimpleNamespace(category="spatial", reward="b_vqa", select_top_fraction=0.5), "color", "x")


def test_jsonl_prompts_carry_their_rows_as_metadata(tmp_path: Path) -> None:
    rows = [
        {"tag": "counting", "include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}],
         "prompt": "a photo of two cups"},
        {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": " a photo of a red car "},
    ]
    path = tmp_path / "geneval_train.jsonl"
    path.write_text("\ufeff" + json.dumps(rows[0]) + "\r\n\n" + json.dumps(rows[1]) + "\n", encoding="utf-8")
    prompt_set = P.load_prompts(str(path))
    assert prompt_set.prompts == ["a photo of two cups", "a photo of a red car"]
    assert prompt_set.metadata == rows and prompt_set.category is None
    assert (prompt_set.name, prompt_set.source) == ("geneval_train", str(path))
    assert prompt_set.info(1) == {"name": "geneval_train", "category": None, "source": str(path), "metadata": rows[:1]}
    assert "metadata" not in P.PromptSet("x", ["a cat"], None, "x.txt").info()


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a cat"}\n{"prompt": "a dog"\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: not JSON"):
        P.load_prompts(str(path))
    path.write_text('{"prompt": "a cat"}\n\n{"tag": "colors"}\n')
    with pytest.raises(ValueError, match=r"line 3: '\{\"tag\": \"colors\"\}' is not a JSON object with a non-empty"):
        P.load_prompts(str(path))
    path.write_text('["a cat"]\n')
    with pytest.raises(ValueError, match="line 1"):
        P.load_prompts(str(path))
    path.write_text("\n \n")
    with pytest.raises(ValueError, match="contains no prompts"):
        P.load_prompts(str(path))
    with pytest.raises(FileNotFoundError, match="nope.jsonl.*one JSON object per line"):
        P.load_prompts(str(tmp_path / "nope.jsonl"))


def test_a_benchmark_name_with_its_txt_suffix_is_the_benchmarks_file():
    # `color_val.txt` (no such file here) and `color.txt` name T2I-CompBench's files, as `color_val` and `color` do.
    assert P._resolve_name("color_val.txt", "train") == "color_val"
    assert P._resolve_name("color.txt", "val") == "color_val"
    assert P._resolve_name("colour.txt", "val") is None


def test_a_jsonl_prompt_of_whitespace_only_is_refused(tmp_path):
    # It would be an empty prompt once read (`clean_prompt`): refused with its line, as a missing prompt is.
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a cat"}\n{"prompt": " \\u200b "}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"prompts.jsonl, line 2: .* is not a JSON object with a non-empty 'prompt'"):
        P.read_prompt_jsonl(path)


def test_a_benchmark_name_wins_over_a_same_named_file_here_unless_written_as_a_path(tmp_path, monkeypatch):
    bench = tmp_path / "bench" / "color_val.txt"
    bench.parent.mkdir()
    bench.write_text("a green bench\n", encoding="utf-8")
    monkeypatch.setattr(P, "fetch_t2i_compbench_file", lambda filename: bench)
    monkeypatch.chdir(tmp_path)
    Path("color_val").write_text("my own prompt\n", encoding="utf-8")  # a file named like the benchmark's stem
    assert P.load_prompts("color_val").prompts == ["a green bench"]
    assert P.load_prompts("./color_val").prompts == ["my own prompt"]
    assert P.load_prompts("./color_val").category is None  # one's own file: not the benchmark's, nor its category


DEMO_BYTES = b"one prompt\n"
DEMO = PinnedSource(name="demo", repository="someone/prompts", commit="c" * 40, folder="data/",
                    sha256={"demo.txt": sha256_of(DEMO_BYTES), "short.txt": sha256_of(DEMO_BYTES)[:8]})


def test_a_pin_matches_in_either_case_and_only_as_a_prefix_of_eight_digits_or_more() -> None:
    """A sha256 pin matches a digest whole or by a prefix of 8+ hex digits, ignoring case; shorter pins never match."""
    digest = sha256_of(DEMO_BYTES)
    assert sha256_matches(digest, digest) and sha256_matches(digest, digest.upper())
    assert sha256_matches(digest, digest[:8]) and sha256_matches(digest, digest[:8].upper())
    assert not sha256_matches(digest, digest[:7]) and not sha256_matches(digest, "")
    assert not sha256_matches(digest, sha256_of(b"another file")[:8])


def test_a_checksum_error_names_the_pinned_commit_and_marks_only_a_prefix_pin_as_one(monkeypatch, tmp_path) -> None:
    """A corrupted file's error names the repository and commit it must come from; '...' follows only a prefix pin."""
    (tmp_path / "demo.txt").write_bytes(b"edited\n")
    (tmp_path / "short.txt").write_bytes(b"edited\n")
    monkeypatch.setenv("GORS_DATA_DIR", str(tmp_path))
    with pytest.raises(P.ChecksumError) as whole:
        fetch_pinned_file(DEMO, "demo.txt")
    assert f"expected {DEMO.sha256['demo.txt']}: " in str(whole.value)
    assert f"not from someone/prompts commit {'c' * 40}" in str(whole.value)
    with pytest.raises(P.ChecksumError) as prefix:
        fetch_pinned_file(DEMO, "short.txt")
    assert f"expected {DEMO.sha256['short.txt']}...: " in str(prefix.value)


def test_an_empty_gors_data_dir_counts_as_unset(monkeypatch) -> None:
    """GORS_DATA_DIR set to an empty string is ignored: the file comes from the cache, as without it."""
    cached = cache_root() / "demo" / DEMO.commit / "demo.txt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(DEMO_BYTES)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cached copy, with no request
    monkeypatch.setenv("GORS_DATA_DIR", "")
    assert fetch_pinned_file(DEMO, "demo.txt") == cached


def test_a_cache_dir_given_with_a_tilde_is_under_the_home_folder(monkeypatch, tmp_path) -> None:
    """GORS_CACHE_DIR=~/... is expanded to the home folder, not taken as a folder named '~'."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GORS_CACHE_DIR", "~/gors-cache")
    assert cache_root() == tmp_path / "gors-cache"
