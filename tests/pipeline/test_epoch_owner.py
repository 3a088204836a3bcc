"""One owner of the epoch (issue 24): a pipeline counts its runs' epochs, each run carries its
number, and every source and stage of the run reads that one (``current_epoch()``); a merge
branch reads the epoch of its input that its era names."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, mix
from asyncflow.pipeline import current_epoch, run_thread

pytestmark = pytest.mark.usefixtures("leak_check")


class Listed:
    """A source factory whose items carry the epoch it read when the run opened it."""

    def __init__(self, n: int = 6) -> None:
        self.n = n

    def __call__(self) -> Iterator[tuple[int | None, int]]:
        epoch = current_epoch()
        return ((epoch, i) for i in range(self.n))


async def _async_stage(item: tuple[int | None, int]) -> tuple[int | None, int | None, int]:
    return (item[0], current_epoch(), item[1])  # async: on the run's loop, in its stage task


def _epochs(pipe: Pipeline[Any]) -> tuple[int, set[Any]]:
    with pipe.open() as run:
        items = list(run)
        return run.epoch, {item[:2] for item in items}


def test_outside_a_run_there_is_no_epoch() -> None:
    assert current_epoch() is None


def test_the_source_and_stages_read_the_runs_epoch_run_after_run() -> None:
    pipe = Pipeline(Listed()).map(_async_stage)
    for expected in range(3):
        epoch, seen = _epochs(pipe)
        assert epoch == expected and seen == {(expected, expected)}


def test_a_derived_pipeline_counts_on_with_the_same_owner() -> None:
    pipe = Pipeline(Listed()).map(_async_stage)
    _epochs(pipe)
    derived = pipe.with_options(max_failures=0)  # shares the source, and its count
    assert _epochs(derived) == (1, {(1, 1)})
    assert _epochs(pipe) == (2, {(2, 2)})


def test_with_source_sets_the_epoch_its_runs_read() -> None:
    pipe = Pipeline(Listed()).map(_async_stage).with_source(Listed(), epoch=5)
    assert _epochs(pipe) == (5, {(5, 5)})
    assert _epochs(pipe) == (6, {(6, 6)})


def test_a_resumed_run_reads_the_saved_epoch_then_counts_on() -> None:
    pipe = Pipeline(Listed(20)).map(_async_stage)
    _epochs(pipe), _epochs(pipe)
    with pipe.open() as run:
        head = list(itertools.islice(run, 7))
        state = json.loads(json.dumps(pipe.state_dict()))
    assert state["epoch"] == 2 and {h[:2] for h in head} == {(2, 2)}
    resumed = Pipeline(Listed(20)).map(_async_stage)
    resumed.load_state_dict(state)
    epoch, seen = _epochs(resumed)
    assert epoch == 2 and seen == {(2, 2)}
    assert _epochs(resumed) == (3, {(3, 3)})


def _tagged(name: str, n: int) -> Pipeline[Any]:
    async def tag(item: tuple[int | None, int]) -> tuple[str, int | None, int | None, int]:
        return (name, item[0], current_epoch(), item[1])

    return Pipeline(Listed(n), name=name).map(tag)


def test_a_restarted_branch_reads_its_inputs_next_epoch() -> None:
    merged = mix([_tagged("short", 2), _tagged("long", 9)], seed=1, stop="never")
    with merged.open() as run:
        items = list(itertools.islice(run, 40))
        assert run.epoch == 0
    # the source and the stage of a branch read the same epoch: the input's, which each
    # restart moves on (0, 1, 2, ...), in the order the short input's items come
    assert all(source == stage for _, source, stage, _ in items)
    eras = [epoch for name, epoch, _, _ in items if name == "short"]
    assert eras == sorted(eras) and eras[0] == 0 and eras[-1] >= 3
    assert [i for name, _, _, i in items if name == "short"][:4] == [0, 1, 0, 1]


def test_a_merge_resumes_each_branch_at_its_eras_epoch() -> None:
    def make() -> Pipeline[Any]:
        return mix([_tagged("a", 3), _tagged("b", 40)], seed=4, stop="cycle")

    full = list(itertools.islice(make(), 40))
    pipe = make()
    with pipe.open() as run:
        head = list(itertools.islice(run, 17))
        state = json.loads(json.dumps(pipe.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(itertools.islice(resumed, 40 - 17))
    assert head + rest == full  # each era's items carry the epoch its input read then


def test_set_epoch_numbers_the_next_run_and_its_derived_pipelines_count_on() -> None:
    pipe = Pipeline(Listed()).map(_async_stage)
    derived = pipe.with_options(max_failures=0)
    pipe.set_epoch(4)
    assert _epochs(derived) == (4, {(4, 4)})
    assert _epochs(pipe) == (5, {(5, 5)})
    state = pipe.state_dict()
    assert state["epoch"] == 5
    for bad in (-1, True, 1.0):
        with pytest.raises(ConfigError, match="epoch must be an int >= 0"):
            pipe.set_epoch(bad)  # type: ignore[arg-type]



def test_a_call_handed_to_the_runs_threads_reads_it_too() -> None:
    async def on_thread(item: tuple[int | None, int]) -> tuple[int | None, int | None, int]:
        return (item[0], await run_thread(current_epoch), item[1])

    pipe = Pipeline(Listed()).map(on_thread).with_source(Listed(), epoch=3)
    assert _epochs(pipe) == (3, {(3, 3)})
