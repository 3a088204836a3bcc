"""A merge branch that ends its own stream: an ``END_OF_STREAM`` item from its stages, while
its source could go on (``asyncflow/pipeline/_merge_end.py``)."""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import pytest

from asyncflow import Pipeline, PipelineError
from asyncflow.pipeline import END_OF_STREAM, BranchEnd, EndOfStream, Merge, Processes

from .test_merge import RoundRobin


class Upto:
    """A worker's own iterator of ``n`` items, one a call: ``END_OF_STREAM`` once it has run
    out (its tasks, from an endless source, say nothing of where it ends)."""

    def __init__(self, n: int, tag: int, bad: int | None = None) -> None:
        self.n, self.tag, self.bad = n, tag, bad
        self.items = iter(range(n))
        self.ended = False

    def __call__(self, task: int) -> Any:
        if task == 0:  # a new era of the branch: a new iterator
            self.items, self.ended = iter(range(self.n)), False
        x = next(self.items, None)
        if x is None:  # the first end says where it stands, any later one nothing
            ended, self.ended = self.ended, True
            return END_OF_STREAM if ended else EndOfStream(f"{self.tag} ended after {self.n}")
        if x == self.bad:
            raise ValueError(f"item {x} is bad")
        return (self.tag, x)


def _lanes(sizes: list[int], window: int | None, bad: int | None = None,
           policy: Any = None, on_end: Any = None) -> Pipeline:
    inputs = [
        Pipeline(itertools.count, name=f"w{w}", window=window, max_failures=1.0).map(
            Upto(n, w, bad), name="fetch")
        for w, n in enumerate(sizes)
    ]
    return Pipeline(Merge(inputs, policy or RoundRobin(), name="lanes", on_end=on_end))


@pytest.mark.parametrize("window", [None, 2])
def test_a_branch_ends_where_its_stages_say_and_counts_only_its_items(
    window: int | None, leak_check: None
) -> None:
    ends: list[tuple[int, Any]] = []
    pipe = _lanes([3, 1], window, on_end=lambda branch, value: ends.append((branch, value)))
    # RoundRobin takes branch 1 first; branch 1 ends after its one item, branch 0 after three
    assert list(pipe) == [(1, 0), (0, 0), (0, 1), (0, 2)]
    stats = pipe.stats()
    assert [(s.name, s.items_in, s.items_out) for s in stats.stages
            if not s.name.endswith("/source")] == [
        ("w0/fetch", 3, 3), ("w1/fetch", 1, 1), ("lanes", 4, 4)]
    if window is not None:  # without one the source's chunks are what it counts
        assert [stats["w0/source"].items_out, stats["w1/source"].items_out] == [3, 1]
    assert stats.delivered == 4
    assert not stats.running
    assert ends == [(1, "1 ended after 1"), (0, "0 ended after 3")]


def test_items_failed_before_the_end_count_in_the_stages_that_took_them(
    leak_check: None,
) -> None:
    pipe = _lanes([4], 2, bad=1)
    assert list(pipe) == [(0, 0), (0, 2), (0, 3)]
    stats = pipe.stats()
    assert [(s.name, s.items_in, s.items_out, s.failures) for s in stats.stages] == [
        ("w0/source", 0, 4, 0), ("w0/fetch", 4, 3, 1), ("lanes", 3, 3, 0)]


class RestartOnce(RoundRobin):
    def open(self, epoch: int, branches: int) -> Any:
        turns = super().open(epoch, branches)
        turns.restarted = False
        ended = turns.ended

        def once(branch: int, *, empty: bool) -> BranchEnd:
            if not turns.restarted:
                turns.restarted = True
                return "restart"
            return ended(branch, empty=empty)

        turns.ended = once
        return turns


def test_a_restarted_branch_counts_on_from_its_earlier_eras(leak_check: None) -> None:
    pipe = _lanes([2], 1, policy=RestartOnce())
    assert list(pipe) == [(0, 0), (0, 1), (0, 0), (0, 1)]
    stats = pipe.stats()
    assert [(s.name, s.items_in, s.items_out) for s in stats.stages] == [
        ("w0/source", 0, 4), ("w0/fetch", 4, 4), ("lanes", 4, 4)]


def test_the_marker_is_one_object_in_every_process_and_a_value_crosses_with_its_own() -> None:
    assert pickle.loads(pickle.dumps(END_OF_STREAM)) is END_OF_STREAM
    assert repr(END_OF_STREAM) == "END_OF_STREAM"
    end = pickle.loads(pickle.dumps(EndOfStream({"pos": 3})))
    assert isinstance(end, EndOfStream) and end.value == {"pos": 3}


def test_a_break_while_a_branch_is_ending_leaves_nothing_running(leak_check: None) -> None:
    for item in _lanes([1, 50], 2):
        assert item == (1, 0)
        break


class FirstEnds:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, task: int) -> Any:
        return self.value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("window", [None, 1])
@pytest.mark.parametrize("marker", [END_OF_STREAM, EndOfStream("empty")])
def test_a_branch_whose_first_item_is_its_end(window: int | None, marker: Any,
                                               leak_check: None) -> None:
    ends: list[tuple[int, Any]] = []
    seen: list[tuple[int, bool]] = []

    class Watch(RoundRobin):
        def open(self, epoch: int, branches: int) -> Any:
            turns = super().open(epoch, branches)
            ended = turns.ended

            def spy(branch: int, *, empty: bool) -> Any:
                seen.append((branch, empty))
                return ended(branch, empty=empty)

            turns.ended = spy
            return turns

    inputs = [
        Pipeline(itertools.count, name="empty", window=window).map(FirstEnds(marker),
                                                                    name="fetch"),
        Pipeline(range(3), name="full", window=window).map(lambda x: x, name="fetch"),
    ]
    pipe = Pipeline(Merge(inputs, Watch(), name="lanes",
                          on_end=lambda b, v: ends.append((b, v))))
    assert list(pipe) == [0, 1, 2]
    assert ends == [(0, marker.value)]
    assert (0, True) in seen
    stats = pipe.stats()
    assert stats["empty/fetch"].items_out == 0
    assert stats["lanes"].items_out == 3


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle this state")


def _end_unpicklable(task: int) -> Any:
    if task < 2:
        return task
    return EndOfStream(Unpicklable())


@pytest.mark.timeout(60)
def test_an_end_whose_value_cannot_cross_from_a_worker_process_fails_naming_its_stage(
    leak_check: None,
) -> None:
    inputs = [Pipeline(itertools.count, name="w0", window=2).map(
        _end_unpicklable, name="fetch", workers=Processes(start_method="fork"))]
    pipe = Pipeline(Merge(inputs, RoundRobin(), name="lanes"))
    with pytest.raises(PipelineError) as info:
        list(pipe)
    text = str(info.value) + "".join(str(e) for e in info.value.exceptions)
    assert "w0/fetch" in text, text


def test_only_a_merge_reads_the_marker() -> None:
    """Outside a merge branch the marker is an item like any other: the consumer gets it."""

    def ends_at_3(x: int) -> Any:
        return END_OF_STREAM if x == 3 else x

    assert list(Pipeline(range(6)).map(ends_at_3)) == [0, 1, 2, END_OF_STREAM, 4, 5]
