"""The state of a ``mix`` whose inputs restart within its run (issue 16): its size, how long
``state_dict()`` takes, and how long a resumed run takes to replay its picks.

    python benchmarks/bench_mix_restarts.py [--batches N]

A ``stop="never"`` mix of three inputs (3 items; 7 through a filter; 1,000), by weight, then
``batch(8)``: the consumer reads ``N`` batches (default 25,000: 200,000 items, the short inputs
restarted tens of thousands of times), pauses (the buffers fill), and takes the state (median
of 20 calls); a new pipeline given the state then yields its first batch (the replay).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from asyncflow import Pipeline, mix


def _third(x: int) -> bool:
    return x % 3 != 0


def make() -> Pipeline[Any]:
    a = Pipeline(range(3), name="a")
    b = Pipeline(range(7), name="b").filter(_third)
    c = Pipeline(range(1000), name="c")
    return mix([a, b, c], weights=[0.3, 0.3, 0.4], seed=0, stop="never").batch(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=25_000)
    args = parser.parse_args()
    pipe = make()
    with pipe.open() as run:
        for _ in range(args.batches):
            next(run)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            state = pipe.state_dict()
            times.append(time.perf_counter() - start)
    text = json.dumps(state)
    done = [b["done"] for b in state["nodes"]["mix"]["branches"]]
    start = time.perf_counter()
    resumed = make()
    resumed.load_state_dict(json.loads(text))
    with resumed.open() as run:
        next(run)
    replay = time.perf_counter() - start
    print(f"{args.batches * 8} items delivered; eras delivered in full per input: {done}")
    print(f"state: {len(text)} bytes; state_dict(): {statistics.median(times) * 1e3:.2f} ms "
          f"(median of 20, consumer paused); resumed run's first batch after "
          f"{replay:.2f} s (the replay of the picks)")


if __name__ == "__main__":
    main()
