"""Merging pipelines in one run: each input a branch of the run's graph, one node reading them.

A pipeline whose source is a :class:`Merge` builds, for each of its input pipelines, that
input's source and stages as a *branch* of its own run: the same loop, worker threads, stop,
stall detection and statistics (the branch's stages named ``label/stage``). The merge node
(named after the merge, ``mix`` for ``asyncflow.mix``) takes items from the branches' last
channels in the order a :class:`MergePolicy` chooses. A policy may restart a branch that ran
out: the branch is rebuilt as a new epoch of its input, inside the same run. The engine knows
nothing else of the policy (``asyncflow.mix`` draws by weight).

A merge's state, and how a resumed merge replays its policy's choices, restarts included:
``_merge_resume.py`` and ``_merge_epochs.py``.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, Protocol, TypeVar, runtime_checkable

from .._errors import ConfigError
from .._scope import RunScope
from ._merge_end import EndOfStream, count_to_end
from ._merge_resume import END, TAKE, MergeLedger
from ._node import NodeContext, Receiver, Sender, apply_hooks
from ._options import RunOptions, RunPlan
from ._pool_holder import PoolHolder
from ._protocols import BranchEnd, MergeChooser, MergePolicy, SourceGate
from ._spec import StageSpec, unique_names
from ._stats import count_items
from ._window import BranchCredits, Window

__all__ = ["Branch", "BranchRun", "Merge", "MergeNode"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_ENDS = ("stop", "drop", "restart")
_TAKE = 32  # items taken from a branch at a time
_FLUSH = 64  # items chosen before they are put out together


@runtime_checkable
class MergeInput(Protocol[T_co]):
    """What a merge needs of each input: an asyncflow pipeline (``PipelineCore``, which
    ``Pipeline`` is, has all of it). Its source, stages and settings size the run's threads
    and name its branch; ``_branch()`` makes a new epoch of it to build into the run."""

    @property
    def source(self) -> Any: ...

    @property
    def stages(self) -> tuple[StageSpec, ...]: ...

    @property
    def options(self) -> RunOptions: ...

    def _branch(self) -> Branch: ...

    def __iter__(self) -> Iterator[T_co]: ...


@dataclass(frozen=True, eq=False)
class Merge(Generic[T]):
    """The source of a pipeline that reads several pipelines in its own run.

    ``Pipeline(Merge([web, books], policy), name="mix")``: each run builds the inputs'
    sources and stages as branches of that run, and a merge node named ``name`` takes their
    items in the order ``policy`` chooses. An input's run plan (``run_plan()``: a cache
    replay, say) and its stages' receive hooks are honoured; the receive hooks run on the
    run's worker threads, as the merge takes the items. Its consumer hooks (``with_hook``,
    ``progress``) are not run: put those on the merging pipeline.

    The merge node starts the branches when it starts, or once its run plan's ``gate``
    allows (a cache fill of the merged pipeline, which may replay after all).

    Attributes:
        inputs: The pipelines merged.
        policy: Chooses the branch of each item, and what happens to one that runs out.
        name: The merge node's name in ``stats()``.
        labels: Prefixes of each branch's stage names (default: each input's ``name``, or
            ``input<i>`` for an unnamed one; made unique).
        on_end: Called on the run's loop with a branch's index and its :class:`EndOfStream`'s
            ``value`` when the branch ends its own stream, before the policy's ``ended``.
    """

    inputs: Sequence[MergeInput[T]]
    policy: MergePolicy
    name: str = "merge"
    labels: tuple[str, ...] = field(default=())
    on_end: Callable[[int, Any], None] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        inputs = tuple(self.inputs)
        if not inputs:
            raise ConfigError(f"{self.name}: no pipelines to merge")
        for p in inputs:
            if not isinstance(p, MergeInput):
                raise ConfigError(
                    f"{self.name} takes asyncflow pipelines, got {type(p).__name__}"
                )
        if not isinstance(self.policy, MergePolicy):
            raise ConfigError(f"{self.name}: policy must have open(epoch, branches)")
        labels = tuple(self.labels) or tuple(
            p.options.name if p.options.name != "pipeline" else f"input{i}"
            for i, p in enumerate(inputs)
        )
        if len(labels) != len(inputs):
            raise ConfigError(f"{self.name}: {len(inputs)} inputs need {len(inputs)} labels")
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "labels", tuple(unique_names(labels)))

    def describe(self) -> dict[str, Any]:
        """``{"type": "Merge", "name": ..., "inputs": [labels]}`` for ``describe()``."""
        return {"type": "Merge", "name": self.name, "inputs": list(self.labels)}

    def __call__(self) -> NoReturn:
        """A merge is not an iterable to open: the run builds its inputs as branches. Called,
        it says so (a feature that wraps a run plan's ``open_source`` must pass a
        ``Merge`` on as it is).

        Raises:
            ConfigError: Always.
        """
        raise ConfigError(
            f"the merge {self.name!r} was opened as a plain source: a run builds a Merge's "
            "inputs as branches of its graph, so a run plan must pass it on as its "
            "open_source, unwrapped"
        )


@dataclass(frozen=True)
class Branch:
    """One new epoch of a pipeline, to be built into a run: a merge's input, as a branch of
    the merging run (``PipelineCore._branch()``), or the pipeline's own (``build_run``)."""

    plan: RunPlan
    stages: tuple[StageSpec, ...]
    epoch: int
    start: int
    pools: PoolHolder


@dataclass(eq=False)
class BranchRun:
    """A branch built into a run: its nodes' contexts (a contiguous part of the run's graph,
    nested branches included), those the merge starts (nested merges start their own
    branches), the channel it ends in, and what the merge applies to its items."""

    contexts: list[NodeContext]
    starts: list[NodeContext]
    output: Any
    hooks: tuple[Callable[[Any], Any], ...]
    scope: RunScope
    window: Window | None = None
    counts: list[tuple[int, int, int]] | None = None  # its stages' (in, out, failed) at start
    items: list[Any] = field(default_factory=list)
    pos: int = 0
    live: bool = True
    received: int = 0  # items taken from its output, before its end
    ended: EndOfStream | None = None  # the marker that ended its stream


class RunGraph(Protocol):
    """What the merge node needs of its run's graph (a ``_graph.Graph``): the stages' tasks
    by context, the contexts of those that failed, and what starts stages' tasks (set while
    the run runs)."""

    tasks: dict[Any, asyncio.Task[None]]
    failed: set[NodeContext]
    spawn: Callable[[Sequence[NodeContext]], None] | None


#: Rebuilds branch ``i`` (its old run given) as a new epoch, installed in the run's graph.
Rebuild = Callable[[int, BranchRun], Awaitable[BranchRun]]


class MergeNode:
    """The merge: takes the branches' items in the order the policy chooses.

    Args:
        ctx: The node's context (its counters; its epoch numbers the merge's runs).
        merge: The merge (its policy, and ``on_end``).
        branches: The branches as first built, not started.
        graph: The run's graph: its stages' tasks (the merge starts, stops and waits for its
            branches'), and the contexts of those that failed.
        rebuild: Builds a new epoch of a branch into the run (the merge starts it).
        ledger: Records which branch item (of which era: an epoch of the input, a restart
            begins the next) each output is, and passes over the choices a resumed run had
            settled, telling the policy where an era settled in full ran out
            (``_merge_resume.py``).
        gate: Awaited before the branches start (``RunPlan.gate``).
    """

    def __init__(
        self,
        ctx: NodeContext,
        merge: Merge[Any],
        branches: list[BranchRun],
        graph: RunGraph,
        rebuild: Rebuild,
        ledger: MergeLedger,
        gate: SourceGate | None = None,
    ) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self.merge = merge
        self.gate = gate
        self.branches = branches
        self._graph = graph
        self._rebuild = rebuild
        self._credits = ctx.window if isinstance(ctx.window, BranchCredits) else None

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        """Take items until the policy ends the merge, a branch fails, or the run stops.

        Cancellation:
            Stops the branches still running (their tasks are cancelled); items taken and
            not yet put out are dropped.
        """
        pending: list[Any] = []
        try:
            if self.gate is not None and not await self.gate():
                return
            for branch in self.branches:
                self._start(branch)
            chooser = self.merge.policy.open(self.ctx.epoch, len(self.branches))
            ledger = self.ledger
            while (choice := chooser.choose()) is not None:
                i = self._index(choice)
                branch = self.branches[i]
                if (what := ledger.pick(i)) != TAKE:
                    if what == END:  # an era settled in full before a resume ran out
                        ledger.ended(i, self._verdict(chooser, i, empty=ledger.ran_out(i)))
                    continue  # else passed over: settled before a resume
                if branch.pos >= len(branch.items):
                    await self._flush(pending, out)
                    if not await self._refill(branch):
                        if not await self._ended(i, branch, chooser):
                            return
                        continue
                item = branch.items[branch.pos]
                branch.items[branch.pos] = None  # the merge's reference is not kept
                branch.pos += 1
                ledger.take(i)
                if self._credits is not None:
                    self._credits.owe(branch.window)
                pending.append(item)
                if len(pending) >= _FLUSH:
                    await self._flush(pending, out)
            await self._flush(pending, out)
        finally:
            for branch in self.branches:
                self._stop(branch)

    def _index(self, choice: Any) -> int:
        """The branch the policy chose, checked: an index of a live branch."""
        try:
            i = -1 if isinstance(choice, bool) else operator.index(choice)
        except TypeError:
            i = -1
        if not 0 <= i < len(self.branches):
            raise ConfigError(f"merge policy chose branch {choice!r} of {len(self.branches)}")
        if not self.branches[i].live:
            raise ConfigError(f"merge policy chose branch {choice}, which it had dropped")
        return i

    async def _flush(self, pending: list[Any], out: Sender) -> None:
        if pending:
            items = pending[:]
            pending.clear()
            await out.put_many(items)
            self.ctx.produced(count_items(items))

    async def _refill(self, branch: BranchRun) -> bool:
        """Take the branch's next items; False when it has run out. Items that receive
        hooks finish (a copy, say) are taken one at a time, so that few wait finished."""
        if branch.ended is not None:
            return False
        items = await branch.output.get_many(1 if branch.hooks else _TAKE)
        end = next((k for k, item in enumerate(items) if isinstance(item, EndOfStream)), None)
        if end is not None:
            branch.ended = items[end]
            del items[end:]
        if not items:
            return False
        branch.received += len(items)
        self.ctx.counters.items_in += count_items(items)
        if branch.hooks:
            items = await self.ctx.run_sync(apply_hooks, branch.hooks, items)
        branch.items, branch.pos = items, 0
        return True

    async def _ended(self, i: int, branch: BranchRun, chooser: MergeChooser) -> bool:
        """Branch ``i`` ran out: drop or restart it; False when the merge ends."""
        empty = self.ledger.ran_out(i)
        if branch.ended is not None:  # its source may go on: stop its stages
            self._stop(branch)
        await self._settle(branch)
        if branch.ended is not None:
            count_to_end([c.counters for c in branch.contexts], branch.counts, branch.received)
            if self.merge.on_end is not None:
                self.merge.on_end(i, branch.ended.value)
        if any(ctx in self._graph.failed for ctx in branch.contexts):
            return False  # the run fails with the branch's error
        verdict = self._verdict(chooser, i, empty=empty)
        self.ledger.ended(i, verdict)  # a restart: the branch's next era
        if verdict == "stop":
            return False
        await self._retire(branch)
        if verdict == "restart":
            self.branches[i] = await self._rebuild(i, branch)
            self._start(self.branches[i])
        return True

    @staticmethod
    def _verdict(chooser: MergeChooser, i: int, *, empty: bool) -> BranchEnd:
        verdict = chooser.ended(i, empty=empty)
        if verdict not in _ENDS:
            raise ConfigError(f"merge policy: ended() returned {verdict!r}, not one of {_ENDS}")
        return verdict

    def _start(self, branch: BranchRun) -> None:
        assert self._graph.spawn is not None  # the run is running
        self._graph.spawn(branch.starts)

    def _stop(self, branch: BranchRun) -> None:
        branch.live = False
        for ctx in branch.contexts:
            task = self._graph.tasks.get(ctx)
            if task is not None and not task.done():
                task.cancel()

    async def _settle(self, branch: BranchRun) -> None:
        """Wait until the stages of a branch that ran out have ended (its last channel is
        closed, so they are ending).

        Cancellation:
            Safe: stops waiting; the run's stop cancels the branch's tasks as well.
        """
        branch.live = False
        tasks = [t for ctx in branch.contexts if (t := self._graph.tasks.get(ctx)) is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _retire(self, branch: BranchRun) -> None:
        """Release what an ended branch holds: its stop callbacks (on a worker thread: they
        may wait for worker processes) and its run scope."""
        await self.ctx.run_sync(retire_callbacks, branch.contexts)
        await branch.scope.aclose()


def retire_callbacks(contexts: Sequence[NodeContext]) -> None:
    """Call (once) the stop callbacks of the stages of a branch that has ended."""
    for ctx in contexts:
        ctx.call_stop_callbacks()
