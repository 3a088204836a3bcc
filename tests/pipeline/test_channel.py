"""The run's one channel type: the bounded, chunked channel between stages and the hand-off to
the consumer, both on :class:`ChannelBase`."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from asyncflow.pipeline._bridge import Handoff
from asyncflow.pipeline._channel import Channel, ChannelAborted, ChannelBase


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


# -- the contract both variants share (ChannelBase), run over each ---------------------------

KINDS = ["channel", "handoff"]


def _make(kind: str, capacity: int, max_bytes: int | None = None) -> ChannelBase:
    if kind == "channel":
        return Channel(capacity, max_bytes)
    return Handoff(capacity, asyncio.get_running_loop(), max_bytes)


async def _read(ch: ChannelBase, limit: int = 1000) -> list[object]:
    """One reader call of either variant (a hand-off takes up to half its capacity)."""
    if isinstance(ch, Channel):
        return await ch.get_many(limit)
    assert isinstance(ch, Handoff)
    return await ch.aget_chunk(5.0)


async def _settle() -> None:
    for _ in range(5):  # a hand-off wakes its writers through call_soon_threadsafe
        await asyncio.sleep(0)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_writer_waits_while_full_and_the_order_is_kept(kind: str) -> None:
    ch = _make(kind, 4)
    writer = asyncio.create_task(ch.put_many(list(range(10))))
    await _settle()
    assert len(ch) == 4 and not writer.done()
    got: list[object] = []
    while len(got) < 10:
        got += await _read(ch)
        await _settle()
    await asyncio.wait_for(writer, 1)
    assert got == list(range(10))


@pytest.mark.parametrize("kind", KINDS)
async def test_try_put_many_is_all_or_nothing_and_never_waits(kind: str) -> None:
    ch = _make(kind, 4)
    assert ch.try_put_many([1, 2, 3])
    assert not ch.try_put_many([4, 5])  # one fits, two do not: none is appended
    assert len(ch) == 3
    assert ch.try_put_many([4]) and len(ch) == 4
    ch.abort()
    with pytest.raises(ChannelAborted):
        ch.try_put_many([5])


@pytest.mark.parametrize("kind", KINDS)
async def test_close_lets_the_reader_drain_then_ends_the_stream(kind: str) -> None:
    ch = _make(kind, 8)
    await ch.put_many([1, 2])
    ch.close()
    assert ch.closed
    assert await _read(ch) == [1, 2]
    assert await _read(ch) == []
    assert await _read(ch) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_abort_drops_items_and_stops_pending_and_later_writers(kind: str) -> None:
    ch = _make(kind, 1)
    await ch.put(1)
    writer = asyncio.create_task(ch.put(2))
    await _settle()
    ch.abort()
    assert len(ch) == 0 and ch.closed
    with pytest.raises(ChannelAborted):
        await asyncio.wait_for(writer, 1)
    with pytest.raises(ChannelAborted):
        await ch.put_many([3])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancelled_writer_leaves_the_channel_usable(kind: str) -> None:
    ch = _make(kind, 1)
    await ch.put(1)
    writer = asyncio.create_task(ch.put(2))
    await _settle()
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert await _read(ch) == [1]
    await asyncio.wait_for(ch.put(3), 1)
    assert await _read(ch) == [3]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_byte_budget_passes_one_large_item_when_empty(kind: str) -> None:
    ch = _make(kind, 100, max_bytes=10)
    await ch.put(b"x" * 30)  # larger than the budget on its own: passes when empty
    assert ch.nbytes == 30
    assert not ch.try_put_many([b"y"])
    blocked = asyncio.create_task(ch.put(b"y"))
    await _settle()
    assert not blocked.done()
    assert await _read(ch) == [b"x" * 30]
    if isinstance(ch, Handoff):
        # The reader's chunk still counts until it asks for the next one.
        await _settle()
        assert not blocked.done() and ch.nbytes == 30
        reading = asyncio.create_task(ch.aget_chunk(5.0))
        assert await asyncio.wait_for(reading, 1) == [b"y"]
    await asyncio.wait_for(blocked, 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_error_given_at_close_is_pending_once(kind: str) -> None:
    ch = _make(kind, 4)
    error = ValueError("boom")
    ch.close(error)
    ch.abort(KeyError("later"))  # a stop after the end keeps the first error
    assert ch.take_pending() is error
    assert ch.take_pending() is None


# -- what only the hand-off does: a reader on another thread or loop -----------------------


async def test_the_hand_off_gives_its_reader_the_error_after_the_items_once() -> None:
    ch = Handoff(8, asyncio.get_running_loop())
    await ch.put_many([1, 2])
    ch.close(ValueError("boom"))
    assert await ch.aget_chunk() == [1, 2]
    with pytest.raises(ValueError, match="boom"):
        await ch.aget_chunk()
    assert await ch.aget_chunk() == []


async def test_an_aborted_hand_off_ends_its_reader_with_the_stop_error() -> None:
    ch = Handoff(8, asyncio.get_running_loop())
    reader = asyncio.create_task(ch.aget_chunk(5.0))
    await _settle()
    ch.abort(ValueError("failed before the stop"))
    with pytest.raises(ValueError, match="before the stop"):
        await asyncio.wait_for(reader, 1)


async def test_a_thread_reads_the_hand_off_in_chunks_while_the_loop_writes() -> None:
    ch = Handoff(16, asyncio.get_running_loop())
    chunks: list[list[object]] = []

    def consume() -> None:
        while chunk := ch.get_chunk(5.0):
            chunks.append(chunk)

    thread = threading.Thread(target=consume)
    thread.start()
    for start in range(0, 1000, 10):
        await ch.put_many(list(range(start, start + 10)))
    ch.close()
    await asyncio.get_running_loop().run_in_executor(None, thread.join, 5.0)
    assert [x for chunk in chunks for x in chunk] == list(range(1000))
    assert max(len(chunk) for chunk in chunks) <= 8  # half the capacity at a time


def test_a_thread_reader_times_out_when_nothing_arrives() -> None:
    loop = asyncio.new_event_loop()
    try:
        ch = Handoff(4, loop)
        with pytest.raises(TimeoutError):
            ch.get_chunk(0.01)
    finally:
        loop.close()


def test_the_end_of_the_stream_wakes_every_waiting_thread() -> None:
    loop = asyncio.new_event_loop()
    try:
        ch = Handoff(4, loop)
        got: list[list[object]] = []
        readers = [threading.Thread(target=lambda: got.append(ch.get_chunk(10.0)))
                   for _ in range(3)]
        for reader in readers:
            reader.start()
        while ch._sleeping < 3:  # all three wait on the condition
            time.sleep(0.001)
        ch.close()
        for reader in readers:
            reader.join(5.0)
        assert got == [[], [], []]
    finally:
        loop.close()
