"""The offline demo: GORS end to end on tiny random models, on a CPU (`make demo` runs this).

    accelerate launch --config_file accelerate_configs/cpu.yaml recipes/gors_demo.py [--flag value ...]
"""

from gors.demo import main

if __name__ == "__main__":
    main()
