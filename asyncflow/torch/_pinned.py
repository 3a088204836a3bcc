"""A bounded pool of reusable pinned (page-locked) host buffers for host-to-device copies.

Staging a batch in pinned memory is what lets ``copy_(non_blocking=True)`` run asynchronously
and at full bus speed, but pinning is slow (a system call and page-table work per allocation)
and pinned memory is a scarce, non-swappable resource. The pool keeps at most ``max_buffers``
buffers, hands out the smallest free one that fits, and takes a buffer back only when the
copy that reads it has finished: :meth:`PinnedPool.release_after` pairs it with a fence (a
CUDA event, or anything with ``query()`` and ``synchronize()``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .._errors import ConfigError

__all__ = ["Fence", "PinnedPool", "PoolStats", "held_bytes"]

_ALIGN = 256


class Fence(Protocol):
    """What the pool waits on before reusing a buffer; ``torch.cuda.Event`` is one."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a :class:`PinnedPool`.

    Attributes:
        buffers: Buffers allocated and not yet freed.
        allocated_bytes: Their total size.
        in_use: Buffers handed out and not yet released.
        pending: Buffers released but waiting for their fence.
        hits: Acquisitions served by a buffer already allocated.
        misses: Acquisitions that allocated a buffer.
    """

    buffers: int
    allocated_bytes: int
    in_use: int
    pending: int
    hits: int
    misses: int


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


class PinnedPool:
    """At most ``max_buffers`` pinned byte buffers, reused across batches.

    Thread-safe: stage threads may acquire and release concurrently.

    Args:
        max_buffers: How many buffers may exist at once; this many batches can be in flight.
        granularity: Buffer sizes are rounded up to a multiple of this many bytes, so that
            batches of slightly different sizes reuse one another's buffers.
        allocate: ``allocate(nbytes)`` returns a 1-D ``uint8`` tensor. Pinned memory by
            default; the tests pass ordinary memory.

    Memory: at most ``max_buffers`` times the largest batch (rounded up) is held, until
    :meth:`close`.
    """

    def __init__(
        self,
        max_buffers: int = 4,
        *,
        granularity: int = 1 << 20,
        allocate: Callable[[int], torch.Tensor] = _pinned,
    ) -> None:
        if isinstance(max_buffers, bool) or not isinstance(max_buffers, int) or max_buffers < 1:
            raise ConfigError(f"max_buffers must be an int >= 1, got {max_buffers!r}")
        if granularity < 1:
            raise ConfigError(f"granularity must be >= 1, got {granularity!r}")
        self.max_buffers = max_buffers
        self._granularity = granularity
        self._allocate = allocate
        self._cond = threading.Condition()
        self._free: list[torch.Tensor] = []
        self._in_use: dict[int, torch.Tensor] = {}
        self._pending: deque[tuple[torch.Tensor, Fence]] = deque()
        self._hits = self._misses = 0
        self._closed = False

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``nbytes`` bytes; use ``buf[:nbytes]``.

        Blocks while all ``max_buffers`` buffers are taken: it waits for the oldest pending
        fence (the oldest copy) or for another thread's :meth:`release`.

        Raises:
            RuntimeError: The pool is closed.

        Cancellation:
            Blocks the calling thread; call it from a worker thread, not an event loop.
        """
        with self._cond:
            while True:
                self._check_open()
                self._reclaim()
                buf = self._take_free(nbytes)
                if buf is None and self._count() < self.max_buffers:
                    buf = self._new(nbytes)
                if buf is None and self._free:
                    self._free.sort(key=len)
                    # every free buffer is too small: replace the smallest
                    _count_held(-len(self._free.pop(0)))
                    buf = self._new(nbytes)
                if buf is not None:
                    self._in_use[id(buf)] = buf
                    return buf
                if self._pending:
                    self._pending[0][1].synchronize()
                else:
                    self._cond.wait()

    def release(self, buf: torch.Tensor) -> None:
        """Give ``buf`` back for immediate reuse (nothing reads it any more)."""
        with self._cond:
            self._forget(buf)
            if self._closed:
                _count_held(-len(buf))
            else:
                self._free.append(buf)
            self._cond.notify()

    def release_after(self, buf: torch.Tensor, fence: Fence) -> None:
        """Give ``buf`` back once ``fence`` has completed (the copy reading it is done)."""
        with self._cond:
            self._forget(buf)
            if self._closed:
                _count_held(-len(buf))  # torch's host allocator defers reuse past the copy
            else:
                self._pending.append((buf, fence))
            self._cond.notify()

    def close(self) -> None:
        """Wait for pending copies and free every buffer the pool holds. Idempotent.

        Buffers still handed out are freed when their holder releases them.
        """
        with self._cond:
            self._closed = True
            for _, fence in self._pending:
                fence.synchronize()
            dropped = [*self._free, *(b for b, _ in self._pending)]
            self._pending.clear()
            self._free.clear()
            _count_held(-sum(len(b) for b in dropped))
            self._cond.notify_all()

    def stats(self) -> PoolStats:
        """How many buffers and bytes the pool holds, and how often it reused one."""
        with self._cond:
            held = [*self._free, *self._in_use.values(), *(b for b, _ in self._pending)]
            return PoolStats(
                buffers=len(held),
                allocated_bytes=sum(len(b) for b in held),
                in_use=len(self._in_use),
                pending=len(self._pending),
                hits=self._hits,
                misses=self._misses,
            )

    def __del__(self) -> None:
        # Accounting only: the buffers go with the pool (torch's host allocator keeps their
        # memory from reuse until copies that read it are done).
        if not getattr(self, "_closed", True):
            held = [*self._free, *self._in_use.values(), *(b for b, _ in self._pending)]
            _count_held(-sum(len(b) for b in held))

    def __enter__(self) -> PinnedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this pinned-buffer pool is closed")

    def _count(self) -> int:
        return len(self._free) + len(self._in_use) + len(self._pending)

    def _reclaim(self) -> None:
        while self._pending and self._pending[0][1].query():
            self._free.append(self._pending.popleft()[0])

    def _take_free(self, nbytes: int) -> torch.Tensor | None:
        fitting = [i for i, b in enumerate(self._free) if len(b) >= nbytes]
        if not fitting:
            return None
        # by position: ``list.remove`` would compare tensors element-wise
        best = min(fitting, key=lambda i: len(self._free[i]))
        self._hits += 1
        return self._free.pop(best)

    def _new(self, nbytes: int) -> torch.Tensor:
        size = max(1, -(-nbytes // self._granularity)) * self._granularity
        buf = self._allocate(size)
        self._misses += 1
        _count_held(len(buf))
        return buf

    def _forget(self, buf: torch.Tensor) -> None:
        if self._in_use.pop(id(buf), None) is None:
            raise ValueError("this buffer was not acquired from this pool, or was released twice")
