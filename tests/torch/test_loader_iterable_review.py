"""An IterableDataset loader's epoch as one run, pushed as a demanding user would: early
breaks, two iterators, uneven and empty workers, a worker failing while another waits on its
window, resume after workers ended, a slow worker among fast ones."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data as tud

from asyncflow import ConfigError, DataLoader


class Sizes(tud.IterableDataset[int]):
    """Worker ``k`` yields ``100 * k + i`` for ``i`` in ``range(sizes[k])``."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        k = 0 if info is None else info.id
        return iter(range(100 * k, 100 * k + self.sizes[k]))


def _plain(batches: Any) -> list[Any]:
    return [b.tolist() if hasattr(b, "tolist") else b for b in batches]


def _torch(dataset: Any, **kwargs: Any) -> list[Any]:
    if kwargs.get("num_workers"):
        kwargs["multiprocessing_context"] = "fork"
    return _plain(tud.DataLoader(dataset, **kwargs))


def _ours(dataset: Any, **kwargs: Any) -> list[Any]:
    loader = DataLoader(dataset, workers="processes", timeout=60, **kwargs)
    got = _plain(loader)
    del loader
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_breaking_out_of_an_epoch_then_the_next_epoch_then_dropping_the_loader(
    persistent: bool, leak_check: None
) -> None:
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": 3, "persistent_workers": persistent}
    full = _torch(Sizes([5, 3, 4]), **kwargs)
    loader = DataLoader(Sizes([5, 3, 4]), workers="processes", timeout=60, **kwargs)
    for batch in loader:
        assert _plain([batch]) == full[:1]
        break
    it = iter(loader)
    assert [next(it).tolist() for _ in range(2)] == full[:2]
    it.close()
    assert _plain(loader) == full  # a full epoch after two broken ones
    assert _plain(loader) == full
    del it, batch, loader


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sizes", [[0, 5, 0], [3, 0, 7], [0, 0, 0], [1, 9, 0]])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_workers_ending_at_very_different_lengths_match_torch(
    sizes: list[int], batch_size: int | None, leak_check: None
) -> None:
    kwargs: dict[str, Any] = {"batch_size": batch_size, "num_workers": len(sizes)}
    assert _ours(Sizes(sizes), **kwargs) == _torch(Sizes(sizes), **kwargs)


class FailsAt(tud.IterableDataset[int]):
    """Worker 0 streams endlessly; worker 1 yields ``ok`` items, then its iterator raises."""

    def __init__(self, ok: int) -> None:
        self.ok = ok

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        if info.id == 0:
            return iter(range(10_000))
        return self._failing()

    def _failing(self) -> Iterator[int]:
        yield from range(100, 100 + self.ok)
        raise KeyError("worker 1 broke")


@pytest.mark.timeout(120)
def test_a_worker_failing_mid_epoch_while_another_waits_on_its_window_is_raised_as_torch(
    leak_check: None,
) -> None:
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": 2, "prefetch_factor": 1}

    def first(loader: Any, n: int) -> list[Any]:
        got: list[Any] = []
        it = iter(loader)
        for _ in range(n):
            try:
                got.append(next(it).tolist())
            except KeyError:
                got.append("KeyError")
        it._shutdown_workers() if hasattr(it, "_shutdown_workers") else it.close()
        del it
        return got

    theirs = first(tud.DataLoader(FailsAt(3), multiprocessing_context="fork", **kwargs), 7)
    loader = DataLoader(FailsAt(3), workers="processes", timeout=60, **kwargs)
    time.sleep(0.5)  # worker 0 has filled its window and waits for credits
    ours = first(loader, 7)
    # worker 1's batch [102] then its error, in its place; then worker 0 alone, as torch
    assert ours == theirs
    del loader


class LoggedSizes(tud.IterableDataset[int]):
    """Worker ``k`` yields ``sizes[k]`` items, appending a byte per item to ``logs/k``;
    worker ``slow`` sleeps ``0.05`` s an item."""

    def __init__(self, sizes: list[int], logs: str, slow: int) -> None:
        self.sizes, self.logs, self.slow = sizes, logs, slow

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        for i in range(self.sizes[info.id]):
            if info.id == self.slow:
                time.sleep(0.05)
            with open(f"{self.logs}/{info.id}", "ab") as f:
                f.write(b"x")
            yield 100 * info.id + i


@pytest.mark.timeout(120)
def test_fast_workers_stay_within_prefetch_factor_of_a_slow_one(
    tmp_path: Path, leak_check: None
) -> None:
    sizes, prefetch = [40, 40, 40], 2
    loader = DataLoader(LoggedSizes(sizes, str(tmp_path), slow=1), batch_size=2,
                        num_workers=3, prefetch_factor=prefetch, workers="processes",
                        timeout=60)

    def fetched(w: int) -> int:
        log = tmp_path / str(w)
        return log.stat().st_size // 2 if log.exists() else 0  # batches of 2

    got: list[list[int]] = []
    seen = [0, 0, 0]
    worst = [0, 0, 0]
    with iter(loader) as it:
        for batch in it:
            got.append(batch.tolist())
            seen[got[-1][0] // 100] += 1
            for w in (0, 2):  # a fast worker: at most prefetch_factor beyond what came
                worst[w] = max(worst[w], fetched(w) - seen[w])
    assert worst[0] <= prefetch and worst[2] <= prefetch, worst
    assert sorted(x for b in got for x in b) == sorted(
        100 * w + i for w, n in enumerate(sizes) for i in range(n))
    del it, loader


class Counted(Sizes):
    """:class:`Sizes` whose iterators have states (torchdata's protocol): a resumed worker
    loads its iterator's state rather than replay its batches."""

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        k = 0 if info is None else info.id
        return _CountIter(100 * k, 100 * k + self.sizes[k])


class _CountIter:
    def __init__(self, at: int, end: int) -> None:
        self.at, self.end = at, end

    def __iter__(self) -> _CountIter:
        return self

    def __next__(self) -> int:
        if self.at >= self.end:
            raise StopIteration
        self.at += 1
        return self.at - 1

    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.at = state["at"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dataset", [Sizes, Counted])
def test_state_taken_after_some_workers_ended_resumes_the_exact_remaining_batches(
    dataset: Any, leak_check: None
) -> None:
    sizes = [0, 7, 2, 4]

    def make() -> DataLoader[Any]:
        return DataLoader(dataset(sizes), batch_size=2, num_workers=4, workers="processes",
                          timeout=60)

    whole = _torch(dataset(sizes), batch_size=2, num_workers=4)
    for cut in (1, 3, 5, 7):  # after worker 2 ended; worker 3 too; near the end; at it
        loader = make()
        it = iter(loader)
        head = [next(it).tolist() for _ in range(cut)]
        state = loader.state_dict()
        # a stateful iterator's state is saved, a plain one's batches replayed
        assert any(lane["state"] for lane in state["iterable"]["lanes"]) == (
            dataset is Counted)
        it.close()
        del it, loader
        resumed = make()
        resumed.load_state_dict(state)
        assert head + _plain(resumed) == whole, cut
        assert _plain(resumed) == whole  # and the epoch after it is whole
        del resumed


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("workers", "persistent"), [
    ({"workers": "threads"}, False),
    ({"workers": "processes", "num_workers": 2}, False),
    ({"workers": "processes", "num_workers": 2}, True),
])
def test_a_second_iterator_stops_the_first_which_then_raises_rather_than_end_short(
    workers: dict[str, Any], persistent: bool, leak_check: None
) -> None:
    kwargs: dict[str, Any] = {"num_workers": workers.get("num_workers", 0),
                              "persistent_workers": persistent}
    whole = _torch(Sizes([4, 4]), **kwargs)
    loader = DataLoader(Sizes([4, 4]), timeout=60, **workers,
                        persistent_workers=persistent)
    first = iter(loader)
    assert _plain([next(first) for _ in range(3)]) == whole[:3]
    second = iter(loader)
    # torch's first iterator goes on (its own workers, or, persistent, the second's epoch);
    # an IterableDataset's workers here keep one iterator each, so the loader runs one epoch
    # at a time: the first says so, rather than end its epoch short as if it were whole
    with pytest.raises(ConfigError, match="started a new epoch"):
        next(first)
    assert _plain(first) == []  # said once; then it has ended
    assert _plain(second) == whole
    # an iterator whose epoch was over, or that its consumer closed, just ends
    third = iter(loader)
    third.close()
    assert _plain(iter(loader)) == whole
    assert _plain(third) == [] and _plain(second) == []
    # load_state_dict() on a loader mid-epoch stops that epoch too
    fourth = iter(loader)
    next(fourth)
    state = loader.state_dict()
    loader.load_state_dict(state)
    with pytest.raises(ConfigError, match="started a new epoch"):
        next(fourth)
    assert _plain(loader) == whole[1:]
    del first, second, third, fourth, loader


class IterFailsOnce(tud.IterableDataset[int]):
    """Worker 0 streams long; worker 1's ``iter()`` raises while the file ``flag`` exists
    (removing it): once."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        if info.id == 1 and Path(self.flag).exists():
            Path(self.flag).unlink()
            raise KeyError("worker 1's iter() broke")
        return iter(range(100 * info.id, 100 * info.id + (1000 if info.id == 0 else 3)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_workers_iter_raising_while_another_waits_on_its_window_fails_the_epoch_only(
    tmp_path: Path, persistent: bool, leak_check: None
) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    loader = DataLoader(IterFailsOnce(str(flag)), num_workers=2, prefetch_factor=1,
                        workers="processes", persistent_workers=persistent, timeout=60)
    it = iter(loader)
    assert next(it).tolist() == [0]
    time.sleep(0.3)  # worker 0 fills its window and waits for credits
    # worker 1's turn: its iter()'s own error (torch's own loader raises it there too, then
    # fails each later turn of that worker with an UnboundLocalError), and the epoch ends
    with pytest.raises(KeyError, match="broke"):
        next(it)
    assert _plain(it) == []
    # the next epoch is whole: worker 0's 1000 items and worker 1's 3, in turn
    got = _plain(loader)
    assert got[:6] == [[0], [100], [1], [101], [2], [102]]
    assert [b[0] for b in got[6:]] == list(range(3, 1000))
    del it, loader
