"""The bounded, chunked channel between stages."""

from __future__ import annotations

import asyncio

import pytest

from asyncflow.pipeline._channel import Channel, ChannelAborted


async def test_put_many_respects_capacity_and_get_many_takes_chunks() -> None:
    ch = Channel(4)
    task = asyncio.create_task(ch.put_many(list(range(10))))
    await asyncio.sleep(0)
    assert len(ch) == 4 and not task.done()
    assert await ch.get_many(3) == [0, 1, 2]
    await asyncio.sleep(0)
    got = []
    while len(got) < 7:
        got += await ch.get_many(100)
        await asyncio.sleep(0)
    assert got == list(range(3, 10))
    await task


async def test_close_lets_readers_drain_then_returns_empty() -> None:
    ch = Channel(8)
    await ch.put_many([1, 2])
    ch.close()
    assert await ch.get_many(10) == [1, 2]
    assert await ch.get_many(10) == []


async def test_abort_wakes_blocked_writers_and_readers() -> None:
    full, empty = Channel(1), Channel(1)
    await full.put(1)
    writer = asyncio.create_task(full.put(2))
    reader = asyncio.create_task(empty.get_many(1))
    await asyncio.sleep(0)
    full.abort()
    empty.abort()
    with pytest.raises(ChannelAborted):
        await writer
    with pytest.raises(ChannelAborted):
        await reader


async def test_cancelled_getter_passes_its_wake_up_on() -> None:
    ch = Channel(4)
    first = asyncio.create_task(ch.get_many(1))
    second = asyncio.create_task(ch.get_many(1))
    await asyncio.sleep(0)
    await ch.put(42)  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    await asyncio.sleep(0)
    assert await asyncio.wait_for(second, 1) == [42]
    with pytest.raises(asyncio.CancelledError):
        await first
