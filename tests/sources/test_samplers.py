"""Index samplers: orders, epochs, torch's DistributedSampler semantics, resume."""

from __future__ import annotations

import collections
import itertools
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from asyncflow import ConfigError, ConfigTypeError
from asyncflow.sources._samplers import (
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    WeightedRandomSampler,
)


def test_sequential_yields_every_index_in_order() -> None:
    assert list(SequentialSampler(5)) == [0, 1, 2, 3, 4]
    assert list(SequentialSampler(["a", "b"])) == [0, 1]
    assert len(SequentialSampler(range(7))) == 7
    assert list(SequentialSampler(0)) == []


@pytest.mark.parametrize("bad", [-1, True, 1.5, object()])
def test_bad_length_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError):
        SequentialSampler(bad)  # type: ignore[arg-type]


def test_random_is_a_permutation_reproducible_per_seed_and_epoch() -> None:
    a, b = RandomSampler(100, seed=3), RandomSampler(100, seed=3)
    first = list(a)
    assert sorted(first) == list(range(100))
    assert first != list(range(100))
    assert list(b) == first
    a.set_epoch(0)
    assert list(a) == first  # same epoch, same order
    a.set_epoch(1)
    second = list(a)
    assert sorted(second) == list(range(100)) and second != first
    assert list(RandomSampler(100, seed=4)) != first


def test_random_seed_none_is_drawn_once_and_kept() -> None:
    s = RandomSampler(50)
    assert s.indices(0) == s.indices(0)
    assert list(RandomSampler(50, seed=s.seed)) == s.indices(0)
    assert RandomSampler(50).seed != s.seed


def test_random_ignores_global_numpy_state() -> None:
    import numpy as np

    np.random.seed(1)
    one = list(RandomSampler(30, seed=9))
    np.random.seed(2)
    assert list(RandomSampler(30, seed=9)) == one


def test_random_with_replacement_and_num_samples() -> None:
    s = RandomSampler(10, replacement=True, num_samples=1000, seed=0)
    drawn = list(s)
    assert len(drawn) == len(s) == 1000
    assert set(drawn) == set(range(10))
    longer = list(RandomSampler(10, num_samples=25, seed=0))
    assert len(longer) == 25
    assert sorted(longer[:10]) == sorted(longer[10:20]) == list(range(10))
    assert len(set(longer[20:])) == 5


def test_random_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        RandomSampler(10, num_samples=-1)
    with pytest.raises(ConfigError):
        RandomSampler(0, num_samples=3)
    with pytest.raises(ConfigError):
        RandomSampler(10, seed="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        RandomSampler(10).set_epoch(-1)


def test_weighted_follows_the_weights() -> None:
    s = WeightedRandomSampler([0.0, 1.0, 3.0], num_samples=40_000, seed=1)
    counts = collections.Counter(s)
    assert counts[0] == 0
    assert counts[2] / counts[1] == pytest.approx(3.0, rel=0.05)
    s.set_epoch(1)
    assert list(s) != list(WeightedRandomSampler([0.0, 1.0, 3.0], 40_000, seed=1))


def test_weighted_without_replacement_draws_distinct_indices() -> None:
    drawn = list(WeightedRandomSampler([1, 2, 3, 4, 0], num_samples=4, replacement=False, seed=0))
    assert sorted(drawn) == [0, 1, 2, 3]
    with pytest.raises(ConfigError):
        WeightedRandomSampler([1, 0, 0], num_samples=2, replacement=False)


@pytest.mark.parametrize(
    "weights", [[], [0, 0], [1, -1], [1, float("nan")], [[1, 2]]]
)
def test_weighted_rejects_bad_weights(weights: object) -> None:
    with pytest.raises(ConfigError):
        WeightedRandomSampler(weights, num_samples=1)


def test_weighted_takes_weights_whose_sum_overflows() -> None:
    # Each weight is finite, their sum is not: the probabilities were all 0, and drawing
    # failed with NumPy's bare "Probabilities do not sum to 1" (after an overflow warning).
    huge = sys.float_info.max
    drawn = list(WeightedRandomSampler([huge, 0.0, huge], num_samples=400, seed=0))
    assert set(drawn) == {0, 2} and 150 < drawn.count(0) < 250


@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_matches_torch_without_shuffle(drop_last: bool) -> None:
    from torch.utils.data import DistributedSampler as TorchDistributedSampler

    for n, world in itertools.product([1, 2, 5, 7, 10, 16, 17], [1, 2, 3, 4, 8]):
        if drop_last and n < world:
            continue
        for rank in range(world):
            ours = DistributedSampler(
                n, num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
            )
            theirs = TorchDistributedSampler(
                range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
            )
            assert list(ours) == list(theirs), (n, world, rank)
            assert len(ours) == len(theirs)


@pytest.mark.parametrize(("n", "world"), [(10, 3), (12, 4), (7, 8), (100, 3)])
def test_distributed_shuffled_shards_pad_like_torch(n: int, world: int) -> None:
    shards = [list(DistributedSampler(n, world, r, seed=5)) for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    interleaved = [shards[i % world][i // world] for i in range(len(shards[0]) * world)]
    order = interleaved[:n]
    assert sorted(order) == list(range(n))  # the first n positions are a permutation
    pad = len(interleaved) - n
    assert interleaved[n:] == (order * (pad // n + 1))[:pad]  # padded from the start, as torch


def test_distributed_drop_last_shards_are_disjoint() -> None:
    shards = [set(DistributedSampler(10, 3, r, drop_last=True, seed=1)) for r in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]
    assert not (shards[0] & shards[1] or shards[1] & shards[2] or shards[0] & shards[2])


def test_distributed_reshuffles_per_epoch_identically_on_every_rank() -> None:
    ranks = [DistributedSampler(20, 2, r, seed=0) for r in range(2)]
    orders = []
    for epoch in range(2):
        for s in ranks:
            s.set_epoch(epoch)
        orders.append([list(s) for s in ranks])
    for shards in orders:
        assert sorted(shards[0] + shards[1]) == list(range(20))
    assert orders[0] != orders[1]


def test_distributed_reads_rank_and_world_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    s = DistributedSampler(16, shuffle=False)
    assert (s.rank, s.num_replicas) == (2, 4)
    assert list(s) == [2, 6, 10, 14]
    assert DistributedSampler(16, rank=1).rank == 1
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="rank 4"):
        DistributedSampler(16)
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ConfigError, match="RANK"):
        DistributedSampler(16)


def test_distributed_defaults_to_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    s = DistributedSampler(5, shuffle=False)
    assert (s.rank, s.num_replicas, list(s)) == (0, 1, [0, 1, 2, 3, 4])


def test_distributed_prefers_an_initialized_process_group(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        s = DistributedSampler(5)
        assert (s.rank, s.num_replicas) == (0, 1)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "make",
    [
        lambda: SequentialSampler(23),
        lambda: RandomSampler(23),
        lambda: WeightedRandomSampler(list(range(1, 24)), 23),
        lambda: DistributedSampler(23, 2, 1, seed=4),
    ],
)
def test_resume_mid_epoch_yields_exactly_the_rest(make: object) -> None:
    sampler = make()  # type: ignore[operator]
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_epoch(3)
    it = iter(sampler)
    head = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    assert state["offset"] == 5 and state["epoch"] == 3
    fresh = make()  # type: ignore[operator]
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    fresh.set_epoch(3)
    assert list(fresh) == full  # the offset applies to one iteration only


def test_load_state_dict_rejects_garbage() -> None:
    s = RandomSampler(5)
    with pytest.raises(ConfigError):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(ConfigError):
        s.load_state_dict({"epoch": 0, "seed": 1, "offset": 6})


def test_torch_dataloader_accepts_our_sampler() -> None:
    import torch
    from torch.utils.data import DataLoader

    batches = list(DataLoader(list(range(10)), batch_size=4, sampler=SequentialSampler(10)))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(isinstance(b, torch.Tensor) for b in batches)


def test_samplers_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from asyncflow.sources import DistributedSampler, RandomSampler\n"
        "list(DistributedSampler(10)); list(RandomSampler(10))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_sampler_is_a_pipeline_source() -> None:
    from asyncflow import Pipeline

    sampler = RandomSampler(20, seed=1)
    pipe = Pipeline(sampler).map(lambda i: i * 10)
    assert list(pipe) == [i * 10 for i in sampler.indices(0)]
    assert list(pipe) == [i * 10 for i in sampler.indices(1)]  # each run reshuffles
    sampler.set_epoch(5)
    assert list(pipe) == [i * 10 for i in sampler.indices(5)]


# -- epochs: random samplers reshuffle on each iteration, as torch's do ---------------------

RESHUFFLING: dict[str, Callable[[], Any]] = {
    "random": lambda: RandomSampler(40, seed=7),
    "random with replacement": lambda: RandomSampler(40, replacement=True, seed=7),
    "weighted": lambda: WeightedRandomSampler(list(range(1, 41)), 40, seed=7),
}


@pytest.mark.parametrize("name", list(RESHUFFLING))
def test_each_iteration_is_the_next_epoch_without_set_epoch(name: str) -> None:
    sampler = RESHUFFLING[name]()
    orders = [list(sampler) for _ in range(3)]
    assert len({tuple(o) for o in orders}) == 3
    assert orders == [sampler.indices(e) for e in range(3)]
    assert sampler.state_dict()["epoch"] == sampler.epoch == 2
    assert list(RESHUFFLING[name]()) == orders[0]  # reproducible from (seed, epoch)


@pytest.mark.parametrize("name", list(RESHUFFLING))
def test_set_epoch_pins_the_next_iteration_only(name: str) -> None:
    sampler = RESHUFFLING[name]()
    sampler.set_epoch(5)
    assert sampler.state_dict() == {"epoch": 5, "seed": 7, "offset": 0}
    assert list(sampler) == sampler.indices(5)
    assert list(sampler) == sampler.indices(6)
    sampler.set_epoch(0)
    assert list(sampler) == sampler.indices(0)
    sampler.set_epoch(3)
    sampler.set_epoch(1)  # the latest call wins
    assert list(sampler) == sampler.indices(1)


def test_set_epoch_after_a_partial_iteration_starts_that_epoch_afresh() -> None:
    sampler = RandomSampler(30, seed=2)
    it = iter(sampler)
    next(it)
    sampler.set_epoch(0)
    assert sampler.state_dict()["offset"] == 0
    next(it)  # the abandoned iterator no longer moves the state
    assert sampler.state_dict() == {"epoch": 0, "seed": 2, "offset": 0}
    assert list(sampler) == sampler.indices(0)


def test_the_epoch_advances_at_the_first_index_not_at_iter() -> None:
    sampler = RandomSampler(30, seed=2)
    list(sampler)
    dropped, it = iter(sampler), iter(sampler)  # as torch's DataLoader with workers does
    assert sampler.state_dict() == {"epoch": 0, "seed": 2, "offset": 30}
    assert next(it) == sampler.indices(1)[0]
    assert sampler.state_dict() == {"epoch": 1, "seed": 2, "offset": 1}
    assert [next(it) for _ in range(3)] == sampler.indices(1)[1:4]
    assert sampler.state_dict()["offset"] == 4
    del dropped


def test_torch_dataloader_with_workers_reshuffles_from_epoch_zero() -> None:
    from torch.utils.data import DataLoader

    sampler = RandomSampler(8, seed=6)
    # batch_size=None: the loader iterates the sampler itself, not through a BatchSampler
    loader: Any = DataLoader(
        list(range(8)), batch_size=None, sampler=sampler, num_workers=1,  # type: ignore[arg-type]
        multiprocessing_context="forkserver",
    )
    epochs = [[int(i) for i in loader] for _ in range(2)]
    assert epochs == [sampler.indices(0), sampler.indices(1)]


def test_load_state_dict_pins_and_replays_mid_epoch() -> None:
    sampler = RandomSampler(30, seed=4)
    for _ in range(2):
        list(sampler)  # epochs 0 and 1
    it = iter(sampler)  # epoch 2
    head = [next(it) for _ in range(7)]
    state = sampler.state_dict()
    assert state == {"epoch": 2, "seed": 4, "offset": 7}
    resumed = RandomSampler(30, seed=99)
    for _ in range(3):
        list(resumed)  # an unrelated history: load_state_dict overrides it
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert head + list(resumed) == sampler.indices(2)
    assert resumed.state_dict() == {"epoch": 2, "seed": 4, "offset": 30}
    assert list(resumed) == sampler.indices(3)  # then on to the next epoch, from its start


def test_state_after_a_whole_iteration_replays_its_empty_rest() -> None:
    sampler = RandomSampler(10, seed=1)
    list(sampler)
    state = sampler.state_dict()
    assert state == {"epoch": 0, "seed": 1, "offset": 10}
    resumed = RandomSampler(10, seed=1)
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert list(resumed) == sampler.indices(1)


def test_sequential_keeps_the_same_epoch_bookkeeping() -> None:
    sampler = SequentialSampler(4)
    assert [list(sampler) for _ in range(3)] == [[0, 1, 2, 3]] * 3
    assert sampler.state_dict() == {"epoch": 2, "seed": 0, "offset": 4}
    sampler.set_epoch(9)
    assert list(sampler) == [0, 1, 2, 3] and sampler.epoch == 9


def test_distributed_repeats_its_order_until_set_epoch_as_torch() -> None:
    sampler = DistributedSampler(20, 2, 1, seed=3)
    orders = [list(sampler) for _ in range(3)]
    assert orders[0] == orders[1] == orders[2] == sampler.indices(0)
    assert sampler.state_dict()["epoch"] == 0
    sampler.set_epoch(1)
    assert list(sampler) == list(sampler) == sampler.indices(1) != orders[0]
    assert sampler.epoch == 1


def test_torch_dataloader_reshuffles_our_random_sampler_each_epoch() -> None:
    from torch.utils.data import DataLoader

    sampler = RandomSampler(12, seed=5)
    loader: Any = DataLoader(list(range(12)), batch_size=12, sampler=sampler)  # type: ignore[arg-type]
    epochs = [next(iter(loader)).tolist() for _ in range(2)]
    assert epochs == [sampler.indices(0), sampler.indices(1)]
    assert epochs[0] != epochs[1]


# -- the dataset's length is read at each iteration ------------------------------------------


def test_lengths_follow_a_dataset_that_grows_and_shrinks() -> None:
    data = list(range(5))
    sequential, shuffled = SequentialSampler(data), RandomSampler(data, seed=0)
    distributed = DistributedSampler(data, 2, 0, shuffle=False)
    assert (len(sequential), len(shuffled), len(distributed)) == (5, 5, 3)
    data.extend(range(5, 12))
    lengths = (len(sequential), len(shuffled), shuffled.num_samples, len(distributed))
    assert lengths == (12, 12, 12, 6)
    assert list(sequential) == list(range(12))
    assert sorted(shuffled) == list(range(12))
    assert list(distributed) == [0, 2, 4, 6, 8, 10]
    del data[3:]
    assert (len(sequential), len(shuffled), len(distributed)) == (3, 3, 2)
    assert list(sequential) == [0, 1, 2]
    assert sorted(shuffled) == [0, 1, 2]
    assert list(distributed) == [0, 2]


def test_fixed_lengths_stay_fixed() -> None:
    data = list(range(5))
    fixed = RandomSampler(data, num_samples=10, seed=0)
    from_int = RandomSampler(5, seed=0)
    assert collections.Counter(fixed.indices(0)) == dict.fromkeys(range(5), 2)
    data.extend(range(5, 10))
    assert len(fixed) == len(list(fixed)) == 10
    assert sorted(fixed.indices(0)) == list(range(10))
    assert len(from_int) == 5 and sorted(from_int) == list(range(5))


def test_an_empty_dataset_is_refused_as_torch_refuses_it() -> None:
    message = "num_samples should be a positive integer value, but got num_samples=0"
    empties: tuple[list[int], int] = ([], 0)
    for empty in empties:
        with pytest.raises(ConfigError) as caught:
            RandomSampler(empty)
        assert str(caught.value) == message
    with pytest.raises(ConfigError, match="cannot draw 3 samples from an empty dataset"):
        RandomSampler(0, num_samples=3)  # a fixed length: refused at once


def test_drawing_from_a_dataset_that_became_empty_raises_when_iterating() -> None:
    data = [1, 2, 3]
    by_length, by_count = RandomSampler(data, seed=0), RandomSampler(data, num_samples=2, seed=0)
    list(by_length)
    data.clear()
    assert len(by_length) == 0
    with pytest.raises(ConfigError, match="but got num_samples=0"):
        iter(by_length)
    with pytest.raises(ConfigError, match="cannot draw 2 samples from an empty dataset"):
        iter(by_count)
    assert by_length.state_dict()["epoch"] == 0  # a refused iteration is no epoch
    data.extend([4, 5])
    assert sorted(by_length) == [0, 1] and by_length.epoch == 1
    assert list(SequentialSampler(data)) == [0, 1]


# -- iteration is lazy ---------------------------------------------------------------------


def _peak_bytes(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_iteration_does_not_build_the_index_list(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 1_000_000
    eager = _peak_bytes(lambda: RandomSampler(n, seed=1).indices(0))
    lazy = _peak_bytes(lambda: next(iter(RandomSampler(n, seed=1))))
    # one int64 array (8 MB) rather than a list of a million ints (about 40 MB more)
    assert lazy < 2 * 8 * n < eager
    expected = RandomSampler(1000, seed=1).indices(0)

    def refuse(*args: object) -> list[int]:
        raise AssertionError("iteration called indices()")

    monkeypatch.setattr(RandomSampler, "indices", refuse)
    assert list(RandomSampler(1000, seed=1)) == expected
    assert 0 <= next(iter(RandomSampler(10**7, seed=1))) < 10**7


@pytest.mark.parametrize(
    "make",
    [
        lambda: SequentialSampler(3_000_000),
        lambda: RandomSampler(1_000_000, num_samples=3_000_000, seed=2),
        lambda: DistributedSampler(3_000_000, 2, 1, seed=2),
    ],
)
def test_other_samplers_iterate_lazily_too(make: Callable[[], Any]) -> None:
    peak = _peak_bytes(lambda: next(iter(make())))
    assert peak < 40 * 3_000_000  # a list of three million ints costs about 120 MB


def test_resuming_near_the_end_skips_without_iterating() -> None:
    sampler = RandomSampler(1_000_000, num_samples=2_500_000, seed=3)
    tail = sampler.indices(0)[-5:]
    sampler.load_state_dict({"epoch": 0, "seed": 3, "offset": 2_499_995})
    rest: list[int] = []

    def consume() -> None:
        for index in sampler:  # not list(): it would size its list by len(sampler)
            rest.append(index)

    # one permutation (8 MB) at a time, where iterating past the skipped ones costs ~100 MB
    assert _peak_bytes(consume) < 12 * 1_000_000
    assert rest == tail


def test_many_indices_come_out_as_python_ints_in_order() -> None:
    sampler = RandomSampler(10_000, num_samples=25_000, seed=8)
    drawn = list(sampler)
    assert drawn == sampler.indices(0)
    assert all(type(i) is int for i in drawn)
    assert sorted(drawn[:10_000]) == list(range(10_000))


# -- arguments are checked as torch checks them ----------------------------------------------

_TORCH_CASES: dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]] = {
    "replacement=0": ("RandomSampler", (range(10),), {"replacement": 0}),
    "replacement='yes'": ("RandomSampler", (range(10),), {"replacement": "yes"}),
    "num_samples=0": ("RandomSampler", (range(10),), {"num_samples": 0}),
    "num_samples=-3": ("RandomSampler", (range(10),), {"num_samples": -3}),
    "num_samples=2.5": ("RandomSampler", (range(10),), {"num_samples": 2.5}),
    "empty dataset": ("RandomSampler", ([],), {}),
    "weighted num_samples=0": ("WeightedRandomSampler", ([1.0, 2.0], 0), {}),
    "weighted num_samples=True": ("WeightedRandomSampler", ([1.0, 2.0], True), {}),
    "weighted num_samples=1.5": ("WeightedRandomSampler", ([1.0, 2.0], 1.5), {}),
    "weighted replacement=1": ("WeightedRandomSampler", ([1.0, 2.0], 2), {"replacement": 1}),
    "weighted 2d": ("WeightedRandomSampler", ([[1.0, 2.0]], 1), {}),
    "weighted scalar": ("WeightedRandomSampler", (5.0, 1), {}),
    "rank too high": ("DistributedSampler", (range(10),), {"num_replicas": 2, "rank": 2}),
    "rank negative": ("DistributedSampler", (range(10),), {"num_replicas": 3, "rank": -1}),
}


@pytest.mark.parametrize("case", list(_TORCH_CASES))
def test_bad_arguments_raise_torchs_exception_and_message(case: str) -> None:
    import torch.utils.data as tud

    from asyncflow import sources

    name, args, kwargs = _TORCH_CASES[case]
    with pytest.raises((TypeError, ValueError)) as theirs:
        getattr(tud, name)(*args, **kwargs)
    with pytest.raises(ConfigError) as ours:
        getattr(sources, name)(*args, **kwargs)
    assert str(ours.value) == str(theirs.value)
    assert isinstance(ours.value, type(theirs.value))
    is_type_error = isinstance(theirs.value, TypeError)
    assert isinstance(ours.value, ConfigTypeError) == is_type_error


def test_the_messages_read_as_torchs() -> None:
    with pytest.raises(ConfigTypeError) as caught:
        RandomSampler(10, replacement=0)  # type: ignore[arg-type]
    assert str(caught.value) == "replacement should be a boolean value, but got replacement=0"
    assert isinstance(caught.value, TypeError)
    with pytest.raises(ConfigError) as shape:
        WeightedRandomSampler([[1, 2], [3, 4]], 1)
    assert str(shape.value) == "weights should be a 1d sequence but given weights have shape (2, 2)"
    assert not isinstance(shape.value, TypeError)
    with pytest.raises(ConfigError) as rank:
        DistributedSampler(10, num_replicas=4, rank=4)
    assert str(rank.value) == "Invalid rank 4, rank should be in the interval [0, 3]"


@pytest.mark.parametrize(
    "make",
    [
        lambda: SequentialSampler(2.5),  # type: ignore[arg-type]
        lambda: RandomSampler(object()),  # type: ignore[arg-type]
        lambda: RandomSampler(10, seed="x"),  # type: ignore[arg-type]
        lambda: WeightedRandomSampler(["a", "b"], 1),
        lambda: DistributedSampler(10, num_replicas=2, rank="0"),  # type: ignore[arg-type]
        lambda: DistributedSampler(10, num_replicas=2.0, rank=0),  # type: ignore[arg-type]
        lambda: RandomSampler(10).set_epoch("1"),  # type: ignore[arg-type]
    ],
)
def test_wrong_types_are_config_type_errors(make: Callable[[], Any]) -> None:
    with pytest.raises(ConfigTypeError):
        make()


def test_our_extras_still_work() -> None:
    sampler = RandomSampler(range(10), replacement=True, num_samples=5, seed=3)
    assert sampler.seed == 3 and len(list(sampler)) == 5
    assert sampler.state_dict() == {"epoch": 0, "seed": 3, "offset": 5}
    with pytest.raises(ConfigError, match="num_replicas"):
        DistributedSampler(10, num_replicas=0, rank=0)
