"""GORS on T2I-CompBench color, with the paper's defaults (SD-2-base, the color train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_color.py [--flag value ...]
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("color")
