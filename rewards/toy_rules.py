"""The toy world's exact scorer: colour segmentation, simple shape geometry, and a verdict per prompt.

Pure functions of numpy arrays. `segment` finds the coloured blobs of an image, `classify_shape`
names a blob's shape from its geometry, and `judge` checks a prompt against the blobs: each
object present, the relation (if any) between their centres, and nothing else drawn. On rendered
scenes every pixel has its exact palette colour, so the verdict is exact; the tolerances below
also keep it right on the blurry, slightly off-colour images a small diffusion model draws.
Positions and sizes are in pixels, x to the right and y downwards, (0, 0) the top-left corner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from gors.core.toy import world

# The nearest palette colour decides between colours; this RGB (Euclidean) distance decides
# whether a pixel is a palette colour at all. Every colour lies >= 240 from white, so 100 keeps
# out blur fringes that are mostly white, yet takes in generated pixels off by tens per channel.
COLOUR_TOLERANCE = 100.0
# Components smaller than this fraction of the image are noise: 30 px at 64 x 64, while the
# smallest object drawn (a 16 px triangle) covers about 128 px, and a blurred one over 90.
MIN_AREA_FRACTION = 30 / 64**2
# Every shape of the world has a square bounding box; a blob longer than this is none of them.
MAX_ASPECT = 2.0
# Fill = area / bounding-box area: square 1.0, circle pi/4 ~ 0.785, triangle 0.5. Fill alone
# splits squares from circles badly: one stray pixel beside a 16 px square adds a row to its box
# (fill 0.88), and small digitised circles reach 0.84. Their corners differ far more: the four
# corner cells of side CORNER_SIZE x the box side are full for a square (>= 0.72 blurred and
# noisy) and nearly empty for a circle (<= 0.28 at every size drawn), so the cut is halfway.
CORNER_SIZE = 0.2
SQUARE_MIN_CORNER_FILL = 0.5
# An untapered blob sparser than this is no circle: a circle fills 0.785 of its box (>= 0.68
# blurred), while e.g. a diamond fills 0.5.
CIRCLE_MIN_FILL = 0.6
# Below this nothing of the world fits (the triangle, the sparsest shape, fills half its box).
MIN_FILL = 0.35
# Taper = mean row width of the narrower third of the box rows (top or bottom) over the wider
# third: about 0.2 for a triangle (rendered apex up; a generated one upside down counts too) and
# >= 0.75 for squares and circles, blurred or not. Blur cuts the apex, raising a triangle's taper
# to <= 0.37 (GaussianBlur(1)) or <= 0.48 (GaussianBlur(1.5)); 0.6 leaves room on both sides.
TRIANGLE_MAX_TAPER = 0.6

# Kinds of binding error, in the order they are reported, with what each means; an image can have
# several, each once. A missing object is explained by the largest unmatched blob of its colour.
# An exchange ("a red circle and a blue square" drawn as a red square and a blue circle) is the
# attribute-binding error itself; a colour drawn in another shape otherwise is a wrong shape.
BINDING_ERRORS = {
    "exchanged": "the two colours each drawn in the other's shape",
    "wrong_shape": "an object's colour in another shape (not an exchange)",
    "shapeless": "an object's colour drawn only as a shapeless blob",
    "missing": "nothing of an object's colour",
    "extra": "a blob no prompt object explains",
}


@dataclass(frozen=True)
class Blob:
    """One connected region of a palette colour.

    Attributes:
        colour: palette colour name (a key of `world.COLOURS`).
        area: pixels in the region.
        bbox: (x0, y0, x1, y1) in pixels, x1 and y1 exclusive.
        centroid: (cx, cy), mean of the pixel centres, in the renderer's coordinates.
        fill: area / bounding-box area, in (0, 1].
        shape: a name from `world.SHAPES`, or None when the geometry fits none.
    """

    colour: str
    area: int
    bbox: tuple[int, int, int, int]
    centroid: tuple[float, float]
    fill: float
    shape: str | None

    @property
    def name(self) -> str:
        """'red circle', or 'red blob' when the shape is unknown."""
        return f"{self.colour} {self.shape or 'blob'}"

    def describe(self) -> str:
        """E.g. 'red circle at (20, 31)' (rounded centroid)."""
        return f"{self.name} at ({round(self.centroid[0])}, {round(self.centroid[1])})"


@dataclass
class Judgement:
    """The verdict on one image: which checks passed, and why the others failed.

    Attributes:
        correct: every check passed.
        score: fraction of checks passed, in [0, 1].
        checks: (check, passed) pairs: one per prompt object, one for the relation if the prompt
            has one, and "no extra objects".
        reasons: one human-readable reason per failed check.
        found: `Blob.describe()` of the blobs matched to prompt objects.
        relation_holds: whether the relation holds between the matched objects; None when the
            prompt has no relation or an object is missing.
        relation_check: the name of the relation's check in `checks` (None without a relation).
        errors: the kinds of binding error found (`BINDING_ERRORS`, in that order); empty when bound.
    """

    correct: bool
    score: float
    checks: list[tuple[str, bool]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    relation_holds: bool | None = None
    relation_check: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def binding_checks(self) -> list[tuple[str, bool]]:
        """The checks of attribute binding: each object present with its colour and shape, and
        nothing else drawn; the relation check left out."""
        return [(check, passed) for check, passed in self.checks if check != self.relation_check]

    @property
    def bound(self) -> bool:
        """Every object drawn with its own colour and shape and nothing else drawn, wherever they are."""
        return all(passed for _, passed in self.binding_checks)

    @property
    def binding_score(self) -> float:
        """Fraction of `binding_checks` passed, in [0, 1]."""
        checks = self.binding_checks
        return sum(passed for _, passed in checks) / len(checks)


def _label_components(mask: np.ndarray) -> np.ndarray:
    """8-connected component labels of a boolean mask (0 outside it), by max-label propagation."""
    height, width = mask.shape
    labels = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:
        padded = np.pad(labels, 1)
        neighbours = [padded[dy : dy + height, dx : dx + width] for dy in range(3) for dx in range(3)]
        spread = np.where(mask, np.maximum.reduce(neighbours), 0)
        if np.array_equal(spread, labels):
            return labels
        labels = spread


def classify_shape(mask: np.ndarray) -> str | None:
    """'circle', 'square' or 'triangle' for a boolean mask holding one blob, or None if none fits."""
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return None
    crop = mask[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    height, width = crop.shape
    if max(height, width) > MAX_ASPECT * min(height, width):
        return None
    fill = len(ys) / crop.size
    if fill < MIN_FILL:
        return None
    widths = crop.sum(axis=1)
    third = max(1, height // 3)
    top, bottom = widths[:third].mean(), widths[-third:].mean()
    if min(top, bottom) < TRIANGLE_MAX_TAPER * max(top, bottom):
        return "triangle"
    side = max(1, round(CORNER_SIZE * min(height, width)))
    corners = np.mean([crop[rows, cols].mean() for rows in (slice(side), slice(-side, None))
                       for cols in (slice(side), slice(-side, None))])
    if corners >= SQUARE_MIN_CORNER_FILL:
        return "square"
    return "circle" if fill >= CIRCLE_MIN_FILL else None


def colour_masks(image: np.ndarray) -> dict[str, np.ndarray]:
    """Per palette colour, the boolean (H, W) mask of the pixels that colour owns (see `segment`)."""
    pixels = image[..., :3].astype(np.float32)
    palette = np.array(list(world.COLOURS.values()), dtype=np.float32)
    distances = np.linalg.norm(pixels[:, :, None, :] - palette, axis=-1)  # (H, W, colours)
    nearest = distances.argmin(axis=-1)
    best = distances.min(axis=-1)
    to_background = np.linalg.norm(pixels - np.array(world.BACKGROUND, dtype=np.float32), axis=-1)
    owned = (best < COLOUR_TOLERANCE) & (best < to_background)
    return {name: owned & (nearest == index) for index, name in enumerate(world.COLOURS)}


def segment(image: np.ndarray) -> list[Blob]:
    """The blobs of a uint8 (H, W, 3) image, largest first.

    A pixel belongs to colour c if c is its nearest palette colour, within `COLOUR_TOLERANCE`,
    and nearer than the background. Each colour's 8-connected components under
    `MIN_AREA_FRACTION` of the image are dropped as noise.
    """
    min_area = MIN_AREA_FRACTION * image.shape[0] * image.shape[1]
    blobs = []
    for colour, mask in colour_masks(image).items():
        labels = _label_components(mask)
        for label in np.unique(labels[labels > 0]):
            region = labels == label
            ys, xs = np.nonzero(region)
            if len(ys) < min_area:
                continue
            x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
            blobs.append(
                Blob(
                    colour=colour,
                    area=len(ys),
                    bbox=(x0, y0, x1, y1),
                    centroid=(float(xs.mean()) + 0.5, float(ys.mean()) + 0.5),  # pixel centres
                    fill=len(ys) / ((x1 - x0) * (y1 - y0)),
                    shape=classify_shape(region),
                )
            )
    return sorted(blobs, key=lambda blob: -blob.area)


def _missing_reason(obj: world.ToyObject, others: list[Blob], colour_matched: bool) -> str:
    """Why `obj` was not found, given the unmatched blobs of its colour (`colour_matched`: another
    object of that colour was already matched)."""
    prefix = f"no {obj.colour} {obj.shape}"
    if not others:
        return f"{prefix}: nothing {'else ' if colour_matched else ''}{obj.colour}"
    shapes = [blob.shape or "shapeless blob" for blob in others]
    if len(shapes) == 1:
        return f"{prefix}: the {obj.colour} object is a {shapes[0]}"
    return f"{prefix}: the {obj.colour} objects are {', '.join('a ' + shape for shape in shapes)}"


def judge(prompt: world.ToyPrompt, blobs: list[Blob]) -> Judgement:
    """Check a prompt against the blobs of an image; see `Judgement` for the checks and the score."""
    unused = sorted(blobs, key=lambda blob: -blob.area)  # greedy: the largest candidate wins
    checks: list[tuple[str, bool]] = []
    reasons: list[str] = []
    holds: bool | None = None
    relation_check: str | None = None
    matched: list[Blob | None] = []
    matched_colours: set[str] = set()
    for obj in prompt.objects:
        blob = next((b for b in unused if (b.colour, b.shape) == (obj.colour, obj.shape)), None)
        matched.append(blob)
        checks.append((f"{obj.text} is present", blob is not None))
        if blob is None:
            others = [b for b in unused if b.colour == obj.colour]
            reasons.append(_missing_reason(obj, others, obj.colour in matched_colours))
        else:
            unused.remove(blob)
            matched_colours.add(blob.colour)
    if prompt.relation is not None:
        first, second = (f"{o.colour} {o.shape}" for o in prompt.objects)
        check = relation_check = f"{first} {prompt.relation} {second}"
        if None in matched:
            absent = [o for o, blob in zip(prompt.objects, matched) if blob is None]
            missing = " and ".join(f"{o.colour} {o.shape}" for o in absent)
            checks.append((check, False))
            reasons.append(f"could not check that {check}: no {missing}")
        else:
            holds = world.relation_holds(prompt.relation, matched[0].centroid, matched[1].centroid, margin=0)
            checks.append((check, holds))
            if not holds:
                reasons.append(f"{first} is not {prompt.relation} {second}")
    checks.append(("no extra objects", not unused))
    if unused:
        reasons.append("unexpected " + ", ".join(blob.describe() for blob in unused))
    passed = sum(ok for _, ok in checks)
    return Judgement(
        correct=passed == len(checks),
        score=passed / len(checks),
        checks=checks,
        reasons=reasons,
        found=[blob.describe() for blob in matched if blob is not None],
        relation_holds=holds,
        relation_check=relation_check,
        errors=binding_errors(prompt, matched, unused),
    )


def binding_errors(prompt: world.ToyPrompt, matched: list[Blob | None], unused: list[Blob]) -> list[str]:
    """The kinds of binding error (`BINDING_ERRORS`) of an image, given the blob matched to each prompt
    object (None when absent) and the blobs left unmatched, largest first."""
    unexplained = list(unused)
    stand_ins: list[tuple[world.ToyObject, Blob | None]] = []
    for obj, blob in zip(prompt.objects, matched):
        if blob is None:
            # The largest blob of its colour stands for it; any others of that colour are extras.
            stand_in = next((b for b in unexplained if b.colour == obj.colour), None)
            if stand_in is not None:
                unexplained.remove(stand_in)
            stand_ins.append((obj, stand_in))
    errors = {"missing" if blob is None else "wrong_shape" if blob.shape else "shapeless" for _, blob in stand_ins}
    if len(stand_ins) == 2 and all(blob is not None for _, blob in stand_ins):
        (a, drawn_a), (b, drawn_b) = stand_ins
        if a.colour != b.colour and a.shape != b.shape and (drawn_a.shape, drawn_b.shape) == (b.shape, a.shape):
            errors = {"exchanged"}
    if unexplained:
        errors.add("extra")
    return [kind for kind in BINDING_ERRORS if kind in errors]


def to_rgb_array(image: Image.Image | np.ndarray) -> np.ndarray:
    """A uint8 (H, W, 3) array from a PIL image of any mode, or from an array: grey or RGB(A),
    uint8 or floats (in [0, 1], or in [0, 255] if any value is above 1)."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if np.issubdtype(array.dtype, np.floating) and array.size and array.max() <= 1.0:
        array = array * 255.0
    array = np.clip(np.rint(array), 0, 255).astype(np.uint8) if array.dtype != np.uint8 else array
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    return array[..., :3]


def judge_image(prompt: world.ToyPrompt | str, image: Image.Image | np.ndarray) -> Judgement:
    """`judge` on the blobs of an image; a string prompt is parsed with `ToyPrompt.parse`."""
    if isinstance(prompt, str):
        prompt = world.ToyPrompt.parse(prompt)
    return judge(prompt, segment(to_rgb_array(image)))
