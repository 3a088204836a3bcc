"""The run's thread pool: shared by the stages and the loop-side helpers, its default executor."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from asyncflow import Pipeline
from asyncflow.pipeline import CustomSpec, NodeContext, run_failed, run_thread
from asyncflow.workers._thread_pool import HELPER, HELPER_THREADS, WorkerPool


def test_to_thread_and_run_thread_in_a_stage_use_the_runs_threads(leak_check: None) -> None:
    async def where(x: int) -> tuple[str, str, str]:
        loop = asyncio.get_running_loop()
        return (
            await asyncio.to_thread(lambda: threading.current_thread().name),
            await run_thread(lambda: threading.current_thread().name),
            await loop.run_in_executor(None, lambda: threading.current_thread().name),
        )

    names = [n for triple in Pipeline(range(3), name="tp").map(where) for n in triple]
    assert names and all(n.startswith("asyncflow-tp-worker-") for n in names), names


async def test_run_thread_outside_a_run_is_to_thread() -> None:
    loop_thread = threading.current_thread().name
    name = await run_thread(lambda: threading.current_thread().name)
    assert name != loop_thread and not name.startswith("asyncflow-")
    assert not run_failed()


async def test_run_thread_passes_arguments_and_errors() -> None:
    assert await run_thread(divmod, 7, 2) == (3, 1)
    assert await run_thread(int, "ff", base=16) == 255
    with pytest.raises(ZeroDivisionError):
        await run_thread(divmod, 1, 0)


def test_helpers_cannot_take_the_threads_of_the_stages(leak_check: None) -> None:
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most at once
    helpers: list[asyncio.Future[Any]] = []

    def blocked() -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        release.wait()
        with lock:
            running[0] -= 1

    async def spawn(x: int) -> int:
        # helpers that stay blocked until the consumer has every item
        helpers.extend(asyncio.ensure_future(run_thread(blocked)) for _ in range(3))
        return x

    pipe = Pipeline(range(8)).map(spawn).map(lambda x: x * x, concurrency=2)
    out = []
    with pipe.open(timeout=60) as run:  # a hang guard: starved stages would stall
        for y in run:
            out.append(y)
            if len(out) == 8:
                release.set()
    assert out == [x * x for x in range(8)]
    assert 1 <= running[1] <= HELPER_THREADS


async def test_the_pool_queues_helpers_beyond_its_reserve_and_drops_them_at_shutdown() -> None:
    pool = WorkerPool(1, "asyncflow-test-worker", helpers=1)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    first = pool.helpers.submit(loop, HELPER, gate.wait)
    queued = pool.helpers.submit(loop, HELPER, lambda: "ran")
    stage = pool.stages.submit(loop, "stage", lambda: "stage ran")  # not held up by the helpers
    assert await stage == "stage ran"
    assert not queued.done()
    gate.set()
    assert await first is True and await queued == "ran"
    blocker, running = threading.Event(), threading.Event()
    pool.helpers.submit(loop, HELPER, lambda: running.set() or blocker.wait())
    await asyncio.to_thread(running.wait, 10)  # running, not queued: a stop leaves it be
    dropped = pool.helpers.submit(loop, HELPER, lambda: "never")  # queued: the reserve is full
    try:
        assert await asyncio.to_thread(pool.shutdown, 0.05) == ["helper"]  # still blocked
    finally:
        blocker.set()
    assert pool.closed
    with pytest.raises(RuntimeError, match="shut down"):
        await dropped


def test_run_failed_tells_a_stage_whether_its_input_ended_by_a_failure(
    leak_check: None
) -> None:
    ends: list[bool] = []

    class Probe:
        def __init__(self, ctx: NodeContext) -> None:
            self.ctx = ctx

        async def run(self, inp: Any, out: Any) -> None:
            while items := await inp.get_many(64):
                await out.put_many(items)
            ends.append(run_failed())

    def fail_on(bad: int) -> Any:
        def fn(x: int) -> int:
            if x == bad:
                raise ValueError("bad")
            return x
        return fn

    probe = CustomSpec(label="probe", factory=Probe)
    assert list(Pipeline(range(4)).map(fail_on(-1)).with_stage(probe)) == [0, 1, 2, 3]
    with pytest.raises(Exception, match="bad"):
        list(Pipeline(range(4)).map(fail_on(3)).with_stage(probe))
    assert ends == [False, True]


async def test_a_stop_runs_every_call_a_thread_was_there_for() -> None:
    """Calls queued for a thread of their own (here, each a new one, maybe not running yet)
    run before their threads end: a stop drops only those waiting for a thread to be free,
    so a file's close handed to a thread is never dropped."""
    loop = asyncio.get_running_loop()
    for _ in range(20):
        pool = WorkerPool(4, "asyncflow-test-worker", helpers=1)
        calls = [pool.stages.submit(loop, "stage", lambda i=i: i) for i in range(4)]
        assert await asyncio.to_thread(pool.shutdown, 10) == []
        assert await asyncio.gather(*calls) == [0, 1, 2, 3]
