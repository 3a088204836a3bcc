"""Concurrency: runs of one pipeline at once (threads and worker processes, persistent or
not), and one run shared by several consumer threads or tasks."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from asyncflow import Pipeline, PipelineError, Processes
from asyncflow.workers import ProcessPool

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(120)]

#: Raise StallError instead of hanging: no item for this long means a consumer is stuck.
_STALL = 30.0


def square(x: int) -> int:
    return x * x


def fail_at_700(x: int) -> int:
    if x == 700:
        raise ValueError("item 700")
    return x


_WORKERS: dict[str, Callable[[], Any]] = {
    "threads": lambda: "threads",
    "processes": lambda: Processes(),
    "persistent": lambda: Processes(persistent=True),
}


def _pipe(workers: str, n: int = 2000) -> Pipeline[int]:
    return Pipeline(range(n)).map(square, concurrency=2, workers=_WORKERS[workers]())


def _in_threads(count: int, target: Callable[[int], None]) -> None:
    """Run ``target(k)`` in ``count`` threads released at the same moment; re-raise the
    first error."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def main(k: int) -> None:
        try:
            barrier.wait()
            target(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * _STALL)
    assert not any(t.is_alive() for t in threads), "a consumer is stuck"
    if errors:
        raise errors[0]


# -- runs of one pipeline at once ------------------------------------------------------


@pytest.mark.parametrize("workers", list(_WORKERS))
def test_two_runs_started_at_once_from_threads_both_finish(workers: str) -> None:
    pipe = _pipe(workers)
    expected = [x * x for x in range(2000)]
    results: dict[int, list[int]] = {}

    def consume(k: int) -> None:
        with pipe.open(timeout=_STALL) as run:
            results[k] = list(run)

    for _ in range(2):
        results.clear()
        _in_threads(2, consume)
        assert results == {0: expected, 1: expected}


@pytest.mark.parametrize("workers", list(_WORKERS))
async def test_two_runs_gathered_on_one_loop_both_finish(workers: str) -> None:
    pipe = _pipe(workers)

    async def consume() -> list[int]:
        async with pipe.open(timeout=_STALL) as run:
            return [x async for x in run]

    expected = [x * x for x in range(2000)]
    async with asyncio.timeout(2 * _STALL):
        for _ in range(2):
            assert await asyncio.gather(consume(), consume()) == [expected, expected]


def test_a_pool_started_by_two_runs_at_once_has_its_workers_for_both() -> None:
    # The root of the hang: the second start() returned while the first was still spawning
    # the workers, so the second run sent its first chunks to no worker at all.
    pool = ProcessPool(square, 2, Processes(), "square")
    seen: list[int] = []
    try:
        def start(_: int) -> None:
            pool.start()
            seen.append(sum(slot.process.is_alive() for slot in pool._slots))

        _in_threads(2, start)
        assert seen == [2, 2]
    finally:
        pool.shutdown()


# -- one run shared by several consumers -----------------------------------------------


@pytest.fixture
def often_switching() -> Any:
    """Switch threads every microsecond, not every 5 ms, so that races show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)



@pytest.mark.parametrize("workers", list(_WORKERS))
def test_one_run_shared_by_threads_gives_every_item_once(
    workers: str, often_switching: None
) -> None:
    n = 5000
    run = _pipe(workers, n).open(timeout=_STALL)  # started by the threads, at once
    taken: list[list[int]] = [[] for _ in range(4)]

    def consume(k: int) -> None:
        for item in run:
            taken[k].append(item)

    try:
        _in_threads(4, consume)
    finally:
        run.close()
    counts = Counter(x for part in taken for x in part)
    assert sorted(counts) == [x * x for x in range(n)]
    assert set(counts.values()) == {1}
    for part in taken:  # each consumer sees the items in the run's order
        assert part == sorted(part)


def test_one_run_over_an_iterator_started_by_threads_at_once_runs_once(
    often_switching: None,
) -> None:
    # Two threads starting one run at once used to build two runtimes: the second read the
    # one-shot source again ("the source ... is an iterator"), or items came twice.
    for _ in range(5):
        run = Pipeline(iter(range(3000))).open(timeout=_STALL)
        taken: list[list[int]] = [[] for _ in range(4)]

        def consume(k: int, run: Any = run, taken: list[list[int]] = taken) -> None:
            taken[k].extend(run)

        try:
            _in_threads(4, consume)
        finally:
            run.close()
        assert sorted(x for part in taken for x in part) == list(range(3000))


async def test_one_run_shared_by_tasks_on_several_loops_gives_every_item_once(
    often_switching: None,
) -> None:
    n = 5000
    run = _pipe("threads", n).open(timeout=_STALL)
    taken: list[list[int]] = [[] for _ in range(4)]

    async def consume(k: int) -> None:
        async for item in run:
            taken[k].append(item)

    async def two_tasks(k: int) -> None:
        await asyncio.gather(consume(2 * k), consume(2 * k + 1))

    async with asyncio.timeout(2 * _STALL):  # two here, two on another thread's loop
        other = asyncio.to_thread(lambda: asyncio.run(two_tasks(1)))
        await asyncio.gather(two_tasks(0), other)
    await run.aclose()
    counts = Counter(x for part in taken for x in part)
    assert sorted(counts) == [x * x for x in range(n)]
    assert set(counts.values()) == {1}


def test_hooks_of_a_shared_run_see_one_item_at_a_time_in_order(often_switching: None) -> None:
    seen: list[int] = []
    inside = [0, 0]  # now, most at once

    class Hook:
        def __call__(self, item: int) -> int:
            inside[0] += 1
            inside[1] = max(inside)
            seen.append(item)
            inside[0] -= 1
            return item

        def close(self) -> None:
            pass

    run = Pipeline(range(3000)).with_hook(lambda run: Hook()).open(timeout=_STALL)
    try:
        _in_threads(4, lambda k: [None for _ in run])
    finally:
        run.close()
    assert seen == list(range(3000))
    assert inside[1] == 1


def test_a_failure_reaches_one_consumer_of_a_shared_run_and_ends_the_others(
    often_switching: None,
) -> None:
    run = Pipeline(range(2000)).map(fail_at_700).open(timeout=_STALL)
    errors: list[BaseException] = []
    counts: list[int] = []

    def consume(_: int) -> None:
        n = 0
        try:
            for _ in run:
                n += 1
        except PipelineError as exc:
            errors.append(exc)
        counts.append(n)

    try:
        _in_threads(3, consume)
    finally:
        run.close()
    assert len(errors) == 1
    assert sum(counts) == 700  # every item before the failure, once
