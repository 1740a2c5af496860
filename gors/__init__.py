"""gors: reward-driven text-to-image fine-tuning (GORS) with built-in compositional evaluators.

The package is light to import: models load only when a stage or a reward is built. Layers, each
importing only those below it: `gors.core` (run folders, sample store, io, hub, distributed,
sampling and scoring, the paper's facts), `rewards`, `evaluators`, then the trainer and CLI
(`gors.*`), then `recipes/`.
"""

import os

# The process that started this one, read before anything heavy is imported: a launcher that dies
# meanwhile is then still noticed (`gors.core.distributed.die_with_launcher`).
PARENT_AT_START = os.getppid()

from gors import _moved  # noqa: E402  (after the parent is read)

__version__ = "0.2.0.dev0"

_moved.install()
