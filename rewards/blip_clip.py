"""BLIP-CLIP, the unbiased non-spatial reward of GORS: BLIP caption vs prompt in CLIP text space.

BLIP captions the image; CLIP's text encoder embeds the caption and the prompt; the reward is
their cosine similarity, clamped into [0, 1] (`rewards.clip_text.cosine_to_score`, i.e.
max(0, cos)). The clamp keeps the raw cosine, so a selection threshold reads directly on it:
CLIP text embeddings share a common direction, so even unrelated sentences score about 0.5 and
captions that say what the prompt says 0.8-1.0; a negative cosine (never seen on real captions)
would mean no agreement at all. A linear map such as (1 + cos) / 2 would squeeze every real value
into [0.75, 1] and hide that scale.

Decoding follows BLIP's own captioner (``BLIP_Decoder.generate`` defaults, the model behind
`Salesforce/blip-image-captioning-large`): the text prompt "a picture of " the captioner was
fine-tuned with, deterministic beam search with 3 beams, at least 10 and at most 30 decoder tokens
counting [DEC] and the prompt; the prompt is cut from the caption. Images are preprocessed by the
checkpoint's `BlipImageProcessor` (384x384 bicubic resize; BLIP resizes a PIL image, transformers
5 a tensor with antialiasing: values close, not equal). T2I-CompBench's table has a B-CLIP column,
but its repository holds no code for it: these settings are ours, so the column compares with the
paper's in kind, not to the decimal, and the transformers preprocessing is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import MODEL_FLAG, Reward, RewardOutput
from rewards.clip_score import DEFAULT_CLIP, CLIPEncoder, cosines_by_text
from rewards.clip_text import cosine_to_score

CLIP_FLAG = "clip_model_name_or_path"
CAPTION_PROMPT = "a picture of "

# BLIP's captioning defaults (beam search, caption length in tokens, the prompt's included).
NUM_BEAMS, MIN_LENGTH, MAX_LENGTH = 3, 10, 30


class BlipClipReward(Reward):
    """CLIP text-text cosine between a BLIP caption of the image and the prompt, in [0, 1].

    Args:
        model_name_or_path: BLIP captioning checkpoint (Hub id or folder) of
            `BlipForConditionalGeneration`; default `Salesforce/blip-image-captioning-large`.
        device, torch_dtype: where and in which dtype both models run (see `Reward`).
        batch_size: images captioned (and distinct texts embedded) per forward pass.
        clip_model_name_or_path: CLIP checkpoint for the text embeddings; default
            `openai/clip-vit-base-patch32`, the CLIP of T2I-CompBench's CLIPScore.
        caption_prompt: text the caption continues ("a picture of ", BLIP's); "" for
            unconditional captions.
        num_beams, min_length, max_length: beam search width, and caption length bounds in
            decoder tokens including [DEC] and the prompt (BLIP: 3, 10, 30).
    """

    name = "blip_clip"
    default_model = "Salesforce/blip-image-captioning-large"
    categories = ("non_spatial",)
    description = "BLIP-large caption vs prompt: cosine of their CLIP ViT-B/32 text embeddings"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse num_beams < 1 and caption lengths other than 0 <= min_length <= max_length (each
        against the other's default where only one is given)."""
        num_beams = options.get("num_beams", NUM_BEAMS)
        min_length, max_length = options.get("min_length", MIN_LENGTH), options.get("max_length", MAX_LENGTH)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (num_beams, min_length, max_length)) \
                or num_beams < 1 or not 0 <= min_length <= max_length:
            raise ValueError(
                f"need whole numbers num_beams >= 1 and 0 <= min_length <= max_length, got num_beams={num_beams!r}, "
                f"min_length={min_length!r}, max_length={max_length!r}"
            )

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        clip_model_name_or_path: str = DEFAULT_CLIP,
        caption_prompt: str = CAPTION_PROMPT,
        num_beams: int = NUM_BEAMS,
        min_length: int = MIN_LENGTH,
        max_length: int = MAX_LENGTH,
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        from transformers import BlipForConditionalGeneration, BlipProcessor

        self.check_options({"num_beams": num_beams, "min_length": min_length, "max_length": max_length})
        path = str(self.model_name_or_path)
        self.processor = from_pretrained(BlipProcessor.from_pretrained, path, MODEL_FLAG)
        model = from_pretrained(
            BlipForConditionalGeneration.from_pretrained, path, MODEL_FLAG, dtype=self.torch_dtype
        )
        self.model = model.to(self.device).eval().requires_grad_(False)
        # [CLS] prompt [SEP]; generate() turns [CLS] into [DEC] and drops [SEP], as BLIP does.
        self.prompt_ids = self.processor.tokenizer(caption_prompt, return_tensors="pt").input_ids
        prompt_length = self.prompt_ids.shape[1] - 1
        if prompt_length >= max_length:
            raise ValueError(
                f"caption_prompt={caption_prompt!r} is {prompt_length} decoder tokens; "
                f"max_length={max_length} leaves no room for a caption"
            )
        self.generation = {
            "num_beams": num_beams,
            "do_sample": False,
            "max_new_tokens": max_length - prompt_length,
            "min_new_tokens": max(0, min_length - prompt_length),
        }
        self.prompt_text = self.processor.tokenizer.decode(
            self.prompt_ids[0], skip_special_tokens=True
        ).strip()
        # Only CLIP's text tower is used: no image transform to set up.
        self.clip = CLIPEncoder(
            clip_model_name_or_path, CLIP_FLAG, self.device, self.torch_dtype, "transformers"
        )

    def captions(self, images: list[Image.Image]) -> list[str]:
        """BLIP's caption of each RGB image (prompt removed), in order."""
        captions: list[str] = []
        for start in range(0, len(images), self.batch_size):
            batch = images[start : start + self.batch_size]
            pixels = self.processor.image_processor(batch, return_tensors="pt").pixel_values
            output = self.model.generate(
                pixel_values=pixels.to(self.device, self.torch_dtype),
                input_ids=self.prompt_ids.repeat(len(batch), 1).to(self.device),
                **self.generation,
            )
            for text in self.processor.tokenizer.batch_decode(output, skip_special_tokens=True):
                captions.append(text.strip().removeprefix(self.prompt_text).strip())
        return captions

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        if not images:
            return RewardOutput(scores=[])
        captions = self.captions(images)
        caption_embeddings = self.clip.text_embeddings(captions, self.batch_size)
        cosines = cosines_by_text(self.clip, caption_embeddings, prompts, self.batch_size)
        scores = [cosine_to_score(c) for c in cosines]
        details = [
            {"caption": caption, "cosine": c, "score": s}
            for caption, c, s in zip(captions, cosines, scores, strict=True)
        ]
        return RewardOutput(scores=scores, details=details)
