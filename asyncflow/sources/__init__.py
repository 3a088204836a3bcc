"""Where items come from: local files, HTTP(S), S3, tar shards, and index samplers.

Everything here loads lazily: importing ``asyncflow.sources`` does not import aiohttp,
aiobotocore or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    # remote and local reads (issue 7)
    "read_bytes": "asyncflow.sources._read",
    "session": "asyncflow.sources._read",
    "ObjectInfo": "asyncflow.sources._read",
    "list_objects": "asyncflow.sources._list",
    "tar_samples": "asyncflow.sources._tar",
    "tar_members": "asyncflow.sources._tar",
    "Retry": "asyncflow.sources._retry",
    "Timeout": "asyncflow.sources._retry",
    # index samplers (issue 4)
    "SequentialSampler": "asyncflow.sources._samplers",
    "RandomSampler": "asyncflow.sources._samplers",
    "WeightedRandomSampler": "asyncflow.sources._samplers",
    "DistributedSampler": "asyncflow.sources._samplers",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

if TYPE_CHECKING:
    from ._list import list_objects
    from ._read import ObjectInfo, read_bytes, session
    from ._retry import Retry, Timeout
    from ._samplers import (
        DistributedSampler,
        RandomSampler,
        SequentialSampler,
        WeightedRandomSampler,
    )
    from ._tar import tar_members, tar_samples

__all__ = sorted(_LAZY)


def __dir__() -> list[str]:
    return __all__
