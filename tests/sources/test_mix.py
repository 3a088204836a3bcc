"""mix(): weighted draws from several pipelines, reproducible, with every stop rule."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from asyncflow import ConfigError, Pipeline, PipelineError, mix


def tagged(tag: str, n: int) -> Pipeline:
    return Pipeline([(tag, i) for i in range(n)])


def test_draws_in_proportion_to_the_weights(leak_check: None) -> None:
    items = list(mix([tagged("a", 10_000), tagged("b", 10_000)], weights=[0.7, 0.3], seed=1))
    counts = collections.Counter(tag for tag, _ in items)
    assert counts["a"] == 10_000  # "first": ends when a runs out
    assert counts["b"] / len(items) == pytest.approx(0.3, abs=0.02)
    for tag in "ab":  # each source keeps its own order
        seq = [i for t, i in items if t == tag]
        assert seq == sorted(seq) and seq == list(range(len(seq)))


def test_reproducible_per_seed_and_new_per_epoch() -> None:
    def make(seed: int) -> Pipeline:
        return mix([tagged("a", 50), tagged("b", 50)], seed=seed, stop="all")

    mixed = make(3)
    first, second = list(mixed), list(mixed)
    assert first == list(make(3))
    assert first != second
    assert first != list(make(4))
    assert sorted(first) == sorted(second)


def test_stop_all_yields_every_item_once() -> None:
    items = list(mix([tagged("a", 30), tagged("b", 5), tagged("c", 0)], [1, 10, 1], stop="all"))
    assert sorted(items) == sorted([("a", i) for i in range(30)] + [("b", i) for i in range(5)])


def test_stop_cycle_restarts_until_every_source_ran_out() -> None:
    items = list(mix([tagged("a", 40), tagged("b", 3)], stop="cycle", seed=0))
    a = [i for t, i in items if t == "a"]
    b = [i for t, i in items if t == "b"]
    assert a == list(range(40))  # the mix ended when a ran out, the last to do so
    assert len(b) > 3 and b[:6] == [0, 1, 2, 0, 1, 2]


def test_stop_cycle_ends_with_a_source_of_weight_zero() -> None:
    # A source of weight 0 is never read, so it never runs out: "cycle" never ended.
    mixed = mix([tagged("a", 3), tagged("b", 2), tagged("c", 5)], [1, 0, 1], stop="cycle")
    items = list(itertools.islice(mixed, 1000))
    assert len(items) < 1000 and not any(tag == "b" for tag, _ in items)
    for tag, n in (("a", 3), ("c", 5)):
        assert {i for t, i in items if t == tag} == set(range(n))


async def test_stop_never_runs_until_the_consumer_stops(async_leak_check: None) -> None:
    count = 0
    async with mix([tagged("a", 3), tagged("empty", 0)], stop="never").open() as run:
        async for tag, _ in run:
            assert tag == "a"
            count += 1
            if count == 50:
                break
    assert count == 50


def test_break_stops_every_source(leak_check: None) -> None:
    for n, _ in enumerate(mix([tagged("a", 10**6), tagged("b", 10**6)])):
        if n == 10:
            break


def test_a_failing_source_fails_the_mix() -> None:
    def boom(x: tuple[str, int]) -> tuple[str, int]:
        if x[1] == 5:
            raise ValueError("bad item")
        return x

    with pytest.raises(PipelineError) as info:
        list(mix([tagged("a", 20).map(boom), tagged("b", 20)], stop="all"))
    assert info.group_contains(ValueError)


def reference(
    sources: Sequence[list[Any]], weights: Sequence[float], seed: int, epoch: int, stop: str
) -> list[Any]:
    """The picks of ``mix`` as it made them before it was an engine merge: one
    ``rng.choice`` per pick, seeded by (seed, epoch)."""
    n = len(sources)
    active = np.asarray(weights, dtype=np.float64) / sum(weights)
    rng = np.random.default_rng(np.random.SeedSequence([seed & (2**64 - 1), epoch]))
    its = [iter(s) for s in sources]
    ran_out, fresh, out = [False] * n, [True] * n, []
    while active.sum() > 0:
        i = int(rng.choice(n, p=active / active.sum()))
        try:
            item = next(its[i])
        except StopIteration:
            ran_out[i] = True
            if stop == "first" or (stop == "cycle" and all(ran_out)):
                return out
            if stop == "all" or fresh[i]:
                active[i] = 0.0
            else:
                its[i], fresh[i] = iter(sources[i]), True
            continue
        fresh[i] = False
        out.append(item)
    return out


@pytest.mark.parametrize("stop", ["first", "all", "cycle"])
@pytest.mark.parametrize(
    ("sizes", "weights", "seed"),
    [
        ((300, 40, 7), (1, 2, 3), 0),
        ((50, 0, 90), (0.2, 0.5, 0.3), 11),
        ((5, 60), (0.05, 0.95), 2**70),
    ],
)
def test_picks_are_those_mix_made_before(
    stop: str, sizes: tuple[int, ...], weights: tuple[float, ...], seed: int
) -> None:
    sources = [[(tag, i) for i in range(n)] for tag, n in zip("abc", sizes, strict=False)]
    mixed = mix([Pipeline(s) for s in sources], weights, seed, stop=stop)
    for epoch in range(2):
        assert list(mixed) == reference(sources, weights, seed, epoch, stop)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (([],), {}),
        (([[1, 2]],), {}),
        (([Pipeline([1])], [1, 2]), {}),
        (([Pipeline([1])], [-1]), {}),
        (([Pipeline([1])], [0]), {}),
        (([Pipeline([1])],), {"stop": "sometimes"}),
        (([Pipeline([1])],), {"seed": "x"}),
    ],
)
def test_bad_arguments(args: tuple, kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        mix(*args, **kwargs)


@pytest.mark.parametrize("weights", [["a", "b"], [[1.0], [2.0]], [float("nan"), 1.0]])
def test_weights_are_checked_as_a_weighted_samplers_are(weights: Any) -> None:
    # One check of weights (``_orders.probabilities``): text was a bare numpy ValueError.
    with pytest.raises(ConfigError, match=r"^mix: weights"):
        mix([Pipeline([1]), Pipeline([2])], weights)


def test_weights_whose_sum_overflows_still_mix() -> None:
    # The probabilities were all 0: the mix ended at once, an empty epoch with no error.
    items = list(mix([tagged("a", 20), tagged("b", 20)], [1e308, 1e308], stop="all"))
    assert len(items) == 40


@pytest.mark.parametrize("weights", [[-1.0, 1.0], [0.0, 0.0], [float("inf"), 1.0]])
def test_bad_weight_values_name_the_mix(weights: list[float]) -> None:
    with pytest.raises(ConfigError, match=r"^mix: weights must be finite"):
        mix([Pipeline([1]), Pipeline([2])], weights)
