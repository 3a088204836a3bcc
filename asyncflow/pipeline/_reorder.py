"""The reorder buffer of an ordered map stage with several workers: results back in input
order, within a bounded window."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ._loop import settle, settle_all
from ._protocols import Sender

__all__ = ["Reorder"]


class OrderedStage(Protocol):
    """What a reorder buffer needs of its stage (a map node): the tickets it has handed out,
    and how it puts out one ticket's results."""

    @property
    def _ticket(self) -> int: ...

    async def _emit(
        self, items: list[Any], values: list[Any], failures: list[tuple[int, BaseException]],
        out: Sender,
    ) -> None: ...


class Reorder:
    """Puts the results of an ordered stage back in input order, so that a worker that
    finishes early takes new work instead of waiting for its turn. The window of tickets
    taken but not yet emitted is bounded (twice the concurrency), which bounds memory."""

    def __init__(self, node: OrderedStage, window: int) -> None:
        self.node = node
        self.window = window
        self.ready: dict[int, Any] = {}
        self.emitted = 0
        self._wake_emitter: asyncio.Future[None] | None = None
        self._room_waiters: list[asyncio.Future[None]] = []

    async def room(self) -> None:
        while self.node._ticket - self.emitted >= self.window:
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
            if all(w.done() for w in workers) and self.emitted >= self.node._ticket:
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
        await self.node._emit(items, values, failures, out)
        self.emitted += 1
        waiters, self._room_waiters = self._room_waiters, []
        settle_all(waiters)
        return True
