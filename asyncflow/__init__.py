"""asyncflow: an asyncio-native dataflow framework that feeds PyTorch training and inference.

``import asyncflow`` is light: torch, aiohttp, aiobotocore and PIL load lazily, when a name that
needs them is first used.

Layout, bottom first: a module imports only those above it in its own layer or the layers
below (``tests/structure.py`` holds it; docs/concepts.md draws it)::

    base      _errors.py   every error, the tree drawn in its docstring, FailureRecord, and
                           the one int and bool argument checks
              _redact.py   the one redactor of secrets in messages and URLs
              _scope.py    RunScope: resources that live as long as one run (HTTP, S3)
              _lazy.py     module attributes imported when first used
              _tree.py     the one walker of nested items (dicts, lists, tuples, namedtuples)
              _recycle.py  the one recycler of batch buffers
              _blob.py     bytes that name their source; the reader of whole local files
              _identity.py the one checksum of a saved state, the one digest of bytes, and
                           what a listing holds (resume, the cache, ranks, the journal)
    workers   workers/     a stage's sync calls on the run's threads or in worker processes
                           (results through shared memory), workers="auto"'s choice; the
                           seeds every random stream draws from
    engine    pipeline/    specs, the fluent Pipeline, runs, channels, stage nodes
    services  ranks/       a process's share of a list, elastic resume, rank and world size
              journal/     which items made each output, and that output made again
    features  sources/     where items come from: samplers, files, HTTP, S3, tar shards
              image/       decode, crop and resize into batch buffers (image.folder)
              torch/       collate, pinned buffers, to_device, the DataLoader facade
              cache/       store a pipeline's output, replay it
              report/      the stats table, progress bars, the profiler
    face      __init__.py  this module: the public names; it registers the features the engine
                           looks up by name (register_feature)
              cli/         the ``asyncflow`` command (``__main__.py`` runs it)
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
    "profile": "asyncflow.report",
    "Journal": "asyncflow.journal",
    "JournalRecord": "asyncflow.journal",
    "explain": "asyncflow.journal",
    "rebuild": "asyncflow.journal",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

# The engine imports none of its features: the methods and options that need one
# (``pipe.to_device``, ``pipe.cache``, ``pipe.progress``, the HTML and text reprs, ``retry=`` /
# ``timeout=``) look it up by name, and it is imported when first used. Likewise the journal
# reads an ``image.folder`` record's crops through ``"journal_crops:image.folder"``, and
# ``asyncflow.image`` parses a device with asyncflow.torch's ``"parse_device"`` and
# ``"resolve_device"``.
for _name, _target in {
    "to_device": "asyncflow.torch._transfer:to_device",
    "parse_device": "asyncflow.torch._transfer:parse_device",
    "resolve_device": "asyncflow.torch._transfer:resolve_device",
    "cache": "asyncflow.cache._cached:cache",
    "progress_hook": "asyncflow.report._progress:progress_hook",
    "journal": "asyncflow.journal:Journal",
    "journal_crops:image.folder": "asyncflow.image._explain:record_crops",
    "pipeline_html": "asyncflow.report._tables:pipeline_html",
    "stats_text": "asyncflow.report._tables:stats_text",
    "stats_html": "asyncflow.report._tables:stats_html",
    "Retry": "asyncflow.sources._retry:Retry",
    "Timeout": "asyncflow.sources._retry:Timeout",
}.items():
    register_feature(_name, _target)
del _name, _target

# Tensors cross worker processes through shared memory once torch is loaded (the engine
# itself imports neither torch nor asyncflow.torch).
register_lazy_reducers("torch", "asyncflow.torch._reducers")

if TYPE_CHECKING:
    from . import image, sources
    from .journal import Journal, JournalRecord, explain, rebuild
    from .report import profile
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
