"""The reorder buffer of an ordered map stage with several workers: results back in input
order, within a bounded window."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..workers import settle, settle_all
from ._protocols import Sender

__all__ = ["Reorder"]


class Reorder:
    """Puts the results of an ordered stage back in input order, so that a worker that
    finishes early takes new work instead of waiting for its turn. The window of tickets
    taken but not yet emitted is bounded (twice the concurrency), which bounds memory.

    Args:
        emit: Puts out one ticket's results (``items, values, failures, out``: the stage's).
        window: Tickets taken and not yet emitted, at most.
    """

    def __init__(self, emit: Callable[[Any, Any, Any, Sender], Awaitable[None]],
                 window: int) -> None:
        self.emit = emit
        self.window = window
        self.ready: dict[int, Any] = {}
        self.taken = 0
        self.emitted = 0
        self._wake_emitter: asyncio.Future[None] | None = None
        self._room_waiters: list[asyncio.Future[None]] = []

    def ticket(self) -> int:
        """The next ticket, for items just taken (no await since): tickets follow items."""
        self.taken += 1
        return self.taken - 1

    async def room(self) -> None:
        while self.taken - self.emitted >= self.window:
            fut = asyncio.get_running_loop().create_future()
            self._room_waiters.append(fut)
            await fut

    def put(self, ticket: int, result: Any) -> None:
        self.ready[ticket] = result
        if ticket == self.emitted:
            self._wake()

    def _wake(self) -> None:
        fut, self._wake_emitter = self._wake_emitter, None
        if fut is not None:
            settle(fut)

    async def emit_all(self, workers: list[asyncio.Task[None]], out: Sender) -> None:
        for worker in workers:
            worker.add_done_callback(lambda _: self._wake())
        while True:
            if await self._emit_next(out):
                continue
            if all(w.done() for w in workers) and self.emitted >= self.taken:
                return
            self._wake_emitter = asyncio.get_running_loop().create_future()
            await self._wake_emitter

    async def _emit_next(self, out: Sender) -> bool:
        """Emit the next result in order if it is ready. The result is a local of this call
        only, so that nothing emitted stays referenced while the emitter waits."""
        result = self.ready.pop(self.emitted, None)
        if result is None:
            return False
        items, values, failures = result
        await self.emit(items, values, failures, out)
        self.emitted += 1
        waiters, self._room_waiters = self._room_waiters, []
        settle_all(waiters)
        return True
