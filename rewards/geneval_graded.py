"""GenEval with partial credit as a training reward: the `geneval` models, graded rules.

The detector (Mask2Former COCO instances), the CLIP colour classifier, the thresholds and the
position rule are the binary `geneval` reward's (`rewards.geneval`); the clauses earn per-clause
credits that `rewards.geneval_graded_rules` combines into a score in [0, 1], 1.0 exactly when
GenEval judges the image correct. Each image's metadata must carry GenEval's clauses (`tag`,
`include`, `exclude`), e.g. a row of `evaluators.geneval_train_prompts`' training prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewards.geneval import GenEvalReward
from rewards.geneval_graded_rules import grade_image
from rewards.geneval_rules import ColorClassifier, GenEvalObject


class GenEvalGradedReward(GenEvalReward):
    """GenEval with partial credit per clause (class, count, colour, position); scores in [0, 1].

    The arguments are `GenEvalReward`'s (model, colour classifier, GenEval's thresholds). Per image
    the details hold GenEval's verdict and reason (`correct`, `reason`), the graded `score`, the
    credits and reason of each clause (`clauses`) and the kept detections.
    """

    name = "geneval_graded"
    description = (
        "GenEval with partial credit in [0, 1] (class, count, colour, position per clause; 1 = GenEval-correct): "
        "Mask2Former COCO instances + CLIP ViT-L-14 colours (needs tag/include/exclude metadata)"
    )

    def judge(self, detections: Mapping[str, Sequence[GenEvalObject]], metadata: Mapping[str, Any],
              classify_colors: ColorClassifier) -> tuple[float, dict[str, Any]]:
        """One image's graded score in [0, 1] (1.0 exactly when GenEval judges it correct) and its details."""
        graded = grade_image(detections, metadata, classify_colors, **self.rule_options)
        return graded.score, graded.details
