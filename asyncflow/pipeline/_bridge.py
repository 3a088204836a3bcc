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

from ._channel import ChannelAborted

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

    Args:
        capacity: The most items held for the consumer.
        loop: The run's loop, where writers wait.
    """

    def __init__(self, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self.capacity = capacity
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
        while start < total:
            reader = None
            with self._cond:
                if self._aborted:
                    raise ChannelAborted
                room = self.capacity - len(self._items)
                if room > 0:
                    end = min(total, start + room)
                    self._items.extend(items[start:end] if start or end < total else items)
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

    def close(self, error: BaseException | None = None) -> None:
        """End the stream; the consumer drains what is left, then gets ``error`` if any.

        Thread-safe.
        """
        with self._cond:
            self._closed = True
            self._error = error
            self._cond.notify_all()
            reader, self._reader = self._reader, None
        if reader is not None:
            _notify(*reader)

    def abort(self) -> None:
        """The consumer is gone: drop what is held and make writers stop. Thread-safe."""
        with self._cond:
            self._aborted = True
            self._items.clear()
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
        return taken

    def _release(self, count: int) -> list[asyncio.Future[None]]:
        woken = []
        while self._putters and count > 0:
            woken.append(self._putters.popleft())
            count -= 1
        return woken

    def _finish(self) -> list[Any]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return []

    def get_chunk(self, timeout: float | None = None) -> list[Any]:
        """Take the next chunk of items; ``[]`` at the end; raise the run's error after its
        items.

        Raises:
            TimeoutError: Nothing arrived within ``timeout`` seconds.

        Cancellation:
            The wait is interruptible by signals (Ctrl-C raises ``KeyboardInterrupt`` here).
        """
        with self._cond:
            while not self._items:
                if self._aborted:
                    return []
                if self._closed:
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
        while True:
            with self._cond:
                if self._items:
                    taken = self._take_locked()
                    woken = self._release(len(taken))
                    break
                if self._aborted:
                    return []
                if self._closed:
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
