"""The decoders' side of ``image.folder``: what a decode worker process (or thread) receives
and runs; and, for worker processes, the batch buffers in shared memory.

With threads, a decode thread claims its batch row from the ``BatchAssembler`` itself.
Worker processes cannot share the assembler's state, so the parent claims rows in listing order
(a cheap stage on one thread, ahead of the decoders: ``_folder.py``), and each item travels to
a worker with its row's address: the name of a shared-memory slab (one batch buffer) and the
row number. The worker maps the slab once (it keeps the newest mappings) and decodes straight
into the row; only tickets and small failure records come back. Pixels never cross a pipe, and
the batch the consumer receives is a tensor over the slab, as in thread mode: the output is bit
for bit the same, with the same seeded crops.

Slabs are named ``asyncflow-<pid>-<token>-slab<n>`` files in ``/dev/shm``. Those the
assembler keeps for reuse live as long as it does (a finalizer unlinks them, at exit too); one
made beyond the pool (the consumer holds many batches) is unlinked as soon as its batch is
complete, when no worker will need to map it again.

Torch-free on purpose (NumPy, PIL and the decode kernel only): a decode worker never imports
torch, which keeps each worker process small.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import secrets
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from ..pipeline import ItemGroup
from ..pipeline.shm import SHM_DIR, segment_prefix, sweep
from ._decode import decode

__all__ = ["Claimed", "DecodeIntoSharedRow", "Failed", "SharedSlabs", "Ticket", "map_slab"]

# Slabs a worker keeps mapped: the assembler's pool, and a few made beyond it (whose names
# are gone once their batch is complete, so a mapping kept longer would only hold memory).
_MAPPED = 16
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class Ticket(NamedTuple):
    """Where a decoded image went: its listing (run), batch number and row; and its label."""

    run: int
    number: int
    row: int
    label: int


class Failed(NamedTuple):
    """A row whose image could not be decoded (its repr names the file)."""

    path: str
    error: Exception
    ticket: Ticket

    def __repr__(self) -> str:  # short, the file name last: failure reports truncate the middle
        return f"Failed({self.path!r})"


class Claimed(NamedTuple):
    """An item with its row: the row's address on its way to a worker process (the name of
    its shared-memory slab), or the row itself for a decode thread."""

    path: str
    epoch: int
    sample: int
    ticket: Ticket
    slab: str | np.ndarray


class DecodeIntoSharedRow:
    """The decode stage's function: decode each item into its row (in a worker process, a
    row of a shared slab, mapped once; on a thread, the row it was given).

    Returns, per item, its ticket, or a ``Failed`` record (the decode error names the file);
    the batch stage raises the errors, where they count against ``max_failures``.
    """

    def __init__(self, seed: int, options: dict[str, Any], shape: tuple[int, ...],
                 dtype: str) -> None:
        self.seed = seed
        self.options = options
        self.shape = shape
        self.dtype = dtype
        self.__name__ = "decode"
        self._slabs: OrderedDict[str, np.ndarray] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_slabs": OrderedDict()}  # mappings stay in their process

    def __call__(self, items: Iterable[Claimed]) -> ItemGroup:
        out = ItemGroup()  # stats count its images
        for item in items:
            try:
                slab = item.slab
                row = slab if isinstance(slab, np.ndarray) else self._slab(slab)[item.ticket.row]
                decode(item.path, out=row, layout="chw", seed=self.seed, epoch=item.epoch,
                       index=item.sample, **self.options)
            except Exception as exc:
                out.append(Failed(item.path, exc, item.ticket))
            else:
                out.append(item.ticket)
        return out

    def _slab(self, name: str) -> np.ndarray:
        slab = self._slabs.get(name)
        if slab is not None:
            self._slabs.move_to_end(name)
            return slab
        slab = np.ndarray(self.shape, self.dtype, buffer=map_slab(name))
        self._slabs[name] = slab
        while len(self._slabs) > _MAPPED:
            self._slabs.popitem(last=False)
        return slab


def map_slab(name: str, size: int | None = None) -> mmap.mmap:
    """Map the shared-memory slab ``name`` (``size``: create it, of that many bytes)."""
    create = os.O_CREAT | os.O_EXCL if size is not None else 0
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | create, 0o600)
    try:
        if size is None:
            size = os.fstat(fd).st_size
        else:
            os.ftruncate(fd, size)
        # Pre-faulted: one call maps every page, instead of a fault per page on first write.
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)


class SharedSlabs:
    """Allocates batch buffers as named shared-memory files (the parent's side)."""

    def __init__(self) -> None:
        self.prefix = f"{segment_prefix(secrets.token_hex(4))}slab"
        self._numbers = itertools.count()
        weakref.finalize(self, sweep, self.prefix)

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[np.ndarray, str]:
        """A new zeroed buffer of ``shape`` and ``dtype``, and its slab's name."""
        name = f"{self.prefix}{next(self._numbers)}"
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mapping = map_slab(name, size)
        # np.ndarray over the mapping, not frombuffer().reshape(): the pool tells a free buffer
        # by its reference count, so the views handed out must have this array as their base.
        return np.ndarray(shape, dtype, buffer=mapping), name

    @staticmethod
    def release(name: str) -> None:
        """Unlink a slab's name (its memory lives on while mapped)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
