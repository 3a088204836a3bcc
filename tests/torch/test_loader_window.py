"""A DataLoader's worker processes fetch at most ``prefetch_factor * num_workers``
batches ahead of the consumer through the run's window (``Pipeline(window=...)``), a failure
budget included: a batch failed within it gives its place back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncflow import DataLoader
from tests.torch.test_loader_processes import _settles

BATCHES = 40


class FailingLogged:
    """Appends a byte to ``log`` for each sample fetched (in whatever process); sample ``i``
    with ``i % 10 == 5`` fails, so batch ``b`` of two fails when ``b % 5 == 2``."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __len__(self) -> int:
        return 2 * BATCHES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with open(self.log, "ab") as f:
            f.write(b"x")
        if i % 10 == 5:
            raise ValueError(f"sample {i}")
        return torch.full((2,), float(i)), i


def _failed(batch: int) -> bool:
    return batch % 5 == 2


def _let_in(received: int, window: int) -> int:
    """Batches let in once ``received`` have been: each failed one gives its place back."""
    let_in = failed = 0
    while let_in < BATCHES and let_in - failed - received < window:
        failed += _failed(let_in)
        let_in += 1
    return let_in


def _fetched(log: Path) -> int:
    return log.stat().st_size // 2 if log.exists() else 0


@pytest.mark.parametrize(("workers", "prefetch"), [(1, 1), (2, None)])
def test_workers_fetch_at_most_prefetch_factor_batches_ahead_under_a_failure_budget(
    tmp_path: Path, workers: int, prefetch: int | None, leak_check: None
) -> None:
    log = tmp_path / "fetched"
    loader = DataLoader(FailingLogged(str(log)), batch_size=2, num_workers=workers,
                        prefetch_factor=prefetch, workers="processes", timeout=30,
                        max_failures=0.5)
    ahead = (prefetch or 2) * workers
    received = []
    with iter(loader) as it:
        for held in (1, 2, 3):  # the consumer holds off after each batch
            received.append(next(it)[1].tolist())
            expected = _let_in(held, ahead)
            assert _settles(lambda: _fetched(log) >= expected, 10.0), (  # noqa: B023
                f"{_fetched(log)} batches fetched, {expected} let in")
            time.sleep(0.3)  # room to fetch more, were it allowed
            assert _fetched(log) == expected
        received += [batch[1].tolist() for batch in it]
    assert received == [[2 * b, 2 * b + 1] for b in range(BATCHES) if not _failed(b)]
    assert len(loader.stats().failures) == BATCHES // 5


class LoggedStream(torch.utils.data.IterableDataset[int]):
    """Each worker yields its share of ``range(n)`` and appends a byte to its own log file for
    each sample it yields."""

    def __init__(self, n: int, logs: str) -> None:
        self.n, self.logs = n, logs

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(worker, self.n, workers):
            with open(f"{self.logs}/{worker}", "ab") as f:
                f.write(b"x")
            yield i


@pytest.mark.parametrize(("workers", "prefetch"), [(1, 1), (2, 2)])
def test_each_iterable_worker_fetches_at_most_prefetch_factor_batches_ahead(
    tmp_path: Path, workers: int, prefetch: int, leak_check: None
) -> None:
    loader = DataLoader(LoggedStream(200, str(tmp_path)), batch_size=2, num_workers=workers,
                        prefetch_factor=prefetch, workers="processes", timeout=30)

    def fetched(worker: int) -> int:
        return _fetched(tmp_path / str(worker))

    received = []
    with iter(loader) as it:
        for held in (1, 2, 3):  # the consumer holds off after each batch
            received.append(next(it).tolist())
            # torch's rule: each worker prefetch_factor batches beyond those received (every
            # worker's lane starts with the epoch, as torch primes every worker)
            expected = [len(range(w, held, workers)) + prefetch for w in range(workers)]
            assert _settles(lambda: all(
                fetched(w) >= n for w, n in enumerate(expected)), 10.0), (  # noqa: B023
                f"{[fetched(w) for w in range(workers)]} batches fetched, {expected} let in")
            time.sleep(0.3)  # room to fetch more, were it allowed
            assert [fetched(w) for w in range(workers)] == expected
        received += [batch.tolist() for batch in it]
    assert sorted(x for batch in received for x in batch) == list(range(200))
