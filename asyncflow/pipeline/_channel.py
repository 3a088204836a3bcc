"""Bounded, closable channels that join the stages of one run (all on the run's loop).

A channel counts *items*, but moves them in chunks: a stage puts whatever it has ready and the
next stage takes up to as many as it can use in one go, so a cheap stage pays the queue's
bookkeeping once per chunk rather than once per item, while the bound on items keeps memory
bounded whatever the chunk sizes are.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = ["Channel", "ChannelAborted", "nbytes_of"]


def nbytes_of(obj: Any, depth: int = 0) -> int:
    """The bytes an item holds, as far as can be told cheaply: ``nbytes`` of arrays and
    tensors, the length of ``bytes`` and ``str``, summed over tuples, lists and dict values
    (three levels deep); 0 for anything else."""
    n = getattr(obj, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(obj, bytes | bytearray | str):
        return len(obj)
    if isinstance(obj, memoryview):
        return obj.nbytes
    if depth < 3:
        if isinstance(obj, tuple | list):
            return sum(nbytes_of(x, depth + 1) for x in obj)
        if isinstance(obj, dict):
            return sum(nbytes_of(x, depth + 1) for x in obj.values())
    return 0


class ChannelAborted(Exception):
    """The run is stopping: the other side of the channel went away (internal, never raised
    to users)."""


class Channel:
    """A bounded FIFO of items between two stages of one run.

    ``close()`` marks the end of the stream (readers drain what is left, then receive ``[]``);
    ``abort()`` stops both sides at once (every pending and later call raises
    :class:`ChannelAborted`).

    Args:
        capacity: The most items the channel holds.
        max_bytes: The most bytes its items may hold (see :func:`nbytes_of`); an item larger
            than that on its own still passes when the channel is empty. ``None``: no limit.
    """

    __slots__ = ("_aborted", "_bytes", "_closed", "_getters", "_items", "_putters", "_sizes",
                 "capacity", "max_bytes")

    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._bytes = 0
        self._sizes: deque[int] = deque()
        self._items: deque[Any] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self._aborted = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """True once the writer has ended the stream (or the channel was aborted)."""
        return self._closed or self._aborted

    async def put(self, item: Any) -> None:
        """Append one item, waiting while the channel is full.

        Cancellation:
            Safe: the item is either appended or not; a wake-up meant for a cancelled waiter
            is passed on.
        """
        if self.max_bytes is not None:
            await self.put_many([item])
            return
        while len(self._items) >= self.capacity and not self._aborted:
            await self._wait(self._putters)
        if self._aborted:
            raise ChannelAborted
        self._items.append(item)
        if self._getters:
            _wake(self._getters, 1)

    async def put_many(self, items: list[Any]) -> None:
        """Append ``items`` in order, as many at a time as fit.

        Cancellation:
            Items appended before the cancellation stay in the channel.
        """
        if self.max_bytes is not None:
            await self._put_sized(items)
            return
        start, total = 0, len(items)
        while start < total:
            if self._aborted:
                raise ChannelAborted
            room = self.capacity - len(self._items)
            if room <= 0:
                await self._wait(self._putters)
                continue
            end = min(total, start + room)
            self._items.extend(items if (start == 0 and end == total) else items[start:end])
            if self._getters:
                _wake(self._getters, end - start)
            start = end

    async def _put_sized(self, items: list[Any]) -> None:
        assert self.max_bytes is not None
        for item in items:
            size = nbytes_of(item)
            while self._items and (
                len(self._items) >= self.capacity or self._bytes + size > self.max_bytes
            ) and not self._aborted:
                await self._wait(self._putters)
            if self._aborted:
                raise ChannelAborted
            self._items.append(item)
            self._sizes.append(size)
            self._bytes += size
            if self._getters:
                _wake(self._getters, 1)

    @property
    def nbytes(self) -> int:
        """Bytes held now (counted only when the channel has a byte limit)."""
        return self._bytes

    async def get_many(self, limit: int) -> list[Any]:
        """Take up to ``limit`` items, waiting for at least one; ``[]`` at the end of stream.

        Cancellation:
            Safe: nothing is taken unless the call returns.
        """
        items = self._items
        while not items:
            if self._aborted:
                raise ChannelAborted
            if self._closed:
                return []
            await self._wait(self._getters)
        if self._aborted:
            raise ChannelAborted
        if limit >= len(items):
            taken = list(items)
            items.clear()
        else:
            popleft = items.popleft
            taken = [popleft() for _ in range(limit)]
        if self.max_bytes is not None:
            sizes = self._sizes
            self._bytes -= sum(sizes.popleft() for _ in range(len(taken)))
        if self._putters:
            _wake(self._putters, len(taken))
        return taken

    def close(self) -> None:
        """End the stream: readers drain what is left, then receive ``[]``."""
        self._closed = True
        _wake(self._getters, len(self._getters))

    def abort(self) -> None:
        """Stop both sides: pending and later puts and gets raise :class:`ChannelAborted`."""
        self._aborted = True
        self._items.clear()
        self._sizes.clear()
        self._bytes = 0
        _wake(self._getters, len(self._getters))
        _wake(self._putters, len(self._putters))

    async def _wait(self, waiters: deque[asyncio.Future[None]]) -> None:
        fut = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                _wake(waiters, 1)  # we were woken, then cancelled: pass the wake-up on
            else:
                try:
                    waiters.remove(fut)
                except ValueError:
                    pass
            raise


def _wake(waiters: deque[asyncio.Future[None]], count: int) -> None:
    while waiters and count > 0:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            count -= 1
