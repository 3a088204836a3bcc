"""Index samplers: orders, epochs, torch's DistributedSampler semantics, resume."""

from __future__ import annotations

import collections
import itertools
import subprocess
import sys

import pytest

from asyncflow import ConfigError
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
    assert list(a) == first  # same epoch, same order
    a.set_epoch(1)
    second = list(a)
    assert sorted(second) == list(range(100)) and second != first
    assert list(RandomSampler(100, seed=4)) != first


def test_random_seed_none_is_drawn_once_and_kept() -> None:
    s = RandomSampler(50)
    assert list(s) == list(s)
    assert list(RandomSampler(50, seed=s.seed)) == list(s)
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
    it = iter(sampler)
    head = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    assert state["offset"] == 5 and state["epoch"] == 3
    fresh = make()  # type: ignore[operator]
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
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
    assert list(pipe) == [i * 10 for i in sampler]
    sampler.set_epoch(1)
    assert list(pipe) == [i * 10 for i in sampler.indices(1)]
