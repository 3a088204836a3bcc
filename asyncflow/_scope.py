"""Async resources that live exactly as long as one pipeline run.

A run of a pipeline creates a :class:`RunScope` on its event loop and makes it current (a
context variable, so every stage task inherits it). Stage functions such as
``asyncflow.read_bytes`` ask the current scope for a shared resource (an aiohttp session, an
S3 client) by key; the scope creates it once, on first use, and closes every resource it
created when the run stops, whether the run ended, failed or was cancelled.

Each stage task of a run also has the run's epoch current (:func:`current_epoch`): the number
its pipeline gave the run (a merge branch's stages: the epoch of its input that the branch
reads). The pipeline owns the count (``pipeline/_shared_source.py``: ``set_epoch`` and
``load_state_dict`` set it); a source or stage that depends on the epoch (a listing's shuffle,
a cache's replay order) reads it here rather than counting runs itself.

This module sits below both ``pipeline/`` and ``sources/`` so that neither imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "RunScope", "aclose_scopes", "current_epoch", "current_scope", "use_epoch", "use_scope",
]

T = TypeVar("T")

_current: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar(
    "asyncflow_run_scope", default=None
)
_epoch: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "asyncflow_run_epoch", default=None
)


class RunScope:
    """Shared async resources of one run, closed together when the run stops.

    Args:
        settings: Read-only options for the resources (for example ``retry`` and
            ``timeout`` given to ``Pipeline(...)``); stage functions read them with
            ``scope.settings.get(name)``.
    """

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings: Mapping[str, Any] = MappingProxyType(dict(settings or {}))
        self._stack = contextlib.AsyncExitStack()
        self._resources: dict[str, Any] = {}
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._closed = False
        self._closing: asyncio.Task[None] | None = None
        self._reports: list[Callable[[], Iterable[str]]] = []

    def add_report(self, report: Callable[[], Iterable[str]]) -> None:
        """Have ``report()`` add lines to the run's ``stats().notes`` (a host's window, say).

        It is called at every snapshot, from any thread, during the run and after it.
        """
        self._reports.append(report)

    def reports(self) -> list[str]:
        """The lines of every report added, in order."""
        return [line for report in list(self._reports) for line in report()]

    async def get(self, key: str,
                  factory: Callable[[], contextlib.AbstractAsyncContextManager[T]]) -> T:
        """Return the resource stored under ``key``, entering ``factory()`` on first use.

        Concurrent first calls for one key share a single creation.

        Raises:
            RuntimeError: The scope is already closed, or closed while the resource opened
                (the resource is closed then).

        Cancellation:
            Cancelling a caller that waits for another caller's creation leaves that creation
            running; cancelling the creating caller cancels the creation and the next caller
            tries again.
        """
        if key in self._resources:
            return self._resources[key]  # type: ignore[no-any-return]
        if self._closed:
            raise RuntimeError("this run has stopped; its resources are closed")
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            resource = await self._stack.enter_async_context(factory())
            if self._closed:  # the run stopped while it opened: closed now, not leaked
                await self.aclose()  # the close under way ends first
                await self._stack.aclose()
                raise RuntimeError("this run has stopped; its resources are closed")
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            elif not fut.done():
                fut.set_exception(exc)
                fut.exception()  # marks it retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            del self._pending[key]
        self._resources[key] = resource
        fut.set_result(resource)
        return resource

    async def aclose(self) -> None:
        """Close every resource, newest first. Safe to call more than once.

        Cancellation:
            The close runs to its end all the same, then the cancellation is re-raised: a
            resource left half-closed (an HTTP session's connections) would outlive the run's
            event loop, and only be found, unclosed, when that loop closes.
        """
        self._closed = True
        self._resources.clear()
        if self._closing is None:
            # A task of its own, so that cancelling a caller does not cut the close short.
            self._closing = asyncio.get_running_loop().create_task(self._stack.aclose())
        await _finish(self._closing)


async def _finish(task: asyncio.Task[None]) -> None:
    """Wait for ``task`` to end, through any cancellation of the caller; re-raise that
    cancellation after, else ``task``'s own outcome."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:  # caught only to finish the close; re-raised below
            # The caller was cancelled, even when the close ended in the same step: a
            # cancellation swallowed here would let a stopped merge start a branch again.
            # (The close itself cancelled is re-raised by task.result() below.)
            cancelled = cancelled or not (task.done() and task.cancelled())
    if cancelled:
        raise asyncio.CancelledError
    task.result()


async def aclose_scopes(scopes: Iterable[RunScope]) -> None:
    """Close every one of ``scopes``, in order, even when one fails or the caller is cancelled.

    Raises:
        Exception: The first failure of a close, once every scope has been closed.

    Cancellation:
        Every close runs to its end (see :meth:`RunScope.aclose`), then the cancellation is
        re-raised.
    """
    cancelled = False
    failure: Exception | None = None
    for scope in scopes:
        try:
            await scope.aclose()
        except asyncio.CancelledError:  # the scope is closed all the same; re-raised below
            cancelled = True
        except Exception as exc:
            failure = failure or exc
    if cancelled:
        raise asyncio.CancelledError
    if failure is not None:
        raise failure


def current_scope() -> RunScope | None:
    """The scope of the run whose stage is calling, or ``None`` outside any run."""
    return _current.get()


def current_epoch() -> int | None:
    """The epoch of the pipeline run whose stage (or source) is calling: a merge branch's is
    the epoch of its input that it reads. ``None`` outside any run.

    It is set in each stage task of a run (its source's factory, an async stage function, a
    custom node) and in what they hand to ``run_thread``; a sync map function, called on the
    run's worker threads, does not see it (a custom node reads ``ctx.epoch``).

    Read it when an epoch begins (a source factory called by the run, a stage's first item):
    it is the one count of the run's epochs, which ``Pipeline.set_epoch`` and
    ``load_state_dict`` set.
    """
    return _epoch.get()


def use_scope(scope: RunScope | None) -> contextlib.AbstractContextManager[None]:
    """Make ``scope`` current for the block (and the tasks created inside it)."""
    return _using(_current, scope)


def use_epoch(epoch: int | None) -> contextlib.AbstractContextManager[None]:
    """Make ``epoch`` the run's epoch for the block (and the tasks created inside it): the
    engine starts each stage task of a run so, with that stage's epoch."""
    return _using(_epoch, epoch)


@contextlib.contextmanager
def _using(var: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
