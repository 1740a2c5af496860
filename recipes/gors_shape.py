"""GORS on T2I-CompBench shape, with the paper's defaults (SD-2-base, the shape train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_shape.py [--flag value ...]
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("shape")
