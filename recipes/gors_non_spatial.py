"""GORS on T2I-CompBench non_spatial, with the paper's defaults (SD-2-base, the non_spatial train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_non_spatial.py [--flag value ...]
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("non_spatial")
