"""Where a DataLoader's memory is, process by process, at fixed batches (issue 23).

How to run::

    python benchmarks/profile_loader_memory.py asyncflow      # or: torch
    python benchmarks/profile_loader_memory.py torch --at 1:0,1:20

``bench_loader_memory.py``'s images job (4 workers, persistent, batches of 32 normalized
float32), in this process. Before the loader and as the consumer takes each batch named by
``--at`` (``epoch:batch``), it prints each process of the tree with its PSS and its
``Private_Dirty`` (MiB) by kind of mapping (``/proc/PID/smaps``): the malloc heap, other
anonymous memory, shared memory (``/dev/shm``) and files. Reading every process's smaps takes
tens of milliseconds, during which batches keep arriving: the loader's process may show a
batch or two more than it would hold otherwise.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader_memory as bench

KINDS = ("heap", "anon", "shm", "file")


def _kind(fields: list[str]) -> str:
    name = fields[5] if len(fields) > 5 else ""
    if name.startswith("/dev/shm/"):
        return "shm"
    if name.startswith("/"):
        return "file"
    return "heap" if name == "[heap]" else "anon"


def smaps(pid: int) -> dict[tuple[str, str], float]:
    """``pid``'s ``Pss`` and ``Private_Dirty`` (MiB) by kind of mapping."""
    out: dict[tuple[str, str], float] = collections.Counter()
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as fh:
            for line in fh:
                fields = line.split()
                if "-" in fields[0] and not fields[0].endswith(":"):
                    kind = _kind(fields)
                elif fields[0] in ("Pss:", "Private_Dirty:"):
                    out[(kind, fields[0][:-1])] += int(fields[1]) / 1024
    except OSError:
        pass
    return out


def show(me: int, tag: str) -> None:
    rows = [(bench._role(pid, me), smaps(pid)) for pid in [me, *bench._descendants(me)]]
    total = sum(v for _, s in rows for (k, field), v in s.items() if field == "Pss")
    print(f"{tag}: the tree's PSS {total:.0f} MiB; per process, PSS / Private_Dirty in MiB")
    for role, s in rows:
        print(f"  {role:10s} " + ", ".join(
            f"{k} {s[(k, 'Pss')]:.1f}/{s[(k, 'Private_Dirty')]:.1f}" for k in KINDS))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("torch", "asyncflow"))
    parser.add_argument("--at", default="1:0,1:1,1:20", help="epoch:batch,...")
    args = parser.parse_args()
    at = {tuple(int(x) for x in pair.split(":")) for pair in args.at.split(",")}
    import torch

    torch.set_num_threads(1)
    me = os.getpid()
    show(me, "before the loader")
    loader: Any = bench._loader(args.kind, "images", 0)
    for epoch in range(1 + max(e for e, _ in at)):
        for index, batch in enumerate(loader):
            if (epoch, index) in at:
                show(me, f"epoch {epoch}, batch {index} (batches mapped here: "
                         f"{bench._mapped_batches(batch)})")


if __name__ == "__main__":
    main()
