"""How each benchmark's official code turns an image file made elsewhere (`--images`) into RGB.

Images gors generates are RGB PNGs without orientation tags, read alike by every rule below. A
file made elsewhere may carry transparency or an EXIF orientation, which the official scorers
treat differently:

- `plain_rgb`: PIL's ``convert("RGB")`` (T2I-CompBench's scripts): transparency dropped, so a
  transparent pixel shows its stored colour, orientation tags ignored;
- `upright_rgb`: the EXIF orientation applied first (GenEval's ``evaluate_images.py`` opens each image
  with ``ImageOps.exif_transpose``; GenEval 2 reads images with transformers' ``load_image``, which
  calls it too).
"""

from __future__ import annotations

from PIL import Image, ImageOps


def plain_rgb(image: Image.Image) -> Image.Image:
    """`image` as RGB, alpha dropped."""
    return image.convert("RGB")


def upright_rgb(image: Image.Image) -> Image.Image:
    """`image` turned as its EXIF orientation says, as RGB."""
    return ImageOps.exif_transpose(image).convert("RGB")

