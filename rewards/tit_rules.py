"""TIT-Score's decision rules, free of models: prompts, pooling, similarity, score mapping, judge parsing.

TIT-Score (Wang et al., "TIT-Score: Evaluating Long-Prompt Based Text-to-Image Alignment via
Text-to-Image-to-Text Consistency", arXiv 2510.02987; reference code in the README of
`IntMeGroup/TIT-Score`, MIT) describes the image with a VLM, then compares the description with
the prompt in the text domain:

- TIT-Score: both texts embedded by a text-embedding model (Qwen3-Embedding), last-token
  pooling, L2 normalisation, cosine similarity;
- TIT-Score-LLM: an LLM judges how well the description matches the prompt.
"""

from __future__ import annotations

import re
from typing import Literal

import torch

# The reference code's request to the VLM, word for word (it asks for 250-350 words).
DESCRIPTION_PROMPT = (
    "Please provide a detailed, single-paragraph description of the image in English, "
    "using between 250 and 350 words."
)
# Qwen3-Embedding's query format. The TIT-Score reference code embeds the prompt and the
# description as plain texts (no instruction), which is the default here too.
QUERY_TEMPLATE = "Instruct: {instruction}\nQuery:{text}"

# Our wording for TIT-Score-LLM's judge: the paper's own judge prompt (Gemini 2.5 Pro) is not
# published in the repository, so this is an assumption. The judge answers 0-100.
JUDGE_TEMPLATE = (
    "You compare two texts. The first is a prompt given to a text-to-image model; the second is "
    "a detailed description of the image the model generated.\n"
    "Rate how faithfully the described image follows the prompt: its objects, their attributes "
    "and counts, spatial relations, actions, setting, style and any written text. Ignore "
    "differences of wording, and details of the image that the prompt does not mention.\n"
    "Answer with one integer from 0 (the image has nothing to do with the prompt) to 100 (every "
    "element of the prompt is present and correct), and nothing else.\n\n"
    "Prompt:\n{prompt}\n\nImage description:\n{description}"
)
JUDGE_SCALE = 100.0

Mapping = Literal["clip", "affine"]


def query_text(text: str, instruction: str | None) -> str:
    """`text` as an embedding query: unchanged without an instruction, else Qwen3-Embedding's format."""
    return text if not instruction else QUERY_TEMPLATE.format(instruction=instruction, text=text)


def last_token_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The hidden state of each row's last real token; (batch, hidden).

    Args:
        hidden: (batch, length, hidden) last hidden states.
        attention_mask: (batch, length), 1 on real tokens, 0 on padding, either side.

    The reference code checks left padding for the whole batch; taking each row's last
    attended position gives the same vectors for left or right padding (and for mixed rows).
    """
    if attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not match hidden {tuple(hidden.shape)}")
    if (attention_mask.sum(dim=1) == 0).any():
        raise ValueError("a row of attention_mask has no real token; every text must have at least one token")
    length = attention_mask.shape[1]
    positions = torch.arange(length, device=attention_mask.device).expand_as(attention_mask)
    last = torch.where(attention_mask.bool(), positions, -1).max(dim=1).values
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def cosine_similarities(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine of two (batch, dim) tensors after L2 normalisation; float64, in [-1, 1]."""
    a = torch.nn.functional.normalize(first.double(), p=2, dim=-1)
    b = torch.nn.functional.normalize(second.double(), p=2, dim=-1)
    return (a * b).sum(dim=-1).clamp(-1.0, 1.0)


def cosine_to_score(cosine: float, mapping: Mapping = "clip") -> float:
    """A cosine in [-1, 1] as a score in [0, 1].

    "clip" (default): max(cosine, 0), i.e. the published TIT-Score itself whenever it is positive
    (embeddings of a prompt and a description of any image are positively correlated in practice,
    so the published numbers are kept); "affine": (1 + cosine) / 2, monotone over the whole range.
    """
    if not -1.0 - 1e-9 <= cosine <= 1.0 + 1e-9:
        raise ValueError(f"cosine must lie in [-1, 1], got {cosine}")
    if mapping == "clip":
        return min(max(cosine, 0.0), 1.0)
    if mapping == "affine":
        return min(max((1.0 + cosine) / 2.0, 0.0), 1.0)
    raise ValueError(f"mapping must be 'clip' or 'affine', got {mapping!r}")


_THINKING = re.compile(r"<think>.*?</think>", flags=re.DOTALL)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)")


def parse_judge_rating(reply: str) -> float | None:
    """The judge's rating on 0-100, or None when the reply holds no rating.

    The first number of the reply (after any <think>...</think> block) is the rating; a number
    above 100 is not a rating (None). "85" -> 85.0, "Score: 72/100" -> 72.0. The score in [0, 1]
    is rating / JUDGE_SCALE.
    """
    match = _NUMBER.search(_THINKING.sub(" ", reply))
    if match is None:
        return None
    value = float(match.group(1))
    return value if value <= JUDGE_SCALE else None


def word_count(text: str) -> int:
    """Words of a description (whitespace-separated), to check the 250-350 words asked for."""
    return len(text.split())
