"""The hand-off from a run's own loop thread to its consumer.

The data plane runs on a loop in a thread of its own, so a consumer that blocks its thread or
loop (a synchronous training step) does not stop loading. Items cross to the consumer here, in
chunks: a plain ``for`` waits on a condition variable, ``async for`` on a future of its own
loop, woken with ``call_soon_threadsafe``. Neither touches the other side's loop otherwise, so
plain ``for`` works in a thread whose loop is already running (Jupyter).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from ._channel import ChannelAborted, nbytes_of

__all__ = ["Handoff"]


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _notify(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
    try:
        loop.call_soon_threadsafe(_resolve, fut)
    except RuntimeError:  # that loop is closed: nobody is waiting any more
        pass


class Handoff:
    """The last, bounded channel of a run: written on the run's loop, read by the consumer.

    It offers the writer side of :class:`~asyncflow.pipeline._channel.Channel` (``put``,
    ``put_many``, ``close``, ``abort``) and two reader calls, :meth:`get_chunk` for a thread
    and :meth:`aget_chunk` for a coroutine on any loop.

    The consumer takes up to half the capacity at a time. With a byte budget, the bytes of the
    chunk it is working through still count until it asks for the next one, so that what waits
    for the consumer and what it holds stay within the budget together.

    Args:
        capacity: The most items held for the consumer.
        loop: The run's loop, where writers wait.
        max_bytes: A byte budget (see ``Channel``); ``None``: items only.
    """

    def __init__(
        self, capacity: int, loop: asyncio.AbstractEventLoop, max_bytes: int | None = None
    ) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._sizes: deque[int] = deque()
        self._bytes = 0
        self._lent_bytes = 0  # bytes of the consumer's current chunk
        self._loop = loop
        self._cond = threading.Condition(threading.Lock())
        self._items: deque[Any] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        self._reader: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._closed = False
        self._aborted = False
        self._error: BaseException | None = None
        self._take = max(1, capacity // 2)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed or self._aborted

    # -- writer side (the run's loop) ---------------------------------------------------

    async def put(self, item: Any) -> None:
        await self.put_many([item])

    async def put_many(self, items: list[Any]) -> None:
        """Append ``items``, waiting (on the run's loop) while the consumer is behind.

        Cancellation:
            Items appended before the cancellation stay for the consumer.
        """
        start, total = 0, len(items)
        sizes = [nbytes_of(item) for item in items] if self.max_bytes is not None else None
        while start < total:
            reader = None
            with self._cond:
                if self._aborted:
                    raise ChannelAborted
                room = self._room(sizes, start, total)
                if room > 0:
                    end = start + room
                    self._items.extend(items[start:end] if start or end < total else items)
                    if sizes is not None:
                        self._sizes.extend(sizes[start:end])
                        self._bytes += sum(sizes[start:end])
                    start = end
                    self._cond.notify()
                    reader, self._reader = self._reader, None
                    fut = None
                else:
                    fut = self._loop.create_future()
                    self._putters.append(fut)
            if reader is not None:
                _notify(*reader)
            if fut is not None:
                try:
                    await fut
                except asyncio.CancelledError:
                    with self._cond:
                        if fut in self._putters:
                            self._putters.remove(fut)
                    raise

    def take_pending(self) -> BaseException | None:
        """Take the error no reader has been given yet (the reader has left), if any."""
        with self._cond:
            error, self._error = self._error, None
        return error

    def _room(self, sizes: list[int] | None, start: int, total: int) -> int:
        """How many of the items from ``start`` fit now (with the lock held)."""
        held = len(self._items)
        room = min(total - start, self.capacity - held)
        if sizes is None or room <= 0:
            return max(0, room)
        assert self.max_bytes is not None
        budget = self.max_bytes - self._bytes - self._lent_bytes
        fit = 0
        empty = held == 0 and self._lent_bytes == 0
        while fit < room and (sizes[start + fit] <= budget or (empty and fit == 0)):
            budget -= sizes[start + fit]
            fit += 1
        return fit

    @property
    def nbytes(self) -> int:
        """Bytes held for the consumer and in its current chunk (with a byte budget)."""
        return self._bytes + self._lent_bytes

    def close(self, error: BaseException | None = None) -> None:
        """End the stream; the consumer drains what is left, then gets ``error`` if any.

        After :meth:`abort`, the error given there (if any) stands. Thread-safe.
        """
        with self._cond:
            if not self._closed and not self._aborted:
                self._error = error
            self._closed = True
            self._cond.notify_all()
            reader, self._reader = self._reader, None
        if reader is not None:
            _notify(*reader)

    def abort(self, error: BaseException | None = None) -> None:
        """Stop: drop what is held and make writers stop. Thread-safe.

        Args:
            error: What ended the run before the stop, if anything: a reader still waiting
                (or reading next) gets it, once, instead of the end of the stream.
        """
        with self._cond:
            if not self._aborted and not self._closed:
                self._error = error
            self._aborted = True
            self._items.clear()
            self._sizes.clear()
            self._bytes = self._lent_bytes = 0
            putters = list(self._putters)
            self._putters.clear()
            self._cond.notify_all()
            reader, self._reader = self._reader, None
        for fut in putters:
            _notify(self._loop, fut)
        if reader is not None:
            _notify(*reader)

    # -- reader side (the consumer) -----------------------------------------------------

    def _take_locked(self) -> list[Any]:
        items = self._items
        if len(items) <= self._take:
            taken = list(items)
            items.clear()
        else:
            popleft = items.popleft
            taken = [popleft() for _ in range(self._take)]
        if self.max_bytes is not None:  # the previous chunk is consumed: this one counts
            self._lent_bytes = sum(self._sizes.popleft() for _ in range(len(taken)))
            self._bytes -= self._lent_bytes
        return taken

    def _give_back(self) -> list[asyncio.Future[None]]:
        """The consumer is back for more: its previous chunk is done with (lock held)."""
        if not self._lent_bytes:
            return []
        self._lent_bytes = 0
        return self._release(0)

    def _release(self, count: int) -> list[asyncio.Future[None]]:
        # Room came back (this chunk, less the one before it): every waiting writer checks.
        woken = list(self._putters)
        self._putters.clear()
        return woken

    def _finish(self) -> list[Any]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return []

    def get_chunk(self, timeout: float | None = None) -> list[Any]:
        """Take the next chunk of items; ``[]`` at the end; raise the run's error after its
        items (once: later calls return ``[]``).

        Raises:
            TimeoutError: Nothing arrived within ``timeout`` seconds.

        Cancellation:
            The wait is interruptible by signals (Ctrl-C raises ``KeyboardInterrupt`` here).
        """
        with self._cond:
            woken = self._give_back()
        for fut in woken:
            _notify(self._loop, fut)
        with self._cond:
            while not self._items:
                if self._closed or self._aborted:
                    return self._finish()
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"no item arrived within {timeout} s")
            taken = self._take_locked()
            woken = self._release(len(taken))
        for fut in woken:
            _notify(self._loop, fut)
        return taken

    async def aget_chunk(self, timeout: float | None = None) -> list[Any]:
        """Like :meth:`get_chunk`, waiting on the caller's own loop.

        Cancellation:
            Safe: nothing is taken unless the call returns.
        """
        loop = asyncio.get_running_loop()
        with self._cond:
            woken = self._give_back()
        for fut in woken:
            _notify(self._loop, fut)
        while True:
            with self._cond:
                if self._items:
                    taken = self._take_locked()
                    woken = self._release(len(taken))
                    break
                if self._closed or self._aborted:
                    return self._finish()
                fut = loop.create_future()
                self._reader = (loop, fut)
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except TimeoutError:
                raise TimeoutError(f"no item arrived within {timeout} s") from None
            finally:
                with self._cond:
                    if self._reader is not None and self._reader[1] is fut:
                        self._reader = None
        for fut in woken:
            _notify(self._loop, fut)
        return taken
