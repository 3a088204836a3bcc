"""One rank of the torchrun tests in tests/torch/test_even_steps.py; not a test module itself.

``python _even_steps_worker.py MODE OUT_DIR``: each rank writes ``OUT_DIR/rank<r>.json``.

- ``short``: every rank reads its ``Split()`` share of 24 items in batches of 4 (``drop_last``);
  on rank 1 alone one item fails (skipped within ``max_failures``), so rank 1 has a batch less.
  Read plainly, then through ``even_steps``. Then an ``asyncflow.DataLoader`` with two worker
  processes over an iterable dataset split by rank and worker.
- ``fail``: rank 1's second batch fails outright (no failure budget); every rank must stop
  after one batch, none hang.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from asyncflow import DataLoader, Pipeline, Split
from asyncflow.torch import even_steps

N, BATCH = 24, 4


def _check(rank: int, bad: int) -> Any:
    def check(item: int) -> int:
        if rank == 1 and item == bad:
            raise ValueError(f"item {item} is damaged")
        return item
    return check


def _batches(rank: int, max_failures: int, bad: int = 1) -> Pipeline[Any]:
    pipe = Pipeline(Split()(range(N)), max_failures=max_failures)
    return pipe.map(_check(rank, bad)).batch(BATCH, drop_last=True)


class Numbers(IterableDataset[tuple[int, int]]):
    """0..29, this rank's and this worker's share, tagged with the worker that read it."""

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker = -1 if info is None else info.id
        return ((worker, i) for i in Split()(range(30)))


def short(rank: int) -> dict[str, Any]:
    plain = [list(b) for b in _batches(rank, max_failures=1)]
    agreed = even_steps(_batches(rank, max_failures=1))
    yielded = [list(b) for b in agreed]
    again = [list(b) for b in agreed]  # a second epoch: the same agreement
    stats = agreed.stats()
    windowed = even_steps(_batches(rank, max_failures=1), agree_every=2)
    in_pairs = [list(b) for b in windowed]
    loader = DataLoader(Numbers(), batch_size=None, num_workers=2)
    read = [(int(w), int(i)) for w, i in loader]
    return {"plain": plain, "yielded": yielded, "again": again, "steps": stats.steps,
            "leftover": stats.leftover, "leftover_by_rank": list(stats.leftover_by_rank),
            "failed_ranks": list(stats.failed_ranks), "loader": read, "in_pairs": in_pairs,
            "in_pairs_leftover_by_rank": list(windowed.stats().leftover_by_rank)}


def fail(rank: int) -> dict[str, Any]:
    agreed = even_steps(_batches(rank, max_failures=0, bad=13))  # rank 1's second batch
    yielded = []
    try:
        for batch in agreed:
            yielded.append(list(batch))
    except Exception as exc:
        return {"yielded": yielded, "error": type(exc).__name__, "message": str(exc),
                "failed_ranks": list(agreed.stats().failed_ranks)}
    return {"yielded": yielded, "error": None}


def main(mode: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = {"short": short, "fail": fail}[mode]
    result = {"rank": rank, "world": dist.get_world_size(), **run(rank)}
    dist.barrier()
    dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
