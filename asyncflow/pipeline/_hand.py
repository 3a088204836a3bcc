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
    """At most half the stage's output queue held at once (or ``floor`` items, if more),
    and with a byte budget at most as many items as half of it holds at the measured size
    of the results (one until they are measured). The run's loop only; not thread-safe.

    Args:
        capacity: The stage's output queue's capacity, in items.
        max_bytes: Its byte budget, if any.
        floor: The fewest items it may hold without a byte budget: two per worker process
            (one running, the next queued), so that a worker never waits for the parent.
    """

    __slots__ = ("_items", "_max_bytes", "_room", "held", "limit")

    def __init__(self, capacity: int, max_bytes: int | None, floor: int = 1) -> None:
        self._items = max(1, capacity // 2, floor)
        self._max_bytes = max_bytes
        self.limit = self._items if max_bytes is None else 1
        self.held = 0
        self._room = asyncio.Event()  # set as items leave or the limit grows

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
            self._room.clear()
            await self._room.wait()
        return count

    def give(self, count: int) -> None:
        """``count`` items left the stage's hands (their results were put out)."""
        if count:
            self.held -= count
            self._room.set()

    def measured(self, size: float) -> None:
        """The results weigh ``size`` bytes each (a running estimate) with a byte budget."""
        if self._max_bytes is None:
            return
        limit = self._items if size <= 0 else int(self._max_bytes / 2 / size)
        limit = max(1, min(self._items, limit))
        grew = limit > self.limit
        self.limit = limit
        if grew:
            self._room.set()
