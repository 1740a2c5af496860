"""Which denoising steps a toy GORS LoRA helps at: held-out binding with the LoRA on at some steps only.

    python recipes/toy_lora_by_step.py --lora toy_output --variants base,all,first10,last10

For each variant the packaged toy model draws the 150 held-out prompts x 4 images (20 DDIM steps,
guidance 4, as the `toy` benchmark; image i of prompt p has the seed 10000 + 100 p + i) with the
LoRA's adapters, those of the U-Net and of the text encoder, on only at the variant's steps:
`base` none, `all` every step, `firstK` the K noisiest, `lastK` the K least noisy. It prints the
oracle's binding accuracy and the share of images with each binding error. A diagnostic for the
the toy results (docs/toy_world_results.md): a LoRA used so is not what `load_lora_weights` gives.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from tabulate import tabulate

from evaluators.toy import error_shares
from gors.core.pipeline import check_lora_path, cpu_generators, load_pipeline
from gors.core.toy import PRETRAINED_DIR
from gors.core.toy.world import split_prompts
from rewards.toy_rules import BINDING_ERRORS, judge_image

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

STEPS, GUIDANCE, IMAGES_PER_PROMPT, PROMPTS_PER_CALL = 20, 4.0, 4, 8


def steps_on(variant: str) -> Callable[[int], bool]:
    """Whether the LoRA is on at denoising step s (0 = the noisiest) in this variant."""
    if variant in ("base", "all"):
        return lambda step: variant == "all"
    for prefix, on in (("first", lambda step, k: step < k), ("last", lambda step, k: step >= STEPS - k)):
        if variant.startswith(prefix) and variant[len(prefix):].isdigit() and int(variant[len(prefix):]) <= STEPS:
            k = int(variant[len(prefix):])
            return lambda step: on(step, k)
    raise SystemExit(f"error: variant {variant!r}; use base, all, firstK or lastK (K <= {STEPS})")


def embeddings(pipe: DiffusionPipeline, texts: list[str], lora: bool) -> torch.Tensor:
    """[unconditional; prompt] embeddings, as the pipeline concatenates them, with or without the text-encoder LoRA."""
    (pipe.enable_lora if lora else pipe.disable_lora)()
    prompt, negative = pipe.encode_prompt(texts, pipe.device, 1, True, [""] * len(texts))
    return torch.cat([negative, prompt])


def evaluate(pipe: DiffusionPipeline, variant: str) -> dict[str, float]:
    """Held-out binding accuracy and error shares (in [0, 1]) with the LoRA on only at the steps `variant` names."""
    on = steps_on(variant)
    prompts = split_prompts()[1]
    bound, errors = [], []
    for start in range(0, len(prompts), PROMPTS_PER_CALL):
        batch = range(start, min(start + PROMPTS_PER_CALL, len(prompts)))
        texts = [prompts[p].text for p in batch for _ in range(IMAGES_PER_PROMPT)]
        generators = cpu_generators([10_000 + 100 * p + i for p in batch for i in range(IMAGES_PER_PROMPT)])
        with_lora, without = embeddings(pipe, texts, True), embeddings(pipe, texts, False)

        def switch(step: int) -> torch.Tensor:
            (pipe.unet.enable_adapters if on(step) else pipe.unet.disable_adapters)()
            return with_lora if on(step) else without

        def next_step(pipe, step: int, timestep, tensors: dict) -> dict:
            return {"prompt_embeds": switch(step + 1)} if step + 1 < STEPS else {}

        negative, prompt = switch(0).chunk(2)
        result = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, num_inference_steps=STEPS,
                      guidance_scale=GUIDANCE, height=64, width=64, generator=generators,
                      callback_on_step_end=next_step, callback_on_step_end_tensor_inputs=["prompt_embeds"])
        for text, image in zip(texts, result.images):
            judgement = judge_image(text, image)
            bound.append(judgement.bound)
            errors.append(judgement.errors)
    return {"binding": sum(bound) / len(bound), **error_shares(errors)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="recipes/toy_lora_by_step.py", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--lora", required=True, help="A toy run folder (or any folder with its LoRA).")
    parser.add_argument("--variants", default="base,all,first10,last10", help="Comma-separated; see the module doc.")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    for variant in variants:
        steps_on(variant)  # every name checked before any image
    try:
        check_lora_path(args.lora)  # one line, not diffusers' traceback about weight_name
    except (FileNotFoundError, ValueError) as err:  # ValueError: a weights file cut short or of another format
        raise SystemExit(f"error: {err}") from None
    torch.set_num_threads(1)  # the toy results' numbers were drawn on one thread; the summation order moves pixels
    pipe = load_pipeline(str(PRETRAINED_DIR / "pipeline"), torch.device("cpu"), lora=args.lora)
    pipe.set_progress_bar_config(disable=True)
    rows = []
    for variant in variants:
        rows.append([variant, *evaluate(pipe, variant).values()])
        print(f"{variant}: binding {rows[-1][1]:.3f}", flush=True)
    print(tabulate(rows, headers=["LoRA on at", "binding", *BINDING_ERRORS], floatfmt=".3f"))


if __name__ == "__main__":
    main()
