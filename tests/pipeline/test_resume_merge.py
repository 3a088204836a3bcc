"""Resuming a merge (``asyncflow.mix``): exactly the remaining items, in the same order."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, mix


def _odd(x: int) -> bool:
    return x % 3 != 0


def _twice(x: int) -> list[int]:
    return [x, x + 1] if x % 5 else []


def _mixed(stop: str = "all", *, ordered: bool = True) -> Pipeline[Any]:
    a = Pipeline(range(0, 120), name="a").map(lambda x: x, concurrency=3, ordered=ordered)
    b = Pipeline(list(range(1000, 1070)), name="b").filter(_odd)
    c = Pipeline(range(5000, 5030), name="c").flat_map(_twice)
    return mix([a, b, c], weights=[0.5, 0.3, 0.2], seed=3, stop=stop).batch(4)


def _resume(make: Any, k: int, *, epochs: int = 0) -> tuple[list[Any], list[Any]]:
    """The first ``k`` items of run ``epochs`` (earlier ones read whole), and what a new
    pipeline given the state then yields."""
    first = make()
    for _ in range(epochs):
        list(first)
    with first.open() as run:
        head = [next(run) for _ in range(k)]
        state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    return head, list(resumed)


@pytest.mark.parametrize("stop", ["first", "all"])
def test_a_resumed_mix_yields_the_rest_in_the_same_order(stop: str, leak_check: None) -> None:
    full = list(_mixed(stop))
    assert len(full) > 10
    for k in (0, 1, 3, len(full) // 2, len(full) - 1, len(full)):
        head, rest = _resume(lambda: _mixed(stop), k)
        assert head == full[:k] and rest == full[k:], k


def test_a_later_epoch_resumes_its_own_picks() -> None:
    pipe = _mixed()
    list(pipe)
    second = list(pipe)
    assert second != list(_mixed())  # new picks each epoch
    head, rest = _resume(_mixed, 5, epochs=1)
    assert head + rest == second


def test_unordered_branches_resume_the_same_multiset() -> None:
    full = [x for batch in _mixed(ordered=False) for x in batch]
    for k in (2, 9):
        head, rest = _resume(lambda: _mixed(ordered=False), k)
        got = [x for batch in head + rest for x in batch]
        assert Counter(got) == Counter(full)


def test_resume_twice_in_a_row() -> None:
    full = list(_mixed())
    head, state_items = [], []
    first = _mixed()
    with first.open() as run:
        head = [next(run) for _ in range(4)]
        state = json.loads(json.dumps(first.state_dict()))
    second = _mixed()
    second.load_state_dict(state)
    with second.open() as run:
        state_items = [next(run) for _ in range(5)]
        state = json.loads(json.dumps(second.state_dict()))
    third = _mixed()
    third.load_state_dict(state)
    assert head + state_items + list(third) == full


def test_the_state_holds_each_branch_bounded() -> None:
    pipe = _mixed()
    with pipe.open() as run:
        for _ in range(6):
            next(run)
        state = pipe.state_dict()
    branches = state["nodes"]["mix"]["branches"]
    assert [set(b) for b in branches] == [{"done", "eras"}] * 3
    assert [b["done"] for b in branches] == [[]] * 3  # no input restarted
    assert [[set(e) for e in b["eras"]] for b in branches] == [
        [{"epoch", "positions", "nodes", "taken"}]] * 3
    assert len(json.dumps(state)) < 3000


def test_a_state_after_a_branch_restarted_resumes_exactly() -> None:
    # (Once refused with a ConfigError; tests/pipeline/test_merge_restart_resume.py holds more.)
    def make() -> Pipeline[Any]:
        return mix([Pipeline(range(3), name="a"), Pipeline(range(100, 200), name="b")],
                   seed=0, stop="cycle")

    full = list(make())
    head, rest = _resume(make, 40)
    assert head.count(0) >= 2  # "a" ran out and restarted by now
    assert head + rest == full


def test_a_cycling_mix_resumes_before_any_restart() -> None:
    def make() -> Pipeline[Any]:
        return mix([Pipeline(range(30), name="a"), Pipeline(range(100, 110), name="b")],
                   seed=1, stop="cycle")

    full = list(make())
    head, rest = _resume(make, 6)
    assert head + rest == full


def test_a_state_of_another_mix_is_refused() -> None:
    pipe = _mixed()
    with pipe.open() as run:
        next(run)
        state = pipe.state_dict()
    other = mix([Pipeline(range(5), name="a"), Pipeline(range(5), name="b")], seed=3).batch(4)
    with pytest.raises(ConfigError, match=r"inputs \(the pipelines merged\) differ"):
        other.load_state_dict(state)
