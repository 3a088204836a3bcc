"""The DataLoader facade: batch-for-batch parity with torch, epochs, resume, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from asyncflow import ConfigError, DataLoader, StallError
from asyncflow.sources import DistributedSampler, RandomSampler, WeightedRandomSampler
from asyncflow.torch import pad_collate


class Point(NamedTuple):
    xy: np.ndarray
    label: int


class Squares:
    """A map-style dataset that counts concurrent calls."""

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((2, 3), float(i)), "sq": i * i, "name": f"s{i}"}


class Batched(Squares):
    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [{"x": torch.tensor([float(i)]), "sq": -i, "name": "b"} for i in indices]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


Case = Callable[[], tuple[Any, dict[str, Any]]]

CASES: dict[str, Case] = {
    "ints": lambda: (list(range(23)), {"batch_size": 4}),
    "dicts drop_last": lambda: (Squares(), {"batch_size": 5, "drop_last": True}),
    "namedtuples": lambda: (
        [Point(np.array([i, -i]), i % 3) for i in range(11)], {"batch_size": 3}
    ),
    "tuples of arrays": lambda: (
        [(np.full((2,), i, np.float32), i) for i in range(9)], {"batch_size": 2}
    ),
    "no batching": lambda: (Squares(7), {"batch_size": None}),
    "batch_sampler": lambda: (list(range(10)), {"batch_sampler": [[0, 1], [5, 2, 3], [9]]}),
    "our sampler": lambda: (
        list(range(30)),
        {"batch_size": 4, "sampler": WeightedRandomSampler(list(range(1, 31)), 25, seed=3)},
    ),
    "collate_fn": lambda: (
        [{"ids": list(range(i % 4 + 1))} for i in range(10)],
        {"batch_size": 3, "collate_fn": lambda b: pad_collate(b, fields=["ids"], mask=True)},
    ),
    "__getitems__": lambda: (Batched(10), {"batch_size": 4}),
    "torch generator": lambda: (
        list(range(50)),
        {"batch_size": 6, "shuffle": True, "generator": torch.Generator().manual_seed(7)},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_batch_matches_torchs_dataloader(name: str, leak_check: None) -> None:
    dataset, kwargs = CASES[name]()
    ours = DataLoader(dataset, num_workers=4, **kwargs)
    _, kwargs = CASES[name]()  # a fresh generator / sampler for torch
    theirs = tud.DataLoader(dataset, num_workers=0, **kwargs)
    assert len(ours) == len(theirs)
    for _epoch in range(2):
        mine, expected = list(ours), list(theirs)
        assert len(mine) == len(expected)
        for got, want in zip(mine, expected, strict=True):
            assert same(got, want), (got, want)


async def test_async_for_gives_the_same_batches(async_leak_check: None) -> None:
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, seed=0)
    sync = list(loader)
    loader.set_epoch(0)
    got = [batch async for batch in loader]
    assert len(got) == len(sync) == len(loader)
    assert all(same(a, b) for a, b in zip(got, sync, strict=True))


def test_reshuffles_every_epoch_reproducibly() -> None:
    def orders(loader: DataLoader) -> list[list[int]]:
        return [torch.cat(list(loader)).tolist() for _ in range(3)]

    first = orders(DataLoader(list(range(40)), batch_size=8, shuffle=True, seed=5))
    assert len({tuple(o) for o in first}) == 3
    assert all(sorted(o) == list(range(40)) for o in first)
    assert orders(DataLoader(list(range(40)), batch_size=8, shuffle=True, seed=5)) == first
    loader = DataLoader(list(range(40)), batch_size=8, shuffle=True, seed=5)
    loader.set_epoch(2)
    assert torch.cat(list(loader)).tolist() == first[2]
    torch.manual_seed(11)
    a = orders(DataLoader(list(range(40)), batch_size=8, shuffle=True))
    torch.manual_seed(11)
    assert orders(DataLoader(list(range(40)), batch_size=8, shuffle=True)) == a


def test_set_epoch_reaches_a_distributed_sampler() -> None:
    sampler = DistributedSampler(20, num_replicas=2, rank=1, seed=0)
    loader = DataLoader(list(range(20)), batch_size=5, sampler=sampler)
    loader.set_epoch(3)
    assert sampler.epoch == 3
    sampler.set_epoch(3)
    assert torch.cat(list(loader)).tolist() == list(sampler)


def _resume_case(make: Callable[[], DataLoader], stop_after: int) -> None:
    reference = make()
    epochs = [[b for b in reference] for _ in range(3)]
    crashed = make()
    list(crashed)  # epoch 0
    it = iter(crashed)
    head = [next(it) for _ in range(stop_after)]
    state = crashed.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(epochs[1])
    assert all(same(a, b) for a, b in zip(head + rest, epochs[1], strict=True))
    after = list(resumed)
    assert all(same(a, b) for a, b in zip(after, epochs[2], strict=True))


@pytest.mark.parametrize("workers", [1, 6])
def test_resume_mid_epoch_with_shuffle(workers: int) -> None:
    seed = int(torch.randint(0, 2**31, ()).item())
    _resume_case(
        lambda: DataLoader(Squares(), batch_size=4, shuffle=True, seed=seed, num_workers=workers),
        stop_after=3,
    )


def test_resume_with_a_random_seed_restores_the_seed() -> None:
    crashed = DataLoader(list(range(30)), batch_size=4, shuffle=True)
    full = torch.cat(list(crashed)).tolist()
    crashed.set_epoch(0)
    it = iter(crashed)
    head = torch.cat([next(it), next(it)]).tolist()
    resumed = DataLoader(list(range(30)), batch_size=4, shuffle=True)
    resumed.load_state_dict(crashed.state_dict())
    assert head + torch.cat(list(resumed)).tolist() == full


def test_resume_with_a_torch_generator() -> None:
    _resume_case(
        lambda: DataLoader(
            list(range(26)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)
        ),
        stop_after=2,
    )


def test_resume_with_a_distributed_sampler_and_batch_sampler() -> None:
    def make_dist() -> DataLoader:
        return DataLoader(
            list(range(41)), batch_size=3, sampler=DistributedSampler(41, 3, 2, seed=9)
        )

    def make_batches() -> DataLoader:
        return DataLoader(list(range(12)), batch_sampler=[[3, 1], [0], [2, 5, 4], [11]])

    _resume_case(make_dist, stop_after=4)
    _resume_case(make_batches, stop_after=1)


def test_state_at_an_epoch_end_points_at_the_next_epoch() -> None:
    loader = DataLoader(list(range(8)), batch_size=4, shuffle=True, seed=1)
    assert loader.state_dict()["epoch"] == 0
    list(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    with pytest.raises(ConfigError):
        loader.load_state_dict({"epoch": -1, "batches": 0})
    with pytest.raises(ConfigError):
        loader.load_state_dict({"nope": 1})


def test_max_failures_skips_batches_that_fail() -> None:
    class Flaky(Squares):
        def __getitem__(self, i: int) -> dict[str, Any]:
            if i in (5, 17):
                raise KeyError(i)
            return super().__getitem__(i)

    loader = DataLoader(Flaky(20), batch_size=4, max_failures=2)
    got = [b["sq"].tolist() for b in loader]
    assert got == [[0, 1, 4, 9], [64, 81, 100, 121], [144, 169, 196, 225]]
    assert [f.item for f in loader.stats().failures] == ["[4, 5, 6, 7]", "[16, 17, 18, 19]"]
    strict_loader = DataLoader(Flaky(20), batch_size=4)
    strict = iter(strict_loader)
    assert next(strict)["sq"].tolist() == [0, 1, 4, 9]
    with pytest.raises(KeyError) as info:  # the batch's own exception, as torch raises it
        next(strict)
    # raised in place, it is in stats() as a skipped one is (it was missing)
    assert [f.item for f in strict_loader.stats().failures] == ["[4, 5, 6, 7]"]
    assert [f.item for f in strict.stats().failures] == ["[4, 5, 6, 7]"]
    assert "batch 1 (indices [4, 5, 6, 7]) failed in stage 'fetch'" in info.value.__notes__[-1]
    assert next(strict)["sq"].tolist() == [64, 81, 100, 121]  # and iterating goes on


def test_timeout_raises_a_stall_error(leak_check: None) -> None:
    class Slow(Squares):
        def __getitem__(self, i: int) -> dict[str, Any]:
            time.sleep(0.5 if i >= 2 else 0)
            return super().__getitem__(i)

    loader = DataLoader(Slow(6), batch_size=2, timeout=0.1, num_workers=1)
    with pytest.raises(StallError):
        list(loader)


def test_an_epoch_stopped_by_a_timeout_or_close_is_not_ended(leak_check: None) -> None:
    # its iterator ends, but state_dict() used to say "epoch over": a resume lost the rest
    class Slow(Squares):
        def __init__(self, n: int, stuck: bool) -> None:
            super().__init__(n)
            self.stuck = stuck

        def __getitem__(self, i: int) -> dict[str, Any]:
            time.sleep(0.6 if self.stuck and i == 2 else 0)
            return super().__getitem__(i)

    loader = DataLoader(Slow(6, stuck=True), batch_size=1, timeout=0.2, num_workers=0)
    epoch = iter(loader)
    assert [next(epoch)["sq"].item() for _ in range(2)] == [0, 1]
    with pytest.raises(StallError):
        next(epoch)
    with pytest.raises(StopIteration):  # the timeout stopped the run
        next(epoch)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], "between_epochs" in state) == (0, 2, False)
    closed = iter(loader)
    next(closed)
    closed.close()
    assert list(closed) == []
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], "between_epochs" in state) == (1, 1, False)
    fresh = DataLoader(Slow(6, stuck=False), batch_size=1, num_workers=0)
    fresh.load_state_dict(loader.state_dict())
    assert [b["sq"].item() for b in fresh] == [1, 4, 9, 16, 25]


def test_workers_are_threads_fetching_batches_concurrently() -> None:
    active, peak = 0, 0
    lock = threading.Lock()

    class Counting(Squares):
        def __getitem__(self, i: int) -> dict[str, Any]:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.01)
            with lock:
                active -= 1
            return super().__getitem__(i)

    batches = list(DataLoader(Counting(64), batch_size=2, num_workers=4))
    assert len(batches) == 32
    assert 2 <= peak <= 4


def test_break_stops_the_epoch(leak_check: None) -> None:
    loader = DataLoader(Squares(400), batch_size=2, num_workers=3)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    with iter(loader) as it:
        next(it)


def test_pin_memory_without_cuda_is_ignored_quietly() -> None:
    batches = list(DataLoader(list(range(6)), batch_size=3, pin_memory=True))
    assert [b.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_sampler": [[0]], "batch_size": 2},
        {"batch_sampler": [[0]], "shuffle": True},
        {"sampler": [0, 1], "shuffle": True},
        {"batch_size": None, "drop_last": True},
        {"batch_size": 0},
        {"num_workers": -1},
        {"prefetch_factor": 2, "num_workers": 0},
        {"timeout": -1},
        {"seed": 1, "generator": torch.Generator()},
        {"max_failures": -1},
    ],
)
def test_conflicting_or_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # torch's own checks raise ValueError; ours ConfigError
        DataLoader(list(range(4)), **kwargs)


class _Count(tud.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


@pytest.mark.parametrize("value, error", [(0, ConfigError), (1.5, TypeError)])
@pytest.mark.parametrize("dataset", [list(range(4)), _Count()])
def test_a_prefetch_factor_torchs_workers_refuse_is_refused_naming_it(
    value: Any, error: type[Exception], dataset: Any
) -> None:
    # torch's worker iterator refuses 0 (and a float); ours fetched 2 ahead instead, or said
    # "window must be an int" without naming the argument
    with pytest.raises(error, match="prefetch_factor"):
        DataLoader(dataset, num_workers=2, prefetch_factor=value)
    loader = DataLoader(dataset, num_workers=2)
    loader.prefetch_factor = value  # torch lets it be reassigned; the next epoch checks it
    with pytest.raises(error, match="prefetch_factor"):
        iter(loader)


def test_cuda_device_without_cuda_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA"):
        DataLoader(list(range(4)), device="cuda")


def test_our_samplers_work_with_torchs_loader_too() -> None:
    sampler = RandomSampler(10, seed=2)
    got = torch.cat(list(tud.DataLoader(list(range(10)), sampler=sampler))).tolist()
    assert got == sampler.indices(0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_and_pin_memory_on_a_gpu() -> None:
    theirs = list(tud.DataLoader(Squares(), batch_size=4, shuffle=False))
    ours = list(DataLoader(Squares(), batch_size=4, device="cuda"))
    torch.cuda.synchronize()
    assert all(b["x"].is_cuda and b["sq"].is_cuda for b in ours)
    for a, b in zip(ours, theirs, strict=True):
        assert same({**a, "x": a["x"].cpu(), "sq": a["sq"].cpu()}, b)
    pinned = list(DataLoader(Squares(), batch_size=4, pin_memory=True))
    assert all(b["x"].is_pinned() for b in pinned)


def test_in_asyncio_run_with_a_blocking_consumer() -> None:
    async def main() -> int:
        count = 0
        async for _ in DataLoader(Squares(20), batch_size=3):
            count += 1
        return count

    assert asyncio.run(main()) == 7


class _FailsAt:
    """Items 0..n-1; fetching index ``bad`` raises."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(i)
        return i


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4])
def test_resume_under_max_failures_repeats_and_loses_no_batch(stop_after: int) -> None:
    # batches [0,1] [2,3] [4,5] [6,7] [8,9]; the one holding 5 fails and is skipped
    def loader() -> DataLoader:
        return DataLoader(_FailsAt(10, 5), batch_size=2, num_workers=1, max_failures=1,
                          workers="threads")

    whole = [b.tolist() for b in loader()]
    assert whole == [[0, 1], [2, 3], [6, 7], [8, 9]]
    first = loader()
    seen = []
    for batch in first:
        seen.append(batch.tolist())
        if len(seen) == stop_after:
            break
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in resumed]
    assert seen + rest == whole
