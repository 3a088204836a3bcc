"""A bounded pool of reusable pinned (page-locked) host buffers for host-to-device copies.

Staging a batch in pinned memory is what lets ``copy_(non_blocking=True)`` run asynchronously
and at full bus speed, but pinning is slow (a system call and page-table work per allocation)
and pinned memory is a scarce, non-swappable resource. The pool keeps at most ``max_buffers``
buffers, hands out the smallest free one that fits, and takes a buffer back only when the
copy that reads it has finished: :meth:`PinnedPool.release_after` pairs it with a fence (a
CUDA event, or anything with ``query()`` and ``synchronize()``). The recycling itself is
``asyncflow/_recycle.py``'s, which the cache's and ``image.folder``'s batch buffers share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from .._errors import check_int
from .._recycle import Fence, PoolStats, Recycler

__all__ = ["Fence", "PinnedPool", "PoolStats", "held_bytes"]

_ALIGN = 256


def _pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def align(offset: int) -> int:
    """``offset`` rounded up so a tensor of any dtype may start there."""
    return -(-offset // _ALIGN) * _ALIGN


_held_lock = threading.Lock()
_held_bytes = 0


def held_bytes() -> int:
    """Bytes held right now by every :class:`PinnedPool` of the process (for leak checks)."""
    return _held_bytes


def _count_held(delta: int) -> None:
    global _held_bytes
    with _held_lock:
        _held_bytes += delta


class PinnedPool(AbstractContextManager["PinnedPool"]):
    """At most ``max_buffers`` pinned byte buffers, reused across batches.

    Thread-safe: stage threads may acquire and release concurrently.

    Args:
        max_buffers: How many buffers may exist at once; this many batches can be in flight.
        granularity: Buffer sizes are rounded up to a multiple of this many bytes, so that
            batches of slightly different sizes reuse one another's buffers.
        allocate: ``allocate(nbytes)`` returns a 1-D ``uint8`` tensor. Pinned memory by
            default; the tests pass ordinary memory.

    Memory: at most ``max_buffers`` times the largest batch (rounded up) is held, until
    :meth:`close` (or the end of a ``with`` block).
    """

    def __init__(
        self,
        max_buffers: int = 4,
        *,
        granularity: int = 1 << 20,
        allocate: Callable[[int], torch.Tensor] = _pinned,
    ) -> None:
        check_int("max_buffers", max_buffers, 1)
        check_int("granularity", granularity)
        self.max_buffers = max_buffers

        def make(_: None, nbytes: int) -> torch.Tensor:
            buf = allocate(max(1, -(-nbytes // granularity)) * granularity)
            _count_held(len(buf))
            return buf

        # one key: any buffer big enough serves any request
        self._buffers: Recycler[None, torch.Tensor] = Recycler(
            make, nbytes=len, limit=max_buffers, on_drop=lambda buf: _count_held(-len(buf))
        )

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``nbytes`` bytes; use ``buf[:nbytes]``.

        Blocks while all ``max_buffers`` buffers are taken: it waits for the oldest pending
        fence (the oldest copy) or for another thread's :meth:`release`.

        Raises:
            RuntimeError: The pool is closed.

        Cancellation:
            Blocks the calling thread; call it from a worker thread, not an event loop.
        """
        return self._buffers.acquire(None, nbytes)

    def release(self, buf: torch.Tensor) -> None:
        """Give ``buf`` back for immediate reuse (nothing reads it any more).

        Raises:
            ValueError: ``buf`` was not acquired from this pool, or was released already.
        """
        self._buffers.release(buf)

    def release_after(self, buf: torch.Tensor, fence: Fence) -> None:
        """Give ``buf`` back once ``fence`` has completed (the copy reading it is done)."""
        self._buffers.release_after(buf, fence)

    def close(self) -> None:
        """Wait for pending copies and free every buffer the pool holds. Idempotent.

        Buffers still handed out are freed when their holder releases them.

        Cancellation:
            Blocks the calling thread until pending copies are done.
        """
        self._buffers.close()

    def stats(self) -> PoolStats:
        """How many buffers and bytes the pool holds, and how often it reused one."""
        return self._buffers.stats()

    def __del__(self) -> None:
        # Accounting only: the buffers go with the pool (torch's host allocator keeps their
        # memory from reuse until copies that read it are done).
        buffers = getattr(self, "_buffers", None)
        if buffers is not None and not buffers.closed:
            _count_held(-sum(len(b) for b in buffers.held()))

    def __exit__(self, *exc: object) -> None:
        self.close()
