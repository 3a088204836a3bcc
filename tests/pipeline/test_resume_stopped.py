"""A state taken after a run stopped (``close()``, ``break``, garbage collection, ``async
for`` left early) is the state at the consumer's last item: its resumption loses nothing and
repeats nothing, whatever the stages did while they were torn down."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import pytest

from asyncflow import Pipeline
from asyncflow.pipeline._lineage import received

pytestmark = pytest.mark.usefixtures("leak_check")

Build = Callable[[], Pipeline]


async def _twice(x: int) -> int:
    await asyncio.sleep(0.001 * (x % 3))  # finishes out of order
    return 2 * x


BUILDS: dict[str, tuple[Build, bool]] = {  # name: (build, keeps order)
    "flat_map": (lambda: Pipeline(list(range(30))).flat_map(lambda x: [x, x + 100]), True),
    "flat_map_concurrent": (
        lambda: Pipeline(list(range(30))).flat_map(lambda x: [x, x + 100, x + 200],
                                                   concurrency=3), True),
    "map_unordered": (
        lambda: Pipeline(list(range(40))).map(_twice, concurrency=4, ordered=False), False),
    "batch": (lambda: Pipeline(list(range(40))).batch(3), True),
    "batch_drop_last": (lambda: Pipeline(list(range(40))).batch(3, drop_last=True), True),
    "shuffle": (lambda: Pipeline(list(range(40))).shuffle(buffer_size=8, seed=3), False),
    "filter": (lambda: Pipeline(list(range(40))).filter(lambda x: x % 3 != 1), True),
}
POINTS = [1, 3, 7, 11]


def _by_close(build: Build, taken: int) -> tuple[list[Any], dict[str, Any]]:
    pipe = build()
    it = iter(pipe)
    got = [next(it) for _ in range(taken)]
    it.close()
    return got, pipe.state_dict()


def _by_break(build: Build, taken: int) -> tuple[list[Any], dict[str, Any]]:
    pipe = build()
    got = []
    for item in pipe:  # the run is garbage-collected after the break
        got.append(item)
        if len(got) == taken:
            break
    return got, pipe.state_dict()


def _by_async_break(build: Build, taken: int) -> tuple[list[Any], dict[str, Any]]:
    pipe = build()

    async def consume() -> list[Any]:
        got = []
        async for item in pipe:
            got.append(item)
            if len(got) == taken:
                break
        return got

    got = asyncio.run(consume())
    return got, pipe.state_dict()


def _by_exception(build: Build, taken: int) -> tuple[list[Any], dict[str, Any]]:
    pipe = build()
    got: list[Any] = []
    with pytest.raises(KeyError):
        for item in pipe:
            got.append(item)
            if len(got) == taken:
                raise KeyError("the consumer failed")
    return got, pipe.state_dict()


STOPS = {"close": _by_close, "break": _by_break, "async_break": _by_async_break,
         "exception": _by_exception}


@pytest.mark.parametrize("stop", sorted(STOPS))
@pytest.mark.parametrize("kind", sorted(BUILDS))
def test_state_after_stop_resumes_exactly(kind: str, stop: str) -> None:
    build, ordered = BUILDS[kind]
    full = list(build())
    for taken in POINTS:
        before, state = STOPS[stop](build, taken)
        assert len(before) == taken
        pipe = build()
        pipe.load_state_dict(json.loads(json.dumps(state)))
        after = list(pipe)
        if ordered:
            assert before + after == full, (taken, state)
        else:
            assert Counter(map(repr, before + after)) == Counter(map(repr, full)), (taken, state)


def test_the_documented_case() -> None:
    """Three items of ``[0, 100, 1, 101, ...]``, then ``close()``: 101 is not lost."""
    def build() -> Pipeline:
        return Pipeline(list(range(4))).flat_map(lambda x: [x, x + 100])

    pipe = build()
    it = iter(pipe)
    assert [next(it) for _ in range(3)] == [0, 100, 1]
    at_item = pipe.state_dict()
    it.close()
    assert pipe.state_dict() == at_item
    again = build()
    again.load_state_dict(pipe.state_dict())
    assert list(again) == [101, 2, 102, 3, 103]


def test_received_counts_what_the_chunk_no_longer_holds() -> None:
    assert received(10, []) == 10
    assert received(10, deque([None, 5])) == 8  # a None item is not taken
    assert received(4, deque()) == 4


def test_run_delivered_counts_the_items_taken_after_the_close_too() -> None:
    run = Pipeline(list(range(100))).open()
    assert [next(run) for _ in range(3)] == [0, 1, 2]
    assert run.delivered == 3
    run.close()
    assert run.delivered == 3
