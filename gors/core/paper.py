"""The T2I-CompBench paper's facts, in one place: every other module reads them from here.

Source: T2I-CompBench (Huang et al., NeurIPS 2023) and its official repository
(`Karine-Huang/T2I-CompBench`); 3d_spatial and numeracy come from T2I-CompBench++. Nothing here
is ever used as a measured result: `PUBLISHED` is printed beside measured numbers in reports.
"""

from __future__ import annotations

import re

# The GORS training categories; 3d_spatial and numeracy (T2I-CompBench++) are evaluated but have
# no GORS thresholds or checkpoints in the paper.
CATEGORIES = ("color", "shape", "texture", "spatial", "non_spatial", "complex")
ALL_CATEGORIES = CATEGORIES + ("3d_spatial", "numeracy")

# Each category's evaluation metric as the paper's table names it (label, metric) and the reward
# that computes it. Biased GORS trains with this reward.
TABLE_LABELS: dict[str, tuple[str, str]] = {
    "color": ("Color", "B-VQA"),
    "shape": ("Shape", "B-VQA"),
    "texture": ("Texture", "B-VQA"),
    "spatial": ("2D-Spatial", "UniDet"),
    "3d_spatial": ("3D-Spatial", "UniDet"),
    "numeracy": ("Numeracy", "UniDet"),
    "non_spatial": ("Non-Spatial", "CLIPScore"),
    "complex": ("Complex", "3-in-1"),
}
METRIC_REWARD: dict[str, str] = {
    "color": "b_vqa",
    "shape": "b_vqa",
    "texture": "b_vqa",
    "spatial": "spatial_rule",
    "non_spatial": "clip_score",
    "complex": "three_in_one",
    "3d_spatial": "spatial_3d",
    "numeracy": "numeracy",
}
# GORS-unbiased: rewards disjoint from the evaluation metrics, so a gain cannot come from gaming them.
UNBIASED_REWARD: dict[str, str] = {
    "color": "grounded_sam",
    "shape": "grounded_sam",
    "texture": "grounded_sam",
    "spatial": "grounded_detection",
    "non_spatial": "blip_clip",
    "complex": "unbiased_complex",
}

# GORS selection thresholds (Sec. 4 / appendix): in each category's train file the first 560
# prompts come from templates, the rest are natural prompts; attribute binding is stricter on
# template prompts.
TEMPLATE_PROMPT_COUNT = 560
SELECTION_THRESHOLDS: dict[str, tuple[float, float]] = {  # (template, natural)
    "color": (0.92, 0.7),
    "shape": (0.85, 0.6),
    "texture": (0.9, 0.65),
    "spatial": (0.8, 0.8),
    "non_spatial": (0.75, 0.75),
    "complex": (0.4, 0.4),
}


def selection_threshold(category: str, prompt_index: int) -> float:
    """GORS reward threshold tau in [0, 1] for the `prompt_index`-th prompt (0-based) of a category's train file.

    The first `TEMPLATE_PROMPT_COUNT` (560) prompts are template prompts, the rest natural prompts:
    color 0.92/0.7, shape 0.85/0.6, texture 0.9/0.65; spatial 0.8, non-spatial 0.75 and complex
    0.4 use one threshold for all prompts.
    """
    if category not in SELECTION_THRESHOLDS:
        raise ValueError(f"No GORS threshold for category {category!r}; known categories: {', '.join(CATEGORIES)}")
    if prompt_index < 0:
        raise ValueError(f"prompt_index must be >= 0, got {prompt_index}")
    template, natural = SELECTION_THRESHOLDS[category]
    return template if prompt_index < TEMPLATE_PROMPT_COUNT else natural


# The released GORS LoRAs, one per category: GORS_finetune/checkpoint/<category>/<stem>.pt.
OFFICIAL_CHECKPOINT_STEMS: dict[str, str] = {
    "color": "lora_weight_e357_s124500",
    "shape": "lora_weight_e180_s49000",
    "texture": "lora_weight_e118_s63000",
    "spatial": "spatial",
    "non_spatial": "non_spatial",
    "complex": "complex",
}
# The steps the released checkpoints were saved at, where their names say ("..._e357_s124500": step 124 500).
RELEASED_CHECKPOINT_STEPS: dict[str, int] = {
    category: int(match.group(1)) for category, stem in OFFICIAL_CHECKPOINT_STEMS.items()
    if (match := re.search(r"_s(\d+)$", stem))
}

# The prompts each T2I-CompBench category's published numbers average over: its validation set.
PUBLISHED_PROMPTS = 300

# Table 2: Stable Diffusion v2 (`stable-diffusion-2-base`, the model GORS fine-tunes) and GORS,
# each category's own metric; keys are `gors evaluate` labels.
PUBLISHED: dict[str, dict[str, float]] = {
    "SD-2-base (T2I-CompBench paper)": {
        "t2i_compbench:color": 0.5065,
        "t2i_compbench:shape": 0.4221,
        "t2i_compbench:texture": 0.4922,
        "t2i_compbench:spatial": 0.1342,
        "t2i_compbench:non_spatial": 0.3096,
        "t2i_compbench:complex": 0.3386,
    },
    "GORS (T2I-CompBench paper)": {
        "t2i_compbench:color": 0.6603,
        "t2i_compbench:shape": 0.4785,
        "t2i_compbench:texture": 0.6287,
        "t2i_compbench:spatial": 0.1815,
        "t2i_compbench:non_spatial": 0.3193,
        "t2i_compbench:complex": 0.3328,
    },
}


# The GORS training run of one category, as published: what `gors estimate` prices by default. Each
# value's source is below; `GORS_RUN_SOURCES` repeats it in words for the printed estimate.
GORS_TRAIN_PROMPTS = 700  # lines of each category's <category>_train.txt in the official dataset
GORS_IMAGES_PER_PROMPT = 90  # k, the images generated per prompt (the T2I-CompBench paper's GORS)
# The denoising steps of the training samples: neither the paper nor the official repository states
# them (the repository releases no script that generates the training samples). Its sampling script
# GORS_finetune/inference.py defaults to 50, the plan issue #13 prices; its metric images take 30
# (inference_eval.py), as `gors run` and the recipes sample SD 1/2 (`--num_inference_steps 30`
# prices that).
GORS_SAMPLING_STEPS = 50
GORS_TRAIN_STEPS = 15000  # official GORS_finetune/train_text_to_image.py, --max_train_steps default
GORS_TRAIN_BATCH_PER_GPU = 2  # the same script's --train_batch_size default (no gradient accumulation)
GORS_TRAIN_GPUS = 8  # official GORS_finetune/train.sh: accelerate launch --num_processes=8
GORS_GLOBAL_BATCH = GORS_TRAIN_BATCH_PER_GPU * GORS_TRAIN_GPUS
GORS_RUN_SOURCES: dict[str, str] = {
    "num_prompts": "each category's train file in the official dataset",
    "images_per_prompt": "the T2I-CompBench paper's GORS",
    "num_inference_steps": "source unclear: the official repository has no script for the training samples; 50 "
                           "is its sampling script's default (inference.py); gors samples with 30, its metric "
                           "images' DDIM steps (pass --num_inference_steps 30 to price that)",
    "max_train_steps": "official train_text_to_image.py",
    "global_batch_size": "official train_text_to_image.py and train.sh: 2 per GPU x 8 GPUs",
}

# How the T2I-CompBench repository asks to be cited (its Readme.md at the pinned commit 1b70949): the
# paper of GORS and of the benchmark. The model cards of `gors push` and the README give it.
T2I_COMPBENCH_BIBTEX = """@article{huang2023t2icompbench,
  title={T2i-compbench: A comprehensive benchmark for open-world compositional text-to-image generation},
  author={Huang, Kaiyi and Sun, Kaiyue and Xie, Enze and Li, Zhenguo and Liu, Xihui},
  journal={Advances in Neural Information Processing Systems},
  volume={36},
  pages={78723--78747},
  year={2023}
}"""
