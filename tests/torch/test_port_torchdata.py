"""torchdata's stateful DataLoader tests (``test/stateful_dataloader/test_state_dict.py``),
ported to ``asyncflow.DataLoader``: ``state_dict()`` / ``load_state_dict()`` round trips
mid-epoch, at the start and at the end of an epoch, over several epochs, for map-style and
iterable-style datasets, with a dataset's own ``state_dict()`` saved in the loader's state.

Each case states torchdata's ``StatefulDataLoader`` behaviour through the public interface
only: the layout of the state (``_snapshot``, ``_worker_snapshots``, ...) and torchdata's
extra arguments (``snapshot_every_n_steps``) are not ported.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import asyncflow

DataLoader = asyncflow.DataLoader


# -- datasets (module level: worker processes import them) -----------------------------


def identity(x: Any) -> Any:
    return x


class MapDataset(tud.Dataset):
    """torchdata's ``DummyMapDataset``: dict samples; with ``shuffle`` each ``__getitem__``
    draws its sample from torch's global generator, whose state is the dataset's state."""

    def __init__(self, size: int, shuffle: bool, include_generator: bool = True) -> None:
        self.size = size
        self.data = [{"id": i, "strcol": f"strcol_{i}", "listcol": [i, i + 1, i + 2]}
                     for i in range(size)]
        self.shuffle = shuffle
        self.include_generator = include_generator

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.shuffle:
            i = int(torch.randint(self.size, (1,)).item())
        return self.data[i]

    def state_dict(self) -> dict[str, Any]:
        return {"g": torch.get_rng_state()} if self.include_generator else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.include_generator:
            torch.set_rng_state(state["g"])


class OffsetDataset(tud.Dataset):
    """Sample ``i`` is ``i + offset``; ``offset`` is the dataset's state."""

    def __init__(self, size: int, offset: int) -> None:
        self.size, self.offset = size, offset
        self.loaded: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        return i + self.offset

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded.append(dict(state))
        self.offset = state["offset"]


class SamplerIterator(Iterator[int]):
    def __init__(self, size: int) -> None:
        self.size, self.i = size, 0

    def __next__(self) -> int:
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


class StatefulSampler(tud.Sampler):
    """torchdata's ``DummySampler``: its iterator has a state."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> SamplerIterator:
        return SamplerIterator(self.size)

    def __len__(self) -> int:
        return self.size


def worker_slice(sizes: list[int]) -> range:
    """The samples of this worker: ``sizes[k]`` consecutive numbers for worker ``k``, all of
    them in this process."""
    info = tud.get_worker_info()
    if info is None:
        return range(sum(sizes))
    start = sum(sizes[:info.id])
    return range(start, start + sizes[info.id])


class GeneratorIterable(tud.IterableDataset):
    """torchdata's: a generator that resumes from the count its ``state_dict`` saved."""

    def __init__(self, sizes_for_all_workers: list[int]) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers
        self.i = 0
        self.resume: int | None = None

    def __iter__(self) -> Iterator[int]:
        mine = worker_slice(self.sizes_for_all_workers)
        self.i = 0
        if self.resume is not None:
            self.i, self.resume = self.resume, None
        for value in mine[self.i:]:
            self.i += 1
            yield value
        # an end-of-epoch state then resumes a whole new epoch (as torchdata's own)
        self.i = 0

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume = state["i"]


class GeneratorIterableNoState(tud.IterableDataset):
    def __init__(self, sizes_for_all_workers: list[int]) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers

    def __iter__(self) -> Iterator[int]:
        yield from worker_slice(self.sizes_for_all_workers)


class StatefulIterator(Iterator[int]):
    """torchdata's ``DummyIterator``: an iterator with its own state; with ``shuffle`` each
    sample is drawn from torch's global generator, whose state is saved too."""

    def __init__(self, samples: list[int], shuffle: bool, include_generator: bool) -> None:
        self.samples, self.shuffle = samples, shuffle
        self.include_generator = include_generator
        self.i = 0

    def __iter__(self) -> StatefulIterator:
        return self

    def __next__(self) -> int:
        if self.i >= len(self.samples):
            raise StopIteration
        i = int(torch.randint(len(self.samples), (1,)).item()) if self.shuffle else self.i
        self.i += 1
        return self.samples[i]

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"i": self.i}
        if self.include_generator:
            state["g"] = torch.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]
        if self.include_generator:
            torch.set_rng_state(state["g"])


class StatefulIteratorIterable(tud.IterableDataset):
    """torchdata's ``DummyIterableDataset``: ``__iter__`` returns a ``StatefulIterator``
    over this worker's slice."""

    def __init__(self, sizes_for_all_workers: list[int], shuffle: bool = False,
                 include_generator: bool = True) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers
        self.shuffle, self.include_generator = shuffle, include_generator

    def __iter__(self) -> StatefulIterator:
        return StatefulIterator(list(worker_slice(self.sizes_for_all_workers)), self.shuffle,
                                self.include_generator)


class SelfIteratingIterable(tud.IterableDataset, StatefulIterator):
    """torchdata's ``DummyIteratorIterableDataset``: the dataset is its own iterator."""

    def __init__(self, samples: list[int], shuffle: bool, include_generator: bool) -> None:
        StatefulIterator.__init__(self, samples, shuffle, include_generator)

    def __iter__(self) -> SelfIteratingIterable:
        return self


class ErrorDataset(tud.Dataset):
    def __getitem__(self, index: int) -> Any:
        raise ValueError("Iteration error")

    def __len__(self) -> int:
        return 10


def error_worker_init_fn(worker_id: int) -> None:
    raise ValueError("Worker init error")


def same_state(a: Any, b: Any) -> bool:
    """Equal states: tensors by value, containers recursively."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return (isinstance(b, list | tuple) and len(a) == len(b)
                and all(same_state(x, y) for x, y in zip(a, b, strict=True)))
    return bool(a == b)


# -- map-style: resume mid-epoch -------------------------------------------------------


def seeded_random_sampler(dataset: tud.Dataset, seed: int) -> tud.RandomSampler:
    return tud.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("interrupt", [0, 1, 4])
def test_map_resume_with_a_seeded_random_sampler(
    num_workers: int, batch_size: int | None, interrupt: int
) -> None:
    dataset = MapDataset(40, shuffle=False)

    def make() -> Any:
        return DataLoader(dataset, num_workers=num_workers, collate_fn=identity,
                          batch_size=batch_size, sampler=seeded_random_sampler(dataset, 13))

    loader = make()
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("interrupt", [0, 1, 4])
def test_map_resume_with_a_stateful_sampler(
    num_workers: int, batch_size: int | None, interrupt: int
) -> None:
    dataset = MapDataset(40, shuffle=False)

    def make() -> Any:
        return DataLoader(dataset, num_workers=num_workers, collate_fn=identity,
                          batch_size=batch_size, sampler=StatefulSampler(len(dataset)))

    loader = make()
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("interrupt", [2, 9])
def test_map_resume_with_shuffle(num_workers: int, interrupt: int) -> None:
    dataset = MapDataset(30, shuffle=False)
    loader = DataLoader(dataset, shuffle=True, num_workers=num_workers, collate_fn=identity,
                        batch_size=2)
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    resumed = DataLoader(dataset, shuffle=True, num_workers=num_workers, collate_fn=identity,
                         batch_size=2)
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("interrupt", [0, 1, 4])
def test_map_resume_restores_the_datasets_generator_state(interrupt: int) -> None:
    # The dataset draws from torch's global generator in this process; its state_dict()
    # (that generator's state) is saved with the loader's and loaded back.
    dataset = MapDataset(40, shuffle=True)

    def make() -> Any:
        return DataLoader(dataset, num_workers=0, collate_fn=identity, batch_size=7,
                          sampler=seeded_random_sampler(dataset, 13))

    loader = make()
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    torch.manual_seed(99)  # elsewhere in the program, the generator moves on
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_datasets_own_state_is_saved_and_restored(num_workers: int) -> None:
    saved = OffsetDataset(12, offset=100)
    loader = DataLoader(saved, batch_size=3, num_workers=num_workers)
    it = iter(loader)
    head = [next(it).tolist(), next(it).tolist()]
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    assert head + rest == [[100, 101, 102], [103, 104, 105], [106, 107, 108], [109, 110, 111]]

    restored = OffsetDataset(12, offset=0)
    resumed = DataLoader(restored, batch_size=3, num_workers=num_workers)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest
    if num_workers == 0:  # loaded into the dataset of this process
        assert restored.loaded == [{"offset": 100}]
        assert restored.offset == 100


def test_the_state_is_json_serialisable_for_a_map_dataset() -> None:
    for num_workers in (0, 2):
        dataset = MapDataset(30, shuffle=False, include_generator=False)
        sampler = StatefulSampler(30)
        loader = DataLoader(dataset, sampler=sampler, num_workers=num_workers,
                            collate_fn=identity)
        list(loader)
        it = iter(loader)
        for _ in range(4):
            next(it)
        text = json.dumps(loader.state_dict())
        expected = list(it)
        resumed = DataLoader(dataset, sampler=sampler, num_workers=num_workers,
                             collate_fn=identity)
        resumed.load_state_dict(json.loads(text))
        assert list(resumed) == expected


# -- map-style: the start and the end of an epoch --------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_state_taken_at_the_start_replays_the_epoch(num_workers: int, shuffle: bool) -> None:
    # torchdata's TestSnapshotZero: the state right after iter() replays the whole epoch
    dataset = MapDataset(30, shuffle=False)
    loader = DataLoader(dataset, shuffle=shuffle, num_workers=num_workers, collate_fn=identity)
    it = iter(loader)
    state0 = loader.state_dict()
    expected = list(it)
    loader.load_state_dict(state0)
    assert list(loader) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_interrupted_then_restarted_from_the_initial_state(num_workers: int) -> None:
    dataset = MapDataset(10, shuffle=False)
    loader = DataLoader(dataset, shuffle=True, num_workers=num_workers, collate_fn=identity)
    it = iter(loader)
    state0 = loader.state_dict()
    expected = [next(it) for _ in range(4)]
    state1 = loader.state_dict()
    loader.load_state_dict(state1)
    expected += list(loader)
    loader.load_state_dict(state0)
    assert list(loader) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_state_at_the_end_of_an_epoch_resumes_the_next_one(
    num_workers: int, batch_size: int | None
) -> None:
    # torchdata's TestSnapshotEnd (map): the next epoch after a saved end of epoch equals
    # the next epoch of the loader that saved it
    dataset = MapDataset(30, shuffle=False)
    generator = torch.Generator().manual_seed(15)

    def make() -> Any:
        return DataLoader(dataset, num_workers=num_workers, collate_fn=identity,
                          batch_size=batch_size, shuffle=True, generator=generator)

    loader = make()
    list(loader)
    state_end = loader.state_dict()
    expected = list(loader)
    generator.manual_seed(15)
    resumed = make()
    resumed.load_state_dict(state_end)
    assert list(resumed) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_state_at_the_end_of_an_epoch_with_default_shuffle(
    num_workers: int, batch_size: int | None
) -> None:
    dataset = MapDataset(30, shuffle=False)

    def make() -> Any:
        return DataLoader(dataset, shuffle=True, num_workers=num_workers, collate_fn=identity,
                          batch_size=batch_size)

    loader = make()
    list(loader)
    state_end = loader.state_dict()
    expected = list(loader)
    resumed = make()
    resumed.load_state_dict(state_end)
    assert list(resumed) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_state_inside_the_last_step_versus_after_the_epoch(num_workers: int,
                                                          shuffle: bool) -> None:
    # torchdata's TestEndOfEpochBehavior: a state taken when the last batch was yielded
    # resumes an epoch with nothing left; one taken after the loop, a whole new epoch
    size = 20

    def make() -> Any:
        return DataLoader(MapDataset(size, shuffle=False), num_workers=num_workers,
                          batch_size=1, shuffle=shuffle)

    loader = make()
    count = 0
    for _ in loader:
        count += 1
        state_in = loader.state_dict()
    state_out = loader.state_dict()
    assert count == size
    inside = make()
    inside.load_state_dict(state_in)
    assert sum(1 for _ in inside) == 0
    after = make()
    after.load_state_dict(state_out)
    assert sum(1 for _ in after) == size


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_after_two_epochs_continues_the_sequence_of_epochs(num_workers: int,
                                                                   shuffle: bool) -> None:
    # torchdata's TestMultiEpochSDL
    size = 20

    def make() -> Any:
        return DataLoader(MapDataset(size, shuffle=False), num_workers=num_workers,
                          batch_size=1, shuffle=shuffle)

    torch.manual_seed(0)
    first = make()
    items = [batch for _ in range(2) for batch in first]
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    items += [batch for _ in range(2) for batch in resumed]
    assert len(items) == size * 4
    torch.manual_seed(0)
    reference = make()
    assert items == [batch for _ in range(4) for batch in reference]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("interrupt", [3, 10, 16])
@pytest.mark.parametrize("sampler_cls", [tud.RandomSampler, tud.SequentialSampler])
def test_resume_with_torchs_samplers(num_workers: int, interrupt: int,
                                     sampler_cls: type) -> None:
    # torchdata's TestNotStatefulSamplerSDL: torch's samplers, seeded by torch.manual_seed
    size = 20

    def make() -> Any:
        dataset = MapDataset(size, shuffle=False)
        return DataLoader(dataset, num_workers=num_workers, batch_size=1,
                          sampler=sampler_cls(dataset))

    torch.manual_seed(0)
    loader = make()
    results = []
    for i, batch in enumerate(loader):
        results.append(batch)
        if i == interrupt:
            break
    state = loader.state_dict()
    torch.manual_seed(0)
    resumed = make()
    resumed.load_state_dict(state)
    results += list(resumed)
    torch.manual_seed(0)
    assert results == list(make())


# -- initial state, load then save -----------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_initial_state_replays_every_time(persistent: bool) -> None:
    dataset = MapDataset(30, shuffle=False)
    loader = DataLoader(dataset, num_workers=2, persistent_workers=persistent,
                        collate_fn=identity)
    state = loader.state_dict()
    expected = list(loader)
    it = iter(loader)
    next(it), next(it)
    loader.load_state_dict(state)
    assert list(loader) == expected
    assert list(loader) == expected


@pytest.mark.parametrize("interrupt", [2, 9])
def test_load_after_asking_a_fresh_loader_for_its_state(interrupt: int) -> None:
    dataset = MapDataset(30, shuffle=False)
    loader = DataLoader(dataset, num_workers=2, shuffle=True, collate_fn=identity)
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    resumed = DataLoader(dataset, num_workers=2, shuffle=True, collate_fn=identity)
    resumed.state_dict()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("interrupt", [2, 9])
def test_state_right_after_loading_is_the_loaded_state(interrupt: int) -> None:
    dataset = MapDataset(30, shuffle=False)
    loader = DataLoader(dataset, num_workers=2, shuffle=True, collate_fn=identity)
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    resumed = DataLoader(dataset, num_workers=2, shuffle=True, collate_fn=identity)
    resumed.load_state_dict(state)
    assert same_state(resumed.state_dict(), state)
    assert list(resumed) == expected


def test_loading_the_initial_state_mid_epoch() -> None:
    dataset = MapDataset(30, shuffle=False)
    first = DataLoader(dataset, num_workers=2, collate_fn=identity)
    state0 = first.state_dict()
    expected = list(first)
    loader = DataLoader(dataset, num_workers=2, collate_fn=identity)
    it = iter(loader)
    for _ in range(3):
        next(it)
    loader.load_state_dict(state0)
    assert same_state(loader.state_dict(), state0)
    assert list(loader) == expected
    del it


def test_an_error_in_worker_init_fn_is_raised_as_is() -> None:
    loader = DataLoader(MapDataset(30, shuffle=True), num_workers=2, collate_fn=identity,
                        worker_init_fn=error_worker_init_fn)
    with pytest.raises(ValueError, match="Worker init error"):
        next(iter(loader))


def test_an_error_in_getitem_is_raised_as_is() -> None:
    loader = DataLoader(ErrorDataset(), num_workers=2, collate_fn=identity)
    it = iter(loader)
    with pytest.raises(ValueError, match="Iteration error"):
        next(it)
    del it


def test_same_batches_as_torchs_loader() -> None:
    # torchdata's TestConcurrentDataLoaders
    dataset = MapDataset(30, shuffle=False)
    ours = list(DataLoader(dataset, num_workers=2, collate_fn=identity))
    assert ours == list(tud.DataLoader(dataset, num_workers=0, collate_fn=identity))


# -- iterable-style datasets -----------------------------------------------------------


def torchs_iterable_order(sizes: list[int], num_workers: int,
                          batch_size: int | None) -> list[Any]:
    """What torch's loader yields for ``worker_slice`` datasets with ``collate_fn=identity``:
    each worker batches its own slice, and batches are taken from the workers in turn,
    skipping a worker once it is exhausted."""
    if num_workers == 0:
        slices = [list(range(sum(sizes)))]
    else:
        starts = [sum(sizes[:k]) for k in range(num_workers)]
        slices = [list(range(start, start + size)) for start, size in zip(starts, sizes,
                                                                          strict=True)]
    per_worker = [
        s if batch_size is None else [s[i:i + batch_size] for i in range(0, len(s), batch_size)]
        for s in slices
    ]
    order = []
    for turn in itertools.zip_longest(*per_worker, fillvalue=None):
        order.extend(b for b in turn if b is not None)
    return order


ITERABLE_CASES = list(itertools.product([0, 2], [None, 7], [0, 1, 5]))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("dataset_cls", [GeneratorIterable, GeneratorIterableNoState])
def test_iterable_order_is_torchs(num_workers: int, batch_size: int | None,
                                  dataset_cls: type) -> None:
    # the epoch the resume tests below cut in two
    loader = DataLoader(dataset_cls([30, 17]), num_workers=num_workers, collate_fn=identity,
                        batch_size=batch_size)
    assert list(loader) == torchs_iterable_order([30, 17], num_workers, batch_size)


@pytest.mark.parametrize(("num_workers", "batch_size", "interrupt"), ITERABLE_CASES)
@pytest.mark.parametrize("dataset_cls", [GeneratorIterable, GeneratorIterableNoState])
def test_iterable_resume_mid_epoch(num_workers: int, batch_size: int | None, interrupt: int,
                                   dataset_cls: type) -> None:
    # torchdata's TestStatefulDataLoaderGenerator(NoState)
    sizes = [30, 17]

    def make() -> Any:
        return DataLoader(dataset_cls(sizes), num_workers=num_workers, collate_fn=identity,
                          batch_size=batch_size)

    expected = list(make())
    loader = make()
    it = iter(loader)
    batches = [next(it) for _ in range(interrupt)]
    state = loader.state_dict()
    assert batches == expected[:interrupt]
    del it
    resumed = make()
    resumed.load_state_dict(state)
    batches += list(resumed)
    assert batches == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_state_taken_at_the_start_replays_the_epoch(num_workers: int) -> None:
    loader = DataLoader(GeneratorIterable([30, 17]), num_workers=num_workers,
                        collate_fn=identity)
    it = iter(loader)
    state0 = loader.state_dict()
    expected = list(it)
    loader.load_state_dict(state0)
    assert list(loader) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
@pytest.mark.parametrize("dataset_cls", [GeneratorIterable, GeneratorIterableNoState])
def test_iterable_state_at_the_end_of_an_epoch(num_workers: int, batch_size: int | None,
                                               dataset_cls: type) -> None:
    # torchdata's TestSnapshotEnd (generator): a saved end of epoch starts a whole new one
    def make() -> Any:
        return DataLoader(dataset_cls([30, 17]), num_workers=num_workers, collate_fn=identity,
                          batch_size=batch_size)

    loader = make()
    expected = list(loader)
    state_end = loader.state_dict()
    assert list(loader) == expected
    other = make()
    it = iter(other)
    next(it), next(it)
    other.load_state_dict(state_end)
    assert list(other) == expected
    del it


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_state_is_json_serialisable(num_workers: int) -> None:
    dataset = GeneratorIterable([30, 17])
    loader = DataLoader(dataset, num_workers=num_workers, collate_fn=identity)
    list(loader)
    it = iter(loader)
    for _ in range(4):
        next(it)
    text = json.dumps(loader.state_dict())
    expected = list(it)
    resumed = DataLoader(GeneratorIterable([30, 17]), num_workers=num_workers,
                         collate_fn=identity)
    resumed.load_state_dict(json.loads(text))
    assert list(resumed) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("interrupt", [0, 1, 10])
def test_iterable_resume_with_a_stateful_iterator(num_workers: int, interrupt: int) -> None:
    # torchdata's TestStatefulDataLoaderIterable: __iter__ returns an iterator with a state
    def make() -> Any:
        return DataLoader(StatefulIteratorIterable([30, 17]), num_workers=num_workers,
                          collate_fn=identity)

    loader = make()
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("interrupt", [0, 1, 10])
def test_iterable_resume_restores_the_iterators_generator_state(interrupt: int) -> None:
    # torchdata's test_random_state, in this process: the iterator draws from torch's global
    # generator, and its saved state (that generator's state included) is loaded back
    def make() -> Any:
        return DataLoader(StatefulIteratorIterable([47], shuffle=True), num_workers=0,
                          collate_fn=identity, batch_size=7)

    loader = make()
    it = iter(loader)
    for _ in range(min(interrupt, 6)):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    torch.manual_seed(1234)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("interrupt", [0, 1, 10])
def test_iterable_resume_when_the_dataset_is_its_own_iterator(shuffle: bool,
                                                              interrupt: int) -> None:
    # torchdata's TestStatefulDataLoaderIterable2, in this process
    def make() -> Any:
        return DataLoader(SelfIteratingIterable(list(range(40)), shuffle, True), num_workers=0,
                          collate_fn=identity)

    loader = make()
    it = iter(loader)
    for _ in range(interrupt):
        next(it)
    state = loader.state_dict()
    expected = list(it)
    torch.manual_seed(4321)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


def test_iterable_resume_with_persistent_workers() -> None:
    def make() -> Any:
        return DataLoader(GeneratorIterable([30, 17]), num_workers=2, persistent_workers=True,
                          collate_fn=identity)

    loader = make()
    expected = list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
