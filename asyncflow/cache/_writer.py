"""Writing a cache: one pass of items into a temporary directory, published by a rename.

:class:`Writer` appends samples to the temporary directory, checksumming each field's blocks
as they go (see _checks.py) and, on :meth:`Writer.commit`, writes the headers, the checksum
tables and the manifest and renames the directory into place, so that a reader sees either
no cache or a complete one. Every method blocks on the file system: call them off the event
loop (``CacheSource`` does, on worker threads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError
from ._checks import BlockSums
from ._format import (
    BLOCK_BYTES,
    FORMAT,
    HEADER_BYTES,
    VERSION,
    npy_header,
    remove_cache,
    remove_path,
    table_name,
    write_file,
    write_manifest,
)
from ._schema import Schema

__all__ = ["Writer"]

_WRITE_BUFFER = 1 << 20


class Writer:
    """Writes one pass of items into a temporary directory; :meth:`commit` publishes it.

    Args:
        path: Where the finished cache goes.
        layout: What each item is: ``samples`` (one sample), ``batches`` (every field has a
            leading batch dimension, as collated tensors do) or ``lists`` (a list of samples,
            as ``Pipeline.batch()`` yields). Batches are stored sample by sample.
        meta: Extra manifest entries (fingerprint, upstream summary).
    """

    def __init__(self, path: Path, *, layout: str, meta: dict[str, Any]) -> None:
        self.path = path
        self.layout = layout
        self.count = 0
        self.items = 0
        self.batch_size: int | None = None
        self._meta = meta
        self._schema: Schema | None = None
        self._files: list[Any] = []
        self._sums: list[BlockSums] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        self.tmp.mkdir()

    def write(self, item: Any) -> None:
        """Append ``item`` (one sample, or a batch of them as ``layout`` says).

        Raises:
            ConfigError: ``item`` is not a batch of the layout, or differs in structure,
                dtype or shape from the first item.
        """
        if self.layout == "lists":
            if not isinstance(item, list | tuple):
                raise ConfigError(
                    f"item {self.items} is a {type(item).__name__}, not a list of samples; "
                    "pass batched=True (collated batches) or batched=False to .cache()"
                )
            samples = list(item)
        else:
            samples = [item]
        columns = self.layout == "batches"
        n = 0
        for sample in samples:
            schema = self._schema or self._open(Schema.of(sample, batched=columns))
            arrays, rows = schema.arrays(sample, batched=columns, index=self.items)
            try:
                for fh, sums, array in zip(self._files, self._sums, arrays, strict=True):
                    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                    fh.write(data)
                    sums.update(data)
            except OSError as exc:  # a full disk, say
                exc.add_note(f"while writing the cache {self.path} (nothing of it is kept)")
                raise
            n += rows
        if self.layout != "samples":  # the largest: a shorter batch lost failed rows, or ends
            self.batch_size = max(self.batch_size or 0, n)
        self.count += n
        self.items += 1

    def _open(self, schema: Schema) -> Schema:
        """Open a file per field of ``schema``, the first item's; return ``schema``."""
        self._schema = schema
        for i, field in enumerate(schema.fields):
            fh = open(self.tmp / f"field{i}.npy", "wb", buffering=_WRITE_BUFFER)  # noqa: SIM115
            self._files.append(fh)
            self._sums.append(BlockSums(field.sample_bytes))
            fh.write(bytes(HEADER_BYTES))
        return schema

    def commit(self, *, durable: bool = False) -> None:
        """Finish the files, write the checksums and the manifest, rename to ``path``.

        Args:
            durable: ``fsync`` the files and directories, so the cache also survives a power
                loss or an OS crash right after the commit (a process crash never needs it).
        """
        fields = self._schema.fields if self._schema else ()
        tables = []
        for i, (fh, field, sums) in enumerate(zip(self._files, fields, self._sums, strict=True)):
            fh.seek(0)
            fh.write(npy_header(field, self.count))
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
            fh.close()
            table = sums.table()
            write_file(self.tmp / table_name(i), table, durable=durable)
            tables.append({"block_rows": sums.rows, "crc32": zlib.crc32(table)})
        self._files = []
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "count": self.count,
            "items": self.items,
            "layout": self.layout,
            "batch_size": self.batch_size,
            "structure": self._schema.structure if self._schema else None,
            "fields": [dataclasses.asdict(f) for f in fields],
            "files": [f"field{i}.npy" for i in range(len(fields))],
            "checksums": {"algorithm": "crc32", "block_bytes": BLOCK_BYTES, "tables": tables},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **self._meta,
        }
        write_manifest(self.tmp, manifest, durable=durable)
        self._publish(durable)

    def _publish(self, durable: bool) -> None:
        remove_cache(self.path)  # normally gone already: the writer removed it under the lock
        os.rename(self.tmp, self.path)
        if durable:
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def abort(self) -> None:
        """Drop everything written so far. Safe to call more than once."""
        for fh in self._files:
            with contextlib.suppress(OSError):
                fh.close()
        self._files = []
        remove_path(self.tmp)

