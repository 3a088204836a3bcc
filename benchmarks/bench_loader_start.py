"""Loader start-up: time and memory to the first batch, asyncflow.DataLoader vs torch's.

    python benchmarks/bench_loader_start.py [--quick] [--n 10000000] [--epoch-n 1000000]
    asyncflow bench loader_start [--quick]

The dataset is ``range(N)`` (a map-style dataset: ``__len__`` is N, ``__getitem__(i)``
returns ``i``; it costs no memory of its own and pickles to worker processes), batch 64,
``default_collate``. Contenders, side by side in one run: torch DataLoader
(``num_workers=0``), asyncflow.DataLoader with ``num_workers=0`` and with its defaults, and,
shuffled, asyncflow.DataLoader given a ``torch.Generator`` (the order torch's would draw).
Each runs in a fresh child process of its own, unshuffled and shuffled:

- first batch: seconds from constructing the loader to receiving its first batch;
- peak RSS increase: this process's ``VmHWM`` (``/proc/self/status``) when the first batch
  arrives, less its ``VmRSS`` after the imports; the high-water mark is reset after the
  imports (``/proc/self/clear_refs``), so import-time peaks do not hide the loader's;
- epoch (at ``--epoch-n`` items, smaller): seconds from constructing the loader to the end
  of one whole epoch.

Worker processes (asyncflow's defaults on 4 or more cores) are not in the per-process
figure; the peak RSS of the whole process tree, sampled every 20 ms, is in the JSON.
Repeats are interleaved; the least time and the largest memory are kept. Ratios are
asyncflow / torch for the same order. Writes ``benchmarks/results/bench_loader_start.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BATCH = 64

ROWS = [  # (kind, label, orders it runs in)
    ("torch", "torch DataLoader(num_workers=0)", (False, True)),
    ("asyncflow-0", "asyncflow.DataLoader(num_workers=0)", (False, True)),
    ("asyncflow", "asyncflow.DataLoader (defaults)", (False, True)),
    ("asyncflow-0-generator", "asyncflow.DataLoader(num_workers=0, generator=g)", (True,)),
]


# -- one contender, in a child process -------------------------------------------------------


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name):
                return int(line.split()[1])
    return 0


def _make(kind: str, n: int, shuffle: bool) -> Any:
    import torch

    import asyncflow

    dataset = range(n)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle,
                                           num_workers=0)
    if kind == "asyncflow-0-generator":
        return asyncflow.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=0,
                                    generator=torch.Generator().manual_seed(0))
    workers = {"num_workers": 0} if kind == "asyncflow-0" else {}
    return asyncflow.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, seed=0, **workers)


def child(kind: str, n: int, shuffle: bool, job: str) -> dict[str, Any]:
    """Build one loader and time its first batch (``job="first"``) or whole epoch."""
    import gc

    import torch

    import asyncflow  # noqa: F401  (imported before the baseline, as torch is)

    gc.collect()
    baseline = _status_kib("VmRSS:")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    start = time.perf_counter()
    loader = _make(kind, n, shuffle)
    built = time.perf_counter() - start
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - start
    peak = _status_kib("VmHWM:")
    out: dict[str, Any] = {"construct_s": built, "first_batch_s": first_s}
    if not shuffle:
        assert torch.equal(first, torch.arange(BATCH)), first
    if job == "epoch":
        items = len(first) + sum(len(batch) for batch in it)
        assert items == n, (items, n)
        out["epoch_s"] = time.perf_counter() - start
        peak = _status_kib("VmHWM:")
    notes = list(loader.stats().notes) if hasattr(loader, "stats") else []
    if hasattr(it, "close"):
        it.close()
    return {**out, "baseline_rss": baseline * 1024, "peak_increase": (peak - baseline) * 1024,
            "hwm_reset": reset, "notes": notes}


# -- the run ---------------------------------------------------------------------------------


def _race(kind: str, n: int, shuffle: bool, job: str) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from bench_images import _env, run_child

    cmd = [sys.executable, __file__, "--child", kind, "--n", str(n), "--job", job]
    result, (tree_peak,) = run_child(cmd + ["--shuffle"] * shuffle, _env(), timeout=600)
    return {**result, "tree_peak_rss": tree_peak}


def _keep(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The least time and the largest memory of the repeats."""
    if old is None or "error" in old:
        return new
    if "error" in new:
        return old
    merged = dict(old)
    for key in ("construct_s", "first_batch_s", "epoch_s"):
        if key in new:
            merged[key] = min(old[key], new[key])
    for key in ("peak_increase", "tree_peak_rss", "others"):
        merged[key] = max(old[key], new[key])
    return merged


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _ratio(ours: float | None, theirs: float | None, floor: float = 0.0) -> str:
    if ours is None or theirs is None:
        return ""
    if theirs <= floor:
        return "n/a (torch ~0)"
    return f"{ours / theirs:.2f}x"


def _report(results: dict[tuple[str, bool, str], dict[str, Any]], n: int, epoch_n: int,
            repeats: int) -> str:
    from _common import table

    rows = []
    notes: set[str] = set()
    for shuffle in (False, True):
        base = results.get(("torch", shuffle, "first"), {})
        base_epoch = results.get(("torch", shuffle, "epoch"), {})
        for kind, label, orders in ROWS:
            if shuffle not in orders:
                continue
            r = results.get((kind, shuffle, "first"), {})
            e = results.get((kind, shuffle, "epoch"), {})
            order = "shuffled" if shuffle else "in order"
            if "error" in r:
                rows.append([label, order, f"failed: {r['error'][:80]}", "", "", "", "", ""])
                continue
            notes.update(f"{label}: {note}" for note in r.get("notes", []))
            own = kind == "torch"
            epoch = f"{e['epoch_s']:.3f}" if "epoch_s" in e else e.get("error", "")[:40]
            rows.append([
                label, order, f"{r['first_batch_s']:.3f}",
                "" if own else _ratio(r["first_batch_s"], base.get("first_batch_s")),
                _mib(r["peak_increase"]),
                "" if own else _ratio(r["peak_increase"], base.get("peak_increase"), 2**20),
                epoch, "" if own else _ratio(e.get("epoch_s"), base_epoch.get("epoch_s")),
            ])
    others = max((r.get("others", 0.0) for r in results.values()), default=0.0)
    cores = len(os.sched_getaffinity(0))
    reset = all(r.get("hwm_reset", True) for r in results.values())
    parts = [
        f"Loader start-up, range({n:,}) as the dataset, batch {BATCH}, {cores} usable cores; "
        f"best of {repeats} interleaved run(s), each in a fresh process. First batch: seconds "
        "from constructing the loader to receiving the first batch. Peak RSS increase: "
        "VmHWM at the first batch less VmRSS after the imports"
        + ("" if reset else " (VmHWM could not be reset after the imports)")
        + f". Epoch: seconds for one whole epoch at {epoch_n:,} items. Ratios: asyncflow / "
        "torch DataLoader in the same order.",
        "",
        table(["loader", "order", "first batch (s)", "vs torch", "peak RSS increase",
               "vs torch", f"epoch (s), {epoch_n:,}", "vs torch"], rows),
        "",
        *(f"Note, {note}" for note in sorted(notes)),
        f"Other programs kept up to {others:.2f} of {cores} cores busy during the runs"
        + (": the times are unreliable; run again on an idle machine." if others > 0.2 else "."),
    ]
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N 1,000,000, epoch 100,000")
    parser.add_argument("--n", type=int, help="items for the first batch (default 10,000,000)")
    parser.add_argument("--epoch-n", type=int,
                        help="items for the whole epoch (default 1,000,000; quick 100,000; "
                        "0 skips it)")
    parser.add_argument("--repeat", type=int, help="interleaved repeats (default 2; quick 1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--shuffle", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", default="first", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = args.n or (1_000_000 if args.quick else 10_000_000)
    if args.child:
        print(json.dumps(child(args.child, n, args.shuffle, args.job)))
        return
    epoch_n = (100_000 if args.quick else 1_000_000) if args.epoch_n is None else args.epoch_n
    repeats = args.repeat or (1 if args.quick else 2)

    results: dict[tuple[str, bool, str], dict[str, Any]] = {}
    jobs = [("first", n)] + ([("epoch", epoch_n)] if epoch_n else [])
    for rep in range(repeats):
        for job, size in jobs:
            for shuffle in (False, True):
                for kind, label, orders in ROWS:
                    if shuffle not in orders:
                        continue
                    order = "shuffled" if shuffle else "in order"
                    print(f"  {label}, {order}, {job} at {size:,} ({rep + 1}/{repeats}) ...",
                          flush=True)
                    key = (kind, shuffle, job)
                    results[key] = _keep(results.get(key), _race(kind, size, shuffle, job))

    report = _report(results, n, epoch_n, repeats)
    print("\n" + report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_loader_start.md").write_text(report + "\n")
    (RESULTS / "bench_loader_start.json").write_text(json.dumps({
        "n": n, "epoch_n": epoch_n, "batch_size": BATCH, "repeats": repeats,
        "cores": len(os.sched_getaffinity(0)),
        "results": [{"loader": k, "shuffle": s, "job": j, **r} for (k, s, j), r in results.items()],
    }, indent=1, default=str))
    print(f"\nwrote {RESULTS / 'bench_loader_start.md'} and .json")


if __name__ == "__main__":
    main()
