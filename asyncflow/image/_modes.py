"""Pixel modes: every PIL mode to one the resize handles, and the resized picture to RGB.

The decode kernel resizes in the picture's own mode when PIL can (RGB, RGBA, L, CMYK, YCbCr)
and converts to RGB only afterwards, on the small output: converting a CMYK or grayscale
picture at full size would cost more than the decode itself. Grayscale pictures stay one
channel through the resize and are spread to three channels on the final write.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
from PIL import Image

from .._errors import ConfigError

__all__ = ["Affine", "Layout", "affine", "before_resize", "write_rgb"]

Layout = Literal["hwc", "chw"]
#: Per-channel ``(scale, offset)`` float32 arrays: ``value * scale + offset`` normalizes.
Affine = tuple[np.ndarray, np.ndarray]

# Modes that PIL resizes directly (RGBA with premultiplied alpha, so no dark fringes).
_RESIZABLE = frozenset({"RGB", "RGBA", "L", "CMYK", "YCbCr", "RGBX"})
_ALPHA_TO_RGBA = frozenset({"LA", "La", "PA", "RGBa"})
#: Modes whose transparency is a colour (or palette entries) named in ``info["transparency"]``.
_KEYED = frozenset({"1", "L", "RGB", "P"})


@functools.lru_cache(maxsize=32)
def affine(mean: tuple[float, ...], std: tuple[float, ...]) -> Affine:
    """Normalize's ``(scale, offset)`` per channel, read-only float32: ``x * scale + offset``
    is ``(x / 255 - mean) / std``.

    Raises:
        ConfigError: ``mean`` or ``std`` is not 3 values, or a ``std`` is not positive.
    """
    if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
        raise ConfigError(f"mean and std need 3 values (std > 0), got {mean}, {std}")
    m, s = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    scale, offset = (1.0 / (255.0 * s)).astype(np.float32), (-m / s).astype(np.float32)
    scale.flags.writeable = offset.flags.writeable = False
    return scale, offset


def before_resize(im: Image.Image) -> Image.Image:
    """``im`` in a mode that PIL resizes well and that :func:`write_rgb` understands."""
    mode = im.mode
    if mode in _KEYED and "transparency" in im.info:  # a colour key (PNG's tRNS): an alpha
        return im.convert("RGBA")
    if mode in _RESIZABLE:
        return im
    if mode == "P":
        palette = im.palette
        has_alpha = palette is not None and palette.mode == "RGBA"
        return im.convert("RGBA" if has_alpha else "RGB")
    if mode in _ALPHA_TO_RGBA:
        return im.convert("RGBA")
    if mode == "1":
        return im.convert("L")
    if mode.startswith("I;16") or mode in ("I", "F"):
        return _high_depth_to_l(im)
    return im.convert("RGB")


def _high_depth_to_l(im: Image.Image) -> Image.Image:
    """16-bit and 32-bit grayscale to 8 bits, keeping the full range (PIL's convert clips)."""
    arr = np.asarray(im)
    if im.mode.startswith("I;16") or (im.mode == "I" and im.format == "PNG"):
        # 16-bit samples: keep the high byte, as PIL does for 16-bit RGB.
        eight = (arr.astype(np.uint32, copy=False) >> 8).astype(np.uint8)
    else:
        eight = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(eight), mode="L")


def write_rgb(
    im: Image.Image,
    out: np.ndarray,
    *,
    layout: Layout,
    flip: bool,
    background: tuple[int, int, int] | None,
    affine: Affine | None = None,
) -> None:
    """Write the resized picture into ``out`` as RGB, mirrored if ``flip``.

    ``out`` is ``H x W x 3`` (``layout="hwc"``) or ``3 x H x W`` (``"chw"``): uint8, or
    float32 normalized by ``affine``. This is the one copy out of PIL; normalizing happens on
    the read of that copy, while it is still in cache.
    """
    mode = im.mode
    if mode == "RGBA":
        _write_array(_composite(im, background), out, layout, flip, affine)
        return
    if mode not in ("RGB", "L", "RGBX"):
        im = im.convert("RGB")
        mode = "RGB"
    h, w = im.size[1], im.size[0]
    if mode == "L":  # one channel, spread to three by the write
        pixels = np.frombuffer(im.tobytes(), np.uint8).reshape(h, w, 1)
    else:
        # PIL stores RGB as four bytes a pixel: one copy of its storage (a memcpy per row),
        # then strided views, is cheaper than packing three bytes or one band at a time.
        pixels = np.frombuffer(im.tobytes("raw", "RGBX"), np.uint8).reshape(h, w, 4)[:, :, :3]
    _write_array(pixels, out, layout, flip, affine)


def _composite(im: Image.Image, background: tuple[int, int, int] | None) -> np.ndarray:
    rgba: np.ndarray = np.asarray(im)
    if background is None:
        return rgba[:, :, :3]
    alpha = rgba[:, :, 3:4].astype(np.float32) * (1.0 / 255.0)
    bg = np.asarray(background, np.float32)
    mixed: np.ndarray = rgba[:, :, :3] * alpha + bg * (1.0 - alpha)
    result: np.ndarray = np.rint(mixed).astype(np.uint8)
    return result


def _write_array(
    arr: np.ndarray, out: np.ndarray, layout: Layout, flip: bool, affine: Affine | None
) -> None:
    """Write an ``H x W x C`` array (C is 1 or 3) into ``out``."""
    arr = arr[:, ::-1] if flip else arr
    if layout == "chw":
        arr = arr.transpose(2, 0, 1)
        shape = (3, 1, 1)
    else:
        shape = (1, 1, 3)
    if affine is None:
        out[...] = arr
        return
    np.multiply(arr, affine[0].reshape(shape), out=out, dtype=np.float32)
    out += affine[1].reshape(shape)
