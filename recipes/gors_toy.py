"""GORS in the toy world on a CPU: base vs fine-tuned binding accuracy on held-out prompts.

    accelerate launch --config_file accelerate_configs/cpu.yaml recipes/gors_toy.py [--reward toy_classifier]
"""

from gors.toy.demo import main

if __name__ == "__main__":
    main()
