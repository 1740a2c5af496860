"""GenEval 2's evaluators as rewards: Soft-TIFA (AM / GM), TIFA and VQAScore on one chat VLM.

All three ask Qwen3-VL (default `Qwen/Qwen3-VL-8B-Instruct`, GenEval 2's judge) about the image
and read the distribution of the first answer token, as GenEval 2's ``evaluation.py``
(`facebookresearch/GenEval2`) does:

- **Soft-TIFA** (`SoftTIFAReward`, "soft_tifa"): each atom question is asked as
  "{question} Answer in one word."; the atom scores the summed probability of the expected
  answer's variants (`rewards.atoms.answer_variants`); the image scores their arithmetic (AM)
  or geometric (GM) mean.
- **TIFA** (`TIFAReward`, "tifa"): the same questions, each scoring 1 when the most probable
  token, lower-cased, is one of the variants, else 0; the image scores their mean.
- **VQAScore** (`VQAScoreReward`, "vqascore"): P(Yes variants) for
  'Does this image show "{prompt}"? Answer the question with Yes or No.'.

Atom questions come from the metadata's ``vqa_list`` (GenEval 2's data: [question, expected
answer] pairs, with optional ``skills``) when present, else from `rewards.atoms.prompt_atoms`.
Differences from the official script, none of which changes a score on GenEval 2's data with
Qwen3-VL in float32: no ``generate`` (the image encoded once and its chat prefix run once, then its
questions as one packed row of continuations; the same distribution up to round-off, which in
bfloat16, the benchmark's dtype on a GPU, moves an answer's probability by up to 0.013 on the tiny
test model and 0.13 relative at Qwen3-VL-8B's size with random weights, not measured with the trained
weights, see `rewards.vlm`; ``procedure="generate"`` runs the official ``generate`` instead); variant
token ids are deduplicated; answers the data never hold (an expected "No", digits, counts above
ten) get their own variants; an image without atoms scores 1.0; VQAScore formats the prompt
once (the official code calls ``format`` twice, which only matters for a prompt with braces).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import torch
from PIL import Image

from rewards.atoms import (
    QUESTION_SUFFIX,
    VQASCORE_TEMPLATE,
    YES_VARIANTS,
    Aggregation,
    Atom,
    MultiTokenPolicy,
    aggregate,
    answer_variants,
    atoms_from_vqa_list,
    prompt_atoms,
    tifa_correct,
    variant_probability,
    variant_token_ids,
)
from rewards.base import Reward, RewardOutput, check_choice
from rewards.vlm import MODEL_FLAG, load_chat_vlm

# How a question's answer distribution is computed (see `_ChatVLMReward`).
Procedure = Literal["one_pass", "generate"]
PROCEDURES: tuple[str, ...] = get_args(Procedure)


class _ChatVLMReward(Reward):
    """Shared loading and question answering of the three GenEval 2 rewards.

    Args:
        model_name_or_path: Qwen3-VL chat checkpoint (Hub id or folder); default
            `Qwen/Qwen3-VL-8B-Instruct`, GenEval 2's judge. A thinking variant
            (Qwen3-VL-*-Thinking) is refused at load (ValueError): its generation prompt opens a
            ``<think>`` block, so the first token read would be reasoning, not the answer
            (`rewards.vlm.check_answers_directly`).
        device, torch_dtype: where and in which dtype the model runs (see `Reward`; GenEval 2
            loads the model in bfloat16, `torch_dtype=torch.bfloat16` matches it, and benchmarks
            score in it on a GPU: `official_dtype`).
        batch_size: questions of one image per continuation pass (after its shared prefix);
            images are encoded `batch_size` at a time, `4 * batch_size` images per window.
        multi_token: what an answer variant of several tokens adds (see
            `rewards.atoms.variant_token_ids`): "first" (official) or "skip".
        procedure: "one_pass" (default): each image encoded once, its questions run on its shared chat
            prefix (`ChatVLM.next_token_probabilities`), the official distributions up to round-off; or
            "generate": GenEval 2's own procedure, ``generate`` of one token per question with the image
            re-encoded each time (`ChatVLM.generated_probabilities`), exact in bfloat16 too and several
            times slower (``benchmarks/soft_tifa_one_pass.py`` measures by how much).
    """

    default_model = "Qwen/Qwen3-VL-8B-Instruct"
    # GenEval 2's evaluation.py loads Qwen3-VL with dtype="auto": the checkpoint's bfloat16.
    official_dtype = torch.bfloat16
    overflows_in_float16 = True

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse a `multi_token` other than "first" or "skip" and a `procedure` other than "one_pass" or
        "generate"."""
        if "multi_token" in options:
            check_choice("multi_token", options["multi_token"], ("first", "skip"))
        if "procedure" in options:
            check_choice("procedure", options["procedure"], PROCEDURES)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        multi_token: MultiTokenPolicy = "first",
        procedure: Procedure = "one_pass",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"multi_token": multi_token, "procedure": procedure})
        self.multi_token, self.procedure = multi_token, procedure
        self.vlm = load_chat_vlm(str(self.model_name_or_path), self.device, self.torch_dtype, MODEL_FLAG)
        self._ids: dict[tuple[str, ...], list[int]] = {}

    def _variant_ids(self, variants: tuple[str, ...]) -> list[int]:
        if variants not in self._ids:
            encoded = [self.vlm.tokenizer(v, add_special_tokens=False).input_ids for v in variants]
            self._ids[variants] = variant_token_ids(encoded, self.multi_token)
        return self._ids[variants]

    def _ask(
        self, images: list[Image.Image], questions: list[tuple[int, str, tuple[str, ...]]]
    ) -> list[tuple[float, str]]:
        """(summed variant probability, decoded most probable token) of each question.

        `questions` holds (image index, message, answer variants). Images are encoded in
        windows of `4 * batch_size`, each once for all of its questions.
        """
        if self.procedure == "generate":
            return [self._answer(self.vlm.generated_probabilities(images[index], message), variants)
                    for index, message, variants in questions]
        answers: list[tuple[float, str]] = [(0.0, "")] * len(questions)
        window = 4 * self.batch_size
        for first in range(0, len(images), window):
            members = [k for k, q in enumerate(questions) if first <= q[0] < first + window]
            if not members:
                continue
            indices = sorted({questions[k][0] for k in members})
            encoded = []
            for start in range(0, len(indices), self.batch_size):
                part = indices[start : start + self.batch_size]
                encoded += self.vlm.encode_images([images[i] for i in part])
            slot = {index: position for position, index in enumerate(indices)}
            asked = [(slot[questions[k][0]], questions[k][1]) for k in members]
            for j, probs in self.vlm.next_token_probabilities(encoded, asked, self.batch_size):
                answers[members[j]] = self._answer(probs, questions[members[j]][2])
        return answers

    def _answer(self, probs: torch.Tensor, variants: tuple[str, ...]) -> tuple[float, str]:
        """(summed probability of the answer's variants, the most probable token decoded) of one distribution."""
        return variant_probability(probs, self._variant_ids(variants)), self.vlm.tokenizer.decode([int(probs.argmax())])


class _AtomReward(_ChatVLMReward):
    """Soft-TIFA and TIFA: atom questions per image, soft or hard atom scores, AM or GM."""

    hard: bool = False

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse `multi_token` and `procedure` as `_ChatVLMReward` does and an `aggregation` other than "am" or
        "gm"."""
        super().check_options(options)
        if "aggregation" in options:
            check_choice("aggregation", options["aggregation"], ("am", "gm"))

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        multi_token: MultiTokenPolicy = "first",
        aggregation: Aggregation = "gm",
        procedure: Procedure = "one_pass",
    ) -> None:
        self.check_options({"aggregation": aggregation})
        super().__init__(model_name_or_path, device, torch_dtype, batch_size, multi_token, procedure)
        self.aggregation = aggregation

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        atoms, sources = [], []
        for index, prompt in enumerate(prompts):
            entry = metadata[index] if metadata is not None else {}
            if entry.get("vqa_list") is not None:
                atoms.append(atoms_from_vqa_list(entry["vqa_list"], entry.get("skills") or ()))
                sources.append("vqa_list")
            else:
                atoms.append(prompt_atoms(prompt))
                sources.append("parser")
        flat = [(i, atom) for i, image_atoms in enumerate(atoms) for atom in image_atoms]
        answers = self._ask(
            images,
            [
                (i, atom.question + QUESTION_SUFFIX, answer_variants(atom.question, atom.answer))
                for i, atom in flat
            ],
        )
        scores, details = [], []
        cursor = 0
        for image_atoms, source in zip(atoms, sources, strict=True):
            part = answers[cursor : cursor + len(image_atoms)]
            cursor += len(image_atoms)
            details.append(self._details(image_atoms, part, source))
            scores.append(details[-1]["score"])
        return RewardOutput(scores=scores, details=details)

    def _details(
        self, atoms: list[Atom], answers: list[tuple[float, str]], source: str
    ) -> dict[str, Any]:
        predicted = [token for _, token in answers]
        if self.hard:
            atom_scores = [
                float(tifa_correct(token, answer_variants(a.question, a.answer)))
                for a, token in zip(atoms, predicted, strict=True)
            ]
        else:
            atom_scores = [p for p, _ in answers]
        return {
            "questions": [a.question for a in atoms],
            "expected_answers": [a.answer for a in atoms],
            "skills": [a.skill for a in atoms],
            "source": source,
            "atom_scores": atom_scores,
            "predicted": predicted,
            "am": aggregate(atom_scores, "am"),
            "gm": aggregate(atom_scores, "gm"),
            "score": aggregate(atom_scores, self.aggregation),
        }


class SoftTIFAReward(_AtomReward):
    """GenEval 2's Soft-TIFA: mean (AM or GM) of the atoms' answer probabilities; in [0, 1].

    Args: as `_ChatVLMReward`, plus
        aggregation: "gm" (Soft-TIFA GM, GenEval 2's prompt-level score; default) or "am"
            (Soft-TIFA AM, atom-level).

    Metadata (optional, per image): ``vqa_list`` ([question, expected answer] pairs) and
    ``skills``; without ``vqa_list`` the questions are written from the prompt.
    Details: questions, expected_answers, skills, source ("vqa_list" or "parser"),
    atom_scores (probabilities), predicted (most probable first tokens), am, gm, score.
    """

    name = "soft_tifa"
    categories = ("color", "shape", "texture", "spatial", "non_spatial", "complex")
    description = (
        "GenEval 2's Soft-TIFA: Qwen3-VL's probability of each atom's expected answer, "
        "averaged (GM or AM)"
    )


class TIFAReward(_AtomReward):
    """TIFA on GenEval 2's atoms: the fraction of atoms answered right (0/1 each); in [0, 1].

    As `SoftTIFAReward`, but an atom scores 1 when Qwen3-VL's most probable first token,
    lower-cased, is one of the expected answer's variants (GenEval 2's TIFA), else 0; the image
    scores the arithmetic mean by default (``aggregation="am"``, as the official script).
    """

    name = "tifa"
    hard = True
    categories = ("color", "shape", "texture", "spatial", "non_spatial", "complex")
    description = "TIFA on GenEval 2's atoms: fraction of questions Qwen3-VL answers as expected"

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        multi_token: MultiTokenPolicy = "first",
        aggregation: Aggregation = "am",
        procedure: Procedure = "one_pass",
    ) -> None:
        super().__init__(
            model_name_or_path, device, torch_dtype, batch_size, multi_token, aggregation, procedure
        )


class VQAScoreReward(_ChatVLMReward):
    """VQAScore as in GenEval 2: P(Yes) that the image shows the prompt; in [0, 1].

    Asks 'Does this image show "{prompt}"? Answer the question with Yes or No.' and sums the
    first-token probabilities of 'Yes', 'yes', ' yes', ' Yes'. Details: question, p_yes,
    predicted (the most probable first token), score.
    """

    name = "vqascore"
    categories = ("color", "shape", "texture", "spatial", "non_spatial", "complex")
    description = "VQAScore as in GenEval 2: Qwen3-VL's P(Yes) that the image shows the prompt"

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        questions = [VQASCORE_TEMPLATE.format(prompt=prompt) for prompt in prompts]
        answers = self._ask(
            images, [(i, question, YES_VARIANTS) for i, question in enumerate(questions)]
        )
        details = [
            {"question": question, "p_yes": p, "predicted": token, "score": p}
            for question, (p, token) in zip(questions, answers, strict=True)
        ]
        return RewardOutput(scores=[p for p, _ in answers], details=details)
