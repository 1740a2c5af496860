"""The toy world: colours, shapes, prompts, the renderer, and the train / held-out split.

A prompt names one or two objects, each a (colour, shape) pair, and optionally a spatial
relation between them: "a red circle", "a red circle and a blue square",
"a green triangle on the left of a yellow circle". Scenes are rendered without anti-aliasing, so
every object pixel has exactly its palette colour and the oracle can segment them exactly.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

IMAGE_SIZE = 64
BACKGROUND = (255, 255, 255)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
}
SHAPES = ("circle", "square", "triangle")
RELATIONS = ("on the left of", "on the right of", "above", "below")
# Held out of every training prompt (and of pretraining): one shape per colour for three colours,
# so each colour and each shape is still seen, just not in these combinations.
HELD_OUT_COMBINATIONS = frozenset({("red", "triangle"), ("green", "circle"), ("blue", "square")})
# The same construction inside the train prompts, for choosing settings without the held-out prompts:
# GORS on the "fit" prompts (without this combination), measured on the "val" prompts (the train
# prompts with it). In the train prompts every colour has two shapes but yellow, which has three;
# holding out one of yellow's keeps that structure in the fit prompts, where holding out one pair
# of another colour would leave that colour a single shape, which GORS then learns as a rule.
# One pair is a small sample of "an unseen pair" (the toy:val ranking of settings disagreed with the
# held-out one), so each of yellow's three shapes gives a fold: "fit" / "val" hold out the yellow
# circle, "fit_square" / "val_square" the yellow square, "fit_triangle" / "val_triangle" the yellow
# triangle. Judge a setting on all three: single folds differ by up to 0.35 (docs/toy_world_results.md).
VALIDATION_FOLDS: dict[str, tuple[str, str]] = {
    "": ("yellow", "circle"),
    "_square": ("yellow", "square"),
    "_triangle": ("yellow", "triangle"),
}
SPLITS = ("train", "held_out") + tuple(f"{part}{fold}" for fold in VALIDATION_FOLDS for part in ("fit", "val"))

_OBJECT = r"an? (\w+) (\w+)"
_PROMPT = re.compile(rf"^{_OBJECT}(?: (and|{'|'.join(RELATIONS)}) {_OBJECT})?$")


@dataclass(frozen=True)
class ToyObject:
    """One shape of one colour in a toy image (the names in `COLOURS` and `SHAPES`)."""

    colour: str
    shape: str

    def __post_init__(self) -> None:
        if self.colour not in COLOURS or self.shape not in SHAPES:
            raise ValueError(f"unknown object {self.colour!r} {self.shape!r}; colours {list(COLOURS)}, shapes {SHAPES}")

    @property
    def text(self) -> str:
        return f"a {self.colour} {self.shape}"


@dataclass(frozen=True)
class ToyPrompt:
    """One or two objects; `relation` places objects[0] relative to objects[1] (None: anywhere)."""

    objects: tuple[ToyObject, ...]
    relation: str | None = None

    @property
    def text(self) -> str:
        if len(self.objects) == 1:
            return self.objects[0].text
        joiner = self.relation or "and"
        return f"{self.objects[0].text} {joiner} {self.objects[1].text}"

    @classmethod
    def parse(cls, text: str) -> "ToyPrompt":
        """The prompt `text` describes ('a red circle and a blue square', or with a relation); case and
        surrounding spaces do not matter; ValueError for text outside the toy world's grammar."""
        match = _PROMPT.match(text.strip().lower())
        if not match:
            raise ValueError(
                f"{text!r} is not a toy-world prompt; expected e.g. 'a red circle and a blue square' or "
                f"'a red circle on the left of a blue square' (relations: {', '.join(RELATIONS)})"
            )
        colour_a, shape_a, joiner, colour_b, shape_b = match.groups()
        if joiner is None:
            return cls((ToyObject(colour_a, shape_a),))
        objects = (ToyObject(colour_a, shape_a), ToyObject(colour_b, shape_b))
        return cls(objects, None if joiner == "and" else joiner)


def check_toy_prompts(prompts: Sequence[str], judge: str) -> None:
    """ValueError naming the first of `prompts` outside the toy world's grammar (`ToyPrompt.parse`), for a
    `judge` (a reward) that reads only toy-world prompts: before any image is generated for them."""
    for index, prompt in enumerate(prompts):
        try:
            ToyPrompt.parse(prompt)
        except ValueError as err:
            raise ValueError(f"the {judge} reward judges toy-world prompts only; prompt {index}: {err}") from None


@dataclass(frozen=True)
class PlacedObject:
    """An object drawn at centre (cx, cy) with side / diameter `size`, in pixels."""

    colour: str
    shape: str
    cx: float
    cy: float
    size: float


def shape_mask(shape: str, cx: float, cy: float, size: float, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """Boolean (H, W) mask of a shape; pixel (x, y) is tested at its centre (x + 0.5, y + 0.5)."""
    y, x = np.mgrid[0:image_size, 0:image_size] + 0.5
    half = size / 2
    if shape == "circle":
        return (x - cx) ** 2 + (y - cy) ** 2 <= half**2
    if shape == "square":
        return (np.abs(x - cx) <= half) & (np.abs(y - cy) <= half)
    if shape == "triangle":  # apex up, base at the bottom
        top, bottom = cy - half, cy + half
        width_at_y = (y - top) / size * half  # half-width grows from 0 at the apex to half at the base
        return (y >= top) & (y <= bottom) & (np.abs(x - cx) <= width_at_y)
    raise ValueError(f"unknown shape {shape!r}")


def render(objects: list[PlacedObject], image_size: int = IMAGE_SIZE) -> Image.Image:
    """Draw the objects in order (later ones on top) on the white background."""
    canvas = np.empty((image_size, image_size, 3), dtype=np.uint8)
    canvas[:] = BACKGROUND
    for obj in objects:
        canvas[shape_mask(obj.shape, obj.cx, obj.cy, obj.size, image_size)] = COLOURS[obj.colour]
    return Image.fromarray(canvas)


def relation_holds(relation: str, a: tuple[float, float], b: tuple[float, float], margin: float = 0.0) -> bool:
    """Whether centre `a` is `relation` centre `b` (image y grows downwards)."""
    (ax, ay), (bx, by) = a, b
    return {
        "on the left of": bx - ax > margin,
        "on the right of": ax - bx > margin,
        "above": by - ay > margin,
        "below": ay - by > margin,
    }[relation]


def sample_scene(prompt: ToyPrompt, rng: np.random.Generator, image_size: int = IMAGE_SIZE) -> list[PlacedObject]:
    """A random layout of the prompt's objects: sizes 16-24 px, no overlap, the relation (if any) clear.

    Without a relation the two objects are still apart, in a random arrangement.
    """
    for _ in range(1000):
        placed = []
        for obj in prompt.objects:
            size = rng.uniform(16, 24)
            low, high = size / 2 + 2, image_size - size / 2 - 2
            placed.append(PlacedObject(obj.colour, obj.shape, rng.uniform(low, high), rng.uniform(low, high), size))
        if len(placed) == 1:
            return placed
        a, b = placed
        apart = max(abs(a.cx - b.cx), abs(a.cy - b.cy)) > (a.size + b.size) / 2 + 2
        if prompt.relation is None:
            if apart:
                return placed
            continue
        # A clear relation: far enough along its axis, and more than along the other axis.
        along = abs(a.cx - b.cx) if "left" in prompt.relation or "right" in prompt.relation else abs(a.cy - b.cy)
        across = abs(a.cy - b.cy) if along == abs(a.cx - b.cx) else abs(a.cx - b.cx)
        if apart and relation_holds(prompt.relation, (a.cx, a.cy), (b.cx, b.cy), margin=12) and along > across:
            return placed
    raise RuntimeError(f"could not place {prompt.text!r}")


def all_objects() -> list[ToyObject]:
    """Every colour-shape combination, colours first."""
    return [ToyObject(c, s) for c in COLOURS for s in SHAPES]


def two_object_prompts(objects: list[ToyObject]) -> list[ToyPrompt]:
    """Every 'X and Y' and 'X <relation> Y' prompt over objects that differ in colour and in shape."""
    prompts = []
    for a, b in itertools.permutations(objects, 2):
        if a.colour != b.colour and a.shape != b.shape:
            prompts.append(ToyPrompt((a, b)))
            prompts.extend(ToyPrompt((a, b), relation) for relation in RELATIONS)
    return prompts


def is_held_out(prompt: ToyPrompt) -> bool:
    """Whether `prompt` names a colour-shape combination kept out of training (`HELD_OUT_COMBINATIONS`)."""
    return any((o.colour, o.shape) in HELD_OUT_COMBINATIONS for o in prompt.objects)


def split_prompts() -> tuple[list[ToyPrompt], list[ToyPrompt]]:
    """(train, held_out): held-out prompts contain a colour-shape combination no train prompt has."""
    prompts = two_object_prompts(all_objects())
    train = [p for p in prompts if not is_held_out(p)]
    held_out = [p for p in prompts if is_held_out(p)]
    return train, held_out


def split_train_for_validation(fold: str = "") -> tuple[list[ToyPrompt], list[ToyPrompt]]:
    """(fit, val) of the train prompts: val prompts contain the fold's pair (`VALIDATION_FOLDS`), which
    no fit prompt has, as held-out prompts contain a pair no train prompt has."""
    if fold not in VALIDATION_FOLDS:
        raise ValueError(f"validation fold {fold!r}; choose one of {', '.join(map(repr, VALIDATION_FOLDS))}")
    train, _ = split_prompts()
    is_val = [any((o.colour, o.shape) == VALIDATION_FOLDS[fold] for o in p.objects) for p in train]
    return [p for p, v in zip(train, is_val) if not v], [p for p, v in zip(train, is_val) if v]


def prompts_of_split(split: str) -> list[ToyPrompt]:
    """The prompts of a toy split: "train" and "held_out" (`split_prompts`), or "fit" and "val" and
    their folds "fit_square", "val_square", "fit_triangle", "val_triangle"
    (`split_train_for_validation`, for choosing settings on the train prompts alone)."""
    if split not in SPLITS:
        raise ValueError(f"toy split {split!r}; choose one of {', '.join(SPLITS)}")
    if split in ("train", "held_out"):
        return split_prompts()[split == "held_out"]
    part, fold = split[:3], split[3:]
    return split_train_for_validation(fold)[part == "val"]
