"""Lazy re-exports: resolved on first use, then plain attributes of the package."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from asyncflow._lazy import lazy_getattr


@pytest.fixture
def package() -> Iterator[types.ModuleType]:
    module = types.ModuleType("lazy_demo")
    module.__getattr__ = lazy_getattr(  # type: ignore[method-assign]
        "lazy_demo", {"dumps": "json", "decoder": "json.decoder:"}
    )
    sys.modules["lazy_demo"] = module
    yield module
    del sys.modules["lazy_demo"]


def test_a_name_resolves_once_and_then_is_a_plain_attribute(package: types.ModuleType) -> None:
    import json
    import json.decoder

    assert "dumps" not in vars(package)
    assert package.dumps is json.dumps
    assert vars(package)["dumps"] is json.dumps  # later reads skip __getattr__
    assert package.decoder is json.decoder
    assert vars(package)["decoder"] is json.decoder


def test_an_unknown_name_is_an_attribute_error(package: types.ModuleType) -> None:
    with pytest.raises(AttributeError, match="'lazy_demo' has no attribute 'nope'"):
        _ = package.nope
    assert "nope" not in vars(package)


def test_the_real_package_caches_read_bytes() -> None:
    import asyncflow

    first = asyncflow.read_bytes
    assert vars(asyncflow)["read_bytes"] is first
