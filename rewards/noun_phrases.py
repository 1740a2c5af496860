"""Noun phrases of a prompt and T2I-CompBench's B-VQA questions built from them.

T2I-CompBench's B-VQA asks BLIP one yes/no question per noun phrase of the prompt, with the noun
phrases taken from spaCy's ``en_core_web_sm`` noun chunks. spaCy is optional here: when it and the
model are importable they are used (the official questions); otherwise a built-in rule-based chunker
runs. The built-in chunker gives the grammatical noun chunks of the benchmark's template prompts
("a green bench and a red car", "a triangular slice of pizza and ...", "a balloon on the top of a
giraffe") and is approximate on free-form sentences: it knows no parts of speech beyond small word
lists and a few positional rules (a word before a determiner is a verb, "-ing" after a noun is a
verb, ...). Where spaCy's tagger itself errs on a template (it tags "rose" in "a red rose and a
white lily" as a verb and drops "a red rose") the built-in chunker keeps the grammatical phrases.

The official metric pins spaCy 3.5.3 and ``en_core_web_sm`` 3.5.0 (T2I-CompBench's requirements.txt);
`OFFICIAL_INSTALL` installs exactly those, and `parser_record` says which parser a backend runs
here, so that results can name it. A question table (`rewards.question_table`) carries the
official questions to machines without spaCy.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Backend = Literal["auto", "spacy", "builtin"]
BACKENDS = ("auto", "spacy", "builtin")

# The official evaluation drops exactly these chunk texts (an exact string match, so "the top"
# and "the bottom" stay questions, as in T2I-CompBench's BLIP_vqa.py).
EXCLUDED_PHRASES = ("top", "the side", "the left", "the right")
MAX_QUESTIONS = 8

SPACY_MODEL = "en_core_web_sm"
# The official parser, as T2I-CompBench's requirements.txt pins it (at the commit of
# gors.core.prompts.T2I_COMPBENCH_COMMIT): spacy==3.5.3 and the model wheel by URL and sha256.
OFFICIAL_SPACY_VERSION = "3.5.3"
OFFICIAL_MODEL_VERSION = "3.5.0"
OFFICIAL_MODEL_WHEEL = (
    "https://github.com/explosion/spacy-models/releases/download/"
    "en_core_web_sm-3.5.0/en_core_web_sm-3.5.0-py3-none-any.whl"
)
OFFICIAL_MODEL_SHA256 = "0964370218b7e1672a30ac50d72cdc6b16f7c867496f1d60925691188f4d2510"
OFFICIAL_PARSER: dict[str, str] = {
    "name": "spacy",
    "version": OFFICIAL_SPACY_VERSION,
    "model": SPACY_MODEL,
    "model_version": OFFICIAL_MODEL_VERSION,
}
# spaCy 3.5's compiled dependencies (thinc 8.1, blis 0.7) are built against NumPy 1: under NumPy 2
# `import spacy` fails with "numpy.dtype size changed". pip checks the wheel's sha256 fragment.
OFFICIAL_INSTALL = (
    f'pip install "spacy=={OFFICIAL_SPACY_VERSION}" "numpy<2" '
    f'"en-core-web-sm @ {OFFICIAL_MODEL_WHEEL}#sha256={OFFICIAL_MODEL_SHA256}"'
)
# Bump when the built-in chunker gives any prompt other phrases: results and question tables
# record it, so that numbers made with different chunkers are told apart.
BUILTIN_PARSER_VERSION = "1"


@functools.lru_cache(maxsize=1)
def _spacy_pipeline() -> Any | None:
    """spaCy's ``en_core_web_sm``, loaded once; None when spaCy or the model is not installed."""
    # spaCy loads the model as the installed package of that name: without one, importing spaCy (about a second)
    # would be in vain, in every process that scores with B-VQA.
    if importlib.util.find_spec(SPACY_MODEL) is None:
        return None
    try:
        import spacy

        return spacy.load(SPACY_MODEL)
    except (ImportError, OSError):
        return None


def pipeline_for(backend: Backend) -> Any | None:
    """The spaCy pipeline `backend` runs, or None for the built-in chunker."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'spacy' or 'builtin', got {backend!r}")
    nlp = _spacy_pipeline() if backend != "builtin" else None
    if nlp is None and backend == "spacy":
        raise ImportError(
            f"backend='spacy' needs spaCy and its English model {SPACY_MODEL}; the official "
            f"parser of T2I-CompBench installs with: {OFFICIAL_INSTALL}"
        )
    return nlp


def spacy_record(nlp: Any) -> dict[str, str]:
    """The parser record of a loaded spaCy pipeline: spaCy's version and the model's name and version."""
    import spacy

    meta = nlp.meta
    return {
        "name": "spacy",
        "version": spacy.__version__,
        "model": f"{meta['lang']}_{meta['name']}",
        "model_version": str(meta["version"]),
    }


def parser_record(backend: Backend = "auto") -> dict[str, str]:
    """Which parser `noun_phrases(..., backend)` runs on this machine, for results to record.

    ``{"name": "spacy", "version": <spaCy>, "model": "en_core_web_sm", "model_version": <model>}``
    or ``{"name": "builtin", "version": BUILTIN_PARSER_VERSION}``. Raises like `noun_phrases`
    (ImportError for "spacy" without spaCy's model, ValueError for an unknown backend).
    """
    nlp = pipeline_for(backend)
    if nlp is not None:
        return spacy_record(nlp)
    return {"name": "builtin", "version": BUILTIN_PARSER_VERSION}


def is_official_parser(record: Mapping[str, Any]) -> bool:
    """Whether a parser record names the official parser (spaCy 3.5.3 with en_core_web_sm 3.5.0)."""
    return all(record.get(key) == value for key, value in OFFICIAL_PARSER.items())


def noun_phrases(prompt: str, backend: Backend = "auto") -> list[str]:
    """Noun phrases of `prompt`, each a substring of it, in order.

    Args:
        prompt: the text prompt; surrounding whitespace (and a CRLF line ending) is ignored.
        backend: "spacy" (noun chunks of ``en_core_web_sm``; raises when it is not installed),
            "builtin" (the rule-based chunker), or "auto" (spaCy when installed, else built-in).
    """
    nlp = pipeline_for(backend)
    text = prompt.strip()
    if nlp is not None:
        return [chunk.text for chunk in nlp(text).noun_chunks]
    return builtin_noun_phrases(text)


def vqa_questions(
    prompt: str, max_questions: int | None = MAX_QUESTIONS, backend: Backend = "auto"
) -> list[str]:
    """T2I-CompBench's B-VQA questions: ``f"{phrase}?"`` per noun phrase, in prompt order.

    Phrases equal to one of `EXCLUDED_PHRASES` are dropped and at most `max_questions` (8 in the
    official code; None: all) are kept. An empty list means the prompt has no noun phrase.
    """
    if max_questions is not None and max_questions < 0:
        raise ValueError(f"max_questions must be >= 0, got {max_questions}")
    phrases = [p for p in noun_phrases(prompt, backend) if p not in EXCLUDED_PHRASES]
    return [f"{phrase}?" for phrase in phrases[:max_questions]]


# --------------------------------------------------------------------------------------------
# The built-in chunker.


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_DETERMINERS = _words(
    "a an the this that these those each every some any no another either neither both all"
)
_POSSESSIVES = _words("its his her their my your our")
_NUMBERS = _words(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty hundred dozen"
)
_PREPOSITIONS = _words(
    "about above across after against along alongside amid amidst among around at atop before "
    "behind below beneath beside besides between beyond by despite down during except for from in "
    "inside into like near of off on onto out outside over past per through throughout till to "
    "toward towards under underneath until up upon via with within without"
)
_GERUND_PREPOSITIONS = _words("for by about before after without")
_CONJUNCTIONS = _words("and or but nor")
_SUBORDINATORS = _words(
    "while as because although though if when whenever where wherever whereas since unless than "
    "so whether which who whom whose what how why yet then"
)
_AUXILIARIES = _words(
    "is are was were am be been being has have had do does did can could will would shall should "
    "may might must 's 're 've 'm 'd 'll"
)
_PRONOUNS = _words(
    "it they them he she him we us i me you itself themselves himself herself ourselves yourself "
    "something someone somebody everything everyone everybody nothing anyone anybody anything"
)
# Words that modify a verb or a sentence and never belong to a noun chunk.
_ADVERBS = _words(
    "not never very too also just still even really quite almost together away back forth here "
    "next there again nearby overhead ever else alike otherwise instead perhaps rather always "
    "often sometimes soon now already n't"
)
# Adjectives that cannot head a noun phrase; a chunk ending in one of them is no chunk
# ("The sky is blue"). Colour words that are also nouns (orange, gold, silver) are left out.
_ADJECTIVES = _words(
    "red yellow green blue purple pink brown black white gray grey golden beige turquoise maroon "
    "teal cyan magenta crimson scarlet whitish reddish bluish greenish big small large tiny huge "
    "little tall short long wide thin thick narrow giant enormous massive gigantic high low deep "
    "shallow cubic triangular rectangular circular spherical cylindrical conical pyramidal "
    "pentagonal hexagonal octagonal oblong metallic wooden fluffy furry fuzzy shiny smooth rough "
    "soft hard hairy woolen woollen silky glossy matte transparent sparkly prickly bumpy spiky "
    "happy sad old new young beautiful pretty cute ugly bright dark warm cool cold hot wet dry "
    "fresh ripe juicy sweet sour delicious heavy empty full clean dirty modern ancient vintage "
    "cozy cosy colorful colourful vibrant elegant sleek fancy plain simple sharp blunt tangy "
    "crisp crispy crunchy creamy fragrant gentle calm quiet loud busy lush majestic serene rustic "
    "other several many few various different same whole entire curly friendly lovely silly "
    "lonely chilly early daily oily hilly woolly wooly bubbly wrinkly elderly holy jolly cuddly "
    "frilly wobbly smelly scaly only visible most more least less rocky starry sunny foggy cloudy "
    "rainy snowy windy stormy sandy grassy leafy muddy dusty rusty misty icy spicy salty tasty "
    "dull plush tart opaque iridescent translucent intricate delicate ornate arid harsh tropical "
    "natural brilliant tranquil vast bare safe secure unique ready late"
)
_ADJECTIVE_SUFFIXES = ("ous", "ful", "ive", "able", "ible", "less")
# Nouns that mostly modify another noun in prompts ("a diamond serving platter", "a glass cup"):
# after them an -ing word is part of the chunk, not a verb.
_MODIFIERS = _ADJECTIVES | _words(
    "oval square round diamond teardrop crescent heart star orange gold silver bronze copper "
    "plastic rubber leather glass fabric metal wood paper stone ceramic cotton silk wool velvet "
    "denim marble brick concrete steel iron porcelain crystal"
)


def _looks_adjective(low: str) -> bool:
    """Adjective by word list or by suffix ("graceful", "curious"): a guess to join phrases."""
    return low in _ADJECTIVES or (low.endswith(_ADJECTIVE_SUFFIXES) and len(low) > 5)


# Words ending in -ing / -ed / -ly that are nouns, not verb forms or adverbs.
_NOUNS_LIKE_VERB_FORMS = _words(
    "ring king wing thing string spring swing sling sing ceiling building painting clothing "
    "earring wedding evening morning pudding icing stuffing frosting railing topping stocking "
    "bedding awning duckling seedling dumpling filling lightning sibling pudding herring darling "
    "shilling ending landing drawing sapling stuffing siding lining wring bed shed sled red seed "
    "weed reed steed tweed hundred bread sacred naked wicked rugged ragged jagged lily fly "
    "butterfly dragonfly firefly belly jelly family bully holly ally rally assembly italy supply "
    "doily gully tally filly potbelly"
)
# Irregular participles: like "-ed" words, a modifier before a noun, a verb after one.
_PARTICIPLES = _words(
    "hidden broken fallen frozen stolen woven sewn shown grown drawn thrown worn torn written "
    "ridden eaten beaten sunk bitten forgotten chosen driven given taken shaken swollen laid "
    "built lit bent spent hung made clad lost"
)
# Verb forms that are (nearly) never nouns in prompts: a verb wherever they follow a noun.
_VERBS = _words(
    "sat sits hung hangs stood shone shines held holds lies lay made makes kept keeps fell drove "
    "swam swims wrote writes flew flies struck felt feels blew blows lost drew told tells strode "
    "grew grows ran runs ate eats sang sings rang took gave gives came comes saw sees went goes "
    "brought brings caught catches threw throws sped spun slept sleeps woke stuck wore wears adds "
    "stirs reads leans bounces lounges creaks hovers chases contains sit lie hang left cast"
)
# Verb forms that are also nouns ("music stands", "diamond rings"): a verb only when they end a
# noun chunk that a preposition or adverb follows ("the leather shoes rest on the rack").
_AMBIGUOUS_VERBS = _words(
    "rest rests stand stands display displays hold play plays ride rides float floats drift swing "
    "look looks serve serves hang sit lie stir mix brew glow glows shine bloom blooms sway sways "
    "perch perches lean stay stays sleep wait waits grow fly set cut spread fit nap rings "
    "features lives falls leads draws sparkles stretches shifts walks spins barks drives climbs "
    "crawls smiles soars jumps"
)

_TOKEN = re.compile(r"[^\W_]+(?:[-'\u2019][^\W_]+)*|\S")
_CONTRACTION = re.compile(r"(?i)^(.+?)(n't|'s|'re|'ve|'m|'d|'ll)$")


class _Tok:
    __slots__ = ("text", "low", "start", "end", "kind")

    def __init__(self, text: str, start: int) -> None:
        self.text = text
        self.low = text.lower().replace("\u2019", "'")
        self.start, self.end = start, start + len(text)
        self.kind = _kind(self.low)


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    for match in _TOKEN.finditer(text):
        word, start = match.group(), match.start()
        split = _CONTRACTION.match(word.replace("\u2019", "'"))
        stem = split.group(1).lower() if split else ""
        # "it's", "there's", "don't" are two words; "the cat's toy" keeps its possessive.
        if split and (
            split.group(2).lower() == "n't" or _kind(stem) != "WORD" or stem in ("there", "here")
        ):
            cut = len(split.group(1))
            tokens += [_Tok(word[:cut], start), _Tok(word[cut:], start + cut)]
        else:
            tokens.append(_Tok(word, start))
    for i, tok in enumerate(tokens):
        if tok.low == "that" and i > 0 and tokens[i - 1].kind in ("WORD", "PRON"):
            tok.kind = "SUB"  # "the shapes that he struggled with": a relative, not a determiner
        if tok.low in ("both", "all") and i > 0 and tokens[i - 1].kind == "AUX":
            tok.kind = "ADV"  # "were both useful"
        if (
            tok.low == "back"
            and i > 0
            and (tokens[i - 1].kind == "DET" or tokens[i - 1].low in _ADJECTIVES)
        ):
            tok.kind = "WORD"  # "the bumpy back road", not "sat back"
        if tok.low == "can" and i > 0:
            # "a soda can and ...", "a cylindrical can of soup": "can" after a determiner or a
            # modifier, or before anything but a word, is the noun.
            prev, nxt = tokens[i - 1], (tokens[i + 1] if i + 1 < len(tokens) else None)
            if prev.kind == "DET" or prev.low in _MODIFIERS or nxt is None or nxt.kind != "WORD":
                tok.kind = "WORD"
    return tokens


def _kind(low: str) -> str:
    if not low[0].isalnum() and low[0] != "'" and low != "n't":
        return "PUNCT"
    for kind, words in (
        ("DET", _DETERMINERS),
        ("DET", _POSSESSIVES),
        ("DET", _NUMBERS),
        ("CONJ", _CONJUNCTIONS),
        ("PREP", _PREPOSITIONS),
        ("SUB", _SUBORDINATORS),
        ("AUX", _AUXILIARIES),
        ("PRON", _PRONOUNS),
        ("ADV", _ADVERBS),
    ):
        if low in words:
            return kind
    if low.isdigit():
        return "DET"
    return "WORD"


def _verb_form(low: str) -> str | None:
    """The verb-like shape of a word: "ing", "ed" (participles) or "ly" (adverbs), else None."""
    if low in _NOUNS_LIKE_VERB_FORMS or low in _ADJECTIVES or "-" in low:
        return None
    if low in _PARTICIPLES:
        return "ed"
    for suffix, min_len in (("ing", 5), ("ed", 4), ("ly", 5)):
        if low.endswith(suffix) and len(low) >= min_len and not low.endswith("eed"):
            return suffix
    return None


def _is_third_person_verb(low: str) -> bool:
    # "bounces", "lounges": an -s word after a singular subject, unless it is a singular noun.
    return low.endswith("s") and not low.endswith(("ss", "us", "is", "'s")) and len(low) > 3


def _split_runs(tokens: list[_Tok]) -> list[tuple[list[_Tok], str, str]]:
    """Maximal spans of determiners + content words, with the kinds of the tokens around them.

    A determiner inside a span starts a new span; a pronoun is a span of its own.
    """
    runs: list[tuple[list[_Tok], str, str]] = []
    current: list[_Tok] = []
    before = "START"
    for i, tok in enumerate(tokens):
        if tok.kind == "WORD" or (tok.kind == "DET" and not any(t.kind == "WORD" for t in current)):
            current.append(tok)
            continue
        if tok.kind == "DET" and current:
            runs.append((current, before, "DET"))
            current, before = [tok], "NOUN"
            continue
        if current:
            runs.append((current, before, tok.kind))
            current = []
        if tok.kind == "PRON":
            after = tokens[i + 1].kind if i + 1 < len(tokens) else "END"
            runs.append(([tok], before, after))
        # "to" before a verb behaves like an auxiliary ("trying to beat their record"), and so do
        # prepositions that take a gerund ("for reaching high places").
        before = "TO" if tok.low == "to" or tok.low in _GERUND_PREPOSITIONS else tok.kind
        if tok.low == "to" and 0 < i < len(tokens) - 1 and tokens[i - 1].low == tokens[i + 1].low:
            before = "PREP"  # "from tree to tree"
    if current:
        runs.append((current, before, "END"))
    return runs


def _chunks_of_run(run: list[_Tok], before: str, after: str) -> list[list[_Tok]]:
    """Cut one span at its verbs; each piece is a candidate noun chunk (determiners + words).

    `before` and `after` are the kinds of the tokens around the span; "VERB" marks a verb cut
    out earlier in the span, "TO" an infinitive marker.
    """
    if run[0].kind == "PRON":
        return [run]
    dets = [t for t in run if t.kind == "DET"]
    words = [t for t in run if t.kind != "DET"]
    det = dets[0].low if dets else ""
    pieces: list[list[_Tok]] = []
    chunk: list[_Tok] = list(dets)
    content: list[_Tok] = []  # the content words of `chunk`
    context = before
    for i, tok in enumerate(words):
        low = tok.low
        is_last = i == len(words) - 1
        has_det = bool(chunk) and chunk[0].kind == "DET"
        bare = not content and not has_det  # no determiner and no word before it in its chunk
        form = _verb_form(low)
        # After a modifier noun an -ing word still belongs to the chunk ("a diamond serving
        # platter"); other verb forms only after an adjective ("the smooth marble rolled").
        modifiers = _MODIFIERS if low.endswith("ing") else _ADJECTIVES
        follows_noun = (
            bool(content)
            and content[-1].low not in modifiers
            and not _looks_adjective(content[-1].low)
            and _verb_form(content[-1].low) != "ly"
        )
        verb_context = context in ("AUX", "VERB", "TO", "PRON", "ADV")
        if form is not None:
            if follows_noun:
                verb = True  # "a black cat sitting", "six dogs played"
            elif content:
                verb = form == "ly" and is_last  # "its pentagonal stitching" ends in a noun
            elif has_det:
                verb = form == "ly" and is_last  # "a sleeping cat", "the painting"
            elif (
                form == "ly"
                and not is_last
                and _verb_form(words[i + 1].low) == "ed"
                and any(_verb_form(t.low) is None for t in words[i + 2 :])
            ):
                verb = False  # "dimly lit living room"
            elif form == "ly" or is_last or verb_context:
                verb = True  # "is playing", "and adorned with", "completely immersed"
            else:
                # "with striped shirts" modifies a noun; "and trying to" does not.
                verb = form == "ing" and context not in ("PREP", "START", "PUNCT")
        elif low in _VERBS:
            verb = follows_noun or (bare and context in ("AUX", "TO", "PRON"))
        elif is_last and after in ("DET", "PRON"):
            # A noun chunk is never directly followed by a determiner: "glass jar stir the ...".
            verb = follows_noun or (bare and (verb_context or low.endswith("ing")))
        elif is_last and bare and len(words) == 1 and context in ("TO", "PRON"):
            verb = not low.endswith("s")  # "to go", "making it squeak"; not "to swimmers"
        elif is_last and follows_noun and after in ("PREP", "ADV", "SUB", "END", "PUNCT"):
            # "the leather shoes rest on", "a fluffy cat lounges on": a verb with no object.
            plural_subject = det not in ("a", "an", "one", "each", "every", "this", "that")
            verb = after != "END" and (
                (low in _AMBIGUOUS_VERBS and plural_subject != low.endswith("s"))
                or (
                    det in ("a", "an", "this", "that", "each", "every", "one")
                    and _is_third_person_verb(low)
                    and not content[-1].low.endswith("'s")
                )
            )
        else:
            verb = False
        if verb:
            pieces.append(chunk)
            chunk, content, context = [], [], "VERB"
        else:
            chunk.append(tok)
            content.append(tok)
    pieces.append(chunk)
    return pieces


def _trim(piece: list[_Tok]) -> list[_Tok]:
    """Drop trailing adjectives and adverbs ("the only things visible" -> "the only things")."""

    def modifier(tok: _Tok) -> bool:
        return tok.kind == "WORD" and (tok.low in _ADJECTIVES or _verb_form(tok.low) == "ly")

    end = len(piece)
    while end > 0 and modifier(piece[end - 1]):
        end -= 1
    return piece[:end] if end > 0 and piece[end - 1].kind in ("WORD", "PRON") else piece


def _is_chunk(piece: list[_Tok]) -> bool:
    if not piece:
        return False
    head = piece[-1]
    if head.kind == "PRON":
        return True
    return head.kind == "WORD" and head.low not in _ADJECTIVES and _verb_form(head.low) != "ly"


def builtin_noun_phrases(prompt: str) -> list[str]:
    """Rule-based noun chunks: exact on T2I-CompBench's templates, approximate elsewhere.

    Each phrase is a substring of the stripped prompt, in order, e.g.
    "a triangular slice of pizza and a cylindrical pizza cutter" ->
    ["a triangular slice", "pizza", "a cylindrical pizza cutter"].
    """
    text = prompt.strip()
    return [text[p[0].start : p[-1].end] for p in _builtin_chunks(text)]


def _builtin_chunks(text: str) -> list[list[_Tok]]:
    """The tokens of each noun chunk of `text` (stripped), in order."""
    tokens = _tokenize(text)
    runs = _split_runs(tokens)
    pieces: list[list[_Tok]] = []
    for run, before, after in runs:
        new = _chunks_of_run(run, before, after)
        # "A black and green tile bathroom", "the warm, summer sun": adjectives joined by a
        # conjunction or a comma belong to the noun that follows them.
        if (
            pieces
            and pieces[-1]
            and new[0]
            and new[0][0].kind != "DET"
            and before in ("CONJ", "PUNCT")
        ):
            prev = pieces[-1]
            gap = text[prev[-1].end : new[0][0].start].strip()
            one_word = (
                len(prev) == 2
                and prev[0].kind == "DET"
                and len(new[0]) >= 2
                and _verb_form(new[0][0].low) != "ing"  # "the sky, casting shadows"
            )
            if (
                gap in ("and", "or", ",")
                and new[0][-1].low not in _ADJECTIVES
                and (_looks_adjective(prev[-1].low) or (gap == "," and one_word))
            ):
                new[0] = prev + new[0]
                pieces.pop()
        pieces.extend(new)
    pieces = [_trim(p) for p in pieces if p]
    return [p for p in pieces if _is_chunk(p)]


@dataclass(frozen=True)
class TaggedToken:
    """A token of a prompt with its universal part-of-speech tag, as spaCy gives them.

    Attributes:
        text: the token as written.
        pos: spaCy's `Token.pos_` ("NOUN", "PROPN", "ADJ", ...); the built-in tagger says only
            "NOUN" or "X" (anything else).
        whitespace: what follows it in the prompt, " " or "" (spaCy's `Token.whitespace_`).
    """

    text: str
    pos: str
    whitespace: str


def tagged_tokens(prompt: str, backend: Backend = "auto") -> list[TaggedToken]:
    """The tokens of `prompt` (stripped) and their part-of-speech tags: spaCy's (the official
    scripts' parser) or, with the built-in backend, `builtin_tagged_tokens`' approximation."""
    nlp = pipeline_for(backend)
    text = prompt.strip()
    if nlp is not None:
        return [TaggedToken(token.text, token.pos_, token.whitespace_) for token in nlp(text)]
    return builtin_tagged_tokens(text)


# Adjectives before a noun that `_ADJECTIVES` leaves out, as they can also head a chunk ("an orange"),
# and "mid" ("mid-air").
_PRENOMINAL_ADJECTIVES = _words("orange gold silver square round oval flat curved rugged ragged jagged compact mid")
_HYPHEN_PART = re.compile(r"[^-]+|-")


def _is_prenominal_adjective(low: str) -> bool:
    return low in _PRENOMINAL_ADJECTIVES or _looks_adjective(low) or _verb_form(low) in ("ed", "ing")


def builtin_tagged_tokens(prompt: str) -> list[TaggedToken]:
    """Which words of `prompt` (stripped) are nouns, as spaCy's tagger would say, by rules.

    In each noun chunk of `builtin_noun_phrases` the last word is a NOUN, and so is every word
    before it that is not an adjective by the chunker's word lists and suffixes: the first half of
    a compound ("coffee" in "a white coffee table") is a NOUN, as spaCy tags it. Words are split as
    spaCy's tokenizer splits them, at hyphens ("mid-air": "mid", "-", "air"; each part judged
    alone, so "sun" in "a sun-drenched wall" is a NOUN and "drenched" not) and before a possessive
    ("cat's": "cat", "'s"); whitespace beyond one space is a token of its own ("SPACE"). Every other
    token is tagged "X". Approximate where the chunker is (free-form sentences).
    """
    text = prompt.strip()
    heads: set[int] = set()  # start offsets of the chunks' last words
    modifiers: set[int] = set()  # and of the words before them
    for chunk in _builtin_chunks(text):
        words = [token for token in chunk if token.kind == "WORD"]
        modifiers.update(token.start for token in words[:-1])
        if chunk[-1].kind == "WORD":
            heads.add(chunk[-1].start)
    tokens = _tokenize(text)
    tagged = []
    for n, token in enumerate(tokens):
        stem, possessive = token.text, ""
        if token.kind == "WORD" and len(stem) > 2 and stem[-2:].lower().replace("\u2019", "'") == "'s":
            stem, possessive = stem[:-2], stem[-2:]
        parts = _HYPHEN_PART.findall(stem) if token.kind == "WORD" else [stem]
        tags = []
        for i, part in enumerate(parts):
            low = part.lower()
            if not any(c.isalnum() for c in part) or not (token.start in heads or token.start in modifiers):
                tags.append("X")
            elif token.start in heads and i == len(parts) - 1:
                tags.append("NOUN")
            else:
                tags.append("NOUN" if _kind(low) == "WORD" and not _is_prenominal_adjective(low) else "X")
        if possessive:
            parts, tags = [*parts, possessive], [*tags, "X"]
        gap = text[token.end : tokens[n + 1].start] if n + 1 < len(tokens) else ""
        space, rest = (" ", gap[1:]) if gap.startswith(" ") else ("", gap)
        tagged += [TaggedToken(part, tag, space if i == len(parts) - 1 else "")
                   for i, (part, tag) in enumerate(zip(parts, tags))]
        if rest:
            tagged.append(TaggedToken(rest, "SPACE", ""))
    return tagged
