"""``Span`` checked against a plain set of ints on random inputs."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import pytest

from asyncflow import Pipeline
from asyncflow.pipeline._span import Span


def _members(span: Span, limit: int) -> set[int]:
    return {i for i in range(limit) if i in span}


def _random_span(rng: random.Random, limit: int) -> tuple[Span, set[int]]:
    mark = rng.choice([0, 0, rng.randrange(limit // 2)])
    ranges = []
    for _ in range(rng.randrange(12)):
        start = rng.randrange(limit)
        ranges.append((start, min(limit, start + rng.randrange(1, 8))))
    model = set(range(mark)) | {i for a, b in ranges for i in range(a, b)}
    return Span(mark, ranges), model


@pytest.mark.parametrize("seed", range(40))
def test_span_matches_a_set(seed: int) -> None:
    rng = random.Random(seed)
    limit = 80
    span, model = _random_span(rng, limit)
    assert _members(span, limit) == model
    assert len(span) == len(model)
    assert all(span.mark < a < b for a, b in span.ranges)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(span.ranges))
    for _ in range(30):
        start = rng.randrange(limit + 4)
        end = rng.randrange(limit + 4)
        inside = [i for i in range(start, end) if i in model]
        within = list(span.within(start, end))
        assert [i for a, b in within for i in range(a, b)] == inside
        assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(within))
        missing = [i for i in range(start, end) if i not in model]
        assert [i for a, b in span.gaps(start, end) for i in range(a, b)] == missing
    other, other_model = _random_span(rng, limit)
    assert _members(span.union(other), limit) == model | other_model
    ordinals = rng.sample(range(limit), rng.randrange(20)) * rng.choice([1, 2])
    joined = Span.of(span.mark, list(ordinals), span.ranges)
    assert joined == span.union(Span(0, [(o, o + 1) for o in ordinals]))
    assert Span.from_json(span.to_json(), "span") == span


def _expand(x: int) -> list[int]:
    return [x] * (x % 3)


def _shaky(x: int) -> int:
    if x % 13 == 5:
        raise ValueError(x)
    return x


def _fresh_state(pipe: Any) -> dict[str, Any]:
    """The state computed from scratch: every ledger's remembered answers forgotten."""
    lineage = pipe._last[0].lineage  # a look inside: the memos are private
    for ledger in lineage.ledgers:
        for name in ("_memo", "_state_memo", "_cache"):
            if hasattr(ledger, name):
                setattr(ledger, name, None)
    return pipe.state_dict()  # type: ignore[no-any-return]


@pytest.mark.usefixtures("leak_check")
@pytest.mark.parametrize("seed", range(3))
def test_remembered_answers_match_fresh_ones(seed: int) -> None:
    """``state_dict()`` called again and again while the run goes on (the ledgers reuse
    their last answers where nothing changed) equals the state computed from scratch."""
    rng = random.Random(seed)
    pipe = (
        Pipeline(range(3000), max_failures=1.0)
        .map(_shaky, concurrency=4, ordered=False)
        .filter(lambda x: x % 5 != 0)
        .flat_map(_expand)
        .shuffle(buffer_size=64, seed=seed)
        .batch(4)
        .prefetch(4)
    )
    with pipe.open() as run:
        lineage = pipe._last[0].lineage  # a look inside: held, no record changes meanwhile
        for _ in range(40):
            for _ in range(rng.randrange(4)):
                next(run)
            time.sleep(rng.choice([0, 0.001, 0.005]))  # the stages go on meanwhile
            with lineage.lock:
                first = _settled(pipe.state_dict())
                again = _settled(pipe.state_dict())
                assert again == first
                first["nodes"].clear()  # the caller's copy: the next state is whole
                first["positions"]["ranges"].clear()
                assert _settled(pipe.state_dict()) == again
                assert _settled(_fresh_state(pipe)) == again


def _settled(state: dict[str, Any]) -> dict[str, Any]:
    """What a state says was settled (the failure counts go on changing meanwhile)."""
    return {"positions": state["positions"], "nodes": state["nodes"]}
