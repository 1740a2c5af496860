"""Tiny random Qwen3 text models: an embedding model (`Qwen3Model`) and a chat LLM (`Qwen3ForCausalLM`).

The classes and token conventions are those of `Qwen/Qwen3-Embedding-8B` and `Qwen/Qwen3-8B`:
a byte-level BPE `Qwen2Tokenizer` with Qwen's pre-tokenizer, the special tokens <|endoftext|>,
<|im_start|>, <|im_end|>, <think>, </think>, and

- for the embedding model, left padding and a post-processor that appends <|endoftext|> to
  every text (as Qwen3-Embedding's tokenizer does, so the last token the pooling reads is
  always the same special token);
- for the chat model, a chat template writing ``<|im_start|>role\\ncontent<|im_end|>\\n`` turns
  and ``<|im_start|>assistant\\n`` as the generation prompt (Qwen3's layout, without the
  thinking block, which ``enable_thinking=False`` also drops in the real template).

Only the sizes differ: hidden size 32, two layers, a vocabulary of a few hundred tokens.
`AutoModel` / `AutoModelForCausalLM` and `AutoTokenizer` load the saved folders offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Words learned whole (with and without a leading space); anything else falls back to bytes.
WORDS = (
    "a an the of and in on with is are red green blue white black yellow cat dog car cars "
    "tree house sky sun image photo shows scene detailed description prompt score rate from "
    "to 0 100 user assistant system answer number"
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _tokenizer(padding_side: str, append_eos: bool):
    """A `Qwen2Tokenizer` with a vocabulary learned from `WORDS` (deterministic)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    trainer_tokenizer = Tokenizer(models.BPE())
    trainer_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=1000, min_frequency=1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trainer_tokenizer.train_from_iterator([f"{w}\n x {w}" for w in WORDS.split()], trainer=trainer)
    vocab = dict(sorted(trainer_tokenizer.get_vocab().items(), key=lambda item: item[1]))
    merges = [tuple(pair) for pair in json.loads(trainer_tokenizer.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=SPECIAL_TOKENS, padding_side=padding_side,
    )
    if append_eos:
        eos = "<|endoftext|>"
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:1 {eos}:1",
            special_tokens=[(eos, tokenizer.convert_tokens_to_ids(eos))],
        )
    return tokenizer


def _config(vocab_size: int, pad_token_id: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
        pad_token_id=pad_token_id, tie_word_embeddings=False,
        # A larger init than Qwen's 0.02 so embeddings of different texts differ visibly.
        initializer_range=0.5,
    )


def build_tiny_qwen3_embedding(save_dir: str | Path, seed: int = 0) -> Path:
    """Save a tiny random `Qwen3Model` + left-padding tokenizer (appends <|endoftext|>); returns `save_dir`."""
    from transformers import Qwen3Model

    save_dir = Path(save_dir)
    tokenizer = _tokenizer("left", append_eos=True)
    tokenizer.save_pretrained(save_dir)
    torch.manual_seed(seed)
    Qwen3Model(_config(len(tokenizer), tokenizer.pad_token_id)).eval().save_pretrained(save_dir)
    return save_dir


def build_tiny_qwen3_chat(save_dir: str | Path, seed: int = 0) -> Path:
    """Save a tiny random `Qwen3ForCausalLM` + tokenizer with a chat template; returns `save_dir`."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    save_dir = Path(save_dir)
    tokenizer = _tokenizer("left", append_eos=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(save_dir)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_config(len(tokenizer), tokenizer.pad_token_id)).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(save_dir)
    return save_dir
