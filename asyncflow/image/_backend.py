"""Which imaging backend is in use: pillow-simd or Pillow, libjpeg-turbo or not, and simplejpeg
(the kernel's JPEG decoder where it is installed)."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import Any

__all__ = ["backend_info"]


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


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
    import PIL
    from PIL import features

    from . import _turbo

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
    if not _turbo.available():
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
        "simplejpeg": _turbo.version(),
        "problems": problems,
        "ok": not problems,
    }
