"""Worker processes (``workers="processes"``): results, shared memory, pickling, errors, seeds.

Stopping, worker deaths and persistent workers are in ``test_processes_lifecycle.py``.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import operator
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncflow import (
    ConfigError,
    Pipeline,
    PipelineError,
    Processes,
    WorkerError,
    WorkerInfo,
    worker_info,
)
from asyncflow.workers import _segments
from tests.doubles import ROOT, child_env

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(60)]

BIG = (256, 256)  # float32: 256 KiB, well over the shared-memory threshold (64 KiB)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _my_segments() -> list[str]:
    return [n for n in os.listdir(_segments.SHM_DIR) if n.startswith(f"asyncflow-{os.getpid()}-")]


def square(x: int) -> int:
    return x * x


def is_odd(x: int) -> bool:
    return x % 2 == 1


# -- 1. the same results as threads; arrays and tensors through shared memory --------------


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("mode", ["map", "filter"])
def test_results_equal_thread_mode(mode: str, ordered: bool, concurrency: int) -> None:
    def build(workers: str) -> Pipeline:
        pipe = Pipeline(range(200))
        if mode == "map":
            return pipe.map(square, concurrency=concurrency, ordered=ordered, workers=workers)
        return pipe.filter(is_odd, concurrency=concurrency, ordered=ordered, workers=workers)

    threads, processes = list(build("threads")), list(build("processes"))
    if ordered:
        assert processes == threads
    else:
        assert sorted(processes) == sorted(threads)
    assert len(threads) == (200 if mode == "map" else 100)
    assert _my_segments() == []


def make_arrays(x: int) -> dict[str, Any]:
    return {
        "big": np.full(BIG, x, dtype=np.float32),
        "small": np.arange(10) + x,
        "tensor": torch.full(BIG, float(x)),
        "small_tensor": torch.arange(10) + x,
    }


def _has_mmap_base(array: np.ndarray) -> bool:
    base: Any = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return False


def test_arrays_and_tensors_come_back_correct_writable_and_through_shared_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attached: list[int] = []
    real_map = _segments._map

    def counting_map(path: str, size: int, *, received: bool) -> Any:
        if received:
            attached.append(size)
        return real_map(path, size, received=received)

    monkeypatch.setattr(_segments, "_map", counting_map)
    out = list(Pipeline(range(6)).map(make_arrays, concurrency=3, workers="processes"))
    assert len(out) == 6
    for x, result in enumerate(out):
        big, small, tensor, small_tensor = (
            result["big"], result["small"], result["tensor"], result["small_tensor"]
        )
        assert big.shape == BIG and (big == x).all()
        assert (small == np.arange(10) + x).all()
        assert torch.equal(tensor, torch.full(BIG, float(x)))
        assert torch.equal(small_tensor, torch.arange(10) + x)
        assert big.flags.writeable and small.flags.writeable
        assert _has_mmap_base(big), "a large array did not come through shared memory"
        big += 1
        tensor.add_(1)  # raises on read-only memory
        small_tensor.add_(1)
        assert (big == x + 1).all() and float(tensor[0, 0]) == x + 1
    big_bytes = BIG[0] * BIG[1] * 4
    # One segment per large array and per large tensor; the small ones stay in the pipe.
    assert sorted(attached) == [big_bytes] * 12
    assert _my_segments() == []


def total(array: np.ndarray) -> float:
    return float(array.sum())


def test_large_inputs_go_to_the_workers_through_shared_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written: list[str] = []
    real_write = _segments._write_segment

    def counting_write(path: str, data: memoryview) -> int:
        written.append(path)
        return real_write(path, data)

    monkeypatch.setattr(_segments, "_write_segment", counting_write)
    arrays = [np.full(BIG, i, dtype=np.float32) for i in range(8)]
    out = list(Pipeline(arrays).map(total, concurrency=2, workers="processes"))
    assert out == [float(i * BIG[0] * BIG[1]) for i in range(8)]
    assert len(written) == 8  # one per input array, in this process
    assert _my_segments() == []


def _no_room(path: str, data: memoryview) -> int:
    raise OSError(errno.ENOSPC, "No space left on device", path)


def fill_shared_memory(info: WorkerInfo) -> None:
    _segments._write_segment = _no_room  # as a container's full 64 MB /dev/shm answers


def test_large_arrays_go_through_the_pipe_when_shared_memory_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Was: each input chunk failed with a bare OSError naming no item, and each worker died
    # writing its result, its replacement took the chunk and died too, forever (a hang).
    monkeypatch.setattr(_segments, "_write_segment", _no_room)
    arrays = [np.full(BIG, i, dtype=np.float32) for i in range(4)]
    pipe = Pipeline(arrays).map(operator.neg, concurrency=2,
                                workers=Processes(init=fill_shared_memory))
    out = list(pipe)
    assert [float(a[0, 0]) for a in out] == [-float(i) for i in range(4)]
    assert all(a.shape == BIG for a in out)
    assert _my_segments() == []


# -- 2. the function goes to each worker once ------------------------------------------------


class CountsUnpickling:
    """A callable whose unpickling (in a worker) appends a line to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, x: int) -> int:
        return x + 1

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        with open(self.path, "a") as fh:
            fh.write(f"{os.getpid()}\n")


def test_function_is_sent_once_per_worker_not_per_chunk(tmp_path: Path) -> None:
    counter = tmp_path / "unpickled"
    fn = CountsUnpickling(str(counter))
    pipe = Pipeline(range(500), buffer=16).map(fn, concurrency=3, workers="processes")
    assert sorted(pipe) == list(range(1, 501))
    pids = counter.read_text().split()
    # 500 items in chunks of at most a few items: well over 3 chunks, yet 3 unpicklings.
    assert len(pids) == 3 and len(set(pids)) == 3


# -- 3. functions of __main__ travel by value ------------------------------------------------


MAIN_SCRIPT = """
import sys
from asyncflow import Pipeline

if __name__ == "__main__":
    class Box:
        def __init__(self, value):
            self.value = value

    OFFSET = 100

    def shift(x):  # defined as a notebook cell defines it: not importable by the workers
        return Box(x + OFFSET)

    def unbox(box):
        return box.value * 2

    pipe = Pipeline(range(10)).map(shift, concurrency=2, workers="processes")
    print([b.value for b in pipe])
    pipe = Pipeline([Box(i) for i in range(5)]).map(unbox, concurrency=2, workers="processes")
    print(list(pipe))
"""


def test_function_defined_in_main_works_by_value(tmp_path: Path) -> None:
    script = tmp_path / "notebook_like.py"
    script.write_text(MAIN_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(script)], capture_output=True, text=True,
        timeout=45, env=child_env(), cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(list(range(100, 110)))
    assert lines[1] == str([0, 2, 4, 6, 8])


# -- 4. what cannot be pickled fails at .map(), naming it --------------------------------------


class HoldsLock:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, x: int) -> int:
        with self.lock:
            return x


class HoldsGenerator:
    def __init__(self) -> None:
        self.numbers = (i for i in range(10))

    def __call__(self, x: int) -> int:
        return x + next(self.numbers)


@pytest.mark.parametrize("fn", [HoldsLock(), HoldsGenerator()], ids=["lock", "generator"])
@pytest.mark.parametrize("method", ["map", "filter"])
def test_unpicklable_function_is_a_config_error_at_map_time(fn: Any, method: str) -> None:
    pipe = Pipeline(range(3))
    with pytest.raises(ConfigError) as info:
        getattr(pipe, method)(fn, concurrency=2, workers="processes")
    message = str(info.value)
    assert type(fn).__name__ in message
    assert "workers='threads'" in message


def test_unpicklable_init_is_a_config_error_at_map_time() -> None:
    lock = threading.Lock()

    def init_with_lock(info: Any) -> None:
        with lock:
            pass

    with pytest.raises(ConfigError) as info:
        Pipeline(range(3)).map(square, workers=Processes(init=init_with_lock))
    message = str(info.value)
    assert "init" in message and "init_with_lock" in message
    assert "workers='threads'" in message


def fetch_with(url: str, lock: Any, x: int) -> int:
    return x


def test_an_unpicklable_function_is_named_without_its_secrets() -> None:
    url = "https://user:hunter2@host/a.jpg?X-Amz-Signature=deadbeef00"
    fn = partial(fetch_with, url, threading.Lock())
    with pytest.raises(ConfigError) as info:
        Pipeline(range(3)).map(fn, workers="processes")
    message = str(info.value)
    assert "functools.partial" in message and "workers='threads'" in message
    assert "hunter2" not in message and "deadbeef00" not in message


# -- 5. exceptions and unpicklable results ---------------------------------------------------


class NeedsTwoArguments(Exception):
    """Pickles, but Python cannot unpickle it (``__init__`` takes two arguments, and
    passes one message on)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} (code {code})")
        self.what, self.code = what, code


class HoldsALock(Exception):
    """Cannot be pickled at all (an attribute holds a lock)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raises(x: str) -> int:
    if x == "two":
        raise NeedsTwoArguments("custom", 7)
    if x == "os":
        raise FileNotFoundError(2, "No such file", "/data/x.jpg")
    if x == "lock":
        raise HoldsALock("locked out")
    return 0


def fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"three is bad: {x}")
    return x


def odd_failures(x: int) -> Any:
    if x == 3:
        raise ValueError("plain")
    if x == 5:
        raise NeedsTwoArguments("custom", 7)
    if x == 7:
        return threading.Lock()  # a result that cannot be pickled
    return x


def test_exception_keeps_its_remote_traceback() -> None:
    with pytest.raises(PipelineError) as info:
        list(Pipeline(range(10)).map(fails_on_three, concurrency=2, workers="processes"))
    [error] = [e for e in _leaves(info.value) if isinstance(e, ValueError)]
    assert str(error) == "three is bad: 3"
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "Traceback" in notes and "fails_on_three" in notes and "three is bad" in notes


@pytest.mark.parametrize("executor", ["processes", "process pool executor"])
def test_an_exception_whose_init_takes_two_arguments_comes_back_as_itself(
    executor: str,
) -> None:
    from concurrent.futures import ProcessPoolExecutor

    with contextlib.ExitStack() as stack:
        if executor == "processes":
            stage: dict[str, Any] = {"workers": "processes"}
        else:
            stage = {"executor": stack.enter_context(ProcessPoolExecutor(1))}
        with pytest.raises(PipelineError) as info:
            list(Pipeline(["two"]).map(raises, **stage))
        [error] = _leaves(info.value)
        assert type(error) is NeedsTwoArguments, repr(error)
        assert (error.what, error.code, str(error)) == ("custom", 7, "custom (code 7)")
        notes = "\n".join(error.__notes__)
        assert "Traceback" in notes and "in raises" in notes  # the remote traceback
        with pytest.raises(PipelineError) as info:  # errno, strerror and filename too
            list(Pipeline(["os"]).map(raises, **stage))
        [error] = _leaves(info.value)
        assert type(error) is FileNotFoundError and error.filename == "/data/x.jpg"


def test_unpicklable_exception_comes_back_as_worker_error() -> None:
    with pytest.raises(PipelineError) as info:
        list(Pipeline(["lock"]).map(raises, workers="processes"))
    [error] = _leaves(info.value)
    assert isinstance(error, WorkerError), repr(error)
    assert "HoldsALock" in str(error) and "locked out" in str(error)


def test_unpicklable_result_fails_its_item_clearly() -> None:
    with pytest.raises(PipelineError) as info:
        list(Pipeline([7]).map(odd_failures, workers="processes"))
    [error] = _leaves(info.value)
    assert isinstance(error, WorkerError)
    assert "lock" in str(error) and "could not be pickled" in str(error)


def test_a_result_that_cannot_be_pickled_leaves_the_chunks_other_failures_as_they_are(
) -> None:
    from asyncflow.workers import FAILED
    from asyncflow.workers._worker_process import _picklable, _Worker

    failures = [(0, _picklable(NeedsTwoArguments("custom", 7)))]  # sent by state
    values, out = _Worker._salvage([FAILED, threading.Lock()], failures)
    assert values[1] is FAILED and [i for i, _ in out] == [0, 1]
    back = pickle.loads(pickle.dumps(out[0][1], protocol=5))
    assert type(back) is NeedsTwoArguments and back.code == 7  # not a WorkerError
    assert isinstance(out[1][1], WorkerError) and "could not be pickled" in str(out[1][1])


@pytest.mark.parametrize("concurrency", [1, 3])
def test_failures_count_against_the_budget_and_the_rest_arrive(concurrency: int) -> None:
    pipe = Pipeline(range(20), max_failures=3).map(
        odd_failures, concurrency=concurrency, workers="processes"
    )
    assert sorted(pipe) == [x for x in range(20) if x not in (3, 5, 7)]
    [stage] = [s for s in pipe.stats().stages if s.name == "odd_failures"]
    assert stage.failures == 3
    kinds = sorted(r.error_type for r in stage.failed_items)
    assert kinds == ["NeedsTwoArguments", "ValueError", "WorkerError"]


def _rebuild(x: int) -> int:
    if worker_info() is None:  # in the parent: a class its workers have and it has not, say
        raise ValueError(f"cannot rebuild {x}")
    return x


class RebuiltOnlyInWorkers:
    def __init__(self, x: int) -> None:
        self.x = x

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _rebuild, (self.x,)


def unloadable_at_5(x: int) -> object:
    return RebuiltOnlyInWorkers(x) if x == 5 else x


def test_results_the_parent_cannot_unpickle_fail_their_items_within_the_budget() -> None:
    # Was: a bare ValueError from deep in the pool's reader, naming no item, that ended the
    # run whatever its budget.
    pipe = Pipeline(range(10), buffer=1, max_failures=9).map(
        unloadable_at_5, workers=Processes(), concurrency=1
    )
    out = list(pipe)
    assert 5 not in out and set(out) < set(range(10))
    [stage] = [s for s in pipe.stats().stages if s.name == "unloadable_at_5"]
    assert stage.failures == 10 - len(out)
    records = {r.item: r for r in stage.failed_items}
    assert "5" in records and {r.error_type for r in records.values()} == {"WorkerError"}
    assert "cannot rebuild 5" in records["5"].message
    assert "could not be unpickled" in records["5"].message


# -- 7. seeding and worker_info ---------------------------------------------------------------


def draw(x: int) -> tuple[int, float, float, float]:
    return x, random.random(), float(np.random.rand()), float(torch.rand(1))


def _two_epochs(concurrency: int) -> list[list[Any]]:
    pipe = Pipeline(range(12)).map(draw, concurrency=concurrency,
                                   workers=Processes(seed=1234))
    return [list(pipe), list(pipe)]  # epochs 0 and 1


def test_seeds_are_reproducible_whatever_the_number_of_workers() -> None:
    one, three = _two_epochs(1), _two_epochs(3)
    assert one == three
    epoch0, epoch1 = one
    assert [r[0] for r in epoch0] == list(range(12))
    assert all(a != b for a, b in zip(epoch0, epoch1, strict=True))  # differ between epochs
    for epoch in one:
        for column in (1, 2, 3):
            assert len({r[column] for r in epoch}) == 12  # and between items
    other = list(Pipeline(range(12)).map(draw, workers=Processes(seed=1235)))
    assert other != epoch0


def seed_once(info: WorkerInfo) -> None:
    torch.manual_seed(1000 + info.id)


def initial_seed(x: int) -> int:
    return int(torch.initial_seed())


def test_reseed_false_leaves_seeding_to_the_init_hook() -> None:
    spec = Processes(seed=5, init=seed_once, reseed=False)
    seeds = list(Pipeline(range(8)).map(initial_seed, concurrency=1, workers=spec))
    assert seeds == [1000] * 8  # the one worker's own seed, item after item
    reseeded = list(Pipeline(range(8)).map(initial_seed, concurrency=1,
                                           workers=Processes(seed=5, init=seed_once)))
    assert len(set(reseeded)) == 8 and 1000 not in reseeded


def draw_or_die(x: int) -> tuple[int, float, float, float]:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return draw(x)


def test_seeds_do_not_shift_when_a_worker_dies_and_its_chunk_is_sent_again() -> None:
    spec = Processes(seed=77)
    clean = list(Pipeline(range(30)).map(draw, concurrency=2, workers=spec))
    survived = list(Pipeline(range(30), max_failures=1).map(draw_or_die, concurrency=2,
                                                            workers=spec))
    assert survived == [r for r in clean if r[0] != 5]


def who_am_i(x: int) -> tuple[int, Any]:
    info = worker_info()
    assert info is not None
    return x, (info.id, info.num_workers, info.seed, info.stage, info.pid == os.getpid())


def record_init(path: str, info: Any) -> None:
    with open(path, "a") as fh:
        fh.write(f"{type(info).__name__} {info.id} {info.num_workers} {os.getpid()}\n")


def test_worker_info_and_init_once_per_worker(tmp_path: Path) -> None:
    assert worker_info() is None
    log = tmp_path / "init"
    spec = Processes(seed=99, init=partial(record_init, str(log)))
    pipe = Pipeline(range(60)).map(who_am_i, concurrency=3, workers=spec, name="ident")
    out = list(pipe)
    assert [x for x, _ in out] == list(range(60))
    for _, (wid, num, seed, stage, pid_matches) in out:
        assert 0 <= wid < 3 and num == 3 and seed == 99 and stage == "ident" and pid_matches
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 3
    assert {line[0] for line in lines} == {"WorkerInfo"}
    assert sorted(int(line[1]) for line in lines) == [0, 1, 2]
    assert {line[2] for line in lines} == {"3"}


# -- 10. spawn ------------------------------------------------------------------------------------


def test_spawn_start_method_works() -> None:
    # A builtin: the spawned workers need not import this module (and pytest) to find it.
    spawn = Processes(start_method="spawn")
    pipe = Pipeline(range(30)).map(operator.neg, concurrency=2, workers=spawn)
    assert list(pipe) == [-x for x in range(30)]


def torch_threads(_: int) -> int:
    return torch.get_num_threads()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="torch's default is one thread here")
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_torch_function_computes_with_one_thread_per_worker(start_method: str) -> None:
    # asyncflow.torch registers the setup; the forkserver imports it before any worker exists
    # (the function names torch), and each worker must still run it once it starts.
    pipe = Pipeline(range(4)).map(torch_threads, concurrency=2,
                                  workers=Processes(start_method=start_method))
    assert list(pipe) == [1, 1, 1, 1]
