"""A tiny T5 v1.1 encoder (`T5EncoderModel`) and an offline `T5TokenizerFast`, random weights.

SD3 (`text_encoder_3`), FLUX.1 (`text_encoder_2`) and PixArt (`text_encoder`) all condition on the
encoder of `google/t5-v1_1-xxl`. This module keeps its structure and token conventions and shrinks
the sizes: gated-GELU feed-forward, untied embeddings, relative-position buckets 32 / distance 128,
`<pad>` = 0 (also the pad id the pipelines pad with), `</s>` = 1 appended to every sequence,
`<unk>` = 2, SentencePiece-style "▁" word starts, 100 `<extra_id_*>` sentinels at the end of the
vocabulary in reverse order. The real SentencePiece model cannot be downloaded here, so the
tokenizer is a `tokenizers` Unigram model written in code: whole pieces for common prompt words,
single characters for everything else (like T5, characters outside the vocabulary become `<unk>`).

Sizes: d_model 128 (at least the two tiny CLIP widths together, as SD3 zero-pads the concatenated
CLIP states up to T5's width), 2 layers, 4 heads of 32, d_ff 256, 388 tokens (448 embedding rows),
0.39 M parameters.
"""

from __future__ import annotations

import string

T5_D_MODEL = 128
# The real tokenizer's `model_max_length`, and the longest `max_sequence_length` SD3 and FLUX accept.
T5_MAX_LENGTH = 512
EXTRA_IDS = 100
# Words that become single pieces ("▁word"): what compositional prompts are mostly made of.
WORDS = (
    "a an the of and on in with next to near top bottom left right above below behind front side "
    "photo picture image one two three four five six seven eight nine ten "
    "red orange yellow green blue purple pink brown black white gray "
    "big small tall short round square wooden metallic plastic glass "
    "person man woman dog cat bird horse cow sheep car bus truck bicycle motorcycle train boat "
    "chair bench table couch bed cup bowl bottle vase book clock apple banana pizza cake "
    "umbrella bag suitcase ball kite laptop phone tv giraffe zebra elephant bear"
)
# Log-probabilities of the Unigram pieces: a whole word always beats spelling it out.
_WORD_SCORE = -5.0
_CHAR_SCORE = -10.0


def t5_vocab() -> list[tuple[str, float]]:
    """The Unigram vocabulary `(piece, log-probability)` in T5's id layout.

    Ids 0-2 are `<pad>`, `</s>`, `<unk>`; then "▁", the words, the characters (each also as a
    word start "▁c"), and last the sentinels `<extra_id_99>` ... `<extra_id_0>`.
    """
    pieces = {"▁": -2.0}
    for word in WORDS.split():
        pieces.setdefault(f"▁{word}", _WORD_SCORE)
    for char in string.ascii_letters + string.digits + string.punctuation:
        pieces.setdefault(f"▁{char}", _CHAR_SCORE)
        pieces.setdefault(char, _CHAR_SCORE)
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    sentinels = [(f"<extra_id_{i}>", 0.0) for i in reversed(range(EXTRA_IDS))]
    return specials + list(pieces.items()) + sentinels


def build_t5_tokenizer(model_max_length: int = T5_MAX_LENGTH):
    """The tiny T5 tokenizer (`T5TokenizerFast`, which transformers 5 names `T5Tokenizer`)."""
    from transformers import T5TokenizerFast

    return T5TokenizerFast(vocab=t5_vocab(), extra_ids=EXTRA_IDS, model_max_length=model_max_length)


def build_tiny_t5_encoder(vocab_size: int, d_model: int = T5_D_MODEL):
    """A random `T5EncoderModel` with T5 v1.1's structure; seed torch before calling.

    Args:
        vocab_size: tokenizer size; the embedding is rounded up to a multiple of 64 as T5's
            (32 100 tokens, 32 128 rows), so ids past the tokenizer exist but are never produced.
        d_model: hidden width, the `joint_attention_dim` / `caption_channels` of the transformer.
    """
    from transformers import T5Config, T5EncoderModel

    num_heads = 4
    config = T5Config(
        vocab_size=-(-vocab_size // 64) * 64,
        d_model=d_model,
        d_kv=d_model // num_heads,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=num_heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    )
    return T5EncoderModel(config).eval()
