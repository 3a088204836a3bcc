"""The consumer's handle on one run: iteration (``for`` / ``async for``), lifetime, stats."""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self

from .._errors import StallError
from ._bridge import Handoff
from ._cursor import REFILL, Cursor
from ._lineage import Lineage, received
from ._protocols import Closable, ConsumerHook
from ._stats import FailureRecord, PipelineStats

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    from ._runtime import Runtime

    # The item type of a pipeline and of its runs. Its default makes a bare ``Pipeline`` or
    # ``Run`` annotation mean ``Pipeline[Any]``, as it did before they were generic.
    T_co = TypeVar("T_co", covariant=True, default=Any)
else:
    from typing import TypeVar

    T_co = TypeVar("T_co", covariant=True)  # typing.TypeVar takes a default from 3.13 on

__all__ = ["ConsumerHook", "Run"]


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
    ) -> None:
        self._make_runtime: Callable[[], Runtime] | None = make_runtime
        self._timeout = timeout
        self._hook_factories = hooks
        self._rt: Runtime | None = None
        self._ended: _Ended | None = None  # what a closed run keeps (see _shed)
        # The latest chunk, shared by the consumers (``_cursor.py``).
        self._cursor = Cursor()
        self._closed = False
        self._hooks: list[ConsumerHook] = []
        self._finalizer: weakref.finalize[Any, Any] | None = None
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
            assert self._make_runtime is not None  # dropped only when closed
            rt = self._rt = self._make_runtime()
            self._finalizer = weakref.finalize(self, rt.request_stop)
            rt.consumer = weakref.ref(self)
            self._hooks = [factory(self) for factory in self._hook_factories]
            self._cursor.use([*rt.graph.receive_hooks, *self._hooks])
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
        rt = self._closing()
        if rt is not None:
            rt.join(rt.options.stop_timeout + 5.0)
            self._finish_close(rt)

    async def aclose(self) -> None:
        """Like :meth:`close`, waiting on the caller's loop instead of blocking it.

        Cancellation:
            Cancelling the wait leaves the run stopping by itself.
        """
        rt = self._closing()
        if rt is not None:
            await rt.wait_done()
            rt.join(1.0)
            self._finish_close(rt)

    def _closing(self) -> Runtime | None:
        """Mark the run closed, drop its chunk and ask its runtime to stop. Returns the
        runtime to wait for; ``None`` if the run was closed already (consumers in several
        threads may close it at once) or never started (then it is shed here)."""
        with self._start_lock:
            if self._closed:
                return None
            self._closed = True
        self._cursor.clear()
        rt = self._rt
        if rt is None:
            self._shed()
        elif not rt.done:
            rt.request_stop()
        return rt

    def _finish_close(self, rt: Runtime) -> None:
        """The stopped run's last steps: its error reported where no consumer waits for it,
        its hooks closed, its runtime shed."""
        rt.report_undelivered()
        self._detach()
        self._shed()

    def _shed(self) -> None:
        """Keep only the figures of a closed run whose thread has ended: its pipeline (and
        so the pipeline's persistent workers and batch slabs), runtime, stages and
        undelivered items are released when the run ends, not when the last reference to
        this handle goes (a kept ``PipelineError``'s traceback holds it)."""
        self._make_runtime, self._hook_factories = None, ()
        self._cursor.apply = None
        rt = self._rt
        if rt is None or not rt.done:
            return  # still stopping (a stage abandoned): it keeps what it holds until then
        rt.delivered -= len(rt.chunk)  # first: a state taken meanwhile counts less, not more
        rt.chunk = ()
        self._ended = _Ended(rt.epoch, rt.delivered, rt.snapshot(), self.failure_records())
        self._rt = None

    def _detach(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            if isinstance(hook, Closable):
                hook.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T_co:
        try:  # no lock: with hooks to call one item at a time, this chunk is always empty
            item: T_co = self._cursor.free.popleft()  # no cast(): a call per item
            return item
        except IndexError:
            pass
        while (item := self._cursor.claim_sync()) is REFILL:
            chunk: list[Any] | None = None
            try:
                chunk = self._fetch_sync()
            finally:
                self._refilled_with(chunk)
        return item

    def _refilled_with(self, chunk: list[Any] | None) -> None:
        """End a refill: hand the chunk to every consumer, wake the waiting ones."""
        cursor = self._cursor
        with cursor.lock:
            rt = self._rt
            if chunk and rt is not None and not self._closed:
                # the chunk first: a state taken meanwhile counts it as not received yet
                rt.chunk = items = deque(chunk)
                cursor.install(items)
                rt.delivered += len(chunk)
            cursor.refilled()

    @property
    def reading(self) -> bool:
        """Whether a consumer is waiting for this run's next items now (a stop from
        another thread then leaves the run's error to it instead of reporting it)."""
        return self._cursor.refilling

    def _handoff(self) -> Handoff | None:
        """The run's hand-off, starting the run; ``None`` once it is closed. (The frames an
        error passes through hold it, not the runtime: see :meth:`_shed`.)"""
        rt = self._start()
        return None if rt is None else rt.handoff

    def _fetch_sync(self) -> list[Any]:
        """The next chunk from the run; ``StopIteration`` at its end (or once closed)."""
        handoff = self._handoff()
        if handoff is None:
            raise StopIteration
        try:
            chunk = handoff.get_chunk(self._timeout)
        except TimeoutError:
            self.close()
            raise self._stalled() from None
        except BaseException:
            self.close()
            raise
        if not chunk:
            self.close()
            raise StopIteration
        return chunk

    def _stalled(self) -> StallError:
        """The error of a consumer that waited ``timeout`` seconds for an item in vain (the
        run closed), naming the busiest stage where one is known."""
        busiest = self.stats().bottleneck
        where = "" if busiest is None else f" (stats: {busiest!r} is the busiest stage)"
        return StallError(
            f"no item arrived within timeout={self._timeout} s; the pipeline is stalled{where}"
        )

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T_co:
        try:
            item: T_co = self._cursor.free.popleft()  # no cast(): a call per item
            return item
        except IndexError:
            pass
        while (item := await self._cursor.claim_async()) is REFILL:
            chunk: list[Any] | None = None
            try:
                handoff = self._handoff()
                chunk = [] if handoff is None else await self._refill_async(handoff)
            finally:
                self._refilled_with(chunk)
            if not chunk:
                raise StopAsyncIteration
        return item

    async def _refill_async(self, handoff: Handoff) -> list[Any]:
        try:
            chunk = await handoff.aget_chunk(self._timeout)
        except TimeoutError:
            await self.aclose()
            raise self._stalled() from None
        except Exception:
            await self.aclose()
            raise
        except BaseException:
            # Cancelled (a kernel interrupt, a task torn down) or Ctrl-C: the consumer is going
            # away. Stop the run now, without awaiting anything more in this task.
            if self._closing() is not None:
                self._detach()
            raise
        if not chunk:
            await self.aclose()
        return chunk

    # -- introspection ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch this run reads, as its stages see it (``0`` before it starts)."""
        ended = self._ended
        return ended.epoch if ended else 0 if self._rt is None else self._rt.epoch

    @property
    def lineage(self) -> Lineage | None:
        """The run's lineage (``None`` before it starts and once closed): which source
        positions the output numbered ``ordinal`` was made from (``trace(ordinal)``),
        keeping records from ``ordinal`` on until traced (``hold(ordinal)``), and where a
        resumed run started (``resumed``). For features that record what each output was
        made from."""
        return None if self._rt is None else self._rt.lineage

    def failure_records(self) -> list[list[FailureRecord]]:
        """Each stage's failures so far, in run order (copies; the first ones of each stage,
        as ``stats().failures`` lists them)."""
        if self._ended is not None:
            return [list(records) for records in self._ended.failures]
        rt = self._rt
        return [] if rt is None else [list(ctx.counters.records) for ctx in rt.contexts]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def delivered(self) -> int:
        """Items handed to the consumer so far."""
        if self._ended is not None:
            return self._ended.delivered
        rt = self._rt
        return 0 if rt is None else received(rt.delivered, rt.chunk)

    def stats(self) -> PipelineStats:
        """Statistics of this run so far."""
        if self._ended is not None:
            return self._ended.stats
        return PipelineStats() if self._rt is None else self._rt.snapshot()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._rt else "not started")
        return f"<asyncflow.Run {state}, {self.delivered} delivered>"


@dataclass(frozen=True)
class _Ended:
    """What a closed run keeps of its runtime (``Run._shed``)."""

    epoch: int
    delivered: int
    stats: PipelineStats
    failures: list[list[FailureRecord]]

