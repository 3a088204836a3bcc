"""One run's graph: its stages' nodes, contexts and channels (``Graph``), and what every
stage of the run shares (``RunResources``). ``_build.py`` builds them; the runtime runs them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._scope import RunScope
from ..workers import WorkerPool
from ._lineage import Lineage, SourcePlan
from ._node import Node, NodeContext, ReceiveHook
from ._options import RunOptions
from ._pool_holder import PoolHolder

__all__ = ["Graph", "RunResources"]


@dataclass
class Graph:
    """One run's stages, branches first, each chain's source first: ``nodes[i]`` writes
    ``outputs[i]`` and reads ``outputs[i - 1]`` (nothing for a source, whose
    ``contexts[i].index`` is 0); ``contexts[i]`` is what it may use. The pipeline's own
    stages (``chain``) come last, the last one writing the consumer's hand-off.

    A merge replaces a branch's entries when it restarts it (on the run's loop), so the
    runtime keeps its tasks and failures by context, not by position.
    """

    contexts: list[NodeContext] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What the consumer's thread applies to each item: the run plan's receive hooks, then
    #: those of the pipeline's own stages.
    receive_hooks: tuple[ReceiveHook, ...] = ()
    #: The running stages' tasks, by context (the runtime fills it).
    tasks: dict[Any, asyncio.Task[None]] = field(default_factory=dict)
    #: The contexts of the stages that failed (the runtime fills it).
    failed: set[NodeContext] = field(default_factory=set)
    #: The branches' run scopes, closed when the run ends.
    scopes: list[RunScope] = field(default_factory=list)
    #: The contexts of the branches' stages: their merge nodes start them, not the runtime.
    deferred: set[NodeContext] = field(default_factory=set)
    #: Starts the tasks of the stages with these contexts (set by the runtime).
    spawn: Callable[[Sequence[NodeContext]], None] | None = None
    #: The ledgers of the pipeline's own stages: what the consumer's items came from.
    lineage: Lineage = field(default_factory=Lineage)

    def close_windows(self) -> None:
        """Close every stage's window, a nested merge's branches' too (any thread): a failed
        or stopping run wakes each source waiting for credits, to end its stream."""
        for ctx in list(self.contexts):  # a copy: a merge may restart a branch meanwhile
            if ctx.window is not None:
                ctx.window.close()

    def move(self, start: int, old: Sequence[NodeContext]) -> None:
        """Put the entries from ``start`` on in the place of those of ``old`` (a contiguous
        run of entries before ``start``; whole chains both, so each stage still follows its
        input)."""
        lo = next(i for i, ctx in enumerate(self.contexts) if ctx is old[0])
        hi = lo + len(old)
        for entries in (self.contexts, self.nodes, self.outputs):
            new = entries[start:]
            del entries[start:]
            entries[lo:hi] = new  # type: ignore[assignment]


@dataclass(frozen=True)
class RunResources:
    """What every stage of one run shares."""

    options: RunOptions
    pool: WorkerPool
    stop: threading.Event
    scope: RunScope
    loop: asyncio.AbstractEventLoop
    pools: PoolHolder
    epoch: int
    #: Where the run's source starts (a resumed run's: what it leaves out, and its stages'
    #: saved state).
    plan: SourcePlan
