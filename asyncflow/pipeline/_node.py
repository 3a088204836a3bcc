"""What every stage of a run is given: its counters, its failure budget, and the run's
thread pool, scope and hooks; and which node each kind of stage spec builds (``node_for``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import InitVar, dataclass, field
from typing import Any, TypeVar

from .._errors import ConfigError
from .._redact import describe_item, format_exception
from .._scope import RunScope
from ..workers import WorkerPool
from ._failures import FailureBudget
from ._lineage import Lineage
from ._protocols import Node, ReceiveHook, Receiver, Sender
from ._stats import StageCounters
from ._window import Window

logger = logging.getLogger("asyncflow")

__all__ = [
    "ItemKeys", "Node", "NodeContext", "ReceiveHook", "Receiver", "Sender", "apply_hooks",
    "make_node", "node_for",
]

S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Node])

#: The node factory of each spec class: ``factory(ctx, spec) -> Node``.
_FACTORIES: dict[type, Callable[[NodeContext, Any], Node]] = {}


def node_for(spec_class: type[S]) -> Callable[[F], F]:
    """Register what builds a run's node for each stage of ``spec_class`` (and of its
    subclasses that register none): a node class or function called as
    ``factory(ctx, spec)``. A stage is a spec and its node; the spec module never imports the
    node's (EXTENDING.md, "A stage of a new kind")::

        @node_for(MySpec)
        class MyNode:
            def __init__(self, ctx: NodeContext, spec: MySpec) -> None: ...

    Registering a class again replaces its factory (a test double, say).
    """
    if not isinstance(spec_class, type):
        raise ConfigError(f"node_for() needs a spec class, got {spec_class!r}")

    def register(factory: F) -> F:
        _FACTORIES[spec_class] = factory
        return factory

    return register


def make_node(ctx: NodeContext, spec: object) -> Node:
    """The node of ``spec``'s stage for one run, from the factory registered for the closest
    class of ``spec`` (:func:`node_for`).

    Raises:
        ConfigError: No node is registered for the spec's class.
    """
    for cls in type(spec).__mro__:
        factory = _FACTORIES.get(cls)
        if factory is not None:
            return factory(ctx, spec)
    raise ConfigError(f"stage {ctx.name!r}: no node is registered for {type(spec).__name__} "
                      "(register one with asyncflow.pipeline.node_for)")


def apply_hooks(hooks: Sequence[ReceiveHook], items: list[Any]) -> list[Any]:
    """``items``, each passed through ``hooks`` in order (receive hooks applied to a chunk
    where the consumer does not apply them: a merge's branch, a cache fill's upstream)."""
    out = []
    for item in items:
        for hook in hooks:
            item = hook(item)
        out.append(item)
    return out


@dataclass(slots=True)
class ItemKeys:
    """A run's source's seed keys (``seeding.KeyedIterator``), shared by the stages in step
    with the source: set by the source node once it has opened its iterator."""

    key: Callable[[int], int] | None = None  # of the iterator's item i (at plan.first + i)


@dataclass(eq=False, repr=False, kw_only=True)
class NodeContext:
    """Everything a node of one run may use (a context is compared and hashed by identity).

    Attributes:
        name: The stage's unique name in this run.
        index: Its position (the source is 0).
        counters: Its live statistics.
        budget: Its failure budget.
        stop: Set when the run is stopping; long sync work should check it.
        scope: The run's shared async resources.
        epoch: How many runs of this pipeline started before this one.
    """

    name: str
    index: int
    counters: StageCounters
    budget: FailureBudget
    pool: InitVar[WorkerPool]
    stop: threading.Event
    scope: RunScope
    epoch: int
    executor: Executor | None = None
    #: The stage's worker processes (a ``ProcessPool``), when it runs on processes.
    processes: Any = None
    #: The position in the epoch of the stage's first input item (non-zero when a resumed
    #: run starts part-way and the stages before map source items 1:1).
    start: int = 0
    receive_hooks: list[ReceiveHook] = field(default_factory=list)
    stop_callbacks: list[Callable[[], None]] = field(default_factory=list)
    #: The run's lineage (``_lineage.py``): where the node's ledger, if any, belongs.
    lineage: Lineage = field(default_factory=Lineage)
    #: Whether the stages before this one map source items 1:1, in order.
    in_step: bool = False
    #: The source's seed keys (shared by the stages of a run's chain).
    item_keys: ItemKeys = field(default_factory=ItemKeys)
    #: The run's window (``Pipeline(window=...)``), for a stage of the run's own chain.
    window: Window | None = None

    def __post_init__(self, pool: WorkerPool) -> None:
        self._pool = pool  # the run's threads, which run_sync submits to

    def positions(self, taken: int, count: int) -> tuple[int, int]:
        """The source position of the stage's input item ``taken`` (counted from
        :attr:`start`), and how many of the ``count`` items from it have consecutive
        positions (a resumed run leaves settled positions out). For a stage in step with the
        source; any other gets ``(taken, count)``."""
        if not self.in_step:
            return taken, count
        ordinal = taken - self.start
        low, high = self.lineage.source.positions(ordinal, ordinal + count)[0]
        return low, high - low

    def seed_keys(self, first: int, count: int) -> list[int] | None:
        """The per-item seed keys of ``count`` consecutive source positions from ``first``
        (as :meth:`positions` gives them), when the source names them
        (``seeding.KeyedIterator``) and the stage is in step with it; ``None`` otherwise: the
        positions are the keys."""
        key = self.item_keys.key
        if key is None or not self.in_step:
            return None
        start = first - self.lineage.source.plan.first  # the iterator's item 0 is there
        return [key(i) for i in range(start, start + count)]

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the run's worker threads (or the stage's executor).

        Cancellation:
            Cancelling abandons the result; a call already running finishes on its thread.
        """
        if self.executor is not None:
            return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        return self._pool.stages.submit(asyncio.get_running_loop(), self.name, fn, *args)

    async def run_timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`run_sync`, counted as the stage's work: one chunk, in flight meanwhile, and
        the call's time on its worker added to the stage's busy time (as a map stage's
        function is), so that ``stats()`` and stall detection see a custom stage's work.

        Raises:
            Exception: What ``fn`` raised (its time is counted all the same).

        Cancellation:
            As :meth:`run_sync`; a cancelled call's time is not counted.
        """
        counters = self.counters
        counters.chunks += 1
        counters.in_flight += 1
        try:
            error, value, elapsed = await self.run_sync(_timed, fn, *args)
        finally:
            counters.in_flight -= 1
        counters.busy += elapsed
        if error is not None:
            raise error
        return value

    def produced(self, count: int = 1) -> None:
        """Count ``count`` items put out (what ``stats()`` and stall detection read)."""
        self.counters.items_out += count
        self.counters.last_progress = time.monotonic()

    def dropped(self, count: int = 1) -> None:
        """Say that the stage dropped ``count`` items it took, making nothing of them (a
        filter does; a failure within the budget is counted by :meth:`item_failed`): a
        run's window lets as many more in. A stage that drops items without saying so
        holds a run with a window back until it has none free, and then forever."""
        if self.window is not None:
            self.window.give(count)

    def add_receive_hook(self, hook: ReceiveHook) -> None:
        """Apply ``hook`` to each item in the consumer's thread, before it is yielded."""
        self.receive_hooks.append(hook)

    def add_stop_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the run stops (on whichever thread stops it)."""
        self.stop_callbacks.append(callback)

    def call_stop_callbacks(self) -> None:
        """Call the stop callbacks, each at most once, on this thread; a failing one is
        logged and the others still run (the run, or the branch of a merge, has ended)."""
        callbacks, self.stop_callbacks = self.stop_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:
                logger.error(
                    "asyncflow: stop callback of stage %r failed: %s", self.name,
                    format_exception(exc),
                )

    def item_failed(self, item: Any, exc: BaseException) -> None:
        """Count a failed item; raise ``exc`` (with a note) once the budget is exceeded."""
        counters = self.counters
        text = describe_item(item)
        counters.record(text, exc)
        if self.budget.allows(counters.failures, max(counters.items_in, 1)):
            self.budget.log_skip(text, exc)
            self.dropped()
            return
        exc.add_note(
            f"asyncflow: stage {self.name!r} ({counters.kind} #{self.index}) failed on item "
            f"{text} ({counters.failures} failure(s); max_failures={self.budget.limit})"
        )
        raise exc


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Exception | None, Any, float]:
    """``fn(*args)`` on a worker: ``(error, value, seconds)``, the error returned, not raised,
    so that a failed call's time counts too."""
    start = time.perf_counter()
    try:
        value = fn(*args)
    except Exception as exc:
        return exc, None, time.perf_counter() - start
    return None, value, time.perf_counter() - start
