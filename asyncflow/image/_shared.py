"""``image.folder`` on worker processes: batch buffers in shared memory, rows claimed by the parent.

With threads, a decode thread claims its batch row from the :class:`BatchAssembler` itself.
Worker processes cannot share the assembler's state, so the parent claims rows in listing order
(a cheap stage on one thread, ahead of the decoders), and each item travels to a worker with
its row's address: the name of a shared-memory slab (one batch buffer) and the row number. The
worker maps the slab once (it keeps the newest mappings) and decodes straight into the row;
only tickets and small failure records come back. Pixels never cross a pipe, and the batch the
consumer receives is a tensor over the slab, as in thread mode: the output is bit for bit the
same, with the same seeded crops.

The workers' side (what they receive and run) is ``_rows.py``, which imports no torch.

Slabs are named ``asyncflow-<pid>-<token>-slab<n>`` files in ``/dev/shm``. Those the
assembler keeps for reuse live as long as it does (a finalizer unlinks them, at exit too); one
made beyond the pool (the consumer holds many batches) is unlinked as soon as its batch is
complete, when no worker will need to map it again.
"""

from __future__ import annotations

import itertools
import os
import secrets
import weakref
from typing import Any

import numpy as np

from ..pipeline import ItemGroup, label_stage
from ..pipeline.shm import SHM_DIR, segment_prefix, sweep
from ._rows import Claimed, map_slab
from ._slots import BatchAssembler

__all__ = ["ClaimRows", "SharedSlabs"]


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
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass


class ClaimRows:
    """The claim stage (one thread, in listing order): give each item of a group its row.

    An internal stage (see ``stats().table(internal=True)``): its time counts for ``decode``.
    """

    def __init__(self, assembler: BatchAssembler) -> None:
        self.assembler = assembler
        self.__name__ = "claim"
        label_stage(self, internal=True)

    def __call__(self, items: list[Any]) -> ItemGroup:
        out = ItemGroup()
        for item in items:
            ticket, slab = self.assembler.claim_shared(item.run, item.pos, item.label)
            out.append(Claimed(item.path, item.epoch, item.sample, ticket, slab))
        return out
