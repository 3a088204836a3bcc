"""The hand-off to the consumer: a busy consumer does not stop loading; plain ``for`` works
inside a running loop (as in Jupyter); results cross in chunks."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from asyncflow import Pipeline

pytestmark = pytest.mark.usefixtures("leak_check")


async def load(x: int) -> int:
    await asyncio.sleep(0.02)
    return x


def test_loading_continues_while_a_sync_consumer_is_busy() -> None:
    pipe = Pipeline(range(12)).map(load, concurrency=1).prefetch(16)
    start = time.monotonic()
    for _ in pipe:
        time.sleep(0.02)  # "training step" as long as one load
    elapsed = time.monotonic() - start
    # step + load would be 12 * 0.04 = 0.48 s; overlapped about 12 * 0.02 + 0.02
    assert elapsed < 0.45, elapsed


async def test_loading_continues_while_an_async_consumer_blocks_its_loop() -> None:
    pipe = Pipeline(range(12)).map(load, concurrency=1).prefetch(16)
    start = time.monotonic()
    async for _ in pipe:
        time.sleep(0.02)  # a synchronous training step blocking the consumer's loop
    elapsed = time.monotonic() - start
    assert elapsed < 0.45, elapsed


async def test_plain_for_works_inside_a_running_event_loop() -> None:
    asyncio.get_running_loop()  # as in a Jupyter cell: a loop runs in this thread
    assert [x for x in Pipeline(range(50)).map(load, concurrency=25)] == list(range(50))


async def test_async_stage_runs_on_the_pipelines_own_loop() -> None:
    here = asyncio.get_running_loop()
    loops = set()

    async def where(x: int) -> int:
        loops.add(asyncio.get_running_loop())
        return x

    assert [x async for x in Pipeline(range(5)).map(where)] == list(range(5))
    assert here not in loops and len(loops) == 1


def test_consumer_in_another_thread() -> None:
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.extend(Pipeline(range(100)).map(lambda x: x)))
    thread.start()
    thread.join(10)
    assert out == list(range(100))


def test_pipeline_as_the_source_of_another_pipeline() -> None:
    inner = Pipeline(range(10)).map(lambda x: x + 1)
    outer = Pipeline(inner).map(lambda x: x * 10)
    assert list(outer) == [10 * (x + 1) for x in range(10)]
    assert list(outer) == [10 * (x + 1) for x in range(10)]


def test_stats_during_and_after_a_run() -> None:
    pipe = Pipeline(range(1000)).map(lambda x: x, name="ident").batch(10)
    with pipe.open() as run:
        next(run)
        assert run.stats().running
    stats = pipe.stats()
    assert not stats.running
    assert stats["ident"].items_in >= 10
    list(pipe)
    stats = pipe.stats()
    assert stats["ident"].items_out == 1000 and stats["batch"].items_out == 100
    assert stats.delivered == 100
    assert stats.bottleneck is not None
    assert "ident" in str(stats)
