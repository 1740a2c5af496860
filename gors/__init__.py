"""gors: reward-driven text-to-image fine-tuning (GORS) with built-in compositional evaluators.

The package is light to import: models load only when a stage or a reward is built.
"""

__version__ = "0.1.0"
