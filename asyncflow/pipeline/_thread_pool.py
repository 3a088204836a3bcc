"""A run's worker threads: ``WorkerPool``, shared by the sync stages and the loop-side helpers.

The stages' sync calls (a map's chunks, a source iterator's advance, a custom stage's
``run_timed``) and the helpers that features run off the loop (file reads, lock files, cache
writes: :func:`run_thread`, ``asyncio.to_thread``, ``run_in_executor(None, ...)``) share one
pool per run. The pool is the run loop's default executor, so code that knows nothing of
asyncflow lands on it too.

Helpers have a reserve of their own (:data:`HELPER_THREADS`): the pool holds one thread per
sync call the stages can have in flight plus that reserve, and at most that many helper calls
run at once (the rest wait their turn), so helpers can neither starve the stages' calls nor
deadlock them by taking their threads.

The threads are daemon threads named ``asyncflow-<pipeline>-worker-<n>``: a function stuck in
C code cannot block interpreter exit, and the run reports which stage it abandoned.

The run whose loop runs in a thread (:class:`RunLocal`) is set by the run's loop thread for its
lifetime: :func:`run_thread` finds the run's pool there, and :func:`run_failed` its failures.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ._loop import settle_soon
from ._pool import PoolStats

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


class WorkerPool:
    """Daemon threads, started on demand, that run one run's sync work.

    Args:
        size: The most threads for the stages: the sum of the sync stages' concurrencies
            (plus one for the source), so a stage never waits for a thread another holds.
        name: Prefix of the threads' names.
        helpers: The most helper calls (:meth:`submit_helper`) running at once, on threads
            of their own beyond ``size``.
    """

    def __init__(self, size: int, name: str, helpers: int = HELPER_THREADS) -> None:
        self._size = max(1, size) + max(0, helpers)
        self._helpers = max(1, helpers)
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy: dict[int, str] = {}
        self._lock = threading.Lock()
        self._idle = 0
        self._closed = False
        self._helping = 0
        self._waiting: collections.deque[tuple[Any, ...]] = collections.deque()
        self.executor = _Executor(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def name(self) -> str:
        return self._name

    def submit(
        self, loop: asyncio.AbstractEventLoop, label: str, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Run a stage's ``fn(*args)`` on a worker; the returned future (of ``loop``) gets
        its result.

        Raises:
            RuntimeError: The pool is shut down.

        Cancellation:
            Cancelling the future abandons the result; a call already running finishes on
            its thread.
        """
        fut = loop.create_future()
        self._put((settle_soon, (loop, fut), label, fn, args), helper=False)
        return fut

    def submit_helper(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """:meth:`submit` for a loop-side helper: within the helpers' reserve, queued while
        it is full.

        Cancellation:
            As :meth:`submit`: the call still runs (once its turn comes, if queued).
        """
        fut = loop.create_future()
        self._put((settle_soon, (loop, fut), HELPER, fn, args), helper=True)
        return fut

    def _put(self, job: tuple[Any, ...], *, helper: bool) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("worker pool is shut down")
            if helper:
                if self._helping >= self._helpers:
                    self._waiting.append(job)
                    return
                self._helping += 1
            self._reserve_thread()
        self._jobs.put((*job, helper))

    def _reserve_thread(self) -> None:
        # Called with the lock held: an idle thread takes the job, or a new one starts.
        if self._idle == 0 and len(self._threads) < self._size:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        else:
            self._idle -= 1

    def _work(self) -> None:
        ident = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            # settle(*where, ...): settle_soon with (loop, future), or a concurrent future's
            settle, where, label, fn, args, helper = job
            self._busy[ident] = label
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting caller, not swallowed
                error = exc
            self._busy.pop(ident, None)
            with self._lock:
                self._idle += 1
                if helper:
                    self._helping -= 1
                    if self._waiting and not self._closed:
                        self._helping += 1
                        self._reserve_thread()
                        self._jobs.put((*self._waiting.popleft(), True))
            settle(*where, result, error)
            del where, result, error, job, args

    def statistics(self) -> PoolStats:
        """The pool now (any thread)."""
        with self._lock:
            workers = sum(t.is_alive() for t in self._threads)
        return PoolStats(kind="threads", name=self._name, size=self._size, workers=workers,
                         busy=len(self._busy))

    def shutdown(self, timeout: float = 2.0) -> list[str]:
        """Stop the threads; return the labels of calls still running after ``timeout``.

        Helper calls still queued are dropped: their callers get a ``RuntimeError``.
        """
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            waiting, self._waiting = list(self._waiting), collections.deque()
        for settle, where, *_ in waiting:
            settle(*where, None, RuntimeError("worker pool is shut down"))
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [self._busy.get(t.ident or 0, "?") for t in threads if t.is_alive()]


class _Executor(ThreadPoolExecutor):
    """The pool as a run loop's default executor: each call a helper call.

    A ``ThreadPoolExecutor`` by type only (asyncio's ``set_default_executor`` insists on
    one); it starts no thread of its own. Its ``shutdown`` only refuses further calls: the
    run shuts the pool down itself, after the loop.
    """

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(max_workers=1, thread_name_prefix=pool.name)
        self._pool = pool

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: Future[T] = Future()
        call = functools.partial(fn, *args, **kwargs)
        self._pool._put((_settle_concurrent, (fut,), HELPER, call, ()), helper=True)
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
    result: T = await run.pool.submit_helper(asyncio.get_running_loop(), call)
    return result
