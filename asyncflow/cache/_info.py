"""``info(path)``: what a cache holds, for ``asyncflow cache info PATH``."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._blob import describe_size
from ._fingerprint import clip_json
from ._format import CacheInvalid, leftovers, read_manifest
from ._lock import WriterLock
from ._reader import Reader
from ._schema import Field

__all__ = ["CacheInfo", "info"]


@dataclass(frozen=True)
class CacheInfo:
    """What the cache at ``path`` holds. ``str(info)`` is the text the CLI prints.

    Attributes:
        path: The cache directory.
        usable: The cache is complete and its files match its manifest and their checksum
            tables (whether it matches a given pipeline's fingerprint is only known to that
            pipeline; its data blocks are checked as replays read them).
        problem: Why it is not usable, else None.
        count: Samples stored.
        items: Items (batches, when ``batch_size`` is set) upstream yielded while writing.
        batch_size: The batch size replays use, or None when items are single samples.
        layout: ``samples``, ``batches`` (collated) or ``lists`` (lists of samples).
        fields: One entry per stored leaf: name, kind, dtype, per-sample shape.
        nbytes: Bytes of its field files on disk.
        created: When it was committed (UTC, ISO 8601).
        fingerprint: The upstream pipeline's fingerprint.
        key: The user's extra fingerprint input.
        upstream: A summary of the upstream pipeline's description: one entry per stage.
        writer: The pid of a process writing a new copy now, else None.
        unfinished: Temporary directories of writers that did not finish.
    """

    path: Path
    usable: bool
    problem: str | None
    count: int = 0
    items: int = 0
    batch_size: int | None = None
    layout: str = "samples"
    fields: tuple[Field, ...] = ()
    nbytes: int = 0
    created: str | None = None
    fingerprint: str | None = None
    key: Any = None
    upstream: Any = None
    writer: int | None = None
    unfinished: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (for ``--json`` output)."""
        return {**dataclasses.asdict(self), "path": str(self.path)}

    def __str__(self) -> str:
        status = "usable" if self.usable else f"not usable: {self.problem}"
        rows = [("cache", str(self.path)), ("status", status)]
        if self.fields or self.count:
            rows.append(("samples", f"{self.count:,} ({describe_size(self.nbytes)} on disk)"))
            kind = "lists" if self.layout == "lists" else "batches"
            rows.append(("items", f"{kind} of {self.batch_size} ({self.items:,} upstream)"
                         if self.batch_size else "single samples"))
            names = max(len(f.name) for f in self.fields) if self.fields else 0
            for i, f in enumerate(self.fields):
                text = (f"{f.name:<{names}}  {f.kind:<7} {f.dtype:<8} {f.shape!s:<16} "
                        f"{describe_size(f.sample_bytes)} per sample")
                if f.device != "cpu":
                    text += f" (replayed onto {f.device})"
                rows.append(("fields" if i == 0 else "", text))
        for label, value in (("written", self.created), ("fingerprint", self.fingerprint)):
            if value:
                rows.append((label, value))
        if self.key is not None:
            rows.append(("key", json.dumps(self.key)))
        for i, stage in enumerate(self.upstream or ()):  # the summary: one entry a stage
            rows.append(("upstream" if i == 0 else "", clip_json(stage, 100)))
        if self.writer is not None:
            rows.append(("writer", f"process {self.writer} is writing a new copy now"))
        for i, name in enumerate(self.unfinished):
            rows.append(("unfinished" if i == 0 else "", f"{name} (removed by the next writer)"))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}".rstrip() for label, value in rows)


def info(path: str | Path) -> CacheInfo:
    """Describe the cache at ``path`` without changing anything.

    Raises:
        FileNotFoundError: There is no cache at ``path``, nor one being written there.
    """
    path = Path(os.path.abspath(path))  # "." names its folder (its lock sits beside it)
    writer = WriterLock(path).holder()
    unfinished = tuple(p.name for p in leftovers(path)) if writer is None else ()
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        if writer is None and not unfinished:
            raise FileNotFoundError(f"no cache at {path}") from None
        why = "not written yet" if writer is not None else "a writer did not finish"
        return CacheInfo(path, False, why, writer=writer, unfinished=unfinished)
    except CacheInvalid as exc:
        return CacheInfo(path, False, str(exc), writer=writer, unfinished=unfinished)
    problem: str | None = None
    try:
        Reader.open(path)
    except CacheInvalid as exc:
        problem = str(exc)
    try:
        fields = tuple(Field.from_json(f) for f in manifest.get("fields", ()))
    except (KeyError, TypeError, ValueError):
        fields = ()
    nbytes = sum(p.stat().st_size for p in path.glob("field*.npy"))
    return CacheInfo(
        path, problem is None, problem, count=int(manifest.get("count", 0)),
        items=int(manifest.get("items", 0)),
        batch_size=manifest.get("batch_size") if manifest.get("layout") != "samples" else None,
        layout=str(manifest.get("layout")),
        fields=fields, nbytes=nbytes, created=manifest.get("created"),
        fingerprint=manifest.get("fingerprint"), key=manifest.get("key"),
        upstream=manifest.get("upstream"), writer=writer, unfinished=unfinished,
    )
