"""GORS on T2I-CompBench spatial, with the paper's defaults (SD-2-base, the spatial train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_spatial.py [--flag value ...]
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("spatial")
