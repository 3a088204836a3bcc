"""The channels that join the stages of one run: one base, two kinds of reader.

A channel counts *items*, but moves them in chunks: a stage puts whatever it has ready and the
next stage takes up to as many as it can use in one go, so a cheap stage pays the queue's
bookkeeping once per chunk rather than once per item, while the bound on items (and, with a
byte budget, on bytes) keeps memory bounded whatever the chunk sizes are.

:class:`ChannelBase` owns everything but the reader's wait: the buffer, the item and byte
accounting, the writer side (writers always run on the run's loop), close and abort, the end
of the stream and the error left for the reader. Two variants add a reader:

* :class:`Channel`: between two stages; readers are coroutines on the run's loop.
* :class:`~asyncflow.pipeline._bridge.Handoff`: the last channel, read by the consumer from
  its own thread or its own loop (thread-safe).
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections import deque
from typing import Any

from ..workers import settle_all

__all__ = ["ALL", "Channel", "ChannelAborted", "ChannelBase", "nbytes_of"]

#: "Every reader": the count given to ``_readers_ready`` when the stream ends.
ALL = 1 << 62


def nbytes_of(obj: Any, depth: int = 0) -> int:
    """The bytes an item holds, as far as can be told cheaply: ``nbytes`` of arrays, tensors
    and memoryviews, the length of ``bytes`` and ``str``, summed over tuples, lists and dict
    values (three levels deep); 0 for anything else."""
    n = getattr(obj, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(obj, bytes | bytearray | str):
        return len(obj)
    if depth < 3:
        if isinstance(obj, tuple | list):
            return sum(nbytes_of(x, depth + 1) for x in obj)
        if isinstance(obj, dict):
            return sum(nbytes_of(x, depth + 1) for x in obj.values())
    return 0


class ChannelAborted(Exception):
    """The run is stopping: the other side of the channel went away (internal, never raised
    to users)."""


class ChannelBase(abc.ABC):
    """A bounded FIFO of items, written on the run's loop; subclasses add the reader.

    Every change of state happens with ``_lock`` held, so that a reader on another thread
    sees it whole; a reader on the run's loop never contends for it.

    Args:
        capacity: The most items held.
        max_bytes: The most bytes the items held may hold (see :func:`nbytes_of`). An item
            larger than that on its own still passes when the channel is empty (nothing
            held, nothing lent). ``None``: no limit.
        lend: With a byte budget, whether the chunk a reader took still counts until that
            reader asks for the next one (so that what waits and what the reader holds stay
            within the budget together).
    """

    __slots__ = ("_aborted", "_bytes", "_closed", "_error", "_items", "_lend", "_lent",
                 "_lock", "_putters", "_sizes", "capacity", "max_bytes")

    def __init__(self, capacity: int, max_bytes: int | None = None, *, lend: bool = False) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._lend = lend
        self._lock = threading.Lock()
        self._items: deque[Any] = deque()
        self._sizes: deque[int] = deque()  # in step with _items, with a byte budget only
        self._bytes = 0
        self._lent = 0  # bytes of the reader's current chunk (with ``lend``)
        self._putters: deque[asyncio.Future[None]] = deque()  # writers, on the run's loop
        self._closed = False
        self._aborted = False
        self._error: BaseException | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """True once the writer has ended the stream (or the channel was aborted)."""
        return self._closed or self._aborted

    @property
    def nbytes(self) -> int:
        """Bytes held now, and lent to the reader (counted only with a byte budget)."""
        return self._bytes + self._lent

    def fullness(self) -> float:
        """How full the channel is now, 0 to 1: by its items, or by its bytes (those lent to
        the reader included) where a byte budget makes it fuller. Read without the lock: a
        sample for statistics."""
        full = len(self._items) / self.capacity if self.capacity else 0.0
        if self.max_bytes:
            full = max(full, (self._bytes + self._lent) / self.max_bytes)
        return min(full, 1.0)

    # -- hooks of the reader's variant -------------------------------------------------------

    @abc.abstractmethod
    def _readers_ready(self, count: int) -> None:
        """``count`` items arrived (:data:`ALL`: the stream ended): wake readers that wait
        (lock held)."""

    def _resolve_writers(self, waiters: list[asyncio.Future[None]]) -> None:
        """Wake ``waiters`` (writers' futures on the run's loop) from the reader's side; never
        blocks, so it may run with or without the lock held."""
        settle_all(waiters)

    # -- writer side (the run's loop) -------------------------------------------------------

    async def put(self, item: Any) -> None:
        """Append one item, waiting while the channel is full.

        Cancellation:
            Safe: the item is either appended or not.
        """
        if self.max_bytes is None:
            with self._lock:
                if not self._aborted and len(self._items) < self.capacity:
                    self._items.append(item)
                    self._readers_ready(1)
                    return
        await self.put_many([item])

    async def put_many(self, items: list[Any]) -> None:
        """Append ``items`` in order, as many at a time as fit, waiting while none fits.

        Raises:
            ChannelAborted: The channel was aborted (before or while waiting).

        Cancellation:
            Items appended before the cancellation stay in the channel.
        """
        sizes = [nbytes_of(item) for item in items] if self.max_bytes is not None else None
        start, total = 0, len(items)
        while start < total:
            with self._lock:
                if self._aborted:
                    raise ChannelAborted
                room = self._room(sizes, start, total)
                if room > 0:
                    self._append(items, sizes, start, start + room)
                    start += room
                    continue
                fut = asyncio.get_running_loop().create_future()
                self._putters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                with self._lock:
                    if fut in self._putters:
                        self._putters.remove(fut)
                raise

    def try_put_many(self, items: list[Any]) -> bool:
        """Append all of ``items`` if they fit now; never waits.

        Returns:
            Whether they were appended (all of them), or none was (no room now).

        Raises:
            ChannelAborted: The channel was aborted.
        """
        sizes = [nbytes_of(item) for item in items] if self.max_bytes is not None else None
        with self._lock:
            if self._aborted:
                raise ChannelAborted
            if self._room(sizes, 0, len(items)) < len(items):
                return False
            self._append(items, sizes, 0, len(items))
            return True

    def _room(self, sizes: list[int] | None, start: int, total: int) -> int:
        """How many of the items from ``start`` fit now (lock held)."""
        held = len(self._items)
        room = min(total - start, self.capacity - held)
        if sizes is None or room <= 0:
            return max(0, room)
        assert self.max_bytes is not None
        budget = self.max_bytes - self._bytes - self._lent
        fit = 0
        empty = held == 0 and self._lent == 0
        while fit < room and (sizes[start + fit] <= budget or (empty and fit == 0)):
            budget -= sizes[start + fit]
            fit += 1
        return fit

    def _append(self, items: list[Any], sizes: list[int] | None, start: int, end: int) -> None:
        self._items.extend(items if start == 0 and end == len(items) else items[start:end])
        if sizes is not None:
            self._sizes.extend(sizes[start:end])
            self._bytes += sum(sizes[start:end])
        self._readers_ready(end - start)

    def close(self, error: BaseException | None = None) -> None:
        """End the stream: readers drain what is left, then get the end (after which a
        :class:`~asyncflow.pipeline._bridge.Handoff` reader gets ``error``, once).

        After :meth:`abort`, the error given there (if any) stands. Thread-safe.
        """
        with self._lock:
            if not self._closed and not self._aborted:
                self._error = error
            self._closed = True
            self._readers_ready(ALL)

    def abort(self, error: BaseException | None = None) -> None:
        """Stop both sides: drop what is held; pending and later puts raise
        :class:`ChannelAborted` (what readers get is the variant's). Thread-safe.

        Args:
            error: What ended the run before the stop, if anything (see :meth:`take_pending`).
        """
        with self._lock:
            if not self._aborted and not self._closed:
                self._error = error
            self._aborted = True
            self._items.clear()
            self._sizes.clear()
            self._bytes = self._lent = 0
            self._readers_ready(ALL)
            writers = self._take_putters()
        self._resolve_writers(writers)

    def take_pending(self) -> BaseException | None:
        """Take the error no reader has been given yet (the reader has left), if any."""
        with self._lock:
            error, self._error = self._error, None
        return error

    # -- reader side: what both variants share ----------------------------------------------

    def _take(self, limit: int) -> list[Any]:
        """Take up to ``limit`` items (lock held, at least one item held)."""
        items = self._items
        if limit >= len(items):
            taken = list(items)
            items.clear()
        else:
            popleft = items.popleft
            taken = [popleft() for _ in range(limit)]
        if self.max_bytes is not None:
            popsize = self._sizes.popleft
            size = sum(popsize() for _ in range(len(taken)))
            self._bytes -= size
            if self._lend:  # the previous chunk is done with (the reader is back): this one counts
                self._lent = size
        return taken

    def _take_putters(self) -> list[asyncio.Future[None]]:
        """The writers to wake now that room came back: all of them re-check (lock held)."""
        woken = list(self._putters)
        self._putters.clear()
        return woken


class Channel(ChannelBase):
    """A channel between two stages of one run: readers are coroutines on the run's loop.

    ``close()`` marks the end of the stream (readers drain what is left, then receive ``[]``);
    ``abort()`` stops both sides at once (every pending and later call raises
    :class:`ChannelAborted`). See :class:`ChannelBase` for the arguments.
    """

    __slots__ = ("_getters",)

    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        super().__init__(capacity, max_bytes)
        self._getters: deque[asyncio.Future[None]] = deque()

    def _readers_ready(self, count: int) -> None:
        _wake(self._getters, count)

    async def get_many(self, limit: int) -> list[Any]:
        """Take up to ``limit`` items, waiting for at least one; ``[]`` at the end of stream.

        Raises:
            ChannelAborted: The channel was aborted (before or while waiting).

        Cancellation:
            Safe: nothing is taken unless the call returns.
        """
        items = self._items
        while not items:
            if self._aborted:
                raise ChannelAborted
            if self._closed:
                return []
            fut = asyncio.get_running_loop().create_future()
            getters = self._getters
            getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    _wake(getters, 1)  # woken, then cancelled: the wake-up goes to the next
                elif fut in getters:
                    getters.remove(fut)
                raise
        with self._lock:
            taken = self._take(limit)
            writers = self._take_putters()
        self._resolve_writers(writers)
        return taken


def _wake(waiters: deque[asyncio.Future[None]], count: int) -> None:
    while waiters and count > 0:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            count -= 1
