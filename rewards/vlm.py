"""A chat VLM answering questions about images: the next-token distribution of each answer.

GenEval 2's evaluator (Soft-TIFA, TIFA, VQAScore) sends a chat message "<image> question" to
Qwen3-VL and reads the distribution of the first answer token (``generate`` with one new token).
`ChatVLM` gives the same distribution without ``generate`` and without re-encoding the image:

1. each image is preprocessed and run through the vision tower once; Qwen3-VL's merged patch
   embeddings and its deepstack features (the vision layers' features that the first decoder
   layers add at the image positions) are kept;
2. questions are rendered with the processor's chat template, the image placeholder expanded to
   the image's token count as the processor does, and tokenised;
3. a batch of questions (of any images, right-padded) runs through the language model once,
   with the kept features passed as ``mm_encoder_outputs`` (transformers then skips the vision
   tower and places them, and the M-RoPE positions, exactly as in a full forward); the hidden
   state at each question's last token goes through the LM head and a float32 softmax.

The result equals a plain full forward ``model(**processor.apply_chat_template(...))`` of each
question alone (checked in the tests on a tiny random Qwen3-VL), up to float round-off.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import MODEL_FLAG


@dataclass
class EncodedImage:
    """One image after the vision tower.

    Attributes:
        grid_thw: (3,) the (temporal, height, width) patch grid, as the image processor gives it.
        embeds: (image tokens, text hidden size) the merged patch embeddings.
        deepstack: one (image tokens, text hidden size) tensor per deepstack layer.
    """

    grid_thw: torch.Tensor
    embeds: torch.Tensor
    deepstack: list[torch.Tensor]


class ChatVLM:
    """Qwen3-VL (`AutoModelForImageTextToText` + `AutoProcessor`) as a one-token answerer.

    Args:
        model_name_or_path: Hub id or folder of a Qwen3-VL chat checkpoint, e.g.
            `Qwen/Qwen3-VL-8B-Instruct`.
        device, torch_dtype: where and in which dtype the model runs.
        flag: the option name quoted in loading errors.
    """

    def __init__(
        self,
        model_name_or_path: str,
        device: torch.device,
        torch_dtype: torch.dtype,
        flag: str = MODEL_FLAG,
    ) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.device = device
        self.processor = from_pretrained(AutoProcessor.from_pretrained, model_name_or_path, flag)
        model = from_pretrained(
            AutoModelForImageTextToText.from_pretrained, model_name_or_path, flag, dtype=torch_dtype
        )
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = self.processor.tokenizer
        image_token = getattr(self.processor, "image_token", None)
        merge_size = getattr(getattr(self.processor, "image_processor", None), "merge_size", None)
        if image_token is None or merge_size is None or self.processor.chat_template is None:
            raise ValueError(
                f"{flag}={model_name_or_path!r} is not a Qwen3-VL chat checkpoint: its processor "
                "needs an image token, an image processor with a merge size, and a chat template "
                "(e.g. Qwen/Qwen3-VL-8B-Instruct)."
            )
        self.image_token: str = image_token
        self.merge_size: int = merge_size
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"{flag}={model_name_or_path!r}: the tokenizer has no pad token")

    def chat_text(self, question: str) -> str:
        """The chat prompt of one user turn "<image> question", ready for the first answer token."""
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}
        ]
        return self.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def encode_images(self, images: Sequence[Image.Image]) -> list[EncodedImage]:
        """Run the vision tower once over `images` (RGB); one `EncodedImage` each, in order."""
        if not images:
            return []
        pixels = self.processor.image_processor(images=list(images), return_tensors="pt")
        grid = pixels["image_grid_thw"].to(self.device)
        output = self.model.base_model.get_image_features(
            pixels["pixel_values"].to(self.device), grid, return_dict=True
        )
        deepstack = getattr(output, "deepstack_features", None) or []
        return [
            EncodedImage(grid[i], output.pooler_output[i], [layer[i] for layer in deepstack])
            for i in range(len(images))
        ]

    def question_ids(self, question: str, image: EncodedImage) -> list[int]:
        """Token ids of `question` about `image`, the image placeholder expanded to its tokens."""
        text = self.chat_text(question)
        if text.count(self.image_token) != 1:
            raise ValueError(
                f"the chat template wrote {text.count(self.image_token)} image placeholders "
                f"{self.image_token!r} for one image; expected exactly one"
            )
        # The processor's own expansion: one placeholder per merged patch.
        tokens = int(image.grid_thw.prod()) // self.merge_size**2
        text = text.replace(self.image_token, self.image_token * tokens)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    @torch.no_grad()
    def next_token_probabilities(
        self,
        images: Sequence[EncodedImage],
        questions: Sequence[tuple[int, str]],
        batch_size: int,
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (k, P(first answer token)) for each ``questions[k] = (image index, question)``.

        Each distribution is a float32 vector over the vocabulary (on the model's device),
        summing to 1. Questions run `batch_size` at a time, in order, questions of different
        images together; the images are not re-encoded.
        """
        for start in range(0, len(questions), batch_size):
            chunk = range(start, min(start + batch_size, len(questions)))
            rows = [images[questions[k][0]] for k in chunk]
            ids = [self.question_ids(questions[k][1], image) for k, image in zip(chunk, rows)]
            probabilities = self._last_token_probabilities(ids, rows)
            yield from zip(chunk, probabilities)

    def _last_token_probabilities(
        self, ids: list[list[int]], rows: list[EncodedImage]
    ) -> torch.Tensor:
        """Softmax of the logits after each sequence's last token; (len(ids), vocab) float32."""
        lengths = torch.tensor([len(x) for x in ids], device=self.device)
        width = int(lengths.max())
        pad = self.tokenizer.pad_token_id
        # Right padding: a causal model's real tokens never see the padding after them.
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=self.device)
        attention_mask = (torch.arange(width, device=self.device) < lengths[:, None]).long()
        mm_token_type_ids = torch.tensor(
            self.processor.create_mm_token_type_ids(input_ids.tolist()), device=self.device
        ) * attention_mask
        image_outputs = _image_outputs(rows)
        hidden = self.model.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            image_grid_thw=torch.stack([row.grid_thw for row in rows]),
            mm_token_type_ids=mm_token_type_ids,
            mm_encoder_outputs={"image": image_outputs},
            use_cache=False,
        ).last_hidden_state
        last = hidden[torch.arange(len(ids), device=self.device), lengths - 1]
        logits = self.model.get_output_embeddings()(last)
        return logits.float().softmax(dim=-1)


def _image_outputs(rows: list[EncodedImage]) -> object:
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
        vlm = ChatVLM(model_name_or_path, device, torch_dtype, flag)
        _LOADED[key] = vlm
    return vlm
