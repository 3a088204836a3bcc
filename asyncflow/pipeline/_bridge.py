"""The hand-off from a run's own loop thread to its consumer.

The data plane runs on a loop in a thread of its own, so a consumer that blocks its thread or
loop (a synchronous training step) does not stop loading. Items cross to the consumer here, in
chunks: a plain ``for`` waits on a condition variable, ``async for`` on a future of its own
loop, woken with ``call_soon_threadsafe``. Neither touches the other side's loop otherwise, so
plain ``for`` works in a thread whose loop is already running (Jupyter).

:class:`Handoff` is the thread-safe variant of the run's one channel type: the buffer, the
accounting, the writer side, close and abort are :class:`~._channel.ChannelBase`'s; only the
consumer's wait is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from ..workers import settle_all, settle_soon
from ._channel import ALL, ChannelBase

__all__ = ["Handoff"]


class Handoff(ChannelBase):
    """The last, bounded channel of a run: written on the run's loop, read by the consumer.

    It offers the writer side of every channel (``put``, ``put_many``, ``try_put_many``,
    ``close``, ``abort``) and two reader calls, :meth:`get_chunk` for a thread and
    :meth:`aget_chunk` for a coroutine on any loop. After an :meth:`abort`, the reader gets
    the error given there (once), else the end of the stream: never ``ChannelAborted``.

    The consumer takes up to half the capacity at a time. With a byte budget, the bytes of the
    chunk it is working through still count until it asks for the next one, so that what waits
    for the consumer and what it holds stay within the budget together.

    Args:
        capacity: The most items held for the consumer.
        loop: The run's loop, where writers wait.
        max_bytes: A byte budget (see ``ChannelBase``); ``None``: items only.
    """

    __slots__ = ("_cond", "_loop", "_reader", "_sleeping", "take_size")

    def __init__(
        self, capacity: int, loop: asyncio.AbstractEventLoop, max_bytes: int | None = None
    ) -> None:
        super().__init__(capacity, max_bytes, lend=True)
        self._loop = loop
        self._cond = threading.Condition(self._lock)
        # The consumer waiting on a loop, if any: that loop and the future it waits on.
        self._reader: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._sleeping = 0  # consumer threads waiting on the condition
        #: The most items the consumer takes at a time.
        self.take_size = max(1, capacity // 2)

    # -- the variant's hooks (lock held) ----------------------------------------------------

    def _readers_ready(self, count: int) -> None:
        if self._sleeping:
            if count >= ALL:  # the end: every waiting thread sees it
                self._cond.notify_all()
            else:
                self._cond.notify()
        reader, self._reader = self._reader, None
        if reader is not None:  # one wake-up per put, however many items it brought
            settle_soon(*reader)

    def _resolve_writers(self, waiters: list[asyncio.Future[None]]) -> None:
        if waiters:  # one call into the run's loop for all of them
            with contextlib.suppress(RuntimeError):  # that loop closed: nobody is waiting
                self._loop.call_soon_threadsafe(settle_all, waiters)

    # -- reader side (the consumer) -----------------------------------------------------

    def _next_chunk(self) -> list[Any] | None:
        """The next chunk, the end (``[]``, or the error raised), or ``None``: nothing yet
        (lock held). The previous chunk is done with either way."""
        freed = self._lent > 0
        self._lent = 0  # the reader is back for more: its previous chunk no longer counts
        if self._items:
            taken: list[Any] | None = self._take(self.take_size)
            freed = True
        elif self._closed or self._aborted:  # the end: [], or the error left, once
            error, self._error = self._error, None
            if error is not None:
                raise error
            taken = []
        else:
            taken = None
        if freed:  # room came back: every waiting writer re-checks
            self._resolve_writers(self._take_putters())
        return taken

    def get_chunk(self, timeout: float | None = None) -> list[Any]:
        """Take the next chunk of items; ``[]`` at the end; raise the run's error after its
        items (once: later calls return ``[]``).

        Raises:
            TimeoutError: Nothing arrived within ``timeout`` seconds.

        Cancellation:
            The wait is interruptible by signals (Ctrl-C raises ``KeyboardInterrupt`` here).
        """
        with self._cond:
            while (taken := self._next_chunk()) is None:
                self._sleeping += 1
                try:
                    woken = self._cond.wait(timeout)
                finally:
                    self._sleeping -= 1
                if not woken:
                    raise TimeoutError(f"no item arrived within {timeout} s")
        return taken

    async def aget_chunk(self, timeout: float | None = None) -> list[Any]:
        """Like :meth:`get_chunk`, waiting on the caller's own loop.

        Cancellation:
            Safe: nothing is taken unless the call returns.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                taken = self._next_chunk()
                if taken is not None:
                    return taken
                fut = loop.create_future()
                self._reader = (loop, fut)
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except TimeoutError:
                raise TimeoutError(f"no item arrived within {timeout} s") from None
            finally:
                with self._lock:
                    if self._reader is not None and self._reader[1] is fut:
                        self._reader = None
