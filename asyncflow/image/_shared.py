"""``image.folder`` on worker processes: batch buffers in shared memory, rows claimed by the parent.

With threads, a decode thread claims its batch row from the :class:`BatchAssembler` itself.
Worker processes cannot share the assembler's state, so the parent claims rows in listing order
(a cheap stage on one thread, ahead of the decoders), and each item travels to a worker with
its row's address: the name of a shared-memory slab (one batch buffer) and the row number. The
worker maps the slab once (it keeps the newest mappings) and decodes straight into the row;
only tickets and small failure records come back. Pixels never cross a pipe, and the batch the
consumer receives is a tensor over the slab, as in thread mode: the output is bit for bit the
same, with the same seeded crops.

Slabs are named ``asyncflow-<pid>-<token>-slab<n>`` files in ``/dev/shm``. Those the
assembler keeps for reuse live as long as it does (a finalizer unlinks them, at exit too); one
made beyond the pool (the consumer holds many batches) is unlinked as soon as its batch is
complete, when no worker will need to map it again.
"""

from __future__ import annotations

import itertools
import mmap
import os
import secrets
import weakref
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np

from ..pipeline._shm import SHM_DIR, segment_prefix, sweep
from ._decode import decode
from ._slots import BatchAssembler, Ticket

__all__ = ["ClaimRows", "DecodeIntoSharedRow", "SharedSlabs"]

# Slabs a worker keeps mapped: the assembler's pool, and a few made beyond it (whose names
# are gone once their batch is complete, so a mapping kept longer would only hold memory).
_MAPPED = 16
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


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
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
        finally:
            os.close(fd)
        # np.ndarray over the mapping, not frombuffer().reshape(): the pool tells a free buffer
        # by its reference count, so the views handed out must have this array as their base.
        return np.ndarray(shape, dtype, buffer=mapping), name

    @staticmethod
    def release(name: str) -> None:
        """Unlink a slab's name (its memory lives on while mapped)."""
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass


class Claimed(NamedTuple):
    """An item with its row's address, on its way to a worker."""

    path: str
    epoch: int
    sample: int
    ticket: Ticket
    slab: str


class ClaimRows:
    """The claim stage (one thread, in listing order): give each item of a group its row."""

    def __init__(self, assembler: BatchAssembler) -> None:
        self.assembler = assembler
        self.__name__ = "claim"

    def __call__(self, items: list[Any]) -> list[Claimed]:
        out = []
        for item in items:
            ticket, slab = self.assembler.claim_shared(item.run, item.pos, item.label)
            out.append(Claimed(item.path, item.epoch, item.sample, ticket, slab))
        return out


class DecodeIntoSharedRow:
    """The decode stage's function in a worker process: decode each item into its row.

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

    def __call__(self, items: list[Claimed]) -> list[Any]:
        from ._folder import Failed

        out: list[Any] = []
        for item in items:
            try:
                row = self._slab(item.slab)[item.ticket.row]
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
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            # Pre-faulted: one call maps every page, instead of a fault per page on first write.
            mapping = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | _POPULATE)
        finally:
            os.close(fd)
        slab = np.ndarray(self.shape, self.dtype, buffer=mapping)
        self._slabs[name] = slab
        while len(self._slabs) > _MAPPED:
            self._slabs.popitem(last=False)
        return slab
