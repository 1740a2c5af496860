"""B-VQA: gors' one vision pass per image against T2I-CompBench's official 8 passes, same BLIP VQA.

Both run in one process on the same random-weight BLIP VQA model (transformers'
`BlipForQuestionAnswering`), the same images and the same prompts, interleaved and repeated; the
script prints the min and median of the paired time ratios and how far the scores differ.

- **Reference, T2I-CompBench** (``BLIPvqa_eval/`` of Karine-Huang/T2I-CompBench, read as facts,
  not copied: ``BLIP_vqa.py``, ``BLIP/train_vqa_func.py``, ``models/blip_vqa.py``,
  ``data/__init__.py``, ``data/vqa_dataset.py``, ``data/utils.py``, ``configs/vqa.yaml``).
  ``BLIP_vqa.py`` makes ``--np_num`` passes (default 8) over all images. Pass i writes one
  question per image, "<noun phrase i>?" from spaCy's noun chunks of the prompt (chunks equal to
  'top', 'the side', 'the left' or 'the right' dropped), or the empty question '' when the prompt
  has fewer phrases, and runs the whole evaluation on it (``VQA_main``: the model is built and
  its checkpoint loaded again, then a test DataLoader of batch ``batch_size_test`` 32 goes through
  ``evaluation`` with ``inference: 'vqa_prob'``). Per batch: every image is read and transformed
  (``Resize((480, 480), bicubic)``, ``ToTensor``, ``Normalize`` with CLIP's mean and std), each
  question goes through ``pre_question`` (lower case, ``.!"()*#:;~`` removed, trailing spaces
  stripped); ``BLIP_VQA.forward`` runs the vision encoder on the batch, tokenises the questions
  (``padding='longest', truncation=True, max_length=35``), replaces each first token by [ENC], runs
  the text encoder (question attention mask, cross-attention to all image tokens), and
  ``vqa_prob`` runs the answer decoder on the one token [DEC] with cross-attention to the question
  states under the question mask; the softmax over the vocabulary at that position gives
  P(yes) / (P(yes) + P(no)) (token ids 2748 and 2053), written as ``'{:.4f}'``. An empty question's
  answer is replaced by 1, and an image scores the product of its 8 answers. So every pass runs
  the vision encoder over every image again, however many phrases its prompt has.
  Written here with transformers' BLIP: the same calls in the same batches (8 passes, batch 32,
  the vision model re-run each pass, [ENC] first, padded questions with their mask, the full
  softmax). One departure, for correctness only: transformers' BLIP text layers drop the
  cross-attention mask (`BlipTextAttention` hands it on as ``attention_mask``, which
  `BlipTextSelfAttention` replaces by its unset ``encoder_attention_mask``; transformers 5.24), so
  the decoder would attend to the padding of the shorter questions of a batch; the reference
  therefore decodes the questions of each token length together on their unpadded states, which
  is what the official mask computes (the decoder runs one token, a small part of the work).
  Left out of the timing, so the reference is faster than the official script: rebuilding and
  reloading the model in every pass, reading and decoding the image files (the images are handed
  over in memory, the transform, with its resize of SD-2-base's 512 px samples to 480, still runs
  every pass; until 2026-12-05 the images were 480 px and the resize did nothing), spaCy (both sides use gors' built-in
  noun-phrase chunker, which gives the same phrases on these prompts), the JSON files, and the
  4-decimal rounding (left out on both sides, gors' with ``decimals=None``, so that the agreement
  measures the computation, not the format).
- **gors**: `BVQAReward.score` (``rewards/b_vqa.py``) on the same images and prompts: the vision
  model once per image, then only the prompts' real questions (no empty ones), batched across
  images (``--batch_size`` 16, as `gors score` builds the reward: ``--reward_batch_size``, default
  16), on the stored vision features.

The model: `BlipForQuestionAnswering` built in code with the BLIP ViT-B/16 VQA architecture of
``Salesforce/blip-vqa-capfilt-large`` (values below), at 480 px as the official BLIP VQA runs it
(``configs/vqa.yaml``: ``image_size: 480``, 30 x 30 patches + [CLS] = 901 vision tokens). By
default it is scaled down in depth only, 2 of 12 vision layers and 2 of 12 text layers (text
encoder and decoder each), so widths, head counts, the vocabulary (30524) and the vision token
count are the real ones; ``--full-size`` builds all 12 + 12. Weights are random, std 0.02.
The tokenizer is gors' tiny BLIP test tokenizer (`gors.testing.blip`: BERT WordPiece, [DEC] after
the vocabulary, [ENC] after that; whole words for the prompts below, so the questions have the
real token counts, except 'leaf', which it spells in 4 pieces and which makes one pass pad);
the image processor is transformers' `BlipImageProcessor` (bicubic, CLIP mean and std) at 480 px, which
`BVQAReward` reads with the PIL backend (`BlipImageProcessorPil`), as BLIP resizes.

    python benchmarks/b_vqa_passes.py                        # CPU, 2 + 2 layers, 8 images, 3 pairs
    python benchmarks/b_vqa_passes.py --repeats 1 --images 4
    python benchmarks/b_vqa_passes.py --device cuda --full-size --repeats 5

`python -m benchmarks` calls `measure` with ``--device`` (and ``--full-size``) and puts its row in
the common table. In float32 the per-image scores must agree within 1e-5.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import SpeedResult, paired_ratios, positive_int, print_table
from PIL import Image

from rewards.b_vqa import BVQAReward
from rewards.noun_phrases import noun_phrases

# ----- the official procedure's settings ---------------------------------------------------------
OFFICIAL_PASSES = 8  # BLIP_vqa.py: --np_num, default 8
OFFICIAL_BATCH_SIZE = 32  # configs/vqa.yaml: batch_size_test
OFFICIAL_IMAGE_SIZE = 480  # configs/vqa.yaml: image_size
SAMPLE_SIZE = 512  # SD-2-base's samples, which T2I-CompBench scores (both sides resize them to 480)
OFFICIAL_MAX_QUESTION_TOKENS = 35  # models/blip_vqa.py: the question tokenizer's max_length
OFFICIAL_DROPPED_PHRASES = ("top", "the side", "the left", "the right")  # BLIP_vqa.py
# data/__init__.py: transforms.Normalize of transform_test (CLIP's mean and std).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# ----- the model ---------------------------------------------------------------------------------
# Salesforce/blip-vqa-capfilt-large is transformers' conversion of BLIP's
# model_base_vqa_capfilt_large.pth (the checkpoint of configs/vqa.yaml): BLIP's ViT-B/16 vision
# encoder (BLIP models/vit.py, create_vit('base'): width 768, depth 12, 12 heads, MLP 3072,
# patch 16) and its BERT-base text encoder and decoder (BLIP configs/med_config.json: hidden 768,
# 12 layers, 12 heads, intermediate 3072, vocabulary 30524 = BERT's 30522 + [DEC] + [ENC],
# 512 positions, layer-norm eps 1e-12). The values below are those of Salesforce's transformers
# BLIP base config.json (read for blip-image-captioning-base, the same conversion; the VQA
# repository's own file could not be read offline): vision layer-norm eps 1e-5, projection 512.
# image_size is the official 480: transformers' conversion script (convert_blip_original_pytorch_
# to_hf.py) loads this checkpoint with image_size=384, which resizes its position embeddings.
BLIP_VQA_VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "patch_size": 16,
    "image_size": OFFICIAL_IMAGE_SIZE,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
    "projection_dim": 512,
}
BLIP_VQA_TEXT = {
    "vocab_size": 30524,
    "hidden_size": 768,
    "encoder_hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "tie_word_embeddings": True,
}
INIT_STD = 0.02  # the text config's initializer_range

# T2I-CompBench-style colour prompts (two or three "<colour> <object>" phrases), one per image.
PROMPTS = [
    "a green bench and a red car",
    "a red apple and a green leaf",
    "a blue cat and a brown dog",
    "a pink bag, a gray box and a blue ball",
    "a white vase and a black book",
    "a yellow bowl and a purple cup",
    "an orange chair and a silver table",
    "a white clock and a red lamp",
]


def build_model(tokenizer, vision_layers: int, text_layers: int):
    """A random `BlipForQuestionAnswering` of the BLIP VQA architecture at the given depths, on the
    CPU in float32; the token ids ([DEC], [PAD], [SEP]) are the tokenizer's."""
    from transformers import BlipConfig, BlipForQuestionAnswering
    from transformers.initialization import no_init_weights

    config = BlipConfig(
        vision_config={**BLIP_VQA_VISION, "num_hidden_layers": vision_layers},
        text_config={**BLIP_VQA_TEXT, "num_hidden_layers": text_layers, "bos_token_id": tokenizer.bos_token_id,
                     "pad_token_id": tokenizer.pad_token_id, "sep_token_id": tokenizer.sep_token_id,
                     "eos_token_id": tokenizer.sep_token_id},
        projection_dim=512,
        image_text_hidden_size=256,
    )
    # Built without transformers' initialisation (slow at full size), then filled: N(0, 0.02)
    # weights and embeddings, zero biases, unit layer-norm scales.
    with no_init_weights():
        model = BlipForQuestionAnswering(config).eval()
    generator = torch.Generator().manual_seed(0)
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            parameter.data.zero_()
        elif "norm" in name.lower():
            parameter.data.fill_(1.0)
        else:
            parameter.data.normal_(0.0, INIT_STD, generator=generator)
    model.tie_weights()
    return model


def parameter_counts(model) -> dict[str, int]:
    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    return {"vision encoder": count(model.vision_model), "text encoder": count(model.text_encoder),
            "answer decoder": count(model.text_decoder)}


# ----- the reference: T2I-CompBench's B-VQA ------------------------------------------------------


def official_question(prompt: str, pass_index: int) -> str:
    """BLIP_vqa.py's question of pass `pass_index` for `prompt`: its noun phrase of that index
    (the dropped phrases left out) with '?', or '' when the prompt has no such phrase."""
    phrases = [p for p in noun_phrases(prompt, "builtin") if p not in OFFICIAL_DROPPED_PHRASES]
    return f"{phrases[pass_index]}?" if len(phrases) > pass_index else ""


def pre_question(question: str, max_words: int = 50) -> str:
    """data/utils.py's question clean-up: lower case, ``.!"()*#:;~`` removed, trailing spaces
    stripped, at most `max_words` words."""
    question = re.sub(r"[.!\"()*#:;~]", "", question.lower()).rstrip(" ")
    words = question.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else question


def official_transform():
    """data/__init__.py's transform_test."""
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode

    return transforms.Compose([
        transforms.Resize((OFFICIAL_IMAGE_SIZE, OFFICIAL_IMAGE_SIZE), interpolation=InterpolationMode.BICUBIC),
        transforms.ToTensor(),
        transforms.Normalize(CLIP_MEAN, CLIP_STD),
    ])


class OfficialBVQA:
    """T2I-CompBench's B-VQA procedure on a transformers BLIP VQA model (see the module docstring)."""

    def __init__(self, model, tokenizer, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.tokenizer, self.device, self.dtype = model, tokenizer, device, dtype
        self.transform = official_transform()
        self.bos_id = model.config.text_config.bos_token_id  # [DEC]
        self.enc_id = self.bos_id + 1  # [ENC], added after [DEC] (BLIP's init_tokenizer)
        self.yes_id = tokenizer.convert_tokens_to_ids("yes")  # 2748 in BERT's vocabulary
        self.no_id = tokenizer.convert_tokens_to_ids("no")  # 2053

    @torch.no_grad()
    def vqa_prob(self, pixel_values: torch.Tensor, questions: list[str]) -> list[float]:
        """models/blip_vqa.py's forward with inference='vqa_prob' on one batch."""
        model = self.model
        image_embeds = model.vision_model(pixel_values=pixel_values).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device)
        question = self.tokenizer(questions, padding="longest", truncation=True,
                                  max_length=OFFICIAL_MAX_QUESTION_TOKENS, return_tensors="pt").to(self.device)
        question.input_ids[:, 0] = self.enc_id
        question_states = model.text_encoder(input_ids=question.input_ids, attention_mask=question.attention_mask,
                                             encoder_hidden_states=image_embeds,
                                             encoder_attention_mask=image_atts).last_hidden_state
        # vqa_prob: the decoder on [DEC], cross-attending to the question states under the question
        # mask. transformers drops that mask, so each token length is decoded on its unpadded states.
        lengths = question.attention_mask.sum(dim=1)
        logits = torch.empty(len(questions), model.config.text_config.vocab_size, device=self.device)
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero().squeeze(1)
            start_ids = torch.full((len(rows), 1), self.bos_id, device=self.device)
            output = model.text_decoder(input_ids=start_ids, encoder_hidden_states=question_states[rows, :length],
                                        encoder_attention_mask=question.attention_mask[rows, :length])
            logits[rows] = output.logits[:, 0, :].float()
        prob = torch.softmax(logits, dim=1)
        prob_yes, prob_no = prob[:, self.yes_id], prob[:, self.no_id]
        return (prob_yes / (prob_yes + prob_no)).tolist()

    def score(self, images: list[Image.Image], prompts: list[str]) -> tuple[list[float], list[list[float]]]:
        """(score of each image, its answers of the 8 passes (1 for an empty question))."""
        answers = [[1.0] * OFFICIAL_PASSES for _ in images]
        for pass_index in range(OFFICIAL_PASSES):
            questions = [official_question(prompt, pass_index) for prompt in prompts]
            for start in range(0, len(images), OFFICIAL_BATCH_SIZE):
                batch = range(start, min(start + OFFICIAL_BATCH_SIZE, len(images)))
                pixel_values = torch.stack([self.transform(images[k]) for k in batch]).to(self.device, self.dtype)
                probs = self.vqa_prob(pixel_values, [pre_question(questions[k]) for k in batch])
                for k, prob in zip(batch, probs, strict=True):
                    if questions[k] != "":
                        answers[k][pass_index] = prob
        return [math.prod(row) for row in answers], answers


# ----- the comparison ----------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--full-size", action="store_true", help="all 12 vision and 12 text layers")
    parser.add_argument("--vision_layers", type=int, default=2, help="of 12 in BLIP ViT-B/16")
    parser.add_argument("--text_layers", type=int, default=2, help="of 12 (text encoder and decoder each)")
    parser.add_argument("--images", type=int, default=8, help="images (and prompts, cycled)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed pairs")
    parser.add_argument("--batch_size", type=int, default=16,
                        help="gors' batch (gors run's --reward_batch_size, default 16)")
    args = parser.parse_args(argv)
    if args.full_size:
        args.vision_layers = BLIP_VQA_VISION["num_hidden_layers"]
        args.text_layers = BLIP_VQA_TEXT["num_hidden_layers"]
    return args


def save_model(folder: Path, vision_layers: int, text_layers: int) -> dict[str, int]:
    """Write a BLIP VQA model of `build_model`'s architecture at these depths (of 12), with its
    processor at 480 px, to `folder` for `BVQAReward` to load; returns its parameter counts."""
    from transformers import BlipImageProcessor, BlipProcessor

    from gors.testing.blip import build_tiny_blip_vqa

    with tempfile.TemporaryDirectory(prefix="b_vqa_tokenizer_") as workdir:
        tiny = build_tiny_blip_vqa(Path(workdir) / "tiny", seed=0)  # its folder gives the tokenizer files
        processor = BlipProcessor(
            image_processor=BlipImageProcessor(size={"height": OFFICIAL_IMAGE_SIZE, "width": OFFICIAL_IMAGE_SIZE}),
            tokenizer=BlipProcessor.from_pretrained(tiny).tokenizer,
        )
    model = build_model(processor.tokenizer, vision_layers, text_layers)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return parameter_counts(model)


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    """Build the model, time both procedures in interleaved pairs, print the details; one row."""
    args = parse(argv)
    device, dtype = torch.device(args.device), torch.float32  # the official evaluation runs in float32

    with tempfile.TemporaryDirectory(prefix="b_vqa_bench_") as workdir:
        start = time.perf_counter()
        folder = Path(workdir) / "model"
        counts = save_model(folder, args.vision_layers, args.text_layers)
        reward = BVQAReward(model_name_or_path=str(folder), device=device, torch_dtype=dtype,
                            batch_size=args.batch_size, noun_phrase_backend="builtin", decimals=None)
        built_s = time.perf_counter() - start
    official = OfficialBVQA(reward.model, reward.processor.tokenizer, device, dtype)

    rng = np.random.default_rng(0)
    side = SAMPLE_SIZE
    images = [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(args.images)]
    prompts = [PROMPTS[k % len(PROMPTS)] for k in range(args.images)]
    questions = [official_question(p, i) for p in prompts for i in range(OFFICIAL_PASSES)]
    asked = [q for q in questions if q]
    lengths = [len(ids) for ids in reward.processor.tokenizer(asked).input_ids]
    vision_tokens = (OFFICIAL_IMAGE_SIZE // BLIP_VQA_VISION["patch_size"]) ** 2 + 1
    print(f"model: BLIP ViT-B/16 VQA (Salesforce/blip-vqa-capfilt-large architecture), {args.vision_layers}/12 "
          f"vision layers, {args.text_layers}/12 text layers (encoder and decoder each), width 768, random "
          f"weights, built in {built_s:.0f} s; float32 on {device}")
    for name, count in counts.items():
        print(f"  {name:16s} {count / 1e6:7.1f} M parameters")
    print(f"inputs: {args.images} images of {side} x {side} px, resized to {OFFICIAL_IMAGE_SIZE} ({vision_tokens} "
          "vision tokens each), "
          f"{len(asked)} questions ({min(lengths)}-{max(lengths)} tokens); official: {OFFICIAL_PASSES} passes "
          f"of batch {OFFICIAL_BATCH_SIZE} = {OFFICIAL_PASSES * args.images} image encodings; gors: "
          f"{args.images} image encodings, questions in batches of {args.batch_size}; {args.repeats} pairs",
          flush=True)

    reference_seconds: list[float] = []
    gors_seconds: list[float] = []

    def reference():
        start = time.perf_counter()
        result = official.score(images, prompts)
        reference_seconds.append(time.perf_counter() - start)
        return result

    def ours():
        start = time.perf_counter()
        result = reward.score(images, prompts)
        gors_seconds.append(time.perf_counter() - start)
        return result

    # Warm-up of both (thread pools, first touches of the activations' memory) on one image, then
    # the timed pairs on all of them.
    official.score(images[:1], prompts[:1])
    reward.score(images[:1], prompts[:1])
    ratios, (reference_scores, reference_answers), output = paired_ratios(reference, ours, device, args.repeats,
                                                                          warmup=0)
    score_difference = max(abs(r - g) for r, g in zip(reference_scores, output.scores, strict=True))
    answer_difference = max(
        abs(answer - p)
        for row, details in zip(reference_answers, output.details, strict=True)
        for answer, p in zip(row, details["p_yes"])  # the asked questions come first in both
    )
    print(f"timed pairs: official {', '.join(f'{s:.2f}' for s in reference_seconds)} s; "
          f"gors {', '.join(f'{s:.2f}' for s in gors_seconds)} s")
    print(f"speed-up (official / gors, {len(ratios)} interleaved pairs): min {min(ratios):.2f}x, "
          f"median {statistics.median(ratios):.2f}x")
    all_p = [p for details in output.details for p in details["p_yes"]]
    print(f"agreement: per-image scores max |difference| {score_difference:.1e}, per-question P(yes) "
          f"{answer_difference:.1e} (bound 1e-5); P(yes) ranges over {min(all_p):.4f}-{max(all_p):.4f}")
    if max(score_difference, answer_difference) > 1e-5:
        raise SystemExit("the two procedures disagree beyond 1e-5")
    sizes = (f"{args.vision_layers}/12 vision + {args.text_layers}/12 text layers, width 768, "
             f"{sum(counts.values()) / 1e6:.0f} M parameters, {side} px images at {OFFICIAL_IMAGE_SIZE} px "
             f"({vision_tokens} vision tokens), "
             f"{args.images} images x {len(asked) / args.images:.2g} questions, float32")
    return [SpeedResult(
        stage="B-VQA, BLIP ViT-B/16 VQA at 480 px",
        reference=f"T2I-CompBench `BLIP_vqa.py`: {OFFICIAL_PASSES} passes of batch {OFFICIAL_BATCH_SIZE}, "
                  "vision re-run each pass",
        sizes=sizes,
        ratios=ratios,
        agreement=f"{max(score_difference, answer_difference):.0e}",
        prices="score",
    )]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
