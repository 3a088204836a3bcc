"""The reorder buffer of an ordered map stage with several workers: results back in input
order, within a bounded window."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ._protocols import Sender

__all__ = ["Reorder"]


class Reorder:
    """Puts the results of an ordered stage back in input order, so that a worker that
    finishes early takes new work instead of waiting for its turn. The window of tickets
    taken but not yet emitted is bounded (twice the concurrency), which bounds memory.

    Args:
        emit: Puts out one ticket's result (``result, out``: the stage's).
        window: Tickets taken and not yet emitted, at most.
    """

    def __init__(self, emit: Callable[[Any, Sender], Awaitable[None]], window: int) -> None:
        self.emit = emit
        self.window = window
        self.ready: dict[int, Any] = {}
        self.taken = 0
        self.emitted = 0
        self._ready = asyncio.Event()  # set as the next ticket's result or a worker's end comes
        self._room = asyncio.Event()  # set as a ticket is emitted

    def ticket(self) -> int:
        """The next ticket, for items just taken (no await since): tickets follow items."""
        self.taken += 1
        return self.taken - 1

    async def room(self) -> None:
        while self.taken - self.emitted >= self.window:
            self._room.clear()
            await self._room.wait()

    def put(self, ticket: int, result: Any) -> None:
        self.ready[ticket] = result
        if ticket == self.emitted:
            self._ready.set()

    async def emit_all(self, workers: list[asyncio.Task[None]], out: Sender) -> None:
        for worker in workers:
            worker.add_done_callback(lambda _: self._ready.set())
        while True:
            if await self._emit_next(out):
                continue
            if all(w.done() for w in workers) and self.emitted >= self.taken:
                return
            self._ready.clear()
            await self._ready.wait()

    async def _emit_next(self, out: Sender) -> bool:
        """Emit the next result in order if it is ready. The result is a local of this call
        only, so that nothing emitted stays referenced while the emitter waits."""
        result = self.ready.pop(self.emitted, None)
        if result is None:
            return False
        await self.emit(result, out)
        self.emitted += 1
        self._room.set()
        return True
