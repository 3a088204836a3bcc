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
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence, Sized
from typing import Any

from .._redact import describe_exception, format_exception
from .._scope import aclose_scopes, use_epoch, use_scope
from ..workers import RunLocal, enter_run, settle_soon
from ._bridge import Handoff
from ._channel import ChannelAborted
from ._failures import final_error, flatten, mark_abandoned, note_stage, release_frames
from ._graph import Graph, RunResources
from ._loop import LIVE_RUNS, cancel_pending
from ._monitor import Monitor
from ._node import NodeContext
from ._stats import PipelineStats, find_bottleneck

__all__ = ["Runtime"]

logger = logging.getLogger("asyncflow")

#: How often KeyboardInterrupt / SystemExit may escape the run's loop before it gives up
#: running the loop and goes straight to clean-up.
_MAX_ESCAPES = 8


class Runtime:
    """The data plane of one run. Built in the consumer's thread, run on its own thread.

    Args:
        graph: The run's stages (``_build.build_run``).
        run: What its stages share: its loop, worker threads, stop event and scope.
    """

    #: How many errors the run had when a stop was requested (those after it are its echo);
    #: ``None`` until a stop is requested.
    _errors_at_stop: int | None = None

    def __init__(self, graph: Graph, run: RunResources) -> None:
        options = self.options = run.options
        self.loop, self.pool, self.stop_event, self.scope = run.loop, run.pool, run.stop, run.scope
        self.errors: list[BaseException] = []
        self.delivered = 0  # handed over in chunks; taken: ``received(delivered, chunk)``
        self.chunk: Sized = ()  # what the consumer has not taken of its latest chunk
        self.consumer: Callable[[], Any] | None = None  # weak reference to the Run
        self.started_at = time.monotonic()
        self.finished_at: float | None = None
        self.graph = graph
        self.epoch = run.epoch
        self.lineage = graph.lineage
        self.contexts = graph.contexts
        self.notes: list[str] = [*options.notes, *graph.notes]
        self.handoff: Handoff = graph.outputs[-1]
        # the consumer surely has every item but those of the chunk it is working through
        self.lineage.follow(lambda: self.delivered - self.handoff.take_size)
        self.monitor = Monitor(graph.contexts, graph.outputs, graph.tasks, options)
        self.thread = threading.Thread(
            target=self._thread_main, name=f"asyncflow-{options.name}", daemon=True
        )
        self._main_task: asyncio.Task[None] | None = None
        self._started = False
        self._done = threading.Event()
        self._done_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the run's thread. Its handle (``Run``) calls it once, before any stop."""
        with self._lock:
            self._started = True
            self.started_at = time.monotonic()
            LIVE_RUNS.add(self)  # stopped at interpreter exit, should it still be going
        self.thread.start()

    def request_stop(self) -> None:
        """Ask the run to stop: drop undelivered items, cancel every stage. Thread-safe,
        idempotent, never blocks (also called by the garbage collector)."""
        with self._lock:
            if self._errors_at_stop is not None:
                return
            self._errors_at_stop = len(self.errors)
            started = self._started
        self.lineage.freeze()  # what the torn-down stages do from now on settles nothing
        self.stop_event.set()
        self.graph.close_windows()
        # A failure before the stop still reaches a consumer waiting for items.
        self.handoff.abort(self._final_error())
        if not started:  # nothing ran: the stages' resources are released here
            for ctx in self.contexts:
                ctx.call_stop_callbacks()
            self.loop.close()
            self._done.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed: the run has ended
            self.loop.call_soon_threadsafe(self._cancel_main)

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

    async def wait_done(self) -> None:
        """Wait, on the caller's loop, until the run's thread has finished its clean-up.

        Cancellation:
            Safe: stops waiting; the run goes on stopping by itself.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done.is_set() or not self._started:
                return
            self._done_waiters.append((loop, fut))
        await fut

    def _thread_main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        # run_thread() on this loop uses the run's threads; run_failed() reads its errors
        enter_run(RunLocal(self.pool, self.errors))
        try:
            self._run_loop(loop)
        finally:
            self._cleanup(loop)
            enter_run(None)

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
            self._cleanup_failed("clean-up", exc)
        finally:
            # Whatever failed above, the consumer's loop must end.
            self.finished_at = time.monotonic()
            release_frames(self.errors)  # a kept error keeps nothing the run used
            self.handoff.close(self._final_error())
            if self._errors_at_stop is not None:  # a stop was requested
                self.report_undelivered()
            with self._lock:
                self._done.set()
                waiters, self._done_waiters = self._done_waiters, []
            for waiter_loop, fut in waiters:
                settle_soon(waiter_loop, fut)

    def _close_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            cancel_pending(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        except BaseException as exc:  # clean-up goes on; the error is reported, not raised
            self._cleanup_failed("clean-up of the run's loop", exc)
        try:
            stuck = self.pool.shutdown(self.options.stop_timeout)
        finally:
            for ctx in self.contexts:
                ctx.call_stop_callbacks()
            asyncio.set_event_loop(None)
            loop.close()
        self.notes.extend(mark_abandoned(stuck, self.contexts, self.options.stop_timeout))

    def _cleanup_failed(self, what: str, exc: BaseException) -> None:
        """Report a failed step of the clean-up; a ``BaseException`` (``KeyboardInterrupt``)
        also reaches the consumer, as a crash does."""
        logger.warning("asyncflow run %r: %s failed: %s", self.options.name, what,
                       format_exception(exc))
        if not isinstance(exc, Exception):
            self._crashed(exc)

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

    def _final_error(self) -> BaseException | None:
        """What the consumer gets after the items: ``None``, a :class:`PipelineError` of the
        stages' exceptions, or a ``BaseException`` raised in a stage (``KeyboardInterrupt``,
        ``SystemExit``), as itself. Failures after a requested stop are not counted. Never
        raises."""
        at = self._errors_at_stop
        return final_error(self.options.name, self.errors if at is None else self.errors[:at])

    # -- the run ------------------------------------------------------------------------

    async def _main(self) -> None:
        self._main_task = asyncio.current_task()
        if self.stop_event.is_set():
            return
        sampler = None
        with use_scope(self.scope):
            try:
                async with asyncio.TaskGroup() as tg:
                    self.graph.spawn = spawn = functools.partial(self._spawn, tg)
                    spawn([c for c in self.contexts if c not in self.graph.deferred])
                    sampler = asyncio.create_task(self.monitor.run(self.snapshot))
            finally:
                self.graph.spawn = None
                try:
                    if sampler is not None:
                        sampler.cancel()
                        await asyncio.gather(sampler, return_exceptions=True)
                finally:
                    # A stop may cancel this task again, here or above (a run that ended
                    # just as its consumer closed it): every scope is closed all the same,
                    # before the loop ends, or its sessions' connections outlive the loop.
                    await aclose_scopes([*self.graph.scopes, self.scope])  # branches' first

    def _spawn(self, group: asyncio.TaskGroup, contexts: Sequence[NodeContext]) -> None:
        """Start the tasks of the stages of ``contexts``, each with its stage's run scope
        and epoch current (the run starts its own stages so; a merge node, its branches')."""
        graph = self.graph
        position = {id(ctx): index for index, ctx in enumerate(graph.contexts)}
        for ctx in contexts:
            index = position[id(ctx)]
            inp = graph.outputs[index - 1] if ctx.index else None  # the chain's previous stage's
            with use_scope(ctx.scope), use_epoch(ctx.epoch):
                coro = self._run_node(ctx, graph.nodes[index], inp, graph.outputs[index])
                try:
                    graph.tasks[ctx] = group.create_task(coro)
                except BaseException:  # a group shutting down: the coroutine never runs
                    coro.close()
                    raise

    async def _run_node(self, ctx: NodeContext, node: Any, inp: Any, out: Any) -> None:
        try:
            await node.run(inp, out)
            # every stage's failure budget, at its end (every item failed; a fraction over)
            counters = ctx.counters
            ctx.budget.check_end(counters.failures, counters.items_in, counters.records)
        except asyncio.CancelledError:
            stall = self.monitor.stalled.get(ctx)
            if stall is None or self.stop_event.is_set():
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._fail(ctx, inp, out, [stall])
        except BaseException as exc:
            failures = [e for e in flatten(exc)
                        if not isinstance(e, ChannelAborted | asyncio.CancelledError)]
            if not isinstance(exc, Exception):
                # KeyboardInterrupt, SystemExit, GeneratorExit: caught only to be forwarded,
                # as itself, to the consumer, after the items already handed over; the run
                # stops.
                self._fail(ctx, inp, out, failures or [exc])
                self.stop_event.set()
                self._cancel_main()
            elif failures:
                self._fail(ctx, inp, out, failures)
            elif inp is not None:  # aborted: the run is stopping
                inp.abort()
        else:
            if out is not self.handoff:
                out.close()  # the hand-off is closed last, with the run's error, in _cleanup

    def _fail(self, ctx: NodeContext, inp: Any, out: Any, failures: list[BaseException]) -> None:
        self.graph.failed.add(ctx)
        self.lineage.freeze()
        self.graph.close_windows()  # the items it held never reach the consumer
        for exc in failures:
            note_stage(exc, ctx)
            if not any(e is exc for e in self.errors):
                self.errors.append(exc)
        if out is not self.handoff:
            out.close()
        if inp is not None:
            inp.abort()

    # -- statistics ---------------------------------------------------------------------

    def snapshot(self) -> PipelineStats:
        """Statistics of the run so far, from its stages' counters (any thread)."""
        end = self.finished_at if self.finished_at is not None else time.monotonic()
        elapsed = max(0.0, end - self.started_at) if self._started else 0.0
        stages = tuple(ctx.counters.snapshot(elapsed) for ctx in self.contexts)
        fullness = self.contexts[-1].counters.full_area / elapsed if elapsed else 0.0
        return PipelineStats(
            stages=stages, elapsed=elapsed, delivered=self.delivered,
            running=self._started and not self._done.is_set(),
            bottleneck=find_bottleneck(stages, fullness),
            notes=(*self.notes, *(line for scope in (self.scope, *self.graph.scopes)
                                  for line in scope.reports())),
            loop_delay_max=self.monitor.loop_delay_max,
        )
