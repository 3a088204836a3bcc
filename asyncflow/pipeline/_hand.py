"""``Hand``: how many items a sync map stage may hold at once, whatever holds them.

A stage's items are in its hands from the moment it takes them from its input until their
results are in its output queue: in a worker thread or process, as a result on its way back
(mapped into the parent, for a worker process), waiting in the reorder buffer. The stage
takes a share of its hand before it takes items, and gives it back once their results are
put out, so that the bound holds however many chunks its workers queue, and however the
results come back.
"""

from __future__ import annotations

import asyncio

__all__ = ["Hand"]


class Hand:
    """At most ``limit`` items held at once (the run's loop only; not thread-safe).

    Args:
        limit: The most items held; :meth:`resize` changes it (a byte budget's share,
            in items, as the results' size is measured).
    """

    __slots__ = ("_waiters", "held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.held = 0
        self._waiters: list[asyncio.Future[None]] = []

    def take_now(self, want: int) -> int:
        """:meth:`take` if there is room now; ``0`` if the hand is full."""
        if self.held >= self.limit:
            return 0
        count = max(1, min(want, self.limit - self.held))
        self.held += count
        return count

    async def take(self, want: int) -> int:
        """Take room for up to ``want`` items (at least one), waiting while the hand is full.

        Returns:
            How many items the caller may take; it gives back what it does not use.

        Cancellation:
            Safe: nothing is taken unless the call returns.
        """
        while not (count := self.take_now(want)):
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        return count

    def give(self, count: int) -> None:
        """``count`` items left the stage's hands (their results were put out)."""
        if count:
            self.held -= count
            self._wake()

    def resize(self, limit: int) -> None:
        """Hold at most ``limit`` items (at least one) from now on."""
        grew = limit > self.limit
        self.limit = max(1, limit)
        if grew:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
