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
    "ObjectInfo": "asyncflow.sources._transport",
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
    # splitting a source across ranks and workers (issue 16)
    "Split": "asyncflow.ranks",
    "Share": "asyncflow.ranks",
    "Part": "asyncflow.ranks",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

if TYPE_CHECKING:
    # "import X as X" marks an explicit re-export for type checkers (``__all__`` is computed).
    from ..ranks import Part as Part
    from ..ranks import Share as Share
    from ..ranks import Split as Split
    from ._list import list_objects as list_objects
    from ._read import read_bytes as read_bytes
    from ._read import session as session
    from ._retry import Retry as Retry
    from ._retry import Timeout as Timeout
    from ._samplers import DistributedSampler as DistributedSampler
    from ._samplers import RandomSampler as RandomSampler
    from ._samplers import SequentialSampler as SequentialSampler
    from ._samplers import WeightedRandomSampler as WeightedRandomSampler
    from ._tar import tar_members as tar_members
    from ._tar import tar_samples as tar_samples
    from ._transport import ObjectInfo as ObjectInfo

__all__ = sorted(_LAZY)


def __dir__() -> list[str]:
    return __all__
