"""The toy world's shared data: prompts and renderer (`world`) and the packaged pretrained weights.

The layers above build on it: the exact scorer and the classifier reward live in `rewards`
(`toy_rules`, `toy_cnn`, `toy_oracle`, `toy_classifier`), the `toy` benchmark in `evaluators`,
and pretraining and the demo in `gors.toy`.
"""

from pathlib import Path

# The toy pipeline (`pipeline/`) and classifier (`classifier/`) that ship with the package.
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
