"""Running synchronous stage functions off the loop, a chunk of items per hand-off.

A thread round trip costs tens of microseconds; a cheap function must not pay it per item. So
workers receive a *chunk* of items, call the function on each, and return all the results in
one hand-off. Chunks grow while the function is cheap and shrink to one item when it is slow,
so parallelism is not lost on expensive work.

The pool's threads are daemon threads owned by one run: a function stuck in C code cannot
block interpreter exit, and the run reports which stage it abandoned.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

from .._redact import redact

__all__ = ["FAILED", "ChunkResult", "WorkerPool", "next_chunk", "run_chunk", "run_chunk_remote"]

#: Marks a failed item's place in a chunk's results.
FAILED: Any = type("Failed", (), {"__repr__": lambda self: "<FAILED>"})()

#: (results with FAILED at failed places, [(index, exception)], seconds spent)
ChunkResult = tuple[list[Any], list[tuple[int, BaseException]], float]


def run_chunk(
    fn: Callable[[Any], Any], items: list[Any], stop: threading.Event | None
) -> ChunkResult:
    """Call ``fn`` on each item; exceptions are returned in place, not raised."""
    results: list[Any] = []
    failures: list[tuple[int, BaseException]] = []
    append = results.append
    start = time.perf_counter()
    for index, item in enumerate(items):
        if stop is not None and stop.is_set():
            break
        try:
            append(fn(item))
        except Exception as exc:
            append(FAILED)
            failures.append((index, exc))
    return results, failures, time.perf_counter() - start


def run_chunk_remote(fn: Callable[[Any], Any], items: list[Any]) -> ChunkResult:
    """:func:`run_chunk` for process pools: tracebacks travel as notes, since a returned
    exception loses its traceback when pickled."""
    results, failures, elapsed = run_chunk(fn, items, None)
    for _, exc in failures:
        exc.add_note(redact("".join(traceback.format_exception(exc)).rstrip()))
        exc.__traceback__ = None
    return results, failures, elapsed


def next_chunk(
    it: Iterator[Any], limit: int, budget: float = 0.005
) -> tuple[list[Any], bool, Exception | None]:
    """Advance ``it`` up to ``limit`` times or ``budget`` seconds.

    Returns:
        (items, exhausted, error): the items read, whether the iterator ended, and the
        exception it raised (the items before it are still returned, never lost).
    """
    items: list[Any] = []
    append = items.append
    deadline = time.perf_counter() + budget
    try:
        for _ in range(limit):
            append(next(it))
            if time.perf_counter() > deadline:
                break
    except StopIteration:
        return items, True, None
    except Exception as exc:
        return items, True, exc
    return items, False, None


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class WorkerPool:
    """Daemon threads, started on demand up to ``size``, that run one run's sync work.

    Args:
        size: The most threads; the sum of the sync stages' concurrencies, so a stage never
            waits for a thread another stage holds.
        name: Prefix of the threads' names.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = max(1, size)
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy: dict[int, str] = {}
        self._lock = threading.Lock()
        self._idle = 0
        self._closed = False

    def submit(
        self, loop: asyncio.AbstractEventLoop, label: str, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on a worker; the returned future (of ``loop``) gets its result.

        Cancellation:
            Cancelling the future abandons the result; a call already running finishes on
            its thread.
        """
        fut = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("worker pool is shut down")
            if self._idle == 0 and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        self._jobs.put((fut, loop, label, fn, args))
        return fut

    def _work(self) -> None:
        ident = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, loop, label, fn, args = job
            self._busy[ident] = label
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine, not swallowed
                error = exc
            self._busy.pop(ident, None)
            with self._lock:
                self._idle += 1
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:  # the run's loop is closed: the run abandoned this call
                pass
            del fut, result, error, job, args

    def shutdown(self, timeout: float) -> list[str]:
        """Stop the threads; return the labels of calls still running after ``timeout``."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [self._busy.get(t.ident or 0, "?") for t in threads if t.is_alive()]


async def run_in(
    executor: Executor, fn: Callable[..., Any], *args: Any
) -> Any:
    """Run ``fn(*args)`` in a user's executor.

    Cancellation:
        The executor's call is not interrupted; its result is dropped.
    """
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
