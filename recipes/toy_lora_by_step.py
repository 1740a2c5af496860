"""Which denoising steps a toy GORS LoRA helps at: held-out binding with its adapters on at some steps only.

    python recipes/toy_lora_by_step.py --lora toy_output --variants base,all,first10,last10
"""

from gors.toy.lora_by_step import main

if __name__ == "__main__":
    main()
