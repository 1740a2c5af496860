"""Question tables, their provenance records, the known built-in/spaCy differences and `gors questions`."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

import gors.core.logs
import rewards.noun_phrases as np_module
import rewards.question_differences as differences
from gors.questions import main as questions_main
from rewards.noun_phrases import BUILTIN_PARSER_VERSION, OFFICIAL_INSTALL, OFFICIAL_PARSER, builtin_noun_phrases
from rewards.question_differences import (
    KNOWN_DIFFERENCES,
    KnownDifference,
    builtin_differences,
    unofficial_questions_message,
    warn_unofficial_questions,
)
from rewards.question_table import (
    FORMAT,
    canonical_sha256,
    load_question_table,
    make_question_table,
    question_provenance,
    write_question_table,
)

COMPBENCH = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "t2i_compbench"
needs_benchmarks = pytest.mark.skipif(not COMPBENCH.is_dir(), reason=f"{COMPBENCH} not found")
BUILTIN = {"name": "builtin", "version": BUILTIN_PARSER_VERSION}
SPACY_38 = {"name": "spacy", "version": "3.8.7", "model": "en_core_web_sm", "model_version": "3.8.0"}


@pytest.fixture(autouse=True)
def no_spacy(monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" means the built-in chunker here, whether or not spaCy's model is installed."""
    monkeypatch.setattr(np_module, "_spacy_pipeline", lambda: None)


def table(questions: dict, parser: dict | None = None) -> dict:
    return {"format": FORMAT, "format_version": 1, "parser": parser or dict(BUILTIN), "questions": questions}


def test_round_trip_with_the_builtin_parser(tmp_path: Path) -> None:
    animals = ["cat", "dog", "cow", "pig", "fox", "owl", "bee", "ant", "eel", "yak"]
    many = ", ".join(f"a {a}" for a in animals[:-1]) + f" and a {animals[-1]}"
    prompts = ["a green bench and a red car\r\n", "  a horse on the right of a man", many, "a green bench and a red car"]
    content = make_question_table(prompts)
    assert content["parser"] == BUILTIN
    assert content["questions"] == {
        "a green bench and a red car": ["a green bench?", "a red car?"],
        "a horse on the right of a man": ["a horse?", "a man?"],  # "the right" filtered as officially
        many: [f"a {a}?" for a in animals],  # uncapped: B-VQA applies its max_questions
    }
    path = tmp_path / "sub" / "questions.json"
    sha256 = write_question_table(path, content)
    loaded = load_question_table(path)
    assert loaded.sha256 == sha256 == canonical_sha256(json.loads(path.read_text(encoding="utf-8")))
    assert loaded.parser == BUILTIN and len(loaded) == 3
    assert loaded.lookup(" a green bench and a red car\n") == ["a green bench?", "a red car?"]
    assert loaded.lookup("a blue cat") is None
    assert loaded.source() == {"source": "table", "table_sha256": sha256, "parser": BUILTIN}
    # The hash is of the content, not of the file's layout; another question is another table.
    path.write_text(json.dumps(content), encoding="utf-8")
    assert load_question_table(path).sha256 == sha256
    content["questions"]["a green bench and a red car"] = ["a green bench?"]
    assert write_question_table(path, content) != sha256
    assert not list(path.parent.glob(".*.tmp"))  # written through a temporary file, which is gone


def test_make_refuses_blank_prompts_and_a_missing_parser() -> None:
    with pytest.raises(ValueError, match="blank"):
        make_question_table(["", "  \r\n"])
    with pytest.raises(ImportError, match="spacy==3.5.3"):
        make_question_table(["a red car"], backend="spacy")
    with pytest.raises(ValueError, match="backend"):
        make_question_table(["a red car"], backend="nltk")  # type: ignore[arg-type]


BAD_TABLES = {
    "not a table": ([1, 2], "not a gors question table"),
    "other format": ({**table({"a cat": ["a cat?"]}), "format": "vqa"}, "not a gors question table"),
    "future version": ({**table({"a cat": ["a cat?"]}), "format_version": 2}, "format_version 2"),
    "empty": (table({}), '"questions" is empty'),
    "questions a list": ({**table({}), "questions": ["a cat?"]}, '"questions" must map'),
    "no parser version": (table({"a cat": ["a cat?"]}, {"name": "spacy"}), '"parser" must map'),
    "parser not strings": (table({"a cat": ["a cat?"]}, {"name": "spacy", "version": 3.5}), '"parser" must map'),
    "questions a string": (table({"a cat": "a cat?"}), "the questions of 'a cat'"),
    "question without ?": (table({"a cat": ["a cat"]}), "the questions of 'a cat'"),
    "empty question": (table({"a cat": ["?"]}), "the questions of 'a cat'"),
    "untrimmed prompt": (table({"a cat ": ["a cat?"]}), "surrounding whitespace"),
    "no format version": ({k: v for k, v in table({"a cat": ["a cat?"]}).items() if k != "format_version"},
                          "format_version None"),
    "empty parser name": (table({"a cat": ["a cat?"]}, {"name": "", "version": "1"}), '"parser" must map'),
    "parser model not a string": (
        table({"a cat": ["a cat?"]}, {"name": "spacy", "version": "3.5.3", "model_version": 3}), '"parser" must map'
    ),
    "empty prompt": (table({"": ["a cat?"]}), "blank or has surrounding whitespace"),
    "questions a mapping": (table({"a cat": {"a cat?": 1}}), "the questions of 'a cat'"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_tables_are_refused_at_load(tmp_path: Path, case: str) -> None:
    content, message = BAD_TABLES[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(ValueError, match="gors questions") as err:
        load_question_table(path)
    assert message in str(err.value) and str(path) in str(err.value)
    if isinstance(content, dict):
        with pytest.raises(ValueError, match="gors questions"):
            write_question_table(tmp_path / "out.json", content)
        assert not (tmp_path / "out.json").exists()


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="gors questions"):
        load_question_table(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "gors-question-table", ', encoding="utf-8")
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        load_question_table(broken)
    broken.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        load_question_table(broken)


def test_provenance_counts_rows_by_source() -> None:
    from_table = {"source": "table", "table_sha256": "ab" * 32, "parser": dict(OFFICIAL_PARSER)}
    from_parser = {"source": "parser", "parser": dict(BUILTIN)}
    rows = [
        {"questions": [], "question_source": from_table},
        {"questions": [], "question_source": from_parser},
        {"questions": [], "question_source": from_table},
        {"kind": "all", "attribute": {"score": 0.5, "details": {"question_source": from_parser}}},  # 3-in-1
        {"kind": "all", "attribute": {"score": 0.5, "details": {"question_source": from_parser}}},
        {"questions": []},  # a row scored before sources were recorded
    ]
    assert question_provenance(rows) == [
        {**from_parser, "images": 3},
        {**from_table, "images": 2},
        {"source": "unknown", "images": 1},
    ]
    assert question_provenance([]) == []


def test_known_differences_are_pinned() -> None:
    # Only the two prompts issue #15 quotes, with what it reports of spaCy 3.8's questions.
    assert KNOWN_DIFFERENCES == {
        "color": (
            KnownDifference("a red apple and yellow bananas", None, 1, differences._ISSUE_15),
            KnownDifference("a green acorn and a brown leaf", ("a brown leaf?",), 1, differences._ISSUE_15),
        ),
        "shape": (),
        "texture": (),
        "complex": (),
    }
    assert {c: builtin_differences(c) for c in KNOWN_DIFFERENCES} == {"color": 2, "shape": 0, "texture": 0,
                                                                     "complex": 0}
    with pytest.raises(ValueError, match="B-VQA scores only"):
        builtin_differences("spatial")
    # The issue's totals from spaCy 3.8 (prompts not listed there), for every B-VQA category.
    assert differences.REPORTED_TOTALS == {"color": 22, "shape": 21, "texture": 34, "complex": 31}
    assert set(differences.REPORTED_TOTALS) == set(KNOWN_DIFFERENCES)


def test_builtin_chunker_still_differs_on_the_known_prompts() -> None:
    """Were the chunker changed to ask as spaCy does, the entry would be stale: this test says so."""
    expected = {
        "a red apple and yellow bananas": ["a red apple", "yellow bananas"],
        "a green acorn and a brown leaf": ["a green acorn", "a brown leaf"],
    }
    for known in (k for entries in KNOWN_DIFFERENCES.values() for k in entries):
        phrases = builtin_noun_phrases(known.prompt)
        assert phrases == expected[known.prompt]
        assert len(phrases) != known.spacy_question_count
        if known.spacy_questions is not None:
            assert len(known.spacy_questions) == known.spacy_question_count
            assert [f"{p}?" for p in phrases] != list(known.spacy_questions)


@needs_benchmarks
def test_known_prompts_are_val_prompts_of_their_category() -> None:
    for category, entries in KNOWN_DIFFERENCES.items():
        lines = {line.strip() for line in (COMPBENCH / f"{category}_val.txt").read_text(encoding="utf-8").splitlines()}
        assert all(known.prompt in lines for known in entries), category


def test_warning_text() -> None:
    official = [{"source": "table", "table_sha256": "ab" * 32, "parser": dict(OFFICIAL_PARSER), "images": 3000}]
    assert unofficial_questions_message("color", official) is None
    assert unofficial_questions_message("color", []) is None

    builtin = unofficial_questions_message("color", [{"source": "parser", "parser": dict(BUILTIN), "images": 3000}])
    assert builtin is not None
    assert "t2i_compbench:color" in builtin and "3000 of 3000 images by the built-in chunker" in builtin
    assert "known to ask differently on 2 of this category's val prompts (a lower bound" in builtin
    assert "it differs on 22 of the 300 val prompts" in builtin
    assert OFFICIAL_INSTALL in builtin and "gors questions color_val" in builtin
    shape = unofficial_questions_message("shape", [{"source": "parser", "parser": dict(BUILTIN), "images": 10}])
    assert shape is not None and "No difference of the built-in chunker is listed for this category" in shape
    assert "it differs on 21 of the 300 val prompts" in shape
    assert """--scorer_options '{"t2i_compbench:shape": {"questions": "questions.json"}}'""" in shape

    mixed = unofficial_questions_message("texture", [
        {**official[0], "images": 2990},
        {"source": "table", "table_sha256": "cd" * 32, "parser": SPACY_38, "images": 10},
    ])
    assert mixed is not None
    assert "10 of 3000 images by spaCy 3.8.7 with en_core_web_sm 3.8.0 (table cdcdcdcdcdcd)" in mixed
    assert "built-in chunker is known" not in mixed and "it differs on" not in mixed


def test_warning_is_logged_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gors.core.logs, "_said", set())  # each warning said anew
    provenance = [{"source": "parser", "parser": dict(BUILTIN), "images": 20}]
    with caplog.at_level(logging.WARNING, logger=differences.__name__):
        first = warn_unofficial_questions("complex", provenance)
        again = warn_unofficial_questions("complex", provenance)
        other = warn_unofficial_questions("shape", provenance)
    assert first == again and first is not None and other is not None
    assert [r.getMessage() for r in caplog.records] == [first, other]


def test_questions_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a green bench and a red car\r\na balloon on the top of a giraffe\r\n", encoding="utf-8")
    out = tmp_path / "questions.json"
    questions_main([str(prompts), str(out), "--noun_phrase_backend", "builtin"])
    loaded = load_question_table(out)
    assert dict(loaded.questions) == {
        "a green bench and a red car": ("a green bench?", "a red car?"),
        "a balloon on the top of a giraffe": ("a balloon?", "the top?", "a giraffe?"),
    }
    printed = capsys.readouterr().out
    assert f"Wrote {out}: the questions of 2 prompt(s) (sha256 {loaded.sha256}; parser: name builtin" in printed
    # The evaluator asks about the text before a tab (as the official script reads a line): the table's key too.
    tabbed = tmp_path / "tabbed.txt"
    tabbed.write_text("a green bench and a red car\tcolor\n", encoding="utf-8")
    questions_main([str(tabbed), str(tmp_path / "tabbed.json"), "--noun_phrase_backend", "builtin"])
    assert list(load_question_table(tmp_path / "tabbed.json").questions) == ["a green bench and a red car"]
    assert "Not the official T2I-CompBench parser" in printed and OFFICIAL_INSTALL in printed
    with pytest.raises(SystemExit, match="en_core_web_sm"):
        questions_main([str(prompts), str(tmp_path / "spacy.json"), "--noun_phrase_backend", "spacy"])
    assert not (tmp_path / "spacy.json").exists()
    with pytest.raises(SystemExit, match="noun_phrase_backend"):
        questions_main([str(prompts), str(out), "--noun_phrase_backend", "nltk"])
    with pytest.raises(SystemExit, match=r"--split .test.; choose one of train, .*val_spatial, "):  # was "'color' does not exist"
        questions_main(["color", str(out), "--split", "test"])


def test_questions_config_refuses_an_unknown_backend_and_defaults_to_auto(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import gors.questions
    from gors.questions import QuestionsConfig

    # Built in Python (not through the command line, whose choices argparse checks), a backend is checked too.
    with pytest.raises(ValueError, match=r"--noun_phrase_backend='nltk'; choose one of "):
        QuestionsConfig(prompts="color", output=str(tmp_path / "q.json"), noun_phrase_backend="nltk")
    # Without the flag the official parser is used where it is installed (auto), not gors' chunker outright.
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a green bench and a red car\n", encoding="utf-8")
    backends = []
    monkeypatch.setattr(gors.questions, "make_question_table",
                        lambda texts, backend: backends.append(backend) or make_question_table(texts, "builtin"))
    questions_main([str(prompts), str(tmp_path / "q.json")])
    assert backends == ["auto"] and len(load_question_table(tmp_path / "q.json")) == 1


@needs_benchmarks
def test_questions_command_on_a_category(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GORS_DATA_DIR", str(COMPBENCH))
    out = tmp_path / "color.json"
    questions_main(["color", str(out)])  # a category name means its val file here
    loaded = load_question_table(out)
    assert len(loaded) == 300 and loaded.parser == BUILTIN
    assert loaded.lookup("a green acorn and a brown leaf") == ["a green acorn?", "a brown leaf?"]


def test_the_hash_is_of_sorted_compact_utf8_json() -> None:
    """`canonical_sha256` hashes sorted keys, no spaces and raw UTF-8 (not \\u escapes): a table keeps its id."""
    content = {"questions": {"un café rouge": ["un café?"]}, "format": FORMAT}
    canonical = '{"format":"gors-question-table","questions":{"un café rouge":["un café?"]}}'
    assert canonical_sha256(content) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def test_lookup_keeps_the_prompts_case_and_provenance_ignores_key_order(tmp_path: Path) -> None:
    """Prompts are looked up as written (case kept), and equal source records count as one whatever their key order."""
    path = tmp_path / "questions.json"
    write_question_table(path, table({"A Red Car": ["A Red Car?"]}))
    loaded = load_question_table(path)
    assert loaded.lookup("A Red Car") == ["A Red Car?"] and loaded.lookup("a red car") is None
    source = loaded.source()
    reordered = dict(reversed(list(source.items())))
    assert question_provenance([{"question_source": source}, {"question_source": reordered}]) == [
        {**source, "images": 2}
    ]
