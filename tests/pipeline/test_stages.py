"""Every stage kind: ordering, concurrency, executors, flat_map shapes, batching, shuffle."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from asyncflow import Pipeline
from tests.doubles import InFlight

pytestmark = pytest.mark.usefixtures("leak_check")


def square(x: int) -> int:
    return x * x


def jitter(x: int) -> int:
    time.sleep(random.random() * 0.002)
    return x


async def ajitter(x: int) -> int:
    await asyncio.sleep(random.random() * 0.002)
    return x


def test_sync_map_keeps_order_with_concurrency() -> None:
    assert list(Pipeline(range(300)).map(jitter, concurrency=4)) == list(range(300))


def test_async_map_keeps_order_with_concurrency() -> None:
    assert list(Pipeline(range(300)).map(ajitter, concurrency=16)) == list(range(300))


def test_unordered_map_yields_every_item_in_completion_order() -> None:
    async def slow_first(x: int) -> int:
        await asyncio.sleep(0.3 if x == 0 else 0.001)
        return x

    out = list(Pipeline(range(20)).map(slow_first, concurrency=4, ordered=False))
    assert sorted(out) == list(range(20))
    assert out[-1] == 0  # no head-of-line blocking: item 0 finished last


def test_unordered_sync_map_yields_every_item() -> None:
    out = list(Pipeline(range(500)).map(jitter, concurrency=3, ordered=False))
    assert sorted(out) == list(range(500))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_in_flight_never_exceeds_concurrency(kind: str) -> None:
    probe = InFlight(delay=0.002)
    fn = probe.sync if kind == "sync" else probe.async_
    out = list(Pipeline(range(200)).map(fn, concurrency=3))
    assert out == list(range(200))
    assert probe.calls == 200
    assert probe.peak <= 3
    assert probe.peak >= 2  # and it did run things concurrently


def test_cheap_sync_functions_are_handed_over_in_chunks() -> None:
    import threading

    threads: set[int] = set()

    def where(x: int) -> int:
        threads.add(threading.get_ident())
        return x

    pipe = Pipeline(range(20_000)).map(where)
    assert sum(pipe) == sum(range(20_000))
    assert threading.get_ident() not in threads  # ran on worker threads, not here


def test_filter_sync_and_async() -> None:
    async def odd(x: int) -> bool:
        return x % 2 == 1

    assert list(Pipeline(range(10)).filter(lambda x: x % 2 == 0)) == [0, 2, 4, 6, 8]
    assert list(Pipeline(range(10)).filter(odd, concurrency=3)) == [1, 3, 5, 7, 9]


def test_flat_map_accepts_lists_generators_and_async_generators() -> None:
    def gen(x: int):
        yield from range(x)

    async def agen(x: int):
        for i in range(x):
            await asyncio.sleep(0)
            yield i

    async def coro_list(x: int) -> list[int]:
        return [x] * x

    expected = [i for x in range(5) for i in range(x)]
    assert list(Pipeline(range(5)).flat_map(gen)) == expected
    assert list(Pipeline(range(5)).flat_map(agen)) == expected
    assert list(Pipeline(range(5)).flat_map(lambda x: [x] * x)) == [
        x for x in range(5) for _ in range(x)
    ]
    assert list(Pipeline(range(5)).flat_map(coro_list)) == [x for x in range(5) for _ in range(x)]


def test_flat_map_awaits_a_coroutine_that_a_plain_function_returns() -> None:
    # flat_map's type takes a function returning a coroutine; one that is not an `async def`
    # itself (a lambda or a decorator's wrapper around one) was called on a thread and its
    # coroutine iterated: every item failed with "'coroutine' object is not iterable"
    async def rows(x: int) -> list[int]:
        return [x] * x

    async def pairs(x: int) -> _Pairs:
        return _Pairs(x)

    assert list(Pipeline(range(4)).flat_map(lambda x: rows(x))) == [1, 2, 2, 3, 3, 3]
    assert list(Pipeline(range(2)).flat_map(lambda x: pairs(x), concurrency=2)) == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]


class _Pairs:
    """An async iterable that is not an async iterator: ``__aiter__`` makes a new one."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __aiter__(self) -> AsyncIterator[tuple[int, int]]:
        async def pairs() -> AsyncIterator[tuple[int, int]]:
            for i in range(2):
                yield self.x, i
        return pairs()


def test_flat_map_accepts_async_iterables_that_are_not_iterators() -> None:
    async def coro_pairs(x: int) -> _Pairs:
        return _Pairs(x)

    expected = [(x, i) for x in range(3) for i in range(2)]
    assert list(Pipeline(range(3)).flat_map(_Pairs)) == expected
    assert list(Pipeline(range(3)).flat_map(coro_pairs)) == expected


def test_flat_map_ordered_with_concurrency_keeps_each_expansion_together() -> None:
    async def expand(x: int):
        for i in range(3):
            await asyncio.sleep(random.random() * 0.002)
            yield (x, i)

    out = list(Pipeline(range(40)).flat_map(expand, concurrency=4, buffer=2))
    assert out == [(x, i) for x in range(40) for i in range(3)]


def test_flat_map_unordered_with_concurrency_yields_everything() -> None:
    def expand(x: int):
        return [(x, i) for i in range(3)]

    out = list(Pipeline(range(40)).flat_map(expand, concurrency=4, ordered=False))
    assert sorted(out) == [(x, i) for x in range(40) for i in range(3)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_flat_map_closes_a_generator_left_in_part_when_the_run_stops(concurrency: int) -> None:
    # A generator holding a shard's file open was closed only by the garbage collector (it
    # sits in a reference cycle): its file stayed open after break, close() and errors.
    closed: list[int] = []

    def expand(x: int):
        try:
            yield from range(1000)
        finally:
            closed.append(x)

    gc.disable()
    try:
        with Pipeline(range(3)).flat_map(expand, concurrency=concurrency).open() as run:
            for i, _ in enumerate(run):
                if i == 5:
                    break
        assert 0 in closed  # by the time close() returns, without a collection
    finally:
        gc.enable()


def test_batch_and_drop_last() -> None:
    assert list(Pipeline(range(7)).batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(Pipeline(range(7)).batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert list(Pipeline(range(6)).batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert list(Pipeline([]).batch(3)) == []


def test_unbatch_inverts_batch() -> None:
    assert list(Pipeline(range(10)).batch(4).unbatch()) == list(range(10))


def test_prefetch_passes_items_through() -> None:
    assert list(Pipeline(range(100)).map(square).prefetch(4)) == [x * x for x in range(100)]


def test_shuffle_is_a_permutation_reproducible_per_seed_and_epoch() -> None:
    pipe = Pipeline(range(200)).shuffle(buffer_size=50, seed=7)
    first = list(pipe)
    second = list(pipe)
    assert sorted(first) == list(range(200))
    assert first != list(range(200))
    assert first != second  # a new order each epoch
    again = Pipeline(range(200)).shuffle(buffer_size=50, seed=7)
    assert list(again) == first  # same seed, same epoch: same order
    assert list(again) == second


def test_user_thread_pool_executor() -> None:
    with ThreadPoolExecutor(2) as pool:
        assert list(Pipeline(range(50)).map(square, executor=pool, concurrency=2)) == [
            x * x for x in range(50)
        ]


@pytest.mark.timeout(120)
def test_process_pool_executor_for_gil_bound_code() -> None:
    with ProcessPoolExecutor(2) as pool:
        out = list(Pipeline(range(30)).map(square, executor=pool, concurrency=2))
    assert out == [x * x for x in range(30)]


def test_names_appear_in_stats() -> None:
    pipe = Pipeline(range(10)).map(square, name="sq").map(square).map(square).batch(5)
    list(pipe)
    names = [s.name for s in pipe.stats().stages]
    assert names == ["source", "sq", "square", "square#2", "batch"]


def test_sync_function_returning_a_coroutine_is_a_clear_error() -> None:
    from asyncflow import PipelineError

    async def fetch(x: int) -> int:
        return x

    with pytest.raises(PipelineError) as info:
        list(Pipeline(range(3)).map(lambda x: fetch(x)))
    assert "async def" in str(info.value.exceptions[0])


def test_stages_compose_in_a_realistic_chain() -> None:
    async def fetch(x: int) -> bytes:
        await asyncio.sleep(0.001)
        return bytes([x % 256]) * 10

    def decode(b: bytes) -> int | None:
        return None if b[0] % 5 == 0 else len(b) + b[0]

    pipe = (
        Pipeline(range(100))
        .map(fetch, concurrency=16)
        .map(decode, concurrency=2)
        .filter(lambda x: x is not None)
        .batch(8)
        .map(sum)
        .prefetch(4)
    )
    expected_items = [10 + x for x in range(100) if x % 5 != 0]
    expected = [sum(expected_items[i : i + 8]) for i in range(0, len(expected_items), 8)]
    assert list(pipe) == expected
