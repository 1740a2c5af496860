"""A chat VLM answering questions about images: the next-token distribution of each answer.

GenEval 2's evaluator (Soft-TIFA, TIFA, VQAScore) sends a chat message "<image> question" to
Qwen3-VL and reads the distribution of the first answer token (``generate`` with one new token),
running the whole model, vision tower included, once per question. `ChatVLM` gives the same
distribution, computing what the questions of an image share only once:

1. each image is preprocessed and run through the vision tower once; Qwen3-VL's merged patch
   embeddings and its deepstack features (the vision layers' features that the first decoder
   layers add at the image positions) are kept (`encode_images`);
2. the chat prompt of a question is rendered with the processor's chat template, the image
   placeholder expanded to the image's token count as the processor does, and tokenised. Its
   first tokens, up to and including the image tokens, are the same for every question of the
   image: the *shared prefix* (where it ends is found once, in `__init__`, from two rendered
   questions: their longest common token prefix, cut back to just after the last added token
   such as ``<|vision_end|>``, across which the tokenizer never merges);
3. per image, the prefix runs through the language model once, with the kept features passed
   as ``mm_encoder_outputs`` and the M-RoPE position ids of Qwen3-VL's ``get_rope_index``; its
   key/value cache (a `DynamicCache`) is kept. The image tokens and the deepstack injection lie
   in the prefix only, so nothing after it depends on the image except through that cache;
4. the image's questions (their tokens after the prefix) then run as one packed row of
   continuations on that cache: a prefix tree (`QuestionTree`) of their token sequences, so that
   leading tokens several questions share ("Are the", "How many") are computed once and no row
   is padded. Each token attends to the prefix and to its own question's earlier tokens (its
   ancestors in the tree), through a 4D attention mask; its M-RoPE position is a text position
   (the same on all three axes) counting on from the prefix's largest position + 1 by its depth
   in the tree, as ``get_rope_index`` numbers text after an image. The continuation appends to a
   branch of the prefix's cache that shares its tensors (`branch_cache`), so the prefix's cache
   is left as it is for the image's next batch of questions;
5. the hidden state at each question's last token goes through the LM head and a float32
   softmax, the rows of several images in one product: the head's weight (vocabulary x hidden
   size, 2.5 GB for Qwen3-VL-8B in float32) is then read once for all of them, where a product
   of a few rows is bound by that read.

Each distribution equals that of a plain full forward ``model(**processor.apply_chat_template(
...))`` of its question alone, and that of GenEval 2's ``generate(max_new_tokens=1)``, up to float
round-off (checked in ``tests/test_vlm_prefix.py`` on a tiny random Qwen3-VL, to 1e-4 relative).
That holds in float32. In bfloat16, the dtype benchmarks score Qwen3-VL in on a GPU, the round-off
is bfloat16's and depends on how the questions are packed: on the tiny random model an answer's
probability moved by up to 0.013 between `batch_size` 8 and 1 (and by 0.006 from ``generate``);
at Qwen3-VL-8B's architecture with random weights (near-uniform distributions, an H200,
`benchmarks/results/2026-12-04-h200/`) by 0.13 relative; with the trained weights it has not been
measured. `ChatVLM.generated_probabilities` is the official procedure itself, for scores that
must equal the official ones in bfloat16 too (the rewards' ``procedure="generate"``).

Only checkpoints that answer right after the generation prompt are taken: a thinking variant
(Qwen3-VL-*-Thinking), whose chat template ends the generation prompt with an open ``<think>``
block, is refused when `ChatVLM` is built (`check_answers_directly`), as the first token read
would be the first reasoning token, not the answer.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from PIL import Image

from gors.core.hub import from_pretrained, note_load
from rewards.base import MODEL_FLAG

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedConfig

# Two questions that differ from their first character on: their rendered prompts share
# exactly the part of the template before the question.
_PROBE_QUESTIONS = ("Is it red?", "How many?")
# Rows gathered for one LM-head product (see step 5 of the module docstring): enough to share
# the weight's read among several images' questions, few enough that the float32 distributions
# (64 x 151936 x 4 bytes = 39 MB for Qwen3-VL) stay small.
HEAD_ROWS = 64
# Attention implementations that apply a 4D additive mask as given.
MASKED_ATTENTION = ("sdpa", "eager")
# The tags of a reasoning block (Qwen3's thinking variants write it before the answer).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class EncodedImage:
    """One image after the vision tower.

    Attributes:
        grid_thw: (3,) the (temporal, height, width) patch grid, as the image processor gives it.
        embeds: (image tokens, text hidden size) the merged patch embeddings.
        deepstack: one (image tokens, text hidden size) tensor per deepstack layer.
        tokens: the number of image tokens, read off the processor's grid before it went to the device
            (reading it off `grid_thw` there would wait for the GPU at every question).
    """

    grid_thw: torch.Tensor
    embeds: torch.Tensor
    deepstack: list[torch.Tensor]
    tokens: int


@dataclass
class PrefixState:
    """The shared prefix of one image's questions after the language model.

    Attributes:
        ids: the prefix's token ids (chat template start and image tokens).
        cache: the language model's keys and values over the prefix (batch 1).
        next_position: the M-RoPE position of the first token after the prefix (all three axes).
    """

    ids: list[int]
    cache: DynamicCache
    next_position: int


class ChatVLM:
    """Qwen3-VL (`AutoModelForImageTextToText` + `AutoProcessor`) as a one-token answerer.

    Args:
        model: a loaded Qwen3-VL chat model (`Qwen3VLForConditionalGeneration`) on its device;
            it is put in eval mode with gradients off.
        processor: its processor (`Qwen3VLProcessor`), with a chat template.
        name: what to call the checkpoint in errors.
        flag: the option name quoted in errors.

    `ChatVLM.from_pretrained` (or `load_chat_vlm`, which shares one copy) loads both from a
    checkpoint; a model built in code (``benchmarks/soft_tifa_one_pass.py``) is wrapped directly.
    ``prefix_tokens`` is the number of prompt tokens before the question with the image
    placeholder unexpanded (an image of n tokens has a shared prefix of ``prefix_tokens + n - 1``).
    """

    def __init__(self, model: torch.nn.Module, processor: object, name: str = "", flag: str = MODEL_FLAG) -> None:
        self.model = model.eval().requires_grad_(False)
        self.device = model.device
        self.processor = processor
        self.tokenizer = processor.tokenizer
        image_token = getattr(processor, "image_token", None)
        merge_size = getattr(getattr(processor, "image_processor", None), "merge_size", None)
        if image_token is None or merge_size is None or processor.chat_template is None:
            raise ValueError(
                f"{flag}={name!r} is not a Qwen3-VL chat checkpoint: its processor "
                "needs an image token, an image processor with a merge size, and a chat template "
                "(e.g. Qwen/Qwen3-VL-8B-Instruct)."
            )
        check_answers_directly(processor, name, flag)
        self.image_token: str = image_token
        self.merge_size: int = merge_size
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"{flag}={name!r}: the tokenizer has no pad token")
        attention = self.model.config.get_text_config()._attn_implementation
        if attention not in MASKED_ATTENTION:
            # Other kernels (flash attention) would drop the questions' 4D mask without a word.
            raise ValueError(
                f"{flag}={name!r} is loaded with attn_implementation={attention!r}, but an image's "
                f"questions run packed under a 4D attention mask, which only {' and '.join(MASKED_ATTENTION)} "
                "take: load it with attn_implementation='sdpa'."
            )
        self.prefix_tokens = self._shared_prefix_tokens(name, flag)

    @classmethod
    def from_pretrained(
        cls, model_name_or_path: str, device: torch.device, torch_dtype: torch.dtype, flag: str = MODEL_FLAG
    ) -> ChatVLM:
        """Load a Qwen3-VL chat checkpoint (Hub id or folder, e.g. `Qwen/Qwen3-VL-8B-Instruct`)."""
        from transformers import AutoModelForImageTextToText, AutoProcessor

        processor = from_pretrained(AutoProcessor.from_pretrained, model_name_or_path, flag)
        # From the processor alone, so a thinking checkpoint is refused before its weights load.
        check_answers_directly(processor, model_name_or_path, flag)
        model = from_pretrained(
            AutoModelForImageTextToText.from_pretrained, model_name_or_path, flag, dtype=torch_dtype
        )
        return cls(model.to(device), processor, model_name_or_path, flag)

    def chat_text(self, question: str) -> str:
        """The chat prompt of one user turn "<image> question", ready for the first answer token."""
        return render_question(self.processor, question)

    def _shared_prefix_tokens(self, name: str, flag: str) -> int:
        """Tokens before the question in a chat prompt with one (unexpanded) image placeholder.

        The longest common token prefix of two rendered questions, cut back to just after its last
        added token (Qwen3-VL: ``<|vision_end|>``): the tokenizer splits the text at added tokens
        before BPE, so no question's first characters can merge with the prefix's last token.
        """
        first, second = (
            self.tokenizer(self.chat_text(q), add_special_tokens=False).input_ids for q in _PROBE_QUESTIONS
        )
        common = next(
            (i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second))
        )
        added = set(self.tokenizer.added_tokens_decoder)
        cut = max((i + 1 for i in range(common) if first[i] in added), default=0)
        image_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        if image_id not in first[:cut]:
            raise ValueError(
                f"{flag}={name!r}: the chat template does not put the image before the question, "
                "so questions of an image share no prefix with it"
            )
        return cut

    def encode_images(self, images: Sequence[Image.Image]) -> list[EncodedImage]:
        """Run the vision tower once over `images` (RGB); one `EncodedImage` each, in order."""
        if not images:
            return []
        pixels = self.processor.image_processor(images=list(images), return_tensors="pt")
        tokens = [int(row.prod()) // self.merge_size**2 for row in pixels["image_grid_thw"]]
        grid = pixels["image_grid_thw"].to(self.device)
        output = self.model.base_model.get_image_features(
            pixels["pixel_values"].to(self.device), grid, return_dict=True
        )
        deepstack = getattr(output, "deepstack_features", None) or []
        return [
            EncodedImage(grid[i], output.pooler_output[i], [layer[i] for layer in deepstack], tokens[i])
            for i in range(len(images))
        ]

    def image_tokens(self, image: EncodedImage) -> int:
        """The number of image tokens (merged patches) of `image` in the prompt."""
        return image.tokens

    def question_ids(self, question: str, image: EncodedImage) -> list[int]:
        """Token ids of `question` about `image`, the image placeholder expanded to its tokens."""
        text = self.chat_text(question)
        if text.count(self.image_token) != 1:
            raise ValueError(
                f"the chat template wrote {text.count(self.image_token)} image placeholders "
                f"{self.image_token!r} for one image; expected exactly one"
            )
        # The processor's own expansion: one placeholder per merged patch.
        text = text.replace(self.image_token, self.image_token * self.image_tokens(image))
        return self.tokenizer(text, add_special_tokens=False).input_ids

    @torch.no_grad()
    def generated_probabilities(self, image: Image.Image, question: str) -> torch.Tensor:
        """P(first answer token) of `question` about `image` (RGB) by GenEval 2's own procedure: the chat inputs
        made by the processor, then ``generate`` of one greedy token and the softmax of its scores (float32, over
        the vocabulary). Exact in any dtype, where `next_token_probabilities` agrees up to round-off; each
        question re-encodes the image and runs the whole prompt."""
        messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}]
        inputs = self.processor.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                    return_dict=True, return_tensors="pt").to(self.device)
        output = self.model.generate(**inputs, max_new_tokens=1, do_sample=False, output_scores=True,
                                     return_dict_in_generate=True)
        return torch.softmax(output.scores[0].float(), dim=-1)[0]

    @torch.no_grad()
    def next_token_probabilities(
        self,
        images: Sequence[EncodedImage],
        questions: Sequence[tuple[int, str]],
        batch_size: int,
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (k, P(first answer token)) for each ``questions[k] = (image index, question)``.

        Each distribution is a float32 vector over the vocabulary (on the model's device),
        summing to 1. Questions are grouped by image (images in order of first appearance,
        questions in order within an image, which is the order of the yields): each image's
        shared prefix runs once, then its questions run `batch_size` at a time as one packed
        continuation of it; the LM head runs once per `HEAD_ROWS` questions or so, across images.
        The images are not re-encoded.
        """
        by_image: dict[int, list[int]] = {}
        for k, (index, _) in enumerate(questions):
            by_image.setdefault(index, []).append(k)
        pending: list[tuple[int, torch.Tensor]] = []
        for index, members in by_image.items():
            image = images[index]
            ids = {k: self.question_ids(questions[k][1], image) for k in members}
            length = self.prefix_tokens + self.image_tokens(image) - 1
            prefix = self.run_prefix(image, ids[members[0]][:length])
            for start in range(0, len(members), batch_size):
                chunk = members[start : start + batch_size]
                tails = [self._tail(ids[k], prefix) for k in chunk]
                pending += zip(chunk, self.continuation_hidden(prefix, tails))
                if len(pending) >= HEAD_ROWS:
                    yield from self._answer(pending)
                    pending = []
        yield from self._answer(pending)

    def _answer(self, pending: list[tuple[int, torch.Tensor]]) -> Iterator[tuple[int, torch.Tensor]]:
        if pending:
            keys, rows = zip(*pending)
            yield from zip(keys, self.answer_probabilities(torch.stack(rows)))

    @staticmethod
    def _tail(ids: list[int], prefix: PrefixState) -> list[int]:
        """The tokens of a question's prompt after the shared prefix (at least one)."""
        if ids[: len(prefix.ids)] != prefix.ids or len(ids) == len(prefix.ids):
            raise ValueError("a question's chat prompt does not continue the image's shared prefix")
        return ids[len(prefix.ids) :]

    def run_prefix(self, image: EncodedImage, ids: list[int]) -> PrefixState:
        """Run the shared prefix `ids` of `image`'s questions through the language model once."""
        from transformers import DynamicCache

        base = self.model.base_model
        input_ids = torch.tensor([ids], device=self.device)
        mm_token_type_ids = torch.tensor(self.processor.create_mm_token_type_ids([ids]), device=self.device)
        grid = image.grid_thw[None]
        # Qwen3-VL's own M-RoPE numbering, computed here (not left to the forward) so that the
        # model's stored `rope_deltas` are not touched and the next position is known.
        positions, _ = base.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=grid)
        cache = DynamicCache(config=self.model.config)
        base(
            input_ids=input_ids,
            position_ids=positions,
            image_grid_thw=grid,
            mm_token_type_ids=mm_token_type_ids,
            mm_encoder_outputs={"image": image_outputs([image])},
            cache=cache,
            use_cache=True,
        )
        return PrefixState(ids, cache, int(positions.max()) + 1)

    def continuation_hidden(self, prefix: PrefixState, tails: list[list[int]]) -> torch.Tensor:
        """The language model's final hidden state after each prefix + tail, from one packed pass.

        Returns (len(tails), text hidden size), in the model's dtype; `answer_probabilities`
        turns it into next-token distributions. `prefix`'s cache is not extended.
        """
        tree = QuestionTree.from_tails(tails)
        dtype, nodes = self.model.dtype, len(tree.tokens)
        blocked = torch.finfo(dtype).min
        # Additive, as eager attention adds it; SDPA takes the same mask.
        mask = torch.zeros(1, 1, nodes, len(prefix.ids) + nodes, dtype=dtype, device=self.device)
        mask[..., len(prefix.ids) :] = torch.where(tree.ancestry().to(self.device), 0.0, blocked).to(dtype)
        # Text after the image: the same position on all three M-RoPE axes, counting on from the
        # prefix's largest position by the token's place in its own question.
        positions = prefix.next_position + torch.tensor(tree.depths(), device=self.device)
        hidden = self.model.base_model(
            input_ids=torch.tensor([tree.tokens], device=self.device),
            attention_mask=mask,
            position_ids=positions.expand(3, 1, nodes),
            cache=branch_cache(prefix.cache, self.model.config),
            use_cache=True,
        ).last_hidden_state
        return hidden[0, tree.ends]

    def answer_probabilities(self, hidden: torch.Tensor) -> torch.Tensor:
        """P(next token) of each row of `hidden` (rows, text hidden size): (rows, vocabulary) float32."""
        return self.model.get_output_embeddings()(hidden).float().softmax(dim=-1)


def render_question(processor: object, question: str, add_generation_prompt: bool = True) -> str:
    """`processor`'s chat rendering of one user turn "<image> question" (with the generation prompt)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def generation_prompt(processor: object) -> str:
    """What `processor`'s chat template appends after a user turn to prompt the assistant's reply."""
    closed = render_question(processor, _PROBE_QUESTIONS[0], add_generation_prompt=False)
    prompted = render_question(processor, _PROBE_QUESTIONS[0])
    # A template that renders the turn itself differently with the prompt: all of it is checked.
    return prompted[len(closed):] if prompted.startswith(closed) else prompted


def check_answers_directly(processor: object, name: str, flag: str = MODEL_FLAG) -> None:
    """Refuse a thinking checkpoint: one whose generation prompt opens a ``<think>`` block it does not close.

    Its first generated tokens are reasoning, so the rewards on `ChatVLM` would read them as the
    answer: Soft-TIFA, TIFA and VQAScore the first token's probabilities, MLLM-CoT and TIT-Score a
    reply cut at a token budget that the reasoning may spend. An empty closed block (a template
    with thinking switched off) answers right after it and passes. A processor without a chat
    template is left to the caller's own error.
    """
    if getattr(processor, "chat_template", None) is None:
        return
    prompt = generation_prompt(processor)
    if prompt.rfind(THINK_OPEN) <= prompt.rfind(THINK_CLOSE):
        return
    instruct = name.replace("Thinking", "Instruct") if "Thinking" in name else "Qwen/Qwen3-VL-8B-Instruct"
    raise ValueError(
        f"{flag}={name!r} is a thinking (reasoning) checkpoint: its chat template ends the generation "
        f"prompt with {prompt!r}, so the model reasons before it answers. Soft-TIFA, TIFA and VQAScore "
        "read the probabilities of the first token after that prompt, and MLLM-CoT and TIT-Score a "
        "reply of bounded length, so they would score the reasoning instead of the answer. Give the "
        f"Instruct variant instead, e.g. {instruct}."
    )


@dataclass(frozen=True)
class QuestionTree:
    """Token sequences that continue one prefix, as a prefix tree (trie) packed in one row.

    Sequences that begin alike share those nodes, so each distinct (history, token) is computed
    once. Node i attends to the prefix and to its ancestors and itself (`ancestry`), and sits at
    depth `depths()[i]` after the prefix: in that pass every sequence sees exactly what it would
    see alone after the prefix.

    Attributes:
        tokens: the token id of each node; a parent comes before its children.
        parents: each node's parent, -1 for a node right after the prefix.
        ends: for each sequence, the node of its last token (sequences that are equal, or one a
            start of another, may end at the same node or inside another's path).
    """

    tokens: list[int]
    parents: list[int]
    ends: list[int]

    @classmethod
    def from_tails(cls, tails: Sequence[Sequence[int]]) -> QuestionTree:
        """The tree of `tails` (each at least one token), nodes in order of first appearance."""
        tokens: list[int] = []
        parents: list[int] = []
        ends: list[int] = []
        children: dict[tuple[int, int], int] = {}
        for tail in tails:
            if not tail:
                raise ValueError("every continuation needs at least one token")
            node = -1
            for token in tail:
                if (node, token) not in children:
                    children[node, token] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = children[node, token]
            ends.append(node)
        return cls(tokens, parents, ends)

    def depths(self) -> list[int]:
        """Each node's distance from the prefix: 0 for the first token of a sequence."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return depths

    def ancestry(self) -> torch.Tensor:
        """(nodes, nodes) bool: [i, j] is True where node j is node i or one of its ancestors."""
        nodes = len(self.tokens)
        seen = torch.eye(nodes, dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                seen[i] |= seen[parent]
        return seen


def branch_cache(cache: DynamicCache, config: PreTrainedConfig) -> DynamicCache:
    """A new `DynamicCache` over the same key and value tensors as `cache`, copying nothing.

    A continuation appends to the branch (`DynamicCache.update` concatenates into new tensors)
    and leaves `cache` as it was, so several continuations can follow the same prefix.
    """
    from transformers import DynamicCache

    branch = DynamicCache(config=config)
    for layer, source in zip(branch.layers, cache.layers, strict=True):
        layer.lazy_initialization(source.keys, source.values)
        layer.keys, layer.values = source.keys, source.values
    return branch


def image_outputs(rows: list[EncodedImage]) -> object:
    """The vision-tower output of a batch whose row i shows `rows[i]`, in the model's format."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

    layers = len(rows[0].deepstack)
    return BaseModelOutputWithDeepstackFeatures(
        pooler_output=tuple(row.embeds for row in rows),
        deepstack_features=[tuple(row.deepstack[j] for row in rows) for j in range(layers)],
    )


_LOADED: weakref.WeakValueDictionary[tuple[str, str, torch.dtype], ChatVLM] = weakref.WeakValueDictionary()


def load_chat_vlm(
    model_name_or_path: str, device: torch.device, torch_dtype: torch.dtype, flag: str = MODEL_FLAG
) -> ChatVLM:
    """A `ChatVLM`, shared by every reward that holds one of the same checkpoint, device and dtype.

    GenEval 2's Soft-TIFA score and its VQAScore column then keep one copy of Qwen3-VL-8B in
    memory, not two; the model is freed once no reward holds it.
    """
    key = (str(model_name_or_path), str(torch.device(device)), torch_dtype)
    vlm = _LOADED.get(key)
    if vlm is None:
        vlm = ChatVLM.from_pretrained(model_name_or_path, device, torch_dtype, flag)
        _LOADED[key] = vlm
    else:  # no load to see: the reward taking the shared copy still uses that model (its score folder records it)
        note_load(str(model_name_or_path))
    return vlm
