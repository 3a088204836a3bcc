"""asyncflow: an asyncio-native dataflow framework that feeds PyTorch training and inference.

``import asyncflow`` is light: torch, aiohttp, aiobotocore and PIL load lazily, when a name that
needs them is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import (
    AsyncflowError,
    ConfigError,
    ConfigTypeError,
    DecodeError,
    FailureBudgetExceeded,
    LoaderTimeout,
    PipelineError,
    RebuildWarning,
    SourceError,
    SourceNotFound,
    SourcePermissionError,
    SourceTimeout,
    StallError,
    WorkerError,
)
from ._lazy import lazy_getattr
from .pipeline import (
    Pipeline,
    PipelineStats,
    Processes,
    Run,
    StageStats,
    WorkerInfo,
    register_feature,
    worker_info,
)
from .pipeline.shm import register_lazy_reducers

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
    "Split": "asyncflow.sources",
    "DataLoader": "asyncflow.torch",
    "mix": "asyncflow.sources._mix",
    "profile": "asyncflow._profile",
    "Journal": "asyncflow._journal",
    "JournalRecord": "asyncflow._journal",
    "explain": "asyncflow._journal",
    "rebuild": "asyncflow._journal",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

# The engine imports none of its features: the methods and options that need one
# (``pipe.to_device``, ``pipe.cache``, ``pipe.progress``, the HTML and text reprs, ``retry=`` /
# ``timeout=``) look it up by name, and it is imported when first used. Likewise the journal
# reads an ``image.folder`` record's crops through ``"journal_crops:image.folder"``.
for _name, _target in {
    "to_device": "asyncflow.torch._transfer:to_device",
    "cache": "asyncflow.cache._pipeline:cache",
    "progress_hook": "asyncflow._progress:progress_hook",
    "journal": "asyncflow._journal:journal",
    "journal_crops:image.folder": "asyncflow.image._explain:record_crops",
    "pipeline_html": "asyncflow._display:pipeline_html",
    "stats_text": "asyncflow._display:stats_text",
    "stats_html": "asyncflow._display:stats_html",
    "Retry": "asyncflow.sources._retry:Retry",
    "Timeout": "asyncflow.sources._retry:Timeout",
}.items():
    register_feature(_name, _target)
del _name, _target

# Tensors cross worker processes through shared memory once torch is loaded (the engine
# itself imports neither torch nor asyncflow.torch).
register_lazy_reducers("torch", "asyncflow.torch._share")

if TYPE_CHECKING:
    from . import image, sources
    from ._journal import Journal, JournalRecord, explain, rebuild
    from ._profile import profile
    from .sources import (
        DistributedSampler,
        RandomSampler,
        Retry,
        SequentialSampler,
        Split,
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
    "ConfigTypeError",
    "DataLoader",
    "DecodeError",
    "DistributedSampler",
    "FailureBudgetExceeded",
    "Journal",
    "JournalRecord",
    "LoaderTimeout",
    "Pipeline",
    "PipelineError",
    "PipelineStats",
    "Processes",
    "RandomSampler",
    "RebuildWarning",
    "Retry",
    "Run",
    "SequentialSampler",
    "SourceError",
    "SourceNotFound",
    "SourcePermissionError",
    "SourceTimeout",
    "Split",
    "StageStats",
    "StallError",
    "Timeout",
    "WeightedRandomSampler",
    "WorkerError",
    "WorkerInfo",
    "__version__",
    "explain",
    "image",
    "mix",
    "profile",
    "read_bytes",
    "rebuild",
    "sources",
    "worker_info",
]
