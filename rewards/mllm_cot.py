"""T2I-CompBench's MLLM chain-of-thought judge (`mllm_cot`) on a Qwen3-VL chat model.

The paper's MLLM evaluation (MiniGPT-4-CoT): in one conversation about the image, the judge first
describes it, then rates the image-text alignment from 0 to 100 with the category's criteria; the
official questions and parser are in `rewards.mllm_cot_prompts`. Here the judge is any Qwen3-VL
chat checkpoint (default `Qwen/Qwen3-VL-8B-Instruct`, the judge gors already uses for GenEval 2),
decoding is greedy with at most `max_new_tokens` per answer, and the score is the parsed number
/ 100, in [0, 1]. color, shape and texture ask one scoring question per noun phrase and average
them, as the official attribute script does.

An answer without a whole number from 0 to 100 scores 0 for its question, as in the official
script (its running sum is not increased), and the image's details say which answer had no
number. The official script then asks the same question again, up to 3 more times with sampling
(top-p 0.9; temperature 0.7 in the attribute script, 1 in the general one); with greedy decoding
here the question is asked once. Other differences from
the official MiniGPT-4 script: greedy decoding instead of sampling (deterministic scores), the
chat template of the judge instead of MiniGPT-4's "###Human / ###Assistant" format, and a bounded
answer length (default 300 new tokens, the official ``max_new_tokens``).

How it runs (`ChatJudge`): a batch of images is encoded by the vision tower once; every image's
conversation then runs as one row of a batched key/value cache that is kept across turns. Each
turn appends the tokens of the next chat message (the judge's previous answer closed as the chat
template writes it, then the new question) to the rows that have one, right-padded, and decodes
greedily, one column per step for the whole batch; padding and the steps after a row's end of
answer are masked out of the attention. A turn's new tokens are the full conversation as the chat
template renders it, after the longest common token prefix with what the cache already holds, so
each answer equals that of a plain ``generate`` on the re-rendered conversation (what the official
scripts run for every answer) up to float round-off; ``tests/test_mllm_cot.py`` checks the texts
against ``generate`` per image on a tiny Qwen3-VL (in float32; in bfloat16 the round-off depends
on the batch, and on the tiny random model one of four images batched together got another answer
text than alone, so pass ``batch_size=1`` where one-image-at-a-time answers matter), and
``benchmarks/mllm_cot.py`` times it against both official procedures, ShareGPT4V-CoT's (the
vision tower in every turn) and MiniGPT-4-CoT's (the image encoded once): on 2 CPU cores at
Qwen3-VL-8B's proportions with 2 text and 2 vision layers, 2 images of 512 px and two turns of at
most 24 tokens, the measured ratios are in benchmarks/README.md; not yet measured on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import MODEL_FLAG, Reward, RewardOutput, check_choice, check_number
from rewards.mllm_cot_prompts import CATEGORIES, category_questions, check_category, parse_score
from rewards.noun_phrases import BACKENDS, Backend
from rewards.vlm import ChatVLM, EncodedImage, image_outputs, load_chat_vlm

if TYPE_CHECKING:
    from transformers import DynamicCache


@dataclass
class _Row:
    """One image's conversation in the batch: its messages and what the cache holds for it."""

    image: EncodedImage
    messages: list[dict[str, Any]]
    ids: list[int]  # token ids of the valid cache columns, in order
    columns: list[int]  # the cache column of each of `ids`
    prompt_length: int  # tokens of the first turn's prompt (chat start, image, first question)
    prompt_next_position: int  # M-RoPE position of the first token after that prompt
    answers: list[str] = field(default_factory=list)


@dataclass
class _Batch:
    """The conversations of a batch of images and the language model's key/value cache over them."""

    rows: list[_Row]
    cache: DynamicCache
    mask: torch.Tensor  # (rows, cache columns): 1 where a row attends to a column


class ChatJudge:
    """Multi-turn greedy chat with a Qwen3-VL `ChatVLM`, batched over images (see the module docstring).

    Args:
        vlm: the loaded chat model.
        max_new_tokens: the longest answer, in tokens (>= 1).
    """

    def __init__(self, vlm: ChatVLM, max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.vlm = vlm
        self.max_new_tokens = max_new_tokens
        eos = vlm.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = {token for token in [*eos, vlm.tokenizer.eos_token_id] if token is not None}

    @torch.no_grad()
    def conversations(self, images: Sequence[Image.Image], turns: Sequence[Sequence[str]]) -> list[list[str]]:
        """The answers of each image's conversation: ``turns[i]`` are image i's questions, asked in order.

        The first question of each image is sent with the image; every image has at least one.
        Returns one list of answers (decoded, stripped) per image, as long as its questions.
        """
        if not images or len(images) != len(turns) or any(not questions for questions in turns):
            raise ValueError("give at least one image, and every image at least one question")
        batch, logits = self._open(self.vlm.encode_images(images), [questions[0] for questions in turns])
        self._decode(batch, list(range(len(images))), logits)
        for turn in range(1, max(len(questions) for questions in turns)):
            asked = {i: questions[turn] for i, questions in enumerate(turns) if len(questions) > turn}
            self._decode(batch, list(asked), self._continue(batch, asked))
        return [row.answers for row in batch.rows]

    # ------------------------------------------------------------------------------------------

    def _tokens(self, messages: list[dict[str, Any]], image: EncodedImage) -> list[int]:
        """The chat template's rendering of `messages`, ready for the next answer, image placeholder expanded."""
        text = self.vlm.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        placeholder = self.vlm.image_token
        if text.count(placeholder) != 1:
            raise ValueError(f"the chat template wrote {text.count(placeholder)} image placeholders "
                             f"{placeholder!r} for one image; expected exactly one")
        text = text.replace(placeholder, placeholder * self.vlm.image_tokens(image))
        return self.vlm.tokenizer(text, add_special_tokens=False).input_ids

    def _open(self, encoded: list[EncodedImage], questions: list[str]) -> tuple[_Batch, torch.Tensor]:
        """The first turn's prompts (image + question) as one right-padded pass; the logits after each."""
        from transformers import DynamicCache

        base = self.vlm.model.base_model
        device = self.vlm.device
        messages = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
                    for q in questions]
        prompts = [self._tokens(m, image) for m, image in zip(messages, encoded)]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.vlm.tokenizer.pad_token_id, device=device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        positions = torch.zeros((3, len(prompts), width), dtype=torch.long, device=device)
        rows = []
        for i, (ids, image) in enumerate(zip(prompts, encoded)):
            row_ids = torch.tensor([ids], device=device)
            types = torch.tensor(self.vlm.processor.create_mm_token_type_ids([ids]), device=device)
            # Each row's own M-RoPE numbering, as `get_rope_index` gives it without padding.
            row_positions, _ = base.get_rope_index(row_ids, types, image_grid_thw=image.grid_thw[None])
            input_ids[i, : len(ids)] = row_ids[0]
            mask[i, : len(ids)] = 1
            positions[:, i, : len(ids)] = row_positions[:, 0]
            rows.append(_Row(image, messages[i], list(ids), list(range(len(ids))), len(ids),
                             int(row_positions.max()) + 1))
        batch = _Batch(rows, DynamicCache(config=self.vlm.model.config), mask)
        hidden = base(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                      mm_encoder_outputs={"image": image_outputs(encoded)}, cache=batch.cache,
                      use_cache=True).last_hidden_state
        last = torch.tensor([len(p) - 1 for p in prompts], device=device)
        return batch, self._logits(hidden[torch.arange(len(rows), device=device), last])

    def _continue(self, batch: _Batch, asked: dict[int, str]) -> torch.Tensor:
        """Close each asked row's last answer and add its next question; the logits after them."""
        tails: dict[int, list[int]] = {}
        for i, question in asked.items():
            row = batch.rows[i]
            row.messages += [{"role": "assistant", "content": row.answers[-1]},
                             {"role": "user", "content": [{"type": "text", "text": question}]}]
            target = self._tokens(row.messages, row.image)
            common = next((k for k, (a, b) in enumerate(zip(row.ids, target)) if a != b),
                          min(len(row.ids), len(target)))
            if common < row.prompt_length or common == len(target):
                raise RuntimeError("the chat template renders the conversation's earlier turns differently when "
                                   "a turn is added, so the conversation cannot be continued")
            # Columns after the common prefix (an answer the template re-tokenises otherwise) leave the attention.
            batch.mask[i, row.columns[common:]] = 0
            del row.ids[common:], row.columns[common:]
            tails[i] = target[common:]
        return self._append(batch, tails)

    def _decode(self, batch: _Batch, active: list[int], logits: torch.Tensor) -> None:
        """Greedy answers of the `active` rows, one batched step per token; each row's answer is appended."""
        generated: dict[int, list[int]] = {i: [] for i in active}
        running = set(active)
        for step in range(self.max_new_tokens):
            tokens = logits.argmax(dim=-1).tolist()
            for i in sorted(running):
                generated[i].append(tokens[i])
                if tokens[i] in self.eos_ids:
                    running.discard(i)
            if not running or step == self.max_new_tokens - 1:
                break
            logits = self._append(batch, {i: [tokens[i]] for i in running})
        for i in active:
            batch.rows[i].answers.append(self.vlm.tokenizer.decode(generated[i], skip_special_tokens=True).strip())

    def _append(self, batch: _Batch, tails: dict[int, list[int]]) -> torch.Tensor:
        """Run new tokens of some rows (``tails[i]``, right-padded) on the cache; the logits after each row's last.

        A row's new tokens take the next text positions after its valid tokens; padding and rows
        without new tokens get masked columns, which no later token attends to.
        """
        device = self.vlm.device
        width = max(len(tail) for tail in tails.values())
        start = batch.mask.shape[1]
        size = (len(batch.rows), width)
        input_ids = torch.full(size, self.vlm.tokenizer.pad_token_id, device=device)
        new_mask = torch.zeros(size, dtype=torch.long, device=device)
        positions = torch.zeros(size, dtype=torch.long, device=device)
        for i, tail in tails.items():
            row = batch.rows[i]
            first = row.prompt_next_position + len(row.ids) - row.prompt_length
            input_ids[i, : len(tail)] = torch.tensor(tail, device=device)
            new_mask[i, : len(tail)] = 1
            positions[i] = first + torch.arange(width, device=device)
            row.ids += tail
            row.columns += range(start, start + len(tail))
        batch.mask = torch.cat([batch.mask, new_mask], dim=1)
        # Text after the image: the same position on all three M-RoPE axes.
        hidden = self.vlm.model.base_model(input_ids=input_ids, attention_mask=batch.mask,
                                           position_ids=positions.expand(3, -1, -1), cache=batch.cache,
                                           use_cache=True).last_hidden_state
        last = torch.tensor([len(tails.get(i, [0])) - 1 for i in range(len(batch.rows))], device=device)
        return self._logits(hidden[torch.arange(len(batch.rows), device=device), last])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.vlm.model.get_output_embeddings()(hidden).float()


def check_chat_processor(model_name_or_path: str, flag: str = MODEL_FLAG) -> None:
    """Refuse, from its processor alone (before any weights load), a checkpoint that is not a chat VLM.

    A chat VLM's processor has a chat template and an image token; without them there is no
    conversation to hold (ValueError naming a checkpoint that has them).
    """
    from transformers import AutoProcessor

    processor = from_pretrained(AutoProcessor.from_pretrained, model_name_or_path, flag)
    missing = [what for what, attribute in (("chat template", "chat_template"), ("image token", "image_token"))
               if not getattr(processor, attribute, None)]
    if missing:
        raise ValueError(f"{flag}={model_name_or_path!r} is not a chat vision-language model: its processor has no "
                         f"{' and no '.join(missing)}. The MLLM-CoT judge holds a conversation about the image; "
                         "give a Qwen3-VL chat checkpoint, e.g. "
                         "Qwen/Qwen3-VL-8B-Instruct.")


class MLLMCoTReward(Reward):
    """T2I-CompBench's MLLM-CoT score on a Qwen3-VL chat judge: the 0-100 rating / 100, in [0, 1].

    Args:
        model_name_or_path: a Qwen3-VL chat checkpoint (Hub id or folder); default
            `Qwen/Qwen3-VL-8B-Instruct`. A checkpoint without a chat template or an image token is
            refused at load (ValueError), and so is a thinking variant (Qwen3-VL-*-Thinking), whose
            reasoning would spend the `max_new_tokens` budget before the rating
            (`rewards.vlm.check_answers_directly`).
        device, torch_dtype, batch_size: see `Reward`; `batch_size` images are judged together.
        category: the T2I-CompBench category whose questions are asked (required): color, shape,
            texture, spatial, non_spatial, complex, 3d_spatial or numeracy.
        max_new_tokens: the longest answer of each turn, in tokens (official: 300).
        noun_phrase_backend: how color, shape and texture prompts are split into noun phrases
            ("auto": spaCy's noun chunks when installed, as the official script, else gors' parser).

    Details per image: category, description (the first answer), questions (the scoring
    questions), answers, phrase_scores (each parsed 0-100 number, None where the answer had
    none), reasons (one per answer), reason (why the score is what it is), score.
    """

    name = "mllm_cot"
    default_model = "Qwen/Qwen3-VL-8B-Instruct"
    overflows_in_float16 = True
    categories = CATEGORIES
    description = ("T2I-CompBench's MLLM chain-of-thought judge on Qwen3-VL: describe the image, then rate "
                   "the prompt's alignment 0-100 with the category's official criteria")

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse a missing or unknown `category` (it has no default), `max_new_tokens` < 1 and an
        unknown parser."""
        if options.get("category") is None:
            raise ValueError(f"category=None: the MLLM-CoT judge asks the questions of one T2I-CompBench category; "
                             f"give one of {', '.join(CATEGORIES)}, e.g. {{\"category\": \"color\"}}")
        check_category(options["category"])
        if "max_new_tokens" in options:
            check_number("max_new_tokens", options["max_new_tokens"], 1, math.inf)
        if "noun_phrase_backend" in options:
            check_choice("noun_phrase_backend", options["noun_phrase_backend"], BACKENDS)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        category: str | None = None,
        max_new_tokens: int = 300,
        noun_phrase_backend: Backend = "auto",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"category": category, "max_new_tokens": max_new_tokens,
                            "noun_phrase_backend": noun_phrase_backend})
        self.category = category
        self.noun_phrase_backend = noun_phrase_backend
        check_chat_processor(str(self.model_name_or_path))
        vlm = load_chat_vlm(str(self.model_name_or_path), self.device, self.torch_dtype, MODEL_FLAG)
        self.judge = ChatJudge(vlm, max_new_tokens)

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        questions = [category_questions(self.category, prompt, self.noun_phrase_backend) for prompt in prompts]
        details: list[dict[str, Any]] = [{} for _ in prompts]
        # An attribute prompt without a noun phrase has nothing to rate: it is not sent to the judge.
        judged = [i for i, q in enumerate(questions) if q.rate]
        for start in range(0, len(judged), self.batch_size):
            part = judged[start : start + self.batch_size]
            answers = self.judge.conversations(
                [images[i] for i in part], [(questions[i].describe, *questions[i].rate) for i in part]
            )
            for i, conversation in zip(part, answers, strict=True):
                details[i] = self._details(questions[i].rate, conversation)
        for i, q in enumerate(questions):
            if not q.rate:
                details[i] = {"category": self.category, "description": None, "questions": [], "answers": [],
                              "phrase_scores": [], "reasons": [], "score": 0.0,
                              "reason": "the prompt has no noun phrase to rate"}
        return RewardOutput(scores=[d["score"] for d in details], details=details)

    def _details(self, rate: Sequence[str], conversation: list[str]) -> dict[str, Any]:
        parsed = [parse_score(answer) for answer in conversation[1:]]
        values = [value for value, _ in parsed]
        # An answer without a number counts 0, as in the official script; the reason says so.
        score = sum(value or 0.0 for value in values) / len(values) / 100
        missing = [k for k, value in enumerate(values) if value is None]
        if not missing:
            reason = f"rated {', '.join(f'{v:g}' for v in values)} out of 100"
        else:
            which = ", ".join(str(k + 1) for k in missing)
            reason = (f"scoring answer {which} of {len(values)} had no whole number from 0 to 100 "
                      "(counted as 0, as the official script does)")
        return {"category": self.category, "description": conversation[0], "questions": list(rate),
                "answers": conversation[1:], "phrase_scores": values, "reasons": [r for _, r in parsed],
                "reason": reason, "score": score}
