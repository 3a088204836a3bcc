"""The float batches that ``image.folder`` releases: uint8 batches normalized into two buffers.

Decoders write uint8 rows; the ``batch`` stage normalizes each batch as it releases it, in two
NumPy passes with the kernel's own scale and offset (bit for bit its per-row arithmetic), on
the run's loop thread (NumPy, one thread: torch's pool would spin on the decoders' cores).

How many float batches exist is set by where they wait. ``image.folder`` gives its ``batch``
stage's output a byte budget of one batch, so that the consumer's hand-off holds none while
the consumer has one (the hand-off counts the consumer's batch until it asks for the next),
and the assembler releases one float batch per row that arrives (``_slots.py``): one float
batch is in the consumer's hands, and one waits, made, in the ``batch`` stage. So
:class:`FloatBatches` keeps two buffers (:data:`FLOAT_POOL`), recycled once nothing refers to
them (``asyncflow/_recycle.py``'s ``"unreferenced"``): a batch the consumer holds, or any view
of it, is never written over. Right after the consumer takes a batch the stage may release
the next one before the consumer has let go of its previous one (its loop variable still
holds it, or its thread has not run yet); the stage then waits for it, up to
:data:`PATIENCE`, woken as the last reference to it goes (not polling), rather than making a
third buffer. A consumer that holds more batches (two at a time, or ``list(pipe)``) makes a
wait run out: the pool then keeps one more buffer (one wait each), up to
:data:`FLOAT_POOL_MAX`; past that, spares, made without waiting until a kept buffer is free
again. The last row of a run may complete two batches at once: the second then gets a spare
(the first is not handed on yet). Buffers are private anonymous mappings, so that a spare's
memory goes back to the system as soon as it is dropped (19 MB blocks freed to malloc stay in
its arenas).

On 2 cores, 1,024 JPEGs, batches of 32 at 224: two float buffers where three or four were
made before (18.4 MiB each; docs/performance.md).
"""

from __future__ import annotations

import mmap
import queue
import time
import weakref
from typing import Any

import numpy as np
import torch

from .._recycle import PoolStats, Recycler
from ._modes import affine

__all__ = ["FLOAT_POOL", "FLOAT_POOL_MAX", "PATIENCE", "FloatBatches"]

#: Float buffers kept at first: the batch the consumer holds, and the one waiting for it.
FLOAT_POOL = 2
#: The most kept for a consumer that holds several batches (past it, spares).
FLOAT_POOL_MAX = 6
#: Longest wait, in seconds, for the consumer to let go of a float batch (then one more is kept).
PATIENCE = 0.1

_Key = tuple[tuple[int, ...], np.dtype[Any]]


def _anonymous(key: _Key, need: int) -> np.ndarray:
    """A new buffer over a private anonymous mapping (unmapped when the array goes)."""
    shape, dtype = key
    size = int(np.prod(shape)) * dtype.itemsize
    # np.ndarray over the mapping: the views handed out have this array as their base, which
    # is how the pool tells a free buffer by its reference count.
    return np.ndarray(shape, dtype, buffer=mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE))


class FloatBatches:
    """uint8 ``N x 3 x H x W`` batches normalized, ``(x / 255 - mean) / std``, into recycled
    float32 buffers (see the module).

    Called from one thread (the ``batch`` stage's, on the run's loop).

    Args:
        shape: A full batch's ``(N, 3, H, W)``.
        mean, std: Per-channel statistics on a 0-1 scale.
    """

    def __init__(self, shape: tuple[int, ...], mean: tuple[float, ...],
                 std: tuple[float, ...]) -> None:
        self._key: _Key = (tuple(shape), np.dtype(np.float32))
        scale, offset = affine(mean, std)
        self._scale, self._offset = scale[:, None, None], offset[:, None, None]
        self._pool: Recycler[_Key, np.ndarray] = Recycler(
            _anonymous, nbytes=lambda a: a.nbytes, limit=FLOAT_POOL, returned="unreferenced",
        )
        # The kept buffers' exporters that went (see _watch), and each kept buffer's watch.
        self._freed: queue.SimpleQueue[weakref.ref[np.ndarray]] = queue.SimpleQueue()
        self._watches: dict[int, weakref.ref[np.ndarray]] = {}
        self._pressed = False  # every kept buffer held, FLOAT_POOL_MAX of them
        #: Releases that waited for the consumer to let go of a batch, and how long in all.
        self.waits = 0
        self.waited = 0.0

    def normalize(self, images: torch.Tensor, *, wait: bool = True) -> torch.Tensor:
        """``images`` (uint8) as a float32 tensor over a recycled buffer.

        Args:
            images: A uint8 ``n x 3 x H x W`` tensor, ``n`` at most the batch size.
            wait: Wait for a kept buffer when none is free (see the module); ``False``: a
                spare then (the second batch that one call releases: the first one is not
                handed on yet).

        Cancellation:
            May block the calling thread up to :data:`PATIENCE` seconds (see the module); it
            cannot be interrupted.
        """
        base = self._buffer(wait)
        out = base[:len(images)]
        np.multiply(images.numpy(), self._scale, out=out, dtype=np.float32)
        out += self._offset
        if self._pool.owns(base):
            self._watch(base, out)
        return torch.from_numpy(out)

    def stats(self) -> PoolStats:
        """The float buffers kept, and how often one was reused (``spares``: made beyond)."""
        return self._pool.stats()

    def _watch(self, base: np.ndarray, out: np.ndarray) -> None:
        """Queue ``out`` on :attr:`_freed` as it goes, which frees ``base`` (a kept buffer).

        ``out``, the view the tensor is made from, is the batch's one exporter: the tensor's
        storage refers to it, and so do NumPy views of the tensor (through the tensor, the base
        of ``tensor.numpy()``); besides the pool, nothing refers to ``base``. So ``out`` goes when
        the last view, tensor or array does, in whichever thread drops it. The tensor itself
        may go first (a view ``batch[0]`` kept). The callback is C code (``SimpleQueue.put``),
        so the dropping thread holds the GIL from it until ``out`` has let go of ``base``: a
        waiter woken by it sees ``base`` free.
        """
        self._watches[id(base)] = weakref.ref(out, self._freed.put)

    def _buffer(self, wait: bool) -> np.ndarray:
        pool = self._pool
        while not self._freed.empty():  # releases from before: _free() sees them
            self._freed.get_nowait()
        if self._free():
            self._pressed = False
        elif wait and not self._pressed and not self._wait():
            # The consumer holds every kept buffer: keep one more, up to FLOAT_POOL_MAX;
            # past it, spares without waiting until a kept buffer is free again.
            if pool.limit < FLOAT_POOL_MAX:
                pool.limit += 1
            else:
                self._pressed = True
        return pool.acquire(self._key)

    def _wait(self) -> bool:
        """Wait up to :data:`PATIENCE` for a kept buffer to be let go; whether one was."""
        start = time.monotonic()
        self.waits += 1
        try:
            while not self._free():
                left = PATIENCE - (time.monotonic() - start)
                try:
                    self._freed.get(timeout=max(left, 0))  # woken as a kept buffer goes free
                except queue.Empty:
                    return False
            return True
        finally:
            self.waited += time.monotonic() - start

    def _free(self) -> bool:
        """Whether a buffer can be had without a spare: a kept one free, or room to keep one."""
        stats = self._pool.stats()
        return stats.buffers < self._pool.limit or stats.in_use < stats.buffers
