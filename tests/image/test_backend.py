"""image.backend_info, and that the set-up leaves pillow-simd (with libjpeg-turbo) in place."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys

import pytest

from asyncflow import image

LINUX_X86_64 = sys.platform == "linux" and platform.machine() == "x86_64"


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_backend_info_is_json_and_consistent() -> None:
    info = image.backend_info()
    json.dumps(info)
    assert info["ok"] == (not info["problems"])
    assert info["simd_expected"] == LINUX_X86_64
    assert isinstance(info["libjpeg_turbo"], bool)


@pytest.mark.skipif(not LINUX_X86_64, reason="pillow-simd is installed on Linux x86_64 only")
def test_pillow_simd_is_installed_and_pillow_is_not() -> None:
    assert _installed("pillow-simd"), "pillow-simd is missing: pip install pillow-simd"
    assert not _installed("pillow"), (
        "pillow is installed next to pillow-simd and may have overwritten PIL: "
        "pip uninstall -y pillow pillow-simd && pip install pillow-simd"
    )
    info = image.backend_info()
    assert info["pillow_simd"] and info["pillow"] is None


def test_libjpeg_turbo_is_active() -> None:
    info = image.backend_info()
    assert info["libjpeg_turbo"], "PIL was built without libjpeg-turbo"
    assert info["libjpeg_turbo_version"]


@pytest.mark.skipif(not LINUX_X86_64, reason="pillow-simd is installed on Linux x86_64 only")
def test_the_environment_is_as_intended() -> None:
    assert image.backend_info()["problems"] == []


def test_public_names() -> None:
    # sorted as ruff's RUF022 sorts: CONSTANTS, then Classes, then functions
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert image.__all__ == sorted(image.__all__, key=kind)
    for name in image.__all__:
        assert getattr(image, name) is not None
    assert not any(name.startswith("_") for name in image.__all__)
