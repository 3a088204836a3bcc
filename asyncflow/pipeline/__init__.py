"""The engine: specs, the fluent Pipeline, runs on their own loop thread, channels, stats.

Features (``asyncflow.torch``, ``asyncflow.cache``, progress bars, display) extend a pipeline
through the public seams exported here; see ``EXTENDING.md``.
"""

from .._identity import (
    describe_difference,
    item_token,
    listing_identity,
    sequence_identity,
    short_digest,
    state_checksum,
)
from .._scope import current_epoch
from ..workers import (
    Processes,
    WorkerInfo,
    check_picklable,
    choose_workers,
    register_reducer,
    register_worker_setup,
    run_failed,
    run_thread,
    usable_cpus,
    worker_info,
)
from ._assemble import AssembleSpec
from ._core import HookFactory
from ._custom import CustomSpec
from ._failures import FailureBudget
from ._features import feature, register_feature
from ._merge import Merge
from ._merge_end import END_OF_STREAM, EndOfStream
from ._node import Node, NodeContext, ReceiveHook, Receiver, Sender, apply_hooks, node_for
from ._options import RunOptions, RunPlan
from ._pipeline import Pipeline
from ._protocols import Assembler, BranchEnd, MergeChooser, MergePolicy
from ._run import ConsumerHook, Run
from ._span import Span
from ._spec import StageSpec
from ._stats import FailureRecord, ItemGroup, PipelineStats, StageStats, label_stage
from ._traits import StageTraits

__all__ = [
    "END_OF_STREAM",
    "AssembleSpec",
    "Assembler",
    "BranchEnd",
    "ConsumerHook",
    "CustomSpec",
    "EndOfStream",
    "FailureBudget",
    "FailureRecord",
    "HookFactory",
    "ItemGroup",
    "Merge",
    "MergeChooser",
    "MergePolicy",
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
    "Span",
    "StageSpec",
    "StageStats",
    "StageTraits",
    "WorkerInfo",
    "apply_hooks",
    "check_picklable",
    "choose_workers",
    "current_epoch",
    "describe_difference",
    "feature",
    "item_token",
    "label_stage",
    "listing_identity",
    "node_for",
    "register_feature",
    "register_reducer",
    "register_worker_setup",
    "run_failed",
    "run_thread",
    "sequence_identity",
    "short_digest",
    "state_checksum",
    "usable_cpus",
    "worker_info",
]
