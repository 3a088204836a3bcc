"""Worker threads and chunked calls: ``run_chunk``, ``next_chunk``, ``WorkerPool``."""

from __future__ import annotations

import asyncio
import threading
import time

from asyncflow.workers import FAILED, WorkerPool, next_chunk, run_chunk


def test_run_chunk_returns_failures_in_place() -> None:
    def inv(x: int) -> float:
        return 1 / x

    values, failures, elapsed = run_chunk(inv, [1, 0, 2], None)
    assert values[0] == 1.0 and values[1] is FAILED and values[2] == 0.5
    assert [(i, type(e)) for i, e in failures] == [(1, ZeroDivisionError)]
    assert elapsed >= 0


def test_run_chunk_stops_between_items_when_asked() -> None:
    stop = threading.Event()
    stop.set()
    values, failures, _ = run_chunk(lambda x: x, [1, 2, 3], stop)
    assert values == [] and failures == []


def test_next_chunk_keeps_items_read_before_an_error() -> None:
    def gen():
        yield 1
        yield 2
        raise KeyError("boom")

    items, done, error = next_chunk(gen(), 10)
    assert items == [1, 2] and done and isinstance(error, KeyError)


async def test_pool_runs_on_daemon_threads_and_reports_stuck_calls() -> None:
    pool = WorkerPool(2, "test-pool")
    loop = asyncio.get_running_loop()
    idents = await asyncio.gather(*(pool.stages.submit(loop, "quick", threading.get_ident)
                                    for _ in range(4)))
    assert threading.get_ident() not in idents
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test-pool"))
    release = threading.Event()
    pool.stages.submit(loop, "stuck-stage", release.wait, 10)
    await asyncio.sleep(0.05)
    start = time.monotonic()
    assert pool.shutdown(0.2) == ["stuck-stage"]
    assert time.monotonic() - start < 1.0
    release.set()
