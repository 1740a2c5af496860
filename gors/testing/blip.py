"""Tiny random BLIP models (VQA and captioning heads, with `BlipProcessor`) for offline tests.

The structure, token conventions and file layout are those of `Salesforce/blip-vqa-capfilt-large`
(BERT WordPiece tokenizer with "[DEC]" added as bos token right after the vocabulary, text
`bos_token_id` = that id, `pad_token_id` = [PAD], `sep_token_id` = [SEP]); only the sizes differ:
32x32 images, 8x8 patches, hidden size 32, two layers per tower, a 166-word vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = (
    "yes no a an the of and on in with next to top bottom left right side near behind "
    "red orange yellow green blue purple pink brown black white gray grey gold silver "
    "round square oval triangular rectangular circular spherical cylindrical conical "
    "metallic wooden fluffy plastic rubber leather glass fabric big small tall short "
    "car bench chair table cat dog bird horse cup bowl book vase bag box ball apple banana "
    "lamp desk clock sign bottle giraffe balloon man woman person slice pizza cutter"
)
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
PUNCTUATION = "?.,-'!"
IMAGE_SIZE = 32


def tiny_vocab() -> list[str]:
    """The WordPiece vocabulary: specials, common prompt words, then single characters.

    Single letters and their "##" continuations make every lower-case word tokenisable.
    """
    vocab = list(SPECIAL_TOKENS)
    for token in _WORDS.split() + list(PUNCTUATION) + list(LETTERS) + [f"##{c}" for c in LETTERS]:
        if token not in vocab:
            vocab.append(token)
    return vocab


def _build_tiny_blip(save_dir: str | Path, model_class: type, seed: int) -> Path:
    """Save a tiny random BLIP of `model_class` (VQA or captioning head) and its processor."""
    from transformers import BertTokenizer, BlipConfig, BlipImageProcessor, BlipProcessor

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    (save_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # BLIP adds "[DEC]" as the bos token after BERT's vocabulary (id 30522 in the real model).
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, bos_token="[DEC]")
    if tokenizer.bos_token_id != len(vocab):
        raise RuntimeError(f"[DEC] got id {tokenizer.bos_token_id}, expected {len(vocab)}")
    image_processor = BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    BlipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(save_dir)

    # A larger init than BLIP's 0.02 so answers and captions differ visibly between images.
    init = 0.5
    config = BlipConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=IMAGE_SIZE,
            patch_size=8,
            projection_dim=32,
            initializer_range=init,
        ),
        text_config=dict(
            # +1 leaves room for "[ENC]" as in the real checkpoint (30524 = 30522 + [DEC] + [ENC]).
            vocab_size=len(tokenizer) + 1,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=64,
            initializer_range=init,
            bos_token_id=tokenizer.bos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            sep_token_id=tokenizer.sep_token_id,
            eos_token_id=tokenizer.sep_token_id,
        ),
        projection_dim=32,
        image_text_hidden_size=16,
        initializer_range=init,
    )
    torch.manual_seed(seed)
    model_class(config).eval().save_pretrained(save_dir)
    return save_dir


def build_tiny_blip_vqa(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random BLIP VQA model and its processor; returns `save_dir`.

    `BlipForQuestionAnswering.from_pretrained(save_dir)` and
    `BlipProcessor.from_pretrained(save_dir)` load it offline. The same `seed` gives the same
    weights.
    """
    from transformers import BlipForQuestionAnswering

    return _build_tiny_blip(save_dir, BlipForQuestionAnswering, seed)


def build_tiny_blip_captioner(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random BLIP captioning model and its processor; returns `save_dir`.

    Token conventions of `Salesforce/blip-image-captioning-large` ([SEP] ends a caption);
    `BlipForConditionalGeneration.from_pretrained(save_dir)` loads it offline.
    """
    from transformers import BlipForConditionalGeneration

    return _build_tiny_blip(save_dir, BlipForConditionalGeneration, seed)
