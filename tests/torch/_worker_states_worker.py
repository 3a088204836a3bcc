"""One rank of the torchrun test of elastic resume from DataLoader workers in
tests/torch/test_worker_states.py; not a test module itself.

``python _worker_states_worker.py MODE OUT_DIR [STATES]``: each rank writes
``OUT_DIR/rank<r>.json`` (the items it delivered).

- ``save``: every rank reads its share through an ``asyncflow.DataLoader`` with 2 worker
  processes (each cutting the rank's share again), stops after ``STOPS[rank]`` batches, and
  the ranks gather every worker's pipeline state (``gather_states(loader.state_dict())``);
  rank 0 writes them to ``OUT_DIR/states.json``.
- ``resume``: every rank reads the states in ``STATES`` and its share of what they left
  through a loader with ``WORKERS`` worker process(es), to the end.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from asyncflow import DataLoader
from asyncflow.torch import gather_states
from tests.torch.test_worker_states import _Elastic

STOPS = [3, 3]  # batches of 2: 6 items a rank, 12 of 24 left
WORKERS = 1


def _loader(dataset: _Elastic, workers: int) -> Any:
    return DataLoader(dataset, batch_size=2, num_workers=workers, workers="processes")


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "save":
        loader = _loader(_Elastic(None, None), 2)
        it = iter(loader)
        delivered = [int(x) for batch in itertools.islice(it, STOPS[rank]) for x in batch]
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        states = gather_states(state)
        assert [s["split"]["index"] for s in states] == list(range(2 * world)), states
        if rank == 0:
            (out / "states.json").write_text(json.dumps(states))
    else:
        states = json.loads(Path(sys.argv[3]).read_text())
        loader = _loader(_Elastic(None, None, states), WORKERS)
        delivered = [int(x) for batch in loader for x in batch]
    result = {"rank": rank, "world": world, "delivered": delivered}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
