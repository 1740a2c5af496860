"""Soft-TIFA: gors' shared-prefix answering against GenEval 2's official per-question procedure.

Both run in one process on the same random-weight model of Qwen3-VL-8B's proportions, the same
images (files) and the same questions, interleaved batch by batch (the order alternating) and
repeated; the script prints the min and median of the paired time ratios and how far the
answer probabilities of the two differ.

- **Reference, GenEval 2** (``evaluation.py`` of facebookresearch/GenEval2, its local Qwen3-VL
  judge, read as facts, not copied): for every atom question of an image, the chat message
  ``[{"type": "image", "image": <file path>}, {"type": "text", "text": "<question> Answer in one
  word."}]`` goes through ``processor.apply_chat_template(tokenize=True, add_generation_prompt=
  True, return_dict=True, return_tensors="pt")`` (which reads and decodes the image file and
  preprocesses it), then ``model.generate(**inputs, max_new_tokens=1, do_sample=False,
  output_scores=True, return_dict_in_generate=True)``; the atom scores the sum of
  ``softmax(scores[0])[tokenizer.encode(variant)[0]]`` over the answer variants. So every question
  runs the vision tower and the whole language model over the image tokens again.
- **gors**: `SoftTIFAReward.score` on a batch of images (``--images``, 4 by default), each read
  once from its file, as gors' evaluators and GORS' score stage call a reward: the vision tower
  once per image, the chat prefix up to the image tokens through the language model once, the
  image's questions as one packed prefix tree of continuations on its cache, and the LM head
  once for the batch's questions (see `rewards.vlm`).

The model: `Qwen3VLForConditionalGeneration` built in code from Qwen/Qwen3-VL-8B-Instruct's
published ``config.json`` (values below), scaled down in depth only (by default 2 text layers of
36 and 2 vision layers of 27, deepstack features from both vision layers instead of layers 8, 16
and 24), so hidden sizes, head counts, the vocabulary (151936), the image token count (a 512 x
512 image: 32 x 32 patches of 16 px, merged 2 x 2 into 256 tokens) and the per-layer work are the
real ones. Weights are random (std 0.02, as the config's ``initializer_range``); the LM head
shares the input embedding's matrix (the published model has two; the computation is the same
and it saves 2.5 GB of random weights). The tokenizer is gors' tiny test tokenizer
(`gors.testing.qwen3_vl`: Qwen's special tokens, chat layout and pre-tokenizer, whole-word tokens),
so the text parts of the prompts have about the real token counts; the image processor is the
published one's (``preprocessor_config.json``: patch 16, merge 2, temporal patch 2, pixels from
65536 to 16777216, mean and std 0.5).

    python benchmarks/soft_tifa_one_pass.py                      # CPU, float32, 4 images, 3 pairs
    python benchmarks/soft_tifa_one_pass.py --images 1 --repeats 5
    python benchmarks/soft_tifa_one_pass.py --device cuda --full-size --images 8   # bfloat16, 36 + 27 layers

On 2 idle CPU cores the default run takes about 3 minutes (the model is built in about 30 s; a
pair of runs over 4 images takes about 45 s). `python -m benchmarks` calls `measure` with ``--device`` and
``--full-size`` and puts its row in the common table.

The agreement must be within 1e-4 (relative) in float32; in bfloat16 the two procedures' matrix
products round differently (batched or not), and the difference is only reported (against 2e-2),
beside each procedure's distance to the official procedure on a float32 copy of the model (the
first image's questions): gors' rounding should move the distributions about as far as the
official procedure's own.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import SpeedResult, paired_ratios, positive_int, print_table
from PIL import Image

from rewards.atoms import QUESTION_SUFFIX, answer_variants
from rewards.soft_tifa import SoftTIFAReward
from rewards.vlm import ChatVLM

# In half precision gors may be at most this many times as far from the official procedure in float32 as GenEval
# 2's own procedure in that precision is (plus 1e-3): both round, neither is the reference.
HALF_PRECISION_SLACK = 2.0

# A GenEval 2 prompt of atomicity 7 and its official [question, answer] atoms: the example of
# GenEval 2's README, 7 questions for one image.
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

# Qwen/Qwen3-VL-8B-Instruct, config.json (text_config and vision_config; its rope_theta and
# rope_scaling are written in transformers 5's rope_parameters form; tie_word_embeddings is false
# there, see the module docstring).
QWEN3_VL_8B_TEXT = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "vocab_size": 151936,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": [24, 20, 20],
        "mrope_interleaved": True,
    },
    "initializer_range": 0.02,
}
QWEN3_VL_8B_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 4096,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
    "initializer_range": 0.02,
}
# Qwen/Qwen3-VL-8B-Instruct, preprocessor_config.json.
QWEN3_VL_8B_IMAGES = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def deepstack_indexes(vision_layers: int, text_layers: int) -> list[int]:
    """The published indexes at full depth; else the last vision layers, at most 3 and at most
    one per text layer (deepstack feature j is added after text layer j)."""
    if vision_layers == QWEN3_VL_8B_VISION["depth"]:
        return list(QWEN3_VL_8B_VISION["deepstack_visual_indexes"])
    count = min(3, vision_layers, text_layers)
    return list(range(vision_layers - count, vision_layers))


def build_model(tokenizer_dir: Path, text_layers: int, vision_layers: int, device: torch.device,
                dtype: torch.dtype):
    """(model, processor): Qwen3-VL-8B's proportions at the given depths, random weights."""
    from transformers import (
        AutoTokenizer,
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.initialization import no_init_weights
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from gors.testing.qwen3_vl import CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**QWEN3_VL_8B_IMAGES),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**QWEN3_VL_8B_IMAGES),
        chat_template=CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in
           ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|endoftext|>")}
    config = Qwen3VLConfig(
        text_config={**QWEN3_VL_8B_TEXT, "num_hidden_layers": text_layers, "pad_token_id": ids["<|endoftext|>"]},
        vision_config={**QWEN3_VL_8B_VISION, "depth": vision_layers,
                       "deepstack_visual_indexes": deepstack_indexes(vision_layers, text_layers)},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    # Built without transformers' initialisation (a minute for 1.2 B parameters on a small CPU),
    # then filled as it would fill them: N(0, 0.02) weights, zero biases, unit norm scales.
    with torch.device(device), no_init_weights():
        model = Qwen3VLForConditionalGeneration(config).eval()
    generator = torch.Generator(device).manual_seed(0)
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            parameter.data.zero_()
        elif "norm" in name:
            parameter.data.fill_(1.0)
        else:
            parameter.data.normal_(0.0, QWEN3_VL_8B_TEXT["initializer_range"], generator=generator)
    model.tie_weights()
    model = model.to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return model, processor


def parameter_counts(model) -> dict[str, int]:
    """Parameters (millions) of the vision tower (mergers included), decoder layers and embeddings."""
    base = model.base_model

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    return {
        "vision tower": count(base.visual),
        "decoder layers": count(base.language_model.layers),
        "embedding (= LM head)": count(base.language_model.embed_tokens),
    }


@torch.no_grad()
def official_probabilities(model, processor, image_path: str, vqa_list: list[list[str]]) -> list[torch.Tensor]:
    """GenEval 2's procedure: per question, the chat inputs from the image file and ``generate``
    of one greedy token, the softmax of its scores (vocabulary, float32) and its most probable token
    decoded; the softmaxes, one per question."""
    probabilities = []
    for question, _ in vqa_list:
        messages = [{"role": "user", "content": [{"type": "image", "image": image_path},
                                                 {"type": "text", "text": question + QUESTION_SUFFIX}]}]
        inputs = processor.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                               return_dict=True, return_tensors="pt").to(model.device)
        outputs = model.generate(**inputs, max_new_tokens=1, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        probabilities.append(torch.softmax(outputs.scores[0], dim=-1)[0].float())
        processor.batch_decode([torch.argmax(probabilities[-1])])  # the answer it decodes and keeps (a read-back)
    return probabilities


def official_atom_scores(tokenizer, probabilities: list[torch.Tensor]) -> list[float]:
    """GenEval 2's atom scores: the probabilities of ``tokenizer.encode(variant)[0]`` summed."""
    return [
        sum(float(probs[tokenizer.encode(variant)[0]]) for variant in answer_variants(question, answer))
        for (question, answer), probs in zip(VQA_LIST, probabilities, strict=True)
    ]


def gors_atom_scores(reward: SoftTIFAReward, image_paths: list[str]) -> list[list[float]]:
    """gors: the reward on a batch of images, each read once from its file; atom scores per image."""
    images = [Image.open(path).convert("RGB") for path in image_paths]
    output = reward.score(images, [PROMPT] * len(images), [{"vqa_list": VQA_LIST}] * len(images))
    return [details["atom_scores"] for details in output.details]


def relative_difference(got, reference) -> float:
    got, reference = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(reference, dtype=torch.float64)
    return float(((got - reference).abs() / reference.abs()).max())


@torch.no_grad()
def half_precision_errors(model, processor, image_path: str, official: list[torch.Tensor],
                          ours: list[torch.Tensor]) -> tuple[float, float]:
    """How far each procedure's half-precision distributions of one image's questions are from the official
    procedure's on a float32 copy of the model (max relative difference): in half precision the two
    procedures round differently, and this says whether gors' rounding moves the answers more than the
    official procedure's own does."""
    exact = copy.deepcopy(model).float()
    reference = official_probabilities(exact, processor, image_path, VQA_LIST)
    del exact
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return (max(relative_difference(o, r) for o, r in zip(official, reference, strict=True)),
            max(relative_difference(g, r) for g, r in zip(ours, reference, strict=True)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default float32 on the CPU, bfloat16 (GenEval 2's) on a GPU")
    parser.add_argument("--full-size", action="store_true", help="all 36 text and 27 vision layers")
    parser.add_argument("--text_layers", type=int, default=2, help="of 36 in Qwen3-VL-8B")
    parser.add_argument("--vision_layers", type=int, default=2, help="of 27 in Qwen3-VL-8B")
    parser.add_argument("--images", type=int, default=4, help="distinct images (files): gors' batch")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed pairs of passes over the images")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels")
    parser.add_argument("--batch_size", type=int, default=8, help="questions per continuation pass")
    args = parser.parse_args(argv)
    if args.full_size:
        args.text_layers, args.vision_layers = QWEN3_VL_8B_TEXT["num_hidden_layers"], QWEN3_VL_8B_VISION["depth"]
    if args.dtype is None:
        args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    return args


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    """Build the model, time both procedures in interleaved pairs, print the details; one row."""
    args = parse(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    from gors.testing.qwen3_vl import build_tiny_qwen3_vl

    workdir = Path(tempfile.mkdtemp(prefix="soft_tifa_bench_"))
    tiny = build_tiny_qwen3_vl(workdir / "tiny", seed=0)  # its tokenizer; a reward needs a checkpoint
    start = time.perf_counter()
    model, processor = build_model(tiny, args.text_layers, args.vision_layers, device, dtype)
    built_s = time.perf_counter() - start
    reward = SoftTIFAReward(model_name_or_path=str(tiny), device=device, batch_size=args.batch_size)
    # The reward's VLM swapped for the real-proportion model: the same tokenizer, so the
    # reward's answer-variant token ids stay right.
    reward.vlm = ChatVLM(model, processor, "Qwen3-VL-8B proportions")

    rng = np.random.default_rng(0)
    paths = []
    for i in range(args.images):
        path = workdir / f"image_{i}.png"
        Image.fromarray(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))

    encoded = reward.vlm.encode_images([Image.open(paths[0]).convert("RGB")])[0]
    image_tokens = reward.vlm.image_tokens(encoded)
    prompt_lengths = [len(reward.vlm.question_ids(q + QUESTION_SUFFIX, encoded)) for q, _ in VQA_LIST]
    prefix = reward.vlm.prefix_tokens + image_tokens - 1
    counts = parameter_counts(model)
    print(f"model: Qwen3-VL-8B proportions, {args.text_layers} text layers of 36, {args.vision_layers} "
          f"vision layers of 27 (deepstack {model.config.vision_config.deepstack_visual_indexes}), "
          f"random weights, built in {built_s:.0f} s; {args.dtype} on {device}")
    for name, count in counts.items():
        print(f"  {name:24s} {count / 1e6:8.1f} M parameters")
    print(f"inputs: {args.images} image(s) of {args.size} x {args.size} px ({image_tokens} image tokens each), "
          f"{len(VQA_LIST)} questions per image; prompts of {min(prompt_lengths)}-{max(prompt_lengths)} "
          f"tokens, of which {prefix} are the shared prefix; {args.repeats} repeats", flush=True)

    with torch.no_grad():
        # Warm-up of both paths (first touches of the activations' memory, thread pools, kernels):
        # one official question, and gors' whole distributions of image 0 for the agreement below.
        official_probabilities(model, processor, paths[0], VQA_LIST[:1])
        asked = [(0, question + QUESTION_SUFFIX) for question, _ in VQA_LIST]
        gors_probabilities = [p for _, p in reward.vlm.next_token_probabilities([encoded], asked, args.batch_size)]

        # A pair: each side over all images, gors in one call. Each side's seconds are taken
        # inside (their results are on the host, so the device is done).
        official_runs: list[tuple[list[torch.Tensor], list[list[float]], float]] = []
        gors_runs: list[tuple[list[list[float]], float]] = []

        def reference() -> None:
            start = time.perf_counter()
            probabilities, scores = [], []
            for path in paths:
                probabilities.append(official_probabilities(model, processor, path, VQA_LIST))
                scores.append(official_atom_scores(processor.tokenizer, probabilities[-1]))
            official_runs.append((probabilities[0], scores, time.perf_counter() - start))

        def ours() -> None:
            start = time.perf_counter()
            scores = gors_atom_scores(reward, paths)
            gors_runs.append((scores, time.perf_counter() - start))

        ratios, _, _ = paired_ratios(reference, ours, device, args.repeats, warmup=0)

    for k, (official_run, gors_run) in enumerate(zip(official_runs, gors_runs, strict=True)):
        print(f"  pair {k} ({args.images} images): GenEval 2 {official_run[2]:7.2f} s, gors {gors_run[1]:6.2f} s")

    atom_difference = max(relative_difference(g[0], o[1]) for g, o in zip(gors_runs, official_runs, strict=True))
    vocabulary_difference = max(
        relative_difference(g, o) for g, o in zip(gors_probabilities, official_runs[0][0], strict=True)
    )
    official_s = statistics.median(run[2] for run in official_runs) / args.images
    gors_s = statistics.median(run[1] for run in gors_runs) / args.images
    questions = len(VQA_LIST)
    print()
    print(f"| procedure ({questions} questions per image) | s per image (median) | s per question (median) |")
    print("|---|---|---|")
    print(f"| GenEval 2: generate(max_new_tokens=1) per question, image from its file | {official_s:.2f} | "
          f"{official_s / questions:.3f} |")
    print(f"| gors: vision and prefix once per image, questions packed on its cache, one LM head per batch "
          f"| {gors_s:.2f} | "
          f"{gors_s / questions:.3f} |")
    # In half precision the batched and one-at-a-time matrix products round differently by about 1e-2 of a
    # logit: the two are held instead to their distances from the official procedure in float32 (below).
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    print(f"speed-up (GenEval 2 / gors, {len(ratios)} interleaved pairs): min {min(ratios):.2f}x, "
          f"median {statistics.median(ratios):.2f}x")
    print(f"agreement: answer-variant probabilities (atom scores) max relative difference {atom_difference:.1e}; "
          f"whole next-token distributions ({questions} questions x {model.config.text_config.vocab_size}) "
          f"{vocabulary_difference:.1e}; bound {tolerance:.0e}")
    if dtype == torch.float32 and max(atom_difference, vocabulary_difference) > tolerance:
        raise SystemExit("the two procedures disagree beyond the bound")
    agreement = f"{max(atom_difference, vocabulary_difference):.0e}"
    if dtype != torch.float32:
        try:
            official_error, gors_error = half_precision_errors(model, processor, paths[0], official_runs[0][0],
                                                               gors_probabilities)
        except torch.cuda.OutOfMemoryError:  # the float32 copy beside the model: the row stands without it
            torch.cuda.empty_cache()
            print("against float32: not measured (a float32 copy of the model does not fit beside it)")
        else:
            print(f"against float32 (the official procedure on a float32 copy, image 0, whole distributions): "
                  f"GenEval 2 in {args.dtype} {official_error:.1e}, gors in {args.dtype} {gors_error:.1e}")
            agreement += f" (to float32: GenEval 2 {official_error:.0e}, gors {gors_error:.0e})"
            if gors_error > HALF_PRECISION_SLACK * official_error + 1e-3:
                raise SystemExit(f"gors in {args.dtype} is {gors_error:.1e} from float32, more than "
                                 f"{HALF_PRECISION_SLACK:g}x GenEval 2's own {args.dtype} procedure ({official_error:.1e})")
    sizes = (f"{args.text_layers}/36 text, {args.vision_layers}/27 vision layers, "
             f"{sum(counts.values()) / 1e9:.2f} B parameters, {args.size} px ({image_tokens} image tokens), "
             f"{questions} questions per image, {args.dtype}")
    return [SpeedResult(
        stage="Soft-TIFA, Qwen3-VL-8B proportions",
        reference="GenEval 2's `generate(max_new_tokens=1)` per question, image from its file",
        sizes=sizes,
        ratios=ratios,
        agreement=agreement,
    )]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
