"""A tiny random Qwen3-VL chat model (`Qwen3VLForConditionalGeneration` + `Qwen3VLProcessor`).

The classes, token conventions and chat layout are those of `Qwen/Qwen3-VL-8B-Instruct`: a
byte-level BPE `Qwen2Tokenizer` with Qwen's pre-tokenizer (digits split one by one, so " 4" is
two tokens, a space and "4", as in the real model), the special tokens <|im_start|>,
<|im_end|>, <|vision_start|>, <|image_pad|>, <|vision_end|>, <|video_pad|>, <|endoftext|>, and a
chat template that writes ``<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>text
<|im_end|>\\n<|im_start|>assistant\\n``. Only the sizes differ: images are resized to at most
32 x 32 pixels (4-pixel patches, 2 x 2 merge: at most 16 image tokens), hidden size 32, two layers
per tower, deepstack features from both vision layers, a vocabulary of a few hundred tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Words the tokenizer learns whole, each with and without a leading space: every answer variant
# of GenEval 2 (Yes/No, the number words 1-10 and digits) and common question words.
WORDS = (
    "Yes yes No no one One two Two three Three four Four five Five six Six seven Seven eight "
    "Eight nine Nine ten Ten other How many are in the image Are there any Is Does this show "
    "Answer question with or word a an of and on to left right top front behind next near "
    "red green blue white black yellow car cars cow cows bicycle bicycles bench dog dogs cat "
    "plastic wooden user assistant"
)
# Square images of at most this side; the vision grid then has at most 8 x 8 patches.
MAX_SIDE = 32
PATCH_SIZE = 4
MERGE_SIZE = 2

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _train_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE vocabulary and merges learned from `WORDS` (deterministic)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    words = WORDS.split()
    # Each word starts a line once (no leading space) and follows a space once.
    corpus = [f"{word}\n x {word}" for word in words] + ["0 1 2 3 4 5 6 7 8 9 10 ? . , \" ' :"]
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        min_frequency=1,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    vocab = tokenizer.get_vocab()
    merges = [tuple(pair) for pair in json.loads(tokenizer.to_str())["model"]["merges"]]
    return dict(sorted(vocab.items(), key=lambda item: item[1])), merges


def build_tiny_qwen3_vl(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random Qwen3-VL chat model and its processor; returns `save_dir`.

    `AutoModelForImageTextToText.from_pretrained(save_dir)` and
    `AutoProcessor.from_pretrained(save_dir)` load it offline. The same `seed` gives the same
    weights.
    """
    from transformers import (
        Qwen2Tokenizer,
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = _train_vocab()
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=SPECIAL_TOKENS,
    )
    size = {"shortest_edge": (PATCH_SIZE * MERGE_SIZE) ** 2, "longest_edge": MAX_SIDE * MAX_SIDE}
    image_processor = Qwen2VLImageProcessor(
        size=size, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2
    )
    video_processor = Qwen3VLVideoProcessor(
        size=size, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(save_dir)

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    # A larger init than Qwen's 0.02 so answers differ visibly between images and questions.
    init = 0.5
    config = Qwen3VLConfig(
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "out_hidden_size": 32,
            "num_position_embeddings": 64,  # an 8 x 8 learned position grid
            "deepstack_visual_indexes": [0, 1],
            "initializer_range": init,
        },
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 512,
            "initializer_range": init,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
            "pad_token_id": ids["<|endoftext|>"],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    model.save_pretrained(save_dir)
    return save_dir
