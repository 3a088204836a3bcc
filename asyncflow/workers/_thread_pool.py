"""A run's worker threads: ``WorkerPool``, shared by the sync stages and the loop-side helpers.

The stages' sync calls (a map's chunks, a source iterator's advance, a custom stage's
``run_timed``) and the helpers that features run off the loop (file reads, lock files, cache
writes: :func:`run_thread`, ``asyncio.to_thread``, ``run_in_executor(None, ...)``) share one
pool per run. The pool is the run loop's default executor, so code that knows nothing of
asyncflow lands on it too.

Helpers have threads of their own (:data:`HELPER_THREADS`), beside one thread per sync call
the stages can have in flight; helper calls beyond them wait their turn, so helpers can neither
starve the stages' calls nor deadlock them by taking their threads.

The threads are daemon threads named ``asyncflow-<pipeline>-worker-<n>``: a function stuck in
C code cannot block interpreter exit, and the run reports which stage it abandoned.

The run whose loop runs in a thread (:class:`RunLocal`) is set by the run's loop thread for its
lifetime: :func:`run_thread` finds the run's pool there, and :func:`run_failed` its failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ._settle import settle_soon

__all__ = ["HELPER_THREADS", "RunLocal", "WorkerPool", "enter_run", "run_failed", "run_thread"]

T = TypeVar("T")

#: Threads a run keeps for loop-side helpers, beyond those of its stages.
HELPER_THREADS = 4

#: The label of a helper's call (what a stop reports, should it still run).
HELPER = "helper"


def _settle_concurrent(fut: Future[Any], result: Any, error: BaseException | None) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class Threads:
    """Daemon threads, started on demand up to ``size``, that run calls from one queue; the
    calls beyond ``size`` wait their turn there."""

    def __init__(self, size: int, name: str, numbers: Iterator[int], busy: dict[int, str]):
        self._size = size
        self._name = name
        self._numbers = numbers  # the pool's, so that no two of its threads share a name
        self._busy = busy  # thread ident: the label of the call it runs (the pool's)
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call, less the calls queued
        self._lock = threading.Lock()
        self.closed = False

    def submit(
        self, loop: asyncio.AbstractEventLoop, label: str, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on one of the threads; the returned future (of ``loop``) gets its
        result.

        Raises:
            RuntimeError: The pool is shut down.

        Cancellation:
            Cancelling the future abandons the result; a call already running (or queued)
            still runs on its thread.
        """
        fut = loop.create_future()
        self.put((settle_soon, (loop, fut), label, fn, args))
        return fut

    def put(self, call: tuple[Any, ...]) -> None:
        """Queue ``(settle, where, label, fn, args)``: ``settle(*where, result, error)`` is
        called with what ``fn(*args)`` returned or raised."""
        with self._lock:
            if self.closed:
                raise RuntimeError("worker pool is shut down")
            if self._idle == 0 and len(self._threads) < self._size:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{next(self._numbers)}")
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        self._calls.put(call)

    def _work(self) -> None:
        ident = threading.get_ident()
        while (call := self._calls.get()) is not None:
            settle, where, label, fn, args = call
            self._busy[ident] = label
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting caller, not swallowed
                error = exc
            self._busy.pop(ident, None)
            with self._lock:
                self._idle += 1
            settle(*where, result, error)
            del where, result, error, call, args

    def stop(self) -> list[threading.Thread]:
        """Refuse further calls, drop those queued beyond the threads (waiting for one to be
        free: their callers get a ``RuntimeError``) and end each thread once the calls it
        was given have run (a file's close among them); its threads."""
        queued: list[Any] = []
        with self._lock:
            self.closed = True
            threads = list(self._threads)
            beyond = max(0, -self._idle)  # the calls queued with no thread free for them
            with contextlib.suppress(queue.Empty):
                while True:
                    queued.append(self._calls.get_nowait())
        keep = max(0, len(queued) - beyond)  # the first ones: a thread takes each in turn
        for call in queued[:keep]:
            self._calls.put(call)
        for settle, where, *_ in queued[keep:]:
            settle(*where, None, RuntimeError("worker pool is shut down"))
        for _ in threads:
            self._calls.put(None)
        return threads


class WorkerPool:
    """One run's threads: those of its stages, and a reserve of loop-side helpers' own.

    Args:
        size: The most threads for the stages: the sum of the sync stages' concurrencies
            (plus one for the source), so a stage never waits for a thread another holds.
        name: Prefix of the threads' names.
        helpers: The most helper calls running at once, on threads of their own.

    Attributes:
        stages: The stages' threads (their calls labelled with the stage's name).
        helpers: The helpers' threads (:func:`run_thread`, the loop's default executor).
    """

    def __init__(self, size: int, name: str, helpers: int = HELPER_THREADS) -> None:
        numbers = itertools.count()
        self._busy: dict[int, str] = {}
        self.stages = Threads(max(1, size), name, numbers, self._busy)
        self.helpers = Threads(max(1, helpers), name, numbers, self._busy)
        self.executor = _Executor(self.helpers, name)

    @property
    def closed(self) -> bool:
        return self.stages.closed

    def shutdown(self, timeout: float = 2.0) -> list[str]:
        """Stop the threads; return the labels of calls still running after ``timeout``.

        Calls still queued are dropped: their callers get a ``RuntimeError``.
        """
        threads = self.stages.stop() + self.helpers.stop()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [self._busy.get(t.ident or 0, "?") for t in threads if t.is_alive()]


class _Executor(ThreadPoolExecutor):
    """The helpers' threads as a run loop's default executor.

    A ``ThreadPoolExecutor`` by type only (asyncio's ``set_default_executor`` insists on
    one); it starts no thread of its own. Its ``shutdown`` does nothing: the run shuts the
    pool down itself, after the loop.
    """

    def __init__(self, helpers: Threads, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._helpers = helpers

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: Future[T] = Future()
        call = functools.partial(fn, *args, **kwargs)
        self._helpers.put((_settle_concurrent, (fut,), HELPER, call, ()))
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


@dataclass(frozen=True)
class RunLocal:
    """What code running on a run's loop thread may reach of its run.

    Attributes:
        pool: The run's thread pool, which :func:`run_thread` uses.
        errors: The run's failures so far (appended as stages fail).
    """

    pool: WorkerPool
    errors: list[BaseException]


_local = threading.local()


def enter_run(run: RunLocal | None) -> None:
    """Make ``run`` the run of this thread (its loop thread); ``None``: no run."""
    _local.run = run


def current_run() -> RunLocal | None:
    """The run whose event loop runs in this thread, else None."""
    return getattr(_local, "run", None)


def run_failed() -> bool:
    """Whether a stage of the run whose loop runs in this thread has failed so far.

    A stage that ends its output because its input ended cannot tell an end from a failure
    before it (the failing stage ends its output stream, so later stages drain what was
    made before the failure): a stage that must act only on a complete stream (a cache
    committing what it wrote) asks this when its input ends. ``False`` outside a run.
    """
    run = current_run()
    return run is not None and bool(run.errors)


async def run_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` on a worker thread and wait for its result.

    On a run's loop (in a stage, a source, a hook on the run's thread) the call goes to the
    run's thread pool, within the threads it keeps for such helpers; elsewhere it is
    ``asyncio.to_thread``. Context variables are copied, as ``asyncio.to_thread`` does.

    Raises:
        Exception: What ``fn`` raised.

    Cancellation:
        Cancelling stops the wait; a call already running finishes on its thread and its
        result is dropped (the run waits for its threads before it ends).
    """
    run = current_run()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    if run is None or run.pool.closed:
        return await asyncio.to_thread(call)
    result: T = await run.pool.helpers.submit(asyncio.get_running_loop(), HELPER, call)
    return result
