"""CLIPScore (T2I-CompBench's non-spatial metric) as a reward: CLIP image-text cosine similarity.

As the official ``CLIPScore_eval/CLIP_similarity.py``: OpenAI CLIP ViT-B/32, the cosine of the
L2-normalised image and text embeddings, reported raw (not x100, no factor 2.5, no clipping at 0
as in Hessel et al.'s CLIPScore). Real values sit around 0.2-0.4; the score is that cosine
clamped into [0, 1] (`rewards.clip_text.cosine_to_score`), which only a negative cosine changes.
For complex prompts (`remove_adjectives=True`, as the 3-in-1 metric runs it) the adjectives are
removed from the prompt first (`rewards.clip_text.remove_adjectives`).

Differences from ``clip.load("ViT-B/32")`` + ``clip.tokenize``, checked against their code:

- Weights: `openai/clip-vit-base-patch32` is the conversion of the same checkpoint. The official
  code runs it in fp16 on a GPU (``clip.load`` keeps fp16 weights off the CPU): so do the
  benchmarks on CUDA (`official_dtype`); as a training reward it runs in the dtype it is given.
  Not bit for bit: CLIP's ``convert_weights`` keeps the LayerNorms in fp32 and the official script
  normalises and takes the dot product in fp16 (a cosine near 0.3 to about 2.4e-4), while here the
  whole model runs in fp16 and the cosine in fp32: about 1e-4 per image.
- Images: with `preprocess="openai"` (default) exactly CLIP's transform (torchvision `Resize` of
  the shortest side with PIL bicubic, `CenterCrop` with rounded offsets, `ToTensor`,
  `Normalize`), sizes and mean/std read from the checkpoint's processor. transformers 5's
  `CLIPImageProcessor` (`preprocess="transformers"`) resizes a tensor with torchvision's
  antialiased bicubic, which is close to PIL's but not equal, and floors the crop offset. One
  difference remains: `Reward.score` converts a non-RGB image to RGB before resizing, the
  official transform after; identical for RGB images (all generated samples).
- Text: ``clip.tokenize`` raises on prompts over 77 tokens; here they are truncated to
  bos + 75 tokens + eos, as ``clip.tokenize(truncate=True)`` does, and flagged in the details.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from PIL import Image

from gors.core.hub import from_pretrained
from rewards.base import MODEL_FLAG, Reward, RewardOutput, check_choice
from rewards.clip_text import clip_clean, cosine_to_score, split_adjectives
from rewards.noun_phrases import BACKENDS, Backend, parser_record

DEFAULT_CLIP = "openai/clip-vit-base-patch32"
Preprocess = Literal["openai", "transformers"]
PREPROCESS: tuple[Preprocess, ...] = ("openai", "transformers")


class CLIPEncoder:
    """A CLIP model and processor loaded once; L2-normalised image and text embeddings.

    Args:
        model_name_or_path: CLIP checkpoint (Hub id or folder) of `CLIPModel` + `CLIPProcessor`.
        flag: the option that named the model, quoted in load errors.
        device, torch_dtype: where and in which dtype CLIP runs.
        preprocess: "openai" (CLIP's own image transform) or "transformers" (the checkpoint's
            image processor); see the module docstring.
    """

    def __init__(
        self,
        model_name_or_path: str,
        flag: str,
        device: torch.device,
        torch_dtype: torch.dtype,
        preprocess: Preprocess = "openai",
    ) -> None:
        from transformers import CLIPModel, CLIPProcessor

        check_choice("preprocess", preprocess, PREPROCESS)
        self.device, self.torch_dtype = device, torch_dtype
        processor = from_pretrained(CLIPProcessor.from_pretrained, model_name_or_path, flag)
        model = from_pretrained(CLIPModel.from_pretrained, model_name_or_path, flag, dtype=torch_dtype)
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = processor.tokenizer
        self.max_tokens = self.model.config.text_config.max_position_embeddings
        self.image_processor = processor.image_processor
        self.transform = _openai_transform(processor.image_processor) if preprocess == "openai" else None

    def pixel_values(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """Preprocessed RGB images, (n, 3, H, W) on the model's device and dtype."""
        if self.transform is None:
            pixels = self.image_processor(list(images), return_tensors="pt").pixel_values
        else:
            pixels = torch.stack([self.transform(image) for image in images])
        return pixels.to(self.device, self.torch_dtype)

    def image_embeddings(self, images: Sequence[Image.Image], batch_size: int) -> torch.Tensor:
        """Unit-norm image embeddings, (n, projection_dim) float32 on the model's device."""
        parts = [
            self.model.get_image_features(
                pixel_values=self.pixel_values(images[start : start + batch_size])
            ).pooler_output
            for start in range(0, len(images), batch_size)
        ]
        return _unit(torch.cat(parts))

    def text_embeddings(self, texts: Sequence[str], batch_size: int) -> torch.Tensor:
        """Unit-norm text embeddings, (n, projection_dim) float32, texts cleaned as CLIP's tokenizer cleans them
        (`clip_clean`) and cut to `max_tokens`."""
        parts = []
        for start in range(0, len(texts), batch_size):
            tokens = self.tokenizer(
                [clip_clean(text) for text in texts[start : start + batch_size]],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            ).to(self.device)
            # Padding follows the eos token, whose embedding CLIP pools; the causal mask keeps
            # it from seeing the padding, so a text embeds the same alone or in a batch.
            parts.append(self.model.get_text_features(**tokens).pooler_output)
        return _unit(torch.cat(parts))

    def truncated(self, texts: Sequence[str]) -> list[bool]:
        """Whether each text has more than `max_tokens` tokens (bos and eos included)."""
        one_more = self.tokenizer([clip_clean(text) for text in texts], truncation=True, max_length=self.max_tokens + 1)
        return [len(ids) > self.max_tokens for ids in one_more.input_ids]


def _unit(features: torch.Tensor) -> torch.Tensor:
    features = features.float()
    return features / features.norm(dim=-1, keepdim=True)


def _openai_transform(image_processor: Any) -> Any:
    """CLIP's `_transform(n_px)`: bicubic resize of the shortest side, centre crop, normalise."""
    from torchvision import transforms

    shortest = image_processor.size.get("shortest_edge") if image_processor.size else None
    crop = image_processor.crop_size
    if not shortest or not crop or not crop.get("height"):
        raise ValueError(
            f"preprocess='openai' needs a processor that resizes the shortest edge and centre-crops "
            f"(CLIP's own), got size={image_processor.size}, crop_size={crop}; "
            "use preprocess='transformers'."
        )
    return transforms.Compose(
        [
            transforms.Resize(shortest, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop((crop["height"], crop["width"])),
            transforms.ToTensor(),
            transforms.Normalize(image_processor.image_mean, image_processor.image_std),
        ]
    )


def cosines_by_text(
    encoder: CLIPEncoder, features: torch.Tensor, texts: list[str], batch_size: int
) -> list[float]:
    """Cosine of each row of unit-norm `features` with the embedding of the matching text.

    Each distinct text is embedded once (many samples share a prompt).
    """
    row_of = {text: row for row, text in enumerate(dict.fromkeys(texts))}
    embeddings = encoder.text_embeddings(list(row_of), batch_size)
    rows = torch.tensor([row_of[t] for t in texts], device=embeddings.device)
    return (features * embeddings[rows]).sum(-1).tolist()


class CLIPScoreReward(Reward):
    """T2I-CompBench's CLIPScore of (image, prompt) pairs: the raw CLIP cosine, in [0, 1].

    Args:
        model_name_or_path: CLIP checkpoint (Hub id or folder); default
            `openai/clip-vit-base-patch32`, the ViT-B/32 of the official metric.
        device, torch_dtype: where and in which dtype CLIP runs (see `Reward`).
        batch_size: images (and distinct texts) per forward pass.
        remove_adjectives: drop the prompt's adjectives first, as the official code does for
            complex prompts (``--complex``; the 3-in-1 metric sets it).
        noun_phrase_backend: the parser that tags them (`rewards.noun_phrases`): "auto" runs spaCy's
            ``en_core_web_sm`` (the official parser) where installed, else the built-in rules.
        preprocess: "openai" (default: CLIP's own image transform, as the official code) or
            "transformers" (the checkpoint's `CLIPImageProcessor`).
    """

    name = "clip_score"
    default_model = DEFAULT_CLIP
    official_dtype = torch.float16
    categories = ("non_spatial", "complex")
    description = "T2I-CompBench CLIPScore: raw cosine of CLIP ViT-B/32 image and prompt embeddings"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse a `preprocess` other than "openai" or "transformers" (`CLIPEncoder` checks it too) and
        an unknown `noun_phrase_backend`."""
        if "preprocess" in options:
            check_choice("preprocess", options["preprocess"], PREPROCESS)
        if "noun_phrase_backend" in options:
            check_choice("noun_phrase_backend", options["noun_phrase_backend"], BACKENDS)

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        remove_adjectives: bool = False,
        preprocess: Preprocess = "openai",
        noun_phrase_backend: Backend = "auto",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"preprocess": preprocess, "noun_phrase_backend": noun_phrase_backend})
        self.remove_adjectives = remove_adjectives
        self.noun_phrase_backend = noun_phrase_backend
        # Which tagger finds the adjectives (spaCy's: the official ones), for the details.
        self.parser = parser_record(noun_phrase_backend) if remove_adjectives else None
        self.clip = CLIPEncoder(
            str(self.model_name_or_path), MODEL_FLAG, self.device, self.torch_dtype, preprocess
        )

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        if not images:
            return RewardOutput(scores=[])
        if self.remove_adjectives:
            texts, removed = map(list, zip(*(split_adjectives(prompt, self.noun_phrase_backend) for prompt in prompts)))
        else:
            texts, removed = list(prompts), [[] for _ in prompts]
        features = self.clip.image_embeddings(images, self.batch_size)
        cosines = cosines_by_text(self.clip, features, texts, self.batch_size)
        scores = [cosine_to_score(c) for c in cosines]
        details = [
            {"text": t, "removed_adjectives": r, "truncated": cut, "cosine": c, "score": s}
            | ({"parser": self.parser} if self.parser else {})
            for t, r, cut, c, s in zip(
                texts, removed, self.clip.truncated(texts), cosines, scores, strict=True
            )
        ]
        return RewardOutput(scores=scores, details=details)
