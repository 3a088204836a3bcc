"""The consumer's handle on one run: iteration (``for`` / ``async for``), lifetime, stats."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, cast

from .._errors import StallError
from ._bridge import wake
from ._lineage import Lineage, received
from ._run import Runtime
from ._stats import FailureRecord, PipelineStats

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    # The item type of a pipeline and of its runs. Its default makes a bare ``Pipeline`` or
    # ``Run`` annotation mean ``Pipeline[Any]``, as it did before they were generic.
    T_co = TypeVar("T_co", covariant=True, default=Any)
else:
    from typing import TypeVar

    T_co = TypeVar("T_co", covariant=True)  # typing.TypeVar takes a default from 3.13 on

__all__ = ["ConsumerHook", "Run"]


class ConsumerHook(Protocol):
    """Per-run consumer-side hook built by a pipeline-level hook factory."""

    def __call__(self, item: Any) -> Any: ...

    def close(self) -> None: ...


class Run(Generic[T_co]):
    """One run (epoch) of a pipeline, from the consumer's side; it yields ``T_co`` items.

    Iterate it with ``for`` or ``async for``; items come in input order unless a stage says
    otherwise. Leaving a ``with`` / ``async with`` block, :meth:`close`, ``break`` followed by
    the iterator's release, or garbage collection stops every task and thread of the run.

    A run starts on first use: ``next()``, ``__anext__()``, or entering its context.

    Iteration is thread-safe: threads (and tasks on any loops) sharing one run each get
    different items, every item exactly once, in the order they ask; consumer-side hooks see
    one item at a time. The run's error is raised in the consumer that reads it; the others
    then end as at the end of the stream.
    """

    def __init__(
        self,
        make_runtime: Callable[[], Runtime],
        *,
        timeout: float | None = None,
        hooks: tuple[Callable[[Run[Any]], ConsumerHook], ...] = (),
        on_start: Callable[[Runtime, Run[Any]], None] | None = None,
    ) -> None:
        self._make_runtime = make_runtime
        self._timeout = timeout
        self._hook_factories = hooks
        self._on_start = on_start
        self._rt: Runtime | None = None
        # The items of the latest chunk not yet taken: ``popleft`` hands each to one consumer
        # (atomic: several threads may take from it at once) and drops its reference.
        self._chunk: deque[Any] = deque()
        self._closed = False
        self._apply: Callable[[Any], T_co] | None = None
        self._hooks: list[ConsumerHook] = []
        self._finalizer: weakref.finalize[Any, Any] | None = None
        # Consumers inside a refill (from before the run starts to the hand-off's answer): a
        # stop from another thread leaves the run's error for them instead of reporting it.
        self._reading = 0
        # Consumers in several threads or tasks share the chunk: one refills it at a time
        # while the others wait (threads on the condition, tasks on futures of their loops).
        self._lock = threading.Lock()
        self._refilled = threading.Condition(self._lock)
        self._refilling = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._start_lock = threading.Lock()

    # -- lifetime -----------------------------------------------------------------------

    def _start(self) -> Runtime | None:
        if self._closed:
            return None  # a closed run yields nothing more, and raises nothing more
        if self._rt is not None:
            return self._rt
        with self._start_lock:  # two threads starting it at once start one runtime
            if self._closed:
                return None
            if self._rt is not None:
                return self._rt
            return self._start_runtime()

    def _start_runtime(self) -> Runtime:
        rt = self._make_runtime()
        self._rt = rt
        self._finalizer = weakref.finalize(self, rt.request_stop)
        if self._on_start is not None:
            self._on_start(rt, self)
        self._hooks = [factory(self) for factory in self._hook_factories]
        functions: list[Callable[[Any], Any]] = [*rt.receive_hooks, *self._hooks]
        if functions:
            self._apply = _compose(functions)
        rt.start()
        return rt

    def start(self) -> Self:
        """Start loading now (iteration would start it anyway). Returns ``self``."""
        self._start()
        return self

    def close(self) -> None:
        """Stop the run and wait for its thread to end.

        Items not yet consumed are dropped. Safe to call more than once.

        Cancellation:
            Blocks the calling thread for at most the pipeline's ``stop_timeout`` plus a
            little; a stage stuck in C code is abandoned (and reported), not waited for.
        """
        if self._closed:
            return
        self._closed = True
        self._chunk = deque()
        rt = self._rt
        if rt is not None:
            if not rt.done:
                rt.request_stop()
            rt.join(rt.options.stop_timeout + 5.0)
            if not self.reading:  # else the waiting consumer gets the error itself
                rt.report_undelivered()
            self._detach()

    async def aclose(self) -> None:
        """Like :meth:`close`, waiting on the caller's loop instead of blocking it.

        Cancellation:
            Cancelling the wait leaves the run stopping by itself.
        """
        if self._closed:
            return
        self._closed = True
        self._chunk = deque()
        rt = self._rt
        if rt is not None:
            if not rt.done:
                rt.request_stop()
            await rt.wait_done()
            rt.join(1.0)
            if not self.reading:
                rt.report_undelivered()
            self._detach()

    def _abandon(self) -> None:
        """Stop without waiting (for cancellation paths, where awaiting is not possible)."""
        self._closed = True
        self._chunk = deque()
        if self._rt is not None:
            self._rt.request_stop()
            self._detach()

    def _detach(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            close = getattr(hook, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T_co:
        if self._apply is None:  # no hook to call one item at a time: no lock either
            try:
                return cast(T_co, self._chunk.popleft())
            except IndexError:
                pass
        return self._refill_sync()

    def _claim(self) -> Any:
        """An item (hooks applied), the right to refill (``_REFILL``), or ``_EMPTY``: another
        consumer is refilling (lock held)."""
        chunk = self._chunk
        if chunk:
            item = chunk.popleft()
            apply = self._apply
            return item if apply is None else apply(item)
        if self._refilling:
            return _EMPTY
        self._refilling = True
        self._reading += 1
        return _REFILL

    def _refilled_with(self, chunk: list[Any] | None) -> None:
        """End a refill: hand the chunk to every consumer, wake the waiting ones."""
        with self._lock:
            self._refilling = False
            self._reading -= 1
            rt = self._rt
            if chunk and rt is not None and not self._closed:
                # the chunk first: a state taken meanwhile counts it as not received yet
                self._chunk = rt.chunk = deque(chunk)
                rt.delivered += len(chunk)
            self._refilled.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            wake(loop, fut)

    def _refill_sync(self) -> T_co:
        """Wait for the next chunk, or for another consumer's refill; then take an item.

        Cancellation:
            The wait is interruptible by signals (Ctrl-C raises ``KeyboardInterrupt``).
        """
        while True:
            with self._lock:
                item = self._claim()
                if item is _EMPTY:
                    self._refilled.wait()
                    continue
            if item is not _REFILL:
                return cast(T_co, item)
            chunk: list[Any] | None = None
            try:
                chunk = self._fetch_sync()
            finally:
                self._refilled_with(chunk)

    @property
    def reading(self) -> bool:
        """Whether a consumer is waiting for this run's next items now."""
        return self._reading > 0

    def _fetch_sync(self) -> list[Any]:
        """The next chunk from the run; ``StopIteration`` at its end (or once closed)."""
        rt = self._start()
        if rt is None:
            raise StopIteration
        try:
            chunk = rt.handoff.get_chunk(self._timeout)
        except TimeoutError:
            self.close()
            raise StallError(
                f"no item arrived within timeout={self._timeout} s; the pipeline is stalled "
                f"(stats: {self.stats().bottleneck!r} is the busiest stage)"
            ) from None
        except BaseException:
            self.close()
            raise
        if not chunk:
            self.close()
            raise StopIteration
        return chunk

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T_co:
        if self._apply is None:
            try:
                return cast(T_co, self._chunk.popleft())
            except IndexError:
                pass
        return await self._refill_async_claim()

    async def _refill_async_claim(self) -> T_co:
        """Like :meth:`_refill_sync`, waiting on the caller's loop.

        Cancellation:
            Safe while it waits for another consumer's refill; cancelled during its own,
            it stops the run (see :meth:`_refill_async`).
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                item = self._claim()
                wait = loop.create_future() if item is _EMPTY else None
                if wait is not None:
                    self._waiters.append((loop, wait))
            if wait is not None:
                await wait
                continue
            if item is not _REFILL:
                return cast(T_co, item)
            chunk: list[Any] | None = None
            try:
                rt = self._start()
                chunk = [] if rt is None else await self._refill_async(rt)
            finally:
                self._refilled_with(chunk)
            if not chunk:
                raise StopAsyncIteration

    async def _refill_async(self, rt: Runtime) -> list[Any]:
        try:
            chunk = await rt.handoff.aget_chunk(self._timeout)
        except TimeoutError:
            await self.aclose()
            raise StallError(f"no item arrived within timeout={self._timeout} s") from None
        except Exception:
            await self.aclose()
            raise
        except BaseException:
            # Cancelled (a kernel interrupt, a task torn down) or Ctrl-C: the consumer is going
            # away. Stop the run now, without awaiting anything more in this task.
            self._abandon()
            raise
        if not chunk:
            await self.aclose()
        return chunk

    # -- introspection ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch this run reads, as its stages see it (``0`` before it starts)."""
        return 0 if self._rt is None else self._rt.epoch

    @property
    def lineage(self) -> Lineage | None:
        """The run's lineage (``None`` before it starts): which source positions the output
        numbered ``ordinal`` was made from (``trace(ordinal)``), keeping records from
        ``ordinal`` on until traced (``hold(ordinal)``), and where a resumed run started
        (``resumed``). For features that record what each output was made from."""
        return None if self._rt is None else self._rt.lineage

    def failure_records(self) -> list[list[FailureRecord]]:
        """Each stage's failures so far, in run order (copies; the first ones of each stage,
        as ``stats().failures`` lists them)."""
        return [] if self._rt is None else [list(c.counters.records) for c in self._rt.contexts]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def delivered(self) -> int:
        """Items handed to the consumer so far."""
        rt = self._rt
        return 0 if rt is None else received(rt.delivered, rt.chunk)  # after a close too

    def stats(self) -> PipelineStats:
        """Statistics of this run so far."""
        return PipelineStats() if self._rt is None else self._rt.snapshot()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._rt else "not started")
        return f"<asyncflow.Run {state}, {self.delivered} delivered>"


#: What the chunk gives when it has no item left (``_take``, ``_claim``).
_EMPTY: Any = object()
#: What ``_claim`` gives the one consumer that is to refill the chunk.
_REFILL: Any = object()


def _compose(functions: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    if len(functions) == 1:
        return functions[0]

    def apply(item: Any) -> Any:
        for fn in functions:
            item = fn(item)
        return item

    return apply
