"""One rank of the elastic-resume torchrun tests in tests/torch/test_elastic.py; not a test
module itself.

``python _elastic_worker.py MODE OUT_DIR [STATES]``: each rank writes ``OUT_DIR/rank<r>.json``
(the items it delivered, with their local positions, and its pipeline's final ``split``).

- ``save``: every rank reads its ``Split()`` share of ``N`` items through a pipeline, stops
  after ``STOPS[world][rank]`` items (a different step on each rank), takes its state, and the
  ranks gather their states (``gather_states``); rank 0 writes them to ``OUT_DIR/states.json``.
- ``resume``: every rank reads the states in ``STATES``, takes its ``Split().resume`` share
  and reads it to the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from asyncflow import Pipeline, Split
from asyncflow.torch import gather_states

N = 25  # 3 ranks pad it to 27, 2 ranks to 26
STOPS = {3: [2, 6, 4], 2: [3, 9]}


def _pipeline(share: Any) -> Pipeline[Any]:
    return Pipeline(share).map(lambda item: item, concurrency=3)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    items = list(range(N))
    if mode == "save":
        pipe = _pipeline(Split()(items))
        it = iter(pipe)
        delivered = [next(it) for _ in range(STOPS[world][rank])]
        state = json.loads(json.dumps(pipe.state_dict()))
        del it
        states = gather_states(state)
        assert states[rank] == state
        if rank == 0:
            (out / "states.json").write_text(json.dumps(states))
    else:
        states = json.loads(Path(sys.argv[3]).read_text())
        pipe = _pipeline(Split().resume(items, states))
        delivered = list(pipe)
        state = pipe.state_dict()
    result = {"rank": rank, "world": world, "delivered": delivered, "split": state["split"],
              "positions": state["positions"]}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
