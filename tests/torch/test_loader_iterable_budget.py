"""``max_failures`` with an ``IterableDataset``: failed batches are skipped within the budget,
counted over every worker's batches (a budget per worker's lane would allow it once per
worker), and one more fails the epoch."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch.utils.data as tud

from asyncflow import DataLoader, FailureBudgetExceeded


class Shares(tud.IterableDataset[int]):
    """``range(n)`` split between the workers in blocks (all of it without workers); the
    items in ``bad`` raise, and the iterator goes on after them."""

    def __init__(self, n: int, bad: frozenset[int]) -> None:
        self.n, self.bad = n, bad

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        if info is None:
            return _Items(range(self.n), self.bad)
        per = math.ceil(self.n / info.num_workers)
        return _Items(range(info.id * per, min(self.n, (info.id + 1) * per)), self.bad)


class _Items:
    def __init__(self, items: range, bad: frozenset[int]) -> None:
        self.items, self.bad = iter(items), bad

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> int:
        item = next(self.items)
        if item in self.bad:
            raise ValueError(f"item {item} is bad")
        return item


def test_failed_batches_within_the_budget_are_skipped_and_listed() -> None:
    loader = DataLoader(Shares(6, frozenset({2})), batch_size=None, num_workers=0,
                        max_failures=1)
    assert [int(b) for b in loader] == [0, 1, 3, 4, 5]
    (failure,) = loader.stats().failures
    assert failure.error_type == "ValueError" and "item 2 is bad" in failure.message
    again = DataLoader(Shares(6, frozenset({2})), batch_size=None, num_workers=0)
    with pytest.raises(ValueError):  # no budget: raised in place, as torch's
        list(again)


def test_one_failure_over_the_budget_fails_the_epoch_with_the_batchs_error_as_cause() -> None:
    loader = DataLoader(Shares(8, frozenset({1, 5})), batch_size=2, num_workers=0,
                        max_failures=1)
    it = iter(loader)
    assert next(it).tolist() == [2, 3]  # [0, 1] failed and was skipped
    with pytest.raises(FailureBudgetExceeded) as info:
        next(it)
    assert isinstance(info.value.__cause__, ValueError)
    assert "2 of 3 batches failed" in str(info.value)


def test_a_fraction_budget_is_checked_at_the_end_and_an_epoch_of_failures_fails() -> None:
    # a fraction allows one failure while few batches were seen, and is checked at the end
    loader = DataLoader(Shares(1, frozenset({0})), batch_size=None, num_workers=0,
                        max_failures=0.5)
    with pytest.raises(FailureBudgetExceeded, match="every one of its 1 items failed"):
        list(loader)
    within = DataLoader(Shares(10, frozenset({4})), batch_size=None, num_workers=0,
                        max_failures=0.1)
    assert len(list(within)) == 9


@pytest.mark.timeout(90)
def test_the_budget_counts_every_workers_failures_together(leak_check: None) -> None:
    # worker 0 has 0-4 (2 is bad), worker 1 has 5-9 (7 is bad)
    def loader(budget: int) -> DataLoader[Any]:
        return DataLoader(Shares(10, frozenset({2, 7})), batch_size=None, num_workers=2,
                          workers="processes", max_failures=budget)

    got = sorted(int(b) for b in loader(2))
    assert got == [0, 1, 3, 4, 5, 6, 8, 9]
    with pytest.raises(FailureBudgetExceeded):  # one per worker: two in all
        list(loader(1))
