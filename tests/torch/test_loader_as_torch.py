"""With torch's own arguments, asyncflow.DataLoader delivers torch's items: checked side by
side with ``torch.utils.data.DataLoader`` (defaults, workers, shuffles and seeds)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.data as tud

from asyncflow import ConfigError, DataLoader, LoaderTimeout, StallError


class Unsplit(tud.IterableDataset[int]):
    """Every worker yields everything, as torch's docs warn."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(7))


class Split(tud.IterableDataset[int]):
    """``range(n)``, each worker taking its share through get_worker_info()."""

    def __init__(self, n: int = 9) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        if info is None:
            return iter(range(self.n))
        per = math.ceil(self.n / info.num_workers)
        return iter(range(info.id * per, min(self.n, (info.id + 1) * per)))


class WhichWorker(tud.Dataset[int]):
    """A map-style dataset whose items say which worker fetched them."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        info = tud.get_worker_info()
        return 10 * i + (-1 if info is None else info.id)


class Offset(tud.Dataset[int]):
    """Items shifted by whatever a worker_init_fn set."""

    offset = 0

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> int:
        return i + self.offset


def _shift(worker_id: int) -> None:
    info = tud.get_worker_info()
    assert info is not None
    info.dataset.offset = 100  # type: ignore[attr-defined]


class Locked(Unsplit):
    """An iterable dataset no worker process can receive."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def _items(loader: Any) -> list[Any]:
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in loader]


CASES = {
    "iterable, no num_workers": (Unsplit, {"batch_size": 2}),
    "split iterable, no num_workers": (Split, {"batch_size": 2}),
    "iterable, single items": (Unsplit, {"batch_size": None}),
    "worker info, no num_workers": (WhichWorker, {"batch_size": 2}),
    "worker_init_fn, no num_workers": (Offset, {"batch_size": 2, "worker_init_fn": _shift}),
    "iterable, two workers": (Unsplit, {"batch_size": 2, "num_workers": 2}),
    "split iterable, two workers": (Split, {"batch_size": 2, "num_workers": 2}),
    "worker info, two workers": (WhichWorker, {"batch_size": 2, "num_workers": 2}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_torchs_arguments_deliver_torchs_items(case: str, leak_check: None) -> None:
    make, kwargs = CASES[case]
    theirs = _items(tud.DataLoader(make(), **kwargs))
    loader = DataLoader(make(), **kwargs)
    assert _items(loader) == theirs
    assert _items(loader) == theirs  # and again in the next epoch
    if "num_workers" not in kwargs and make is not WhichWorker:
        assert loader.num_workers == 0  # as torch's default: one iterator, no worker_init_fn
    del loader


def test_without_num_workers_a_plain_map_style_dataset_still_gets_workers() -> None:
    loader = DataLoader(list(range(10)), batch_size=3)
    assert loader.num_workers >= 1
    assert _items(loader) == _items(tud.DataLoader(list(range(10)), batch_size=3))
    loader.num_workers = 0  # assigned, as torch lets it be
    assert loader.num_workers == 0
    assert _items(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_workers_that_cannot_give_torchs_items_are_refused_not_replaced() -> None:
    with pytest.raises(ConfigError, match="would not deliver the items torch's does"):
        DataLoader(Locked(), batch_size=2, num_workers=2)
    # asked for explicitly, threads read it with one iterator (as num_workers=0)
    loader = DataLoader(Locked(), batch_size=2, num_workers=2, workers="threads")
    assert _items(loader) == [[0, 1], [2, 3], [4, 5], [6]]


# -- the same order as torch, and torch's global generator left as torch leaves it -------------


def _epochs(make: Any, seed: int, epochs: int = 3) -> tuple[list[list[int]], list[float]]:
    """Each epoch's order under ``torch.manual_seed(seed)``, then what the global generator
    gives after the loops."""
    torch.manual_seed(seed)
    loader = make()
    orders = [[int(i) for b in loader for i in b.reshape(-1).tolist()] for _ in range(epochs)]
    return orders, torch.rand(4).tolist()


SHUFFLES = {
    "default": {},
    "no workers": {"num_workers": 0},
    "two workers": {"num_workers": 2},
    "persistent": {"num_workers": 2, "persistent_workers": True},
    "drop_last": {"drop_last": True},
    "generator": {"generator": "seeded"},
    "generator, persistent": {"generator": "seeded", "num_workers": 1,
                              "persistent_workers": True},
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", list(SHUFFLES))
@pytest.mark.parametrize(("seed", "n"), [(0, 1), (1, 7), (7, 33), (2**40 + 5, 100)])
def test_a_shuffle_under_manual_seed_is_torchs_and_draws_as_torch(
    case: str, seed: int, n: int, leak_check: None,
) -> None:
    def make(cls: Any) -> Any:
        kwargs = dict(SHUFFLES[case])
        if kwargs.get("generator") == "seeded":
            kwargs["generator"] = torch.Generator().manual_seed(seed + 1)
        return lambda: cls(list(range(n)), batch_size=4, shuffle=True, **kwargs)

    assert _epochs(make(DataLoader), seed) == _epochs(make(tud.DataLoader), seed)


def test_unshuffled_epochs_draw_torchs_base_seeds_too() -> None:
    def make(cls: Any) -> Any:
        return lambda: cls(list(range(10)), batch_size=3)

    assert _epochs(make(DataLoader), 3) == _epochs(make(tud.DataLoader), 3)


def test_a_resumed_shuffle_replays_the_seed_its_epoch_drew() -> None:
    torch.manual_seed(5)
    crashed = DataLoader(list(range(30)), batch_size=4, shuffle=True, num_workers=2)
    list(crashed)  # epoch 0
    it = iter(crashed)
    head = [next(it), next(it)]
    state = crashed.state_dict()
    rest = list(it)
    torch.manual_seed(99)  # another global state: the saved seed, not a new draw, decides
    resumed = DataLoader(list(range(30)), batch_size=4, shuffle=True, num_workers=2)
    resumed.load_state_dict(state)
    assert torch.cat(list(resumed)).tolist() == torch.cat(rest).tolist()
    assert torch.cat(head + rest).sort().values.tolist() == list(range(30))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_the_distributed_sampler_gives_torchs_shards(shuffle: bool, drop_last: bool) -> None:
    from asyncflow import DistributedSampler

    for n in (1, 2, 7, 10, 33, 100):
        for replicas in (1, 2, 3, 4):
            for rank in range(replicas):
                for seed in (0, 1, 17, 2**33 + 2):
                    ours = DistributedSampler(n, replicas, rank, shuffle=shuffle, seed=seed,
                                              drop_last=drop_last)
                    theirs = tud.DistributedSampler(range(n), replicas, rank, shuffle=shuffle,
                                                    seed=seed, drop_last=drop_last)
                    for epoch in (0, 3):
                        ours.set_epoch(epoch)
                        theirs.set_epoch(epoch)
                        assert list(ours) == list(theirs), (n, replicas, rank, seed, epoch)


# -- persistent workers keep the copy of the dataset they started with -------------------------


class Scaled(tud.Dataset[int]):
    """Items times a factor the main process changes between epochs."""

    def __init__(self) -> None:
        self.factor = 1

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        return i * self.factor


class ScaledStream(tud.IterableDataset[int]):
    def __init__(self) -> None:
        self.factor = 1

    def __iter__(self) -> Iterator[int]:
        return iter([i * self.factor for i in range(5)])


def _two_epochs(cls: Any, make: Any, **kwargs: Any) -> list[list[Any]]:
    dataset = make()
    loader = cls(dataset, batch_size=2, **kwargs)
    first = _items(loader)
    dataset.factor = 10  # after the workers started: torch's persistent ones never see it
    return [first, _items(loader)]


def _nothing(worker_id: int) -> None:
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", ["threads", "processes", "auto", "auto, kept alive"])
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("make", [Scaled, ScaledStream])
def test_persistent_workers_keep_the_dataset_they_started_with(
    workers: str, persistent: bool, make: Any, leak_check: None,
) -> None:
    kwargs: dict[str, Any] = {"num_workers": 1, "persistent_workers": persistent}
    if workers == "auto, kept alive":  # a worker_init_fn: auto picks processes, and keeps them
        kwargs["worker_init_fn"] = _nothing
    theirs = _two_epochs(tud.DataLoader, make, **kwargs)
    ours = DataLoader
    assert _two_epochs(ours, make, workers=workers.split(",")[0], **kwargs) == theirs


def test_a_dataset_persistent_workers_cannot_copy_is_refused_with_a_reason() -> None:
    class Held(Scaled):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()

    loader = DataLoader(Held(), batch_size=2, num_workers=2, workers="threads",
                        persistent_workers=True)
    with pytest.raises(ConfigError, match=r"cannot be copied.*persistent_workers=False"):
        iter(loader)
    loader = DataLoader(Held(), batch_size=2, num_workers=2, workers="threads")
    assert _items(loader) == [[0, 1], [2, 3], [4, 5]]


# -- timeout=1 raises within 2 s, as torch's raises at 1 s -------------------------------------


class Stuck(tud.Dataset[int]):
    """Every item takes 4 s."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        time.sleep(4)
        return i


class StuckStream(tud.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        time.sleep(4)
        yield 0


def _timed_out_after(loader: Any, use_async: bool) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        if use_async:
            async def first() -> Any:
                async for batch in loader:
                    return batch

            asyncio.run(first())
        else:
            next(iter(loader))
    return info.value, time.monotonic() - started


def test_torchs_timeout_error_is_ours() -> None:
    theirs, _ = _timed_out_after(tud.DataLoader(Stuck(), num_workers=1, timeout=1), False)
    ours, _ = _timed_out_after(DataLoader(Stuck(), num_workers=1, timeout=1), False)
    assert type(theirs) is RuntimeError and str(ours) == str(theirs)
    assert isinstance(ours, LoaderTimeout) and isinstance(ours, StallError)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("use_async", [False, True], ids=["for", "async for"])
@pytest.mark.parametrize("workers", ["threads", "processes"])
@pytest.mark.parametrize("make", [Stuck, StuckStream])
def test_timeout_1_raises_within_2_seconds(
    make: Any, workers: str, use_async: bool, leak_check: None,
) -> None:
    loader = DataLoader(make(), batch_size=None, num_workers=1, workers=workers, timeout=1)
    error, waited = _timed_out_after(loader, use_async)
    assert isinstance(error, LoaderTimeout)
    assert str(error) == "DataLoader timed out after 1 seconds"
    assert 1.0 <= waited < 2.0
    del loader
