"""GORS on T2I-CompBench texture, with the paper's defaults (SD-2-base, the texture train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_texture.py [--flag value ...]
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("texture")
