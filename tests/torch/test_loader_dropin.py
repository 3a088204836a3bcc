"""asyncflow.DataLoader as a drop-in for torch's: a subclass, torch's errors and arguments,
samplers and generators, lazy start, pinning through a batch's own method, dataset state."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import asyncflow
from asyncflow import ConfigTypeError, DataLoader, Pipeline, PipelineError
from asyncflow.torch._shuffle import ShuffleSampler


class Flaky(tud.Dataset[int]):
    """Index 1 is missing; the rest are themselves."""

    def __init__(self, n: int = 6) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == 1:
            raise KeyError(f"sample {i} is missing")
        return i


class Growing:
    """A dataset whose length the test changes between epochs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


class Huge:
    """A billion items: any loader that lists its indices up front never gets going."""

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> int:
        return i


class Counting:
    """A dataset with a state of its own: how many items it has served."""

    def __init__(self, n: int = 12) -> None:
        self.n = n
        self.served = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        self.served += 1
        return i, self.served

    def state_dict(self) -> dict[str, int]:
        return {"served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.served = state["served"]


class Pinnable:
    """A batch type with its own pin_memory(), as torch's loader honours."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.pinned = False

    def pin_memory(self) -> Pinnable:
        pinned = Pinnable(self.items)
        pinned.pinned = True
        return pinned


# -- a subclass of torch's loader, generic ------------------------------------------------


def test_it_is_a_torch_dataloader_and_generic() -> None:
    loader: DataLoader[int] = DataLoader(list(range(5)), batch_size=2, num_workers=0)
    assert isinstance(loader, tud.DataLoader)
    assert DataLoader[int] is not None  # subscriptable in annotations and at run time
    assert isinstance(loader.batch_sampler, tud.BatchSampler)
    assert isinstance(loader.sampler, tud.SequentialSampler)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


def test_a_shuffling_loader_shows_torchs_random_sampler() -> None:
    loader = DataLoader(list(range(8)), batch_size=4, shuffle=True, seed=3)
    assert isinstance(loader.sampler, tud.RandomSampler)  # what Lightning looks for
    assert loader.batch_sampler.sampler is loader.sampler


# -- 1. errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", ["threads", 0])
def test_a_failing_getitem_raises_its_own_type_and_iteration_goes_on(workers: Any) -> None:
    kwargs = {"num_workers": 0} if workers == 0 else {"num_workers": 2, "workers": workers}
    it = iter(DataLoader(Flaky(), batch_size=None, **kwargs))
    got: list[Any] = []
    for _ in range(6):
        try:
            got.append(next(it))
        except KeyError as exc:
            got.append(KeyError)
            assert "batch 1 (index 1) failed in stage 'fetch'" in exc.__notes__[-1]
    assert got == [0, KeyError, 2, 3, 4, 5]
    with pytest.raises(StopIteration):
        next(it)


def test_a_failing_collate_raises_its_own_type() -> None:
    def collate(batch: list[int]) -> list[int]:
        if 2 in batch:
            raise ValueError("cannot collate 2")
        return batch

    it = iter(DataLoader(list(range(4)), batch_size=2, collate_fn=collate, num_workers=0))
    assert next(it) == [0, 1]
    with pytest.raises(ValueError, match="cannot collate 2"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_async_iteration_raises_the_same_way() -> None:
    async def main() -> list[Any]:
        got: list[Any] = []
        it = DataLoader(Flaky(4), batch_size=None, num_workers=0).__aiter__()
        for _ in range(4):
            try:
                got.append(await it.__anext__())
            except KeyError:
                got.append(KeyError)
        return got

    assert asyncio.run(main()) == [0, KeyError, 2, 3]


def test_a_pipeline_still_raises_pipeline_error() -> None:
    def fail(i: int) -> int:
        raise KeyError(i)

    with pytest.raises(PipelineError):
        list(Pipeline([1]).map(fail))


def test_timeout_raises_torchs_runtime_error() -> None:
    class Slow(Growing):
        def __getitem__(self, i: int) -> int:
            import time

            time.sleep(0.5 if i == 1 else 0)
            return i

    loader = DataLoader(Slow(3), batch_size=None, num_workers=1, timeout=0.1)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0\.1 seconds") as info:
        list(loader)
    assert isinstance(info.value, asyncflow.LoaderTimeout)


# -- 5. samplers, generators, lengths ---------------------------------------------------------


def test_generator_beside_a_sampler_is_used_as_torch_uses_it() -> None:
    sampler = tud.SequentialSampler(range(6))
    ours = DataLoader(list(range(6)), batch_size=2, sampler=sampler,
                      generator=torch.Generator().manual_seed(1), num_workers=0)
    theirs = tud.DataLoader(list(range(6)), batch_size=2, sampler=sampler,
                            generator=torch.Generator().manual_seed(1))
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
    # and each epoch draws the worker base seed from it, as torch's does
    assert torch.equal(ours.generator.get_state(), theirs.generator.get_state())  # type: ignore[union-attr]


def test_a_seeded_generator_shuffles_as_torch_epoch_after_epoch() -> None:
    ours = DataLoader(list(range(10)), batch_size=3, shuffle=True,
                      generator=torch.Generator().manual_seed(7), num_workers=0)
    theirs = tud.DataLoader(list(range(10)), batch_size=3, shuffle=True,
                            generator=torch.Generator().manual_seed(7))
    for _ in range(3):
        assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


def test_asyncflow_random_sampler_reshuffles_each_epoch_without_set_epoch() -> None:
    loader = DataLoader(list(range(20)), batch_size=None, num_workers=0,
                        sampler=asyncflow.RandomSampler(20, seed=4))
    first, second = list(loader), list(loader)
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_the_length_is_read_at_each_epoch() -> None:
    data = Growing(4)
    for shuffle in (False, True):
        loader = DataLoader(data, batch_size=2, shuffle=shuffle, num_workers=0)
        data.n = 4
        assert len(loader) == 2 and sorted(torch.cat(list(loader)).tolist()) == [0, 1, 2, 3]
        data.n = 6
        assert len(loader) == 3
        assert sorted(torch.cat(list(loader)).tolist()) == list(range(6))


# -- 6. start-up does not grow with the dataset ----------------------------------------------


def test_the_first_batch_of_a_billion_items_comes_without_listing_them() -> None:
    with iter(DataLoader(Huge(), batch_size=64, num_workers=1)) as it:
        assert next(it).tolist() == list(range(64))


def test_a_shuffle_keeps_its_permutation_as_one_tensor() -> None:
    sampler = ShuffleSampler(range(2_000_000), seed=1)
    tracemalloc.start()
    try:
        first = next(iter(sampler))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 <= first < 2_000_000
    # a list of every index would take 70+ MB of Python objects; chunks take a few hundred KB
    assert peak < 8 * 2**20


def test_a_shuffled_order_is_the_same_as_torchs_for_the_same_generator() -> None:
    theirs = list(tud.RandomSampler(range(1000), generator=torch.Generator().manual_seed(5)))
    ours = list(ShuffleSampler(range(1000), generator=torch.Generator().manual_seed(5)))
    assert ours == theirs


# -- 7. pinning through the batch's own method ----------------------------------------------


def test_a_batch_with_its_own_pin_memory_is_pinned_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loader = DataLoader(list(range(4)), batch_size=2, collate_fn=Pinnable, pin_memory=True,
                        num_workers=1, workers="threads")
    batches = list(loader)
    assert [b.items for b in batches] == [[0, 1], [2, 3]]
    assert all(b.pinned for b in batches)


# -- 8. arguments --------------------------------------------------------------------------


def test_attributes_are_guarded_as_in_torch() -> None:
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=0)
    with pytest.raises(ValueError, match="batch_size attribute should not be set after"):
        loader.batch_size = {}  # type: ignore[assignment]


def test_an_unknown_argument_says_what_to_use_instead() -> None:
    with pytest.raises(ConfigTypeError, match=r"snapshot_every_n_steps.*exact at every batch"):
        DataLoader(list(range(4)), snapshot_every_n_steps=10)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bogus'.*device="):
        DataLoader(list(range(4)), bogus=1)


def test_pin_memory_device_and_in_order_are_accepted() -> None:
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, pin_memory_device="cpu",
                        in_order=False)
    assert loader.pin_memory_device == "cpu" and loader.in_order is False
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_seed_must_be_an_int() -> None:
    with pytest.raises(ConfigTypeError, match="seed must be an int"):
        DataLoader(list(range(4)), shuffle=True, seed="1")  # type: ignore[arg-type]


# -- 9. a dataset's own state resumes with the loader's -------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_datasets_state_is_saved_and_restored_with_the_loader(num_workers: int) -> None:
    data = Counting()
    loader = DataLoader(data, batch_size=2, num_workers=num_workers, workers="threads")
    it = iter(loader)
    head = [next(it), next(it)]
    assert [i.tolist() for i, _ in head] == [[0, 1], [2, 3]]
    state = loader.state_dict()
    it.close()
    # the dataset's state as of the last batch delivered, not of what was prefetched
    assert state["dataset"]["main"] == {"served": 4}

    fresh = Counting()
    resumed = DataLoader(fresh, batch_size=2, num_workers=num_workers, workers="threads")
    resumed.load_state_dict(state)
    rest = list(resumed)  # loaded at the epoch's start, after the order is drawn
    assert [i.tolist() for i, _ in rest] == [[4, 5], [6, 7], [8, 9], [10, 11]]
    assert [s.tolist() for _, s in rest] == [[5, 6], [7, 8], [9, 10], [11, 12]]


@pytest.mark.timeout(60)
def test_each_worker_process_resumes_its_own_dataset_state(leak_check: None) -> None:
    loader = DataLoader(Counting(), batch_size=2, num_workers=2, workers="processes")
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    it.close()
    workers = state["dataset"]["workers"]
    assert sum(s["served"] for s in workers.values()) == 6
    assert set(workers) <= {0, 1}

    resumed = DataLoader(Counting(), batch_size=2, num_workers=2, workers="processes")
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [i.tolist() for i, _ in head + rest] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9],
                                                     [10, 11]]
    # each worker counts on from its own saved state: 12 items served in all
    final = resumed.state_dict()["dataset"]["workers"]
    assert sum(s["served"] for s in final.values()) == 12
    del loader, resumed


# -- torch's worker semantics, and in_order ------------------------------------------------


def _note_init(worker_id: int) -> None:
    return None


class AsksWhichWorker(tud.Dataset[int]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        info = tud.get_worker_info()
        return -1 if info is None else info.id


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ["worker_init_fn", "get_worker_info"])
def test_torch_worker_semantics_choose_processes(case: str, leak_check: None) -> None:
    if case == "worker_init_fn":
        loader = DataLoader(list(range(4)), batch_size=2, num_workers=2, worker_init_fn=_note_init)
    else:
        loader = DataLoader(AsksWhichWorker(), batch_size=None, num_workers=2)
    got = list(loader)
    note = " ".join(loader.stats().notes)
    assert "processes (workers='auto')" in note and "usable cores" not in note
    if case == "get_worker_info":
        assert set(got) <= {0, 1}  # answered in worker processes, as torch's
    # and where no such need is, two cores keep threads
    plain = DataLoader(list(range(4)), batch_size=2, num_workers=2)
    list(plain)
    assert "threads" in " ".join(plain.stats().notes)
    del loader, plain


class Gated(tud.Dataset[int]):
    """Sample 0 waits until the test lets it go."""

    def __init__(self) -> None:
        import threading

        self.go = threading.Event()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 0:
            assert self.go.wait(10)
        return i


def test_in_order_false_yields_ready_batches_and_resumes_exactly() -> None:
    data = Gated()
    loader = DataLoader(data, batch_size=None, num_workers=2, workers="threads", in_order=False)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    assert 0 not in head  # the others came first
    state = loader.state_dict()
    assert state["batches"] == 0 and state["delivered_ahead"] == sorted(head)
    data.go.set()
    it.close()

    resumed = DataLoader(Gated(), batch_size=None, num_workers=2, workers="threads",
                         in_order=False)
    resumed.dataset.go.set()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert sorted(head + rest) == list(range(8))  # nothing lost, nothing twice


def test_a_loader_pickles_and_deep_copies_as_torchs_does() -> None:
    import copy
    import pickle

    loader = DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=4, num_workers=1)
    list(loader)  # running parts exist now; copies leave them behind
    for other in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert isinstance(other, DataLoader)
        assert other.state_dict() == loader.state_dict()
        assert [b.tolist() for b in other] == [b.tolist() for b in copy.deepcopy(loader)]


def test_resume_with_a_torch_sampler_that_has_its_own_generator() -> None:
    def make() -> DataLoader[Any]:
        data = list(range(12))
        return DataLoader(data, batch_size=3, num_workers=0, sampler=tud.RandomSampler(
            data, generator=torch.Generator().manual_seed(11)))

    reference = make()
    epochs = [[b.tolist() for b in reference] for _ in range(2)]
    loader = make()
    list(loader)
    it = iter(loader)  # epoch 1: its generator has moved on since epoch 0
    head = [next(it).tolist()]
    state = loader.state_dict()
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == epochs[1]


def test_every_loader_state_is_plain_json() -> None:
    import json

    data = list(range(12))
    loaders = [
        DataLoader(data, batch_size=3, num_workers=0, shuffle=True,
                   generator=torch.Generator().manual_seed(1)),
        DataLoader(data, batch_size=3, num_workers=0,
                   sampler=tud.RandomSampler(data, generator=torch.Generator().manual_seed(2))),
        DataLoader(data, batch_size=3, num_workers=0, shuffle=True, seed=3),
        DataLoader(Counting(), batch_size=3, num_workers=0),
    ]
    for loader in loaders:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        it.close()
        assert json.loads(json.dumps(state)) == state
