"""``Window``: a run's bound on the items between its source and its consumer
(``Pipeline(window=n)``).

An item takes a credit as the source lets it in, and gives it back as the consumer receives
it (a receive hook, in the consumer's thread) or as the run drops it (filtered, or failed
within the failure budget: :meth:`NodeContext.dropped`). The source waits on a future the
giving side resolves, never polling; a failed or stopped run closes the window, which wakes
the source to end its stream.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from ..workers import settle_soon

__all__ = ["BranchCredits", "Window"]


class Window:
    """Credits for the items in flight between a run's source and its consumer.

    Args:
        size: Items let in by the source, less those the consumer received or the run
            dropped, at most.
    """

    def __init__(self, size: int) -> None:
        self._free = size
        self._closed = False
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    async def take(self, most: int) -> int:
        """Take up to ``most`` credits (on the run's loop), waiting for one if none is free.

        Returns:
            How many were taken (at least 1); ``0`` once the window is closed: the run has
            failed or is stopping, and the source ends its stream.

        Cancellation:
            Safe: a cancelled wait takes nothing.
        """
        while True:
            with self._lock:
                if self._closed:
                    return 0
                if self._free > 0:
                    taken = min(most, self._free)
                    self._free -= taken
                    return taken
                fut = asyncio.get_running_loop().create_future()
                self._waiters.append((fut.get_loop(), fut))
            await fut

    def give(self, count: int = 1) -> None:
        """Give ``count`` credits back (any thread; never blocks)."""
        if count > 0:
            self._wake(count)

    def received(self, item: Any) -> Any:
        """A receive hook: the consumer has the item; its credit is free again."""
        self.give(1)
        return item

    def close(self) -> None:
        """The run failed or is stopping: wake the source, and let nothing more in (any
        thread; idempotent)."""
        self._wake(0, close=True)

    def _wake(self, freed: int, *, close: bool = False) -> None:
        """Free ``freed`` credits (and close, if ``close``), and wake every waiting take to
        look again."""
        with self._lock:
            self._free += freed
            self._closed = self._closed or close
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            settle_soon(loop, fut)


class BranchCredits(Window):
    """A merged run's window: the credits of the items the merge has put out, each owed to
    its branch's :class:`Window` (``None`` for a branch without one), given back in the
    order the merge put them out as the consumer receives items or the run drops them.

    The stages after the merge keep items one for one (building the run checks it), so the
    ``n``-th item received or dropped is the merge's ``n``-th. A stage there that finishes
    items out of order may give a credit to the wrong branch for a while; each branch gets
    back as many as it had put out, once they are through. Its own :meth:`take` is never
    called: the branches' sources take from their windows.
    """

    def __init__(self) -> None:
        super().__init__(0)
        self._owed: deque[Window | None] = deque()

    def owe(self, window: Window | None) -> None:
        """The merge puts out an item of the branch whose window is ``window`` (on the run's
        loop, before it puts it)."""
        self._owed.append(window)

    def give(self, count: int = 1) -> None:
        """The next ``count`` items the merge put out were received or dropped: their
        credits go back to their branches (any thread; never blocks)."""
        for _ in range(count):
            try:
                window = self._owed.popleft()  # deque's popleft is atomic: any thread
            except IndexError:
                return
            if window is not None:
                window.give(1)
