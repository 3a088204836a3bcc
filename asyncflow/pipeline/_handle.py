"""The consumer's handle on one run: iteration (``for`` / ``async for``), lifetime, stats."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self

from .._errors import StallError
from ._lineage import TAKEN, Lineage, received
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
        self._chunk: list[Any] = []
        self._pos = 0
        self._closed = False
        self._apply: Callable[[Any], T_co] | None = None
        self._hooks: list[ConsumerHook] = []
        self._finalizer: weakref.finalize[Any, Any] | None = None
        # Consumers inside a refill (from before the run starts to the hand-off's answer): a
        # stop from another thread leaves the run's error for them instead of reporting it.
        self._reading = 0

    # -- lifetime -----------------------------------------------------------------------

    def _start(self) -> Runtime | None:
        if self._closed:
            return None  # a closed run yields nothing more, and raises nothing more
        if self._rt is not None:
            return self._rt
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
        self._chunk, self._pos = [], 0
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
        self._chunk, self._pos = [], 0
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
        self._chunk, self._pos = [], 0
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
        pos, chunk = self._pos, self._chunk
        if pos < len(chunk):
            item = chunk[pos]
            chunk[pos] = TAKEN  # the consumer owns it now: release our reference
            self._pos = pos + 1
            apply = self._apply
            return item if apply is None else apply(item)
        return self._refill_sync()

    def _refill_sync(self) -> T_co:
        self._reading += 1
        try:
            return self._refill_sync_reading()
        finally:
            self._reading -= 1

    @property
    def reading(self) -> bool:
        """Whether a consumer is waiting for this run's next items now."""
        return self._reading > 0

    def _refill_sync_reading(self) -> T_co:
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
        rt.delivered += len(chunk)
        self._chunk = rt.chunk = chunk
        self._pos = 0
        return self.__next__()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T_co:
        pos, chunk = self._pos, self._chunk
        if pos < len(chunk):
            item = chunk[pos]
            chunk[pos] = TAKEN
            self._pos = pos + 1
            apply = self._apply
            return item if apply is None else apply(item)
        self._reading += 1
        try:
            rt = self._start()
            chunk = [] if rt is None else await self._refill_async(rt)
        finally:
            self._reading -= 1
        if rt is None or not chunk:
            raise StopAsyncIteration
        rt.delivered += len(chunk)
        self._chunk = rt.chunk = chunk
        self._pos = 1
        item = chunk[0]
        chunk[0] = TAKEN
        apply = self._apply
        return item if apply is None else apply(item)

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


def _compose(functions: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    if len(functions) == 1:
        return functions[0]

    def apply(item: Any) -> Any:
        for fn in functions:
            item = fn(item)
        return item

    return apply
