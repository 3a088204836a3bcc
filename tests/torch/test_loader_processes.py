"""The DataLoader on worker processes: the batches of threads, torch's worker interface
(``get_worker_info``, ``worker_init_fn``, persistent workers, start methods), reproducible
random augmentation, the ``workers="auto"`` choice, failures, and clean stops."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from asyncflow import ConfigError, DataLoader, StallError, WorkerError
from asyncflow.pipeline import usable_cpus
from tests.conftest import _children, _segments

ROOT = Path(__file__).resolve().parents[2]
needs_two_cores = pytest.mark.skipif(usable_cpus() < 2, reason="needs 2 usable cores")


@pytest.fixture
def big_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this machine count as one where a loader's processes beat its threads (4 cores
    and up): the tests below are about the other reasons to choose threads."""
    import asyncflow.torch._layout as layout

    monkeypatch.setattr(layout, "PROCESS_CORES", 2)


# -- datasets (module level: a worker imports them by reference) ------------------------


class Pairs:
    """``(tensor, int)`` samples. ``in_worker`` says where ``__getitem__`` must run: a sample
    fetched in the wrong place fails the batch, so equal batches also prove where they came
    from."""

    def __init__(self, n: int, in_worker: bool | None = None) -> None:
        self.n, self.in_worker = n, in_worker

    def __len__(self) -> int:
        return self.n

    def _check_place(self) -> None:
        if self.in_worker is not None and (tud.get_worker_info() is not None) != self.in_worker:
            raise AssertionError(f"fetched {'outside' if self.in_worker else 'inside'} a worker")

    def __getitem__(self, i: int) -> Any:
        self._check_place()
        return torch.arange(3, dtype=torch.float32) + i, i * 7


class Dicts(Pairs):
    def __getitem__(self, i: int) -> Any:
        self._check_place()
        return {"x": torch.full((2, 2), float(i)), "id": i, "name": f"n{i}"}


class Fetched(Pairs):
    """Has ``__getitems__``, which answers differently from ``__getitem__``."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self._check_place()
        return [(torch.tensor([float(-i)]), -i) for i in indices]


class Introspect(Pairs):
    """Reports what torch's ``get_worker_info()`` says in ``__getitem__``."""

    def __getitem__(self, i: int) -> Any:
        info = tud.get_worker_info()
        if info is None:
            return {"i": i, "info": None, "pid": os.getpid()}
        return {
            "i": i, "pid": os.getpid(),
            "info": (info.id, info.num_workers, info.seed, info.dataset is self),
        }


_INIT_CALLS: list[int] = []  # in a worker: the worker_init_fn calls it has seen


def record_init(worker_id: int) -> None:
    _INIT_CALLS.append(worker_id)


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"worker_init_fn failed in worker {worker_id}")


class InitReport(Pairs):
    """Reports its worker's id and the ``worker_init_fn`` calls made in that process."""

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.01)  # long enough that every worker gets items
        info = tud.get_worker_info()
        return (-1 if info is None else info.id), tuple(_INIT_CALLS), os.getpid()


class Pids(Pairs):
    def __getitem__(self, i: int) -> Any:
        time.sleep(0.01)
        return os.getpid(), os.getppid(), i


class Noisy(Pairs):
    """A random augmentation from each of torch's, Python's and NumPy's global generators."""

    def __getitem__(self, i: int) -> Any:
        return torch.cat([
            torch.rand(1), torch.tensor([random.random()]),
            torch.from_numpy(np.random.rand(1)).float(),
        ])


class Locked(Pairs):
    """Cannot be pickled: it holds a lock."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()


class Flaky(Pairs):
    def __getitem__(self, i: int) -> Any:
        if i == 5:
            raise KeyError(f"sample {i} is missing")
        return super().__getitem__(i)


class Dies(Pairs):
    """Its worker process exits while fetching sample 5 (as a segfault or the OOM killer)."""

    def __getitem__(self, i: int) -> Any:
        if i == 5 and tud.get_worker_info() is not None:
            os._exit(3)
        return super().__getitem__(i)


class Hangs(Pairs):
    def __getitem__(self, i: int) -> Any:
        if i == 4:
            time.sleep(60)
        return super().__getitem__(i)


class Slow(Pairs):
    def __getitem__(self, i: int) -> Any:
        time.sleep(0.005)
        return torch.zeros(64, 64) + i  # 16 KiB: comes back through shared memory


# -- helpers -------------------------------------------------------------------------------


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


def _settles(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _epochs(loader: DataLoader, n: int = 2) -> list[list[Any]]:
    return [list(loader) for _ in range(n)]


# -- 1. processes give the batches of threads -------------------------------------------

CASES: dict[str, Callable[[bool], tuple[Any, dict[str, Any]]]] = {
    "pairs": lambda w: (Pairs(23, w), {"batch_size": 4}),
    "pairs shuffled": lambda w: (Pairs(23, w), {"batch_size": 4, "shuffle": True, "seed": 3}),
    "dicts shuffled drop_last": lambda w: (
        Dicts(17, w), {"batch_size": 5, "shuffle": True, "seed": 1, "drop_last": True}
    ),
    "no batching": lambda w: (Dicts(7, w), {"batch_size": None}),
    "no batching shuffled": lambda w: (
        Pairs(9, w), {"batch_size": None, "shuffle": True, "seed": 2}
    ),
    "torch generator": lambda w: (
        Pairs(20, w),
        {"batch_size": 3, "shuffle": True, "generator": torch.Generator().manual_seed(7)},
    ),
    "lambda collate_fn": lambda w: (
        Pairs(10, w),
        {"batch_size": 3, "collate_fn": lambda b: (torch.stack([x * 2 for x, _ in b]),
                                                   [y + 1 for _, y in b])},
    ),
    "__getitems__": lambda w: (Fetched(10, w), {"batch_size": 4, "shuffle": True, "seed": 4}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_processes_give_the_batches_of_threads(name: str, leak_check: None) -> None:
    dataset, kwargs = CASES[name](False)
    threads = _epochs(DataLoader(dataset, num_workers=2, workers="threads", **kwargs))
    dataset, kwargs = CASES[name](True)
    processes = _epochs(DataLoader(dataset, num_workers=2, workers="processes", **kwargs))
    assert [len(e) for e in processes] == [len(e) for e in threads]
    assert len(threads[0]) > 1
    for epoch_t, epoch_p in zip(threads, processes, strict=True):
        for t, p in zip(epoch_t, epoch_p, strict=True):
            assert same(t, p), (t, p)
    if kwargs.get("shuffle"):  # and both reshuffled alike for the second epoch
        assert not all(same(a, b) for a, b in zip(*processes, strict=True))


# -- 2. torch.utils.data.get_worker_info() ----------------------------------------------


def test_get_worker_info_in_a_worker_process(leak_check: None) -> None:
    loader = DataLoader(Introspect(24), batch_size=None, num_workers=3, workers="processes")
    items = list(loader)
    assert [s["i"] for s in items] == list(range(24))
    assert all(s["pid"] != os.getpid() for s in items)
    assert all(s["info"] is not None for s in items)
    infos = {tuple(s["info"]) for s in items}
    assert {i for i, *_ in infos} <= {0, 1, 2}
    assert {n for _, n, *_ in infos} == {3}
    assert all(is_self for *_, is_self in infos)  # the worker's own copy of the dataset
    seeds = {i: {seed for j, _, seed, _ in infos if j == i} for i, *_ in infos}
    assert all(len(s) == 1 for s in seeds.values())  # one seed per worker...
    assert len({s.pop() for s in seeds.values()}) == len(seeds)  # ...each its own
    assert tud.get_worker_info() is None  # not set in this process


@pytest.mark.parametrize("kwargs", [{"workers": "threads"}, {"num_workers": 0}])
def test_get_worker_info_is_none_outside_worker_processes(kwargs: dict[str, Any]) -> None:
    items = list(DataLoader(Introspect(6), batch_size=None, **kwargs))
    assert [s["info"] for s in items] == [None] * 6
    assert {s["pid"] for s in items} == {os.getpid()}


# -- 3. worker_init_fn ---------------------------------------------------------------------


def test_worker_init_fn_runs_once_in_each_worker(leak_check: None) -> None:
    loader = DataLoader(InitReport(40), batch_size=2, num_workers=3, workers="processes",
                        worker_init_fn=record_init, collate_fn=list)
    seen = {pid: (wid, calls) for batch in loader for wid, calls, pid in batch}
    assert sorted(wid for wid, _ in seen.values()) == [0, 1, 2]
    assert all(calls == (wid,) for wid, calls in seen.values())  # once, with its own id
    assert _INIT_CALLS == []  # never in this process


def test_an_exception_in_worker_init_fn_raises_its_own_type(leak_check: None) -> None:
    loader = DataLoader(Pairs(8), batch_size=2, num_workers=2, workers="processes",
                        worker_init_fn=failing_init)
    it = iter(loader)
    # as torch: the first batch each failed worker fetches raises the init's exception
    with pytest.raises(RuntimeError, match="worker_init_fn failed in worker") as info:
        next(it)
    assert any("in worker_init_fn of DataLoader worker process" in n for n in info.value.__notes__)
    assert "failed in stage 'fetch'" in info.value.__notes__[-1]
    it.close()
    del it, loader


# -- 4. persistent workers -------------------------------------------------------------------


def test_persistent_workers_serve_every_epoch(leak_check: None) -> None:
    loader = DataLoader(Pids(24), batch_size=2, num_workers=2, workers="processes",
                        persistent_workers=True)
    first, second = ({p for b in epoch for p in b[0].tolist()} for epoch in _epochs(loader))
    assert len(first) == 2 and os.getpid() not in first
    assert second == first
    del loader
    gc.collect()


def test_workers_that_do_not_persist_are_new_each_epoch(leak_check: None) -> None:
    loader = DataLoader(Pids(24), batch_size=2, num_workers=2, workers="processes")
    first, second = ({p for b in epoch for p in b[0].tolist()} for epoch in _epochs(loader))
    assert len(first) == len(second) == 2
    assert first.isdisjoint(second)


def test_persistent_workers_need_worker_processes() -> None:
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        DataLoader(Pairs(4), num_workers=0, persistent_workers=True)  # torch's own check


# -- 5. multiprocessing_context ------------------------------------------------------------


class LockedPairs(Pairs):
    """A Dataset that cannot be pickled (it holds a lock), as torch's fork workers allow."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()

    def __getitem__(self, i: int) -> Any:
        with self.lock:
            return torch.full((3,), i), os.getpid()


@pytest.mark.fresh_process  # fork needs a process with no other thread
@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", multiprocessing.get_context("fork")],
                         ids=["fork", "fork context"])
def test_fork_workers_deliver_torchs_batches(context: Any, leak_check: None) -> None:
    loader = DataLoader(Pairs(40), batch_size=4, num_workers=2, workers="processes",
                        multiprocessing_context=context, persistent_workers=True)
    reference = list(tud.DataLoader(Pairs(40), batch_size=4))  # torch's workers leave threads
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(reference) == 10
        for ours, theirs in zip(batches, reference, strict=True):
            assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    del loader
    gc.collect()


@pytest.mark.fresh_process  # fork needs a process with no other thread
@pytest.mark.timeout(120)
def test_fork_takes_a_dataset_that_cannot_be_pickled(leak_check: None) -> None:
    loader = DataLoader(LockedPairs(16), batch_size=4, num_workers=2, workers="processes",
                        multiprocessing_context="fork")
    batches = list(loader)
    assert torch.equal(torch.cat([b[0] for b in batches])[:, 0], torch.arange(16))
    assert os.getpid() not in {int(p) for b in batches for p in b[1]}
    with pytest.raises(ConfigError, match="cannot be sent to worker processes"):
        DataLoader(LockedPairs(16), num_workers=2, workers="processes",
                   multiprocessing_context="forkserver")


class Counting(tud.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


def test_fork_is_refused_for_an_iterable_dataset_whose_workers_start_inside_a_run() -> None:
    with pytest.raises(ConfigError, match=r"IterableDataset.*forkserver"):
        DataLoader(Counting(), num_workers=2, workers="processes",
                   multiprocessing_context="fork")
    # on threads no process forks: accepted
    batches = DataLoader(Counting(), num_workers=2, workers="threads",
                         multiprocessing_context="fork")
    assert {int(b) for b in batches} == {0, 1, 2, 3}


def test_an_unknown_start_method_gets_torchs_error() -> None:
    with pytest.raises(ValueError, match="should specify a valid start method"):
        DataLoader(Pairs(4), num_workers=2, multiprocessing_context="bogus")


@pytest.mark.fresh_process  # fork needs a process with no other thread
@pytest.mark.timeout(120)
def test_fork_while_another_python_thread_runs_is_refused_naming_it(leak_check: None) -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="metrics-writer")
    other.start()
    try:
        loader = DataLoader(Pairs(8), batch_size=4, num_workers=2, workers="processes",
                            multiprocessing_context="fork")
        with pytest.raises(ConfigError, match=r"metrics-writer.*forkserver"):
            list(loader)
    finally:
        stop.set()
        other.join()
    assert len(list(loader)) == 2  # no other thread now: it forks


@pytest.mark.parametrize("context", ["spawn", multiprocessing.get_context("spawn")],
                         ids=["name", "context"])
def test_spawn_starts_workers_from_this_process(context: Any, leak_check: None) -> None:
    loader = DataLoader(Pids(4), batch_size=None, num_workers=1, workers="processes",
                        multiprocessing_context=context)
    samples = list(loader)
    assert [i for *_, i in samples] == [0, 1, 2, 3]
    assert {pid for pid, *_ in samples} != {os.getpid()}
    # spawned by this process itself, not forked from the forkserver
    assert {ppid for _, ppid, _ in samples} == {os.getpid()}


def test_forkserver_starts_workers_from_the_server(leak_check: None) -> None:
    # (the default, fork where safe: tests/torch/test_loader_fork_default.py)
    samples = list(DataLoader(Pids(4), batch_size=None, num_workers=1, workers="processes",
                              multiprocessing_context="forkserver"))
    parents = {ppid for _, ppid, _ in samples}
    assert len(parents) == 1 and os.getpid() not in parents
    with open(f"/proc/{parents.pop()}/cmdline", "rb") as fh:
        assert b"forkserver" in fh.read()


class TorchThreads(Pairs):
    """Reports the torch threads its worker computes with."""

    def __getitem__(self, i: int) -> Any:
        return torch.get_num_threads(), os.getpid()


@needs_two_cores
@pytest.mark.parametrize("context", [None, "forkserver", "spawn"])
def test_each_worker_computes_with_one_torch_thread(context: Any, leak_check: None) -> None:
    # As torch's DataLoader: the workers are the parallelism. N workers x N torch threads
    # oversubscribed a 16-core machine to a tenth of torch's rate (docs/performance.md); the
    # forkserver had imported asyncflow.torch before any worker existed to set it up.
    kwargs = {} if context is None else {"multiprocessing_context": context}
    loader = DataLoader(TorchThreads(6), batch_size=None, num_workers=2, workers="processes",
                        **kwargs)
    samples = list(loader)
    assert {pid for _, pid in samples} != {os.getpid()}
    assert {threads for threads, _ in samples} == {1}


# -- 6. reproducible random augmentation ----------------------------------------------------


def _noise(num_workers: int, seed: int, persistent: bool = False) -> list[list[torch.Tensor]]:
    torch.manual_seed(seed)
    loader = DataLoader(Noisy(12), batch_size=3, num_workers=num_workers, workers="processes",
                        persistent_workers=persistent)
    return _epochs(loader)


def test_random_augmentation_is_reproducible_whatever_the_workers(leak_check: None) -> None:
    one, two = _noise(1, seed=0), _noise(2, seed=0)
    kept = _noise(2, seed=0, persistent=True)  # the epoch reaches workers that persist
    for epoch_1, epoch_2, epoch_kept in zip(one, two, kept, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(epoch_1, epoch_2, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(epoch_1, epoch_kept, strict=True))
    first = torch.cat(one[0])
    assert len({tuple(row.tolist()) for row in first}) == 12  # every sample its own draw
    assert len(set(first[0].tolist())) == 3  # and each generator its own
    assert not torch.equal(first, torch.cat(one[1]))  # a new epoch, new draws
    assert not torch.equal(first, torch.cat(_noise(2, seed=1)[0]))  # another seed, others


def test_a_resumed_epoch_gets_the_augmentations_of_an_uninterrupted_one(
    leak_check: None,
) -> None:
    def make() -> DataLoader:
        torch.manual_seed(0)
        return DataLoader(Noisy(12), batch_size=3, num_workers=2, workers="processes")

    expected = make()
    epoch = list(expected)
    crashed = make()
    it = iter(crashed)
    head = [next(it), next(it)]
    state = crashed.state_dict()
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    got = head + list(resumed)
    assert len(got) == len(epoch) == 4
    assert all(torch.equal(a, b) for a, b in zip(got, epoch, strict=True))


# -- 7. workers="auto" and the main script ------------------------------------------------

_SCRIPT = """
import os
import torch
import asyncflow
import asyncflow.torch._loader
asyncflow.torch._layout.PROCESS_CORES = 2  # as on a machine of 4 cores or more
print("started", flush=True)

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 10
    def __getitem__(self, i):
        return torch.tensor([i * i]), os.getpid()

def collate(batch):
    return torch.cat([x for x, _ in batch]), sorted({{pid for _, pid in batch}})

{body}
"""
_BODY = """
loader = asyncflow.DataLoader(Squares(), batch_size=3, collate_fn=collate)
values, pids = [], set()
for x, batch_pids in loader:
    values += x.tolist()
    pids.update(batch_pids)
here = os.getpid() in pids
print("result", values, "here" if here else "elsewhere", "|".join(loader.stats().notes))
"""


@needs_two_cores
@pytest.mark.parametrize("guarded", [True, False])
def test_a_main_script_gets_processes_with_or_without_a_main_guard(
    tmp_path: Path, guarded: bool
) -> None:
    body = _BODY
    if guarded:
        body = 'if __name__ == "__main__":\n' + textwrap.indent(_BODY, "    ")
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(body=body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    results = [line for line in lines if line.startswith("result ")]
    assert len(results) == 1, out.stdout  # the loop ran once: no worker ran it again
    expected = f"result {[i * i for i in range(10)]}"
    assert results[0].startswith(expected), results[0]
    where, notes = results[0][len(expected) + 1:].split(" ", 1)
    assert where == "elsewhere"  # loaded in worker processes, the Dataset sent by value
    assert "processes (workers='auto')" in notes
    assert lines.count("started") == 1  # no worker imported the script again


# -- 8. a dataset that cannot be pickled --------------------------------------------------


def test_an_unpicklable_dataset_with_processes_is_a_config_error() -> None:
    # (the default forks where it can, and takes it: test_loader_fork_default.py)
    with pytest.raises(ConfigError) as info:
        DataLoader(Locked(4), num_workers=2, workers="processes",
                   multiprocessing_context="forkserver")
    message = str(info.value)
    assert "Locked" in message and "lock" in message
    assert "workers='threads'" in message


@needs_two_cores
def test_an_unpicklable_dataset_falls_back_to_threads_under_auto(big_box: None) -> None:
    loader = DataLoader(Locked(6), batch_size=2, num_workers=2)
    assert [y.tolist() for _, y in loader] == [[0, 7], [14, 21], [28, 35]]
    notes = " ".join(loader.stats().notes)
    assert "threads (workers='auto')" in notes and "Locked" in notes and "lock" in notes


@needs_two_cores
def test_auto_picks_processes_for_a_picklable_dataset(big_box: None, leak_check: None) -> None:
    loader = DataLoader(Pids(6), batch_size=2, num_workers=2)
    assert os.getpid() not in {p for b in loader for p in b[0].tolist()}
    assert "processes (workers='auto')" in " ".join(loader.stats().notes)


def test_auto_picks_threads_below_four_cores_and_says_why(
    monkeypatch: pytest.MonkeyPatch, leak_check: None
) -> None:
    import asyncflow.workers._auto as auto

    monkeypatch.setattr(auto, "usable_cpus", lambda: 3)
    loader = DataLoader(Pids(6), batch_size=2, num_workers=3)
    assert {p for b in loader for p in b[0].tolist()} == {os.getpid()}
    notes = " ".join(loader.stats().notes)
    assert "threads (workers='auto'): 3 usable cores" in notes and "GIL" in notes


def _locked_init() -> Callable[[int], None]:
    lock = threading.Lock()

    def locked_init(worker_id: int) -> None:
        with lock:
            pass

    return locked_init


def test_an_unpicklable_worker_init_fn_with_processes_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"worker_init_fn=.*locked_init.*workers='threads'"):
        DataLoader(Pairs(4), num_workers=2, workers="processes", worker_init_fn=_locked_init(),
                   multiprocessing_context="forkserver")


@needs_two_cores
def test_an_unpicklable_worker_init_fn_falls_back_to_threads_under_auto(big_box: None) -> None:
    loader = DataLoader(Pairs(4), batch_size=2, num_workers=2, worker_init_fn=_locked_init())
    assert [y.tolist() for _, y in loader] == [[0, 7], [14, 21]]
    notes = " ".join(loader.stats().notes)
    assert "threads (workers='auto')" in notes and "locked_init" in notes


@needs_two_cores
def test_a_script_piped_to_python_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-"], input=_SCRIPT.format(body=_BODY),
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    results = [line for line in out.stdout.splitlines() if line.startswith("result ")]
    assert len(results) == 1 and "processes (workers='auto')" in results[0]
    assert out.stdout.splitlines().count("started") == 1


# -- 9. failures in a worker ---------------------------------------------------------------


def test_a_failing_getitem_keeps_its_type_and_the_workers_traceback(leak_check: None) -> None:
    loader = DataLoader(Flaky(12), batch_size=2, num_workers=2, workers="processes")
    it = iter(loader)
    assert [next(it)[1].tolist() for _ in range(2)] == [[0, 7], [14, 21]]
    with pytest.raises(KeyError, match="sample 5 is missing") as info:
        next(it)
    notes = "\n".join(info.value.__notes__)
    assert "in __getitem__" in notes and "Traceback" in notes  # the worker's traceback
    assert "batch 2 (indices [4, 5]) failed in stage 'fetch'" in notes
    assert [y.tolist() for _, y in it] == [[42, 49], [56, 63], [70, 77]]  # the epoch goes on
    # raised in place, and counted as the budget's skips are (it was not before)
    (failure,) = loader.stats().failures
    assert (failure.stage, failure.item, failure.error_type) == ("fetch", "[4, 5]", "KeyError")
    assert "sample 5 is missing" in failure.message


def test_max_failures_skips_the_batch_that_failed_in_a_worker(leak_check: None) -> None:
    loader = DataLoader(Flaky(12), batch_size=2, num_workers=2, workers="processes",
                        max_failures=1)
    got = [y.tolist() for _, y in loader]
    assert got == [[0, 7], [14, 21], [42, 49], [56, 63], [70, 77]]
    assert [f.item for f in loader.stats().failures] == ["[4, 5]"]


def test_a_worker_that_dies_is_reported_with_its_batch(leak_check: None) -> None:
    loader = DataLoader(Dies(12), batch_size=2, num_workers=2, workers="processes")
    with pytest.raises(WorkerError, match=r"died \(exit code 3\).*item \[4, 5\]"):
        list(loader)  # a RuntimeError, as torch's "worker exited unexpectedly"
    loader = DataLoader(Dies(12), batch_size=2, num_workers=2, workers="processes",
                        max_failures=1)
    assert [y.tolist() for _, y in loader] == [[0, 7], [14, 21], [42, 49], [56, 63], [70, 77]]
    assert [f.item for f in loader.stats().failures] == ["[4, 5]"]


def test_timeout_stops_a_worker_stuck_in_getitem(leak_check: None) -> None:
    loader = DataLoader(Hangs(12), batch_size=2, num_workers=2, workers="processes", timeout=1)
    started = time.monotonic()
    with pytest.raises(StallError):
        list(loader)
    assert time.monotonic() - started < 10  # and leak_check: the stuck worker is gone


# -- 9b. batches collated straight into shared memory ----------------------------------------


class Images(Pairs):
    """48 KiB samples: a batch of 4 is above SHM_THRESHOLD."""

    def __getitem__(self, i: int) -> Any:
        return torch.full((3, 64, 64), float(i)), i


def _images(first: int, count: int) -> torch.Tensor:
    return torch.stack([torch.full((3, 64, 64), float(i)) for i in range(first, first + count)])


def collate_noting_segments(samples: list[Any]) -> Any:
    """A user's collate calling torch's: its stacked images, and whether they lie in a segment
    this worker made to send by name (``_segments.allocate``), rather than in torch's."""
    from asyncflow.workers import _segments

    images, labels = tud.default_collate(samples)
    return images, labels, images.data_ptr() in _segments._made


def collate_then_fail(samples: list[Any]) -> Any:
    tud.default_collate(samples)  # stacked into a segment, then dropped
    raise ValueError("collate failed after stacking")


@pytest.mark.parametrize("context", [None, "forkserver"])
def test_torchs_collate_stacks_into_segments_sent_without_a_copy(
    context: str | None, leak_check: None
) -> None:
    loader = DataLoader(Images(24), batch_size=4, num_workers=2, workers="processes",
                        collate_fn=collate_noting_segments, multiprocessing_context=context)
    for b, (images, labels, in_segment) in enumerate(loader):
        assert in_segment
        assert torch.equal(images, _images(4 * b, 4))
        assert labels.tolist() == list(range(4 * b, 4 * b + 4))
        images.add_(1)  # writable, as torch's


def test_default_collate_batches_on_processes_are_those_of_threads(leak_check: None) -> None:
    def epoch(workers: str) -> list[Any]:
        return list(DataLoader(Images(26), batch_size=4, num_workers=2, workers=workers))

    threads, processes = epoch("threads"), epoch("processes")
    assert len(processes) == 7
    assert all(same(p, t) for p, t in zip(processes, threads, strict=True))


def _held_segments(before: set[str]) -> set[str]:
    return {n for n in _segments() - before if not n.endswith("-status")}


def test_a_collate_failing_after_stacking_leaves_no_segment_in_live_workers(
    leak_check: None
) -> None:
    before = _segments()
    loader = DataLoader(Images(16), batch_size=4, num_workers=2, workers="processes",
                        collate_fn=collate_then_fail, persistent_workers=True)
    it = iter(loader)
    for _ in range(4):  # as torch: each batch raises, and iterating goes on
        with pytest.raises(ValueError, match="collate failed after stacking"):
            next(it)
    del it
    assert _settles(lambda: _held_segments(before) == set()), _held_segments(before)
    del loader
    gc.collect()


@pytest.mark.parametrize("how", ["break", "exception", "gc"])
def test_stopping_with_batches_in_segments_leaves_none(how: str, leak_check: None) -> None:
    before = _segments()
    loader = DataLoader(Images(400), batch_size=4, num_workers=2, workers="processes",
                        persistent_workers=True)
    if how == "gc":
        it = iter(loader)
        next(it)
        del it
    else:
        with contextlib.suppress(ZeroDivisionError):
            for i, _ in enumerate(loader):
                if i == 3:
                    if how == "break":
                        break
                    raise ZeroDivisionError
    gc.collect()
    # the workers live on (persistent): what they stacked ahead was received or unlinked
    assert _settles(lambda: _held_segments(before) == set()), _held_segments(before)
    del loader
    gc.collect()


# -- 10. stopping leaves nothing behind ----------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_break_mid_epoch_leaves_no_worker(persistent: bool, leak_check: None) -> None:
    before, segments = _children(), _segments()
    loader = DataLoader(Slow(400), batch_size=2, num_workers=2, workers="processes",
                        persistent_workers=persistent)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    if not persistent:  # the epoch's workers stop with it, while the loader lives on
        assert _settles(lambda: _children() <= before), _children() - before
        assert _settles(lambda: _segments() <= segments), _segments() - segments
    assert len(next(iter(loader))) == 2  # and the loader still works
    del loader
    gc.collect()


def test_deleting_a_loader_stops_its_persistent_workers(leak_check: None) -> None:
    before = _children()
    loader = DataLoader(Slow(40), batch_size=2, num_workers=2, workers="processes",
                        persistent_workers=True)
    assert len(list(loader)) == 20
    forked = "forked from this process" in " ".join(loader.stats().notes)
    # alive between epochs: the two workers, and the fork template they were forked from
    assert len(_children() - before) == 2 + forked
    del loader
    gc.collect()
    assert _settles(lambda: _children() <= before), _children() - before


def test_an_exception_in_the_consumer_leaves_no_worker(leak_check: None) -> None:
    before, segments = _children(), _segments()
    loader = DataLoader(Slow(400), batch_size=2, num_workers=2, workers="processes")

    def train() -> None:
        for i, _ in enumerate(loader):
            if i == 2:
                raise ZeroDivisionError("the training step failed")

    with pytest.raises(ZeroDivisionError):
        train()
    assert _settles(lambda: _children() <= before), _children() - before
    assert _settles(lambda: _segments() <= segments), _segments() - segments


_INTERRUPTED = """
import os, sys, time
import torch
import asyncflow

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        time.sleep(0.01)
        return os.getpid()

if __name__ == "__main__":
    loader = asyncflow.DataLoader(Slow(), batch_size=2, num_workers=2, workers="processes",
                                  persistent_workers=sys.argv[1] == "persistent")
    pids = set()
    try:
        for batch in loader:
            pids.update(batch.tolist())
            if len(pids) == 2:
                print("ready", flush=True)
    except KeyboardInterrupt:
        print("interrupted", *sorted(pids), flush=True)
        raise
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("persistent", ["persistent", "per-epoch"])
def test_ctrl_c_ends_the_loop_and_the_workers(tmp_path: Path, persistent: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(_INTERRUPTED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, str(script), persistent], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
        # a shell's background job ignores SIGINT, and Python then installs no handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as child:
        try:
            assert child.stdout is not None
            for line in child.stdout:
                if line.strip() == "ready":
                    break
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=5)  # one Ctrl-C is enough
        finally:
            child.kill()
    assert child.returncode == -signal.SIGINT, err[-2000:]
    assert "Traceback" in err and "Exception ignored" not in err
    last = out.splitlines()[-1].split()
    assert last[0] == "interrupted" and len(last) == 3
    workers = [int(pid) for pid in last[1:]]
    assert _settles(lambda: all(_gone(pid) for pid in workers)), workers


# -- 11. pin_memory ------------------------------------------------------------------------


def test_pin_memory_works_with_worker_processes(leak_check: None) -> None:
    loader = DataLoader(Dicts(6), batch_size=3, num_workers=2, workers="processes",
                        pin_memory=True)
    batches = list(loader)
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    assert torch.equal(batches[1]["x"][0], torch.full((2, 2), 3.0))
    if torch.cuda.is_available():
        assert all(b["x"].is_pinned() for b in batches)


# -- 12. batches fetched ahead of the consumer ----------------------------------------------


class Logged(Pairs):
    """Appends a byte to the file ``log`` for each sample fetched, in whatever process."""

    def __init__(self, n: int, log: str) -> None:
        super().__init__(n)
        self.log = log

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with open(self.log, "ab") as f:
            f.write(b"x")
        return torch.full((2,), float(i)), i


def _fetched(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


@pytest.mark.parametrize(("workers", "prefetch"), [(1, 1), (2, None), (2, 3)])
def test_workers_fetch_at_most_prefetch_factor_batches_each_ahead(
    tmp_path: Path, workers: int, prefetch: int | None, leak_check: None
) -> None:
    log = tmp_path / "fetched"
    loader = DataLoader(Logged(400, str(log)), batch_size=2, num_workers=workers,
                        prefetch_factor=prefetch, workers="processes", timeout=30)
    ahead = (prefetch or 2) * workers  # torch's rule: prefetch_factor * num_workers
    received = []
    with iter(loader) as it:
        for held in (1, 2):  # the consumer holds off after each batch
            received.append(next(it)[1].tolist())
            assert _settles(lambda: _fetched(log) >= 2 * (held + ahead))  # noqa: B023
            time.sleep(0.3)  # room to fetch more, were it allowed
            assert _fetched(log) == 2 * (held + ahead)
        received += [batch[1].tolist() for batch in it]
    assert received == [[i, i + 1] for i in range(0, 400, 2)]


def test_async_iteration_gives_back_each_batch_it_receives(leak_check: None) -> None:
    import asyncio

    loader = DataLoader(Pairs(40), batch_size=2, num_workers=1, prefetch_factor=1,
                        workers="processes", timeout=30)

    async def consume() -> list[list[int]]:
        return [batch[1].tolist() async for batch in loader]

    assert asyncio.run(consume()) == [[7 * i, 7 * i + 7] for i in range(0, 40, 2)]
