"""Two toy settings compared on the same prompts and seeds: paired binding-accuracy difference per seed.

    python recipes/toy_compare.py ONE_s0 ROUNDS_s0 ONE_s1 ROUNDS_s1 ONE_s2 ROUNDS_s2
"""

from gors.toy.compare import main

if __name__ == "__main__":
    main()
