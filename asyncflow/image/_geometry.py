"""Where to crop: centre crops, random-resized crops and EXIF orientation (per-item seeds are
``asyncflow.pipeline.seeding``'s).

Everything here is plain arithmetic on sizes and boxes (no pixels), so the decode kernel can
settle the whole geometry, and with it the JPEG draft scale, before a byte is decoded. Boxes
are ``(left, top, right, bottom)`` floats in source pixels, as ``PIL.Image.resize(box=...)``
takes them: cropping happens inside the one resize call.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple

from PIL import Image

from .._errors import check_int

__all__ = [
    "Box",
    "Crop",
    "centre_box",
    "draft_request",
    "orientation_op",
    "random_resized_box",
    "target_size",
]

Box = tuple[float, float, float, float]

# EXIF Orientation tag (0x0112) -> the transpose that shows the picture upright
# (the same table as PIL.ImageOps.exif_transpose).
_ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_AXES = {5, 6, 7, 8}


class Crop(NamedTuple):
    """A crop of the upright picture: the source box and whether to mirror the result."""

    box: Box
    flip: bool


def target_size(size: int | tuple[int, int]) -> tuple[int, int]:
    """``size`` as ``(height, width)``: an int means a square.

    Raises:
        ConfigError: ``size`` is not an int >= 1 or a pair of them (``True`` is not one).
    """
    if isinstance(size, tuple | list) and len(size) == 2:
        return check_int("size's height", size[0]), check_int("size's width", size[1])
    return check_int("size (or a (height, width) pair)", size), size


def orientation_op(orientation: int) -> tuple[Image.Transpose | None, bool]:
    """The transpose for an EXIF orientation value, and whether it swaps width and height."""
    return _ORIENTATION.get(orientation), orientation in _SWAPS_AXES


def centre_box(width: int, height: int, out_h: int, out_w: int, resize: int | None) -> Box:
    """Resize so the shorter side is ``resize`` (at least covering the output), crop the centre.

    ``resize=None`` means "shorter side to the output's side" for a square output, and "just
    enough to cover ``out_h x out_w``" otherwise. Where the shorter side is an integer, the
    box reproduces torchvision's ``Resize(resize)`` then ``CenterCrop``, roundings included
    (the long side truncated, the crop offset rounded), so that a picture decoded at full size
    gives the same pixels as that pipeline.
    """
    side = resize if resize is not None else (out_h if out_h == out_w else None)
    if side is not None:
        short, long = min(width, height), max(width, height)
        new_long = int(side * long / short)
        rw, rh = (side, new_long) if width <= height else (new_long, side)
        if rw >= out_w and rh >= out_h:
            ileft, itop = round((rw - out_w) / 2.0), round((rh - out_h) / 2.0)
            sx, sy = width / rw, height / rh
            return (ileft * sx, itop * sy, (ileft + out_w) * sx, (itop + out_h) * sy)
    scale = max(out_w / width, out_h / height)
    if resize is not None:
        scale = max(scale, resize / min(width, height))
    crop_w, crop_h = out_w / scale, out_h / scale
    left, top = (width - crop_w) / 2, (height - crop_h) / 2
    return (max(0.0, left), max(0.0, top), min(width, left + crop_w), min(height, top + crop_h))


def random_resized_box(
    rng: random.Random,
    width: int,
    height: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> Box:
    """torchvision's ``RandomResizedCrop.get_params``, drawing from ``rng``."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return (left, top, left + w, top + h)
    # Fallback: the largest centred crop whose aspect lies within ``ratio``.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return (left, top, left + w, top + h)


def draft_request(
    raw_size: tuple[int, int], box: Sequence[float], dims: tuple[int, int], *, swaps: bool
) -> tuple[int, int] | None:
    """The size to pass to ``Image.draft`` so JPEG DCT scaling never drops below the output.

    ``box`` is the upright crop and ``dims`` the output's ``(height, width)``; ``swaps``:
    the picture is stored sideways (its EXIF orientation turns it a quarter).

    Returns ``None`` when the crop is less than 2x larger than the output (no scaling
    possible). ``draft`` picks the largest of 1/2, 1/4, 1/8 for which the decoded picture
    still has at least the requested size; requesting ``raw / factor`` makes that the largest
    power of two not above ``factor``, the crop's own reduction factor.
    """
    out_h, out_w = dims
    if swaps:  # the box is upright; the JPEG is stored sideways
        out_h, out_w = out_w, out_h
        box = (box[1], box[0], box[3], box[2])
    factor = min((box[2] - box[0]) / out_w, (box[3] - box[1]) / out_h)
    if factor < 2.0:
        return None
    return (math.ceil(raw_size[0] / factor), math.ceil(raw_size[1] / factor))
