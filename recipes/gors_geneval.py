"""GORS on GenEval-style prompts: SD-2-base, 700 training prompts that share no clause combination
with GenEval's 553 test prompts (written to <output_dir>/geneval_train_prompts.jsonl), the
`geneval_graded` reward (partial credit per clause), tau 0.7 (see `gors.recipes.GENEVAL_TAU`),
GenEval as validation.

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/gors_geneval.py [--flag value ...]
"""

from gors.recipes import run_geneval_recipe

if __name__ == "__main__":
    run_geneval_recipe()
