"""The engine: specs, the fluent Pipeline, runs on their own loop thread, channels, stats."""

from ._handle import Run
from ._pipeline import Pipeline
from ._spec import CustomSpec
from ._stats import FailureRecord, PipelineStats, StageStats
from ._workers import (
    Processes,
    WorkerInfo,
    register_worker_setup,
    worker_info,
)


def register_reducer(cls: type, reducer: object) -> None:
    """Send instances of ``cls`` between worker processes with ``reducer`` (see ``_shm.py``)."""
    from ._shm import register_reducer as register

    register(cls, reducer)  # type: ignore[arg-type]


__all__ = [
    "CustomSpec",
    "FailureRecord",
    "Pipeline",
    "PipelineStats",
    "Processes",
    "Run",
    "StageStats",
    "WorkerInfo",
    "register_reducer",
    "register_worker_setup",
    "worker_info",
]
