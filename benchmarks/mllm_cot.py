"""MLLM-CoT: gors' batched two-turn judge against a plain ``generate`` per image and turn, as the official scripts run.

All run in one process on the same random-weight model of Qwen3-VL-8B's proportions (the model of
``soft_tifa_one_pass.py``: the published config, scaled down in depth only by default), the same
images and the same T2I-CompBench questions (`rewards.mllm_cot_prompts`), interleaved and
repeated; for each reference the script prints the min and median of its time ratios to gors and
whether the two give the same answers.

- **Two references, the official procedures** (Karine-Huang/T2I-CompBench's ``MLLM_eval``, read as
  facts), timed in one rotation with gors:
  - **ShareGPT4V-CoT** (``ShareGPT4V-CoT_eval/Share_eval.py``): turn by turn the whole conversation
    so far is rendered and tokenised and ``model.generate`` runs it from scratch, vision tower
    included, the image preprocessed once;
  - **MiniGPT-4-CoT** (``MiniGPT4-CoT_eval/mGPT_cot_*.py`` on MiniGPT-4's ``Chat``), the procedure
    whose prompts gors asks: ``upload_img`` runs the vision encoder once per image, then every
    ``answer`` embeds the whole conversation again with the kept image embeddings and generates
    from scratch; here the kept vision outputs go to ``generate`` as ``mm_encoder_outputs``.
  Both decode greedily with at most ``max_new_tokens`` new tokens. Departures from the official
  scripts (an audit, 2026-12-05), the same for both references and gors: greedy decoding where
  both sample (ShareGPT4V: temperature 0.2, top-p 0.7; MiniGPT-4: temperature 0.7 in the attribute
  script and 1 in the general one, top-p 0.9), which the agreement check needs; ShareGPT4V asks each
  rating on the system prompt, image and description alone (not the whole conversation) with up to
  512 new tokens, and streams its decoding; MiniGPT-4 asks again, up to 3 times, when an answer
  holds no number, each time on the conversation grown by the last answer, which neither the
  reference nor gors does (gors scores such an answer 0): with random weights no answer holds a
  number, so the official MiniGPT-4-CoT would run up to 5 `generate` calls per image where the
  reference runs 2, and its row understates the official cost. Each reference keeps its script's
  per-image, per-turn `generate` calls, which is what gors' batching replaces; the MiniGPT-4-CoT
  ratio is the lower of the two by the vision tower's share of a later turn.
- **gors**: `MLLMCoTReward.score` on all the images at once: the vision tower once per image,
  the first turn's prompts as one batch, greedy decoding of all rows together, and each later
  turn appended to the kept key/value cache (see `rewards.mllm_cot`).

Random weights rarely write the end-of-answer token, so every answer runs to ``max_new_tokens``
(every procedure alike; a trained judge stops earlier, at different lengths per image, which the
batched side handles by masking finished rows). The scores are then 0 with the reason "no whole
number": the agreement is checked on the answer texts, which decide the scores.

    python benchmarks/mllm_cot.py                                    # CPU, float32, 2 images, 3 repeats
    python benchmarks/mllm_cot.py --images 4 --max_new_tokens 64
    python benchmarks/mllm_cot.py --device cuda --full-size --images 8   # bfloat16, 36 + 27 layers

On 2 shared CPU cores the default run takes a few minutes (its measured ratios: benchmarks/README.md;
the vision tower and the first turn's prefill are not repeated, and the rows decode together).
`python -m benchmarks` calls `measure` with ``--device`` and ``--full-size`` and puts its two rows
in the common table. The answers must be equal in float32; in bfloat16 batched and one-at-a-time
products round differently, so greedy answers may part after a near tie, and the number of equal
answers is only reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from common import SpeedResult, interleaved_ratios, positive_int, print_table
from PIL import Image
from soft_tifa_one_pass import QWEN3_VL_8B_TEXT, QWEN3_VL_8B_VISION, build_model, parameter_counts

from rewards.mllm_cot import ChatJudge, MLLMCoTReward
from rewards.mllm_cot_prompts import category_questions
from rewards.vlm import ChatVLM

# Prompts of T2I-CompBench's complex_val.txt (one scoring question each) and color_val.txt (one
# per noun phrase).
PROMPTS = {
    "complex": ["The black chair is on the left of the wooden table",
                "A blue bowl sits on top of a white plate"],
    "color": ["a green bench and a blue bowl", "a red apple and a yellow banana"],
}


@torch.no_grad()
def official_conversation(model, processor, image: Image.Image, questions: list[str], max_new_tokens: int,
                          eos: list[int], vision_once: bool = False) -> list[str]:
    """An official procedure for one image: every turn re-renders the conversation and runs a plain
    greedy ``generate`` on it, with the vision tower run again (ShareGPT4V-CoT) or, with
    `vision_once`, its outputs kept from the first turn (MiniGPT-4-CoT); the stripped answers, in order."""
    messages: list[dict] = []
    answers = []
    # The image is preprocessed once, as both official scripts do; the processor's own expansion of its
    # placeholder and token types then give exactly what `processor(text, images)` gives each turn.
    image_inputs = processor.image_processor(images=[image], return_tensors="pt").to(model.device)
    image_tokens = processor.replace_image_token(image_inputs, 0)
    if vision_once:
        vision = model.model.get_image_features(image_inputs["pixel_values"], image_inputs["image_grid_thw"],
                                                return_dict=True)
        image_inputs = {"image_grid_thw": image_inputs["image_grid_thw"]}
    for k, question in enumerate(questions):
        content = ([{"type": "image"}] if k == 0 else []) + [{"type": "text", "text": question}]
        messages.append({"role": "user", "content": content})
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        tokens = processor.tokenizer([text.replace(processor.image_token, image_tokens, 1)], return_tensors="pt")
        token_types = torch.as_tensor(processor.create_mm_token_type_ids(tokens["input_ids"].tolist()))
        inputs = {**tokens, "mm_token_type_ids": token_types, **image_inputs}
        inputs = {name: value.to(model.device) for name, value in inputs.items()}
        if vision_once:
            inputs["mm_encoder_outputs"] = {"image": vision}
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                pad_token_id=processor.tokenizer.pad_token_id)
        answer = processor.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        answers.append(answer.strip())
        messages.append({"role": "assistant", "content": answers[-1]})
    return answers


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default float32 on the CPU, bfloat16 on a GPU")
    parser.add_argument("--full-size", action="store_true", help="all 36 text and 27 vision layers")
    parser.add_argument("--text_layers", type=int, default=2, help="of 36 in Qwen3-VL-8B")
    parser.add_argument("--vision_layers", type=int, default=2, help="of 27 in Qwen3-VL-8B")
    parser.add_argument("--category", default="complex", choices=sorted(PROMPTS))
    parser.add_argument("--images", type=int, default=2, help="images judged (one batch on the gors side)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed rotations of the three procedures")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels")
    parser.add_argument("--max_new_tokens", type=int, default=None,
                        help="longest answer per turn; default 24 on the CPU, 300 (official) with --full-size")
    args = parser.parse_args(argv)
    if args.full_size:
        args.text_layers, args.vision_layers = QWEN3_VL_8B_TEXT["num_hidden_layers"], QWEN3_VL_8B_VISION["depth"]
    if args.dtype is None:
        args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    if args.max_new_tokens is None:
        args.max_new_tokens = 300 if args.full_size else 24
    if min(args.images, args.repeats, args.max_new_tokens) < 1:
        parser.error("--images, --repeats and --max_new_tokens must be >= 1")
    return args


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    """Build the model, time both official procedures and gors' in interleaved rotations, print the
    details; a row per official procedure."""
    args = parse(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    from gors.testing.qwen3_vl import build_tiny_qwen3_vl

    workdir = Path(tempfile.mkdtemp(prefix="mllm_cot_bench_"))
    tiny = build_tiny_qwen3_vl(workdir / "tiny", seed=0)  # its tokenizer; a reward needs a checkpoint
    start = time.perf_counter()
    model, processor = build_model(tiny, args.text_layers, args.vision_layers, device, dtype)
    built_s = time.perf_counter() - start
    reward = MLLMCoTReward(model_name_or_path=str(tiny), device=device, batch_size=args.images,
                           category=args.category, max_new_tokens=args.max_new_tokens, noun_phrase_backend="builtin")
    # The reward's judge swapped for the real-proportion model (same tokenizer and chat template).
    reward.judge = ChatJudge(ChatVLM(model, processor, "Qwen3-VL-8B proportions"), args.max_new_tokens)
    eos = sorted(reward.judge.eos_ids)

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8))
              for _ in range(args.images)]
    prompts = [PROMPTS[args.category][i % len(PROMPTS[args.category])] for i in range(args.images)]
    turns = [[q.describe, *q.rate] for q in (category_questions(args.category, p, "builtin") for p in prompts)]
    image_tokens = reward.judge.vlm.image_tokens(reward.judge.vlm.encode_images(images[:1])[0])
    counts = parameter_counts(model)
    print(f"model: Qwen3-VL-8B proportions, {args.text_layers} text layers of 36, {args.vision_layers} vision "
          f"layers of 27, random weights, built in {built_s:.0f} s; {args.dtype} on {device}")
    print(f"inputs: {args.images} image(s) of {args.size} x {args.size} px ({image_tokens} image tokens each), "
          f"{args.category}: {len(turns[0])} turns per image, at most {args.max_new_tokens} new tokens per answer; "
          f"{args.repeats} repeats", flush=True)

    def reference(vision_once: bool) -> Callable[[], list[list[str]]]:
        return lambda: [official_conversation(model, processor, image, questions, args.max_new_tokens, eos, vision_once)
                        for image, questions in zip(images, turns)]

    def ours() -> list[list[str]]:
        details = reward.score(images, prompts).details
        return [[d["description"], *d["answers"]] for d in details]

    # name: (vision once per image, the row's description of the procedure)
    procedures = {
        "ShareGPT4V-CoT": (False, "plain greedy `generate` per image and turn on the re-rendered conversation, "
                                  "vision re-run each turn (ShareGPT4V-CoT)"),
        "MiniGPT-4-CoT": (True, "plain greedy `generate` per image and turn on the re-rendered conversation, "
                                "vision once per image (MiniGPT-4-CoT, whose prompts gors asks)"),
    }
    all_ratios, official, batched = interleaved_ratios(
        [reference(vision_once) for vision_once, _ in procedures.values()], ours, device, args.repeats)
    sizes = (f"{args.text_layers}/36 text, {args.vision_layers}/27 vision layers, "
             f"{sum(counts.values()) / 1e9:.2f} B parameters, {args.images} images of {args.size} px "
             f"({image_tokens} image tokens), {len(turns[0])} turns of <= {args.max_new_tokens} tokens, {args.dtype}")
    results = []
    for (name, (_, procedure)), ratios, answers in zip(procedures.items(), all_ratios, official):
        total = sum(len(a) for a in answers)
        equal = sum(o == b for conv_o, conv_b in zip(answers, batched) for o, b in zip(conv_o, conv_b))
        print(f"{name}: speed-up (official / gors, {len(ratios)} interleaved repeats): "
              f"min {min(ratios):.2f}x, median {statistics.median(ratios):.2f}x; {equal} of {total} answers equal")
        if dtype == torch.float32 and equal != total:
            raise SystemExit(f"{name} and gors give different answers")
        results.append(SpeedResult(stage=f"MLLM-CoT judge, Qwen3-VL-8B proportions, against {name}",
                                   reference=procedure, sizes=sizes, ratios=ratios,
                                   agreement=f"{equal}/{total} answers equal"))
    return results


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
