"""TIT-Score (LPG-Bench's metric): describe the image with a VLM, compare the description with the prompt.

Following the TIT-Score reference code (README of `IntMeGroup/TIT-Score`, MIT; paper arXiv
2510.02987):

1. **Describe**: the VLM (default `Qwen/Qwen3-VL-8B-Instruct`; the reference uses Qwen2.5-VL)
   gets one user turn, the image then "Please provide a detailed, single-paragraph description
   of the image in English, using between 250 and 350 words.", and generates up to 512 new
   tokens: a real ``generate`` call with `REFERENCE_GENERATION`, greedy (``do_sample=False``)
   with a repetition penalty of 1.05. The reference runs the model's own generation config,
   which for its Qwen2.5-VL is top-k 1 (greedy) with ``repetition_penalty`` 1.05; the penalty is
   kept so descriptions (and scores) compare with the reference's, and greedy keeps them
   reproducible. ``generation_kwargs`` overrides either (``{"repetition_penalty": 1.0}``: plain
   greedy); Qwen3-VL's own generation config samples, and ``do_sample=False`` overrides it.
   transformers 5.25 leaves a left-padded batch's padding out of the penalty, so an image's
   description does not depend on its batch mates (checked on the tiny model; other releases
   unchecked); images of one size have prompts of one length, so a batch of generated images has
   no padding under any release.
   In bfloat16 (on a GPU) a batch's matrix products round otherwise than one image's, which can
   change a greedy token and so the rest of the description: the reference describes one image at a
   time, which a batch of one (`gors evaluate --scorer_batch_size 1`) reproduces.
   A thinking describer (Qwen3-VL-*-Thinking) is refused: its reasoning would be embedded as
   the description (`rewards.vlm.check_answers_directly`).
2. **Compare**, TIT-Score (``judge="embedding"``, default): the prompt and the description are
   embedded by a text-embedding model (default `Qwen/Qwen3-Embedding-8B`, loaded with
   ``AutoModel`` in float32 by default: the reference loads it without a dtype, which
   transformers 4.x reads as float32, where 5.x would read it as "auto"; ``embedding_dtype``
   picks bfloat16 or float16 to halve its memory, see `TITScoreReward`; tokenizer with left
   padding, its own special tokens, truncation at 8192 tokens), pooled at the last token,
   L2-normalised; the TIT-Score is their cosine, rounded to 4 decimals per image as the
   reference does (``round(final_score, 4)``). The prompt is embedded as given, not stripped (as
   in the reference code). No instruction prefix is added (as in the reference code); ``query_instruction`` adds
   Qwen3-Embedding's "Instruct: ...\\nQuery:" prefix to the prompt if wanted.
   The reward is the cosine mapped to [0, 1] by `rewards.tit_rules.cosine_to_score`
   ("clip": max(cosine, 0), the TIT-Score itself whenever positive; or "affine").
   TIT-Score-LLM (``judge="llm"``): a chat LLM run through transformers (default
   `Qwen/Qwen3-8B`, thinking off) reads `rewards.tit_rules.JUDGE_TEMPLATE` (our wording: the
   paper's Gemini prompt is not published) and answers an integer 0-100; the first number of
   its reply / 100 is the score, and a reply without a rating scores 0 (``parsed: false`` in
   the details).
"""

from __future__ import annotations

import math
from collections.abc import Mapping as MappingABC
from typing import Any, Literal

import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import Reward, RewardOutput, check_choice, check_number
from rewards.tit_rules import (
    DESCRIPTION_PROMPT,
    JUDGE_SCALE,
    JUDGE_TEMPLATE,
    Mapping,
    cosine_similarities,
    cosine_to_score,
    last_token_pool,
    parse_judge_rating,
    query_text,
    word_count,
)
from rewards.vlm import MODEL_FLAG, ChatVLM, load_chat_vlm

EMBEDDING_FLAG = "embedding_model_name_or_path"
JUDGE_FLAG = "judge_model_name_or_path"
# The describer's decoding by default: the reference's (its Qwen2.5-VL generation config is top-k 1
# with a repetition penalty of 1.05), greedy so that a description is reproducible.
REFERENCE_GENERATION: dict[str, Any] = {"do_sample": False, "repetition_penalty": 1.05}
# `embedding_dtype` values. Qwen3-Embedding-8B's 7.6 B parameters take about 30 GB in float32 (the
# reference's), 15 GB in bfloat16 or float16.
EmbeddingDtype = Literal["float32", "bfloat16", "float16"]
EMBEDDING_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}


def embedding_torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of an `embedding_dtype` option value ("float32", "bfloat16" or "float16")."""
    if name not in EMBEDDING_DTYPES:
        raise ValueError(
            f"embedding_dtype={name!r} is not a dtype the embedder runs in; give one of "
            f"{', '.join(map(repr, EMBEDDING_DTYPES))} (float32, the reference's, is the default; "
            "bfloat16 halves the embedder's memory)"
        )
    return EMBEDDING_DTYPES[name]


class Describer:
    """A Qwen3-VL chat model (loaded as `rewards.vlm.ChatVLM`) writing one description per image.

    Args:
        vlm: the loaded chat VLM.
        instruction: the user text after the image.
        max_new_tokens: generation budget per description (512 in the reference code).
        generation_kwargs: ``generate`` arguments over `REFERENCE_GENERATION` (greedy with
            ``repetition_penalty=1.05``, the reference's decoding); a key given here replaces its
            default.
    """

    def __init__(self, vlm: ChatVLM, instruction: str = DESCRIPTION_PROMPT, max_new_tokens: int = 512,
                 generation_kwargs: dict[str, Any] | None = None) -> None:
        self.vlm = vlm
        self.instruction = instruction
        self.max_new_tokens = max_new_tokens
        self.generation_kwargs = {**REFERENCE_GENERATION, **(generation_kwargs or {})}
        # Left padding: generation continues every row right after its own last token.
        self.vlm.tokenizer.padding_side = "left"

    @torch.no_grad()
    def describe(self, images: list[Image.Image]) -> list[str]:
        """One description per image (RGB), generated together as one batch."""
        text = self.vlm.chat_text(self.instruction)
        inputs = self.vlm.processor(
            text=[text] * len(images), images=images, padding=True, return_tensors="pt"
        ).to(self.vlm.device)
        output = self.vlm.model.generate(**inputs, max_new_tokens=self.max_new_tokens, **self.generation_kwargs)
        new_tokens = output[:, inputs["input_ids"].shape[1]:]
        replies = self.vlm.tokenizer.batch_decode(
            new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        return [reply.strip() for reply in replies]


class TextEmbedder:
    """A text-embedding model with last-token pooling and L2 normalisation (Qwen3-Embedding's recipe).

    Args:
        model_name_or_path: Hub id or folder, e.g. `Qwen/Qwen3-Embedding-8B`.
        device, torch_dtype: where and in which dtype the model runs.
        max_length: tokens per text before truncation (8192 in the reference code).
    """

    def __init__(self, model_name_or_path: str, device: torch.device, torch_dtype: torch.dtype,
                 max_length: int = 8192) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.device = device
        self.max_length = max_length
        self.tokenizer = from_pretrained(AutoTokenizer.from_pretrained, model_name_or_path, EMBEDDING_FLAG,
                                         padding_side="left")
        model = from_pretrained(AutoModel.from_pretrained, model_name_or_path, EMBEDDING_FLAG, dtype=torch_dtype)
        self.model = model.to(device).eval().requires_grad_(False)

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(len(texts), hidden) L2-normalised float32 embeddings, all texts in one padded batch."""
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)
        mask = batch["attention_mask"]
        # Positions counted over real tokens only, so a text's embedding does not depend on the
        # padding it got (RoPE would make it so up to round-off anyway).
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        hidden = self.model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions).last_hidden_state
        return torch.nn.functional.normalize(last_token_pool(hidden, mask).float(), p=2, dim=-1)


class LLMJudge:
    """A chat LLM (``AutoModelForCausalLM``) rating description-prompt consistency 0-100 (TIT-Score-LLM).

    Args:
        model_name_or_path: Hub id or folder of a chat model, e.g. `Qwen/Qwen3-8B`.
        device, torch_dtype: where and in which dtype the model runs.
        max_new_tokens: reply budget (the answer is one number).
    """

    def __init__(self, model_name_or_path: str, device: torch.device, torch_dtype: torch.dtype,
                 max_new_tokens: int = 16) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device
        self.max_new_tokens = max_new_tokens
        self.tokenizer = from_pretrained(AutoTokenizer.from_pretrained, model_name_or_path, JUDGE_FLAG,
                                         padding_side="left")
        if self.tokenizer.chat_template is None:
            raise ValueError(f"{JUDGE_FLAG}={model_name_or_path!r} has no chat template; pass a chat (instruct) model")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = from_pretrained(AutoModelForCausalLM.from_pretrained, model_name_or_path, JUDGE_FLAG, dtype=torch_dtype)
        self.model = model.to(device).eval().requires_grad_(False)

    @torch.no_grad()
    def replies(self, prompts: list[str], descriptions: list[str]) -> list[str]:
        """The judge's reply to `JUDGE_TEMPLATE` for each (prompt, description), greedy."""
        texts = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": JUDGE_TEMPLATE.format(prompt=p, description=d)}],
                tokenize=False, add_generation_prompt=True, enable_thinking=False,
            )
            for p, d in zip(prompts, descriptions, strict=True)
        ]
        batch = self.tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt").to(self.device)
        output = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, do_sample=False,
                                     pad_token_id=self.tokenizer.pad_token_id)
        return [r.strip() for r in self.tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:],
                                                               skip_special_tokens=True)]


class TITScoreReward(Reward):
    """TIT-Score: cosine between the prompt and a VLM's description of the image, mapped to [0, 1].

    Args:
        model_name_or_path: the describing VLM (Qwen3-VL chat checkpoint; default
            `Qwen/Qwen3-VL-8B-Instruct`).
        device, torch_dtype, batch_size: see `Reward`; `batch_size` images are described
            (and their texts embedded or judged) together.
        embedding_model_name_or_path: text-embedding model (default `Qwen/Qwen3-Embedding-8B`;
            `Qwen/Qwen3-Embedding-0.6B` is a smaller choice).
        judge: "embedding" (TIT-Score) or "llm" (TIT-Score-LLM).
        judge_model_name_or_path: the LLM judge for ``judge="llm"`` (default `Qwen/Qwen3-8B`).
        max_new_tokens: description budget in tokens (512, as the reference code).
        mapping: cosine -> [0, 1], "clip" (default) or "affine" (`rewards.tit_rules.cosine_to_score`).
        query_instruction: optional Qwen3-Embedding instruction for the prompt (none by default).
        max_length: embedding truncation length in tokens (8192).
        generation_kwargs: ``generate`` arguments for the description over the default, greedy
            with ``repetition_penalty=1.05`` as the reference (`REFERENCE_GENERATION`);
            ``{"repetition_penalty": 1.0}`` gives plain greedy.
        embedding_dtype: the embedder's dtype, "float32" (default: the reference's, so cosines
            compare with its numbers), "bfloat16" or "float16". Qwen3-Embedding-8B takes about
            30 GB in float32 and 15 GB in half precision; beside the describer (Qwen3-VL-8B in
            bfloat16, about 17.5 GB) that is about 48 GB of weights in float32 (more than a 40 GB
            GPU holds, and no room left for activations on a 48 GB one) and about 33 GB in
            bfloat16. Half precision moves the cosines by its round-off (not measured on the 8B
            models), so they may differ from the reference's in the 4th decimal.

    Details per image: description, description_words, and either cosine (raw TIT-Score in
    [-1, 1], rounded to 4 decimals as the reference code rounds it) and mapping, or judge_reply,
    judge_rating (0-100 or None) and parsed; score.
    """

    name = "tit_score"
    scoring_version = 2  # 2: the reference's repetition penalty 1.05 in the description (1: plain greedy)
    default_model = "Qwen/Qwen3-VL-8B-Instruct"
    default_embedding_model = "Qwen/Qwen3-Embedding-8B"
    default_judge_model = "Qwen/Qwen3-8B"
    categories = ("complex",)
    # The reference loads its describer in bfloat16 (as its checkpoints are); on a GPU benchmarks score
    # in it rather than the generation precision. The LLM judge shares that dtype; the embedder is
    # float32 by default, as the reference loads it (no dtype given), or `embedding_dtype`.
    official_dtype = torch.bfloat16
    overflows_in_float16 = True
    description = (
        "TIT-Score (LPG-Bench): cosine between the prompt and Qwen3-VL's description of the image, "
        "embedded by Qwen3-Embedding; TIT-Score-LLM with an LLM judge"
    )

    @classmethod
    def check_options(cls, options: MappingABC[str, Any]) -> None:
        """Refuse, before any model loads, an unknown `judge`, `mapping` or `embedding_dtype`, and fewer
        than one new token or one token of input."""
        check_choice("judge", options.get("judge", "embedding"), ("embedding", "llm"))
        check_choice("mapping", options.get("mapping", "clip"), ("clip", "affine"))
        check_number("max_new_tokens", options.get("max_new_tokens", 512), 1, math.inf)
        check_number("max_length", options.get("max_length", 8192), 1, math.inf)
        embedding_torch_dtype(options.get("embedding_dtype", "float32"))

    @classmethod
    def models(cls, options: MappingABC[str, Any]) -> dict[str, str]:
        """The describing VLM and the judge's model: the embedder, or the LLM with ``judge="llm"``."""
        models = super().models(options)
        unused = "judge_model_name_or_path" if options.get("judge", "embedding") == "embedding" \
            else "embedding_model_name_or_path"
        models.pop(unused, None)
        return models

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 4,
        embedding_model_name_or_path: str | None = None,
        judge: Literal["embedding", "llm"] = "embedding",
        judge_model_name_or_path: str | None = None,
        max_new_tokens: int = 512,
        mapping: Mapping = "clip",
        query_instruction: str | None = None,
        max_length: int = 8192,
        generation_kwargs: dict[str, Any] | None = None,
        embedding_dtype: EmbeddingDtype = "float32",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"judge": judge, "mapping": mapping, "max_new_tokens": max_new_tokens,
                            "max_length": max_length, "embedding_dtype": embedding_dtype})
        embedder_dtype = embedding_torch_dtype(embedding_dtype)
        self.judge, self.mapping, self.query_instruction = judge, mapping, query_instruction
        vlm = load_chat_vlm(str(self.model_name_or_path), self.device, self.torch_dtype, MODEL_FLAG)
        self.describer = Describer(vlm, max_new_tokens=max_new_tokens, generation_kwargs=generation_kwargs)
        self.embedder: TextEmbedder | None = None
        self.llm: LLMJudge | None = None
        if judge == "embedding":
            self.embedder = TextEmbedder(embedding_model_name_or_path or self.default_embedding_model,
                                         self.device, embedder_dtype, max_length)
        else:
            self.llm = LLMJudge(judge_model_name_or_path or self.default_judge_model, self.device, self.torch_dtype)

    def similarities(self, prompts: list[str], descriptions: list[str]) -> list[float]:
        """Raw TIT-Scores: cosine in [-1, 1] between each prompt's and description's embeddings."""
        if self.embedder is None:
            raise RuntimeError("similarities need the embedding judge (judge='embedding')")
        embeddings = self.embedder.embed([query_text(p, self.query_instruction) for p in prompts] + descriptions)
        return cosine_similarities(embeddings[: len(prompts)], embeddings[len(prompts):]).tolist()

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        scores: list[float] = []
        details: list[dict[str, Any]] = []
        for start in range(0, len(images), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            descriptions = self.describer.describe(images[chunk])
            for prompt, description, extra in zip(prompts[chunk], descriptions, self._compare(prompts[chunk], descriptions)):
                scores.append(extra["score"])
                details.append({"description": description, "description_words": word_count(description), **extra})
        return RewardOutput(scores=scores, details=details)

    def _compare(self, prompts: list[str], descriptions: list[str]) -> list[dict[str, Any]]:
        """Per pair: the score in [0, 1] and what it was computed from."""
        if self.llm is None:
            return [
                {"cosine": cosine, "mapping": self.mapping, "score": cosine_to_score(cosine, self.mapping)}
                # The reference rounds each TIT-Score to 4 decimals (`round(final_score, 4)`).
                for cosine in (round(value, 4) for value in self.similarities(prompts, descriptions))
            ]
        results = []
        for reply in self.llm.replies(prompts, descriptions):
            rating = parse_judge_rating(reply)
            results.append({
                "judge_reply": reply, "parsed": rating is not None, "judge_rating": rating,
                "score": 0.0 if rating is None else rating / JUDGE_SCALE,
            })
        return results
