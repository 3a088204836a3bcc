"""The decode kernel's fast JPEG decoder: libjpeg-turbo through simplejpeg, when it imports.

simplejpeg ships libjpeg-turbo 3 inside a wheel for every supported Python and platform, and
decodes straight into a NumPy array with the GIL released. Beside PIL's decoder (pillow-simd's
included) it saves what surrounds libjpeg: PIL's per-image Python (``load_prepare``, tile
handling, the decoder object); the ``RGBX`` array it decodes to is PIL's own layout for an
RGB picture, so PIL maps it or copies it whole. The decode is the same
libjpeg-turbo IDCT and upsampling as PIL's (accurate DCT, fancy upsampling), at the same DCT
scale that ``Image.draft`` picked, so the pixels match PIL's to within libjpeg-turbo's
versions. (Its ``fastdct`` and ``fastupsample`` flags are left off: on the benchmark's photos
they moved the 224 training crops 0.96 and 0.43 levels on average from a full decode, against
0.13 without them; the bound is 0.5.)

Damage: ``strict=True`` turns libjpeg's warnings into errors, among them the two that mean the
entropy-coded data ran out (a scan cut short, with or without an end-of-image marker after
it), which PIL drops; those raise :class:`DecodeError` here. Any other warning or error (junk
between segments, a bad Huffman code, a 12-bit or arithmetic-coded file) hands the picture to
PIL's path, which decides exactly as without simplejpeg. What no decoder warns of, a
progressive file missing its last scans, ``_jpeg.inspect`` refuses before either runs.

:func:`backend_info` says which imaging backend the kernel runs on: pillow-simd or Pillow,
libjpeg-turbo or not, and this decoder's simplejpeg.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import sys
from types import ModuleType
from typing import Any

import numpy as np
import PIL
from PIL import Image

from ._jpeg import _damaged

__all__ = ["available", "backend_info", "decode", "version"]


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


try:
    _simplejpeg: ModuleType | None = importlib.import_module("simplejpeg")
except ImportError:  # a speed-up only: PIL decodes every JPEG without it
    _simplejpeg = None

#: Whether to resize the decoded ``RGBX`` array in place (mapped) rather than a copy:
#: pillow-simd resizes four bands as fast as three, so mapping saves the copy (0.05 ms a
#: picture here); stock Pillow resizes the three bands of an "RGB" image 10-25% faster than
#: four, which pays for the copy (0.16 ms a picture).
_MAP_RGBX = _installed("pillow-simd") == PIL.__version__

#: libjpeg's warnings that the data ran out: JWRN_HIT_MARKER and JWRN_JPEG_EOF.
_RAN_OUT = ("premature end of data segment", "Premature end of JPEG file")
#: What each PIL mode of a JPEG is decoded to: four bytes a pixel for RGB, PIL's own layout.
_FORMATS = {"RGB": "RGBX", "L": "GRAY"}


def available() -> bool:
    """Whether simplejpeg imported (the fast path is in use)."""
    return _simplejpeg is not None


def version() -> str | None:
    """simplejpeg's version, or ``None`` when it is not installed."""
    return None if _simplejpeg is None else str(_simplejpeg.__version__)


def decode(
    data: bytes | memoryview, mode: str, size: tuple[int, int], label: str
) -> Image.Image | None:
    """Decode a JPEG at the DCT scale that gives ``size`` (``Image.draft``'s choice).

    Args:
        data: The whole file, already walked by ``_jpeg.inspect`` (not an MPO).
        mode: PIL's mode for it (``Image.open``'s, unchanged by ``draft``).
        size: ``(width, height)`` after ``draft``: the full size divided by 1, 2, 4 or 8,
            rounded up, as libjpeg scales.
        label: How errors name the image.

    Returns:
        The picture of ``size``: ``L``, or ``RGBX`` (mapped, pillow-simd) or ``RGB``;
        ``None`` when PIL's path must decode it (no simplejpeg, a mode it does not take,
        a warning that is not damage, a size that differs).

    Raises:
        DecodeError: The entropy-coded data ends early.

    Cancellation:
        Blocks for one decode (the GIL released); it cannot be interrupted.
    """
    if _simplejpeg is None or mode not in _FORMATS:
        return None
    target = _FORMATS[mode]
    width, height = size
    try:
        arr: np.ndarray = _simplejpeg.decode_jpeg(
            data, target, min_height=height, min_width=width, strict=True
        )
    except ValueError as exc:
        if any(text in str(exc) for text in _RAN_OUT):
            raise _damaged(label, f"the scan data ends early ({exc})") from exc
        return None
    if arr.shape[0] != height or arr.shape[1] != width:
        return None
    if mode == "RGB" and not _MAP_RGBX:
        return Image.frombytes("RGB", size, arr, "raw", "RGBX")
    return Image.frombuffer(mode, size, arr, "raw", "L" if mode == "L" else "RGBX", 0, 1)


def backend_info() -> dict[str, Any]:
    """Describe the imaging backend that :func:`~asyncflow.image.decode` uses.

    Returns:
        A JSON-able dict: ``pil_version``; ``pillow_simd`` and ``pillow`` (the installed
        version of each distribution, or ``None``); ``simd_expected`` (pillow-simd is what
        this platform should have: Linux x86_64); ``libjpeg_turbo`` (bool) and its
        ``libjpeg_turbo_version``; ``jpeg_version``, ``zlib_version``; ``problems`` (a list
        of sentences, empty when the set-up is as intended) and ``ok``; ``simplejpeg``: its
        version, when the decode kernel decodes JPEGs with it (``None``: PIL decodes them).
    """
    from PIL import features

    simd = _installed("pillow-simd")
    plain = _installed("pillow")
    expected = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
    turbo = bool(features.check_feature("libjpeg_turbo"))
    problems = []
    if simd and plain:
        problems.append(
            f"both pillow-simd {simd} and pillow {plain} are installed; they share the PIL "
            "package, so whichever was installed last is in use: uninstall both, then "
            "reinstall the one for this platform"
        )
    if expected and not simd:
        problems.append(
            "pillow-simd is not installed (expected on Linux x86_64): decoding is slower"
        )
    if not available():
        problems.append(
            "simplejpeg is not installed: JPEGs are decoded by PIL, about 0.1 ms slower each"
        )
    if not turbo:
        problems.append(
            "PIL is not built with libjpeg-turbo: JPEG decoding is several times slower"
        )
    return {
        "pil_version": PIL.__version__,
        "pillow_simd": simd,
        "pillow": plain,
        "simd_expected": expected,
        "libjpeg_turbo": turbo,
        "libjpeg_turbo_version": features.version_feature("libjpeg_turbo") if turbo else None,
        "jpeg_version": features.version_codec("jpg"),
        "zlib_version": features.version_codec("zlib"),
        "simplejpeg": version(),
        "problems": problems,
        "ok": not problems,
    }
