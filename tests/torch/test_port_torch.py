"""PyTorch's ``test/test_dataloader.py``, ported to ``asyncflow.DataLoader``: the cases that
use torch's public DataLoader interface, with torch's own samplers and datasets, stating
torch's behaviour (exception types and messages included).

Left out: cases about torch's internals (``_workers``, ``_utils.worker``, the worker
processes' signal handling, segfaults, ``ulimit``), cases that need ``fork``, and
``torch.utils.data``'s own helpers (``random_split``, ``ConcatDataset``,
``default_collate``), which no loader changes. Worker counts and sizes are smaller than
torch's, for a two-core machine.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import operator
import os
import threading
import warnings
from collections import Counter, namedtuple
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import (
    BatchSampler,
    ChainDataset,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

import asyncflow
from asyncflow.pipeline import usable_cpus

DataLoader = asyncflow.DataLoader

# torch warns that pinning is useless without an accelerator; a CPU-only run may warn too
ignore_pin_warning = pytest.mark.filterwarnings("ignore:'pin_memory' argument")
ignore_pin_device_warning = pytest.mark.filterwarnings("ignore:pin_memory_device is deprecated")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# -- datasets and functions (module level: worker processes import them) ---------------


def make_tensor_dataset() -> tuple[torch.Tensor, torch.Tensor, TensorDataset]:
    """torch's ``TestDataLoader.setUp``: 100 samples, each label twice."""
    g = torch.Generator().manual_seed(0)
    data = torch.randn(100, 2, 3, 5, generator=g)
    labels = torch.randperm(50, generator=g).repeat(2)
    return data, labels, TensorDataset(data, labels)


class CountingDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> int:
        return i

    def __len__(self) -> int:
        return self.n


class CountingIterableDataset(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class WorkerSpecificIterableDataset(IterableDataset):
    """Worker ``k`` yields ``range(sizes[k])``: only meaningful inside workers."""

    def __init__(self, sizes_for_all_workers: list[int]) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        return iter(range(self.sizes_for_all_workers[info.id]))

    def __len__(self) -> int:
        return sum(self.sizes_for_all_workers)


class ErrorDataset(Dataset):
    """No ``__getitem__``: ``Dataset.__getitem__`` raises ``NotImplementedError``."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class FailsAt(Dataset):
    """Items ``0..n-1``; fetching one of ``bad`` raises ``error(index)``."""

    def __init__(self, n: int, bad: tuple[int, ...], error: type[Exception]) -> None:
        self.n, self.bad, self.error = n, bad, error

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise self.error(i)
        return i


class ErrorIterableDataset(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("Error in __iter__")


def error_worker_init_fn(_: int) -> None:
    raise RuntimeError("Error in worker_init_fn")


class BlockingDataset(Dataset):
    """``__getitem__`` of index ``block`` waits until ``release`` is called (or ``limit``
    seconds pass): a fetch that does not finish while the test looks."""

    def __init__(self, size: int, block: int, limit: float) -> None:
        self.size, self.block, self.limit = size, block, limit
        self.released = threading.Event()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        if i == self.block:
            self.released.wait(self.limit)
        return i


class SleepDataset(Dataset):
    """torch's: the first fetch in each copy of the dataset sleeps ``sleep_sec``."""

    def __init__(self, size: int, sleep_sec: float) -> None:
        self.size, self.sleep_sec = size, sleep_sec
        self.slept = threading.Event()

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size, "sleep_sec": self.sleep_sec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"], state["sleep_sec"])  # type: ignore[misc]

    def __getitem__(self, i: int) -> int:
        if not self.slept.is_set():
            self.slept.set()
            threading.Event().wait(self.sleep_sec)
        return i

    def __len__(self) -> int:
        return self.size


class SeedDataset(Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()

    def __len__(self) -> int:
        return self.size


class WorkerSeedDataset(Dataset):
    """Each sample: its worker's id, ``worker_info.seed`` and ``torch.initial_seed()``."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = tud.get_worker_info()
        assert info is not None
        return info.id, info.seed, torch.initial_seed()

    def __len__(self) -> int:
        return self.size


def init_fn(worker_id: int) -> None:
    torch.manual_seed(12345)


class WorkerInfoDataset(Dataset):
    """torch's ``TestWorkerInfoDataset``: ``value`` is set by ``worker_info_init_fn`` on the
    worker's copy only."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(self.value)

    def __len__(self) -> int:
        return self.size


def worker_info_init_fn(worker_id: int) -> None:
    info = tud.get_worker_info()
    assert info is not None
    assert worker_id == info.id
    assert worker_id < info.num_workers
    assert info.seed == torch.initial_seed()
    dataset = info.dataset
    assert isinstance(dataset, WorkerInfoDataset)
    assert not hasattr(dataset, "value")
    for attr in ("id", "a"):
        try:
            setattr(info, attr, 3999)
        except (AttributeError, TypeError, RuntimeError):
            pass  # torch 2.13's WorkerInfo is a frozen dataclass; older torch: RuntimeError
        else:
            raise AssertionError("WorkerInfo accepted an assignment")
    for k in ("id", "num_workers", "seed", "dataset"):
        assert f"{k}=" in repr(info)
    dataset.value = [worker_id, os.getpid()]


class BulkLoadingDataset(Dataset):
    """``__getitem__`` takes a whole list of indices (a sampler that yields lists)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __getitem__(self, indices: list[int]) -> torch.Tensor:
        assert isinstance(indices, list | tuple)
        return torch.as_tensor(indices)

    def __len__(self) -> int:
        return self.length


class BulkLoadingSampler(tud.Sampler):
    def __init__(self, dataset: Dataset, batch_size: int) -> None:
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self) -> Iterator[list[int]]:
        for x in torch.randperm(len(self.dataset)).split(self.batch_size):
            yield x.tolist()

    def __len__(self) -> int:
        return math.ceil(len(self.dataset) / self.batch_size)


class CountingSampler(tud.Sampler):
    """``range(n)``, counting the indices that have been drawn."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.drawn = 0

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.drawn += 1
            yield i

    def __len__(self) -> int:
        return self.n


class MultiEpochDataset(IterableDataset):
    """Each worker yields its own id ``length // num_workers`` times."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        assert info is not None
        for _ in range(self.length // info.num_workers):
            yield info.id

    def __len__(self) -> int:
        return self.length


class EmptyTensorDataset(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.empty(0)


class StringDataset(Dataset):
    def __init__(self) -> None:
        self.s = "12345"

    def __len__(self) -> int:
        return len(self.s)

    def __getitem__(self, i: int) -> tuple[str, int]:
        return self.s[i], i


class DictDataset(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"a_tensor": torch.empty(4, 2).fill_(i), "another_dict": {"a_number": i}}


Batch = namedtuple("Batch", ["data", "label", "random_tensor"])
Data = namedtuple("Data", ["positive", "negative"])


class NamedTupleDataset(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Batch:
        return Batch(data=Data(positive=i, negative=-i), label=str(i),
                     random_tensor=torch.randn(3))


class SimpleCustomBatch:
    def __init__(self, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        inputs, targets = zip(*data, strict=True)
        self.inp = torch.stack(inputs, 0)
        self.tgt = torch.stack(targets, 0)

    def pin_memory(self) -> SimpleCustomBatch:
        self.inp = self.inp.pin_memory()
        self.tgt = self.tgt.pin_memory()
        return self

    def is_pinned(self) -> bool:
        return self.inp.is_pinned() and self.tgt.is_pinned()


def collate_wrapper(batch: list[Any]) -> SimpleCustomBatch:
    return SimpleCustomBatch(batch)


def clone_collate(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    return [x.clone() for x in batch]


class WorkerQueueDataset(Dataset):
    """torch's ``TestWorkerQueueDataset``: ``worker_init_fn`` (a bound method) records the
    worker's id in that worker's copy."""

    def __init__(self, data: list[int]) -> None:
        self.data = data
        self.worker_id: int | None = None

    def worker_init_fn(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def __getitem__(self, i: int) -> tuple[int | None, int]:
        return self.worker_id, self.data[i]

    def __len__(self) -> int:
        return len(self.data)


class StartCheckingDataset(Dataset):
    """torch's ``DummyDataset``: persistent workers keep the copy made at their start."""

    def __init__(self) -> None:
        self.data = list(range(10))
        self.start = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> int:
        assert self.start == 0
        return self.data[i]


class ConvDataset(Dataset):
    def __init__(self) -> None:
        self.x = torch.ones(1, 1, 240)
        self[0]  # a convolution in this process first

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


def assert_same(got: Any, want: Any) -> None:
    """torch's ``assertEqual`` for batches: tensors equal in value, nested containers alike."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), (type(got), want)
        assert got.shape == want.shape and torch.equal(got, want.to(got.dtype)), (got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (got, want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), (got, want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    else:
        assert got == want, (got, want)


# -- sequential and shuffled map-style loading ----------------------------------------


def check_sequential(loader: Any, data: torch.Tensor, labels: torch.Tensor) -> None:
    batch_size = loader.batch_size
    count = 0
    for i, (sample, target) in enumerate(loader):
        if batch_size is None:
            assert torch.equal(sample, data[i]) and torch.equal(target, labels[i])
        else:
            idx = i * batch_size
            assert torch.equal(sample, data[idx:idx + batch_size])
            assert torch.equal(target, labels[idx:idx + batch_size])
        count += 1
    step = batch_size or 1
    assert count == math.ceil(len(data) / step)


def check_shuffle(loader: Any, data: torch.Tensor, labels: torch.Tensor) -> None:
    """Every sample exactly once, each with its own label."""
    found = Counter()
    batch_size = loader.batch_size
    batches = 0
    for samples, targets in loader:
        if batch_size is None:
            samples, targets = samples.unsqueeze(0), targets.unsqueeze(0)
        for sample, target in zip(samples, targets, strict=True):
            matches = [j for j in range(len(data)) if torch.equal(data[j], sample)]
            assert len(matches) == 1
            assert found[matches[0]] == 0
            found[matches[0]] += 1
            assert target == labels[matches[0]]
        batches += 1
    assert sum(found.values()) == len(data)
    assert batches == math.ceil(len(data) / (batch_size or 1))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 1, 2, 3])
def test_sequential(num_workers: int, batch_size: int | None) -> None:
    data, labels, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    check_sequential(loader, data, labels)


def test_sequential_with_a_prefetch_factor() -> None:
    data, labels, dataset = make_tensor_dataset()
    check_sequential(
        DataLoader(dataset, batch_size=2, num_workers=2, prefetch_factor=3), data, labels
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 1, 2])
def test_shuffle(num_workers: int, batch_size: int | None) -> None:
    data, labels, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)
    check_shuffle(loader, data, labels)


def test_shuffle_with_a_prefetch_factor() -> None:
    data, labels, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_size=2, shuffle=True, num_workers=2, prefetch_factor=3)
    check_shuffle(loader, data, labels)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_reproducibility_with_a_generator(num_workers: int) -> None:
    _, _, dataset = make_tensor_dataset()

    def make() -> Any:
        return DataLoader(dataset, shuffle=True, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(42))

    assert_same(list(make()), list(make()))


def test_shuffle_with_a_generator_matches_torchs_order() -> None:
    ours = DataLoader(CountingDataset(30), batch_size=4, shuffle=True,
                      generator=torch.Generator().manual_seed(3))
    theirs = tud.DataLoader(CountingDataset(30), batch_size=4, shuffle=True,
                            generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        assert_same(list(ours), list(theirs))


def test_shuffle_follows_torchs_global_seed() -> None:
    torch.manual_seed(7)
    first = [b.tolist() for b in DataLoader(CountingDataset(20), batch_size=5, shuffle=True)]
    torch.manual_seed(7)
    again = [b.tolist() for b in DataLoader(CountingDataset(20), batch_size=5, shuffle=True)]
    assert first == again
    assert sorted(x for b in first for x in b) == list(range(20))


def test_numpy_samples_are_collated_into_a_double_tensor() -> None:
    class NumpyDataset(Dataset):
        def __getitem__(self, i: int) -> np.ndarray:
            return np.ones((2, 3, 4)) * i

        def __len__(self) -> int:
            return 100

    batch = next(iter(DataLoader(NumpyDataset(), batch_size=12, num_workers=0)))
    assert isinstance(batch, torch.DoubleTensor)
    assert batch.size() == torch.Size([12, 2, 3, 4])


@pytest.mark.parametrize(
    ("dtype", "tensor_type"),
    [
        (np.float64, torch.DoubleTensor), (np.float32, torch.FloatTensor),
        (np.float16, torch.HalfTensor), (np.int64, torch.LongTensor),
        (np.int32, torch.IntTensor), (np.int16, torch.ShortTensor),
        (np.int8, torch.CharTensor), (np.uint8, torch.ByteTensor),
    ],
)
def test_numpy_scalars(dtype: Any, tensor_type: Any) -> None:
    class ScalarDataset(Dataset):
        def __getitem__(self, i: int) -> Any:
            return dtype()

        def __len__(self) -> int:
            return 4

    batch = next(iter(DataLoader(ScalarDataset(), batch_size=2, num_workers=0)))
    assert isinstance(batch, tensor_type)


# -- len, epochs, breaking out ---------------------------------------------------------


@pytest.mark.parametrize(("batch_size", "expected"), [(1, 100), (2, 50), (3, 34)])
def test_len(batch_size: int, expected: int) -> None:
    _, _, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=0)
    assert len(loader) == expected
    assert sum(1 for _ in loader) == expected


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "expected"),
    [(1, False, 10), (1, True, 10), (2, False, 5), (2, True, 5), (3, False, 4), (3, True, 3)],
)
def test_iterable_dataset_len(batch_size: int, drop_last: bool, expected: int) -> None:
    loader = DataLoader(CountingIterableDataset(10), batch_size=batch_size, drop_last=drop_last,
                        num_workers=0)
    assert len(loader) == expected


def test_len_follows_a_growing_dataset() -> None:
    dataset = [torch.ones(4) for _ in range(4)]
    sequential = DataLoader(dataset, shuffle=False, num_workers=0)
    shuffled = DataLoader(dataset, shuffle=True, num_workers=0)
    dataset.append(torch.ones(4))
    assert len(sequential) == 5
    assert len(shuffled) == 5
    assert len(list(shuffled)) == 5


def test_drop_last_drops_the_partial_batch() -> None:
    loader = DataLoader(CountingDataset(10), batch_size=3, drop_last=True, num_workers=0)
    assert len(loader) == 3
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_multiple_epochs_give_every_sample_each_time() -> None:
    loader = DataLoader(CountingDataset(12), batch_size=5, shuffle=True, num_workers=2)
    for _ in range(3):
        batches = [b.tolist() for b in loader]
        assert [len(b) for b in batches] == [5, 5, 2]
        assert sorted(x for b in batches for x in b) == list(range(12))


def test_breaking_out_early_stops_the_workers(leak_check: None) -> None:
    _, _, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_size=2, num_workers=2)
    it = iter(loader)
    for i, _ in enumerate(it):
        if i == 10:
            break
    del it
    # a new epoch starts from the beginning
    assert len(list(loader)) == 50


def test_two_loaders_iterated_in_turn() -> None:
    _, _, dataset = make_tensor_dataset()
    it1 = iter(DataLoader(dataset, num_workers=1))
    it2 = iter(DataLoader(dataset, num_workers=2))
    firsts = [next(it1), next(it1), next(it2), next(it2), next(it1), next(it2)]
    assert [int(f[1]) for f in firsts] == [int(dataset[i][1]) for i in (0, 1, 0, 1, 2, 2)]
    del it1, it2


# -- samplers --------------------------------------------------------------------------


def sample_stat(sampler: Any) -> tuple[int, int, int, int]:
    counts = Counter(sampler)
    repeated = sum(v > 1 for v in counts.values())
    return repeated, min(counts), max(counts), sum(counts.values())


def test_random_sampler() -> None:
    _, _, dataset = make_tensor_dataset()
    n = len(dataset)
    repeated, low, high, total = sample_stat(RandomSampler(dataset, replacement=True,
                                                           num_samples=n + 1))
    assert repeated > 0 and low >= 0 and high < n and total == n + 1
    assert sample_stat(RandomSampler(dataset)) == (0, 0, n - 1, n)
    assert sample_stat(RandomSampler(dataset, num_samples=2 * n)) == (n, 0, n - 1, 2 * n)
    repeated, low, high, total = sample_stat(RandomSampler(dataset, num_samples=n - 1))
    assert (repeated, total) == (0, n - 1) and low >= 0 and high < n
    assert sample_stat(RandomSampler(dataset, num_samples=n + 1)) == (1, 0, n - 1, n + 1)


def test_random_sampler_refuses_a_non_boolean_replacement() -> None:
    _, _, dataset = make_tensor_dataset()
    with pytest.raises(TypeError, match="replacement should be a boolean value, but got "
                                        "replacement=0"):
        RandomSampler(dataset, replacement=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("replacement", [True, False])
def test_loader_len_with_a_random_sampler_of_num_samples(replacement: bool) -> None:
    _, _, dataset = make_tensor_dataset()
    num_samples = len(dataset) + 5
    sampler = RandomSampler(dataset, replacement=replacement, num_samples=num_samples)
    assert len(sampler) == num_samples
    assert sum(1 for _ in sampler) == num_samples
    assert len(DataLoader(dataset, batch_size=1, sampler=sampler, num_workers=0)) == num_samples
    loader = DataLoader(dataset, batch_size=6, sampler=sampler, num_workers=0)
    assert len(loader) == math.ceil(num_samples / 6)
    assert sum(len(b[0]) for b in loader) == num_samples


def test_random_sampler_with_replacement_through_the_loader() -> None:
    sampler = RandomSampler(CountingDataset(10), replacement=True, num_samples=25,
                            generator=torch.Generator().manual_seed(5))
    expected = list(RandomSampler(CountingDataset(10), replacement=True, num_samples=25,
                                  generator=torch.Generator().manual_seed(5)))
    got = torch.cat(list(DataLoader(CountingDataset(10), batch_size=4, sampler=sampler,
                                    num_workers=0))).tolist()
    assert got == expected


def test_distributed_sampler_invalid_rank() -> None:
    dataset = torch.IntTensor(range(10))
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(dataset, 3, 3)
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(dataset, 3, -1)


def test_distributed_sampler_with_drop_last_never_duplicates() -> None:
    num_processes, num_batches = 4, 9
    dataset = torch.IntTensor(range(num_batches))
    scanned = []
    for rank in range(num_processes):
        sampler = DistributedSampler(dataset, num_processes, rank)
        loader = DataLoader(dataset, batch_size=num_batches // num_processes, drop_last=True,
                            sampler=sampler, num_workers=0)
        scanned.extend(torch.cat(list(loader)).tolist())
    assert len(scanned) == len(set(scanned))


WEIGHTS = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]


def seeded_samplers() -> list[Any]:
    _, _, dataset = make_tensor_dataset()
    return [
        RandomSampler(dataset, num_samples=5, replacement=True,
                      generator=torch.Generator().manual_seed(42)),
        RandomSampler(dataset, replacement=False, generator=torch.Generator().manual_seed(42)),
        WeightedRandomSampler(WEIGHTS, num_samples=5, replacement=True,
                              generator=torch.Generator().manual_seed(42)),
        WeightedRandomSampler(WEIGHTS, num_samples=5, replacement=False,
                              generator=torch.Generator().manual_seed(42)),
        SubsetRandomSampler(range(10), generator=torch.Generator().manual_seed(42)),
    ]


@pytest.mark.parametrize("which", range(5))
def test_seeded_sampler_passed_as_sampler_gives_its_order(which: int) -> None:
    expected = list(seeded_samplers()[which])
    loader = DataLoader(CountingDataset(100), batch_size=2, sampler=seeded_samplers()[which],
                        num_workers=0)
    assert torch.cat(list(loader)).tolist() == expected
    again = DataLoader(CountingDataset(100), batch_size=2, sampler=seeded_samplers()[which],
                       num_workers=2)
    assert torch.cat(list(again)).tolist() == expected


@pytest.mark.parametrize("which", range(5))
def test_unseeded_sampler_follows_torchs_global_seed(which: int) -> None:
    _, _, dataset = make_tensor_dataset()
    samplers = [
        RandomSampler(dataset, num_samples=5, replacement=True),
        RandomSampler(dataset, replacement=False),
        WeightedRandomSampler(WEIGHTS, num_samples=5, replacement=True),
        WeightedRandomSampler(WEIGHTS, num_samples=5, replacement=False),
        SubsetRandomSampler(range(10)),
    ]
    loader = DataLoader(CountingDataset(100), sampler=samplers[which], num_workers=0)
    torch.manual_seed(0)
    first = [b.tolist() for b in loader] + [b.tolist() for b in loader]
    torch.manual_seed(0)
    second = [b.tolist() for b in loader] + [b.tolist() for b in loader]
    assert first == second


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_iterable_as_sampler(num_workers: int) -> None:
    data, _, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, sampler=range(2, 12), batch_size=2, num_workers=num_workers)
    assert len(loader) == 5
    for i, (inputs, _target) in enumerate(loader):
        assert len(inputs) == 2
        assert torch.equal(inputs, data[i * 2 + 2:i * 2 + 4])


def odd_batches() -> list[tuple[int, ...]]:
    """``[(0, 1), (2, 3, 4), (5, 6), (7, 8, 9), ...]`` up to 19."""
    batches = []
    for i in range(0, 20, 5):
        batches.append(tuple(range(i, i + 2)))
        batches.append(tuple(range(i + 2, i + 5)))
    return batches


def check_batch_sampler(loader: Any, data: torch.Tensor) -> None:
    assert len(loader) == 8
    for i, (inputs, _target) in enumerate(loader):
        offset = i * 5 // 2
        size = 2 if i % 2 == 0 else 3
        assert len(inputs) == size
        assert torch.equal(inputs, data[offset:offset + size])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_list_as_batch_sampler(num_workers: int) -> None:
    data, _, dataset = make_tensor_dataset()
    check_batch_sampler(DataLoader(dataset, batch_sampler=odd_batches(),
                                   num_workers=num_workers), data)


@pytest.mark.timeout(60)
def test_batch_sampler_on_spawned_worker_processes(leak_check: None) -> None:
    data, _, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_sampler=odd_batches(), num_workers=2,
                        multiprocessing_context="spawn", workers="processes")
    check_batch_sampler(loader, data)
    del loader


@pytest.mark.parametrize("drop_last", [False, True])
def test_torchs_batch_sampler(drop_last: bool) -> None:
    sampler = BatchSampler(SequentialSampler(range(10)), 4, drop_last)
    loader = DataLoader(CountingDataset(10), batch_sampler=sampler, num_workers=0)
    assert len(loader) == len(sampler)
    assert [b.tolist() for b in loader] == [list(b) for b in sampler]


def test_batch_sampler_of_random_indices() -> None:
    sampler = BatchSampler(RandomSampler(range(10), generator=torch.Generator().manual_seed(1)),
                           3, False)
    expected = [list(b) for b in BatchSampler(
        RandomSampler(range(10), generator=torch.Generator().manual_seed(1)), 3, False)]
    assert [b.tolist() for b in DataLoader(CountingDataset(10), batch_sampler=sampler,
                                            num_workers=0)] == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bulk_loading_without_batching(num_workers: int) -> None:
    dataset = BulkLoadingDataset(35)
    loader = DataLoader(dataset, num_workers=num_workers, batch_size=None,
                        sampler=BulkLoadingSampler(dataset, batch_size=4))
    samples = list(loader)
    assert len(samples) == 9
    assert not samples[0].is_pinned()
    assert set(torch.cat(samples, 0).tolist()) == set(range(35))


def test_index_batches_are_drawn_lazily() -> None:
    # torch draws each batch's indices when that batch is requested (plus its prefetch):
    # a sampler of millions of indices costs nothing up front. (Drawing ahead in chunks is
    # fine; drawing the epoch is not.)
    sampler = CountingSampler(1_000_000)
    it = iter(DataLoader(EmptyTensorDataset(1_000_000), batch_size=4, sampler=sampler,
                         num_workers=0))
    assert next(it).shape == (4, 0)
    assert sampler.drawn <= len(sampler) // 100
    del it


def test_index_batches_are_drawn_lazily_with_workers() -> None:
    sampler = CountingSampler(1_000_000)
    it = iter(DataLoader(EmptyTensorDataset(1_000_000), batch_size=4, sampler=sampler,
                         num_workers=2))
    next(it)
    assert sampler.drawn <= len(sampler) // 100
    del it


class EmptySampler(tud.Sampler):
    """Falsy (``len() == 0``): still the sampler to use, not a missing one."""

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_a_zero_length_sampler_is_not_replaced_by_the_default() -> None:
    # from SPDL's DataLoader-compat tests
    loader = DataLoader(CountingDataset(3), batch_size=1, sampler=EmptySampler(),
                        num_workers=0)
    assert len(loader) == 0
    assert list(loader) == []


# -- collate ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("collection", [list, tuple])
def test_builtin_collection_conversion(num_workers: int, collection: type) -> None:
    fetched = collection(DataLoader(CountingDataset(20), batch_size=None,
                                    num_workers=num_workers))
    assert fetched == collection(range(20))
    assert all(type(x) is int for x in fetched)
    fetched = collection(DataLoader(CountingDataset(20), batch_size=2, num_workers=num_workers))
    assert_same(fetched, collection(torch.tensor([i, i + 1]) for i in range(0, 20, 2)))
    fetched = collection(DataLoader(CountingIterableDataset(20), batch_size=None,
                                    num_workers=num_workers))
    assert fetched == collection(range(20))
    assert all(type(x) is int for x in fetched)
    fetched = collection(DataLoader(CountingIterableDataset(20), batch_size=2,
                                    num_workers=num_workers))
    assert_same(fetched, collection(torch.tensor([i, i + 1]) for i in range(0, 20, 2)))


def test_dict_samples_are_collated_per_key() -> None:
    for persistent in (False, True):
        loader = DataLoader(DictDataset(), batch_size=2, shuffle=False,
                            persistent_workers=persistent, num_workers=1 if persistent else 0)
        for i, sample in enumerate(loader):
            idx = i * 2
            assert set(sample) == {"a_tensor", "another_dict"}
            assert set(sample["another_dict"]) == {"a_number"}
            t = sample["a_tensor"]
            assert t.size() == torch.Size([2, 4, 2])
            assert (t[0] == idx).all() and (t[1] == idx + 1).all()
            n = sample["another_dict"]["a_number"]
            assert n.size() == torch.Size([2])
            assert n.tolist() == [idx, idx + 1]


def test_string_samples_stay_strings() -> None:
    for s, n in DataLoader(StringDataset(), batch_size=2, shuffle=True, num_workers=2):
        assert isinstance(s[0], str)
        assert isinstance(n, torch.Tensor)


def test_namedtuples_keep_their_type() -> None:
    for batch in DataLoader(NamedTupleDataset(), batch_size=2, num_workers=0):
        assert isinstance(batch, Batch)
        assert isinstance(batch.data, Data)
        assert isinstance(batch.data.positive, torch.Tensor)
        assert not batch.random_tensor.is_pinned()
    for batch in DataLoader(NamedTupleDataset(), batch_size=None, num_workers=0):
        assert isinstance(batch, Batch)
        assert isinstance(batch.data, Data)
        assert not isinstance(batch.data.positive, torch.Tensor)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_custom_collate_fn_returns_a_custom_batch(num_workers: int) -> None:
    inputs = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    dataset = TensorDataset(inputs, inputs + 100)
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_wrapper,
                        num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == 5
    for i, sample in enumerate(batches):
        assert isinstance(sample, SimpleCustomBatch)
        assert torch.equal(sample.inp, inputs[2 * i:2 * i + 2])
        assert torch.equal(sample.tgt, inputs[2 * i:2 * i + 2] + 100)


def test_collate_fn_with_batch_size_none_gets_single_samples() -> None:
    seen = []

    def collate(sample: Any) -> Any:
        seen.append(sample)
        return sample

    assert list(DataLoader(CountingDataset(4), batch_size=None, collate_fn=collate,
                           num_workers=0)) == [0, 1, 2, 3]
    assert sorted(seen) == [0, 1, 2, 3]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensors_with_a_cloning_collate() -> None:
    dataset = [torch.nested.nested_tensor([torch.randn(5)]) for _ in range(6)]
    loader = DataLoader(dataset, batch_size=1, num_workers=2, collate_fn=clone_collate)
    for i, batch in enumerate(loader):
        assert torch.equal(batch[0].to_padded_tensor(0.0), dataset[i].to_padded_tensor(0.0))
    with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
        next(iter(DataLoader(dataset, batch_size=1, num_workers=2)))


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_failing_batch_raises_and_iteration_goes_on(num_workers: int) -> None:
    loader = DataLoader(ErrorDataset(20), batch_size=2, shuffle=True, num_workers=num_workers)
    it = iter(loader)
    errors = 0
    while True:
        try:
            next(it)
        except NotImplementedError:
            errors += 1
        except StopIteration:
            break
    assert errors == math.ceil(len(loader.dataset) / loader.batch_size)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("error", [KeyError, ValueError, IndexError])
def test_a_failing_getitem_raises_its_own_type_and_the_rest_follows(
    num_workers: int, error: type[Exception]
) -> None:
    it = iter(DataLoader(FailsAt(6, (1,), error), batch_size=None, num_workers=num_workers))
    assert next(it) == 0
    with pytest.raises(error):
        next(it)
    assert list(it) == [2, 3, 4, 5]


def test_a_failed_batch_in_the_middle_skips_only_that_batch() -> None:
    it = iter(DataLoader(FailsAt(10, (5,), KeyError), batch_size=2, num_workers=2))
    got = [next(it).tolist(), next(it).tolist()]
    with pytest.raises(KeyError):
        next(it)
    got += [b.tolist() for b in it]
    assert got == [[0, 1], [2, 3], [6, 7], [8, 9]]


def test_the_error_can_be_caught_inside_a_for_loop() -> None:
    loader = DataLoader(FailsAt(8, (3, 6), ValueError), batch_size=None, num_workers=0)
    got, failures = [], 0
    it = iter(loader)
    while True:
        try:
            got.append(next(it))
        except ValueError:
            failures += 1
        except StopIteration:
            break
    assert (got, failures) == ([0, 1, 2, 4, 5, 7], 2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_iter_of_an_iterable_dataset(num_workers: int) -> None:
    loader = DataLoader(ErrorIterableDataset(), num_workers=num_workers)
    with pytest.raises(RuntimeError, match="Error in __iter__"):
        list(iter(loader))


def test_an_error_in_worker_init_fn(leak_check: None) -> None:
    _, _, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, num_workers=2, worker_init_fn=error_worker_init_fn)
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(iter(loader))
    del loader


def test_an_error_raised_by_the_consumer_stops_the_loader(leak_check: None) -> None:
    # torch's test_large_sampler_indices: many big index batches, the loop raises
    loader = DataLoader(EmptyTensorDataset(200_000), batch_size=4096, num_workers=1,
                        persistent_workers=True)
    with pytest.raises(RuntimeError, match="My Error"):
        for x in loader:
            assert x.numel() == 0
            raise RuntimeError("My Error")
    del loader


def test_timeout_raises_torchs_runtime_error() -> None:
    loader = DataLoader(SleepDataset(10, 3), batch_size=2, num_workers=2, timeout=0.5)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d"):
        next(iter(loader))


# -- argument validation ---------------------------------------------------------------


def test_setting_attributes_after_construction_raises() -> None:
    _, _, dataset = make_tensor_dataset()
    loader = DataLoader(dataset)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset",
                 "persistent_workers"):
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after "
                                             "DataLoader is initialized"):
            setattr(loader, attr, {})


def test_is_a_torch_dataloader() -> None:
    assert isinstance(DataLoader(CountingDataset(3)), tud.DataLoader)


def test_defaults_are_torchs() -> None:
    loader = DataLoader(CountingDataset(3))
    assert loader.batch_size == 1
    # asyncflow's one deliberate default: workers on the usable cores (torch: 0), so torch's
    # prefetch_factor default for workers applies
    assert loader.num_workers == usable_cpus()
    assert DataLoader(CountingDataset(3), num_workers=0).prefetch_factor is None
    assert loader.drop_last is False
    assert loader.prefetch_factor == 2
    assert loader.pin_memory is False
    assert loader.timeout == 0
    assert isinstance(loader.sampler, SequentialSampler)
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.collate_fn is tud.default_collate
    assert isinstance(DataLoader(CountingDataset(3), shuffle=True).sampler, RandomSampler)
    assert DataLoader(CountingDataset(3), num_workers=1).prefetch_factor == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_workers": -1}, "num_workers option should be non-negative"),
        ({"timeout": -1}, "timeout option should be non-negative"),
        ({"batch_size": None, "drop_last": True},
         "batch_size=None option disables auto-batching and is mutually exclusive"),
        ({"num_workers": 0, "prefetch_factor": 2},
         "prefetch_factor option could only be specified in multiprocessing"),
        ({"num_workers": 1, "prefetch_factor": -1},
         "prefetch_factor option should be non-negative"),
        ({"num_workers": 0, "persistent_workers": True},
         "persistent_workers option needs num_workers > 0"),
        ({"num_workers": 0, "multiprocessing_context": "forkserver"},
         r"multi-process loading \(num_workers > 0\), but got"),
        ({"num_workers": 1, "multiprocessing_context": "bad"},
         "should specify a valid start method in"),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs: dict[str, Any], match: str) -> None:
    _, _, dataset = make_tensor_dataset()
    with pytest.raises(ValueError, match=match):
        DataLoader(dataset, **kwargs)


def test_a_context_that_is_not_one_raises_type_error() -> None:
    _, _, dataset = make_tensor_dataset()
    with pytest.raises(TypeError, match="multiprocessing_context option should be a valid "
                                        "context "):
        DataLoader(dataset, num_workers=1, multiprocessing_context=object())


def test_invalid_sampler_combinations_raise_value_error() -> None:
    _, _, dataset = make_tensor_dataset()
    sampler = SequentialSampler(dataset)
    batch_sampler = BatchSampler(sampler, 3, False)
    exclusive_with_shuffle = [
        {"batch_size": 11, "sampler": sampler, "shuffle": True},
        {"batch_sampler": batch_sampler, "sampler": sampler, "shuffle": True},
        {"batch_sampler": batch_sampler, "sampler": sampler, "shuffle": 3},
    ]
    for kwargs in exclusive_with_shuffle:
        with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
            DataLoader(dataset, **kwargs)
    exclusive_with_batch_sampler = [
        {"batch_size": 11, "batch_sampler": batch_sampler},
        {"shuffle": True, "batch_sampler": batch_sampler},
        {"drop_last": True, "batch_sampler": batch_sampler},
        {"drop_last": 3, "batch_sampler": batch_sampler},
    ]
    for kwargs in exclusive_with_batch_sampler:
        with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive with"):
            DataLoader(dataset, **kwargs)


def test_invalid_options_for_an_iterable_dataset_raise_value_error() -> None:
    dataset = CountingIterableDataset(20)
    cases = [
        ({"shuffle": True}, "expected unspecified shuffle"),
        ({"shuffle": 3}, "expected unspecified shuffle"),
        ({"sampler": SequentialSampler(dataset)}, "expected unspecified sampler"),
        ({"sampler": 3}, "expected unspecified sampler"),
        ({"batch_sampler": BatchSampler(SequentialSampler(dataset), 3, False)},
         "expected unspecified batch_sampler"),
        ({"batch_sampler": 3}, "expected unspecified batch_sampler"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=f"DataLoader with IterableDataset: {match}"):
            DataLoader(dataset, **kwargs)


def test_shuffle_false_is_accepted_with_an_iterable_dataset() -> None:
    assert list(DataLoader(CountingIterableDataset(3), shuffle=False, batch_size=None,
                           num_workers=0)) == [0, 1, 2]


@pytest.mark.fresh_process  # fork needs a process with no other thread
@pytest.mark.timeout(120)
def test_the_fork_start_method_works_as_torchs() -> None:
    expected = list(tud.DataLoader(CountingDataset(4), num_workers=2,
                                   multiprocessing_context="fork"))
    for context in ("fork", multiprocessing.get_context("fork")):
        got = list(DataLoader(CountingDataset(4), num_workers=2, workers="processes",
                              multiprocessing_context=context))
        assert [b.tolist() for b in got] == [b.tolist() for b in expected]


def test_excessive_worker_count_warns() -> None:
    _, _, dataset = make_tensor_dataset()
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader "
                                         "running slow or even freeze"):
        DataLoader(dataset, batch_size=2, num_workers=1000)


# -- iterable-style datasets -----------------------------------------------------------


def test_iterable_dataset_without_batching_in_this_process() -> None:
    dataset = CountingIterableDataset(20)
    loader = DataLoader(dataset, batch_size=None, num_workers=0)
    fetched = list(loader)
    assert fetched == list(range(20))
    assert all(isinstance(d, int) for d in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.parametrize("prefetch_factor", [2, 3])
def test_iterable_dataset_without_batching_split_by_worker(prefetch_factor: int) -> None:
    sizes = [4, 20]
    expected = sorted(functools.reduce(operator.iadd, (list(range(s)) for s in sizes), []))
    dataset = WorkerSpecificIterableDataset(sizes)
    loader = DataLoader(dataset, num_workers=2, batch_size=None,
                        prefetch_factor=prefetch_factor)
    fetched = sorted(loader)
    assert fetched == expected
    assert all(isinstance(a, int) for a in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.timeout(60)
def test_iterable_dataset_split_by_worker_processes(leak_check: None) -> None:
    loader = DataLoader(WorkerSpecificIterableDataset([4, 20]), num_workers=2, batch_size=7,
                        workers="processes")
    assert {tuple(t.tolist()) for t in loader} == {
        tuple(range(4)), tuple(range(7)), tuple(range(7, 14)), tuple(range(14, 20))
    }
    del loader


def test_iterable_dataset_with_an_idle_worker() -> None:
    dataset = WorkerSpecificIterableDataset([0, 9])
    assert sorted(DataLoader(dataset, num_workers=2, batch_size=None)) == list(range(9))


def test_iterable_dataset_len_warning_after_len_was_asked() -> None:
    # not split by worker: each of the 2 workers yields all 20 samples
    loader = DataLoader(CountingIterableDataset(20), num_workers=2)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(40):
            next(it)
    assert len(loader) == 20
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            next(it)
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"but [0-9]+ samples have been fetched\. For "
                                             "multiprocessing data-loading, this"):
            next(it)
    del it


def test_iterable_dataset_batched_in_this_process() -> None:
    fetched = list(DataLoader(CountingIterableDataset(20), batch_size=7, num_workers=0))
    assert [t.tolist() for t in fetched] == [
        list(range(7)), list(range(7, 14)), list(range(14, 20))
    ]
    fetched = list(DataLoader(CountingIterableDataset(20), batch_size=7, drop_last=True,
                              num_workers=0))
    assert [t.tolist() for t in fetched] == [list(range(7)), list(range(7, 14))]


@pytest.mark.parametrize("prefetch_factor", [2, 3])
def test_iterable_dataset_batched_per_worker(prefetch_factor: int) -> None:
    # worker 0 gives one partial batch, worker 1 two whole ones and a partial one
    dataset = WorkerSpecificIterableDataset([4, 20])
    fetched = list(DataLoader(dataset, num_workers=2, batch_size=7,
                              prefetch_factor=prefetch_factor))
    assert len(fetched) == 4
    assert {tuple(t.tolist()) for t in fetched} == {
        tuple(range(4)), tuple(range(7)), tuple(range(7, 14)), tuple(range(14, 20))
    }
    fetched = list(DataLoader(dataset, num_workers=2, batch_size=7, drop_last=True,
                              prefetch_factor=prefetch_factor))
    assert {tuple(t.tolist()) for t in fetched} == {tuple(range(7)), tuple(range(7, 14))}
    assert len(fetched) == 2


@pytest.mark.parametrize("num_workers", [0, 1])
def test_chained_iterable_datasets(num_workers: int) -> None:
    expected = list(range(20)) + list(range(15))
    for chained in (CountingIterableDataset(20) + CountingIterableDataset(15),
                    ChainDataset([CountingIterableDataset(20), CountingIterableDataset(15)])):
        fetched = list(DataLoader(chained, num_workers=num_workers))
        assert len(fetched) == len(expected)
        for e, d in zip(expected, fetched, strict=True):
            assert isinstance(d, torch.Tensor)
            assert d.tolist() == [e]


def test_multi_epochs_round_robin_over_workers() -> None:
    # torch takes batch i from worker i % num_workers, epoch after epoch
    num_workers, batch_size = 2, 10
    loader = DataLoader(MultiEpochDataset(batch_size * num_workers), batch_size=batch_size,
                        shuffle=False, num_workers=num_workers)
    for _ in range(3):
        batches = [sample.tolist() for sample in loader]
        assert batches == [[i % num_workers] * batch_size for i in range(len(batches))]
        assert len(batches) == num_workers


def test_iterable_dataset_multiple_epochs_in_this_process() -> None:
    loader = DataLoader(CountingIterableDataset(5), batch_size=2, num_workers=0)
    for _ in range(2):
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


# -- workers: worker_init_fn, get_worker_info, seeds -----------------------------------


def test_worker_init_fn_seeds_each_worker() -> None:
    loader = DataLoader(SeedDataset(4), batch_size=2, num_workers=2, worker_init_fn=init_fn)
    for batch in loader:
        assert batch.tolist() == [12345, 12345]


def test_get_worker_info_is_none_in_this_process() -> None:
    assert tud.get_worker_info() is None
    list(DataLoader(CountingDataset(4), num_workers=2))
    assert tud.get_worker_info() is None


class WorkerInfoReport(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = tud.get_worker_info()
        assert info is not None
        assert isinstance(info.dataset, WorkerInfoReport)
        return info.id, info.num_workers


def test_get_worker_info_inside_workers() -> None:
    assert tud.get_worker_info() is None
    batches = list(DataLoader(WorkerInfoReport(), batch_size=None, num_workers=2))
    assert {ids for ids, _ in batches} <= {0, 1}
    assert {n for _, n in batches} == {2}
    assert tud.get_worker_info() is None


@pytest.mark.timeout(60)
def test_get_worker_info_in_worker_processes(leak_check: None) -> None:
    dataset = WorkerInfoDataset(6)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, workers="processes",
                        worker_init_fn=worker_info_init_fn)
    data = torch.cat(list(loader), 0)
    pids_by_worker: dict[int, set[int]] = {}
    for worker_id, pid in data.tolist():
        pids_by_worker.setdefault(worker_id, set()).add(pid)
    assert set(pids_by_worker) <= {0, 1}
    assert all(len(pids) == 1 for pids in pids_by_worker.values())
    assert os.getpid() not in set().union(*pids_by_worker.values())
    assert tud.get_worker_info() is None
    assert not hasattr(dataset, "value")
    with pytest.raises(AttributeError):
        dataset[0]
    del loader


@pytest.mark.timeout(60)
def test_worker_seeds_differ_and_follow_the_generator(leak_check: None) -> None:
    def seeds() -> set[tuple[int, int, int]]:
        loader = DataLoader(WorkerSeedDataset(8), batch_size=1, num_workers=2,
                            workers="processes", generator=torch.Generator().manual_seed(42))
        return {tuple(int(x) for x in batch) for batch in loader}

    first = seeds()
    # torch's worker_info.seed is the worker's; asyncflow then seeds torch's generator per
    # sample (docs/migrating.md, "Worker seeds"), so initial_seed() is the sample's, and
    # reproducible: compared below with a second run
    by_worker = {(w, s) for w, s, _ in first}
    assert len(by_worker) == len({w for w, _ in by_worker})  # one seed per worker
    assert len({s for _, s in by_worker}) == len(by_worker)  # different per worker
    assert seeds() == first


@pytest.mark.timeout(60)
def test_each_worker_gets_its_batches_in_turn(leak_check: None) -> None:
    # torch's TestIndividualWorkerQueue: batch i comes from worker i % num_workers
    dataset = WorkerQueueDataset(list(range(32)))
    batch_size, num_workers = 4, 2
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        timeout=30, worker_init_fn=dataset.worker_init_fn, workers="processes")
    for i, (worker_ids, sample) in enumerate(loader):
        assert worker_ids.tolist() == [i % num_workers] * batch_size
        assert sample.tolist() == list(range(i * batch_size, (i + 1) * batch_size))
    del loader


@pytest.mark.timeout(60)
def test_persistent_workers_keep_their_copy_of_the_dataset(leak_check: None) -> None:
    dataset = StartCheckingDataset()
    loader = DataLoader(dataset, num_workers=2, persistent_workers=True, workers="processes")
    for epoch in range(3):
        assert sorted(int(x) for x in loader) == list(range(10))
        dataset.start = epoch + 1  # not seen by the workers started in epoch 0
    del loader


@pytest.mark.timeout(60)
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_multiprocessing_contexts(context: str, leak_check: None) -> None:
    reference = [torch.arange(3), torch.arange(3, 6), torch.arange(6, 9), torch.arange(9, 11)]
    for ctx in (context, multiprocessing.get_context(context)):
        loader = DataLoader(CountingDataset(11), num_workers=2, batch_size=3,
                            multiprocessing_context=ctx, workers="processes")
        assert_same(list(loader), reference)
        del loader


def test_conv_in_a_worker() -> None:
    for x in DataLoader(ConvDataset(), num_workers=1):
        assert x.shape == (1, 1, 1, 239)


# -- pin_memory, pin_memory_device, in_order -------------------------------------------


@ignore_pin_warning
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_without_cuda_does_not_fail(num_workers: int) -> None:
    data, labels, dataset = make_tensor_dataset()
    loader = DataLoader(dataset, batch_size=2, pin_memory=True, num_workers=num_workers)
    check_sequential(loader, data, labels)


@ignore_pin_warning
@ignore_pin_device_warning
def test_pin_memory_device_is_accepted() -> None:
    loader = DataLoader(DictDataset(), batch_size=2, pin_memory=True, pin_memory_device="cuda")
    assert loader.pin_memory_device == "cuda"
    assert [s["another_dict"]["a_number"].tolist() for s in loader] == [[0, 1], [2, 3]]
    loader = DataLoader(DictDataset(), batch_size=2, pin_memory_device="cuda")
    for sample in loader:
        assert not sample["a_tensor"].is_pinned()


@needs_cuda
@pytest.mark.gpu
def test_pin_memory_on_cuda() -> None:
    for num_workers in (0, 2):
        loader = DataLoader(DictDataset(), batch_size=2, pin_memory=True,
                            num_workers=num_workers)
        for sample in loader:
            assert sample["a_tensor"].is_pinned()
            assert sample["another_dict"]["a_number"].is_pinned()
    for sample in DataLoader(DictDataset(), batch_size=2, pin_memory_device="cuda"):
        assert not sample["a_tensor"].is_pinned()


@needs_cuda
@pytest.mark.gpu
def test_custom_batch_pin_on_cuda() -> None:
    inputs = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    loader = DataLoader(TensorDataset(inputs, inputs), batch_size=2,
                        collate_fn=collate_wrapper, pin_memory=True)
    for sample in loader:
        assert isinstance(sample, SimpleCustomBatch)
        assert sample.is_pinned()


def test_in_order_true_keeps_sampler_order_behind_a_slow_sample() -> None:
    dataset = BlockingDataset(10, block=0, limit=0.3)
    loader = DataLoader(dataset, num_workers=2, in_order=True, batch_size=None)
    assert loader.in_order is True
    assert list(loader) == list(range(10))


def test_in_order_false_yields_what_is_ready() -> None:
    # sample 0 waits until the test has received another sample: in_order=False yields
    # the others first
    dataset = BlockingDataset(10, block=0, limit=10)
    loader = DataLoader(dataset, num_workers=2, in_order=False, batch_size=None,
                        workers="threads")
    it = iter(loader)
    first = next(it)
    dataset.released.set()
    output = [first, *it]
    assert first != 0
    assert sorted(output) == list(range(10))


@pytest.mark.parametrize("in_order", [True, False])
def test_in_order_without_workers_is_sequential(in_order: bool) -> None:
    loader = DataLoader(CountingDataset(7), batch_size=2, in_order=in_order, num_workers=0)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6]]
