"""Running synchronous stage functions off the loop, a chunk of items per hand-off.

A thread round trip costs tens of microseconds; a cheap function must not pay it per item. So
workers receive a *chunk* of items, call the function on each, and return all the results in
one hand-off. Chunks grow while the function is cheap and shrink to one item when it is slow,
so parallelism is not lost on expensive work.

The run's threads themselves are :class:`~asyncflow.workers._thread_pool.WorkerPool`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._portable import FAILED, ChunkResult, noted, portable

__all__ = ["SOURCE_CHUNK", "aclose_iterator", "next_chunk", "run_chunk", "run_chunk_remote"]

#: Items a source or an expansion reads per hand-off.
SOURCE_CHUNK = 256


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
    return results, [(i, portable(noted(exc))) for i, exc in failures], elapsed


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


async def aclose_iterator(obj: Any) -> None:
    """Close an async iterator that has ``aclose`` (an async generator), else nothing."""
    aclose = getattr(obj, "aclose", None)
    if aclose is not None:
        await aclose()
