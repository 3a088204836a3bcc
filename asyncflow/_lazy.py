"""Lazy re-exports, so that ``import asyncflow`` stays light.

torch, aiohttp, aiobotocore and PIL load only when a name that needs them is first used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """Build a module ``__getattr__`` that imports ``table[name]`` (a module path) on demand.

    A value of ``"pkg.mod"`` exports the attribute ``name`` of that module; a value of
    ``"pkg.mod:"`` (trailing colon) exports the module itself.
    """

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if target.endswith(":"):
            value = importlib.import_module(target[:-1])
        else:
            value = getattr(importlib.import_module(target), name)
        # Kept in the package, so that later lookups (``asyncflow.read_bytes`` in a loop
        # of thousands of calls) are plain attribute reads, not imports.
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
