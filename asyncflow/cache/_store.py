"""The cache on disk: one ``.npy`` file per field plus ``manifest.json``, in one directory.

Layout of a cache at ``PATH``::

    PATH/manifest.json      count, batch size, structure, fields, fingerprint (written last)
    PATH/field0.npy ...     one array [count, *shape] per field, a standard .npy file whose
                            data starts at byte 4096 (``np.load(f, mmap_mode="r")`` opens it)
    PATH.lock               the writer's lock file (see _lock.py)
    PATH.tmp-<pid>-<hex>/   a cache being written; renamed to PATH when its pass completes

A :class:`Writer` appends samples to the temporary directory and, on :meth:`Writer.commit`,
writes the headers and the manifest and renames the directory into place, so a reader sees
either no cache or a complete one. :class:`Reader` checks a cache before use (manifest,
fingerprint, file sizes) and raises :class:`CacheInvalid` saying why it cannot be used.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError
from ._schema import Field, Schema

__all__ = [
    "HEADER_BYTES",
    "LAYOUTS",
    "CacheInvalid",
    "Reader",
    "Writer",
    "field_array",
    "leftovers",
    "map_shared",
    "read_manifest",
    "remove_cache",
    "remove_path",
]

FORMAT = "asyncflow-cache"
VERSION = 1
MANIFEST = "manifest.json"
_OWN_FILE = re.compile(r"manifest\.json|field\d+\.npy")
HEADER_BYTES = 4096  # the .npy header is padded to one page, so the data starts page-aligned
_WRITE_BUFFER = 1 << 20
# MAP_NORESERVE keeps a private mapping of a cache larger than RAM from being refused by the
# kernel's overcommit check; Python's mmap module does not name the flag.
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0


class CacheInvalid(Exception):
    """The cache exists but must not be used; ``str(exc)`` says why."""


def _npy_header(field: Field, count: int) -> bytes:
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(field.dtype)),
        "fortran_order": False,
        "shape": (count, *field.shape),
    }
    text = repr(header).encode("latin1")
    room = HEADER_BYTES - 10  # magic (6) + version (2) + header length (2)
    return b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + text.ljust(room - 1) + b"\n"


def leftovers(path: Path) -> list[Path]:
    """Temporary directories of unfinished writers, left next to ``path``."""
    if not path.parent.is_dir():
        return []
    pattern = re.compile(re.escape(path.name) + r"\.tmp-\d+-[0-9a-f]{8}")
    return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name))


def remove_cache(path: Path) -> None:
    """Delete the cache directory at ``path`` (if any), refusing anything that is not one.

    Raises:
        ConfigError: ``path`` holds something a cache never does (a guard against
            ``.cache("data/train")`` deleting a dataset).
    """
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink() or not path.is_dir() or any(
        not _OWN_FILE.fullmatch(p.name) for p in path.iterdir()
    ):
        raise ConfigError(
            f"{path} exists and is not an asyncflow cache; refusing to replace it. "
            "Give .cache() a path of its own"
        )
    remove_path(path)


LAYOUTS = ("samples", "batches", "lists")


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
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.path = path
        self.layout = layout
        self.count = 0
        self.items = 0
        self.batch_size: int | None = None
        self._meta = meta
        self._schema: Schema | None = None
        self._files: list[Any] = []
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
            if self._schema is None:
                self._open(Schema.of(sample, batched=columns))
            assert self._schema is not None
            arrays, rows = self._schema.arrays(sample, batched=columns, index=self.items)
            try:
                for fh, array in zip(self._files, arrays, strict=True):
                    fh.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            except OSError as exc:  # a full disk, say
                exc.add_note(f"while writing the cache {self.path} (nothing of it is kept)")
                raise
            n += rows
        if self.batch_size is None and self.layout != "samples":
            self.batch_size = n
        self.count += n
        self.items += 1

    def _open(self, schema: Schema) -> None:
        self._schema = schema
        for i in range(len(schema.fields)):
            fh = open(self.tmp / f"field{i}.npy", "wb", buffering=_WRITE_BUFFER)  # noqa: SIM115
            self._files.append(fh)
            fh.write(bytes(HEADER_BYTES))

    def commit(self, *, durable: bool = False) -> None:
        """Finish the files, write the manifest and rename the directory to ``path``.

        Args:
            durable: ``fsync`` the files and directories, so the cache also survives a power
                loss or an OS crash right after the commit (a process crash never needs it).
        """
        fields = self._schema.fields if self._schema else ()
        for fh, field in zip(self._files, fields, strict=True):
            fh.seek(0)
            fh.write(_npy_header(field, self.count))
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
            fh.close()
        self._files = []
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "count": self.count,
            "items": self.items,
            "layout": self.layout,
            "batch_size": self.batch_size,
            "structure": self._schema.structure if self._schema else None,
            "fields": [f.to_json() for f in fields],
            "files": [f"field{i}.npy" for i in range(len(fields))],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **self._meta,
        }
        with open(self.tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1)
            fh.write("\n")
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
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


def remove_path(path: Path) -> None:
    """Delete a file or directory tree; nothing when it is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the cache at ``path``.

    Raises:
        FileNotFoundError: No cache at ``path``.
        CacheInvalid: The manifest is unreadable or of another format or version.
    """
    try:
        text = (path / MANIFEST).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"no cache at {path}") from None
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CacheInvalid(f"its manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CacheInvalid("its manifest is not an asyncflow cache manifest")
    if manifest.get("version") != VERSION:
        raise CacheInvalid(
            f"it has format version {manifest.get('version')}, this asyncflow writes {VERSION}"
        )
    return manifest


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
    #: files renamed into place, so a changed identity means other content.
    identity: tuple[tuple[int, int, int, int], ...] = ()

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
    def open(cls, path: Path, *, fingerprint: str | None = None) -> Reader:
        """Check the cache at ``path`` and map its fields.

        Args:
            fingerprint: When given, the cache must have been written with this fingerprint.

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
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheInvalid(f"its manifest lacks or garbles {exc}") from None
        if fingerprint is not None and manifest.get("fingerprint") != fingerprint:
            raise CacheInvalid("the upstream pipeline changed (fingerprint mismatch)")
        if (structure is None) != (not fields) or len(files) != len(fields):
            raise CacheInvalid("its manifest does not match its fields")
        arrays, maps, identity, copy = [], [], [], False
        for name, field in zip(files, fields, strict=True):
            array, mm, stat = _map(path / name, field, count)
            arrays.append(array)
            maps.append(mm)
            identity.append(_identity(stat))
            copy = copy or not array.flags.writeable
        return cls(path, manifest, fields, tuple(arrays), tuple(maps), copy, tuple(identity))

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
            if isinstance(rows, np.ndarray):
                spans = [(r, r + 1) for r in rows.tolist()]
            else:
                spans = [(first, rows[-1] + 1)]
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


def _map(
    file: Path, field: Field, count: int
) -> tuple[np.ndarray, mmap.mmap | None, os.stat_result]:
    expected = HEADER_BYTES + count * field.sample_bytes
    with _open_field(file) as fh:
        stat = os.fstat(fh.fileno())
        if stat.st_size != expected:
            state = "truncated" if stat.st_size < expected else "longer than its manifest says"
            raise CacheInvalid(
                f"{file.name} is {state}: {stat.st_size} bytes, expected {expected}"
            )
        if count * field.sample_bytes == 0:
            return np.zeros((count, *field.shape), dtype=field.dtype), None, stat
        try:
            mm = mmap.mmap(fh.fileno(), expected, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:  # strict overcommit: fall back to a shared read-only mapping
            mm = mmap.mmap(fh.fileno(), expected, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    return field_array(mm, field, count), mm, stat


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _open_field(file: Path) -> Any:
    try:
        return open(file, "rb")
    except FileNotFoundError:
        raise CacheInvalid(f"{file.name} is missing") from None


def field_array(mm: mmap.mmap, field: Field, count: int) -> np.ndarray:
    """The ``[count, *shape]`` array of ``field`` in a mapping of its whole file."""
    items = count * int(np.prod(field.shape, dtype=np.int64))
    array = np.frombuffer(mm, dtype=field.dtype, count=items, offset=HEADER_BYTES)
    return array.reshape((count, *field.shape))


def map_shared(reader: Reader) -> tuple[np.ndarray, ...]:
    """Read-only arrays of ``reader``'s fields over shared mappings of the same files.

    Unlike ``reader.arrays`` they are safe to keep across epochs: nobody can write through
    them. Raises :class:`CacheInvalid` when a file is no longer the one ``reader`` checked.
    """
    arrays = []
    for name, field, array, identity in zip(
        reader.manifest["files"], reader.fields, reader.arrays, reader.identity, strict=True
    ):
        if array.nbytes == 0:
            arrays.append(array)
            continue
        with _open_field(reader.path / name) as fh:
            stat = os.fstat(fh.fileno())
            if _identity(stat) != identity:
                raise CacheInvalid(f"{name} changed while it was being opened")
            mm = mmap.mmap(fh.fileno(), stat.st_size, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ)
        arrays.append(field_array(mm, field, reader.count))
    return tuple(arrays)
