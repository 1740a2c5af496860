"""GenEval's metric as a reward: Mask2Former COCO instances + CLIP colours, judged by GenEval's rules.

An image scores 1.0 when it satisfies every clause of its prompt and 0.0 otherwise (GenEval is
binary). The clauses come from each image's metadata (`tag`, `include`, `exclude`, as in
GenEval's `evaluation_metadata.jsonl`), which the GenEval benchmark passes along; the rules are
`rewards.geneval_rules`.

The official evaluator (djghosh13/geneval `evaluation/evaluate_images.py`) runs mmdetection's
Mask2Former Swin-S COCO instance model, which has no build for current PyTorch. We run it in
`transformers`: `model_name_or_path="official"` downloads GenEval's own checkpoint (the file its
`download_models.sh` fetches) and converts it once (`rewards.mmdet_mask2former`), so detections and
numbers are GenEval's (same weights; only OpenCV's fixed-point rounding of the resize, within one
level of 255, and floating-point order differ); the default, the Hub's
`facebook/mask2former-swin-small-coco-instance`, has the same architecture and training data but is
another training run (detectron2's), so its numbers compare in kind, not to the decimal. Either way
we reproduce mmdetection's test-time processing: images resized to a shortest edge of 800 and a
longest of 1333 pixels (mmdetection's test scale; the Hub processor's own default is 384) with
OpenCV's bilinear, which does not smooth when it shrinks (`mmdet_resize`), padded with grey 128 to
multiples of 32 before normalising (GenEval's config; only non-square images are padded), the 100
best (query, class) pairs, masks upsampled bilinearly to the image and thresholded at logit 0,
confidence = class probability x mean mask probability inside the mask, box = the mask's extent.

Colours follow the official code: open_clip `ViT-L-14` with OpenAI weights (QuickGELU, as OpenAI
trained it), zero-shot over GenEval's 10 colours with the templates "a photo of a {c} {object}",
"a photo of a {c}-colored {object}", "a photo of a {c} object" (text embeddings normalised, then
averaged and normalised again); each object is pasted through its mask onto a #999 grey image
first and cropped to its box second, then CLIP-preprocessed. On CUDA the colour check runs as the
official one does there: float32 weights under float16 autocast (CLIP_benchmark's default).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from gors.core.hub import ModelLoadError, from_pretrained, note_load
from rewards.base import Reward, RewardOutput, check_number, same_size_batches
from rewards.geneval_rules import (
    COLORS,
    COUNTING_THRESHOLD,
    GENEVAL_CLASSES,
    MAX_OBJECTS,
    POSITION_THRESHOLD,
    THRESHOLD,
    ColorClassifier,
    GenEvalObject,
    check_metadata,
    judge_image,
)
from rewards.mmdet_mask2former import OFFICIAL, official_detector_folder

MODEL_FLAG = "geneval model_name_or_path"
CLAUSES_HINT = (
    "give each prompt GenEval's clauses (tag, include, exclude) as in GenEval's evaluation_metadata.jsonl: "
    "train on a .jsonl of such rows with a 'prompt' each (`python -m evaluators.geneval_train_prompts` writes "
    "one, recipes/gors_geneval.py uses it) or score through the geneval benchmark"
)
# Other names of GenEval's classes in COCO label sets (detectron2 / Hub checkpoints, VOC-style dumps).
CLASS_ALIASES = {
    "mouse": "computer mouse", "remote": "tv remote", "keyboard": "computer keyboard", "tvmonitor": "tv",
    "tv monitor": "tv", "aeroplane": "airplane", "motorbike": "motorcycle", "sofa": "couch",
    "pottedplant": "potted plant", "diningtable": "dining table", "hair dryer": "hair drier",
}
COLOR_TEMPLATES = ("a photo of a {c} {obj}", "a photo of a {c}-colored {obj}", "a photo of a {c} object")
MAX_PER_IMAGE = 100  # mmdetection's Mask2Former test_cfg.max_per_image
MMDET_TEST_SIZE = (800, 1333)  # (shortest, longest) edge of mmdetection's Mask2Former test pipeline
MMDET_SIZE_DIVISOR = 32  # mmdetection's test pipeline pads the resized image to multiples of this
# ... with grey 128 on every channel, before normalising (GenEval's config, mmdetection 2.x's Mask2Former LSJ test
# pipeline: `Pad(size_divisor=32, pad_val=dict(img=(128, 128, 128)))`, then `Normalize`).
MMDET_PAD_VALUE = 128
_PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def geneval_label_names(id2label: Mapping[int, str]) -> dict[int, str]:
    """Model label id -> GenEval class name, for the labels that are GenEval classes.

    Names are compared lower-cased with "_" and "-" read as spaces, through `CLASS_ALIASES`.
    Labels that are no GenEval class (e.g. a panoptic model's stuff classes) are left out.
    Raises ValueError when a GenEval class has no label: such a model cannot score GenEval.
    """
    mapping = {}
    for index, label in id2label.items():
        name = " ".join(str(label).lower().replace("_", " ").replace("-", " ").split())
        name = CLASS_ALIASES.get(name, name)
        if name in GENEVAL_CLASSES:
            mapping[int(index)] = name
    missing = [name for name in GENEVAL_CLASSES if name not in mapping.values()]
    if missing:
        raise ValueError(
            f"the detector's labels lack {len(missing)} of GenEval's 80 COCO classes (first: {missing[:5]}); "
            "pass a COCO instance segmentation checkpoint such as facebook/mask2former-swin-small-coco-instance."
        )
    return mapping


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """(x_min, y_min, x_max, y_max) of each boolean (N, H, W) mask, max exclusive (mmdetection's
    `mask2bbox`); an empty mask gets (0, 0, 0, 0)."""
    columns, rows = masks.any(dim=1).int(), masks.any(dim=2).int()  # (N, W), (N, H)
    # argmax finds the first occupied column / row; on the flipped axis, the last one.
    boxes = torch.stack(
        [columns.argmax(dim=1), rows.argmax(dim=1),
         columns.shape[1] - columns.flip(1).argmax(dim=1), rows.shape[1] - rows.flip(1).argmax(dim=1)], dim=1
    ).float()
    return boxes * columns.any(dim=1, keepdim=True)


@dataclass
class InstancePredictions:
    """The best (query, class) pairs of one image, most confident first.

    Attributes:
        labels: (K,) class ids of the model.
        scores: (K,) confidence in [0, 1] = class probability x mean mask probability in the mask.
        boxes: (K, 4) mask extents in image pixels.
        masks: (Q', H, W) boolean masks of the distinct queries; `mask_index` (K,) points into it.
    """

    labels: torch.Tensor
    scores: torch.Tensor
    boxes: torch.Tensor
    masks: torch.Tensor
    mask_index: torch.Tensor


def instance_predictions(
    class_logits: torch.Tensor,
    mask_logits: torch.Tensor,
    input_size: tuple[int, int],
    valid_size: tuple[int, int],
    image_size: tuple[int, int],
    max_per_image: int = MAX_PER_IMAGE,
) -> InstancePredictions:
    """mmdetection's Mask2Former instance post-processing of one image.

    Args:
        class_logits: (Q, C + 1) class logits, the last column "no object".
        mask_logits: (Q, h, w) mask logits at the model's output resolution.
        input_size: (height, width) of the padded model input.
        valid_size: (height, width) of the resized image inside it (the rest is padding).
        image_size: (height, width) of the original image.
        max_per_image: how many (query, class) pairs to keep.
    """
    num_classes = class_logits.shape[-1] - 1
    probabilities = class_logits.float().softmax(-1)[:, :-1].flatten()
    top_scores, top = probabilities.topk(min(max_per_image, probabilities.numel()))
    queries, labels = top // num_classes, top % num_classes
    distinct, mask_index = queries.unique(return_inverse=True)
    logits = F.interpolate(mask_logits[distinct][None].float(), size=input_size, mode="bilinear", align_corners=False)
    logits = logits[..., : valid_size[0], : valid_size[1]]
    logits = F.interpolate(logits, size=image_size, mode="bilinear", align_corners=False)[0]
    masks = logits > 0
    mask_scores = (logits.sigmoid() * masks).flatten(1).sum(1) / (masks.flatten(1).sum(1) + 1e-6)
    return InstancePredictions(
        labels=labels, scores=top_scores * mask_scores[mask_index], boxes=mask_boxes(masks)[mask_index],
        masks=masks, mask_index=mask_index,
    )


def mmdet_resize(image: Image.Image, image_size: Sequence[int]) -> torch.Tensor:
    """`image` as mmdetection's test pipeline resizes it (`Resize(keep_ratio=True)`, mmcv's `imresize`
    with OpenCV's bilinear): scaled by the largest factor that keeps its short side within
    `image_size[0]` and its long side within `image_size[1]`, each side rounded half up, sampled
    bilinearly at half-pixel centres without antialiasing (PIL's bilinear filter widens when it
    shrinks, so a 1024-px image brought to 800 px would be smoothed). Returns uint8, (3, height, width)."""
    short, long = image_size
    width, height = image.size
    scale = min(long / max(width, height), short / min(width, height))
    size = (int(height * scale + 0.5), int(width * scale + 0.5))
    pixels = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)[None].float()
    resized = F.interpolate(pixels, size=size, mode="bilinear", align_corners=False, antialias=False)
    return resized[0].round().clamp(0, 255).to(torch.uint8)


class Mask2FormerDetector:
    """GenEval-class instances of a `transformers` Mask2Former COCO instance segmenter.

    Args:
        model_name_or_path: Hub id or folder of a Mask2Former COCO instance checkpoint, or "official"
            for GenEval's own mmdetection checkpoint (downloaded and converted once into the cache).
        device, torch_dtype: where and in which dtype the model runs.
        image_size: (shortest, longest) edge in pixels the image is resized to, keeping its aspect
            ratio; default mmdetection's test scale (800, 1333); None keeps the checkpoint
            processor's setting.
        batch_size: images per forward pass (only images of one size share a pass, so an
            image's detections never depend on the others).
    """

    def __init__(
        self,
        model_name_or_path: str,
        device: torch.device,
        torch_dtype: torch.dtype = torch.float32,
        image_size: Sequence[int] | None = MMDET_TEST_SIZE,
        batch_size: int = 8,
    ) -> None:
        from transformers import Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor

        if model_name_or_path == OFFICIAL:
            model_name_or_path = official_detector_folder()
        self.image_size = image_size
        self.processor = from_pretrained(Mask2FormerImageProcessor.from_pretrained, model_name_or_path, MODEL_FLAG)
        model = from_pretrained(
            Mask2FormerForUniversalSegmentation.from_pretrained, model_name_or_path, MODEL_FLAG, dtype=torch_dtype
        )
        self.model = model.to(device).eval().requires_grad_(False)
        self.device, self.dtype, self.batch_size = device, torch_dtype, batch_size
        try:
            self.class_names = geneval_label_names(self.model.config.id2label)
        except ValueError as err:
            raise ValueError(f"{MODEL_FLAG}={model_name_or_path!r}: {err}") from err

    @torch.no_grad()
    def detect(self, images: Sequence[Image.Image], threshold: float = 0.0) -> list[dict[str, list[GenEvalObject]]]:
        """Per image: GenEval class -> objects with confidence > `threshold`, most confident first."""
        results: list[dict[str, list[GenEvalObject]]] = [{} for _ in images]
        for chunk in same_size_batches(images, range(len(images)), self.batch_size):
            pixel_values, pixel_mask = self.inputs([images[i] for i in chunk])
            pixel_values = pixel_values.to(self.device, self.dtype)
            pixel_mask = pixel_mask.to(self.device)
            outputs = self.model(pixel_values=pixel_values, pixel_mask=pixel_mask)
            for k, i in enumerate(chunk):
                valid = (int(pixel_mask[k, :, 0].sum()), int(pixel_mask[k, 0, :].sum()))
                width, height = images[i].size
                predictions = instance_predictions(
                    outputs.class_queries_logits[k], outputs.masks_queries_logits[k],
                    tuple(pixel_values.shape[-2:]), valid, (height, width),
                )
                results[i] = self._objects(predictions, threshold)
        return results

    def inputs(self, images: Sequence[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's `pixel_values` and `pixel_mask` for images of one size. With `image_size`, as
        mmdetection's test pipeline makes them: `mmdet_resize`, padded with grey `MMDET_PAD_VALUE` to
        multiples of `MMDET_SIZE_DIVISOR`, normalised (the mask marks the image); else as the checkpoint's
        processor."""
        if self.image_size is None:
            inputs = self.processor(images=list(images), return_tensors="pt")
            return inputs["pixel_values"], inputs["pixel_mask"]
        resized = [mmdet_resize(image, self.image_size) for image in images]
        inputs = self.processor(images=resized, do_resize=False, input_data_format="channels_first",
                                return_tensors="pt")
        values = inputs["pixel_values"]
        height, width = values.shape[-2:]
        pad = (-width % MMDET_SIZE_DIVISOR, -height % MMDET_SIZE_DIVISOR)
        # Grey 128 as the processor normalises a pixel: mmdetection pads before normalising.
        grey = [(MMDET_PAD_VALUE * self.processor.rescale_factor - mean) / std
                for mean, std in zip(self.processor.image_mean, self.processor.image_std, strict=True)]
        padded = torch.tensor(grey, dtype=values.dtype).view(1, -1, 1, 1).repeat(
            len(values), 1, height + pad[1], width + pad[0])
        padded[..., :height, :width] = values
        return padded, F.pad(inputs["pixel_mask"], (0, pad[0], 0, pad[1]))

    def _objects(self, predictions: InstancePredictions, threshold: float) -> dict[str, list[GenEvalObject]]:
        # One copy of the small tensors to the host, and only the kept objects' full-size masks.
        order = predictions.scores.argsort(descending=True, stable=True).cpu().tolist()
        scores = predictions.scores.float().cpu().tolist()
        labels = predictions.labels.cpu().tolist()
        boxes = predictions.boxes.float().cpu().tolist()
        mask_index = predictions.mask_index.cpu().tolist()
        kept = [k for k in order if scores[k] > threshold and labels[k] in self.class_names]
        masks = predictions.masks[[mask_index[k] for k in kept]].cpu().numpy() if kept else []
        objects: dict[str, list[GenEvalObject]] = {}
        for k, mask in zip(kept, masks):
            objects.setdefault(self.class_names[labels[k]], []).append(GenEvalObject(tuple(boxes[k]), scores[k], mask))
        return objects


# GenEval's colour classifier: open_clip's architecture and pretrained tag.
CLIP_MODEL, CLIP_PRETRAINED = "ViT-L-14", "openai"


def open_clip_hub_repo(model_name: str, pretrained: str) -> str | None:
    """The Hub repository open_clip downloads `pretrained` weights of `model_name` from (as open_clip
    reads its `hf_hub` entry: `org/name/` or `org/name/file`), None for a local file or a tag without one."""
    import open_clip

    hub = (open_clip.get_pretrained_cfg(model_name, pretrained) or {}).get("hf_hub", "")
    return os.path.split(hub)[0] or None


class ClipColorClassifier:
    """GenEval's zero-shot colour classifier on open_clip (see the module docstring).

    Args:
        model_name: open_clip architecture name (official: "ViT-L-14").
        pretrained: open_clip pretrained tag (official: "openai") or a local checkpoint file.
        device, torch_dtype: where and in which precision CLIP runs.
        background: colour the object is pasted onto through its mask (official "#999").
        batch_size: crops per forward pass.
    """

    def __init__(
        self,
        model_name: str = CLIP_MODEL,
        pretrained: str = CLIP_PRETRAINED,
        device: torch.device | str = "cpu",
        torch_dtype: torch.dtype = torch.float32,
        background: str = "#999",
        batch_size: int = 16,
    ) -> None:
        import open_clip

        pretrained_cfg = open_clip.get_pretrained_cfg(model_name, pretrained) or {}
        # OpenAI's CLIP was trained with QuickGELU; the official code's open_clip built it that way.
        quick_gelu = bool(pretrained_cfg.get("quick_gelu", False))
        try:
            model, _, self.preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=pretrained, device=device, precision=_PRECISION.get(torch_dtype, "fp32"),
                force_quick_gelu=quick_gelu,
            )
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, AssertionError, OSError) as err:  # AssertionError: weights of another architecture
            raise ModelLoadError(
                f"geneval clip_model={model_name!r}, clip_pretrained={pretrained!r}: open_clip could not "
                f"load it ({err}). Pass an open_clip architecture name and a pretrained tag or a local checkpoint "
                "file; offline, download the weights first (open_clip caches them in the Hugging Face cache)."
            ) from err
        # A tag's weights come from its Hub repository (with the commit the cache holds); a file is local.
        note_load(open_clip_hub_repo(model_name, pretrained) or pretrained)
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.device, self.background, self.batch_size = torch.device(device), background, batch_size
        self._text: dict[str, torch.Tensor] = {}

    def precision(self) -> torch.autocast:
        """The official colour check's precision: evaluate_images.py keeps open_clip's float32 weights and
        CLIP_benchmark's zero-shot functions run them under autocast (their `amp=True` default), which
        is float16 on CUDA; on the CPU, plain float32."""
        return torch.autocast(self.device.type, dtype=torch.float16, enabled=self.device.type == "cuda")

    @torch.no_grad()
    def text_classifier(self, classname: str) -> torch.Tensor:
        """(embedding dim, 10) unit text embeddings of `COLORS` for `classname`, one column per colour."""
        if classname not in self._text:
            columns = []
            with self.precision():
                for colour in COLORS:
                    texts = [t.format(c=colour, obj=classname) for t in COLOR_TEMPLATES]
                    column = F.normalize(self.model.encode_text(self.tokenizer(texts).to(self.device)), dim=-1).mean(0)
                    columns.append(column / column.norm())
            self._text[classname] = torch.stack(columns, dim=1)
        return self._text[classname]

    def crops(self, image: Image.Image, objects: Sequence[GenEvalObject]) -> list[Image.Image]:
        """Each object pasted through its mask onto the background colour, then cropped to its box."""
        blank = Image.new("RGB", image.size, color=self.background)
        crops = []
        for obj in objects:
            pasted = image if obj.mask is None else Image.composite(image, blank, Image.fromarray(obj.mask))
            crops.append(pasted.crop(obj.box))
        return crops

    @torch.no_grad()
    def __call__(self, image: Image.Image, classname: str, objects: Sequence[GenEvalObject]) -> list[str]:
        """One colour of `COLORS` per object of `classname` in `image`."""
        classifier = self.text_classifier(classname)
        crops = self.crops(image, objects)
        colours: list[str] = []
        for start in range(0, len(crops), self.batch_size):
            batch = torch.stack([self.preprocess(c) for c in crops[start : start + self.batch_size]]).to(self.device)
            with self.precision():
                features = F.normalize(self.model.encode_image(batch.to(next(self.model.parameters()).dtype)), dim=-1)
                logits = 100.0 * features @ classifier  # the official scale: it rounds as theirs in float16
            colours += [COLORS[k] for k in logits.float().argmax(dim=1).tolist()]
        return colours


class GenEvalReward(Reward):
    """GenEval correctness of each image against its metadata's clauses; scores in {0.0, 1.0}.

    Args:
        model_name_or_path: Mask2Former COCO instance checkpoint (Hub id or folder); "official" for
            GenEval's own detector (mmdetection's checkpoint, downloaded from download.openmmlab.com
            and converted once: GenEval's numbers); default
            `facebook/mask2former-swin-small-coco-instance` (the official detector's architecture and
            training data, another training run: numbers that compare in kind).
        device, torch_dtype, batch_size: see `Reward`; `batch_size` is images per detector pass.
        clip_model, clip_pretrained: the colour classifier's open_clip model (official "ViT-L-14",
            "openai"; a local checkpoint file works as `clip_pretrained`).
        threshold, counting_threshold, max_objects, position_threshold: GenEval's options
            (official 0.3, 0.9, 16, 0.1); see `rewards.geneval_rules`.
        detector_image_size: (shortest, longest) edge the detector resizes images to; default
            mmdetection's (800, 1333); None keeps the checkpoint processor's setting.
        background: colour behind a masked object for the colour check (official "#999").
    """

    name = "geneval"
    # 4: the padding of non-square images grey 128 before normalising, as mmdetection's (3 padded 0 after);
    # 3: the detector's input resized and padded as mmdetection's test pipeline (OpenCV's bilinear, which does
    # not smooth when it shrinks; zero padding to multiples of 32, where transformers' processor stretched the
    # sides up to them) and scores compared with the thresholds in float32; 2: on CUDA the colour check runs
    # under float16 autocast, as the official one (1: float32)
    scoring_version = 4
    # GenEval's evaluate_images.py runs mmdetection's Mask2Former and open_clip's weights in float32 (the
    # colour check under float16 autocast on CUDA: `ClipColorClassifier.precision`).
    official_dtype = torch.float32
    default_model = "facebook/mask2former-swin-small-coco-instance"
    description = (
        "GenEval correctness (0/1): Mask2Former COCO instances + CLIP ViT-L-14 colours checked against the "
        "prompt's GenEval clauses (needs tag/include/exclude metadata)"
    )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse, before any model loads, detector thresholds outside [0, 1), fewer than one object per
        class, a negative position threshold and a detector size that is not [shortest, longest] edge."""
        for option, default in (("threshold", THRESHOLD), ("counting_threshold", COUNTING_THRESHOLD)):
            value = options.get(option, default)
            check_number(option, value)
            if value >= 1.0:  # a confidence never exceeds 1: nothing would be detected
                raise ValueError(f"{option}={value}: a detector confidence threshold must lie in [0, 1)")
        check_number("max_objects", options.get("max_objects", MAX_OBJECTS), 1, math.inf)
        check_number("position_threshold", options.get("position_threshold", POSITION_THRESHOLD), 0, math.inf)
        size = options.get("detector_image_size", MMDET_TEST_SIZE)
        if size is not None and (not isinstance(size, (list, tuple)) or len(size) != 2):
            raise ValueError(f"detector_image_size={size!r}: give [shortest, longest] edge in pixels")

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        clip_model: str = CLIP_MODEL,
        clip_pretrained: str = CLIP_PRETRAINED,
        threshold: float = THRESHOLD,
        counting_threshold: float = COUNTING_THRESHOLD,
        max_objects: int = MAX_OBJECTS,
        position_threshold: float = POSITION_THRESHOLD,
        detector_image_size: Sequence[int] | None = MMDET_TEST_SIZE,
        background: str = "#999",
    ) -> None:
        super().__init__(model_name_or_path, device, torch_dtype, batch_size)
        self.check_options({"threshold": threshold, "counting_threshold": counting_threshold, "max_objects": max_objects,
                            "position_threshold": position_threshold, "detector_image_size": detector_image_size})
        self.rule_options = {
            "threshold": threshold, "counting_threshold": counting_threshold, "max_objects": max_objects,
            "position_threshold": position_threshold,
        }
        self.detector = Mask2FormerDetector(
            str(self.model_name_or_path), self.device, self.torch_dtype, detector_image_size, batch_size
        )
        self.classify_colors = ClipColorClassifier(
            clip_model, clip_pretrained, self.device, self.torch_dtype, background, batch_size=16
        )

    @classmethod
    def download_files(cls, options: Mapping[str, Any]) -> None:
        """GenEval's own detector checkpoint with `model_name_or_path="official"`, converted once."""
        if options.get("model_name_or_path") == OFFICIAL:
            official_detector_folder()

    @classmethod
    def models(cls, options: Mapping[str, Any]) -> dict[str, str]:
        """The detector (none from the Hub for `"official"`: GenEval's own checkpoint, from openmmlab) and
        the Hub repository of the colour classifier's open_clip weights (`clip_pretrained`)."""
        models = super().models(options)
        if models.get("model_name_or_path") == OFFICIAL:
            del models["model_name_or_path"]
        repo = open_clip_hub_repo(options.get("clip_model", CLIP_MODEL), options.get("clip_pretrained", CLIP_PRETRAINED))
        if repo is not None:
            models["clip_pretrained"] = repo
        return models

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[dict[str, Any]] | None) -> None:
        """Raise ValueError naming the first prompt whose metadata is no GenEval clause set (or none at all)."""
        if metadata is None:
            raise ValueError(f"the {cls.name} reward needs each prompt's GenEval clauses, but the prompts carry no "
                             f"metadata: {CLAUSES_HINT}")
        if len(metadata) < len(prompts):
            raise ValueError(f"the {cls.name} reward needs GenEval clauses for each of the {len(prompts)} prompts, "
                             f"but only {len(metadata)} metadata rows came with them: {CLAUSES_HINT}")
        for index, (prompt, meta) in enumerate(zip(prompts, metadata)):
            try:
                check_metadata(meta)
            except (ValueError, TypeError) as err:
                raise ValueError(f"the {cls.name} reward, prompt {index} ({prompt!r}): {err}") from err

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        self.check_prompts(prompts, metadata)
        # Nothing at or below the lower threshold can count, whatever the tag.
        floor = min(self.rule_options["threshold"], self.rule_options["counting_threshold"])
        detections = self.detector.detect(images, threshold=floor)
        judged = [self.judge(found, meta, partial(self.classify_colors, image))
                  for image, found, meta in zip(images, detections, metadata, strict=True)]
        return RewardOutput(scores=[score for score, _ in judged], details=[details for _, details in judged])

    def judge(self, detections: Mapping[str, Sequence[GenEvalObject]], metadata: Mapping[str, Any],
              classify_colors: ColorClassifier) -> tuple[float, dict[str, Any]]:
        """One image's score, 1.0 when GenEval judges it correct and 0.0 otherwise, and its details."""
        judgement = judge_image(detections, metadata, classify_colors, **self.rule_options)
        return (1.0 if judgement.correct else 0.0), judgement.details
