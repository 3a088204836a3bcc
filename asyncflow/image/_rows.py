"""The decoders' side of ``image.folder``: what a decode worker process (or thread) receives
and runs.

Torch-free on purpose (NumPy, PIL and the decode kernel only): a decode worker never imports
torch, which keeps each worker process small (see ``_shared.py`` for the parent's side).
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from ..pipeline import ItemGroup
from ..pipeline.shm import SHM_DIR
from ._decode import decode

__all__ = ["Claimed", "DecodeIntoSharedRow", "Failed", "Ticket", "map_slab"]

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
