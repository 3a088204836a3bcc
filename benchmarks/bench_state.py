"""Pipeline state (issue 15 / 16): how long ``state_dict()`` takes with items in flight, and
how large the state of a long epoch is.

    python benchmarks/bench_state.py [--quick]

1. Save time: a pipeline of every stage kind (unordered map with failures, filter, flat_map,
   shuffle, batch, prefetch) over 1M items, and two simpler ones, each consumer paused so
   that the buffers fill; ``state_dict()`` timed with those items in flight (median and max
   of 200 calls; wall time and the consumer thread's CPU time, and how many calls waited
   over 1 ms beyond their CPU time: for the GIL, held by the run's threads, or for a core),
   and then while the consumer reads on between calls (each call then settles what the
   consumer took since the last).
2. Size: the JSON length of the state of the same pipeline over a 1M-item source, interrupted
   at random points (the issue's target: under 100 KB).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import table

from asyncflow import Pipeline


def shaky(x: int) -> int:
    if x % 97 == 13:
        raise ValueError(x)
    return x


def expand(x: int) -> list[int]:
    return [x] * (x % 3)  # none, one or two


def build(length: int) -> Pipeline:
    return (
        Pipeline(range(length), max_failures=1.0)
        .map(shaky, concurrency=4, ordered=False)
        .filter(lambda x: x % 5 != 0)
        .flat_map(expand)
        .shuffle(buffer_size=512, seed=1)
        .batch(16)
        .prefetch(8)
    )


def in_flight(pipe: Pipeline, state: dict) -> int:
    """Source items read but not settled."""
    rt = pipe._last[0]  # the benchmark's own look inside: not a public seam
    emitted = rt.lineage.source.emitted
    settled = state["positions"]
    return emitted - settled["mark"] - sum(b - a for a, b in settled["ranges"])


def _timed(pipe: Pipeline, run: Any, calls: int, label: str, reading: bool) -> list[str]:
    """``state_dict()`` timed ``calls`` times: wall and CPU time of the consumer's thread
    (the CPU time leaves out waiting for the GIL or a core on a busy machine)."""
    walls, cpus = [], []
    for _ in range(calls):
        if reading:
            next(run)
        wall, cpu = time.perf_counter(), time.thread_time()
        state = pipe.state_dict()
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    waited = sum(wall - cpu > 1e-3 for wall, cpu in zip(walls, cpus, strict=True))
    return [label, f"{in_flight(pipe, state):,}", f"{statistics.median(walls) * 1e3:.3f}",
            f"{statistics.median(cpus) * 1e3:.3f}", f"{max(walls) * 1e3:.3f}",
            f"{waited}/{calls}", f"{len(json.dumps(state)):,}"]


def save_time(pipe: Pipeline, calls: int) -> list[list[str]]:
    with pipe.open() as run:
        list(itertools.islice(run, 200))
        time.sleep(1.0)  # the buffers fill while the consumer pauses
        return [_timed(pipe, run, calls, "paused consumer", reading=False),
                _timed(pipe, run, calls, "reading consumer", reading=True)]


def state_size(length: int, points: int) -> list[list[str]]:
    rows = []
    rng = random.Random(0)
    batches = length * 8 // 15 // 16  # about the epoch's batches (filter 4/5, expand x 2/3)
    for stop in sorted(rng.randrange(batches) for _ in range(points)):
        pipe = build(length)
        start = time.perf_counter()
        with pipe.open() as run:
            for _ in itertools.islice(run, stop):
                pass
            state = pipe.state_dict()
        elapsed = time.perf_counter() - start
        mark = state["positions"]["mark"]
        rows.append([f"{stop:,}", f"{mark:,}", f"{len(state['positions']['ranges']):,}",
                     f"{len(json.dumps(state)):,}", f"{elapsed:.1f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls and points")
    args = parser.parse_args()
    logging.getLogger("asyncflow").setLevel(logging.ERROR)  # the failures are on purpose
    length = 1_000_000
    calls = 50 if args.quick else 200
    print("1. state_dict() with items in flight")
    headers = ["consumer", "items in flight", "median ms", "median CPU ms", "max ms",
               "waited > 1 ms", "state bytes"]
    print("all stages:")
    print(table(headers, save_time(build(length), calls)))
    print("shuffle(buffer_size=1000).batch(16):")
    print(table(headers, save_time(
        Pipeline(range(length)).shuffle(buffer_size=1000, seed=1).batch(16), calls)))
    print("map(ordered=False, concurrency=8).batch(16).prefetch(64):")
    print(table(headers, save_time(
        Pipeline(range(length)).map(shaky, concurrency=8, ordered=False).batch(16)
        .prefetch(64).with_options(max_failures=1.0), calls)))
    print()
    print(f"2. state size, a {length:,}-item source interrupted at random points")
    print(table(["batches read", "watermark", "ranges above it", "state bytes", "run s"],
                state_size(length, 1 if args.quick else 3)))


if __name__ == "__main__":
    main()
