"""One buffer recycler: batch buffers made once and reused, for every feature that needs them.

A fresh batch-sized buffer costs more than the copy into it (page faults for ordinary memory;
a system call and page-table work for pinned memory), so ``asyncflow.cache`` (shuffled replay),
``asyncflow.torch`` (pinned staging for ``to_device``) and ``asyncflow.image`` (batch slabs)
each recycle theirs through a :class:`Recycler`:

- Buffers are filed by a *key* (shape and dtype, a kind of memory...); within a key, a request
  for ``need`` bytes takes the smallest free buffer of at least that many bytes.
- At most ``limit`` buffers are kept per key.
- A buffer comes back in one of two ways (``returned``):

  - ``"release"``: the holder calls :meth:`Recycler.release`, or :meth:`Recycler.release_after`
    with a fence (a CUDA event: the copy that reads the buffer is done when it completes).
    A key at its limit makes :meth:`Recycler.acquire` wait for a buffer to come back.
  - ``"unreferenced"``: a buffer is free once nothing but the recycler refers to it. The count
    is exact for NumPy arrays: a view, or a tensor made by ``torch.from_numpy``, holds a
    reference to the array it was made from. A key at its limit gets a *spare*: a buffer
    made for one use and not kept.

Thread-safe; :meth:`Recycler.stats` counts buffers, bytes and reuse.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from ._errors import ConfigError, check_int

__all__ = ["Fence", "PoolStats", "Recycler"]

K = TypeVar("K", bound=Hashable)
B = TypeVar("B")

# References to a kept buffer while :meth:`Recycler._unreferenced` looks at it: its key's
# list, the loop variable and ``getrefcount``'s argument. Anything more is a holder.
_ONLY_OURS = 3


class Fence(Protocol):
    """What the recycler waits on before reusing a buffer; ``torch.cuda.Event`` is one."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a buffer pool (a :class:`Recycler`, or ``asyncflow.torch.PinnedPool``).

    Attributes:
        buffers: Buffers kept and not yet freed.
        allocated_bytes: Their total size.
        in_use: Buffers handed out and not yet back.
        pending: Buffers released but waiting for their fence.
        hits: Requests served by a buffer already made.
        misses: Requests that made a buffer.
        spares: Of the misses, buffers made beyond the limit and not kept.
    """

    buffers: int
    allocated_bytes: int
    in_use: int
    pending: int
    hits: int
    misses: int
    spares: int = 0


class Recycler(Generic[K, B]):
    """Buffers filed by key, made by ``make`` and reused (see the module's docstring).

    Args:
        make: ``make(key, need)`` returns a new buffer for ``key`` of at least ``need`` bytes.
        nbytes: A buffer's size in bytes.
        limit: How many buffers to keep per key (>= 1).
        returned: ``"release"`` or ``"unreferenced"``: how a buffer comes back.
        on_drop: Called with each buffer the recycler stops holding (replaced by a bigger one,
            or dropped by :meth:`close`), for the caller's accounting.
    """

    def __init__(
        self,
        make: Callable[[K, int], B],
        *,
        nbytes: Callable[[B], int],
        limit: int,
        returned: Literal["release", "unreferenced"] = "release",
        on_drop: Callable[[B], object] | None = None,
    ) -> None:
        check_int("limit", limit)
        if returned not in ("release", "unreferenced"):
            raise ConfigError(f"returned must be 'release' or 'unreferenced', got {returned!r}")
        self._make, self._nbytes, self.limit = make, nbytes, limit
        self._by_release = returned == "release"
        self._on_drop = on_drop
        self._cond = threading.Condition()
        self._free: dict[K, list[B]] = {}  # every kept buffer, when returned="unreferenced"
        self._in_use: dict[int, tuple[K, B]] = {}
        self._pending: deque[tuple[K, B, Fence]] = deque()
        self._hits = self._misses = self._spares = 0
        self.closed = False

    def acquire(self, key: K, need: int = 0) -> B:
        """A buffer for ``key`` of at least ``need`` bytes that nobody else holds.

        A free one if there is one (the smallest that fits); else a new one, kept while the
        key holds fewer than ``limit``. At the limit, a free buffer too small for ``need`` is
        replaced; otherwise ``"release"`` waits for the oldest fence or another thread's
        release, and ``"unreferenced"`` makes a spare.

        Raises:
            RuntimeError: The recycler is closed.

        Cancellation:
            With ``returned="release"`` it may block the calling thread (a fence's
            ``synchronize()``, or a wait for a release): call it from a worker thread, not an
            event loop. It cannot be interrupted.
        """
        with self._cond:
            while True:
                if self.closed:
                    raise RuntimeError("this buffer pool is closed")
                if not self._by_release:
                    return self._unreferenced(key, need)
                buf = self._take_released(key, need)
                if buf is not None:
                    self._in_use[id(buf)] = (key, buf)
                    return buf
                if any(k == key for k, _, _ in self._pending):
                    self._pending[0][2].synchronize()
                else:
                    self._cond.wait()

    def owns(self, buf: B) -> bool:
        """Whether ``buf`` is kept (``False`` for a spare, or after :meth:`close`)."""
        with self._cond:
            if self._by_release:
                return id(buf) in self._in_use
            return any(b is buf for kept in self._free.values() for b in kept)

    def release(self, buf: B) -> None:
        """Give ``buf`` back for immediate reuse (nothing reads it any more).

        Raises:
            ValueError: ``buf`` is not in use from this recycler (or ``returned`` is
                ``"unreferenced"``).
        """
        with self._cond:
            key = self._forget(buf)
            if self.closed:
                self._drop(buf)
            else:
                self._free.setdefault(key, []).append(buf)
            self._cond.notify_all()

    def release_after(self, buf: B, fence: Fence) -> None:
        """Give ``buf`` back once ``fence`` has completed (the copy reading it is done).

        Raises:
            ValueError: As :meth:`release`.
        """
        with self._cond:
            key = self._forget(buf)
            if self.closed:
                self._drop(buf)  # torch's host allocator defers reuse past the copy
            else:
                self._pending.append((key, buf, fence))
            self._cond.notify_all()

    def close(self) -> None:
        """Wait for pending fences and drop every buffer not in use. Idempotent.

        Buffers still in use are dropped when their holder releases them.

        Cancellation:
            Blocks on the pending fences' ``synchronize()``; it cannot be interrupted.
        """
        with self._cond:
            self.closed = True
            for _, _, fence in self._pending:
                fence.synchronize()
            dropped = [b for kept in self._free.values() for b in kept]
            dropped += [b for _, b, _ in self._pending]
            self._free.clear()
            self._pending.clear()
            for buf in dropped:
                self._drop(buf)
            self._cond.notify_all()

    def held(self) -> list[B]:
        """Every buffer the recycler holds: free, in use and pending."""
        with self._cond:
            return [*(b for kept in self._free.values() for b in kept),
                    *(b for _, b in self._in_use.values()), *(b for _, b, _ in self._pending)]

    def stats(self) -> PoolStats:
        """How many buffers and bytes the recycler holds, and how often it reused one."""
        with self._cond:
            held = self.held()
            in_use = len(self._in_use) if self._by_release else sum(
                sys.getrefcount(b) > _ONLY_OURS + 1 for b in held  # + the list ``held``
            )
            return PoolStats(
                buffers=len(held), allocated_bytes=sum(self._nbytes(b) for b in held),
                in_use=in_use, pending=len(self._pending), hits=self._hits,
                misses=self._misses, spares=self._spares,
            )

    def _unreferenced(self, key: K, need: int) -> B:
        kept = self._free.setdefault(key, [])
        best: B | None = None
        for buf in kept:
            if sys.getrefcount(buf) == _ONLY_OURS and self._nbytes(buf) >= need and (
                best is None or self._nbytes(buf) < self._nbytes(best)
            ):
                best = buf
        if best is not None:
            self._hits += 1
            return best
        buf = self._new(key, need)
        if len(kept) < self.limit:
            kept.append(buf)
        else:
            self._spares += 1
        return buf

    def _take_released(self, key: K, need: int) -> B | None:
        while self._pending and self._pending[0][2].query():
            done_key, done, _ = self._pending.popleft()
            self._free.setdefault(done_key, []).append(done)
        free = self._free.setdefault(key, [])
        fitting = [i for i, b in enumerate(free) if self._nbytes(b) >= need]
        if fitting:
            # by position: ``list.remove`` would compare tensors element-wise
            self._hits += 1
            return free.pop(min(fitting, key=lambda i: self._nbytes(free[i])))
        count = len(free) + sum(k == key for k, _ in self._in_use.values())
        count += sum(k == key for k, _, _ in self._pending)
        if count < self.limit:
            return self._new(key, need)
        if free:  # every free buffer is too small: replace the smallest
            free.sort(key=self._nbytes)
            self._drop(free.pop(0))
            return self._new(key, need)
        return None

    def _new(self, key: K, need: int) -> B:
        self._misses += 1
        return self._make(key, need)

    def _forget(self, buf: B) -> K:
        entry = self._in_use.pop(id(buf), None) if self._by_release else None
        if entry is None:
            raise ValueError("this buffer was not acquired from this pool, or was released twice")
        return entry[0]

    def _drop(self, buf: B) -> None:
        if self._on_drop is not None:
            self._on_drop(buf)
