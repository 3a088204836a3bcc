"""A run's window (``Pipeline(window=n)``): items let in by the source, less those the consumer
received or the run dropped, never more than ``n`` (``asyncflow/pipeline/_window.py``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, overload

import pytest

from asyncflow import ConfigError, Pipeline, PipelineError
from asyncflow.pipeline import Merge

from .test_merge import RoundRobin

ITEMS = 60


class Draws:
    """Counts the items a source lets in against those the consumer asked for: the consumer
    counts an item before it asks (so the count is never behind the run's own), and waits
    until the source has let in ``window`` more than it has before asking for the next."""

    def __init__(self, window: int) -> None:
        self.window, self.drawn, self.asked = window, 0, 0
        self.over: list[tuple[int, int]] = []
        self.cond = threading.Condition()

    def draw(self, count: int = 1) -> None:
        with self.cond:
            self.drawn += count
            if self.drawn > self.asked + self.window:
                self.over.append((self.drawn, self.asked))
            self.cond.notify_all()

    def ask(self) -> None:
        with self.cond:
            full = min(ITEMS, self.asked + self.window)
            assert self.cond.wait_for(lambda: self.drawn >= full, timeout=20), (
                f"the source let in {self.drawn} items, {self.asked} asked for: the window "
                f"of {self.window} holds it back further"
            )
            self.asked += 1

    def wait_all(self) -> None:
        """Until the source has let in every item (up to 20 s): a branch with no window."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.drawn == ITEMS, timeout=20), self.drawn


class Logged(Sequence[int]):
    """A sequence source that counts the items read from it."""

    def __init__(self, draws: Draws) -> None:
        self.draws = draws

    def __len__(self) -> int:
        return ITEMS

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            items = list(range(ITEMS))[index]
            self.draws.draw(len(items))
            return items
        self.draws.draw()
        return index


def _source(kind: str, draws: Draws) -> Any:
    def generator() -> Iterator[int]:
        for i in range(ITEMS):
            draws.draw()
            yield i

    async def agenerator() -> AsyncIterator[int]:
        for i in range(ITEMS):
            draws.draw()
            yield i

    return {"iterator": generator, "async": agenerator, "sequence": lambda: Logged(draws)}[kind]


@pytest.mark.parametrize("kind", ["iterator", "async", "sequence"])
@pytest.mark.parametrize("window", [1, 3])
def test_the_source_lets_in_window_items_beyond_those_received(
    kind: str, window: int, leak_check: None
) -> None:
    draws = Draws(window)
    pipe = Pipeline(_source(kind, draws), window=window).map(lambda x: x * 2, concurrency=4)
    received = []
    with pipe.open() as run:
        while True:
            draws.ask()
            try:
                received.append(next(run))
            except StopIteration:
                break
    assert draws.over == []
    assert received == [2 * i for i in range(ITEMS)]


async def test_items_failed_within_the_budget_give_their_credits_back(leak_check: None) -> None:
    def every_third_fails(x: int) -> int:
        if x % 3 == 0:
            raise ValueError(x)
        return x

    pipe = Pipeline(range(ITEMS), window=2, max_failures=1.0).map(every_third_fails,
                                                                   concurrency=2)
    async with asyncio.timeout(20):
        out = [x async for x in pipe]
    assert out == [x for x in range(ITEMS) if x % 3]
    assert len(pipe.stats().failures) == ITEMS // 3


async def test_filtered_items_give_their_credits_back(leak_check: None) -> None:
    pipe = Pipeline(range(ITEMS), window=2).filter(lambda x: x % 10 == 0, concurrency=2)
    async with asyncio.timeout(20):
        assert [x async for x in pipe] == list(range(0, ITEMS, 10))


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_a_failed_stage_wakes_the_source_waiting_for_a_credit(
    concurrency: int, leak_check: None
) -> None:
    started = threading.Event()

    def fails_on_the_first(x: int) -> int:
        started.set()
        if x == 0:
            raise ValueError("first")
        return x

    pipe = Pipeline(range(ITEMS), window=2).map(fails_on_the_first, concurrency=concurrency)
    async with asyncio.timeout(20):
        with pytest.raises(PipelineError) as caught:
            async for _ in pipe:
                pass
    assert started.is_set()
    assert isinstance(caught.value.exceptions[0], ValueError)


def test_break_while_the_source_waits_for_a_credit_leaves_nothing_running(
    leak_check: None,
) -> None:
    pipe = Pipeline(range(ITEMS), window=1).map(lambda x: x + 1)
    for item in pipe:
        assert item == 1
        break


def test_a_window_needs_stages_that_keep_items_one_for_one() -> None:
    with pytest.raises(ConfigError, match="stage 'batch' regroups items"):
        list(Pipeline(range(4), window=2).batch(2))
    with pytest.raises(ConfigError, match="not a Merge"):
        list(Pipeline(Merge([Pipeline(range(2)), Pipeline(range(2))], RoundRobin()), window=2))


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "2"])
def test_a_window_is_a_positive_int(window: Any) -> None:
    with pytest.raises(ConfigError, match="window must be an int >= 1"):
        Pipeline(range(3), window=window)
