"""With torch's own arguments, asyncflow.DataLoader delivers torch's items: checked side by
side with ``torch.utils.data.DataLoader`` (defaults, workers, shuffles and seeds)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.data as tud

from asyncflow import ConfigError, DataLoader


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
