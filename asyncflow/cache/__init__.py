"""Decode once, replay at memory speed: a memory-mapped cache of a pipeline's output.

``pipe.cache(path)`` (see :func:`asyncflow.cache._cached.cache`) writes each sample to
numpy memory-mapped files on the first full pass and replays them afterwards, in order or
shuffled by index. :func:`info` describes a cache on disk (``asyncflow cache info PATH``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._info import CacheInfo, info

__all__ = ["CacheInfo", "CachedPipeline", "info"]

__getattr__ = lazy_getattr(__name__, {"CachedPipeline": "asyncflow.cache._cached"})

if TYPE_CHECKING:
    from ._cached import CachedPipeline


def __dir__() -> list[str]:
    return __all__
