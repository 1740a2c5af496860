"""Noun phrases and B-VQA questions, checked against the structure of T2I-CompBench's prompts."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import rewards.noun_phrases as np_module
from rewards.noun_phrases import builtin_noun_phrases, noun_phrases, vqa_questions

BENCHMARKS = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"
COMPBENCH = BENCHMARKS / "t2i_compbench"
ATTRIBUTE_FILES = [
    f"{c}_{split}.txt" for c in ("color", "shape", "texture") for split in ("train", "val")
]
needs_benchmarks = pytest.mark.skipif(not COMPBENCH.is_dir(), reason=f"{COMPBENCH} not found")


def read_prompts(name: str) -> list[str]:
    # The files have CRLF endings; splitlines() drops them, noun_phrases() must cope with either.
    return (COMPBENCH / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture
def no_spacy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the "auto" backend take the built-in chunker even where spaCy is installed."""
    monkeypatch.setattr(np_module, "_spacy_pipeline", lambda: None)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a green bench and a red car", ["a green bench", "a red car"]),
        ("rubber gloves and a fluffy teddy bear", ["rubber gloves", "a fluffy teddy bear"]),
        (
            "a triangular slice of pizza and a cylindrical pizza cutter",
            ["a triangular slice", "pizza", "a cylindrical pizza cutter"],
        ),
        ("a balloon on the top of a giraffe", ["a balloon", "the top", "a giraffe"]),
        ("a bee on side of a backpack", ["a bee", "side", "a backpack"]),
        ("a fish in front of a suitcase", ["a fish", "front", "a suitcase"]),
        ("a horse hidden by a television", ["a horse", "a television"]),
        ("an oval sink and a rectangular mirror.", ["an oval sink", "a rectangular mirror"]),
        (
            "a cubic block and a cylindrical can of soup",
            ["a cubic block", "a cylindrical can", "soup"],
        ),
        (
            "a rectangular mirror and a teardrop magnifying mirror",
            ["a rectangular mirror", "a teardrop magnifying mirror"],
        ),
        ("a yellow post-it and a blue clipboard", ["a yellow post-it", "a blue clipboard"]),
        ("a green bench and a red car\r\n", ["a green bench", "a red car"]),
    ],
)
def test_builtin_chunker_on_template_prompts(prompt: str, expected: list[str]) -> None:
    assert builtin_noun_phrases(prompt) == expected


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("A black cat is sitting on a white toilet.", ["A black cat", "a white toilet"]),
        ("A brown purse is sitting on a green bench.", ["A brown purse", "a green bench"]),
        (
            "The wooden spoon and glass jar stir the metallic honey on the fabric tablecloth.",
            ["The wooden spoon", "glass jar", "the metallic honey", "the fabric tablecloth"],
        ),
        ("A fluffy cat lounges on the leather sofa.", ["A fluffy cat", "the leather sofa"]),
        ("six dogs played fetch in the park", ["six dogs", "fetch", "the park"]),
        (
            "A black and green tile bathroom with a black toilet and a yellow bucket on the floor.",
            ["A black and green tile bathroom", "a black toilet", "a yellow bucket", "the floor"],
        ),
        ("The plump, juicy grapes hung low on the vine.", ["The plump, juicy grapes", "the vine"]),
        (
            "A child is playing with a kite and trying to beat their record.",
            ["A child", "a kite", "their record"],
        ),
        ("The sky is blue and the grass is green.", ["The sky", "the grass"]),
        ("It's a cat's toy", ["It", "a cat's toy"]),
    ],
)
def test_builtin_chunker_on_sentences(prompt: str, expected: list[str]) -> None:
    # Free-form sentences are only approximately chunked; these are the cases it must get right.
    assert builtin_noun_phrases(prompt) == expected


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        # Adjectives joined by "and" / "or" / a comma stay with their noun; a comma after a whole chunk ends it.
        ("a black or white cat", ["a black or white cat"]),
        ("a graceful and tall swan", ["a graceful and tall swan"]),
        ("an active and shiny dog", ["an active and shiny dog"]),
        ("a jellyfish with long, trailing tentacles", ["a jellyfish", "long, trailing tentacles"]),
        ("a red barn, wooden fences and a tractor", ["a red barn", "wooden fences", "a tractor"]),
        ("The dog, tail high", ["The dog", "tail"]),
        ("The sign is triangular.", ["The sign"]),
        ("a big burly man", ["a big burly man"]),
        ("two cats in dimly lit rooms", ["two cats", "dimly lit rooms"]),
        # Words that look like verb forms but are nouns or modifiers here.
        ("a cat on the back seat", ["a cat", "the back seat"]),
        ("a desert cactus on the table", ["a desert cactus", "the table"]),
        ("a dragon-fly and a frog", ["a dragon-fly", "a frog"]),
        ("a gift to swimmers", ["a gift", "swimmers"]),
        ("one music stand on the stage", ["one music stand", "the stage"]),
        ("a dog's bones near the bowl", ["a dog's bones", "the bowl"]),
        # Verbs: after a subject, a pronoun, an adverb, "for" or a relative "that".
        ("A frog hops on the lily pad", ["A frog", "the lily pad"]),
        ("it sat on the mat", ["it", "the mat"]),
        ("The dogs never played fetch", ["The dogs", "fetch"]),
        ("The cats were all sleeping on the sofa", ["The cats", "the sofa"]),
        ("a ladder for reaching high places", ["a ladder", "high places"]),
        ("everything that the dog ate", ["everything", "the dog"]),
        # Contractions, with straight or curly apostrophes.
        ("they'll paint the red car", ["they", "the red car"]),
        ("The dog doesn\u2019t like the cat", ["The dog", "the cat"]),
        ("It\u2019s a cat\u2019s toy", ["It", "a cat\u2019s toy"]),
    ],
)
def test_builtin_chunker_rules(prompt: str, expected: list[str]) -> None:
    """One prompt per rule of the built-in chunker (word lists, suffixes, positional rules)."""
    assert builtin_noun_phrases(prompt) == expected


@pytest.mark.parametrize("prompt", ["", "   ", "...", "and and and", "is very blue", "a the"])
def test_no_noun_phrase(prompt: str) -> None:
    assert builtin_noun_phrases(prompt) == []


def template_phrases(prompt: str) -> list[str] | None:
    """The phrases a template prompt is built from, or None for a line that is no template.

    Templates are "<A> and <B>" where each side is "[a|an] words" or "[a|an] words of words",
    starting in lower case; spaCy chunks them at "and" and at "of".
    """
    text = prompt.strip().removesuffix(".")
    if not re.fullmatch(r"[a-z][\w' -]*", text) or text.count(" and ") != 1:
        return None
    phrases = [p for side in text.split(" and ") for p in side.split(" of ")]
    word = r"[^\W\d_][\w'-]*"
    stop = r"(?!(?:a|an|the|on|in|with|to|near|by|is|are)\b)"
    side = re.compile(rf"(?:an? )?{stop}{word}(?: {stop}{word})*")
    if not all(side.fullmatch(p) for p in phrases):
        return None
    return phrases


@needs_benchmarks
@pytest.mark.parametrize("name", ATTRIBUTE_FILES)
def test_attribute_templates_give_their_phrases(name: str) -> None:
    prompts = read_prompts(name)
    templates = [(p, template_phrases(p)) for p in prompts]
    templates = [(p, t) for p, t in templates if t is not None]
    # The first 560 training lines (240 validation lines) are templates: the filter must see them.
    assert len(templates) >= (560 if name.endswith("train.txt") else 240), name
    wrong = [(p, builtin_noun_phrases(p), t) for p, t in templates if builtin_noun_phrases(p) != t]
    assert wrong == []
    # The two-phrase templates with "of" split into three questions, as spaCy's chunks do.
    assert any(len(t) == 3 for _, t in templates) == name.startswith("shape")


@needs_benchmarks
@pytest.mark.parametrize("name", ["spatial_train.txt", "spatial_val.txt"])
def test_spatial_templates(name: str, no_spacy: None) -> None:
    pattern = re.compile(
        r"(an? \w+) (?:on (the top|the bottom|the left|the right|side) of|next to|near) (an? \w+)"
    )
    prompts = read_prompts(name)
    seen = 0
    for prompt in prompts:
        match = pattern.fullmatch(prompt.strip())
        if match is None:
            continue
        seen += 1
        first, relation, second = match.groups()
        expected = [first] + ([relation] if relation else []) + [second]
        assert noun_phrases(prompt) == expected, prompt
        # Exact-string filter: "the left"/"the right" go, "the top"/"the bottom"/"side" stay.
        kept = [p for p in expected if p not in ("the left", "the right")]
        assert vqa_questions(prompt) == [f"{p}?" for p in kept], prompt
    assert seen > 0.9 * len(prompts)


def test_question_filter_is_an_exact_string_match(monkeypatch: pytest.MonkeyPatch) -> None:
    phrases = ["top", "the top", "the side", "side", "the left", "The left", "the right", "a cat"]
    monkeypatch.setattr(np_module, "noun_phrases", lambda prompt, backend="auto": list(phrases))
    assert vqa_questions("anything") == ["the top?", "side?", "The left?", "a cat?"]


def test_questions_are_capped_at_eight_in_order(no_spacy: None) -> None:
    animals = ["cat", "dog", "cow", "pig", "fox", "owl", "bee", "ant", "eel", "yak"]
    prompt = ", ".join(f"a {a}" for a in animals[:-1]) + f" and a {animals[-1]}"
    assert noun_phrases(prompt) == [f"a {a}" for a in animals]
    assert vqa_questions(prompt) == [f"a {a}?" for a in animals[:8]]
    assert vqa_questions(prompt, max_questions=3) == ["a cat?", "a dog?", "a cow?"]
    assert vqa_questions(prompt, max_questions=0) == []  # np_num 0 asks no question
    assert vqa_questions(prompt, max_questions=None) == [f"{a}?" for a in noun_phrases(prompt)]
    with pytest.raises(ValueError, match="max_questions"):
        vqa_questions(prompt, max_questions=-1)


def test_auto_backend_uses_spacy_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def fake_nlp(text: str) -> SimpleNamespace:
        seen.append(text)
        return SimpleNamespace(noun_chunks=[SimpleNamespace(text="spaCy's chunk")])

    monkeypatch.setattr(np_module, "_spacy_pipeline", lambda: fake_nlp)
    assert noun_phrases(" a red car \r\n") == ["spaCy's chunk"]
    assert seen == ["a red car"]
    assert noun_phrases("a red car", backend="builtin") == ["a red car"]


def test_spacy_backend_without_spacy(no_spacy: None) -> None:
    assert noun_phrases("a green bench and a red car") == ["a green bench", "a red car"]
    with pytest.raises(ImportError, match="en_core_web_sm"):
        noun_phrases("a red car", backend="spacy")
    with pytest.raises(ValueError, match="backend"):
        noun_phrases("a red car", backend="nltk")  # type: ignore[arg-type]


@pytest.mark.parametrize("model_installed", [False, True])
def test_spacy_is_imported_only_where_its_model_package_is_installed(monkeypatch: pytest.MonkeyPatch,
                                                                    model_installed: bool) -> None:
    # spaCy loads en_core_web_sm as a package: without one, "auto" takes the built-in chunker and leaves spaCy (about
    # a second to import) unimported; with one, spaCy loads it.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: (
        (SimpleNamespace(name=name) if model_installed else None) if name == np_module.SPACY_MODEL
        else find_spec(name, *args)))
    loaded = []
    if model_installed:
        spacy = pytest.importorskip("spacy")
        monkeypatch.setattr(spacy, "load", lambda name: (loaded.append(name), "the model's pipeline")[1])
    else:
        monkeypatch.delitem(sys.modules, "spacy", raising=False)
    np_module._spacy_pipeline.cache_clear()
    try:
        nlp = np_module.pipeline_for("auto")
    finally:
        np_module._spacy_pipeline.cache_clear()
    if model_installed:
        assert nlp == "the model's pipeline" and loaded == [np_module.SPACY_MODEL]
    else:
        assert nlp is None and "spacy" not in sys.modules


def test_phrases_are_substrings_in_order() -> None:
    prompt = (
        "The teardrop crystal vase with a rectangular base and a conical opening looked elegant."
    )
    phrases = builtin_noun_phrases(prompt)
    assert phrases == ["The teardrop crystal vase", "a rectangular base", "a conical opening"]
    position = 0
    for phrase in phrases:
        position = prompt.index(phrase, position) + len(phrase)


def test_official_parser_pins() -> None:
    """The pins of T2I-CompBench's requirements.txt (spacy==3.5.3, the en_core_web_sm 3.5.0 wheel by
    URL and sha256), and an install command pip reads as exactly those requirements."""
    from packaging.requirements import Requirement

    assert np_module.OFFICIAL_PARSER == {
        "name": "spacy", "version": "3.5.3", "model": "en_core_web_sm", "model_version": "3.5.0",
    }
    wheel = (
        "https://github.com/explosion/spacy-models/releases/download/en_core_web_sm-3.5.0/"
        "en_core_web_sm-3.5.0-py3-none-any.whl#sha256="
        "0964370218b7e1672a30ac50d72cdc6b16f7c867496f1d60925691188f4d2510"
    )
    command = np_module.OFFICIAL_INSTALL
    assert command.startswith("pip install ")
    requirements = [Requirement(r) for r in re.findall(r'"([^"]+)"', command)]
    assert [(r.name, str(r.specifier), r.url) for r in requirements] == [
        ("spacy", "==3.5.3", None), ("numpy", "<2", None), ("en-core-web-sm", "", wheel),
    ]
    assert np_module.is_official_parser(np_module.OFFICIAL_PARSER)
    assert not np_module.is_official_parser({**np_module.OFFICIAL_PARSER, "model_version": "3.8.0"})
    assert not np_module.is_official_parser({"name": "builtin", "version": np_module.BUILTIN_PARSER_VERSION})


def test_parser_record_without_spacy(no_spacy: None) -> None:
    builtin = {"name": "builtin", "version": np_module.BUILTIN_PARSER_VERSION}
    assert np_module.parser_record("builtin") == np_module.parser_record("auto") == builtin
    with pytest.raises(ImportError, match=re.escape(np_module.OFFICIAL_INSTALL)):
        np_module.parser_record("spacy")


# A dependency parse per prompt, as en_core_web_sm would give it: (POS, head index, dep) per word.
PARSES = {
    "a green acorn and a brown leaf": [
        ("DET", 2, "det"), ("ADJ", 2, "amod"), ("NOUN", 2, "ROOT"), ("CCONJ", 2, "cc"),
        ("DET", 6, "det"), ("ADJ", 6, "amod"), ("NOUN", 2, "conj"),
    ],
    # A parse that misses the first chunk, as spaCy 3.8's model is reported to (issue #15).
    "a green acorn and a brown leaf .": [
        ("DET", 2, "det"), ("ADJ", 2, "amod"), ("VERB", 2, "ROOT"), ("CCONJ", 2, "cc"),
        ("DET", 6, "det"), ("ADJ", 6, "amod"), ("NOUN", 2, "dobj"), ("PUNCT", 2, "punct"),
    ],
}


@pytest.fixture
def blank_spacy(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A real spaCy pipeline without the English model: `spacy.blank("en")` plus a component that
    sets the parses of `PARSES`, posing as en_core_web_sm 3.5.0 in its meta."""
    spacy = pytest.importorskip("spacy")
    from spacy.language import Language
    from spacy.tokens import Doc

    if "gors_test_parse" not in Language.factories:

        @Language.component("gors_test_parse")
        def set_parse(doc: Doc) -> Doc:
            parse = PARSES[doc.text]
            return Doc(doc.vocab, words=[t.text for t in doc], pos=[p for p, _, _ in parse],
                       heads=[h for _, h, _ in parse], deps=[d for _, _, d in parse])

    nlp = spacy.blank("en")
    nlp.add_pipe("gors_test_parse")
    nlp.meta.update(name="core_web_sm", version="3.5.0")
    monkeypatch.setattr(np_module, "_spacy_pipeline", lambda: nlp)
    return nlp


def test_spacy_backend_on_a_blank_pipeline(blank_spacy: Any) -> None:
    import spacy

    assert noun_phrases("a green acorn and a brown leaf\r\n", backend="spacy") == ["a green acorn", "a brown leaf"]
    assert vqa_questions("a green acorn and a brown leaf .") == ["a brown leaf?"]  # "auto" takes spaCy
    assert noun_phrases("a green acorn and a brown leaf .", backend="builtin") == ["a green acorn", "a brown leaf"]
    record = {"name": "spacy", "version": spacy.__version__, "model": "en_core_web_sm", "model_version": "3.5.0"}
    assert np_module.parser_record("spacy") == np_module.parser_record("auto") == record
    assert np_module.is_official_parser(record) == (spacy.__version__ == "3.5.3")
    blank_spacy.meta.update(name="core_web_md", version="3.8.0")
    assert np_module.parser_record("spacy")["model"] == "en_core_web_md"
    assert not np_module.is_official_parser(np_module.parser_record("spacy"))


def test_question_table_from_a_spacy_pipeline(blank_spacy: Any, tmp_path: Path) -> None:
    from rewards.question_table import load_question_table, make_question_table, write_question_table

    path = tmp_path / "questions.json"
    write_question_table(path, make_question_table(list(PARSES), backend="spacy"))
    loaded = load_question_table(path)
    assert loaded.parser == np_module.parser_record("spacy")
    assert loaded.lookup("a green acorn and a brown leaf .") == ["a brown leaf?"]


def builtin_nouns(prompt: str) -> list[str]:
    return [t.text for t in np_module.tagged_tokens(prompt, "builtin") if t.pos == "NOUN"]


@pytest.mark.parametrize(
    ("prompt", "nouns"),
    [
        ("both cats and dogs", ["cats", "dogs"]),  # determiners, conjunctions and numbers are no nouns
        ("a red or blue car", ["car"]),
        ("3 cats and 2 dogs", ["cats", "dogs"]),
        ("a triangular clock", ["clock"]),  # adjectives by word list, suffix or verb form are no nouns
        ("a graceful swan", ["swan"]),
        ("a sleeping cat", ["cat"]),
        ("a white ceiling fan", ["ceiling", "fan"]),  # nouns that look like verb forms are
        ("a speed boat", ["speed", "boat"]),
        ("a Ming vase", ["Ming", "vase"]),
        ("a cat on J's lap", ["cat", "J", "lap"]),  # a possessive splits off even a one-letter word
    ],
)
def test_builtin_nouns(prompt: str, nouns: list[str]) -> None:
    assert builtin_nouns(prompt) == nouns


def test_builtin_tags_name_the_nouns_spacy_would() -> None:
    """Compounds' first words are nouns, adjectives are not, and words split at hyphens and
    possessives as spaCy's tokenizer splits them; the token texts and spaces rebuild the prompt."""
    from rewards.noun_phrases import tagged_tokens

    prompt = "The round clock's hand was in mid-air next to the wooden picture frame."
    tagged = tagged_tokens(prompt, backend="builtin")
    assert [t.text for t in tagged if t.pos == "NOUN"] == ["clock", "hand", "air", "picture", "frame"]
    assert [t.text for t in tagged][2:4] == ["clock", "'s"] and [t.text for t in tagged][7:10] == ["mid", "-", "air"]
    assert "".join(t.text + t.whitespace for t in tagged) == prompt
    assert {t.pos for t in tagged} == {"NOUN", "X"}
    # Each part of a hyphenated word on its own: "sun" is a noun, "drenched", "red" and "haired" are not; a
    # plural possessive's apostrophe is no noun; a second space is a token, as spaCy makes it.
    assert builtin_nouns("a red-haired girl near a sun-drenched wall") == ["girl", "sun", "wall"]
    assert builtin_nouns("a cat on the left of the dogs'") == ["cat", "left", "dogs"]
    spaced = tagged_tokens("a dog next  to a cat", "builtin")
    assert [(t.text, t.pos) for t in spaced[2:5]] == [("next", "X"), (" ", "SPACE"), ("to", "X")]


def test_spacys_own_tags_are_read_when_it_is_installed(monkeypatch) -> None:
    """With spaCy's model (the official parser) the spatial rules and the adjective removal take its tags
    as they are: here a tagger that calls "gold" a NOUN and "compact" an ADJ, which the built-in rules
    would not guess."""
    from rewards.spatial_rule import spatial_objects

    words = [("The", "DET", " "), ("pink", "ADJ", " "), ("lipstick", "NOUN", " "), ("lay", "VERB", " "),
             ("next", "ADV", " "), ("to", "ADP", " "), ("the", "DET", " "), ("gold", "NOUN", " "),
             ("compact", "ADJ", " "), ("mirror", "NOUN", ""), (".", "PUNCT", "")]

    def fake_nlp(text: str) -> list[SimpleNamespace]:
        assert text == "".join(w + ws for w, _, ws in words)  # stripped, as given
        return [SimpleNamespace(text=w, pos_=pos, whitespace_=ws) for w, pos, ws in words]

    monkeypatch.setattr(np_module, "_spacy_pipeline", lambda: fake_nlp)
    prompt = " The pink lipstick lay next to the gold compact mirror. "
    assert spatial_objects(prompt, complex=True) == ("lipstick", "gold")
    assert spatial_objects(prompt, complex=True, backend="builtin") == ("lipstick", "mirror")
    # 3-in-1's CLIP text drops spaCy's ADJ tokens, joined by single spaces, as the official script.
    from rewards.clip_text import remove_adjectives

    assert remove_adjectives(prompt, backend="auto") == "The lipstick lay next to the gold mirror ."
    assert "compact" in remove_adjectives(prompt)  # the built-in rules do not know it


# spaCy keeps a clock time one token ("reads 11:44."); the built-in tokenizer splits it (six colour prompts).
_CLOCK_TIME = re.compile(r"\d:\d")


@needs_benchmarks
def test_builtin_tokens_are_spacys_on_every_benchmark_prompt() -> None:
    """The built-in tagger's tokens and spaces, and the CLIP text's tokens, are those of spaCy's English
    tokenizer (en_core_web_sm's; a blank English pipeline has the same) on every T2I-CompBench prompt, so
    that the official rules' token walks see the tokens they see officially."""
    spacy = pytest.importorskip("spacy")
    from rewards.clip_text import spacy_like_tokens
    from rewards.noun_phrases import builtin_tagged_tokens

    nlp = spacy.blank("en")
    checked = 0
    for path in sorted(COMPBENCH.glob("*_*.txt")):
        for prompt in path.read_text(encoding="utf-8").splitlines():
            prompt = prompt.split("\t")[0].strip()
            if not prompt or _CLOCK_TIME.search(prompt):
                continue
            expected = [(token.text, token.whitespace_) for token in nlp(prompt)]
            assert [(token.text, token.whitespace) for token in builtin_tagged_tokens(prompt)] == expected, prompt
            assert spacy_like_tokens(prompt) == [text for text, _ in expected], prompt
            checked += 1
    assert checked > 10_000
