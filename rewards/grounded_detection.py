"""The GLIP-style unbiased spatial reward: grounded detection + the spatial position rule."""

from __future__ import annotations

from rewards.spatial import SpatialRuleReward


class GroundedDetectionReward(SpatialRuleReward):
    """Unbiased spatial reward of GORS: a grounded detector finds the two objects, the position
    rule checks their layout; scores in [0, 1].

    The T2I-CompBench paper's unbiased spatial reward uses GLIP. GLIP has no maintained
    implementation for PyTorch 2 (its maskrcnn-benchmark extension does not build), so this
    reward runs a grounded detector from `transformers` trained on GLIP's grounding data:
    MM-Grounding-DINO `openmmlab-community/mm_grounding_dino_base_o365v1_goldg_v3det` (Swin-B;
    Objects365 + GoldG, GLIP's Flickr30k/GQA grounding set, + V3Det). Grounding DINO
    (`IDEA-Research/grounding-dino-base`) and OWLv2 (`google/owlv2-base-patch16-ensemble`) are
    selectable by `model_name_or_path`. It shares no model with the evaluation metric
    (`spatial_rule`, OWLv2 by default in place of UniDet) unless one passes the same checkpoint.

    Score, per image (prompt parsing and position rule of `rewards.spatial_rule`):
    ``0.25 * s1 + 0.25 * s2 + 0.5 * position`` with s1, s2 the confidences of the most confident
    box of each object (0 when not found) and position the soft position score; there is no
    0.5 floor, so a half-right image still earns a graded reward (e.g. both objects found but on
    the wrong side: 0.25 * (s1 + s2)). Differences from the metric's defaults:

    - detection threshold 0.35 (Grounding DINO's usual box threshold; lower it for OWLv2, whose
      confidences are smaller, e.g. 0.1);
    - "on top of" scores like "on the top of" (`fix_on_top_of=True`; the metric's official
      position rule gives it 0);
    - an object named twice ("a dog near a dog") takes the two most confident boxes
      (`distinct_same_name=True`);
    - girl, boy, man and woman are asked for as such, not as UniDet's "person"
      (`person_mapping=False`);
    - each object is asked for by its noun phrase's head word (`noun_rule="head"`: "table" for
      "the white coffee table", where the metric's official rule looks for "coffee");
    - every noun is asked for (`label_space="open"`), where the metric asks only for the nouns a
      UniDet class is named (`rewards.unidet_labels`).

    A prompt without a relation word, or without two objects, scores 0 with a reason.
    All constructor arguments are those of `SpatialRuleReward`.
    """

    name = "grounded_detection"
    default_model = "openmmlab-community/mm_grounding_dino_base_o365v1_goldg_v3det"
    categories = ("spatial",)
    description = (
        "GLIP-style unbiased spatial reward: MM-Grounding-DINO (GoldG) boxes + the spatial "
        "position rule, graded (no 0.5 floor)"
    )
    default_threshold = 0.35
    default_floor = 0.0
    default_fix_on_top_of = True
    default_distinct_same_name = True
    # An open-vocabulary detector can tell a girl from a man: asking it for "person" (UniDet's class)
    # would reward a man where a girl was asked for.
    default_person_mapping = False
    # The metric's part-of-speech rule asks for "coffee" in "a coffee table": a detector that finds it would
    # reward the wrong object.
    default_noun_rule = "head"
    # A grounded detector finds any noun: UniDet's vocabulary limits only the metric's emulation of UniDet.
    default_label_space = "open"
    # 3: a label scores the mean over its tokens (GLIP's rule) and girl/boy/man/woman are asked for as such
    # (2: the maximum over its tokens, "person"; per-class NMS as the spatial rule's version 2)
    scoring_version = 3
