"""Byte budgets: queues of large items bounded in bytes, not only in items."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest

from asyncflow import ConfigError, Pipeline, Processes
from asyncflow.pipeline._channel import Channel, nbytes_of

MB = 2**20


def test_nbytes_of_counts_arrays_bytes_and_containers() -> None:
    arr = np.zeros(1000, np.float32)
    assert nbytes_of(arr) == 4000
    assert nbytes_of(b"abc") == 3 and nbytes_of("abcd") == 4
    assert nbytes_of((arr, {"x": b"12"}, [arr])) == 8002
    assert nbytes_of(7) == 0 and nbytes_of(object()) == 0


async def test_a_channel_waits_on_bytes_but_always_takes_one_item() -> None:
    channel = Channel(100, max_bytes=10)
    await channel.put(b"x" * 30)  # larger than the budget on its own: passes when empty
    blocked = asyncio.ensure_future(channel.put(b"y"))
    await asyncio.sleep(0.01)
    assert not blocked.done() and channel.nbytes == 30
    assert await channel.get_many(10) == [b"x" * 30]
    await asyncio.wait_for(blocked, 1)
    filling = asyncio.ensure_future(channel.put_many([b"a" * 4, b"b" * 4, b"c" * 4]))
    await asyncio.sleep(0.01)
    assert not filling.done() and len(channel) == 3 and channel.nbytes == 9  # c waits
    assert await channel.get_many(2) == [b"y", b"a" * 4]
    await asyncio.wait_for(filling, 1)
    assert channel.nbytes == 8 and len(channel) == 2


def _live_peak(budget: int | None, *, consumer_pause: float = 0.005) -> int:
    live, peak, lock = 0, 0, threading.Lock()

    def gone() -> None:
        nonlocal live
        with lock:
            live -= 1

    def make(_: int) -> np.ndarray:
        nonlocal live, peak
        arr = np.zeros(MB, np.float32)  # 4 MB
        with lock:
            live += 1
            peak = max(peak, live)
        weakref.finalize(arr, gone)
        return arr

    pipe = Pipeline(range(60), buffer_bytes=budget).map(make, concurrency=2).map(
        lambda a: a, concurrency=2
    )
    for item in pipe:
        time.sleep(consumer_pause)  # a slow consumer: every queue fills up
        del item
    return peak


def test_a_byte_budget_bounds_the_arrays_alive_at_once() -> None:
    # 16 MB per queue: 4 arrays waiting in each of the two queues (the consumer's chunk
    # counts in the last), plus what each stage holds in hand (in its threads and its
    # reorder buffer): half the budget, 2 arrays; plus the one array the consumer holds.
    # docs/concepts.md states this bound.
    bound = 4 + 4 + 2 + 2 + 1
    assert _live_peak(16 * MB) <= bound
    assert _live_peak(None) > bound  # without a budget the item counts (64 per queue) rule


def test_a_stage_budget_overrides_the_pipeline_default() -> None:
    pipe = Pipeline(range(3), buffer_bytes=MB).map(abs, buffer_bytes=2 * MB)
    assert pipe.describe()[1]["buffer_bytes"] == 2 * MB
    assert list(pipe) == [0, 1, 2]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_budgets_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        Pipeline(range(3), buffer_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Pipeline(range(3)).map(abs, buffer_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_a_fast_consumer_over_a_tight_budget_never_deadlocks() -> None:
    # The consumer comes back for more while the queue is empty and its last chunk filled
    # the budget: the chunk must count as returned, or the writer waits for it forever.
    for _ in range(20):
        assert _live_peak(4 * MB, consumer_pause=0.0) >= 1


_alive = {"now": 0, "peak": 0}
_alive_lock = threading.Lock()


def _gone() -> None:
    with _alive_lock:
        _alive["now"] -= 1


def make_4mb(i: int) -> np.ndarray:
    """A 4 MB array; in this process (threads), counted while alive."""
    arr = np.full(MB, i, np.float32)
    with _alive_lock:
        _alive["now"] += 1
        _alive["peak"] = max(_alive["peak"], _alive["now"])
    weakref.finalize(arr, _gone)
    return arr


def _mapped_results() -> int:
    """Worker results mapped into this process (one shared-memory segment per array)."""
    with open("/proc/self/maps") as fh:
        return sum("/dev/shm/asyncflow-" in line and "status" not in line for line in fh)


@pytest.mark.usefixtures("leak_check")
@pytest.mark.parametrize("workers", ["threads", "processes"])
@pytest.mark.parametrize("budget", ["buffer_bytes", "buffer"])
def test_a_slow_consumer_bounds_what_the_parent_holds(workers: str, budget: str) -> None:
    # docs/concepts.md's bound for a map stage making 4 MB arrays from a source of ints:
    # - buffer_bytes=16 MB: its queue holds 4 (the consumer's chunk included), its hands 2
    #   (half the budget: in threads or worker processes, results on their way back,
    #   the reorder buffer), the consumer's hand 1;
    # - buffer=8: its queue holds 8, its hands 4, the consumer's chunk 4 and hand 1.
    options: dict[str, Any] = {"buffer_bytes": 16 * MB} if budget == "buffer_bytes" else {}
    stage: dict[str, Any] = {"buffer": 8} if budget == "buffer" else {}
    bound = 4 + 2 + 1 if budget == "buffer_bytes" else 8 + 4 + 4 + 1
    _alive.update(now=0, peak=0)
    pipe = Pipeline(range(40), **options).map(
        make_4mb, concurrency=2, workers=Processes() if workers == "processes" else "threads",
        **stage,
    )
    peak, total = 0, 0
    for item in pipe:
        time.sleep(0.02)  # a slow consumer: the queues and the stage's hands fill up
        peak = max(peak, _mapped_results())
        total += int(item[0] == total)
        del item
    assert total == 40
    held = peak if workers == "processes" else _alive["peak"]
    assert 1 <= held <= bound, f"{held} arrays held at once, bound {bound}"
