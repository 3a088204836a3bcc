"""The run loop's longest callback on the paths that used to block it (issue 13, point 13).

    python benchmarks/bench_loop.py [--quick]

Each row runs one pipeline and reports ``stats().loop_delay_max``: how late the run's event
loop was to wake up at worst, which bounds the longest callback that held it. The paths:

- tar shards, plain and gzip (``sources.tar_samples``: inflating and header parsing run on a
  worker thread, the loop only hands bytes over);
- a cache's filling epoch (writes, fsync, mapping) and its replays, in stored order and
  shuffled (checks and mapping off the loop).

The target is no callback over 10 ms. A loaded machine delays wake-ups by itself: the table
also shows a pipeline of no-op async stages as the floor of what the machine adds.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import io
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from asyncflow import Pipeline, sources  # noqa: E402


def _shard(path: Path, members: int, size: int, compress: bool) -> Path:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(members):
            for ext, data in (("jpg", rng.bytes(size)), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    if compress:
        data = gzip.compress(data, compresslevel=1)
        path = path.with_suffix(".tar.gz")
    path.write_bytes(data)
    return path


async def _noop(x: Any) -> Any:
    await asyncio.sleep(0)
    return x


def _run(pipe: Pipeline) -> tuple[int, float, float]:
    start = time.perf_counter()
    n = sum(1 for _ in pipe)
    return n, time.perf_counter() - start, pipe.stats().loop_delay_max


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller shards and cache")
    args = parser.parse_args()
    members, size = (500, 50_000) if args.quick else (2_000, 100_000)
    rows: list[tuple[str, int, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        floor = Pipeline(range(20_000)).map(_noop, concurrency=8).map(_noop)
        rows.append(("no-op async stages (the machine's floor)", *_run(floor)))
        for compress in (False, True):
            shards = [_shard(root / f"s{i}.tar", members // 4, size, compress) for i in range(4)]
            pipe = Pipeline([str(s) for s in shards]).flat_map(sources.tar_samples,
                                                               concurrency=2)
            label = f"tar shards, {'gzip' if compress else 'plain'}, 4 x {members // 4} samples"
            rows.append((label, *_run(pipe)))

        items = 256 if args.quick else 1024

        def source() -> Any:
            rng = np.random.default_rng(1)
            return ((rng.integers(0, 255, (3, 224, 224), np.uint8), i) for i in range(items))

        cached = Pipeline(source).batch(32).cache(root / "cache")
        rows.append((f"cache, filling epoch ({items} images of 150 KB)", *_run(cached)))
        for label, pipe in (("cache, replay in stored order", cached),
                            ("cache, replay shuffled", cached.shuffle(seed=0))):
            runs = [_run(pipe) for _ in range(30)]  # a replay is shorter than one sample
            rows.append((f"{label}, 30 epochs", sum(r[0] for r in runs),
                         sum(r[1] for r in runs), max(r[2] for r in runs)))
    print(f"Run-loop delay, {os.cpu_count()} cores (target: no callback over 10 ms)\n")
    print("| path | items | seconds | longest loop delay |")
    print("|---|---:|---:|---:|")
    for label, n, seconds, delay in rows:
        print(f"| {label} | {n} | {seconds:.2f} | {delay * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
