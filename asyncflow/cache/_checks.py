"""Block checksums of a cache's fields: computed as they are written, checked as they are read.

Each field's data is cut into blocks of whole rows (samples): one row per block where a row
takes at least ``BLOCK_BYTES``, else as many rows as fit in that many bytes (a label of
8 bytes: 512 rows a block). Each block's CRC-32 (``zlib.crc32``, which releases the GIL and
runs at several GB/s) is stored in the field's table, ``field<i>.crc32``. The block size and
``block_rows`` belong to the on-disk format (``_format.py``).

A replay checks each block the first time it reads a row of it (:class:`Checks`), before the
item holding the row is handed out; a record of the blocks found intact is kept with the
pipeline (its ``shuffle()`` copies share it) as long as the cache's files stay the same
(device, inode, size and modification time), so that later epochs read the mapping at full
speed. A shuffled epoch thus checks exactly the blocks it reads, and a small field's block
costs at most :data:`BLOCK_BYTES` of extra reading per row.
"""

from __future__ import annotations

import threading
import zlib
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import SourceError
from ._format import HEADER_BYTES, block_rows
from ._reader import Reader, Stamps

__all__ = ["ALL_CHECKED", "BlockSums", "Checks"]


class BlockSums:
    """The running block checksums of one field, fed its bytes in order as they are written."""

    def __init__(self, sample_bytes: int) -> None:
        self.rows = block_rows(sample_bytes)
        self._size = self.rows * sample_bytes
        self._sums = array("I")
        self._crc = 0
        self._filled = 0

    def update(self, data: np.ndarray) -> None:
        """Add ``data`` (a flat uint8 array: whole rows) to the checksums."""
        pos, end = 0, len(data)
        while pos < end:
            take = min(self._size - self._filled, end - pos)
            self._crc = zlib.crc32(data[pos:pos + take].data, self._crc)
            self._filled += take
            pos += take
            if self._filled == self._size:
                self._sums.append(self._crc)
                self._crc = self._filled = 0

    def table(self) -> bytes:
        """The finished table: one little-endian uint32 per block, the last one maybe short."""
        sums = array("I", self._sums)
        if self._filled:
            sums.append(self._crc)
        return np.asarray(sums, dtype="<u4").tobytes()


class Checks:
    """Which blocks of a cache have been found to match their checksums.

    One record serves a cached pipeline and its shuffled copies, in any threads; it starts
    afresh when the cache's files change (a rebuild renames new files into place). Two
    threads may check one block at once: that costs a second check, nothing else.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamps: Stamps | None = None
        self._done: list[np.ndarray] = []
        self._complete = False
        self._damaged: dict[Stamps, str] = {}

    def damage(self, stamps: Stamps) -> str | None:
        """Why the files of ``stamps`` (``_reader.Reader.stamps``) were found damaged in an
        earlier epoch, else None."""
        return self._damaged.get(stamps)

    def refuse(self, stamps: Stamps, why: str) -> None:
        """Note the files of ``stamps`` as damaged (``why``): :meth:`damage` says so."""
        self._damaged[stamps] = why

    def verify(self, reader: Reader, rows: slice | np.ndarray,
               arrays: Sequence[np.ndarray] | None = None) -> None:
        """Check the blocks holding ``rows`` of every field that were not checked yet.

        ``arrays`` are the mapping to read them from (another mapping of ``reader``'s files;
        by default ``reader.arrays``).

        Raises:
            SourceError: A block does not match its checksum; the message names the cache,
                the field, its file, the rows and the bytes.
        """
        done = self._record(reader)
        if done is None:
            return
        for index, (array_, sums, per) in enumerate(
            zip(arrays or reader.arrays, reader.sums, reader.block_rows, strict=True)
        ):
            if per == 0:
                continue
            blocks = _blocks(rows, per)
            todo = blocks[~done[index][blocks]]
            if not len(todo):
                continue
            flat = array_.reshape(-1).view(np.uint8)
            size = per * reader.fields[index].sample_bytes
            for block in todo.tolist():
                if zlib.crc32(flat[block * size:(block + 1) * size].data) != int(sums[block]):
                    raise self._damaged_error(reader, index, block, per, size)
            done[index][todo] = True
        if all(d.all() for d in done):
            self._complete = True

    def complete(self, reader: Reader) -> bool:
        """Whether every block of ``reader``'s files has been checked (reads check nothing)."""
        with self._lock:
            return self._stamps == reader.stamps and self._complete

    def _record(self, reader: Reader) -> list[np.ndarray] | None:
        with self._lock:
            if self._stamps != reader.stamps:
                self._stamps = reader.stamps
                self._done = [np.zeros(len(s), dtype=bool) for s in reader.sums]
                self._complete = False
            return None if self._complete else self._done

    def _damaged_error(self, reader: Reader, index: int, block: int, per: int,
                       size: int) -> SourceError:
        field = reader.fields[index]
        first = block * per
        last = min(first + per, reader.count) - 1
        start = HEADER_BYTES + block * size
        stop = HEADER_BYTES + min((block + 1) * per, reader.count) * field.sample_bytes
        rows = f"row {first}" if first == last else f"rows {first}-{last}"
        why = (f"{reader.manifest['files'][index]} (field {field.name}) is damaged: {rows}, "
               f"bytes {start}-{stop - 1} of the file, do not match their checksum")
        self.refuse(reader.stamps, why)
        return SourceError(f"cache {reader.path}: {why}; its next epoch rebuilds it")


def _blocks(rows: slice | np.ndarray, per: int) -> Any:
    if isinstance(rows, slice):
        return np.arange(rows.start // per, (rows.stop - 1) // per + 1)
    return np.unique(rows // per)


class _AllChecked(Checks):
    """The record of a replay whose blocks were all checked already: it checks nothing."""

    def verify(self, reader: Reader, rows: slice | np.ndarray,
               arrays: Sequence[np.ndarray] | None = None) -> None:
        return None


#: Passed to a replay of a cache whose every block has passed its check.
ALL_CHECKED: Checks = _AllChecked()
