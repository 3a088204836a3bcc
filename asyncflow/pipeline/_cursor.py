"""``Cursor``: a run's latest chunk on the consumer's side, shared by any number of consumer
threads and tasks (on any loops).

Each item is taken with ``deque.popleft`` (atomic: two threads never get the same item, and
the chunk drops its reference at once). When the chunk is empty, one consumer refills it
from the hand-off while the others wait: threads on a condition, tasks on futures of their
own loops. With consumer-side hooks, items are taken and hooked under the lock, so that the
hooks see one item at a time, in order: such a chunk is never :attr:`Cursor.free`.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..workers import settle_soon

__all__ = ["EMPTY", "REFILL", "Cursor"]

#: What :meth:`Cursor.claim` gives while another consumer is refilling the chunk.
EMPTY: Any = object()
#: What :meth:`Cursor.claim` gives the one consumer that is to refill the chunk.
REFILL: Any = object()


class Cursor:
    """The consumers' shared chunk and who refills it.

    Attributes:
        chunk: The items of the latest chunk not yet taken.
        free: The same, when items may be taken without the lock (no hooks); else an
            empty deque. The consumer's fast path pops from it, and nothing else.
        apply: The consumer-side hooks, composed (set before the first chunk comes).
        lock: Held to claim an item or the refill, and to install a chunk.
        refilling: Whether a consumer is refilling the chunk now (at most one is).
    """

    __slots__ = (
        "_refilled", "_waiters", "apply", "chunk", "free", "lock", "refilling",
    )

    def __init__(self) -> None:
        self.chunk: deque[Any] = deque()
        self.free: deque[Any] = _NONE
        self.apply: Callable[[Any], Any] | None = None
        self.lock = threading.Lock()
        self._refilled = threading.Condition(self.lock)
        self.refilling = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def use(self, hooks: Sequence[Callable[[Any], Any]]) -> None:
        """Pass each item taken through ``hooks``, in order (before the first chunk comes)."""
        if len(hooks) > 1:
            def apply(item: Any) -> Any:
                for hook in hooks:
                    item = hook(item)
                return item

            self.apply = apply
        elif hooks:
            self.apply = hooks[0]

    def claim(self) -> Any:
        """An item (hooks applied), :data:`REFILL` (the caller refills, then calls
        :meth:`refilled`), or :data:`EMPTY`: another consumer is refilling (lock held)."""
        chunk = self.chunk
        if chunk:
            item = chunk.popleft()
            apply = self.apply
            return item if apply is None else apply(item)
        if self.refilling:
            return EMPTY
        self.refilling = True
        return REFILL

    def claim_sync(self) -> Any:
        """:meth:`claim`, waiting in this thread while another consumer refills.

        Cancellation:
            The wait is interruptible by signals (Ctrl-C raises ``KeyboardInterrupt``).
        """
        with self.lock:
            while (item := self.claim()) is EMPTY:
                self._refilled.wait()
        return item

    async def claim_async(self) -> Any:
        """:meth:`claim`, waiting on the caller's loop while another consumer refills.

        Cancellation:
            Safe: nothing is claimed unless the call returns.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self.lock:
                item = self.claim()
                if item is not EMPTY:
                    return item
                fut = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    def install(self, chunk: deque[Any]) -> None:
        """Make ``chunk`` the latest (lock held)."""
        self.chunk = chunk
        self.free = _NONE if self.apply is not None else chunk

    def clear(self) -> None:
        """Drop the items not yet taken (the run is closed)."""
        self.chunk, self.free = deque(), _NONE

    def refilled(self) -> None:
        """The refill is over (a new chunk installed, or none: the end): wake every waiting
        consumer (lock held)."""
        self.refilling = False
        self._refilled.notify_all()
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            settle_soon(loop, fut)


#: The fast path's chunk while items must be taken under the lock: always empty.
_NONE: deque[Any] = deque(maxlen=0)
