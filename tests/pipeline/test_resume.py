"""Resumable iteration of pipelines whose source is a sampler."""

from __future__ import annotations

import pytest

from asyncflow import Pipeline
from asyncflow.sources import RandomSampler, SequentialSampler

pytestmark = pytest.mark.usefixtures("leak_check")


def load(i: int) -> int:
    return 1000 + i


def build(seed: int = 3) -> Pipeline:
    return Pipeline(RandomSampler(100, seed=seed)).map(load, concurrency=3).batch(8).prefetch(2)


def test_a_resumed_pipeline_yields_exactly_the_remaining_batches_in_order() -> None:
    full = list(build())
    pipe = build()
    with pipe.open() as run:
        taken = [next(run) for _ in range(4)]
        state = pipe.state_dict()
    assert taken == full[:4]
    assert state["offset"] == 32

    resumed = build()
    resumed.load_state_dict(state)
    assert list(resumed) == full[4:]
    # the run after the resumed one is the next epoch, from its start, as in the reference
    reference = build()
    list(reference)
    with reference.open() as run:
        expected = next(run)
    with resumed.open() as run:
        assert next(run) == expected


def test_resume_twice_in_a_row() -> None:
    full = list(build(seed=9))
    pipe = build(seed=9)
    with pipe.open() as run:
        next(run)
        state = pipe.state_dict()
    second = build(seed=9)
    second.load_state_dict(state)
    with second.open() as run:
        assert next(run) == full[1]
        assert next(run) == full[2]
        state = second.state_dict()
    assert state["offset"] == 24
    third = build(seed=9)
    third.load_state_dict(state)
    assert list(third) == full[3:]


def test_state_after_a_finished_epoch_resumes_to_nothing() -> None:
    pipe = Pipeline(SequentialSampler(10)).batch(5)
    assert len(list(pipe)) == 2
    state = pipe.state_dict()
    assert state["offset"] == 10
    again = Pipeline(SequentialSampler(10)).batch(5)
    again.load_state_dict(state)
    assert list(again) == []


@pytest.mark.parametrize(
    ("build_other", "ordered"),
    [
        (lambda p: p.filter(lambda i: i % 3 != 0), True),
        (lambda p: p.map(load, ordered=False, concurrency=3), False),
        (lambda p: p.map(lambda i: 1 // (i % 4), max_failures=30), True),
        (lambda p: p.shuffle(seed=1, buffer_size=8), False),
    ],
    ids=["filter", "unordered", "failure-budget", "shuffle"],
)
def test_sampler_pipelines_of_any_stage_resume_exactly(build_other, ordered) -> None:
    # (these refused to save a state before every stage kept one)
    def make() -> Pipeline:
        return build_other(Pipeline(RandomSampler(60, seed=4)))

    full = list(make())
    pipe = make()
    with pipe.open() as run:
        taken = [next(run) for _ in range(11)]
        state = pipe.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert (taken + rest == full) if ordered else sorted(taken + rest) == sorted(full)


def test_any_source_resumes_not_only_samplers() -> None:
    # (a non-sampler source refused before)
    pipe = Pipeline(range(10)).batch(3)
    with pipe.open() as run:
        assert next(run) == [0, 1, 2]
        state = pipe.state_dict()
    again = Pipeline(range(10)).batch(3)
    again.load_state_dict(state)
    assert list(again) == [[3, 4, 5], [6, 7, 8], [9]]


def test_a_sampler_state_of_the_earlier_format_still_loads() -> None:
    full = list(build())
    legacy = {"epoch": 0, "seed": 3, "offset": 16}  # a sampler's state plus offset
    resumed = build()
    resumed.load_state_dict(legacy)
    assert list(resumed) == full[2:]
