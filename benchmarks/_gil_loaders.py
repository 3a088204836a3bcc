"""The contenders that ``bench_gil.py`` races, each run in a child process of its own.

Run as ``python benchmarks/_gil_loaders.py KIND --root R --workers W --ms N``; prints one
JSON line. The job is ``_loaders.py``'s (decode, resize the shorter side to 224, centre-crop,
batches of 32, normalized float32 NCHW), read by a consumer that spends ``N`` ms of pure
Python per batch, calibrated on an idle thread before the loader starts: that is what a
training step's own Python does to the GIL. Timed over whole epochs after a warm-up epoch.

A contender whose ``workers=`` argument the installed asyncflow does not take yet prints
``{"na": reason}`` instead of failing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _loaders import _collate_normalize, _Folder, list_images, tree_cpu_seconds

Make = Callable[[str, int, int, int], Any]


# -- the contenders: each returns the object to iterate once per epoch ------------------------


def torch_dataloader(root: str, size: int, batch: int, workers: int) -> Any:
    return torch.utils.data.DataLoader(
        _Folder(list_images(root), size), batch_size=batch, num_workers=workers,
        collate_fn=_collate_normalize, persistent_workers=workers > 0,
    )


def _folder(mode: str | None, in_kernel: bool = False) -> Make:
    def make(root: str, size: int, batch: int, workers: int) -> Any:
        from asyncflow import image
        from asyncflow.image import _folder

        _folder._NORMALIZE_IN_KERNEL = in_kernel  # float32 rows, as before issue 23's change

        extra: dict[str, Any] = {} if mode is None else {"workers": mode}
        return image.folder(root, batch_size=batch, size=size, decode_concurrency=workers,
                            **extra)

    return make


def _loader(mode: str | None) -> Make:
    def make(root: str, size: int, batch: int, workers: int) -> Any:
        import asyncflow

        extra: dict[str, Any] = {} if mode is None else {"workers": mode}
        if mode == "processes":
            extra["persistent_workers"] = True  # as the torch DataLoader row
        return asyncflow.DataLoader(
            _Folder(list_images(root), size), batch_size=batch, num_workers=workers,
            collate_fn=_collate_normalize, **extra,
        )

    return make


KINDS: dict[str, Make] = {
    "torch": torch_dataloader,
    "folder": _folder(None),
    "folder-threads": _folder("threads"),
    "folder-processes": _folder("processes"),
    "folder-kernel": _folder(None, in_kernel=True),  # the defaults, normalized by the decoders
    "loader": _loader(None),
    "loader-threads": _loader("threads"),
    "loader-processes": _loader("processes"),
}


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def calibrate(ms: float) -> int:
    """Loop iterations of :func:`_spin` that take ``ms`` on this thread, alone."""
    if ms <= 0:
        return 0
    n, best = 20_000, float("inf")
    for _ in range(5):
        start = time.thread_time()
        _spin(n)
        best = min(best, time.thread_time() - start)
    return max(1, round(n * ms / 1000 / best))


def _mode_notes(obj: Any) -> list[str]:
    """What the loader says about its workers (which mode "auto" picked), if it says."""
    found: list[str] = []
    try:
        stats = obj.stats()
        found += [str(n) for n in getattr(stats, "notes", ())]
    except Exception:
        pass
    try:
        for stage in obj.describe():
            for key in ("workers", "executor", "mode"):
                if key in stage:
                    found.append(f"{stage.get('name', '?')}: {key}={stage[key]}")
    except Exception:
        pass
    for attr in ("workers", "worker_mode", "mode"):
        value = getattr(obj, attr, None)
        if isinstance(value, str):
            found.append(f"{attr}={value}")
    return found


def race(kind: str, root: str, size: int, batch: int, workers: int, ms: float,
         epochs: int) -> dict[str, Any]:
    torch.set_num_threads(1)  # the decode workers own the cores; collate is per batch
    spins = calibrate(ms)
    try:
        loader = KINDS[kind](root, size, batch, workers)
    except TypeError as exc:
        if "workers" not in str(exc):
            raise
        return {"kind": kind, "na": f"{type(exc).__name__}: {exc}"}
    rates, cpu_ms, consumer = [], [], []
    n = 0
    for epoch in range(1 + epochs):
        n, spent = 0, 0.0
        cpu0, start = tree_cpu_seconds(), time.perf_counter()
        for _images, labels in loader:
            n += len(labels)
            if spins:
                t0 = time.perf_counter()
                _spin(spins)
                spent += time.perf_counter() - t0
        seconds, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu0
        if epoch > 0:
            rates.append(n / seconds)
            cpu_ms.append(1000 * cpu / n)
            consumer.append(spent / seconds)
    best = max(range(len(rates)), key=rates.__getitem__)
    return {
        "kind": kind, "workers": workers, "ms": ms, "images": n, "img_per_s": rates[best],
        "rates": rates, "cpu_ms_per_img": min(cpu_ms), "consumer_busy": consumer[best],
        "modes": _mode_notes(loader),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--root", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--ms", type=float, default=0.0, help="consumer's Python per batch")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(argv)
    result = race(args.kind, args.root, args.size, args.batch_size, args.workers, args.ms,
                  args.epochs)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
