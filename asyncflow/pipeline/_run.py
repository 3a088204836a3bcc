"""One run (one epoch) of a pipeline: its loop thread, stage tasks, channels and stopping.

The data plane runs on a fresh event loop (uvloop when installed) in a daemon thread of its
own, so that a consumer blocking its thread or loop (a synchronous training step) does not
stop loading, and so that plain ``for`` works in a thread whose loop is already running
(Jupyter). Stage failures do not tear the run down at once: the failing stage ends its
output stream, later stages drain what was produced before the failure, and the consumer
receives those items and then a :class:`PipelineError`.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import PipelineError, StallError
from .._redact import describe_exception, format_exception
from .._scope import RunScope, use_scope
from ._bridge import Handoff
from ._channel import Channel, ChannelAborted
from ._failures import FailureBudget
from ._map import MapNode
from ._node import Node, NodeContext, ReceiveHook
from ._offload import WorkerPool
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
from ._stats import PipelineStats, StageCounters, find_bottleneck

__all__ = ["PoolHolder", "RunOptions", "Runtime"]

logger = logging.getLogger("asyncflow")

_UNBATCHED_BUFFER = 64
_SAMPLE_EVERY = 0.05
#: How often KeyboardInterrupt / SystemExit may escape the run's loop before it gives up
#: running the loop and goes straight to clean-up.
_MAX_ESCAPES = 8


@dataclass(frozen=True)
class RunOptions:
    """Pipeline-wide settings of a run (see :class:`~asyncflow.Pipeline`)."""

    name: str = "pipeline"
    max_failures: int | float = 0
    stall_timeout: float | None = None
    report_every: float | None = None
    stop_timeout: float = 2.0
    settings: tuple[tuple[str, Any], ...] = ()
    source_buffer: int | None = None
    notes: tuple[str, ...] = ()
    buffer_bytes: int | None = None


class PoolHolder:
    """The persistent worker-process pools of one pipeline object, by stage index.

    They stop when the holder (the pipeline object) is garbage-collected, or at exit.
    """

    def __init__(self) -> None:
        self.pools: dict[int, Any] = {}
        self._lock = threading.Lock()
        weakref.finalize(self, _shutdown_pools, self.pools)

    def get(self, index: int, make: Callable[[], Any]) -> Any:
        with self._lock:
            pool = self.pools.get(index)
            if pool is None or pool.closed:
                pool = self.pools[index] = make()
            return pool

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop every persistent worker now."""
        _shutdown_pools(self.pools, timeout)


def _shutdown_pools(pools: dict[int, Any], timeout: float = 2.0) -> None:
    for pool in list(pools.values()):
        pool.shutdown(timeout)
    pools.clear()


def _new_loop() -> asyncio.AbstractEventLoop:
    if os.environ.get("ASYNCFLOW_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _default_capacity(spec: StageSpec | None, batched: bool) -> int:
    if isinstance(spec, PrefetchSpec):
        return spec.size
    buffer = getattr(spec, "buffer", None)
    if buffer is not None:
        return int(buffer)
    concurrency = spec.concurrency_ if spec is not None else 1
    return max(2, 2 * concurrency) if batched else max(_UNBATCHED_BUFFER, 2 * concurrency)


def _flatten(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _flatten(sub)]
    return [exc]


class Runtime:
    """The data plane of one run. Built in the consumer's thread, run on its own thread.

    Args:
        open_source: Returns the source iterable for this run.
        specs: The stages after the source.
        options: Pipeline-wide settings.
        epoch: How many runs of the pipeline started before this one.
    """

    #: How many errors the run had when a stop was requested (those after it are its echo).
    _errors_at_stop: int | None = None

    def __init__(
        self,
        open_source: Callable[[], Any],
        specs: Sequence[StageSpec],
        options: RunOptions,
        epoch: int,
        pools: PoolHolder | None = None,
        start: int = 0,
    ) -> None:
        self.options = options
        self._pools = pools if pools is not None else PoolHolder()
        self.loop = _new_loop()
        self.stop_event = threading.Event()
        self.scope = RunScope(dict(options.settings))
        self.errors: list[BaseException] = []
        self.notes: list[str] = list(options.notes)
        self.delivered = 0
        self.start_offset = start  # source items skipped by a resumed run
        self.consumer: Callable[[], Any] | None = None  # weak reference to the Run
        self.started_at = time.monotonic()
        self.finished_at: float | None = None
        self.loop_delay_max = 0.0
        threads = 1 + sum(
            s.concurrency_ for s in specs
            if (isinstance(s, MapSpec) and not s.is_async and s.executor is None
                and s.processes is None)
            or isinstance(s, CustomSpec)
        )
        self.pool = WorkerPool(threads, f"asyncflow-{options.name}-worker")
        self.contexts: list[NodeContext] = []
        self.nodes: list[Node] = []
        self.outputs: list[Any] = []
        self._build(open_source, specs, epoch)
        self.handoff: Handoff = self.outputs[-1]
        self.receive_hooks: list[ReceiveHook] = [h for c in self.contexts for h in c.receive_hooks]
        self.thread = threading.Thread(
            target=self._thread_main, name=f"asyncflow-{options.name}", daemon=True
        )
        self._main_task: asyncio.Task[None] | None = None
        self._node_tasks: dict[int, asyncio.Task[None]] = {}
        self._stalled: dict[int, StallError] = {}
        self._stop_requested = False
        self._started = False
        self._done = threading.Event()
        self._done_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()

    # -- building -----------------------------------------------------------------------

    def _build(
        self, open_source: Callable[[], Any], specs: Sequence[StageSpec], epoch: int
    ) -> None:
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
            base = "source" if spec is None else (spec.name or spec.default_name())
            name, n = base, 2
            while name in names:
                name, n = f"{base}#{n}", n + 1
            names.add(name)
            capacity = _default_capacity(spec, batched)
            if spec is None and self.options.source_buffer is not None:
                capacity = self.options.source_buffer
            last = index == len(stages) - 1
            max_bytes = getattr(spec, "buffer_bytes", None) or self.options.buffer_bytes
            output: Any = (
                Handoff(capacity, self.loop, max_bytes) if last else Channel(capacity, max_bytes)
            )
            concurrency = 1 if spec is None else spec.concurrency_
            counters = StageCounters(name, kind, concurrency, capacity)
            counters.output = output
            limit = getattr(spec, "max_failures", None)
            budget = FailureBudget(self.options.max_failures if limit is None else limit, name)
            ctx = NodeContext(
                name=name, index=index, counters=counters, budget=budget, pool=self.pool,
                stop=self.stop_event, scope=self.scope, epoch=epoch,
                executor=getattr(spec, "executor", None),
            )
            if in_step:
                ctx.start = self.start_offset  # positions count from the resumed one
            in_step = in_step and (spec is None or (
                isinstance(spec, MapSpec) and spec.mode == "map" and spec.ordered
            ) or isinstance(spec, PrefetchSpec))
            if isinstance(spec, MapSpec) and spec.processes is not None:
                ctx.processes = self._process_pool(index, spec, name, ctx)
            if isinstance(spec, MapSpec) and spec.note:
                self.notes.append(f"stage {name!r} runs on {spec.note}")
            self.contexts.append(ctx)
            self.outputs.append(output)
            self.nodes.append(self._make_node(ctx, spec, open_source, capacity))

    def _process_pool(self, index: int, spec: MapSpec, name: str, ctx: NodeContext) -> Any:
        from ._procpool import ProcessPool

        assert spec.processes is not None
        processes = spec.processes

        def make() -> ProcessPool:
            return ProcessPool(spec.fn, spec.concurrency, processes, name)

        if processes.persistent:
            return self._pools.get(index, make)
        pool = make()
        ctx.add_stop_callback(lambda: pool.shutdown(self.options.stop_timeout))
        return pool

    @staticmethod
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

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the run's thread (once)."""
        with self._lock:
            if self._started or self._stop_requested:
                return
            self._started = True
            self.started_at = time.monotonic()
            _LIVE.add(self)
        self.thread.start()

    def request_stop(self) -> None:
        """Ask the run to stop: drop undelivered items, cancel every stage. Thread-safe,
        idempotent, never blocks (also called by the garbage collector)."""
        with self._lock:
            if self._stop_requested:
                return
            self._stop_requested = True
            self._errors_at_stop = len(self.errors)
            started = self._started
        self.stop_event.set()
        # A failure before the stop still reaches a consumer waiting for items.
        self.handoff.abort(self._final_error())
        if not started:
            self._finish_unstarted()
            return
        try:
            self.loop.call_soon_threadsafe(self._cancel_main)
        except RuntimeError:  # the loop already closed: the run has ended
            pass

    def _finish_unstarted(self) -> None:
        for ctx in self.contexts:
            self._call_stop_callbacks(ctx)
        if not self.loop.is_closed():
            self.loop.close()
        self._done.set()

    def _cancel_main(self) -> None:
        if self._main_task is not None and not self._main_task.done():
            self._main_task.cancel()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the run's thread to end; True if it did."""
        if self._started:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    async def wait_done(self) -> None:
        """Wait, on the caller's loop, until the run's thread has finished its clean-up.

        Cancellation:
            Safe: stops waiting; the run goes on stopping by itself.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._done.is_set() and self._started:
                self._done_waiters.append((loop, fut))
            else:
                fut.set_result(None)
        await fut

    def _thread_main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            self._run_loop(loop)
        finally:
            self._cleanup(loop)

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        # KeyboardInterrupt and SystemExit raised in any task escape run_until_complete at
        # once, leaving the other tasks pending: record the exception, stop the stages, and
        # run the loop again until the main task has finished.
        main = loop.create_task(self._main())
        for _ in range(_MAX_ESCAPES):
            try:
                loop.run_until_complete(main)
            except asyncio.CancelledError:
                pass  # stopped
            except BaseException as exc:  # forwarded to the consumer, never lost
                self._crashed(exc)
            if main.done():
                return
            self.stop_event.set()
            main.cancel()

    def _crashed(self, exc: BaseException) -> None:
        if any(e is exc for e in self.errors):
            return
        if isinstance(exc, Exception):
            logger.error(
                "asyncflow run %r crashed: %s", self.options.name, format_exception(exc)
            )
        self.errors.append(exc)

    def _cleanup(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._close_loop(loop)
            at = self._errors_at_stop
            for exc in self.errors[len(self.errors) if at is None else at:]:
                logger.debug(
                    "asyncflow pipeline %r: failed after the stop: %s", self.options.name,
                    describe_exception(exc),
                )
        except BaseException as exc:  # reported; the hand-off is closed below all the same
            logger.warning(
                "asyncflow run %r: clean-up failed: %s", self.options.name,
                format_exception(exc),
            )
            if not isinstance(exc, Exception):
                self._crashed(exc)
        finally:
            # Whatever failed above, the consumer's loop must end.
            self.finished_at = time.monotonic()
            self.handoff.close(self._final_error())
            if self._stop_requested:
                self.report_undelivered()
            with self._lock:
                self._done.set()
                waiters, self._done_waiters = self._done_waiters, []
            for waiter_loop, fut in waiters:
                try:
                    waiter_loop.call_soon_threadsafe(_resolve, fut)
                except RuntimeError:
                    pass

    def _close_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            _cancel_pending(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        except BaseException as exc:  # clean-up goes on; the error is reported, not raised
            logger.warning(
                "asyncflow run %r: clean-up of the run's loop failed: %s",
                self.options.name, format_exception(exc),
            )
            if not isinstance(exc, Exception):
                self._crashed(exc)
        try:
            stuck = self.pool.shutdown(self.options.stop_timeout)
        finally:
            for ctx in self.contexts:
                self._call_stop_callbacks(ctx)
            asyncio.set_event_loop(None)
            loop.close()
        for label in stuck:
            for ctx in self.contexts:
                if ctx.name == label:
                    ctx.counters.abandoned = True
            note = (
                f"stage {label!r} was abandoned: its function was still running "
                f"{self.options.stop_timeout:.1f} s after the run stopped (stuck in C code?); "
                "its daemon thread will not block interpreter exit"
            )
            self.notes.append(note)
            logger.warning("asyncflow: %s", note)

    def report_undelivered(self) -> None:
        """The consumer has left: a failure it was never given is noted and logged, not lost.

        A ``break`` never raises afterwards; the run's error goes to ``stats().notes`` and
        to a warning instead. Thread-safe; reports at most once.
        """
        run = self.consumer() if self.consumer is not None else None
        if run is not None and run.reading:
            return  # a consumer is waiting for items: it gets the error itself
        error = self.handoff.take_pending()
        if error is None:
            return
        note = (
            "the consumer stopped before it was given the run's error: "
            f"{describe_exception(error)}"
        )
        self.notes.append(note)
        logger.warning("asyncflow pipeline %r: %s", self.options.name, note)

    @staticmethod
    def _call_stop_callbacks(ctx: NodeContext) -> None:
        callbacks, ctx.stop_callbacks = ctx.stop_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:
                logger.error(
                    "asyncflow: stop callback of stage %r failed: %s", ctx.name,
                    format_exception(exc),
                )

    def _final_error(self) -> BaseException | None:
        """What the consumer gets after the items: ``None``, a :class:`PipelineError` of the
        stages' exceptions, or a ``BaseException`` raised in a stage (``KeyboardInterrupt``,
        ``SystemExit``), as itself. Failures after a requested stop are not counted. Never
        raises."""
        at = self._errors_at_stop
        errors = list(self.errors if at is None else self.errors[:at])
        if not errors:
            return None
        try:
            return self._make_error(errors)
        except Exception as exc:  # never leave the hand-off open for want of a message
            logger.warning(
                "asyncflow run %r: building its error failed: %s", self.options.name,
                format_exception(exc),
            )
            return errors[0]

    def _make_error(self, errors: list[BaseException]) -> BaseException:
        fatal = next((e for e in errors if not isinstance(e, Exception)), None)
        if fatal is not None:
            others = [describe_exception(e) for e in errors if e is not fatal]
            note = "asyncflow: the run also failed with " + "; ".join(others)
            if others and note not in getattr(fatal, "__notes__", ()):
                fatal.add_note(note)
            return fatal
        failed: list[str] = []
        for exc in errors:
            stage = getattr(exc, "_asyncflow_stage", "?")
            if stage not in failed:
                failed.append(stage)
        where = ", ".join(repr(s) for s in failed)
        message = (
            f"pipeline {self.options.name!r} failed in stage {where}: "
            f"{describe_exception(errors[0])}"
        )
        return PipelineError(message, errors)  # type: ignore[arg-type]

    # -- the run ------------------------------------------------------------------------

    async def _main(self) -> None:
        self._main_task = asyncio.current_task()
        if self.stop_event.is_set():
            return
        sampler = None
        with use_scope(self.scope):
            try:
                async with asyncio.TaskGroup() as tg:
                    for index in range(len(self.nodes)):
                        self._node_tasks[index] = tg.create_task(self._run_node(index))
                    sampler = asyncio.create_task(self._sample())
            finally:
                if sampler is not None:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
                await self.scope.aclose()

    async def _run_node(self, index: int) -> None:
        node = self.nodes[index]
        inp = self.outputs[index - 1] if index else None
        out = self.outputs[index]
        ctx = self.contexts[index]
        ctx.budget.records = ctx.counters.records  # FailureBudgetExceeded carries them
        try:
            await node.run(inp, out)
        except asyncio.CancelledError:
            stall = self._stalled.get(index)
            if stall is None or self.stop_event.is_set():
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._fail(index, [stall])
        except Exception as exc:
            failures = [e for e in _flatten(exc) if not isinstance(e, ChannelAborted)]
            if failures:
                self._fail(index, failures)
            elif inp is not None:
                inp.abort()
        except BaseException as exc:
            # KeyboardInterrupt, SystemExit, GeneratorExit: caught only to be forwarded, as
            # itself, to the consumer, after the items already handed over; the run stops.
            leaves = [
                e for e in _flatten(exc)
                if not isinstance(e, ChannelAborted | asyncio.CancelledError)
            ]
            self._fail(index, leaves or [exc])
            self.stop_event.set()
            self._cancel_main()
        else:
            if index < len(self.nodes) - 1:
                out.close()  # the hand-off is closed last, with the run's error, in _cleanup

    def _fail(self, index: int, failures: list[BaseException]) -> None:
        ctx = self.contexts[index]
        for exc in failures:
            notes = getattr(exc, "__notes__", ())
            if not any(str(n).startswith("asyncflow: stage") for n in notes):
                exc.add_note(
                    f"asyncflow: stage {ctx.name!r} ({ctx.counters.kind} #{index}) failed "
                    f"after producing {ctx.counters.items_out} item(s)"
                )
            if getattr(exc, "_asyncflow_stage", None) is None:
                exc._asyncflow_stage = ctx.name  # type: ignore[attr-defined]
            if not any(e is exc for e in self.errors):
                self.errors.append(exc)
        if index < len(self.nodes) - 1:
            self.outputs[index].close()
        if index:
            self.outputs[index - 1].abort()

    async def _sample(self) -> None:
        last = time.monotonic()
        next_report = last + (self.options.report_every or float("inf"))
        stall = self.options.stall_timeout
        while True:
            await asyncio.sleep(_SAMPLE_EVERY)
            now = time.monotonic()
            # How late this wake-up came: the longest callback that held the loop meanwhile.
            self.loop_delay_max = max(self.loop_delay_max, now - last - _SAMPLE_EVERY)
            for index, ctx in enumerate(self.contexts):
                counters = ctx.counters
                counters.fill_area += len(self.outputs[index]) * (now - last)
                if stall is None or index in self._stalled:
                    continue
                silent = now - counters.last_progress
                output = self.outputs[index]
                if counters.in_flight and silent > stall and len(output) < output.capacity:
                    self._stalled[index] = StallError(
                        f"stage {ctx.name!r} has had work in hand and produced nothing for "
                        f"{silent:.1f} s (stall_timeout={stall} s)"
                    )
                    self._node_tasks[index].cancel()
            last = now
            if now >= next_report:
                next_report = now + (self.options.report_every or float("inf"))
                logger.info("asyncflow pipeline %r:\n%s", self.options.name, self.snapshot())

    # -- statistics ---------------------------------------------------------------------

    def snapshot(self) -> PipelineStats:
        """Statistics of the run so far (any thread)."""
        end = self.finished_at if self.finished_at is not None else time.monotonic()
        elapsed = max(0.0, end - self.started_at) if self._started else 0.0
        stages = tuple(ctx.counters.snapshot(elapsed) for ctx in self.contexts)
        handoff = self.contexts[-1].counters
        bottleneck = find_bottleneck(
            stages, handoff.fill_area / elapsed if elapsed else 0.0, handoff.capacity
        )
        return PipelineStats(
            stages=stages,
            elapsed=elapsed,
            delivered=self.delivered,
            running=self._started and not self._done.is_set(),
            bottleneck=bottleneck,
            notes=tuple(self.notes),
            loop_delay_max=self.loop_delay_max,
        )


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a crashed run left behind, and let them finish (as asyncio.run)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_LIVE: weakref.WeakSet[Runtime] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop runs still going at interpreter exit, so that their resources close cleanly."""
    runs = list(_LIVE)
    for run in runs:
        run.request_stop()
    deadline = time.monotonic() + 3.0
    for run in runs:
        run.join(max(0.0, deadline - time.monotonic()))
