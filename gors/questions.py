"""`gors questions PROMPTS OUT.json`: a table of each prompt's B-VQA questions, for B-VQA anywhere.

Run it where the official parser is installed (`rewards.noun_phrases.OFFICIAL_INSTALL`) with
``--noun_phrase_backend spacy`` and the table carries T2I-CompBench's official questions: B-VQA and
3-in-1 then take ``questions=OUT.json`` on any machine, without spaCy. The table records the
parser's name and version; its format is described in `rewards.question_table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gors.cli import parse_config
from gors.config import check_values
from gors.core.paper import ALL_CATEGORIES
from gors.core.prompts import PROMPT_FILE_STEMS, load_prompts
from rewards.noun_phrases import BACKENDS, OFFICIAL_INSTALL, Backend, is_official_parser
from rewards.question_table import load_question_table, make_question_table, write_question_table


@dataclass
class QuestionsConfig:
    """Write the B-VQA questions of a prompt set, with the parser that made them, to a question table
    (JSON) for the b_vqa / three_in_one option questions=OUT.json."""

    prompts: str = field(metadata={
        "positional": True, "metavar": "PROMPTS",
        "help": "A T2I-CompBench category (its file of --split), file stem (color_val, complex_val) or a text "
        "file with one prompt per line.",
    })
    output: str = field(metadata={"positional": True, "metavar": "OUT.json", "help": "The table to write."})
    noun_phrase_backend: str = field(default="auto", metadata={
        "help": "spacy (spaCy's en_core_web_sm; the official parser is spaCy 3.5.3 with en_core_web_sm 3.5.0), "
        "builtin (gors' chunker) or auto (spaCy when installed, else builtin).",
        "choices": list(BACKENDS),
    })
    split: str = field(default="val", metadata={"help": "The split of a category name (val or train)."})

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        splits = sorted({stem[len(category) + 1:] for stem in PROMPT_FILE_STEMS for category in ALL_CATEGORIES
                         if stem.startswith(f"{category}_")})
        if self.split not in splits:  # else a category name was reported as a missing file
            raise ValueError(f"--split {self.split!r}; choose one of {', '.join(splits)} (T2I-CompBench's file "
                             "<category>_<split>.txt)")


def write_questions(config: QuestionsConfig) -> str:
    """Make and write the table of `config`; returns its sha256 (see `rewards.question_table`)."""
    backend: Backend = config.noun_phrase_backend  # type: ignore[assignment]  # checked in __post_init__
    prompt_set = load_prompts(config.prompts, config.split)
    # The T2I-CompBench evaluator keeps the text before a tab; the table's keys must be what B-VQA sees.
    content = make_question_table((p.split("\t")[0] for p in prompt_set.prompts), backend)
    return write_question_table(Path(config.output), content)


def questions_command(config: QuestionsConfig) -> None:
    """`gors questions PROMPTS OUT.json`: write the table and say which parser made it."""
    try:
        sha256 = write_questions(config)
    except ImportError as err:  # --noun_phrase_backend spacy without spaCy's model
        raise SystemExit(f"error: {err}") from err
    table = load_question_table(config.output)
    parser = ", ".join(f"{key} {value}" for key, value in table.parser.items())
    print(f"Wrote {config.output}: the questions of {len(table)} prompt(s) (sha256 {sha256}; parser: {parser}).")
    if not is_official_parser(table.parser):
        print(f"Not the official T2I-CompBench parser; for it: {OFFICIAL_INSTALL}, then --noun_phrase_backend spacy.")


def main(argv: Sequence[str] | None = None) -> None:
    """`gors questions PROMPTS OUT.json [--noun_phrase_backend spacy|builtin|auto] [--split val]`."""
    questions_command(parse_config(QuestionsConfig, argv, prog="gors questions"))
