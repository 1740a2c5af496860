"""GORS on T2I-CompBench non_spatial, with the paper's defaults (SD-2-base, the non_spatial train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_non_spatial.py --unbiased

Its metric reward (CLIPScore) needs `--reward_threshold T` or `--select_top_fraction F`, or `--unbiased`
(BLIP-CLIP, on whose scale the paper's tau 0.75 is a plausible cut): the paper's tau is above any raw
CLIPScore, so without one of them the run stops before generating (docs/rewards.md).
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("non_spatial")
