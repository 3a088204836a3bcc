"""Host-to-device transfer: GB/s pinned vs pageable, and how much of it compute hides.

Needs a CUDA GPU. Run ``python benchmarks/bench_transfer.py [--mb 64] [--batches 32]
[--json out.json]``. It reports:

- raw ``tensor.to("cuda")`` throughput from pageable memory and from pinned memory;
- ``Pipeline(...).to_device("cuda")`` throughput from pageable batches (staged through the
  pinned pool) and from batches that are already pinned;
- for each of those two sources, the fraction of the transfer time hidden behind a matmul
  loop on the default stream: ``(copy + compute - both) / copy``, where ``both`` runs the
  loop while batches arrive (1.0: the copies cost nothing; 0.0: they add their full time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from asyncflow import Pipeline


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    """The median wall time of ``fn`` over ``repeat`` runs, the GPU drained before and after."""
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def raw_copy(sources: list[torch.Tensor], non_blocking: bool) -> Callable[[], Any]:
    def run() -> None:
        for t in sources:
            t.to("cuda", non_blocking=non_blocking)

    return run


def pipeline_copy(pipe: Pipeline, per_batch: int, a: torch.Tensor) -> Callable[[], Any]:
    def run() -> None:
        for batch in pipe:
            for _ in range(per_batch):
                a @ a
            batch[:1].add_(1)  # touch the batch on the consumer's stream

    return run


def overlap(pipe: Pipeline, n: int, a: torch.Tensor, one_mm: float) -> dict[str, float]:
    copy_s = timed(pipeline_copy(pipe, 0, a))
    per_batch = max(1, round(copy_s / n / one_mm))
    compute_s = timed(lambda: [a @ a for _ in range(n * per_batch)])
    both_s = timed(pipeline_copy(pipe, per_batch, a))
    hidden = (copy_s + compute_s - both_s) / copy_s
    return {
        "copy_ms": copy_s * 1e3,
        "compute_ms": compute_s * 1e3,
        "both_ms": both_s * 1e3,
        "hidden_fraction": max(0.0, min(1.0, hidden)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="batch size in MiB")
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_transfer needs a CUDA GPU")

    n, numel = args.batches, args.mb << 18  # float32: 4 bytes
    gb = n * numel * 4 / 1e9
    pageable = [torch.full((numel,), float(i)) for i in range(n)]
    pinned = [t.pin_memory() for t in pageable]
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    from_pageable = Pipeline(pageable).to_device("cuda")
    from_pinned = Pipeline(pinned).to_device("cuda")
    for pipe in (from_pageable, from_pinned):  # warm up CUDA, the pool and the allocator
        for _ in pipe:
            pass
    one_mm = timed(lambda: [a @ a for _ in range(50)]) / 50

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "batch_mib": args.mb,
        "batches": n,
        "raw_pageable_gbps": gb / timed(raw_copy(pageable, False)),
        "raw_pinned_gbps": gb / timed(raw_copy(pinned, True)),
        "to_device_pageable_gbps": gb / timed(pipeline_copy(from_pageable, 0, a)),
        "to_device_pinned_gbps": gb / timed(pipeline_copy(from_pinned, 0, a)),
        "overlap_pageable": overlap(from_pageable, n, a, one_mm),
        "overlap_pinned": overlap(from_pinned, n, a, one_mm),
    }
    print(f"{results['device']}, torch {results['torch']}, {n} batches of {args.mb} MiB")
    for key in ("raw_pageable", "raw_pinned", "to_device_pageable", "to_device_pinned"):
        print(f"  {key:<22} {results[key + '_gbps']:6.1f} GB/s")
    for key in ("overlap_pageable", "overlap_pinned"):
        o = results[key]
        print(
            f"  {key:<22} copy {o['copy_ms']:7.1f} ms  compute {o['compute_ms']:7.1f} ms  "
            f"both {o['both_ms']:7.1f} ms  hidden {o['hidden_fraction']:.0%}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
