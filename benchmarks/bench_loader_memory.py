"""Memory of ``asyncflow.DataLoader`` on worker processes against torch's DataLoader (issue 23).

How to run::

    python benchmarks/bench_loader_memory.py                 # both jobs, 3 interleaved runs
    python benchmarks/bench_loader_memory.py --runs 1 --jobs array
    python benchmarks/bench_loader_memory.py --jobs images --kinds torch,asyncflow
    python benchmarks/bench_loader_memory.py --quick         # one run, a 32 MiB array

Each contender runs in a child process of its own, which measures its process tree itself: the
PSS summed over the tree (``/proc/<pid>/smaps_rollup``), sampled every 50 ms, its peak less the
child's own PSS just before the loader was built (after the imports and the dataset). The peak's
split by role (the parent, the forkserver, the resource tracker, the workers) says where the
memory went. Shared-memory files nobody maps are in no process's PSS: the ``shm`` column adds
this run's files in ``/dev/shm`` at the peak. Nor are pages mapped and never read: torch's
parent maps each batch it receives without touching it, so with this do-nothing consumer its
batches never enter its PSS (nor asyncflow's, which maps them alike). The column "with each
shared-memory file at its size" counts them
(the tree's anonymous and file PSS, plus every ``/dev/shm`` file the tree maps or holds at its
size: ``_tree_mib``), and ``--touch`` makes the consumer read each batch (a sum), as a
training step does. The last column is each row's median time for
its 2 epochs, start-up included: a memory saving that costs speed shows there. Kinds
``asyncflow`` (the default start: fork where safe, else the forkserver; the lines under the
table say which it got), ``asyncflow-fork``, ``asyncflow-forkserver``, ``torch``, ``folder``
(decoders forked where safe, else from the forkserver, as the default), ``folder-forkserver``.

Jobs, both with 4 workers, ``persistent_workers=True``, 2 epochs:

* ``images``: the issue's setup, 1,024 photo-derived JPEGs (``_imagedata.py``) read by a PIL
  Dataset (``_loaders._Folder``: resize 224, centre crop), batches of 32, normalized float32;
* ``images`` also for ``image.folder(train=True)`` with its defaults (a random-resized crop);
* ``array``: an in-memory Dataset, one ``--array-mib`` MiB uint8 array, rows as float32.

``--worker-gc`` gives the DataLoaders a ``worker_init_fn`` that runs a full garbage collection
in each worker as it starts: what a long run's workers do sooner or later (a full collection
comes once enough objects have outlived the younger ones), brought into two epochs. A forked
worker's collection touches every object it inherited, and so copies their pages, unless they
were frozen (``gc.freeze()``: asyncflow's fork template does it).

``--count`` also counts, as each batch is taken, the batches this process maps from shared
memory (its ``/dev/shm`` mappings of this run's segments, in units of the batch just taken):
the one in hand, those the loader has received and holds for later (out of order, queued).
Reading ``/proc/self/maps`` per batch costs about a millisecond, so the seconds column is
not comparable with a run without it.

Under the table, each row's median run says when its peak came: after which batch the consumer
took (epoch, batch), how many milliseconds after that take, and the shared memory the loader's
process mapped then, in batches. ``--unordered`` gives both DataLoaders ``in_order=False``:
with no batch waiting for an earlier one, what the loader's process holds beyond the
consumer's batch is the hand-off's alone. ``--default-collate`` makes the ``images`` job's
Dataset return normalized float32 samples and leaves ``collate_fn`` unset, so that torch's
``default_collate`` stacks them (as most training code does): in a worker process it stacks
into torch's shared memory, a new mapping per batch. (The ``array`` job's rows always go
through ``default_collate``, in batches of 128 KiB.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

KINDS = {"torch": "torch DataLoader",
         "asyncflow": 'asyncflow.DataLoader(workers="processes"), default: fork where safe',
         "asyncflow-fork": 'the same, multiprocessing_context="fork"',
         "asyncflow-forkserver": 'the same, multiprocessing_context="forkserver"',
         "folder": "image.folder(train=True), defaults",
         "folder-kernel": "the same, normalized in the decoders (float32 rows, before)",
         "folder-forkserver": "image.folder(train=True), decoders from the forkserver (before)"}


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    kids = [int(c) for c in fh.read().split()]
                found += kids
                todo += kids
        except OSError:
            continue
    return found


def _pss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _split_mib(pid: int) -> list[float]:
    """``pid``'s PSS in anonymous memory, files and shared memory (``smaps_rollup``)."""
    fields = {"Pss_Anon:": 0, "Pss_File:": 1, "Pss_Shmem:": 2}
    out = [0.0, 0.0, 0.0]
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key in fields:
                    out[fields[key]] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def _role(pid: int, me: int) -> str:
    if pid == me:
        return "parent"
    try:
        with open(f"/proc/{pid}/cmdline") as fh:
            cmd = fh.read()
    except OSError:
        return "worker"
    for role in ("resource_tracker", "forkserver"):
        if role in cmd and _parent_of(pid) == me:
            return role
    if _parent_of(pid) == me and _descendants(pid):
        return "forkserver"  # a fork pool's template: the forkserver's part for fork
    return "worker"


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _run_files() -> list[str]:
    return [entry.path for entry in os.scandir("/dev/shm")
            if entry.name.startswith((f"asyncflow-{os.getpid()}-", "torch_"))]


def _shm_mib() -> float:
    total = 0
    for path in _run_files():
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total / 2**20


#: Shared-memory files of this size or more are batches (or slabs), not status pages.
_BATCH_FILE = 1 << 20


def _tree_mib(pids: list[int]) -> tuple[dict[int, list[float]], float, dict[str, Any]]:
    """The tree's memory with each shared-memory file counted once, at its size, whoever maps
    it and whether or not its pages were touched: the tree's anonymous and file PSS, plus the
    files in ``/dev/shm`` that its processes map or hold a descriptor of, and this run's
    named files there.

    PSS misses such files two ways. Nobody maps them: torch's workers send each batch as an
    unlinked file whose descriptor waits in the worker (``resource_sharer``) or the parent's
    queue until the batch is taken, and asyncflow's segments wait named until received.
    Or they are mapped but not touched: torch's parent maps each batch it receives from its
    descriptor without reading it (its pages enter the parent's PSS only as they are read),
    so a consumer that never reads a batch, this benchmark's, shows none of them, neither
    the one in hand nor those received out of order and kept for later; asyncflow's parent
    maps its segments the same way now (before 2026-11-27 it mapped them populated, so all
    of its counted). Counted here at their size: what they hold in
    the machine. (Shared memory outside ``/dev/shm``, anonymous shared maps, is left out:
    none of these loaders makes any of size.)

    Returns each process's ``_split_mib``, the tree's memory so counted (each process's
    mappings read right after its PSS, so that a batch freed meanwhile is in neither), and
    where the batch-sized files (``_BATCH_FILE``) are: for each process, how many it maps
    and how many more it holds only as a descriptor (``files``), and how many wait named
    with no process of the tree mapping or holding them (``loose``).
    """
    splits: dict[int, list[float]] = {}
    sizes: dict[int, int] = {}
    files: dict[int, list[int]] = {}
    for pid in pids:
        splits[pid] = _split_mib(pid)
        mapped: dict[int, int] = {}
        held: dict[int, int] = {}
        try:
            with open(f"/proc/{pid}/maps") as fh:
                for line in fh:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                        lo, hi = parts[0].split("-")
                        ino = int(parts[4])
                        mapped[ino] = max(mapped.get(ino, 0), int(hi, 16) - int(lo, 16))
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    held[st.st_ino] = st.st_blocks * 512
            except OSError:
                continue
        for ino, size in [*mapped.items(), *held.items()]:
            sizes[ino] = max(sizes.get(ino, 0), size)
        files[pid] = [sum(size >= _BATCH_FILE for size in mapped.values()),
                      sum(size >= _BATCH_FILE for ino, size in held.items() if ino not in mapped)]
    loose = 0
    for path in _run_files():
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_ino not in sizes and st.st_blocks * 512 >= _BATCH_FILE:
            loose += 1
        sizes[st.st_ino] = st.st_blocks * 512
    own = sum(anon + files for anon, files, _ in splits.values())
    return splits, own + sum(sizes.values()) / 2**20, {"files": files, "loose": loose}


def _batch_bytes(batch: Any) -> int:
    return sum(t.nbytes for t in (batch if isinstance(batch, (tuple, list)) else [batch]))


def _mapped_batches(batch: Any) -> float:
    """The bytes this process maps from this run's shared memory, in units of ``batch``'s
    tensors' bytes (``--count``); asyncflow's one-page status file rounds away."""
    size = _batch_bytes(batch)
    mapped = 0
    with open("/proc/self/maps") as fh:
        for line in fh:
            if "/dev/shm/" in line and ("/asyncflow-" in line or "/torch_" in line):
                start, end = line.split(maxsplit=1)[0].split("-")
                mapped += int(end, 16) - int(start, 16)
    return round(mapped / max(size, 1), 1)


def _collect_garbage(worker_id: int) -> None:
    """``--worker-gc``'s ``worker_init_fn``."""
    import gc

    gc.collect()


def _loader(kind: str, job: str, array_mib: int, worker_gc: bool = False,
            unordered: bool = False, default_collate: bool = False) -> Any:
    import torch

    if job == "images":
        from _imagedata import build_dataset
        from _loaders import _collate_normalize, _Folder, _FolderFloat, list_images

        samples = list_images(str(build_dataset(1024)))
        dataset: Any = (_FolderFloat if default_collate else _Folder)(samples, 224)
        args: dict[str, Any] = {"batch_size": 32}
        if not default_collate:
            args["collate_fn"] = _collate_normalize
    else:
        from _memdata import ArrayRows

        dataset, args = ArrayRows(array_mib), {"batch_size": 32}
    args.update(num_workers=4, persistent_workers=True)
    if worker_gc:
        args["worker_init_fn"] = _collect_garbage
    if unordered:
        args["in_order"] = False
    if kind.startswith("folder"):  # its defaults: as many decoders as cores, processes from 2
        import asyncflow
        from asyncflow import image
        from asyncflow.image import _folder

        # "folder-kernel": float32 rows normalized by the decoders, as before uint8 rows
        _folder._NORMALIZE_IN_KERNEL = kind == "folder-kernel"

        # "folder-forkserver": the decoders start from the forkserver, as before they forked
        workers: Any = (asyncflow.Processes(persistent=True) if kind == "folder-forkserver"
                        else "auto")
        return image.folder(str(build_dataset(1024)), batch_size=32, size=224, train=True,
                            workers=workers)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **args)
    import asyncflow

    if kind in ("asyncflow-fork", "asyncflow-forkserver"):
        args["multiprocessing_context"] = kind.removeprefix("asyncflow-")
    return asyncflow.DataLoader(dataset, workers="processes", **args)


def sample(me: int) -> None:
    """Sample ``me``'s process tree (less this process) until a line comes; print the peak.

    A process of its own, not a thread of ``me``: a fork pool refuses to fork a process in
    which another Python thread runs. It is a fresh interpreter, sharing no heap with ``me``.
    """
    import select

    peak: dict[str, Any] = {"total": 0.0}
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0.05)[0]:
        splits, held, where = _tree_mib([p for p in [me, *_descendants(me)] if p != os.getpid()])
        tree = {p: sum(split) for p, split in splits.items()}
        if sum(tree.values()) > peak["total"]:
            roles: dict[str, float] = {}
            for pid, pss in tree.items():
                role = _role(pid, me)
                roles[role] = roles.get(role, 0.0) + pss
            peak.update(total=sum(tree.values()), roles=roles, shm=_shm_mib(), at=time.time(),
                        split=sorted([_role(pid, me), *splits[pid]] for pid in tree),
                        files=sorted([_role(pid, me), *where["files"].get(pid, [0, 0])]
                                     for pid in tree), loose=where["loose"])
        peak["held"] = max(peak.get("held", 0.0), held)
    print(json.dumps(peak), flush=True)


def child(kind: str, job: str, array_mib: int, worker_gc: bool = False,
          count: bool = False, touch: bool = False, unordered: bool = False,
          default_collate: bool = False) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    me = os.getpid()
    # the array job's data is made before the base is taken
    make = (_loader(kind, job, array_mib, worker_gc, unordered, default_collate)
            if job == "array" else None)
    sampler = subprocess.Popen([sys.executable, __file__, "--sample", str(me)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert sampler.stdout is not None and sampler.stdin is not None
    sampler.stdout.readline()
    base, base_split = _pss_mib(me), _split_mib(me)
    loader = make if make is not None else _loader(kind, job, array_mib, worker_gc, unordered,
                                                   default_collate)
    counts: dict[str, int] = {}
    takes: list[tuple[float, int, int]] = []  # when each batch was taken: time, epoch, index
    start = time.perf_counter()
    for epoch in range(2):
        for index, _batch in enumerate(loader):
            takes.append((time.time(), epoch, index))
            if touch:
                for tensor in _batch if isinstance(_batch, (tuple, list)) else [_batch]:
                    tensor.sum()
            if count:
                held = str(_mapped_batches(_batch))
                counts[held] = counts.get(held, 0) + 1
    seconds = time.perf_counter() - start
    sampler.stdin.write("stop\n")  # not an end of file: forked workers hold the pipe too
    sampler.stdin.flush()
    peak: dict[str, Any] = json.loads(sampler.stdout.readline())
    sampler.stdin.close()
    sampler.wait()
    roles = peak.get("roles", {})
    roles["parent"] = roles.get("parent", base) - base
    before = [t for t in takes if t[0] <= peak.get("at", 0.0)]
    peak_at = [before[-1][1], before[-1][2], (peak["at"] - before[-1][0]) * 1e3] if before else []
    # how the default started its workers (fork, or the forkserver and why): its run's notes
    start = ([n for n in loader.stats().notes if "worker processes" in n]
             if kind in ("asyncflow", "folder") else [])
    # image.folder's float batches (normalized at release): kept, spares, waits for one
    floats = getattr(getattr(loader, "_assembler", None), "_floats", None)
    if floats is not None:
        pool = floats.stats()
        start.append(f"float batches: {pool.buffers} kept, {pool.spares} spares, "
                     f"{floats.waits} waits ({floats.waited * 1e3:.0f} ms)")
    return {"kind": kind, "job": job, "above": peak["total"] - base, "roles": roles,
            "shm": peak.get("shm", 0.0), "seconds": seconds,
            "held": peak.get("held", base) - base, "start": start,
            "split": peak.get("split", []), "base_split": base_split, "counts": counts,
            "peak_at": peak_at, "batch_mib": _batch_bytes(_batch) / 2**20 if takes else 0.0,
            "files": peak.get("files", []), "loose": peak.get("loose", 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", default="images,array")
    parser.add_argument("--kinds", default="torch,asyncflow,folder",
                        help="a subset of " + ",".join(KINDS))
    parser.add_argument("--array-mib", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="one run, a 32 MiB array")
    parser.add_argument("--worker-gc", action="store_true",
                        help="a full garbage collection in each DataLoader worker as it starts")
    parser.add_argument("--touch", action="store_true",
                        help="the consumer reads each batch (sums it), as a training step does")
    parser.add_argument("--count", action="store_true",
                        help="count the batches this process maps as each one is taken")
    parser.add_argument("--unordered", action="store_true",
                        help="in_order=False for both DataLoaders: no batch waits for another")
    parser.add_argument("--default-collate", action="store_true",
                        help="images: float32 samples stacked by torch's default_collate")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "JOB"))
    parser.add_argument("--sample", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample:
        sample(args.sample)
        return
    if args.quick:
        args.runs, args.array_mib = 1, 32
    if args.child:
        print(json.dumps(child(*args.child, args.array_mib, args.worker_gc, args.count,
                                args.touch, args.unordered, args.default_collate)))
        return
    if "images" in args.jobs.split(","):
        # Built here, before any row: a child that built it would count the builder's
        # processes as its loader's (on a fresh 16-core box, torch's row did: 16 of them).
        from _imagedata import build_dataset

        build_dataset(1024)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for job in args.jobs.split(","):
        for _ in range(args.runs):
            for kind in args.kinds.split(","):  # interleaved: drift hits every row alike
                if kind.startswith("folder") and job != "images":
                    continue
                out = subprocess.run(
                    [sys.executable, "-W", "ignore", __file__, "--child", kind, job,
                     "--array-mib", str(args.array_mib), *["--worker-gc"] * args.worker_gc,
                     *["--count"] * args.count, *["--touch"] * args.touch,
                     *["--unordered"] * args.unordered,
                     *["--default-collate"] * args.default_collate],
                    capture_output=True, text=True, check=True, timeout=600,
                )
                results.setdefault((job, kind), []).append(json.loads(out.stdout))
    print("| job | loader | PSS above the parent, runs | median | vs torch | shm at peak "
          "| where (median run): parent, forkserver, tracker, workers "
          "| with each shared-memory file at its size: median, vs torch | seconds (median) |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|")
    for (job, kind), runs in results.items():
        above = sorted(r["above"] for r in runs)
        torch_runs = results.get((job, "torch"), runs)  # without torch's row: vs the row itself
        torch_median = statistics.median(r["above"] for r in torch_runs)
        held = statistics.median(r["held"] for r in runs)
        torch_held = statistics.median(r["held"] for r in torch_runs)
        mid = sorted(runs, key=lambda r: r["above"])[len(runs) // 2]
        where = ", ".join(f"{mid['roles'].get(r, 0):.0f}"
                          for r in ("parent", "forkserver", "resource_tracker", "worker"))
        print(f"| {job} | {KINDS[kind]} | {', '.join(f'{a:.0f}' for a in above)} MiB "
              f"| {statistics.median(above):.0f} MiB "
              f"| {statistics.median(above) / torch_median:.2f}x | {mid['shm']:.0f} MiB "
              f"| {where} | {held:.0f} MiB, {held / torch_held:.2f}x "
              f"| {statistics.median(r['seconds'] for r in runs):.1f} |")
    print("\nAt the peak of each row's median run, each process's PSS (MiB): anonymous, files, "
          "shared memory (the parent's before the loader: its first line)")
    for (job, kind), runs in results.items():
        mid = sorted(runs, key=lambda r: r["above"])[len(runs) // 2]
        procs = [["parent before", *mid["base_split"]], *mid["split"]]
        print(f"- {job}, {kind}: " + "; ".join(
            f"{role} {anon:.0f}/{files:.0f}/{shm:.0f}" for role, anon, files, shm in procs))
    print("\nWhen each row's median run peaked: after the consumer took which batch (epoch, "
          "batch), how long after, and the shared memory the loader's process mapped then")
    for (job, kind), runs in results.items():
        mid = sorted(runs, key=lambda r: r["above"])[len(runs) // 2]
        if mid.get("peak_at"):
            shm = sum(s[3] for s in mid["split"] if s[0] == "parent")
            epoch, index, after = mid["peak_at"]
            print(f"- {job}, {kind}: epoch {epoch}, batch {index}, {after:.0f} ms after; "
                  f"{shm:.0f} MiB ({shm / max(mid['batch_mib'], 1e-9):.1f} batches)")
    print("\nWhere the batches were at each row's median run's peak (shared-memory files of "
          f"{_BATCH_FILE >> 20} MiB or more): per process, mapped + held only as a descriptor; "
          "then those waiting named, in no process")
    for (job, kind), runs in results.items():
        mid = sorted(runs, key=lambda r: r["above"])[len(runs) // 2]
        print(f"- {job}, {kind}: " + "; ".join(
            f"{role} {mapped}+{fds}" for role, mapped, fds in mid.get("files", []))
            + f"; named {mid.get('loose', 0)}")
    if args.count:
        print("\nBatches mapped in the loader's process as each batch is taken (the one taken "
              "included), over every run: count x times; mean")
        for (job, kind), runs in results.items():
            merged: dict[float, int] = {}
            for r in runs:
                for held, times in r["counts"].items():
                    merged[float(held)] = merged.get(float(held), 0) + times
            total = sum(merged.values()) or 1
            mean = sum(h * t for h, t in merged.items()) / total
            print(f"- {job}, {kind}: " + ", ".join(
                f"{h:g} x {t}" for h, t in sorted(merged.items())) + f"; mean {mean:.2f}")
    for (job, kind), runs in results.items():
        for note in sorted({n for r in runs for n in r.get("start", [])
                            if not n.startswith("float batches")}):
            print(f"- {job}, {kind}: {note}")
        floats = [n for r in runs for n in r.get("start", []) if n.startswith("float batches")]
        if floats:
            print(f"- {job}, {kind}, each run: " + "; ".join(floats))


if __name__ == "__main__":
    main()
