"""Resumable iteration of pipelines whose source is a sampler."""

from __future__ import annotations

import pytest

from asyncflow import ConfigError, Pipeline
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
    ("build_bad", "stage"),
    [
        (lambda p: p.filter(bool), "filter"),
        (lambda p: p.map(load, ordered=False), "load"),
        (lambda p: p.map(load, max_failures=3), "load"),
        (lambda p: p.shuffle(seed=1), "shuffle"),
    ],
)
def test_pipelines_that_cannot_count_refuse_naming_the_stage(build_bad, stage) -> None:
    pipe = build_bad(Pipeline(SequentialSampler(10)))
    with pytest.raises(ConfigError, match=stage):
        pipe.state_dict()


def test_non_sampler_sources_refuse() -> None:
    with pytest.raises(ConfigError, match="sampler"):
        Pipeline(range(10)).state_dict()
    with pytest.raises(ConfigError, match="sampler"):
        Pipeline(range(10)).load_state_dict({"offset": 1})
