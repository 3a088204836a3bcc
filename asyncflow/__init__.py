"""asyncflow: an asyncio-native dataflow framework that feeds PyTorch training and inference.

``import asyncflow`` is light: torch, aiohttp, aiobotocore and PIL load lazily, when a name that
needs them is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import (
    AsyncflowError,
    ConfigError,
    DecodeError,
    FailureBudgetExceeded,
    PipelineError,
    SourceError,
    SourceNotFound,
    SourcePermissionError,
    SourceTimeout,
    StallError,
    WorkerError,
)
from ._lazy import lazy_getattr
from .pipeline import Pipeline, PipelineStats, Processes, Run, StageStats, WorkerInfo, worker_info
from .pipeline._shm import register_lazy_reducers

__version__ = "0.1.0"

_LAZY = {
    "image": "asyncflow.image:",
    "sources": "asyncflow.sources:",
    "read_bytes": "asyncflow.sources",
    "Retry": "asyncflow.sources",
    "Timeout": "asyncflow.sources",
    "SequentialSampler": "asyncflow.sources",
    "RandomSampler": "asyncflow.sources",
    "WeightedRandomSampler": "asyncflow.sources",
    "DistributedSampler": "asyncflow.sources",
    "DataLoader": "asyncflow.torch",
    "mix": "asyncflow.sources._mix",
    "profile": "asyncflow._profile",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

# Tensors cross worker processes through shared memory once torch is loaded (the engine
# itself imports neither torch nor asyncflow.torch).
register_lazy_reducers("torch", "asyncflow.torch._share")

if TYPE_CHECKING:
    from . import image, sources
    from ._profile import profile
    from .sources import (
        DistributedSampler,
        RandomSampler,
        Retry,
        SequentialSampler,
        Timeout,
        WeightedRandomSampler,
        read_bytes,
    )
    from .sources._mix import mix
    from .torch import DataLoader


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AsyncflowError",
    "ConfigError",
    "DataLoader",
    "DecodeError",
    "DistributedSampler",
    "FailureBudgetExceeded",
    "Pipeline",
    "PipelineError",
    "PipelineStats",
    "Processes",
    "RandomSampler",
    "Retry",
    "Run",
    "SequentialSampler",
    "SourceError",
    "SourceNotFound",
    "SourcePermissionError",
    "SourceTimeout",
    "StageStats",
    "StallError",
    "Timeout",
    "WeightedRandomSampler",
    "WorkerError",
    "WorkerInfo",
    "__version__",
    "image",
    "mix",
    "profile",
    "read_bytes",
    "sources",
    "worker_info",
]
