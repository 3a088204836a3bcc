"""How a map runs its calls: a cheap sync function inline on the run's loop, back on the
worker threads once slow; an async function at concurrency 1 awaited a chunk at a time."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from asyncflow import Pipeline

# -- cheap sync functions inline on the run's loop, back to threads once slow -------------------


def _where_each_ran(n: int, slow_at: int | None = None, *, opt_out: bool = False) -> list[str]:
    """Map ``range(n)`` through a function that records the thread each call ran on; the call
    on item ``slow_at`` sleeps 5 ms (five times the inline chunk limit)."""
    threads: list[str] = []

    def where(x: int) -> int:
        threads.append(threading.current_thread().name)
        if x == slow_at:
            time.sleep(0.005)
        return x

    if opt_out:
        where.asyncflow_inline = False  # type: ignore[attr-defined]
    assert list(Pipeline(range(n), name="inl").map(where)) == list(range(n))
    return threads


LOOP_THREAD = "asyncflow-inl"  # the run's loop thread; its workers are "asyncflow-inl-worker-N"


def test_a_cheap_sync_function_moves_onto_the_loop_after_chunks_on_threads() -> None:
    threads = _where_each_ran(50_000)
    assert threads[0] != LOOP_THREAD  # measured on a worker thread first
    assert LOOP_THREAD in threads
    assert threading.current_thread().name not in threads  # never on the consumer's thread


def test_a_slow_call_sends_an_inline_stage_back_to_the_threads_for_good() -> None:
    slow_at = 40_000
    threads = _where_each_ran(50_000, slow_at)
    assert LOOP_THREAD in threads[:slow_at]
    # The slow call's chunk (at most 32 items here) ends on the loop; every later one runs on
    # the worker threads.
    after = threads[slow_at + 64:]
    assert after and all(t.startswith("asyncflow-inl-worker") for t in after), set(after)


def test_a_function_that_opts_out_never_runs_inline() -> None:
    threads = _where_each_ran(20_000, opt_out=True)
    assert all(t.startswith("asyncflow-inl-worker") for t in threads), set(threads)


# -- async functions at concurrency 1: awaited directly, a chunk at a time ----------------------


@pytest.mark.timeout(30)
def test_a_suspended_call_does_not_hold_back_the_results_before_it() -> None:
    async def stuck_from_5(x: int) -> int:
        if x >= 5:
            await asyncio.sleep(3600)  # until the run is stopped
        return x

    got = []
    with Pipeline(range(20)).map(stuck_from_5).open() as run:
        for x in run:
            got.append(x)
            if x == 4:
                break
    assert got == [0, 1, 2, 3, 4]


def test_a_stepped_call_keeps_its_task_context_and_cancellation() -> None:
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var", default=0)

    async def call(x: int) -> tuple[int, bool, bool]:
        task = asyncio.current_task()
        var.set(x)
        await asyncio.sleep(0)  # suspends: the rest of the call runs under Resume
        same = asyncio.current_task() is task and var.get() == x
        try:
            async with asyncio.timeout(0.001):  # cancels this task, through Resume
                await asyncio.sleep(3600)
        except TimeoutError:
            timed_out = True
        else:
            timed_out = False
        return x, same, timed_out

    out = list(Pipeline(range(50)).map(call))
    assert out == [(x, True, True) for x in range(50)]


def test_async_chunks_count_items_and_keep_failures_in_place() -> None:
    async def inv(x: int) -> float:
        if x % 3 == 0:
            await asyncio.sleep(0)
        return 1 / (x % 10)

    pipe = Pipeline(range(100)).map(inv, name="inv", max_failures=0.5)
    out = list(pipe)
    assert out == [1 / (x % 10) for x in range(100) if x % 10]
    stats = pipe.stats()["inv"]
    assert stats.items_in == 100 and stats.items_out == 90 and stats.failures == 10


class _Ambiguous:
    """A predicate's result whose truth cannot be told (as a NumPy array's)."""

    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array is ambiguous")


@pytest.mark.parametrize("kind", ["sync", "threads", "async", "async x2"])
def test_a_filter_result_without_a_truth_value_is_the_items_failure(kind: str) -> None:
    # bool() of the result ran on the loop, outside every item's try: the run failed whatever
    # the budget, with a raw ValueError naming no item
    def keep(x: int) -> object:
        time.sleep(0.001 if kind == "threads" else 0)
        return _Ambiguous() if x == 3 else x % 2

    async def akeep(x: int) -> object:
        return keep(x)

    pipe = Pipeline(range(8), max_failures=1)
    predicate = akeep if kind.startswith("async") else keep
    concurrency = 2 if kind in ("threads", "async x2") else 1
    run = pipe.filter(predicate, concurrency=concurrency, name="odd").open()
    assert list(run) == [1, 5, 7]
    [[record]] = run.failure_records()[1:]
    assert record.item == "3" and record.error_type == "ValueError"
