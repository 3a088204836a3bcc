"""A merge input's window (``Pipeline(source, window=n)`` merged): its branch's source lets in
at most ``n`` items beyond those of that branch the merged run's consumer received or the run
dropped (``BranchCredits`` in ``asyncflow/pipeline/_window.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, PipelineError
from asyncflow.pipeline import Merge

from .test_merge import RoundRobin
from .test_window import ITEMS, Draws, _source


def _branches(draws: list[Draws], window: int | None, *, concurrency: int = 4) -> Merge[Any]:
    inputs = [
        Pipeline(_source("iterator", d), name=f"in{b}", window=window).map(
            lambda x, b=b: (b, x), concurrency=concurrency)
        for b, d in enumerate(draws)
    ]
    return Merge(inputs, RoundRobin(), name="turns")


@pytest.mark.parametrize("window", [1, 3])
def test_each_branch_lets_in_its_window_beyond_its_items_received(
    window: int, leak_check: None
) -> None:
    draws = [Draws(window), Draws(window)]
    # the merge's output queue and the hand-off alone would hold 64 items of each branch
    pipe = Pipeline(_branches(draws, window)).map(lambda item: item, concurrency=4)
    received = []
    with pipe.open() as run:
        for turn in range(2 * ITEMS):
            draws[1 - turn % 2].ask()  # RoundRobin takes branch 1 first, then 0, ...
            received.append(next(run))
        assert next(run, None) is None
    assert [d.over for d in draws] == [[], []]
    assert received == [(1 - t % 2, t // 2) for t in range(2 * ITEMS)]


def test_without_windows_a_branch_reads_ahead_of_the_consumer(leak_check: None) -> None:
    """The test above can fail: with no window a branch's source runs ahead."""
    draws = [Draws(1), Draws(1)]
    with Pipeline(_branches(draws, None)).open() as run:
        next(run)
        draws[0].wait_all()
    assert draws[0].over


async def test_items_dropped_after_the_merge_give_their_branch_credits_back(
    leak_check: None,
) -> None:
    def every_third_fails(item: tuple[int, int]) -> tuple[int, int]:
        if item[1] % 3 == 0:
            raise ValueError(item)
        return item

    draws = [Draws(2), Draws(2)]
    pipe = Pipeline(_branches(draws, 2), max_failures=1.0).map(every_third_fails)
    pipe = pipe.filter(lambda item: item[1] % 2 == 0)
    async with asyncio.timeout(20):
        out = [item async for item in pipe]
    assert sorted(out) == sorted((b, x) for b in (0, 1) for x in range(ITEMS)
                                 if x % 3 and x % 2 == 0)


def test_a_window_on_one_input_bounds_that_branch_only(leak_check: None) -> None:
    draws = [Draws(2), Draws(2)]
    inputs = [Pipeline(_source("iterator", draws[0]), name="held", window=2),
              Pipeline(_source("iterator", draws[1]), name="free")]
    with Pipeline(Merge(inputs, RoundRobin())).open() as run:
        assert next(run) == 0  # branch 1 first
        for _ in range(4):
            next(run)
        draws[1].wait_all()
    assert draws[0].drawn <= 2 + 2 + 1  # two received, a window of two, one asked for


async def test_a_failed_stage_after_the_merge_wakes_the_branches_waiting_for_credits(
    leak_check: None,
) -> None:
    started = threading.Event()

    def fails_on_the_first(item: tuple[int, int]) -> tuple[int, int]:
        started.set()
        if item[1] == 0:
            raise ValueError("first")
        return item

    pipe = Pipeline(_branches([Draws(ITEMS), Draws(ITEMS)], 1)).map(fails_on_the_first)
    async with asyncio.timeout(20):
        with pytest.raises(PipelineError):
            async for _ in pipe:
                pass
    assert started.is_set()


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
async def test_a_failed_branch_stage_wakes_its_source_waiting_for_credits(
    nested: bool, leak_check: None,
) -> None:
    def fails(x: int) -> int:
        raise ValueError(f"item {x}")

    inputs = [Pipeline(range(ITEMS), name="fails", window=1).map(fails),
              Pipeline(range(ITEMS), name="fine", window=1)]
    pipe = Pipeline(Merge(inputs, RoundRobin(), name="inner"))
    if nested:  # the windowed branches are one input of an outer merge
        pipe = Pipeline(Merge([pipe, Pipeline(range(5), name="other")], RoundRobin()))
    async with asyncio.timeout(20):
        with pytest.raises(PipelineError) as caught:
            async for _ in pipe:
                pass
    assert isinstance(caught.value.exceptions[0], ValueError)


def test_stages_after_windowed_branches_keep_items_one_for_one() -> None:
    merge = _branches([Draws(ITEMS), Draws(ITEMS)], 2)
    with pytest.raises(ConfigError, match="stage 'batch' regroups items"):
        list(Pipeline(merge).batch(2))
    with pytest.raises(ConfigError, match="give each of the merge's inputs a window"):
        list(Pipeline(merge, window=2))


def _slow_odd(x: tuple[int, int]) -> tuple[int, int]:
    if x[1] % 2:
        time.sleep(0.002)
    return x


@pytest.mark.timeout(60)
@pytest.mark.parametrize("window", [1, 2])
def test_windowed_branches_then_an_unordered_map_finish(window: int, leak_check: None) -> None:
    inputs = [Pipeline(range(200), name=f"in{b}", window=window).map(lambda x, b=b: (b, x))
              for b in range(3)]
    pipe = Pipeline(Merge(inputs, RoundRobin(), name="turns")).map(
        _slow_odd, concurrency=8, ordered=False)
    got = list(pipe)
    assert sorted(got) == [(b, x) for b in range(3) for x in range(200)]
