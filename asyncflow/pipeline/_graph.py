"""Building one run's graph: a node, a context and an output channel per stage.

The source is stage 0. Every stage writes to a bounded :class:`Channel`, the last one to the
consumer's :class:`Handoff`; each gets its counters, failure budget and (for a map on worker
processes) its process pool.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._scope import RunScope
from ._bridge import Handoff
from ._channel import Channel
from ._failures import FailureBudget
from ._map import MapNode
from ._node import Node, NodeContext
from ._offload import WorkerPool
from ._options import RunOptions
from ._pools import PoolHolder
from ._spec import (
    BatchSpec,
    CustomSpec,
    MapSpec,
    PrefetchSpec,
    ShuffleSpec,
    StageSpec,
    UnbatchSpec,
)
from ._stages import (
    BatchNode,
    FlatMapNode,
    PrefetchNode,
    ShuffleNode,
    SourceNode,
    UnbatchNode,
)
from ._stats import StageCounters

__all__ = ["Graph", "build_graph", "thread_count"]

_UNBATCHED_BUFFER = 64


@dataclass
class Graph:
    """One run's stages, in order: ``nodes[i]`` reads ``outputs[i - 1]`` and writes
    ``outputs[i]``; ``contexts[i]`` is what it may use."""

    contexts: list[NodeContext] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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
    start: int


def thread_count(specs: Sequence[StageSpec]) -> int:
    """Worker threads a run of ``specs`` reserves: one per sync call in flight, plus one."""
    return 1 + sum(
        s.concurrency_ for s in specs
        if (isinstance(s, MapSpec) and not s.is_async and s.executor is None
            and s.processes is None)
        or isinstance(s, CustomSpec)
    )


def _default_capacity(spec: StageSpec | None, batched: bool) -> int:
    if isinstance(spec, PrefetchSpec):
        return spec.size
    buffer = getattr(spec, "buffer", None)
    if buffer is not None:
        return int(buffer)
    concurrency = spec.concurrency_ if spec is not None else 1
    return max(2, 2 * concurrency) if batched else max(_UNBATCHED_BUFFER, 2 * concurrency)


def _unique(base: str, names: set[str]) -> str:
    name, n = base, 2
    while name in names:
        name, n = f"{base}#{n}", n + 1
    names.add(name)
    return name


def build_graph(
    open_source: Callable[[], Any], specs: Sequence[StageSpec], run: RunResources
) -> Graph:
    """The nodes, contexts and output channels of one run (in the consumer's thread)."""
    graph = Graph()
    options = run.options
    names: set[str] = set()
    stages: list[StageSpec | None] = [None, *specs]
    in_step = True  # every stage so far maps source items 1:1, in order
    batched = False
    for index, spec in enumerate(stages):
        if isinstance(spec, BatchSpec):
            batched = True
        elif isinstance(spec, UnbatchSpec):
            batched = False
        kind = "source" if spec is None else spec.kind
        name = _unique("source" if spec is None else (spec.name or spec.default_name()), names)
        capacity = _default_capacity(spec, batched)
        if spec is None and options.source_buffer is not None:
            capacity = options.source_buffer
        last = index == len(stages) - 1
        max_bytes = getattr(spec, "buffer_bytes", None) or options.buffer_bytes
        output: Any = (
            Handoff(capacity, run.loop, max_bytes) if last else Channel(capacity, max_bytes)
        )
        concurrency = 1 if spec is None else spec.concurrency_
        counters = StageCounters(name, kind, concurrency, capacity)
        counters.output = output
        limit = getattr(spec, "max_failures", None)
        budget = FailureBudget(options.max_failures if limit is None else limit, name)
        ctx = NodeContext(
            name=name, index=index, counters=counters, budget=budget, pool=run.pool,
            stop=run.stop, scope=run.scope, epoch=run.epoch,
            executor=getattr(spec, "executor", None),
        )
        if in_step:
            ctx.start = run.start  # positions count from the resumed one
        in_step = in_step and (spec is None or (
            isinstance(spec, MapSpec) and spec.mode == "map" and spec.ordered
        ) or isinstance(spec, PrefetchSpec))
        if isinstance(spec, MapSpec) and spec.processes is not None:
            ctx.processes = _process_pool(index, spec, name, ctx, run)
        if isinstance(spec, MapSpec) and spec.note:
            graph.notes.append(f"stage {name!r} runs on {spec.note}")
        graph.contexts.append(ctx)
        graph.outputs.append(output)
        graph.nodes.append(_make_node(ctx, spec, open_source, capacity))
    return graph


def _process_pool(
    index: int, spec: MapSpec, name: str, ctx: NodeContext, run: RunResources
) -> Any:
    from ._procpool import ProcessPool

    assert spec.processes is not None
    processes = spec.processes

    def make() -> ProcessPool:
        return ProcessPool(spec.fn, spec.concurrency, processes, name)

    if processes.persistent:
        return run.pools.get(index, make)
    pool = make()
    ctx.add_stop_callback(lambda: pool.shutdown(run.options.stop_timeout))
    return pool


def _make_node(
    ctx: NodeContext, spec: StageSpec | None, open_source: Callable[[], Any], capacity: int
) -> Node:
    if spec is None:
        return SourceNode(ctx, open_source)
    if isinstance(spec, MapSpec):
        if spec.mode == "flat_map":
            return FlatMapNode(ctx, spec, capacity)
        return MapNode(ctx, spec)
    if isinstance(spec, BatchSpec):
        return BatchNode(ctx, spec)
    if isinstance(spec, UnbatchSpec):
        return UnbatchNode(ctx)
    if isinstance(spec, PrefetchSpec):
        return PrefetchNode(ctx, spec)
    if isinstance(spec, ShuffleSpec):
        return ShuffleNode(ctx, spec)
    if isinstance(spec, CustomSpec):
        return spec.factory(ctx)
    raise TypeError(f"unknown stage spec {spec!r}")
