"""The engine: specs, the fluent Pipeline, runs on their own loop thread, channels, stats.

Features (``asyncflow.torch``, ``asyncflow.cache``, progress bars, display) extend a pipeline
through the public seams exported here; see ``EXTENDING.md``.
"""

from ._auto import choose_workers, usable_cpus
from ._boot import check_picklable
from ._core import HookFactory
from ._features import feature, register_feature
from ._handle import ConsumerHook, Run
from ._node import Node, NodeContext, ReceiveHook, Receiver, Sender
from ._options import RunOptions, RunPlan
from ._pipeline import Pipeline
from ._spec import CustomSpec, StageSpec
from ._stats import FailureRecord, ItemGroup, PipelineStats, StageStats, label_stage
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
    "ConsumerHook",
    "CustomSpec",
    "FailureRecord",
    "HookFactory",
    "ItemGroup",
    "Node",
    "NodeContext",
    "Pipeline",
    "PipelineStats",
    "Processes",
    "ReceiveHook",
    "Receiver",
    "Run",
    "RunOptions",
    "RunPlan",
    "Sender",
    "StageSpec",
    "StageStats",
    "WorkerInfo",
    "check_picklable",
    "choose_workers",
    "feature",
    "label_stage",
    "register_feature",
    "register_reducer",
    "register_worker_setup",
    "usable_cpus",
    "worker_info",
]
