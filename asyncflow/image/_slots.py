"""Decoding straight into batch buffers, in any order, and handing out whole batches in order.

An image-folder pipeline knows, when it lists an epoch, where each item will land: item
``pos`` goes to row ``pos % batch_size`` of batch ``pos // batch_size``. So each decode thread
asks :meth:`BatchAssembler.claim` for its row (the buffer is made, or recycled, by the first
item of the batch to ask) and writes the image there. Decoding runs unordered, so a thread that
finishes early takes the next image at once instead of waiting for a slower neighbour; the
assembler, told of every claimed row on the pipeline's loop (:meth:`arrived`: decoded, or
failed), releases each batch once all its rows are accounted for, strictly in batch order. A
batch with a failed row is released without it (compacted: the one copy made).
Batch contents and order are therefore fixed by the listing alone, whatever the timing.

Resuming (``pipe.load_state_dict``): the ``assemble`` stage hands the assembler the positions
settled in the interrupted run (:meth:`BatchAssembler.resume`); the next run leaves them out of
its batches, as it leaves out failed rows. So a resumed epoch's batches keep their boundaries:
batch ``n`` still holds positions ``[n * batch_size, (n + 1) * batch_size)``, less those
delivered or failed before. Rows claimed at a settled position (the rest of a decoder's group
that was delivered in part) are decoded into a scratch buffer and never reach a batch.

Decoding may run ahead of the oldest unfinished batch by at most ``ahead`` batches: a thread
claiming a row further ahead waits (up to a second at a time) for the head to be released, so
one very slow image cannot make memory grow without bound while the others run on.

With ``normalize`` (``image.folder``'s default on the CPU path), rows are written as uint8 and a
batch becomes float32 only when it is released, in two NumPy passes with the kernel's own scale
and offset (bit for bit its per-row arithmetic), into one of two float buffers recycled alike
(``_float_batches.py``): the buffers that rows are decoded into, in flight and in the pool, are
4x smaller than float batches, and a float batch exists only from its release on (the one
waiting for the consumer, and the consumer's).

Buffers are recycled once nothing refers to them any more (``asyncflow/_recycle.py``'s
``"unreferenced"`` :class:`Recycler`): a fresh 19 MB float batch costs ~5,000 page faults (about
10% of the decode work), a recycled one none. Each buffer is a NumPy array that the batch tensor
wraps (``torch.from_numpy``), so it is free exactly when its reference count shows that no
tensor, view or decode holds it: a batch the consumer still holds, or any view of it, is never
reused. Past ``pool`` buffers, a batch gets a spare, made for it alone.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from functools import partial
from typing import Any

import numpy as np
import torch

from .._recycle import PoolStats, Recycler
from ..pipeline import Span
from ._float_batches import FloatBatches
from ._rows import Failed, Ticket

__all__ = ["BatchAssembler", "Ticket"]

Batch = tuple[torch.Tensor, torch.Tensor]
_Key = tuple[tuple[int, ...], np.dtype[Any]]

#: The attribute of a released batch's labels tensor that holds the batch's record for a
#: journal, ``(run, number, [(row, error), ...], absent rows)``: it travels with the batch.
_NOTE = "asyncflow_batch"
_RUNS = 64  # open iterations of one pipeline kept before the idlest is dropped


class _Open:
    """A batch whose rows are still arriving."""

    __slots__ = ("absent", "array", "arrived", "failed", "key", "labels", "rows", "slab",
                 "spare", "tensor")

    def __init__(self, tensor: torch.Tensor, array: np.ndarray, rows: int, slab: str = "",
                 spare: bool = False) -> None:
        self.tensor, self.array, self.rows = tensor, array, rows
        self.slab, self.spare = slab, spare  # shared-memory name; made beyond the pool
        self.labels = np.zeros(rows, np.int64)
        self.arrived = 0
        self.failed: dict[int, str] = {}  # the failed rows' errors, by row
        self.key = (0, 0)  # (run, batch number)
        self.absent: list[int] = []  # rows settled before a resume: they never arrive

    @property
    def complete(self) -> bool:
        return self.arrived + len(self.failed) + len(self.absent) >= self.rows


class _Run:
    def __init__(self, skip: Span | None = None) -> None:
        self.active = time.monotonic()  # when a row was last claimed or arrived
        self.next = 0  # the next batch number to release
        self.open: dict[int, _Open] = {}  # batches with rows still to arrive
        self.done: deque[tuple[int, _Open]] = deque()  # complete, not released yet
        self.skip = skip  # positions settled in an earlier run (resumed), or None


def _make(slabs: Any, names: dict[int, str], key: _Key, need: int) -> np.ndarray:
    """A new batch buffer: private memory, or a shared-memory slab whose name goes in ``names``."""
    if slabs is None:
        return np.empty(*key)
    array: np.ndarray
    array, name = slabs.allocate(*key)
    names[id(array)] = name
    return array


class BatchAssembler:
    """Rows of per-batch ``N x 3 x H x W`` buffers by item position; whole batches in order.

    Thread-safe: decode threads call :meth:`claim` concurrently with :meth:`arrived`.
    ``dtype`` is the released batches' element type: uint8, or float32 when decoding
    normalizes as it writes, or when ``normalize`` normalizes each batch at release.

    Args:
        batch_size, height, width: The batch geometry.
        count: Items per listing (epoch); the last batch holds the remainder.
        dtype: The buffers' element type.
        drop_last: Never release a last batch shorter than ``batch_size``.
        ahead: How many batches past the oldest unreleased one decoding may start.
        pool: How many buffers to keep for reuse (>= 1); past it, batches get spares.
        slabs: Allocates buffers in shared memory (a ``SharedSlabs``), for decoding in
            worker processes; ``None``: private memory.
        normalize: ``(mean, std)``: rows are written as uint8 and each batch is released as
            ``dtype`` (float32), ``(x / 255 - mean) / std``; ``None``: released as written.
    """

    def __init__(
        self, batch_size: int, height: int, width: int, count: int,
        dtype: torch.dtype = torch.uint8, *, drop_last: bool = False, ahead: int = 4,
        pool: int = 12, slabs: Any = None,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
    ) -> None:
        self.batch_size = batch_size
        self.shape = (3, height, width)
        self.count = count
        self.dtype = dtype
        self.batches = count // batch_size if drop_last else -(-count // batch_size)
        self.normalize = normalize
        #: The rows' element type (uint8 when batches are normalized at release).
        self._np_dtype = torch.empty((), dtype=torch.uint8 if normalize else dtype).numpy().dtype
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._ahead = ahead
        self._runs: dict[int, _Run] = {}
        self._dropped: set[int] = set()
        self._resume: Span | None = None  # for the next run to start (see resume())
        self._scratch: tuple[np.ndarray, str] | None = None  # rows at settled positions
        #: Whether a journal (``asyncflow/journal/``) reads which batch each one is: from
        #: then on each released batch's labels carry its record (:meth:`take_note`), which a
        #: journal takes off (a run without one leaves it on: ``labels.asyncflow_batch``).
        self.journaled = False
        #: Claims that waited the full second for older batches (0 when the decoders' hand-offs
        #: stay within ``ahead``).
        self.stalls = 0
        self._slabs = slabs
        self._names: dict[int, str] = {}  # slab names by ``id`` of the kept and spare buffers
        # Not a bound method: a cycle through ``self`` would keep the slabs (unlinked when the
        # assembler goes) until the garbage collector runs.
        self._buffers: Recycler[_Key, np.ndarray] = Recycler(
            partial(_make, slabs, self._names), nbytes=lambda a: a.nbytes, limit=pool,
            returned="unreferenced",
        )
        # The released float batches, recycled alike (two: see _float_batches.py).
        self._floats = None if normalize is None else FloatBatches(
            (batch_size, *self.shape), *normalize)
        self._first = True

    def describe(self) -> dict[str, Any]:
        """What its batches are, for a cache's fingerprint: not what its runs did (``stalls``,
        whether a journal reads them), which would make an unchanged pipeline's cache look stale."""
        return {"batch_size": self.batch_size, "shape": list(self.shape), "count": self.count,
                "dtype": str(self.dtype), "batches": self.batches}

    def claim(
        self, run: int, pos: int, label: int, *, wait: bool = True
    ) -> tuple[Ticket, np.ndarray]:
        """The ticket for item ``pos`` of listing ``run``, and its row as a writable array.

        ``run`` numbers the listings, not the epochs: two runs of one epoch at the same time
        (after ``set_epoch``) must not share buffers.
        """
        ticket, buffer, _ = self._claim(run, pos, label, wait)
        return ticket, buffer[ticket.row]

    def claim_shared(self, run: int, pos: int, label: int, *,
                     wait: bool = False) -> tuple[Ticket, str]:
        """As :meth:`claim`, for a worker process: the ticket and the slab's name.

        ``wait``: as :meth:`claim` does, while the row's batch is ``ahead`` past the oldest
        one not complete (``image.folder``'s claim stage, on a thread of its own: a slow
        consumer then holds no more slabs than that, rather than as many as the queues
        between the claims and the consumer hold rows).
        """
        ticket, _, slab = self._claim(run, pos, label, wait)
        return ticket, slab

    def _claim(self, run: int, pos: int, label: int,
               wait: bool) -> tuple[Ticket, np.ndarray, str]:
        """The ticket, and the buffer and slab name that its row is in (the scratch buffer's
        for a row that is never assembled)."""
        number, row = divmod(pos, self.batch_size)
        ticket = Ticket(run, number, row, label)
        with self._lock:
            state = self._run(run)
            if number >= self.batches or (state.skip is not None and pos in state.skip):
                # dropped (drop_last), or settled before a resume: decoded, never assembled
                return (ticket, *self._scratch_buffer())
            # Soft back-pressure: never an unbounded wait (a stopped run releases nothing).
            if wait and not self._released.wait_for(
                    lambda: number < state.next + self._ahead, timeout=1.0):
                self.stalls += 1  # gave up waiting: a decoder held rows of older batches
            entry = state.open.get(number)
            if entry is None:
                rows = min(self.batch_size, self.count - number * self.batch_size)
                if not 0 <= row < rows:
                    raise RuntimeError(f"item {pos} is past the listing's {self.count} items")
                entry = state.open[number] = self._new_batch(rows)
                entry.key = (run, number)
                if state.skip is not None:  # rows settled before a resume are not coming
                    low = number * self.batch_size
                    entry.absent.extend(r - low for a, b in state.skip.within(low, low + rows)
                                        for r in range(a, b))
        return ticket, entry.array, entry.slab

    @staticmethod
    def failure(row: Ticket | Failed) -> Exception | None:
        """The decode error of a failed row (``None``: the image is in its row)."""
        return row.error if isinstance(row, Failed) else None

    def arrived(self, row: Ticket | Failed, ok: bool = True) -> list[Batch]:
        """Record a decoded row (``ok``) or a failed one; return the batches now complete, in
        batch order (often none). Called for every claimed row, from one thread.

        With :meth:`failure`, this makes the assembler an ``asyncflow.pipeline.Assembler``:
        ``image.folder``'s ``assemble`` stage tells it of each row as it arrives.
        """
        return [batch for batch, _ in self.release(row, ok=ok) if batch is not None]

    def position(self, row: Ticket | Failed) -> int:
        """The position of ``row`` (a ticket, or a record that holds one) in its epoch's
        order."""
        ticket = row if isinstance(row, Ticket) else row.ticket
        return ticket.number * self.batch_size + ticket.row

    def resume(self, settled: Span) -> None:
        """The next iteration to start leaves out the rows at ``settled`` positions (they were
        delivered, or failed, before it was interrupted): its batches keep their boundaries."""
        with self._lock:
            # Every row settled: the run claims none, so none would take the span up, and the
            # run after it would leave out its rows.
            whole = next(settled.gaps(0, self.count), None) is None
            self._resume = None if whole else settled

    def release(
        self, row: Ticket | Failed, *, ok: bool = True
    ) -> list[tuple[Batch | None, list[int]]]:
        """As :meth:`arrived`, each batch released paired with the positions of the rows it
        holds; ``None`` for a batch released without output (every row failed, or the short
        last batch that ``drop_last`` drops). What makes the ``assemble`` stage resumable
        (``PositionedAssembler`` in ``asyncflow/pipeline/_assemble.py``)."""
        ticket = row.ticket if isinstance(row, Failed) else row
        if ticket.number >= self.batches:  # drop_last's short batch: never assembled
            return [(None, [self.position(row)])] if ok else []
        with self._lock:
            if ticket.run in self._dropped:
                raise RuntimeError(
                    f"the batches of iteration {ticket.run} were dropped: more than "
                    f"{_RUNS} iterations of this image.folder pipeline were open at once, "
                    "and this one had been idle the longest"
                )
            state = self._runs.get(ticket.run)
            entry = None if state is None else state.open.get(ticket.number)
            if state is None or entry is None:
                return []  # a batch already released: cannot happen for a claimed row
            state.active = time.monotonic()
            if ok:
                entry.labels[ticket.row] = ticket.label
                entry.arrived += 1
            else:
                entry.failed[ticket.row] = (f"{type(row.error).__name__}: {row.error}"
                                            if isinstance(row, Failed) else "failed")
            if entry.spare and entry.complete and self._slabs is not None:
                self._slabs.release(entry.slab)  # every row is in: no worker maps it again
            first = state.next
            while (head := state.open.get(state.next)) is not None and head.complete:
                del state.open[state.next]
                state.done.append((state.next, head))
                state.next += 1
                self._skip_settled(state)
            if state.next > first:
                self._released.notify_all()
            ready = self._take_done(state)
            if state.next >= self.batches:
                del self._runs[ticket.run]  # every batch of this iteration is out
        size = self.batch_size
        self._first = True  # only the first float batch of a call waits for a buffer
        return [
            (self._release(entry) if entry.arrived else None,
             [number * size + r for r in range(entry.rows)
              if r not in entry.failed and r not in entry.absent])
            for number, entry in ready
        ]

    def _take_done(self, state: _Run) -> list[tuple[int, _Open]]:
        """The complete batches of ``state`` to release now, in order (lock held): with
        ``normalize``, one float batch a call while rows are to come, so that each is made
        only once the one before it was handed on (``_float_batches.py``)."""
        done = state.done
        if self._floats is None or state.next >= self.batches:
            ready = list(done)
            done.clear()
            return ready
        ready = []
        while done and not any(entry.arrived for _, entry in ready):
            ready.append(done.popleft())  # batches whose every row failed go along
        return ready

    def _skip_settled(self, state: _Run) -> None:
        """Past the batches whose every row was settled before a resume (lock held)."""
        skip, size = state.skip, self.batch_size
        if skip is None:
            return
        while state.next < self.batches and state.next not in state.open:
            low = state.next * size
            if next(skip.gaps(low, min(low + size, self.count)), None) is not None:
                return
            state.next += 1

    def _scratch_buffer(self) -> tuple[np.ndarray, str]:
        """The scratch buffer and its slab's name, for claims never assembled (lock held)."""
        if self._scratch is None:
            key = ((self.batch_size, *self.shape), self._np_dtype)
            if self._slabs is None:
                self._scratch = np.empty(*key), ""
            else:
                self._scratch = self._slabs.allocate(*key)
        return self._scratch

    def _run(self, run: int) -> _Run:
        state = self._runs.get(run)
        if state is None:
            if run in self._dropped:
                raise RuntimeError(f"the batches of iteration {run} were dropped")
            state = self._runs[run] = _Run(self._resume)
            self._resume = None
            self._skip_settled(state)
            # A run stopped part-way leaves its open batches behind, and nothing tells the
            # assembler it stopped. Past _RUNS open runs, the one idle longest is dropped,
            # loudly: if it was still going, its next row raises instead of losing batches.
            while len(self._runs) > _RUNS:
                idle = min(self._runs, key=lambda r: self._runs[r].active)
                del self._runs[idle]
                self._dropped.add(idle)
        state.active = time.monotonic()
        return state

    def pool_stats(self) -> PoolStats:
        """The batch buffers kept for reuse, and how often one was reused."""
        return self._buffers.stats()

    def _new_batch(self, rows: int) -> _Open:
        array = self._buffers.acquire(((self.batch_size, *self.shape), self._np_dtype))
        spare = not self._buffers.owns(array)
        # A spare's name goes with its batch (and is unlinked when that batch is complete);
        # its ``id`` may be reused once the array is gone.
        slab = self._names.pop(id(array), "") if spare else self._names.get(id(array), "")
        view = array[:rows]
        return _Open(torch.from_numpy(view), view, rows, slab, spare)

    def _release(self, entry: _Open) -> Batch:
        labels = torch.from_numpy(entry.labels)
        if not entry.failed and not entry.absent:
            return self._noted(entry, (self._finish(entry.tensor), labels))
        keep = torch.tensor(sorted(set(range(entry.rows)) - set(entry.failed) - set(entry.absent)))
        batch = self._finish(entry.tensor.index_select(0, keep)), labels.index_select(0, keep)
        return self._noted(entry, batch)

    def _finish(self, images: torch.Tensor) -> torch.Tensor:
        """The released images: normalized into a recycled float buffer (the uint8 one goes
        back to the pool at once), or the buffer itself."""
        if self._floats is None:
            return images
        wait, self._first = self._first, False  # a second one: the first is not handed on
        return self._floats.normalize(images, wait=wait)

    def _noted(self, entry: _Open, batch: Batch) -> Batch:
        """Note on the batch's labels which batch this is, and its failed rows, when a journal
        reads them: the note goes where the batch goes, and with it."""
        if self.journaled:
            setattr(batch[1], _NOTE, (*entry.key, list(entry.failed.items()), list(entry.absent)))
        return batch

    @staticmethod
    def take_note(labels: Any) -> Any:
        """The ``(run, batch number, failed rows, absent rows)`` of a released batch, taken
        off its labels tensor (once; ``None``: not noted, or taken already)."""
        return getattr(labels, "__dict__", {}).pop(_NOTE, None)
