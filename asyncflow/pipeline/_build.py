"""Building one run's graph: a node, a context and an output channel per stage.

The source is stage 0. Every stage writes to a bounded :class:`Channel`, the last one to the
consumer's :class:`Handoff`; each gets its counters, failure budget and (for a map on worker
processes) its process pool. A :class:`Merge` source adds each input's source and stages as a
branch of the same graph, before the merge node that reads them (``_merge.py``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._errors import ConfigError
from .._scope import RunScope
from ..workers import WorkerPool
from . import _assemble, _custom, _map, _stages  # noqa: F401  (their nodes: node_for)
from ._bridge import Handoff
from ._channel import Channel
from ._failures import FailureBudget
from ._graph import Graph, RunResources
from ._ledger import Ledger
from ._lineage import Lineage, SourcePlan
from ._loop import new_loop
from ._merge import Branch, BranchRun, Merge, MergeNode
from ._merge_epochs import Era
from ._merge_resume import MergeLedger, branch_at, tracks_of
from ._node import ItemKeys, Node, NodeContext, ReceiveHook, make_node
from ._options import RunOptions, RunPlan
from ._protocols import Budgeted, SettlingNode, SourceGate, StatefulNode, round_robin
from ._source_node import SourceNode
from ._spec import MapSpec, StageSpec, stage_names
from ._stats import StageCounters
from ._window import BranchCredits, Window

__all__ = ["build_run", "thread_count"]

_UNBATCHED_BUFFER = 64


def thread_count(specs: Sequence[StageSpec], source: Any = None) -> int:
    """Worker threads a run of ``specs`` reserves: one per sync call in flight, plus one
    (and those of each branch, when ``source`` is a :class:`Merge`)."""
    branches = 0
    if isinstance(source, Merge):
        branches = sum(thread_count(p.stages, p.source) for p in source.inputs)
    return 1 + branches + sum(s.concurrency for s in specs if s.traits.worker == "threads")


@dataclass(frozen=True, kw_only=True)
class _Source(StageSpec):
    """A chain's stage 0, its source (or merge), as the builder sizes and counts it."""

    kind: ClassVar[str] = "source"
    buffer: int | None = None  # ``RunOptions.source_buffer``

    @property
    def items_per_output(self) -> int | None:
        return 1  # the stages after it count from its items


def build_run(branch: Branch, resume: SourcePlan | None) -> tuple[Graph, RunResources]:
    """One run, ready to start (in the consumer's thread): what its stages share (a fresh
    loop, whose default executor is the run's worker threads, a stop event, a run scope) and
    its graph.

    Args:
        branch: The epoch of the pipeline to run, described as a merge's inputs are: its
            plan (source opener, options), stages, epoch number, first position and
            persistent worker-process pools. A :class:`Merge` source reads several
            pipelines, built as branches of the run's graph.
        resume: Where a resumed run's source starts and what it leaves out, with the
            stages' saved state (from ``load_state_dict``); ``None``: at ``branch.start``.
    """
    options, open_source = branch.plan.options, branch.plan.open_source
    loop = new_loop()
    pool = WorkerPool(thread_count(branch.stages, open_source), f"asyncflow-{options.name}-worker")
    # asyncio.to_thread and run_in_executor(None, ...) on the run's loop use its pool too
    loop.set_default_executor(pool.executor)
    run = RunResources(
        options=options, pool=pool, stop=threading.Event(), scope=RunScope(dict(options.settings)),
        loop=loop, pools=branch.pools, epoch=branch.epoch,
        plan=resume if resume is not None else SourcePlan(first=branch.start),
    )
    graph = Graph()
    try:
        chain = _add_chain(graph, open_source, branch.stages, run, prefix="", handoff=True,
                           gate=branch.plan.gate)
        graph.receive_hooks = _receive_hooks(branch.plan, chain)
    except BaseException:  # a node's factory or its declared traits refused: nothing ran
        for ctx in graph.contexts:  # those built so far
            ctx.call_stop_callbacks()
        pool.shutdown()
        loop.close()
        raise
    return graph, run


def _add_chain(
    graph: Graph,
    open_source: Callable[[], Any] | Merge[Any],
    specs: Sequence[StageSpec],
    run: RunResources,
    *,
    prefix: str,
    handoff: bool,
    counters_of: Mapping[str, StageCounters] | None = None,
    keep: bool = True,
    gate: SourceGate | None = None,
) -> list[NodeContext]:
    """Append a source and its stages to ``graph`` (a merge source's branches first); the
    last writes the hand-off if ``handoff``. Returns their contexts. Stages are named
    ``prefix + name``; those named in ``counters_of`` count on with those counters; the
    source (or merge) is read once ``gate`` allows."""
    options = run.options
    merge = open_source if isinstance(open_source, Merge) else None
    names = [prefix + name for name in stage_names(specs)]
    if merge is not None:
        names[0] = prefix + merge.name
    stages = [_Source(buffer=options.source_buffer), *specs]
    lineage = Lineage(run.plan)
    keys = ItemKeys()  # the source's seed keys, if it names them
    window = _window(merge, specs, names, options)
    in_step = True  # every stage so far maps source items 1:1, in order
    batched = False
    for index, (spec, name) in enumerate(zip(stages, names, strict=True)):
        if spec.traits.grouping is not None:
            batched = spec.traits.grouping != "elements"
        capacity = spec.buffer
        if capacity is None:  # two per call in flight, and 64 items at least unless batched
            capacity = max(2 if batched else _UNBATCHED_BUFFER, 2 * spec.concurrency)
        last = handoff and index == len(stages) - 1
        max_bytes = spec.buffer_bytes or options.buffer_bytes
        output: Any = (
            Handoff(capacity, run.loop, max_bytes) if last else Channel(capacity, max_bytes)
        )
        kind = "merge" if index == 0 and merge is not None else spec.kind
        counters = (counters_of or {}).get(name) or StageCounters(
            name, kind, spec.concurrency, capacity
        )
        counters.output = output
        limit = spec.max_failures if isinstance(spec, Budgeted) else None
        budget = FailureBudget(options.max_failures if limit is None else limit, name)
        ctx = NodeContext(
            name=name, index=index, counters=counters, budget=budget, pool=run.pool,
            stop=run.stop, scope=run.scope, epoch=run.epoch, executor=spec.executor,
            lineage=lineage, item_keys=keys, window=window, in_step=in_step,
            start=run.plan.base if in_step else 0,  # positions count from the resumed one
        )
        if window is not None and index == 0 and (handoff or merge is not None):
            # the consumer has it: its credit is free (a branch's source gets its credits
            # back from the merge's window, as the consumer receives the branch's items)
            ctx.add_receive_hook(window.received)
        in_step = in_step and spec.items_per_output == 1
        if spec.traits.worker == "processes":
            ctx.processes = _process_pool(index, spec, name, ctx, run)
            if ctx.processes.start_note:  # fork, or its fallback: chosen as the pool was made
                graph.notes.append(f"stage {name!r}: {ctx.processes.start_note}")
        if spec.note:
            graph.notes.append(f"stage {name!r} runs on {spec.note}")
        if index > 0:
            node: Node = _stage_node(ctx, spec)
        else:
            node = (SourceNode(ctx, open_source, gate) if merge is None
                    else _merge_node(graph, merge, ctx, run, prefix, gate))
        graph.contexts.append(ctx)
        graph.outputs.append(output)
        graph.nodes.append(node)
    # the chain's entries are the graph's last (a merge's branches come before it)
    lineage.attach(names, graph.nodes[-len(stages):], specs, keep=keep, nested=not handoff)
    if handoff:
        graph.lineage = lineage
    return graph.contexts[-len(stages):]


def _window(merge: Merge[Any] | None, specs: Sequence[StageSpec], names: Sequence[str],
            options: RunOptions) -> Window | None:
    """The chain's window, if its stages keep items one for one: ``options.window`` over a
    plain source; over a merge whose inputs have windows, the credits it owes them."""
    window: Window | None = None
    if merge is not None:
        if options.window is not None:
            raise ConfigError(f"{names[0]}: a window needs a plain source, not a Merge (give "
                              "each of the merge's inputs a window: its branch's read-ahead)")
        if any(p.options.window is not None for p in merge.inputs):
            window = BranchCredits()
    elif options.window is not None:
        window = Window(options.window)
    if window is None:
        return None
    for name, spec in zip(names[1:], specs, strict=True):
        if spec.traits.grouping is not None:
            raise ConfigError(
                f"stage {name!r} regroups items ({spec.traits.grouping}); a window counts "
                "items one for one from the source to the consumer"
            )
    return window


def _add_branch(
    graph: Graph,
    branch: Branch,
    run: RunResources,
    prefix: str,
    counters_of: Mapping[str, StageCounters] | None = None,
    resume: SourcePlan | None = None,
    keep: bool = True,
) -> BranchRun:
    """Append one epoch of a merge's input to ``graph``, with a run scope of its own (its
    pipeline's ``retry`` / ``timeout`` settings); ``resume``: where a resumed branch starts;
    ``keep``: whether its ledgers keep records."""
    plan = branch.plan
    scope = RunScope(dict(plan.options.settings))
    resources = dataclasses.replace(
        run, options=plan.options, scope=scope, pools=branch.pools, epoch=branch.epoch,
        plan=resume if resume is not None else SourcePlan(first=branch.start),
    )
    first = len(graph.contexts)
    chain = _add_chain(graph, plan.open_source, branch.stages, resources, prefix=prefix,
                       handoff=False, counters_of=counters_of, keep=keep, gate=plan.gate)
    graph.scopes.append(scope)
    graph.notes.extend(f"{prefix[:-1]}: {note}" for note in plan.options.notes)
    contexts = graph.contexts[first:]
    starts = [ctx for ctx in contexts if ctx not in graph.deferred]  # nested: their merge's
    graph.deferred.update(contexts)
    window = chain[0].window  # a nested merge's own window is given back by its hook
    steady = not isinstance(plan.open_source, Merge) and all(
        s.items_per_output == 1 for s in branch.stages)  # one for one: EndOfStream's counts
    return BranchRun(
        contexts=contexts, starts=starts, output=graph.outputs[-1], scope=scope,
        hooks=_receive_hooks(plan, chain),
        window=None if isinstance(window, BranchCredits) else window,
        counts=[(c.counters.items_in, c.counters.items_out, c.counters.failures)
                for c in contexts] if steady else None)


def _receive_hooks(plan: RunPlan, chain: Sequence[NodeContext]) -> tuple[ReceiveHook, ...]:
    """What is applied to each item a chain outputs (in the consumer's thread, or by the
    merge that reads a branch): its plan's hooks, then those its stages added."""
    return (*plan.receive_hooks, *(hook for ctx in chain for hook in ctx.receive_hooks))


def _merge_node(
    graph: Graph, merge: Merge[Any], ctx: NodeContext, run: RunResources, prefix: str,
    gate: SourceGate | None,
) -> MergeNode:
    """Build a merge's branches into ``graph`` and the node that reads them."""
    prefixes = [f"{prefix}{label}/" for label in merge.labels]
    tracks = tracks_of(run.plan.nodes.get(ctx.name), len(merge.inputs), merge.name)
    ledger = MergeLedger(ctx.lineage.source.plan, len(merge.inputs), tracks, name=merge.name)

    def add(i: int, era: Era, branch: Branch, old: BranchRun | None = None) -> BranchRun:
        """Branch ``i`` built into the graph, its ledger installed; ``old``: the branch it
        restarts (whose counters count on)."""
        counters = None if old is None else {c.name: c.counters for c in old.contexts}
        new = _add_branch(graph, branch, run, prefixes[i], counters_of=counters,
                          resume=era.plan, keep=old is None or ctx.lineage.missing is None)
        ledger.install(i, new.contexts[-1])  # its last stage's (nested branches come first)
        return new

    branches = []
    for i, pipe in enumerate(merge.inputs):
        era = ledger.tracks[i].era  # resumed: the branch's epoch again (its order, its seeds)
        branches.append(add(i, era, branch_at(pipe, era)))
    ledger.built(merge.inputs)

    async def rebuild(i: int, old: BranchRun) -> BranchRun:
        era = ledger.tracks[i].era  # the era it builds next (resumed: its state lists it)
        branch = await ctx.run_sync(branch_at, merge.inputs[i], era)  # run_plan() may read files
        start = len(graph.contexts)
        new = add(i, era, branch, old)
        graph.move(start, old.contexts)
        graph.deferred.difference_update(old.contexts)
        if old.scope in graph.scopes:
            graph.scopes.remove(old.scope)
        return new

    return MergeNode(ctx, merge, branches, graph, rebuild, ledger=ledger, gate=gate)


def _process_pool(
    index: int, spec: StageSpec, name: str, ctx: NodeContext, run: RunResources
) -> Any:
    from ..workers import ProcessPool

    # A map is the one stage that runs on processes: it names the function and the options.
    assert isinstance(spec, MapSpec) and spec.processes is not None
    processes = spec.processes

    def make() -> ProcessPool:
        return ProcessPool(spec.fn, spec.concurrency, processes, name,
                           round_robin=round_robin(spec.fn))

    if processes.persistent:
        return run.pools.get(index, make)
    pool = make()
    # stopped with its run (a process pool abandons no call: nothing to report)
    ctx.add_stop_callback(lambda: pool.shutdown(run.options.stop_timeout))
    return pool


def _stage_node(ctx: NodeContext, spec: StageSpec) -> Node:
    """The node registered for ``spec``'s class (``_node.node_for``), checked against what
    the spec declares of its state (``StageTraits.stateful``)."""
    node = make_node(ctx, spec)
    if isinstance(getattr(node, "ledger", None), Ledger):
        return node  # the engine's own nodes keep their state in their ledgers
    keeps = isinstance(node, SettlingNode) and isinstance(node, StatefulNode)
    if keeps and not spec.traits.stateful:
        raise ConfigError(
            f"stage {ctx.name!r}: its node ({type(node).__name__}) has get_state / set_state, "
            "but its spec does not declare stateful=True (StageTraits): its state would be "
            "left out of state_dict()"
        )
    if spec.traits.stateful and not keeps:
        raise ConfigError(
            f"stage {ctx.name!r}: its spec declares stateful=True, but its node "
            f"({type(node).__name__}) lacks settled_inputs, get_state or set_state"
        )
    return node
