"""gors: reward-driven text-to-image fine-tuning (GORS) with built-in compositional evaluators.

The package is light to import: models load only when a stage or a reward is built. Layers, each
importing only those below it: `gors.core` (run folders, sample store, io, hub, distributed,
sampling and scoring, the paper's facts), `rewards`, `evaluators`, then the trainer and CLI
(`gors.*`), then `recipes/`.
"""

from gors import _moved

__version__ = "0.1.0"

_moved.install()
