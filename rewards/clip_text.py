"""Text rules of the CLIP rewards: T2I-CompBench's adjective removal and the cosine -> score map.

For complex prompts the official CLIPScore (``CLIPScore_eval/CLIP_similarity.py --complex``) feeds
CLIP the prompt without its adjectives: ``' '.join(token.text for token in nlp(prompt) if
token.pos_ != 'ADJ')`` with spaCy's ``en_core_web_sm``. With backend "auto" or "spacy" and spaCy's
model installed, `remove_adjectives` does exactly that. The model is not installable everywhere, so
without it (and with backend "builtin", the default of these functions) it approximates spaCy:

- Tokens follow spaCy's English tokenizer on prompt-like text: words, each punctuation mark on
  its own, a hyphen between letters split off ("sun-drenched" -> "sun - drenched"), clitics split
  ("don't" -> "do n't", "cat's" -> "cat 's"). The tokens are joined by single spaces, as the
  official code does (CLIP's tokenizer gives the same tokens with or without those spaces).
- A token is an adjective (spaCy's ADJ) when it is in the adjective word list of
  `rewards.noun_phrases` or in `_MORE_ADJECTIVES` (the adjectives of T2I-CompBench's complex
  and non-spatial prompts), is a comparative or superlative of one ("bigger", "largest"), or ends
  in an adjective suffix (-ous, -ful, -ive, -able, -ible, -less) and is no known noun
  ("vegetable"); never a determiner, preposition, pronoun or auxiliary.
- Context, as spaCy's tagger uses it: words that are nouns as often as adjectives ("round",
  "square", "orange", "silver") are adjectives only before a content word or after a copula
  ("the round clock", "the clock is round"); a listed adjective that heads its noun phrase
  (after a determiner, before a preposition or the end: "a tart on a plate") is a noun; "more",
  "most", "less", "least" and "only" before an adjective or a number are adverbs.

Where spaCy's statistical tagger differs from these rules (participles such as "flickering" or
"winding", which it tags VERB or ADJ by context; rare adjectives not in the lists) the CLIP text
differs by that word; on the benchmark's complex prompts the attribute words it removes (colours,
shapes, textures, sizes, qualities) are covered by the lists.
"""

from __future__ import annotations

import re

from rewards.noun_phrases import _ADJECTIVE_SUFFIXES, _ADJECTIVES, Backend, _kind, _words, pipeline_for, tagged_tokens

# Adjectives of T2I-CompBench's complex and non-spatial prompts that the chunker's list lacks.
_MORE_ADJECTIVES = _words(
    """
    jagged textured striped spotted checkered dotted rich stunning rugged tired sturdy bold
    thrilling dim curved fiery sore strong luxurious romantic plump sticky savory scenic thorny
    thirsty weak breathtaking slimy clear twisted damp playful perfect special flat frosty barren
    crowded sleepy achy peaceful chaotic decadent bulky choppy moonlit lively dappled geometric
    therapeutic famous frosted wavy gnarled mossy distant spotty slippery weedy solid brittle puffy
    calloused squishy tough bitter bland fragile glamorous slim neat hungry elaborate grand blank
    powerful verdant dense idyllic abstract northern southern eastern western celestial
    traditional candlelit sunlit polished worn broken frozen amazing charming interesting
    exciting relaxing soothing comforting dazzling refreshing inviting striking detailed sugary
    first second third final last lazy proud brave clever angry gorgeous fierce wild cheerful
    """
)
# Nouns as often as adjectives: adjectives only before a content word or after a copula.
_NOUN_OR_ADJECTIVE = _words("round square oval orange silver gold")
# Degree words: adverbs before an adjective or a number ("the most beautiful", "only two").
_DEGREE_WORDS = _words("more most less least only")
# Nouns with an adjective suffix.
_SUFFIX_NOUNS = _words(
    """
    vegetable timetable turntable constable detective locomotive executive relative explosive
    adhesive representative motive sedative handful mouthful spoonful cupful bucketful armful
    """
)
_KNOWN_ADJECTIVES = _ADJECTIVES | _MORE_ADJECTIVES
_COPULAS = _words("is are was were be been being am seems seem looks look appears appear")

# Words, single non-space symbols; clitics are cut off afterwards.
_TOKEN = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*|\S")
_CLITIC = re.compile(r"(?i)^(.+?)(n['\u2019]t|['\u2019](?:s|re|ve|m|d|ll))$")


def spacy_like_tokens(text: str) -> list[str]:
    """Tokens of `text` as spaCy's English tokenizer splits prompt-like text, in order."""
    tokens: list[str] = []
    for word in _TOKEN.findall(text):
        clitic = _CLITIC.match(word)
        tokens += [clitic.group(1), clitic.group(2)] if clitic else [word]
    return tokens


def _is_listed_adjective(low: str) -> bool:
    if low in _KNOWN_ADJECTIVES:
        return True
    if low.endswith(_ADJECTIVE_SUFFIXES) and len(low) > 5 and low not in _SUFFIX_NOUNS:
        return True
    for suffix in ("est", "er"):  # comparatives and superlatives
        stem = low.removesuffix(suffix)
        if stem == low or len(stem) < 3:
            continue
        bases = {stem, stem + "e"}  # "taller", "larger"
        if stem.endswith("i"):
            bases.add(stem[:-1] + "y")  # "happier"
        if stem[-1] == stem[-2]:
            bases.add(stem[:-1])  # "bigger"
        if bases & _KNOWN_ADJECTIVES:
            return True
    return False


def adjective_flags(tokens: list[str]) -> list[bool]:
    """For each token of `spacy_like_tokens`, whether spaCy would tag it ADJ (approximation)."""
    lows = [t.lower().replace("\u2019", "'") for t in tokens]
    kinds = [_kind(low) for low in lows] + ["END"]
    listed = [kind == "WORD" and _is_listed_adjective(low) for low, kind in zip(lows, kinds)]
    listed.append(False)
    flags = []
    for i, low in enumerate(lows):
        next_kind, next_low = kinds[i + 1], (lows[i + 1] if i + 1 < len(lows) else "")
        if kinds[i] != "WORD":
            flag = False
        elif low in _DEGREE_WORDS:
            # Numbers are determiners to `_kind`: "only two cats" is an adverb too.
            flag = not (listed[i + 1] or next_kind == "DET")
        elif low in _NOUN_OR_ADJECTIVE:
            flag = next_kind == "WORD" or (i > 0 and lows[i - 1] in _COPULAS)
        elif listed[i] and (next_kind in ("END", "PREP", "AUX", "SUB") or next_low == "."):
            # The last word of a phrase that a determiner opens is its head noun ("a tart on a
            # plate"); after a copula it stays an adjective ("the sky is blue").
            j = i - 1
            while j >= 0 and listed[j]:
                j -= 1
            flag = not (j >= 0 and kinds[j] == "DET")
        else:
            flag = listed[i]
        flags.append(flag)
    return flags


def tag_adjectives(prompt: str, backend: Backend = "builtin") -> list[tuple[str, bool]]:
    """(token, is adjective) for each token of `prompt`, in order: spaCy's tokens and ADJ tags where
    `backend` runs spaCy (`rewards.noun_phrases.pipeline_for`: the official parser), else the
    spaCy-like tokens and rules above."""
    if pipeline_for(backend) is not None:
        return [(token.text, token.pos == "ADJ") for token in tagged_tokens(prompt, backend)]
    tokens = spacy_like_tokens(prompt)
    return list(zip(tokens, adjective_flags(tokens)))


def split_adjectives(prompt: str, backend: Backend = "builtin") -> tuple[str, list[str]]:
    """(`prompt` without its adjectives, the adjectives removed); tokens joined by single spaces,
    as the official code does. `backend`: see `tag_adjectives`."""
    tags = tag_adjectives(prompt, backend)
    kept = " ".join(token for token, adjective in tags if not adjective)
    return kept, [token for token, adjective in tags if adjective]


def remove_adjectives(prompt: str, backend: Backend = "builtin") -> str:
    """`prompt` without its adjectives: "a white cat sleeps on a soft sofa" -> "a cat sleeps on a sofa"."""
    return split_adjectives(prompt, backend)[0]


def clip_clean(text: str) -> str:
    """`text` as CLIP's own tokenizer cleans it before its BPE (`simple_tokenizer`'s `basic_clean` and
    `whitespace_clean`, which the official scripts tokenise with): mojibake and curly quotes fixed by ftfy,
    HTML entities unescaped twice, runs of whitespace made one space. transformers' CLIP tokenizer does none of
    it, so "a cat’s toy &amp; ball" would tokenise otherwise."""
    import html

    import ftfy  # open_clip's dependency, as it is the official tokenizer's

    return re.sub(r"\s+", " ", html.unescape(html.unescape(ftfy.fix_text(text))).strip()).strip()


def cosine_to_score(cosine: float) -> float:
    """A cosine similarity in [-1, 1] clamped into [0, 1]: the score of both CLIP rewards.

    CLIPScore (image-text, ViT-B/32) sits around 0.2-0.4 and BLIP-CLIP (caption-prompt text-text)
    around 0.5-1.0, so the clamp changes no real value except rounding past 1 and a rare negative
    cosine (then 0: no alignment). The raw cosine is what the official code reports and what
    thresholds are set on; unlike Hessel et al.'s CLIPScore there is no factor 2.5 or 100.
    """
    return min(1.0, max(0.0, float(cosine)))
