"""Reading a cache: its files checked against the manifest and mapped into memory.

:class:`Reader` checks a cache before use (the manifest and its checksum, file sizes, the
``.npy`` headers, the checksum tables) and raises :class:`CacheInvalid` saying why it cannot be
used; the data blocks themselves are checked as a replay reads them (see _checks.py). The
format is described in _format.py, writing in _writer.py. Opening and mapping block on the
file system: call them off the event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._format import (
    HEADER_BYTES,
    LAYOUTS,
    CacheInvalid,
    block_rows,
    npy_header,
    read_manifest,
    table_name,
)
from ._schema import Field

__all__ = ["Reader", "Stamps", "files_match", "map_shared", "stamps_of"]

#: Per field file: device, inode, size and modification time (which file it is: a cache's
#: files are never written in place).
Stamps = tuple[tuple[int, int, int, int], ...]

# MAP_NORESERVE keeps a private mapping of a cache larger than RAM from being refused by the
# kernel's overcommit check; Python's mmap module does not name the flag.
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0


@dataclass(frozen=True)
class Reader:
    """A checked cache, its fields mapped into memory.

    ``arrays[i]`` is field ``i`` as an array ``[count, *shape]`` over a private
    (copy-on-write) mapping of its file: slices of it can be handed out without copying, and a
    consumer that writes into them changes its own pages, never the file. Where the kernel
    refuses such a mapping (strict overcommit), the arrays are read-only and ``copy`` is set.
    """

    path: Path
    manifest: dict[str, Any]
    fields: tuple[Field, ...]
    arrays: tuple[np.ndarray, ...]
    maps: tuple[mmap.mmap | None, ...]
    copy: bool
    #: Per field file: device, inode, size and modification time. A rebuilt cache is new
    #: files renamed into place, so other stamps mean other content.
    stamps: Stamps = ()
    #: Per field: the CRC-32 of each block of its data, and the rows of one block (0: the
    #: field holds no bytes). See _checks.py.
    sums: tuple[np.ndarray, ...] = ()
    block_rows: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    @property
    def layout(self) -> str:
        return str(self.manifest["layout"])

    @property
    def batch_size(self) -> int | None:
        """The upstream batch size when the cache holds batches or lists, else None."""
        if self.layout == "samples":
            return None
        return int(self.manifest["batch_size"] or max(self.count, 1))

    @classmethod
    def open(cls, path: Path) -> Reader:
        """Check the cache at ``path`` and map its fields (whether it is the cache of a given
        upstream, the caller checks: ``CacheSource`` says what changed).

        Raises:
            FileNotFoundError: No cache at ``path``.
            CacheInvalid: The cache must not be used; the message says why.
        """
        manifest = read_manifest(path)
        try:
            fields = tuple(Field.from_json(f) for f in manifest["fields"])
            files = [str(f) for f in manifest["files"]]
            count = int(manifest["count"])
            structure = manifest["structure"]
            if manifest["layout"] not in LAYOUTS:
                raise ValueError(manifest["layout"])
            tables = _tables(manifest, fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheInvalid(f"its manifest lacks or garbles {exc}") from None
        if (structure is None) != (not fields) or len(files) != len(fields):
            raise CacheInvalid("its manifest does not match its fields")
        arrays, maps, stamps, sums, copy = [], [], [], [], False
        for i, (name, field) in enumerate(zip(files, fields, strict=True)):
            array, mm, stat = _map(path / name, field, count)
            arrays.append(array)
            maps.append(mm)
            stamps.append(_stamp(stat))
            sums.append(_read_table(path / table_name(i), field, count, tables[i]))
            copy = copy or not array.flags.writeable
        return cls(path, manifest, fields, tuple(arrays), tuple(maps), copy, tuple(stamps),
                   tuple(sums), tuple(block_rows(f.sample_bytes) for f in fields))

    def prefetch(self, rows: range | np.ndarray) -> None:
        """Ask the kernel to start reading ``rows`` of every field that is not in memory.

        A cache larger than memory is read from disk: asking ahead keeps many reads in
        flight where page faults would wait for one at a time. Asking costs a walk over the
        pages even when they are in memory, so the first row's first page is checked with
        ``mincore``: when it is resident the cache is taken to be warm and nothing is asked.
        """
        if not len(rows):
            return
        scattered = isinstance(rows, np.ndarray)
        first = int(rows[0])
        for mm, array, field in zip(self.maps, self.arrays, self.fields, strict=True):
            size = field.sample_bytes
            if mm is None or (scattered and size < mmap.PAGESIZE):
                continue  # rows of small fields share pages: the kernel's read-around covers them
            base = array.ctypes.data - HEADER_BYTES
            begin = HEADER_BYTES + first * size
            if _resident(base + begin - begin % mmap.PAGESIZE):
                continue  # a warm cache: one resident row speaks for the rest
            spans = ([(r, r + 1) for r in rows.tolist()] if isinstance(rows, np.ndarray)
                     else [(first, rows[-1] + 1)])
            for start, stop in spans:
                begin = HEADER_BYTES + start * size
                aligned = begin - begin % mmap.PAGESIZE
                with contextlib.suppress(OSError, ValueError):
                    mm.madvise(_WILLNEED, aligned, HEADER_BYTES + stop * size - aligned)


def _load_mincore() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mincore = libc.mincore
    except (OSError, AttributeError):
        return None
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    mincore.restype = ctypes.c_int
    return mincore


_mincore = _load_mincore()
_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)


def _resident(page: int) -> bool:
    """Whether the (page-aligned) address's page is in memory; False when unknown."""
    if _mincore is None:
        return False
    vec = ctypes.c_ubyte(0)
    if _mincore(int(page), mmap.PAGESIZE, ctypes.byref(vec)) != 0:
        return False
    return bool(vec.value & 1)


def _map(file: Path, field: Field, count: int, stamp: tuple[int, int, int, int] | None = None
         ) -> tuple[np.ndarray, mmap.mmap | None, os.stat_result]:
    """``field``'s file checked (``_check_file``) and mapped as an array ``[count, *shape]``:
    privately (copy-on-write), or shared and read-only where the kernel refuses that (strict
    overcommit) or where ``stamp`` asks for the very file a reader checked.

    Raises:
        CacheInvalid: The file is missing, not the one of ``stamp``, or not what ``field``
            and ``count`` make it.
    """
    end = HEADER_BYTES + count * field.sample_bytes
    with _open_field(file) as fh:
        stat = os.fstat(fh.fileno())
        if stamp is not None and _stamp(stat) != stamp:
            raise CacheInvalid(f"{file.name} changed while it was being opened")
        _check_file(file.name, stat.st_size, fh, field, count)
        if end == HEADER_BYTES:
            return np.zeros((count, *field.shape), dtype=field.dtype), None, stat
        mm = None
        if stamp is None:
            with contextlib.suppress(OSError):  # strict overcommit: the shared mapping below
                mm = mmap.mmap(fh.fileno(), end, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if mm is None:
            mm = mmap.mmap(fh.fileno(), end, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    array = np.frombuffer(mm, dtype=field.dtype, count=count * math.prod(field.shape),
                          offset=HEADER_BYTES)
    return array.reshape((count, *field.shape)), mm, stat


def _tables(manifest: dict[str, Any], fields: tuple[Field, ...]) -> list[int]:
    """The manifest's CRC-32 of each field's checksum table.

    Raises:
        KeyError, TypeError, ValueError: The manifest lacks or garbles them.
    """
    checks = manifest["checksums"]
    tables = list(checks["tables"])
    if checks["algorithm"] != "crc32" or len(tables) != len(fields):
        raise ValueError("checksums")
    for table, field in zip(tables, fields, strict=True):
        if int(table["block_rows"]) != block_rows(field.sample_bytes):
            raise ValueError(f"block_rows of {field.name}")
    return [int(t["crc32"]) for t in tables]


def _read_table(file: Path, field: Field, count: int, crc: int) -> np.ndarray:
    per = block_rows(field.sample_bytes)
    blocks = -(-count // per) if per else 0
    with _open_field(file) as fh:
        data = fh.read()
    if len(data) != 4 * blocks:
        raise CacheInvalid(f"{file.name} holds {len(data)} bytes, expected {4 * blocks}")
    if zlib.crc32(data) != crc:
        raise CacheInvalid(f"{file.name} does not match its checksum in the manifest (damaged)")
    return np.frombuffer(data, dtype="<u4")


def stamps_of(path: Path, manifest: dict[str, Any]) -> Stamps:
    """:attr:`Reader.stamps` of the cache at ``path`` now, from a ``stat`` of each file.

    Raises:
        CacheInvalid: A file is missing, or the manifest does not list its files.
    """
    try:
        return tuple(_stamp(os.stat(path / str(name))) for name in manifest["files"])
    except (OSError, KeyError, TypeError) as exc:
        raise CacheInvalid(f"its files cannot be found ({exc})") from None


def files_match(path: Path, manifest: dict[str, Any], stamps: Stamps) -> bool:
    """Whether the field files at ``path``, of ``stamps`` (from :func:`stamps_of`), have
    the sizes and start with the ``.npy`` headers ``manifest`` gives them: a truncated cache or
    a damaged header is found without mapping the files (one short read each)."""
    try:
        fields = [Field.from_json(f) for f in manifest["fields"]]
        count = int(manifest["count"])
        for name, field, (_, _, size, _) in zip(manifest["files"], fields, stamps, strict=True):
            with open(path / str(name), "rb") as fh:
                _check_file(str(name), size, fh, field, count)
    except (OSError, KeyError, TypeError, ValueError, CacheInvalid):
        return False
    return True


def _check_file(name: str, size: int, fh: Any, field: Field, count: int) -> None:
    """Check that the field file ``name`` (open as ``fh``, ``size`` bytes) has the size and the
    ``.npy`` header that ``field`` and ``count`` give it; raise :class:`CacheInvalid` if not."""
    expected = HEADER_BYTES + count * field.sample_bytes
    if size != expected:
        state = "truncated" if size < expected else "longer than its manifest says"
        raise CacheInvalid(f"{name} is {state}: {size} bytes, expected {expected}")
    header = fh.read(HEADER_BYTES)
    want = npy_header(field, count)
    if header != want:
        at = next(i for i, (a, b) in enumerate(zip(header, want, strict=True)) if a != b)
        raise CacheInvalid(f"{name}: its .npy header differs from the manifest's "
                           f"field {field.name} at byte {at} (damaged)")


def _stamp(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _open_field(file: Path) -> Any:
    try:
        return open(file, "rb")
    except FileNotFoundError:
        raise CacheInvalid(f"{file.name} is missing") from None
    except IsADirectoryError:
        raise CacheInvalid(f"{file.name} is a folder, not the cache's file") from None


def map_shared(reader: Reader) -> tuple[np.ndarray, ...]:
    """Read-only arrays of ``reader``'s fields over shared mappings of the same files.

    Unlike ``reader.arrays`` they are safe to keep across epochs: nobody can write through
    them. Raises :class:`CacheInvalid` when a file is no longer the one ``reader`` checked.
    """
    return tuple(_map(reader.path / str(name), field, reader.count, stamp)[0]
                 for name, field, stamp in zip(reader.manifest["files"], reader.fields,
                                               reader.stamps, strict=True))
