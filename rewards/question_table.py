"""Question tables: each prompt's B-VQA questions, made once by a named parser and read anywhere.

A table made where the official parser is installed (spaCy 3.5.3 with en_core_web_sm 3.5.0, see
`rewards.noun_phrases.OFFICIAL_INSTALL`) gives B-VQA the official questions on any machine, without
spaCy at run time: ``b_vqa`` (and ``three_in_one``) take ``questions=TABLE.json``. The file is UTF-8
JSON:

    {"format": "gors-question-table", "format_version": 1,
     "parser": {"name": "spacy", "version": "3.5.3", "model": "en_core_web_sm", "model_version": "3.5.0"},
     "questions": {"a green bench and a red car": ["a green bench?", "a red car?"], ...}}

`parser` is the record of `rewards.noun_phrases.parser_record` (the built-in chunker's is
``{"name": "builtin", "version": ...}``). Keys of `questions` are prompts without surrounding
whitespace; each list holds all of the prompt's questions in order, after the official filter of
`EXCLUDED_PHRASES` and before the cap of 8 questions, which B-VQA applies (`max_questions`). A table
is identified by its sha256: the hash of its canonical JSON (sorted keys, no spaces, UTF-8), so
re-indenting the file keeps it.

Every B-VQA detail row names where its questions came from (`question_source`), and
`question_provenance` sums those records over a run for its summary.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gors.core.io import atomic_write_bytes
from rewards.noun_phrases import Backend, parser_record, vqa_questions

FORMAT = "gors-question-table"
FORMAT_VERSION = 1
_HOW_TO_MAKE = "make one with `gors questions PROMPTS OUT.json`"


def canonical_sha256(content: Mapping[str, Any]) -> str:
    """sha256 hex digest of `content` as canonical JSON (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class QuestionTable:
    """A loaded question table (see the module docstring).

    Attributes:
        parser: the record of the parser that made the questions.
        questions: stripped prompt -> its questions, in order, uncapped.
        sha256: `canonical_sha256` of the file's content.
        path: where it was read from.
    """

    parser: Mapping[str, str]
    questions: Mapping[str, tuple[str, ...]]
    sha256: str
    path: Path

    def lookup(self, prompt: str) -> list[str] | None:
        """The questions of `prompt` (surrounding whitespace ignored), or None when the table lacks it."""
        found = self.questions.get(prompt.strip())
        return None if found is None else list(found)

    def source(self) -> dict[str, Any]:
        """The `question_source` record of a B-VQA row whose questions come from this table."""
        return {"source": "table", "table_sha256": self.sha256, "parser": dict(self.parser)}

    def __len__(self) -> int:
        return len(self.questions)


def make_question_table(prompts: Iterable[str], backend: Backend = "auto") -> dict[str, Any]:
    """The content of a question table of `prompts` (duplicates kept once) asked by `backend`'s parser.

    Raises ValueError when `prompts` holds no non-blank prompt, and as `parser_record` does for a
    backend that cannot run here (before any prompt is parsed).
    """
    parser = parser_record(backend)
    keys = list(dict.fromkeys(p.strip() for p in prompts if p.strip()))
    if not keys:
        raise ValueError("no prompts to make a question table of (every prompt is blank)")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "parser": parser,
        "questions": {key: vqa_questions(key, None, backend) for key in keys},
    }


def write_question_table(path: str | os.PathLike[str], content: Mapping[str, Any]) -> str:
    """Write `content` (checked as `load_question_table` checks it) atomically; returns its sha256."""
    _check_content(content, Path(path))
    text = json.dumps(content, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    return canonical_sha256(content)


def load_question_table(path: str | os.PathLike[str]) -> QuestionTable:
    """Read and check a question table.

    Raises FileNotFoundError for a missing file and ValueError for a file that is not valid
    UTF-8 JSON, not a question table of this format version, or one whose parser record or
    questions are malformed or empty; each message names the file and the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"question table {str(path)!r} does not exist; {_HOW_TO_MAKE}")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"question table {path} is not UTF-8 JSON ({err}); {_HOW_TO_MAKE}") from err
    _check_content(content, path)
    return QuestionTable(
        parser=dict(content["parser"]),
        questions={prompt: tuple(qs) for prompt, qs in content["questions"].items()},
        sha256=canonical_sha256(content),
        path=path,
    )


def _check_content(content: Any, path: Path) -> None:
    def bad(problem: str) -> ValueError:
        return ValueError(f"question table {path}: {problem}; {_HOW_TO_MAKE}")

    if not isinstance(content, Mapping) or content.get("format") != FORMAT:
        raise bad(f'not a gors question table (no "format": "{FORMAT}")')
    if content.get("format_version") != FORMAT_VERSION:
        raise bad(f"format_version {content.get('format_version')!r}; this gors reads {FORMAT_VERSION}")
    parser = content.get("parser")
    if (
        not isinstance(parser, Mapping)
        or not all(isinstance(parser.get(key), str) and parser[key] for key in ("name", "version"))
        or not all(isinstance(value, str) for value in parser.values())
    ):
        raise bad(f'"parser" must map "name", "version" (and e.g. "model") to strings, got {parser!r}')
    questions = content.get("questions")
    if not isinstance(questions, Mapping):
        raise bad(f'"questions" must map each prompt to its list of questions, got {type(questions).__name__}')
    if not questions:
        raise bad('"questions" is empty')
    for prompt, asked in questions.items():
        if not prompt.strip() or prompt != prompt.strip():
            raise bad(f"prompt {prompt!r} is blank or has surrounding whitespace")
        if not isinstance(asked, list) or not all(isinstance(q, str) and q.endswith("?") and q[:-1] for q in asked):
            raise bad(f'the questions of {prompt!r} must be a list of "<phrase>?" strings, got {asked!r}')


def question_source(details: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The `question_source` record of a B-VQA detail row, or of the B-VQA term of a 3-in-1 row."""
    if "question_source" in details:
        return details["question_source"]
    attribute = details.get("attribute")
    if isinstance(attribute, Mapping):
        return attribute.get("details", {}).get("question_source")
    return None


def question_provenance(details: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each distinct question source of a run's B-VQA (or 3-in-1) detail rows, with its row count.

    Returns ``[{"source": "table"|"parser", "parser": {...}, ["table_sha256": ...,] "images": n}, ...]``,
    most rows first; rows without a record (made before gors recorded it) count as
    ``{"source": "unknown"}``. An empty list for no rows.
    """
    counts: Counter[str] = Counter()
    for row in details:
        record = question_source(row) or {"source": "unknown"}
        counts[json.dumps(record, sort_keys=True)] += 1
    return [{**json.loads(key), "images": n} for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
