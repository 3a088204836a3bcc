"""asyncflow.DataLoader over an IterableDataset, as torch's: split by get_worker_info(),
batches round-robin across workers, len() when defined, errors in place, resume."""

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

from asyncflow import DataLoader, StallError


class Range(tud.IterableDataset[int]):
    """``range(n)``, split between workers by torch's get_worker_info(), as torch's docs do."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        if info is None:
            return iter(range(self.n))
        per = math.ceil(self.n / info.num_workers)
        return iter(range(info.id * per, min(self.n, (info.id + 1) * per)))


class Sized(Range):
    def __len__(self) -> int:
        return self.n


class Unsplit(tud.IterableDataset[int]):
    """Every worker yields everything, as with torch."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


class Bumpy(tud.IterableDataset[int]):
    """Item 2 fails; the iterator goes on after it (a class, not a generator)."""

    def __iter__(self) -> Iterator[int]:
        return _Bumpy()


class _Bumpy:
    def __init__(self) -> None:
        self.i = -1

    def __iter__(self) -> _Bumpy:
        return self

    def __next__(self) -> int:
        self.i += 1
        if self.i >= 5:
            raise StopIteration
        if self.i == 2:
            raise ValueError("item 2 is bad")
        return self.i


class Cursor(tud.IterableDataset[int]):
    """An iterable dataset with a state of its own: where its cursor stands."""

    def __init__(self, n: int = 10) -> None:
        self.n = n
        self.pos = 0

    def __iter__(self) -> Iterator[int]:
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


def _torch(dataset: Any, **kwargs: Any) -> list[Any]:
    return [b.tolist() if isinstance(b, torch.Tensor) else b
            for b in tud.DataLoader(dataset, **kwargs)]


def _ours(dataset: Any, **kwargs: Any) -> list[Any]:
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in DataLoader(dataset, **kwargs)]


@pytest.mark.parametrize("kwargs", [
    {"batch_size": 3}, {"batch_size": 3, "drop_last": True}, {"batch_size": None},
])
def test_in_this_process_batches_match_torchs(kwargs: dict[str, Any]) -> None:
    assert _ours(Range(10), num_workers=0, **kwargs) == _torch(Range(10), **kwargs)


def test_len_is_torchs_when_the_dataset_defines_it() -> None:
    assert len(DataLoader(Sized(10), batch_size=3, num_workers=0)) == 4
    assert len(DataLoader(Sized(10), batch_size=3, drop_last=True, num_workers=0)) == 3
    with pytest.raises(TypeError):
        len(DataLoader(Range(10), batch_size=3, num_workers=0))


def test_shuffle_and_samplers_are_refused_with_torchs_messages() -> None:
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(Range(4), shuffle=True)
    with pytest.raises(ValueError, match="expected unspecified sampler option"):
        DataLoader(Range(4), sampler=[0, 1])


def test_on_threads_one_iterator_reads_it_and_stats_say_why() -> None:
    loader = DataLoader(Range(7), batch_size=2, num_workers=2, workers="threads")
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6]]
    assert any("one iterator" in note for note in loader.stats().notes)


def test_a_failing_item_raises_in_place_and_the_iterator_goes_on() -> None:
    it = iter(DataLoader(Bumpy(), batch_size=None, num_workers=0))
    got: list[Any] = []
    for _ in range(4):
        try:
            got.append(next(it))
        except ValueError:
            got.append(ValueError)
    assert got == [0, 1, ValueError, 3]
    assert next(it) == 4


def test_async_for_reads_an_iterable_dataset() -> None:
    async def main() -> list[list[int]]:
        return [b.tolist() async for b in DataLoader(Range(5), batch_size=2, num_workers=0)]

    assert asyncio.run(main()) == [[0, 1], [2, 3], [4]]


def test_a_new_iteration_starts_a_new_iterator() -> None:
    loader = DataLoader(Range(4), batch_size=2, num_workers=0)
    assert [b.tolist() for b in loader] == [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("resume_after", [1, 3])
def test_resume_replays_a_plain_iterable_to_where_it_stopped(resume_after: int) -> None:
    loader = DataLoader(Range(11), batch_size=2, num_workers=0)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(resume_after)]
    state = loader.state_dict()
    it.close()
    resumed = DataLoader(Range(11), batch_size=2, num_workers=0)
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == _torch(Range(11), batch_size=2)


def test_resume_restores_a_stateful_iterable_dataset() -> None:
    loader = DataLoader(Cursor(), batch_size=3, num_workers=0)
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2]
    state = loader.state_dict()
    it.close()
    assert state["iterable"]["lanes"][0]["state"]["dataset"] == {"pos": 3}
    fresh = Cursor()
    resumed = DataLoader(fresh, batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[3, 4, 5], [6, 7, 8], [9]]


# -- worker processes: one lane each, torch's order -------------------------------------------


@pytest.mark.timeout(90)
def test_worker_processes_split_it_by_get_worker_info_in_torchs_order(leak_check: None) -> None:
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": 2}
    ours = _ours(Range(9), workers="processes", **kwargs)
    theirs = _torch(Range(9), multiprocessing_context="spawn", **kwargs)
    # worker 0 has 0-4, worker 1 has 5-8: batches alternate, worker 0's last one at the end
    assert ours == theirs == [[0, 1], [5, 6], [2, 3], [7, 8], [4]]
    # a dataset that ignores get_worker_info comes once per worker, as in torch
    assert sorted(_ours(Unsplit(), batch_size=None, workers="processes", num_workers=2)) == [
        0, 0, 1, 1, 2, 2]


@pytest.mark.timeout(90)
def test_worker_processes_resume_each_lane(leak_check: None) -> None:
    def make() -> DataLoader[Any]:
        return DataLoader(Range(9), batch_size=2, num_workers=2, workers="processes")

    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    it.close()
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == [[0, 1], [5, 6], [2, 3], [7, 8], [4]]
    del resumed


class SplitBumpy(tud.IterableDataset[int]):
    """``range(n)`` split between workers as :class:`Range`; item ``bad`` raises, and the
    iterator goes on after it (a class, not a generator)."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        per = math.ceil(self.n / info.num_workers)
        return _Share(range(info.id * per, min(self.n, (info.id + 1) * per)), self.bad)


class _Share:
    def __init__(self, items: range, bad: int) -> None:
        self.items, self.bad = iter(items), bad

    def __iter__(self) -> _Share:
        return self

    def __next__(self) -> int:
        item = next(self.items)
        if item == self.bad:
            raise ValueError(f"item {item} is bad")
        return item


@pytest.mark.timeout(90)
def test_stats_show_every_worker_and_add_up(leak_check: None) -> None:
    loader = DataLoader(SplitBumpy(9, bad=6), batch_size=2, num_workers=2,
                        workers="processes")
    got: list[Any] = []
    with iter(loader) as it:
        for _ in range(5):
            try:
                got.append(next(it).tolist())
            except ValueError:
                got.append(ValueError)
        assert list(it) == []
        assert it.stats() == loader.stats()
    # worker 0 has 0-4, worker 1 has 5-8: its batch [5, 6] fails at 6
    assert got == [[0, 1], ValueError, [2, 3], [7, 8], [4]]
    stats = loader.stats()
    # one run: each worker's lane a branch of the merge that takes a batch from each in turn
    assert [s.name for s in stats.stages] == [
        "worker0/source", "worker0/fetch", "worker1/source", "worker1/fetch", "workers"]
    # each worker's own batches, not the end markers its run asked for after them
    assert [(stats[f"worker{w}/fetch"].items_in, stats[f"worker{w}/fetch"].items_out)
            for w in (0, 1)] == [(3, 3), (2, 2)]
    assert stats.delivered == 5 == sum(stats[f"worker{w}/fetch"].items_out for w in (0, 1))
    assert stats["workers"].items_in == stats["workers"].items_out == 5
    assert all(stats[f"worker{w}/fetch"].busy_seconds > 0 for w in (0, 1))
    assert [stats[f"worker{w}/fetch"].failures for w in (0, 1)] == [0, 1]
    assert [(f.stage, f.item, f.error_type, f.message) for f in stats.failures] == [
        ("worker1/fetch", "batch 0", "ValueError", "item 6 is bad")]
    assert not stats.running
    text = str(stats)
    assert "worker0/fetch" in text and "worker1/fetch" in text and "5 items" in text
    del it, loader


@pytest.mark.timeout(90)
def test_an_epochs_workers_are_branches_of_one_run(leak_check: None) -> None:
    def run_threads() -> list[str]:  # a run's loop thread is named after its pipeline
        return [t.name for t in threading.enumerate() if t.name == "asyncflow-DataLoader"]

    loader = DataLoader(Range(40), batch_size=2, num_workers=3, workers="processes")
    with iter(loader) as it:
        # a batch from each worker in turn (worker 0 has 0-13, 1 has 14-27, 2 has 28-39)
        assert [next(it).tolist() for _ in range(3)] == [[0, 1], [14, 15], [28, 29]]
        assert len(run_threads()) == 1
        stats = it.stats()
        assert stats.running
        assert [s.name for s in stats.stages if s.name.endswith("/fetch")] == [
            "worker0/fetch", "worker1/fetch", "worker2/fetch"]
    del it, loader


class Sizes(tud.IterableDataset[int]):
    """Worker ``k`` yields ``100 * k + i`` for ``i`` in ``range(sizes[k])``."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        return iter(range(100 * info.id, 100 * info.id + self.sizes[info.id]))


@pytest.mark.timeout(90)
def test_stats_of_a_resumed_epoch_count_its_batches_and_name_ended_workers(
    leak_check: None,
) -> None:
    def make() -> DataLoader[Any]:
        return DataLoader(Sizes([5, 1]), batch_size=None, num_workers=2, workers="processes")

    loader = make()
    it = iter(loader)
    assert [next(it) for _ in range(4)] == [0, 100, 1, 2]  # worker 1 ended after its one
    state = loader.state_dict()
    it.close()
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == [3, 4]
    stats = resumed.stats()
    assert [s.name for s in stats.stages] == ["worker0/source", "worker0/fetch", "workers"]
    assert stats["worker0/fetch"].items_out == stats.delivered == 2
    assert "worker 1's iterator had ended before this epoch resumed: no run" in stats.notes
    del resumed


class _Stuck(tud.IterableDataset[int]):
    """Six items; the third takes longer than the loader's timeout when ``stuck``."""

    def __init__(self, stuck: bool) -> None:
        self.stuck = stuck

    def __iter__(self) -> Iterator[int]:
        for i in range(6):
            if self.stuck and i == 2:
                time.sleep(0.6)
            yield i


def test_an_epoch_stopped_by_a_timeout_resumes_where_it_stood(leak_check: None) -> None:
    # the iterator's StopIteration after the timeout used to end the epoch in state_dict()
    loader = DataLoader(_Stuck(True), batch_size=1, timeout=0.2)
    epoch = iter(loader)
    assert [next(epoch).item(), next(epoch).item()] == [0, 1]
    with pytest.raises(StallError):
        next(epoch)
    assert list(epoch) == []
    fresh = DataLoader(_Stuck(False), batch_size=1)
    fresh.load_state_dict(loader.state_dict())
    assert [b.item() for b in fresh] == [2, 3, 4, 5]
