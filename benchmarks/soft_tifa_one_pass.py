"""Soft-TIFA's one-pass answering against GenEval 2's way, on the same images and questions.

GenEval 2's ``evaluation.py`` runs the whole model once per atom question (``generate`` with
one new token), so every image goes through the vision tower once per question. `SoftTIFAReward`
encodes each image once and answers a batch of questions in one language-model pass. This script
times both on the same inputs, checks that they give the same atom scores, and prints the ratio.

    python benchmarks/soft_tifa_one_pass.py                      # a tiny random Qwen3-VL on the CPU
    python benchmarks/soft_tifa_one_pass.py --model Qwen/Qwen3-VL-8B-Instruct --device cuda \
        --dtype bfloat16 --images 16 --batch_size 16

With the tiny model the ratio mostly measures Python and dispatch overhead; on the real 8B model
on a GPU it measures the vision tower and attention work saved.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from PIL import Image

from rewards.atoms import QUESTION_SUFFIX, answer_variants, variant_probability
from rewards.soft_tifa import SoftTIFAReward

# A GenEval 2 prompt of atomicity 7 and its official [question, answer] atoms.
PROMPT = "four white bicycles in front of three plastic cows"
VQA_LIST = [
    ["How many bicycles are in the image?", "four"],
    ["Are the bicycles white?", "Yes"],
    ["Are there any bicycles in the image?", "Yes"],
    ["Are the bicycles in front of the cows?", "Yes"],
    ["How many cows are in the image?", "three"],
    ["Are the cows plastic?", "Yes"],
    ["Are there any cows in the image?", "Yes"],
]


def reference_atom_scores(model, processor, image: Image.Image, variant_ids: list[list[int]]) -> list[float]:
    """One full forward per question, as GenEval 2 does: the summed probability of the variants."""
    scores = []
    for (question, _), ids in zip(VQA_LIST, variant_ids):
        messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": question + QUESTION_SUFFIX}]}]
        inputs = processor.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                               return_dict=True, return_tensors="pt").to(model.device)
        logits = model(**inputs).logits[0, -1]
        scores.append(variant_probability(logits.float().softmax(-1), ids))
    return scores


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="Qwen3-VL checkpoint; default a tiny random one built here")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--size", type=int, default=512, help="image side in pixels")
    parser.add_argument("--batch_size", type=int, default=8, help="questions per pass of the one-pass reward")
    args = parser.parse_args()

    model_path = args.model
    if model_path is None:
        from gors.testing.qwen3_vl import build_tiny_qwen3_vl

        model_path = str(build_tiny_qwen3_vl(tempfile.mkdtemp(prefix="tiny_qwen3_vl_"), seed=0))
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8))
              for _ in range(args.images)]
    metadata = [{"vqa_list": VQA_LIST}] * args.images

    reward = SoftTIFAReward(model_name_or_path=model_path, device=device, torch_dtype=dtype,
                            batch_size=args.batch_size)
    # The reference uses the very same weights and processor, called as GenEval 2 calls them.
    model, processor = reward.vlm.model, reward.vlm.processor
    variant_ids = [reward._variant_ids(answer_variants(q, a)) for q, a in VQA_LIST]

    with torch.no_grad():
        reward.score(images[:1], [PROMPT], metadata[:1])  # warm-up of both paths
        reference_atom_scores(model, processor, images[0], variant_ids)
        _synchronise(device)
        start = time.perf_counter()
        ours = reward.score(images, [PROMPT] * args.images, metadata)
        _synchronise(device)
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        reference = [reference_atom_scores(model, processor, image, variant_ids) for image in images]
        _synchronise(device)
        reference_s = time.perf_counter() - start

    difference = max(abs(a - b) for d, r in zip(ours.details, reference) for a, b in zip(d["atom_scores"], r))
    # Batched half-precision matrix products round differently from one-at-a-time ones.
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert difference <= tolerance, f"one-pass atom scores differ from the reference by {difference:.2e}"
    questions = args.images * len(VQA_LIST)
    print(f"model {model_path} on {device} ({args.dtype}); {args.images} images of {args.size} px, "
          f"{questions} questions")
    print(f"  GenEval 2 way (a full forward per question)   {reference_s:8.3f} s")
    print(f"  one pass (images encoded once, batches of {args.batch_size})  {ours_s:8.3f} s")
    print(f"  speed-up {reference_s / ours_s:.2f}x; largest atom-score difference {difference:.2e}")


if __name__ == "__main__":
    main()
