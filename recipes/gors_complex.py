"""GORS on T2I-CompBench complex, with the paper's defaults (SD-2-base, the complex train prompts, tau).

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_complex.py [--flag value ...]
"""

from gors.recipes import run_recipe

if __name__ == "__main__":
    run_recipe("complex")
