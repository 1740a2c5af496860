"""B-VQA (T2I-CompBench's attribute-binding metric) as a reward: BLIP VQA yes-probabilities.

Each noun phrase of the prompt becomes a question ("a green bench?", see
`rewards.noun_phrases.vqa_questions`). BLIP answers each one; a question scores
P(yes) / (P(yes) + P(no)) from the first decoded answer token, and the image scores the product
over its questions, in [0, 1] (1.0 for a prompt without a noun phrase), as in the official
``BLIPvqa_eval`` code.

The official metric runs BLIP VQA with BLIP's own code (vendored in
``BLIPvqa_eval/models/blip_vqa.py``), which starts every question with the token [ENC] instead of
BERT's [CLS]; transformers' `BlipForQuestionAnswering.generate` keeps [CLS].
We follow the official code by default (`question_start="enc"`), so numbers compare with the
published tables; `question_start="cls"` gives transformers' behaviour.

The official metric runs the fine-tuned checkpoint (``model_base_vqa_capfilt_large.pth``) at
480 x 480 px (BLIP's ``configs/vqa.yaml``), 30 x 30 patches. The Hub's
``Salesforce/blip-vqa-capfilt-large`` is that checkpoint converted by transformers'
``convert_blip_original_pytorch_to_hf.py``, which loaded it at 384 px: BLIP's loader interpolated
its position embeddings to 24 x 24 (bicubic), and the Hub processor resizes to 384. With that
model gors runs at the official 480 px by default: images resized to 480 (bicubic, as both do) and
the position embeddings interpolated back to 30 x 30 the same way, once at load. The vision
encoder then sees the official 901 tokens; the main difference left is the round trip of the
position embeddings (30 -> 24 -> 30), which could not be measured here (no weights offline). An
image's product is taken in float32, one question after another, as the official script's tensor
holds it (`image_score`). As in BLIP's code, images are resized as PIL images (bicubic; transformers' default processor resizes tensors with torchvision, about
0.015 apart after normalising), the vision LayerNorms take eps 1e-6 (transformers' BLIP config
defaults to 1e-5), and P(yes) is the quotient of the float32 softmax's two probabilities. Like the
official code, each question's probability is rounded
to 4 decimals (BLIP's ``'{:.4f}'`` answer) before the product and the product to 4 decimals
again (``decimals=None`` keeps them unrounded). `image_size=384` gives the Hub's own set-up; other
checkpoints run at their processor's size, with a warning when that is below the official 480
(a local copy of the default model is not recognised by its path: pass `image_size=480`).

The questions come from a question table (`questions=TABLE.json`, see `rewards.question_table`)
for the prompts it holds and from the configured noun-phrase parser for the others; each detail
row records its `question_source`: the parser's name and version, and the table's sha256.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy
import torch
from PIL import Image

from gors.core.hub import from_pretrained
from gors.core.transfer import to_device
from rewards.base import MODEL_FLAG, Reward, RewardOutput, check_choice, check_number
from rewards.noun_phrases import BACKENDS, MAX_QUESTIONS, Backend, parser_record, vqa_questions
from rewards.question_table import QuestionTable, load_question_table

# The official code tokenises questions with truncation to 35 tokens.
MAX_QUESTION_TOKENS = 35
# BLIP's `pre_question` (T2I-CompBench's BLIPvqa_eval/data/utils.py): what it strips, and its word cap.
QUESTION_PUNCTUATION = re.compile(r"""[.!"()*#:;~]""")
MAX_QUESTION_WORDS = 50


def official_question(question: str) -> str:
    """`question` as the official VQA dataset hands it to BLIP: lower case, without the punctuation
    ``.!"()*#:;~`` ("?" stays), trailing spaces dropped, at most 50 words."""
    words = QUESTION_PUNCTUATION.sub("", question.lower()).rstrip(" ").split(" ")
    return " ".join(words[:MAX_QUESTION_WORDS])

# The official metric's input size (BLIP's configs/vqa.yaml), for its checkpoint, the reward's default model.
OFFICIAL_IMAGE_SIZE = 480
# BLIP's ViT builds its LayerNorms with eps 1e-6 (`partial(nn.LayerNorm, eps=1e-6)` in BLIP's models/vit.py);
# transformers' BLIP vision config defaults to 1e-5, which a converted checkpoint keeps unless its config says.
BLIP_VIT_LAYER_NORM_EPS = 1e-6
logger = logging.getLogger(__name__)


class BVQAReward(Reward):
    """BLIP-VQA binding score of (image, prompt) pairs; scores in [0, 1].

    Args:
        model_name_or_path: BLIP VQA checkpoint (Hub id or folder); default
            `Salesforce/blip-vqa-capfilt-large`, the model of the official metric.
        device, torch_dtype: where and in which dtype the model runs (see `Reward`).
        batch_size: questions per forward pass; questions of different images share a pass.
        max_questions: questions per prompt (the official code keeps the first 8 noun phrases).
        noun_phrase_backend: "auto" (spaCy's noun chunks when installed, else the built-in
            chunker), "spacy" or "builtin"; see `rewards.noun_phrases`.
        question_start: "enc" (official: BLIP's code replaces a question's first token by [ENC]) or
            "cls" (transformers' BLIP VQA inference).
        questions: a question table (JSON, see `rewards.question_table`) whose questions are used
            for every prompt it holds (capped at `max_questions`); other prompts are parsed.
        image_size: input side in pixels; the position embeddings are interpolated to it at load
            when the checkpoint has another. Default: 480 (the official metric's) for the default
            model, the processor's size for any other checkpoint.
        decimals: each question's probability and the image's score are rounded to this many
            decimals, as the official code writes them (4); None: unrounded.

    Details per image: questions, phrases, p_yes (each in [0, 1], unrounded), score, and question_source
    (``{"source": "table", "table_sha256": ..., "parser": {...}}`` or
    ``{"source": "parser", "parser": {...}}``, see `rewards.noun_phrases.parser_record`).
    """

    name = "b_vqa"
    # 2: BLIP's own image resize (PIL), LayerNorm eps and P(yes) quotient, each as the official code has it.
    scoring_version = 2
    # T2I-CompBench's BLIP_vqa.py runs BLIP (its vendored copy of BLIP's code) in float32.
    official_dtype = torch.float32
    default_model = "Salesforce/blip-vqa-capfilt-large"
    categories = ("color", "shape", "texture", "complex")

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse, before BLIP loads, a negative `decimals` or `max_questions`, an unknown `question_start` or
        `noun_phrase_backend` and an `image_size` below one 16-px patch."""
        check_number("decimals", options.get("decimals"), 0, math.inf, optional=True)
        check_number("max_questions", options.get("max_questions", MAX_QUESTIONS), 0, math.inf)
        check_choice("question_start", options.get("question_start", "enc"), ("enc", "cls"))
        check_choice("noun_phrase_backend", options.get("noun_phrase_backend", "auto"), BACKENDS)
        check_number("image_size", options.get("image_size"), 16, math.inf, optional=True)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        max_questions: int = MAX_QUESTIONS,
        noun_phrase_backend: Backend = "auto",
        question_start: Literal["enc", "cls"] = "enc",
        questions: str | os.PathLike[str] | None = None,
        image_size: int | None = None,
        decimals: int | None = 4,
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"decimals": decimals, "max_questions": max_questions, "question_start": question_start})
        self.decimals = decimals
        from transformers import BlipForQuestionAnswering, BlipImageProcessorPil, BlipProcessor

        self.max_questions = max_questions
        self.noun_phrase_backend = noun_phrase_backend
        # Both are checked before the model loads: a bad table or a missing spaCy model fails fast.
        self.questions: QuestionTable | None = None if questions is None else load_question_table(questions)
        self._warned_table_miss = False
        self.parser_source = {"source": "parser", "parser": parser_record(noun_phrase_backend)}
        path = str(self.model_name_or_path)
        self.processor = from_pretrained(BlipProcessor.from_pretrained, path, MODEL_FLAG)
        # BLIP's transform resizes the PIL image (`transforms.Resize`, bicubic): the PIL backend does the same,
        # where the default one resizes a tensor with torchvision (about 0.015 apart after normalising).
        self.processor.image_processor = from_pretrained(BlipImageProcessorPil.from_pretrained, path, MODEL_FLAG)
        model = from_pretrained(
            BlipForQuestionAnswering.from_pretrained, path, MODEL_FLAG, dtype=self.torch_dtype
        )
        self.model = model.to(self.device).eval().requires_grad_(False)
        set_vision_layer_norm_eps(self.model.vision_model, BLIP_VIT_LAYER_NORM_EPS)
        if image_size is None and self.model_name_or_path == self.default_model:
            image_size = OFFICIAL_IMAGE_SIZE
        elif image_size is None and self.model.vision_model.config.image_size < OFFICIAL_IMAGE_SIZE:
            logger.warning("B-VQA on %s runs at its processor's %d px; the official metric runs BLIP VQA at %d px. "
                           "If it is Salesforce/blip-vqa-capfilt-large (e.g. a local copy), pass image_size=%d.",
                           path, self.model.vision_model.config.image_size, OFFICIAL_IMAGE_SIZE, OFFICIAL_IMAGE_SIZE)
        if image_size is not None:
            resize_position_embeddings(self.model.vision_model, image_size)
        self.image_size = self.model.vision_model.config.image_size
        self.processor.image_processor.size = {"height": self.image_size, "width": self.image_size}
        self.yes_id = self._single_token_id("yes")
        self.no_id = self._single_token_id("no")
        # BLIP's tokenizer adds [DEC] (bos) and then [ENC] after BERT's vocabulary: 30522, 30523.
        text_config = self.model.config.text_config
        self.question_start_id = text_config.bos_token_id + 1 if question_start == "enc" else None
        if self.question_start_id is not None and self.question_start_id >= text_config.vocab_size:
            raise ValueError(
                f"{MODEL_FLAG}={self.model_name_or_path!r} has no [ENC] token after [DEC] "
                f"(vocab size {text_config.vocab_size}); use question_start='cls'."
            )

    def _single_token_id(self, word: str) -> int:
        ids = self.processor.tokenizer(word, add_special_tokens=False).input_ids
        if len(ids) != 1:
            raise ValueError(
                f"{MODEL_FLAG}={self.model_name_or_path!r}: the tokenizer splits {word!r} into "
                f"{len(ids)} tokens {ids}; B-VQA needs 'yes' and 'no' to be single tokens "
                "(a BLIP VQA checkpoint)."
            )
        return ids[0]

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        asked = [self.questions_of(p) for p in prompts]
        questions = [qs for qs, _ in asked]
        flat = [(index, q) for index, qs in enumerate(questions) for q in qs]
        p_yes = self._answer_probabilities(images, flat)
        details, scores = [], []
        cursor = 0
        for qs, (_, source) in zip(questions, asked, strict=True):
            probs = p_yes[cursor : cursor + len(qs)]
            cursor += len(qs)
            score = image_score(probs, self.decimals)
            scores.append(score)
            details.append(
                {"questions": qs, "phrases": [q[:-1] for q in qs], "p_yes": probs, "score": score,
                 "question_source": source}
            )
        return RewardOutput(scores=scores, details=details)

    def questions_of(self, prompt: str) -> tuple[list[str], dict[str, Any]]:
        """The questions B-VQA asks about `prompt` and their `question_source` record."""
        table = self.questions
        found = table.lookup(prompt) if table is not None else None
        if table is not None and found is not None:
            return found[: self.max_questions], table.source()
        if table is not None and not self._warned_table_miss:  # a table of another prompt set is no error, but says so
            self._warned_table_miss = True
            logger.warning("B-VQA: the question table %s (%d prompts) lacks %r, so its questions come from the parser "
                           "(noun_phrase_backend=%s); a table made for another prompt set asks none of its own "
                           "questions (`gors questions PROMPTS OUT.json` makes one for these prompts)",
                           table.path, len(table.questions), prompt, self.noun_phrase_backend)
        return vqa_questions(prompt, self.max_questions, self.noun_phrase_backend), self.parser_source

    def _answer_probabilities(
        self, images: list[Image.Image], questions: list[tuple[int, str]]
    ) -> list[float]:
        """P(yes) / (P(yes) + P(no)) of each (image index, question), in order; each in [0, 1].

        Images are taken in windows of `4 * batch_size` (bounding the memory of their features);
        each image's vision features are computed once, then the window's questions run in
        chunks of `batch_size`, questions of different images together. A chunk holds questions
        of one token length: transformers' BLIP text layers drop the cross-attention mask
        (`BlipTextAttention` passes it as `attention_mask`, which `BlipTextSelfAttention` then
        replaces by its unset `encoder_attention_mask`, checked on 5.24), so a padded question
        would attend to its padding and get another answer than alone.
        """
        if not questions:
            return []
        token_ids = self.processor.tokenizer(
            [official_question(q) for _, q in questions], truncation=True, max_length=MAX_QUESTION_TOKENS
        ).input_ids
        if self.question_start_id is not None:
            token_ids = [[self.question_start_id, *ids[1:]] for ids in token_ids]
        # Read back once, at the end: a read per chunk would make the host wait for the device each time.
        order: list[int] = []
        probabilities: list[torch.Tensor] = []
        window = 4 * self.batch_size
        for first in range(0, len(images), window):
            members = [
                k for k, (index, _) in enumerate(questions) if first <= index < first + window
            ]
            if not members:
                continue
            features = self._image_features(images, sorted({questions[k][0] for k in members}))
            by_length = sorted(members, key=lambda k: len(token_ids[k]))
            for _, same_length in itertools.groupby(by_length, key=lambda k: len(token_ids[k])):
                group = list(same_length)
                for start in range(0, len(group), self.batch_size):
                    chunk = group[start : start + self.batch_size]
                    probabilities.append(self._yes_probabilities(
                        to_device(torch.tensor([token_ids[k] for k in chunk]), self.device),
                        torch.stack([features[questions[k][0]] for k in chunk]),
                    ))
                    order += chunk
        result = [0.0] * len(questions)
        for k, probability in zip(order, torch.cat(probabilities).tolist(), strict=True):
            result[k] = probability
        return result

    def _image_features(
        self, images: list[Image.Image], indices: list[int]
    ) -> dict[int, torch.Tensor]:
        """Vision-transformer features (tokens x hidden) of `images[i]` for each i in `indices`."""
        features: dict[int, torch.Tensor] = {}
        for start in range(0, len(indices), self.batch_size):
            part = indices[start : start + self.batch_size]
            pixels = self.processor.image_processor([images[i] for i in part], return_tensors="pt")
            pixel_values = to_device(pixels.pixel_values, self.device).to(self.torch_dtype)
            features.update(
                zip(
                    part,
                    self.model.vision_model(pixel_values=pixel_values).last_hidden_state,
                    strict=True,
                )
            )
        return features

    def _yes_probabilities(
        self, input_ids: torch.Tensor, image_embeds: torch.Tensor
    ) -> torch.Tensor:
        """Normalised yes-probability of each question (unpadded `input_ids`) about its image, in [0, 1]
        (float32, on the device)."""
        model = self.model
        # The question encoding attends to the image, and the answer decoder to the question,
        # exactly as BlipForQuestionAnswering.generate does for one question.
        question_embeds = model.text_encoder(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=torch.ones(
                image_embeds.shape[:2], dtype=torch.long, device=self.device
            ),
        ).last_hidden_state
        bos = torch.full(
            (len(input_ids), 1), model.config.text_config.bos_token_id, device=self.device
        )
        logits = (
            model.text_decoder(input_ids=bos, encoder_hidden_states=question_embeds)
            .logits[:, 0]
            .float()
        )
        return yes_probability(logits, self.yes_id, self.no_id)


def image_score(p_yes: list[float], decimals: int | None = 4) -> float:
    """An image's B-VQA score in [0, 1] from its questions' P(yes) (each in [0, 1]); 1.0 without questions.

    With `decimals`, as the official `BLIP_vqa.py` computes it: each probability written with that many
    decimals and read back into a float32 tensor, the product taken there in float32, one question
    after another, and written with that many decimals again. None: the exact product, unrounded.
    """
    if decimals is None:
        return math.prod(p_yes)
    score = numpy.float32(1.0)
    for p in p_yes:
        score = score * numpy.float32(round(p, decimals))  # float32 x float32 stays float32, as on the tensor
    return round(float(score), decimals)


def yes_probability(logits: torch.Tensor, yes_id: int, no_id: int) -> torch.Tensor:
    """P(yes) / (P(yes) + P(no)) of each row of first-answer-token `logits` (rows x vocabulary, float32), in
    [0, 1], as the official code computes it: the softmax over the vocabulary, then the quotient.

    sigmoid(logit_yes - logit_no) is the same in exact arithmetic but rounds otherwise (about 1e-7, enough
    to move a 4-decimal answer now and then); it stands in only for a row where both probabilities
    underflow to 0, whose official quotient is NaN."""
    probabilities = logits.softmax(-1)
    p_yes, p_no = probabilities[:, yes_id], probabilities[:, no_id]
    total = p_yes + p_no
    fallback = torch.sigmoid(logits[:, yes_id] - logits[:, no_id])
    return torch.where(total > 0, p_yes / total, fallback)  # 0 / 0 is NaN only where not taken


def set_vision_layer_norm_eps(vision_model: torch.nn.Module, eps: float) -> None:
    """Give every LayerNorm of a BLIP vision model (and its config) `eps`, in place."""
    for module in vision_model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = eps
    vision_model.config.layer_norm_eps = eps


def resize_position_embeddings(vision_model: torch.nn.Module, image_size: int) -> None:
    """Let a BLIP vision model take `image_size` px inputs: its patch position embeddings
    interpolated to the new grid (bicubic, `align_corners=False`, as BLIP's checkpoint loader and
    transformers' `interpolate_pos_encoding` do), the class token's kept; in place, config updated."""
    embeddings = vision_model.embeddings
    config = vision_model.config
    if image_size % config.patch_size:
        raise ValueError(f"image_size={image_size}: must be a multiple of the patch size {config.patch_size}")
    if image_size == config.image_size:
        return
    table = embeddings.position_embedding.data
    old_grid, new_grid = config.image_size // config.patch_size, image_size // config.patch_size
    patches = table[:, 1:].reshape(1, old_grid, old_grid, -1).permute(0, 3, 1, 2).float()
    patches = torch.nn.functional.interpolate(patches, size=(new_grid, new_grid), mode="bicubic", align_corners=False)
    patches = patches.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, -1).to(table.dtype)
    embeddings.position_embedding = torch.nn.Parameter(torch.cat([table[:, :1], patches], dim=1), requires_grad=False)
    embeddings.image_size = config.image_size = image_size
    embeddings.num_patches = new_grid * new_grid
    embeddings.num_positions = new_grid * new_grid + 1
