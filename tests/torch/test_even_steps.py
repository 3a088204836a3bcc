"""even_steps and Split under a real ``torchrun``: gloo, CPU, loopback
(asyncflow/torch/_distributed.py).

Each run is a subprocess with a timeout; the test checks its exit code, every rank's result
file, and that no process of the run is left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, get_worker_info

from asyncflow import ConfigError, DataLoader, Pipeline, Split
from asyncflow.ranks import cut
from asyncflow.torch import StepStats, even_steps
from tests.torchrun import free_port, torchrun

WORKER = Path(__file__).with_name("_even_steps_worker.py")


def _torchrun(mode: str, ranks: int, out: Path) -> list[dict[str, Any]]:
    return torchrun(WORKER, ranks, out, mode)


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_failure_on_one_rank_leaves_every_rank_the_same_steps(tmp_path: Path, ranks: int) -> None:
    results = _torchrun("short", ranks, tmp_path)
    per_rank = 24 // ranks  # Split(): 24 items, every rank the same count
    # Read plainly, rank 1 (which lost an item) has a batch less: DDP would hang on it.
    plain = [len(r["plain"]) for r in results]
    assert plain == [per_rank // 4 - (r == 1) for r in range(ranks)]
    # Through even_steps, every rank takes the shortest rank's count, two epochs running.
    assert {r["steps"] for r in results} == {min(plain)}
    assert all(len(r["yielded"]) == min(plain) and r["again"] == r["yielded"] for r in results)
    leftovers = [p - min(plain) for p in plain]
    assert all(r["leftover_by_rank"] == leftovers for r in results)  # counted, every rank told
    assert [r["leftover"] for r in results] == leftovers
    assert all(r["failed_ranks"] == [] for r in results)
    # Agreeing on two batches at a time: the same batches, the same leftovers.
    assert all(r["in_pairs"] == r["yielded"] for r in results)
    assert all(r["in_pairs_leftover_by_rank"] == leftovers for r in results)
    yielded = [i for r in results for batch in r["yielded"] for i in batch]
    assert len(yielded) == len(set(yielded))  # disjoint
    # Split() in a DataLoader's two worker processes: each (rank, worker) reads its own part.
    parts = ranks * 2
    for r in results:
        assert {w for w, _ in r["loader"]} == {0, 1}
    read = [i for r in results for _, i in r["loader"]]
    assert {len(r["loader"]) for r in results} == {2 * -(-30 // parts)}
    assert set(read) == set(range(30))
    assert len(read) - 30 == -30 % parts  # the padding: the first items, once more each
    assert sorted(read)[: 2 * (-30 % parts)] == sorted(list(range(-30 % parts)) * 2)


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_rank_whose_batches_fail_stops_every_rank(tmp_path: Path, ranks: int) -> None:
    results = _torchrun("fail", ranks, tmp_path)
    assert all(len(r["yielded"]) == 1 for r in results)  # all stop at the same step
    assert all(r["failed_ranks"] == [1] for r in results)
    assert results[1]["error"] == "PipelineError" and "item 13 is damaged" in results[1]["message"]
    for r in results:
        if r["rank"] != 1:
            assert r["error"] == "WorkerError"
            assert "the batches of rank(s) [1] failed" in r["message"]


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_even_steps_needs_a_process_group() -> None:
    with pytest.raises(ConfigError, match=r"needs an initialized torch\.distributed process group"):
        even_steps([1, 2])


@pytest.mark.usefixtures("one_rank")
def test_on_one_rank_every_batch_is_yielded_and_an_error_is_its_own() -> None:
    agreed = even_steps(Pipeline(range(10)).batch(3))
    assert agreed.stats() == StepStats()
    assert [len(b) for b in agreed] == [3, 3, 3, 1]
    assert agreed.stats() == StepStats(steps=4, leftover=0, leftover_by_rank=(0,))

    def boom(i: int) -> int:
        if i == 5:
            raise KeyError(i)
        return i

    failing = even_steps(map(boom, range(8)))
    seen = []
    with pytest.raises(KeyError):
        for i in failing:
            seen.append(i)
    assert seen == [0, 1, 2, 3, 4]
    assert failing.stats().failed_ranks == (0,)


@pytest.mark.usefixtures("one_rank")
def test_agreeing_on_several_batches_at_once() -> None:
    for every in (1, 2, 3, 4, 10, 11):
        agreed = even_steps(range(10), agree_every=every)
        assert list(agreed) == list(range(10)), every
        assert agreed.stats().steps == 10
    with pytest.raises(ConfigError, match="agree_every must be an int >= 1, got 0"):
        even_steps(range(3), agree_every=0)


class _Numbers(IterableDataset[tuple[int, int]]):
    """0..20 split by an explicit rank and by worker, tagged with the worker that read it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = get_worker_info()
        worker = -1 if info is None else info.id
        return ((worker, i) for i in Split(rank=self.rank, world_size=2)(range(21)))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ours", [True, False])
def test_split_in_dataloader_worker_processes(
    ours: bool, monkeypatch: pytest.MonkeyPatch, leak_check: None
) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def read(rank: int) -> list[tuple[int, int]]:
        loader: Any = (
            DataLoader(_Numbers(rank), batch_size=None, num_workers=2, workers="processes")
            if ours else TorchDataLoader(_Numbers(rank), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn"))
        return [(int(w), int(i)) for w, i in loader]

    got = {rank: read(rank) for rank in (0, 1)}
    # 21 items in 4 parts (2 ranks x 2 workers): 6 each, the first 3 items once more
    parts = {(rank, w): [i for ww, i in items if ww == w] for rank, items in got.items()
             for w in (0, 1)}
    assert parts == {(r, w): cut(21, r * 2 + w, 4) for r in (0, 1) for w in (0, 1)}


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()),
                    reason="needs CUDA and NCCL")
def test_with_nccl_the_count_is_agreed_on_the_gpu() -> None:
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        agreed = even_steps(Pipeline(range(7)).batch(2), agree_every=2)
        assert [len(b) for b in agreed] == [2, 2, 2, 1]
        assert agreed.stats() == StepStats(steps=4, leftover=0, leftover_by_rank=(0,))
    finally:
        dist.destroy_process_group()
