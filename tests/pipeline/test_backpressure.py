"""Back-pressure and stalls (RELIABILITY 12-13): bounded memory, bounded work in flight."""

from __future__ import annotations

import asyncio
import time
import weakref

import pytest

from asyncflow import Pipeline, PipelineError, StallError
from tests.doubles import Tracked

pytestmark = pytest.mark.usefixtures("leak_check")


def make(i: int) -> Tracked:
    return Tracked(i, 1024)


def touch(item: Tracked) -> Tracked:
    return item


def test_slow_consumer_keeps_items_alive_within_queue_capacities() -> None:
    Tracked.reset()
    pipe = (
        Pipeline(range(2000))
        .map(make, concurrency=2, buffer=8)
        .map(touch, concurrency=2, buffer=8)
        .prefetch(4)
    )
    capacities = 8 + 8 + 4
    # each map stage holds at most half its output capacity in its workers' hands; prefetch
    # holds what it took from its input while it waits to pass it on
    in_hands = 4 + 4 + 8
    consumer_chunk = 4 // 2  # the consumer takes up to half the output buffer at a time
    seen = 0
    for item in pipe:
        seen += 1
        if seen % 50 == 0:
            time.sleep(0.002)  # a slow consumer: producers block on full queues
        assert item.index == seen - 1
        del item
    assert seen == 2000
    bound = capacities + in_hands + consumer_chunk + 1  # +1: the item in the consumer's hand
    assert Tracked.peak <= bound, f"{Tracked.peak} items alive at once, bound {bound}"


@pytest.mark.parametrize("asynchronous", [False, True])
def test_no_stage_keeps_an_item_alive_after_handing_it_on(asynchronous: bool) -> None:
    # A slow source: every stage waits for input between items. A stage that kept a reference
    # to what it handed on (a worker's last chunk, an emitter's last result, prefetch's last
    # chunk) while it waits would keep items alive that the consumer has already dropped.
    def source():
        for i in range(30):
            time.sleep(0.01)
            yield i

    async def touch_async(item: Tracked) -> Tracked:
        await asyncio.sleep(0)
        return item

    seen: list[weakref.ref[Tracked]] = []
    kept: list[int] = []  # earlier items still alive when the next one arrives
    pipe = (
        Pipeline(source)
        .map(make, concurrency=2, buffer=8)
        .map(touch_async if asynchronous else touch, concurrency=2, buffer=8)
        .map(touch_async if asynchronous else touch, buffer=8)
        .prefetch(4)
    )
    for item in pipe:
        kept += [old.index for old in (ref() for ref in seen) if old is not None]
        seen.append(weakref.ref(item))
        del item
    assert len(seen) == 30
    assert kept == [], f"items kept alive after the consumer dropped them: {kept}"


def test_source_is_not_read_ahead_beyond_capacities() -> None:
    read = []

    def source():
        for i in range(10_000):
            read.append(i)
            yield i

    pipe = Pipeline(source).map(lambda x: x, buffer=16).prefetch(4)
    with pipe.open() as run:
        next(run)
        time.sleep(0.3)
        # source queue 64 + in hand 8 + map queue 16 + prefetch 4 (+ in hand) + one chunk read
        assert len(read) <= 64 + 8 + 16 + 16 + 4 + 256, len(read)


async def test_async_stage_back_pressure_keeps_in_flight_bounded() -> None:
    now = peak = 0

    async def fetch(x: int) -> int:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        await asyncio.sleep(0.001)
        now -= 1
        return x

    n = 0
    async for _ in Pipeline(range(500)).map(fetch, concurrency=10):
        n += 1
        if n % 100 == 0:
            await asyncio.sleep(0.05)
    assert n == 500
    assert peak <= 10


def test_stall_timeout_names_the_silent_stage() -> None:
    def hang_on_5(x: int) -> int:
        if x == 5:
            time.sleep(2.0)
        return x

    pipe = Pipeline(range(20), stall_timeout=0.3, stop_timeout=3).map(hang_on_5, name="hangs")
    seen = []
    with pytest.raises(PipelineError) as info:
        for x in pipe:
            seen.append(x)
    stall = info.value.exceptions[0]
    assert isinstance(stall, StallError) and isinstance(stall, TimeoutError)
    assert "'hangs'" in str(stall) and "stall_timeout=0.3" in str(stall)
    # items handed to the stuck call with item 5 (one chunk) are lost with it; none after
    assert seen == list(range(len(seen))) and len(seen) <= 5


def test_a_slow_consumer_is_not_a_stall() -> None:
    pipe = Pipeline(range(30), stall_timeout=0.2).map(lambda x: x).prefetch(2)
    out = []
    for x in pipe:
        out.append(x)
        if x in (3, 4):
            time.sleep(0.4)
    assert out == list(range(30))


def test_consumer_timeout_raises_stall_error() -> None:
    def very_slow(x: int) -> int:
        time.sleep(1.0)
        return x

    with pytest.raises(StallError, match="timeout"):
        for _ in Pipeline(range(3), stop_timeout=2).map(very_slow).open(timeout=0.2):
            pass


def test_the_source_buffer_is_configurable() -> None:
    read = []

    def source():
        for i in range(1000):
            read.append(i)
            yield i

    with Pipeline(source, buffer=2).open() as run:
        next(run)
        time.sleep(0.2)
        # the source's queue (2) + the chunk it read + the consumer's queue
        assert len(read) <= 2 + 256 + 64
    with Pipeline(range(3), buffer=2).open() as run:
        assert run.stats().stages[0].queue_capacity == 2
