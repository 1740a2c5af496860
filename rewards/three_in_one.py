"""T2I-CompBench's 3-in-1 metric for complex prompts: B-VQA, the spatial rule and CLIPScore mixed.

The official `3_in_1_eval/3_in_1.py` averages, per image, the attribute score (B-VQA), the
spatial score (the 2D spatial rule in its complex-prompt mode) and the action score (CLIPScore
of the prompt without adjectives): all three for prompts with both relations, attribute and
spatial for the prompts in `complex_val_spatial.txt`, attribute and action for those in
`complex_val_action.txt`. The official script only knows the val lists; here the train lists
(`complex_train_spatial.txt`, `complex_train_action.txt`) classify training prompts the same way.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any, Literal

import torch
from PIL import Image

from rewards.base import Reward, RewardOutput, check_choice
from rewards.combined import check_member_options, member_models
from rewards.registry import get_reward_class

Kind = Literal["all", "spatial", "action"]
TERMS: dict[str, tuple[str, ...]] = {
    "all": ("attribute", "spatial", "action"),
    "spatial": ("attribute", "spatial"),
    "action": ("attribute", "action"),
}
MEMBERS = {"attribute": "b_vqa", "spatial": "spatial_rule", "action": "clip_score"}
# The official 3-in-1 configuration of each member: complex-prompt object parsing for the spatial
# rule, adjectives removed for CLIPScore.
MEMBER_DEFAULTS: dict[str, dict[str, Any]] = {"spatial_rule": {"complex": True}, "clip_score": {"remove_adjectives": True}}
SUBSPLIT_FILES = {
    "spatial": ("complex_val_spatial.txt", "complex_train_spatial.txt"),
    "action": ("complex_val_action.txt", "complex_train_action.txt"),
}


def three_in_one_score(attribute: float, spatial: float, action: float, kind: Kind = "all") -> float:
    """The mean of the terms `kind` uses (see `TERMS`); each score in [0, 1], so is the result."""
    if kind not in TERMS:
        raise ValueError(f"kind={kind!r}; choose one of {sorted(TERMS)}")
    values = {"attribute": attribute, "spatial": spatial, "action": action}
    terms = TERMS[kind]
    return sum(values[term] for term in terms) / len(terms)


def normalise_prompt(prompt: str) -> str:
    """The official key of a prompt: the text before its first '.', lower-cased."""
    return prompt.strip().split(".")[0].lower()


def prompt_kind(prompt: str, spatial_keys: Collection[str], action_keys: Collection[str]) -> Kind:
    """'spatial' or 'action' when the prompt is in that sub-split (spatial checked first, as the
    official script does), else 'all'. The sub-splits hold keys as `normalise_prompt` makes them."""
    key = normalise_prompt(prompt)
    if key in spatial_keys:
        return "spatial"
    if key in action_keys:
        return "action"
    return "all"


def _official_subsplits() -> dict[str, set[str]]:
    from gors.core.prompts import fetch_t2i_compbench_file, read_prompt_file

    return {
        kind: {normalise_prompt(p) for name in files for p in read_prompt_file(fetch_t2i_compbench_file(name))}
        for kind, files in SUBSPLIT_FILES.items()
    }


class ThreeInOneReward(Reward):
    """T2I-CompBench's 3-in-1 score of complex prompts, in [0, 1].

    Args:
        device, torch_dtype, batch_size: passed to the three member rewards.
        b_vqa, spatial_rule, clip_score: keyword arguments of each member (e.g. its
            `model_name_or_path`), on top of the official 3-in-1 settings in `MEMBER_DEFAULTS`.
        subsplits: "official" reads T2I-CompBench's complex spatial/action prompt lists (downloaded
            and checksummed, or from GORS_DATA_DIR) to pick each prompt's terms; "none" always
            averages all three. A metadata entry ``{"three_in_one": "spatial"|"action"|"all"}``
            overrides both for its image.
        questions: a question table for the B-VQA term (see `rewards.question_table`); the same as
            ``b_vqa={"questions": ...}``.

    Details per image: the kind, the terms used, each member's score and details.
    """

    name = "three_in_one"
    # 6: the spatial term asks only for the nouns a UniDet class is named (`rewards.unidet_labels`);
    # 5: its B-VQA member's version 2 (BLIP's own resize, LayerNorm eps and P(yes) quotient);
    # 4: the spatial term's object names by the official part-of-speech rule ("the wooden picture frame": "picture");
    # 3: a Grounding DINO detector's labels score the mean over their tokens, each phrase its own probability
    # (the default OWLv2 scores as in 2); 2: UniDet's 0.1 threshold and per-class NMS; 1: 0.5, no NMS
    scoring_version = 6
    # The official 3-in-1 mixes B-VQA scores made in float32, UniDet's under float16 autocast and CLIPScore's
    # in float16; its members share one dtype here, float32, a little more exact.
    official_dtype = torch.float32
    categories = ("complex",)
    description = "T2I-CompBench complex metric: mean of B-VQA, the spatial rule and adjective-free CLIPScore"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse, before any of the three models loads, a `model_name_or_path` (each member has its own),
        an unknown `subsplits`, two question tables, and a member's option it does not take or a value
        it would refuse (each member's own `check_options`)."""
        if options.get("model_name_or_path") is not None:
            raise ValueError("three_in_one combines three models; give each one's model in its options "
                             "(b_vqa, spatial_rule, clip_score: {'model_name_or_path': ...}), not model_name_or_path")
        check_choice("subsplits", options.get("subsplits", "official"), ("official", "none"))
        # Each member's options first: they are then mappings, whose question table can be read.
        for name in MEMBERS.values():
            check_member_options(name, options.get(name) or {}, MEMBER_DEFAULTS.get(name))
        questions, given = options.get("questions"), (options.get("b_vqa") or {}).get("questions")
        if questions is not None and given is not None and os.fspath(given) != os.fspath(questions):
            raise ValueError(f"two question tables: questions={questions!r} and b_vqa questions={given!r}; give one")

    @classmethod
    def download_files(cls, options: Mapping[str, Any]) -> None:
        """The official complex spatial and action prompt lists, which pick each prompt's terms."""
        if options.get("subsplits", "official") == "official":
            _official_subsplits()

    @classmethod
    def models(cls, options: Mapping[str, Any]) -> dict[str, str]:
        """The three members' models, keyed `<member>.<option>` (e.g. `b_vqa.model_name_or_path`)."""
        return member_models({name: {**MEMBER_DEFAULTS.get(name, {}), **(options.get(name) or {})}
                              for name in MEMBERS.values()})

    def __init__(
        self,
        model_name_or_path: str | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        b_vqa: Mapping[str, Any] | None = None,
        spatial_rule: Mapping[str, Any] | None = None,
        clip_score: Mapping[str, Any] | None = None,
        subsplits: Literal["official", "none"] = "official",
        questions: str | os.PathLike[str] | None = None,
    ) -> None:
        self.check_options({"model_name_or_path": model_name_or_path, "subsplits": subsplits, "questions": questions,
                            "b_vqa": b_vqa, "spatial_rule": spatial_rule, "clip_score": clip_score})
        if questions is not None:
            b_vqa = {**(b_vqa or {}), "questions": questions}
        super().__init__(None, device, torch_dtype, batch_size)
        self.subsplits = _official_subsplits() if subsplits == "official" else {"spatial": set(), "action": set()}
        options = {"b_vqa": b_vqa, "spatial_rule": spatial_rule, "clip_score": clip_score}
        self.members: dict[str, Reward] = {}
        for term, name in MEMBERS.items():
            kwargs = {**MEMBER_DEFAULTS.get(name, {}), **(options[name] or {})}
            self.members[term] = get_reward_class(name)(
                device=self.device, torch_dtype=self.torch_dtype, batch_size=batch_size, **kwargs
            )

    def kind_of(self, prompt: str, metadata: Mapping[str, Any] | None) -> Kind:
        """Which term scores `prompt`: its metadata's `three_in_one` when given, else the official
        split of the complex prompts (spatial, action or all)."""
        if metadata and metadata.get("three_in_one") is not None:
            kind = metadata["three_in_one"]
            if kind not in TERMS:
                raise ValueError(f"metadata three_in_one={kind!r}; choose one of {sorted(TERMS)}")
            return kind
        return prompt_kind(prompt, self.subsplits["spatial"], self.subsplits["action"])

    def _score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        kinds = [self.kind_of(p, metadata[i] if metadata else None) for i, p in enumerate(prompts)]
        outputs = {term: member.score(images, prompts, metadata) for term, member in self.members.items()}
        scores, details = [], []
        for i, kind in enumerate(kinds):
            terms = {term: outputs[term].scores[i] for term in MEMBERS}
            score = three_in_one_score(terms["attribute"], terms["spatial"], terms["action"], kind)
            scores.append(score)
            details.append(
                {
                    "score": score,
                    "kind": kind,
                    "terms": list(TERMS[kind]),
                    **{term: {"score": terms[term], "details": outputs[term].details[i]} for term in MEMBERS},
                }
            )
        return RewardOutput(scores=scores, details=details)
