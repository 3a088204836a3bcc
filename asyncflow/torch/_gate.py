"""How far a loader's worker processes fetch ahead of its consumer: ``prefetch_factor *
num_workers`` batches at most, as torch's, whatever the pipeline's own queues could hold.

The engine's back-pressure bounds each queue, not what lies between a stage's input and the
consumer: a process stage's workers hold two chunks each beside its output queue (of at least
one item), and the consumer takes that queue's items a chunk at a time. With one worker and
``prefetch_factor=1`` that is three batches ahead, where torch fetches one. The engine has no
window over that span (items let in by the source less those the consumer received or the
run dropped), and no awaitable failure of a run: hence these credits, and their polling of
:func:`~asyncflow.pipeline.run_failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..pipeline import run_failed
from ._fetch import Indexed, Positioned
from ._state import EpochIterator

__all__ = ["Credits", "GatedEpoch", "GatedSource"]

# Seconds between checks, while no credit is free, that the run has not failed.
_CHECK_EVERY = 0.05


class Credits:
    """Index batches an epoch may still send to fetch: taken on the run's loop as each one
    enters the pipeline, given back from the consumer's thread as each batch is received.

    Args:
        limit: Batches fetched ahead of the consumer at most (torch's
            ``prefetch_factor * num_workers``).
    """

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._lock = threading.Lock()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    async def take(self) -> bool:
        """Take one credit, waiting for the consumer to receive a batch if none is free.

        Returns:
            ``True``; ``False`` once a stage of the run has failed: a stage that fails
            drops the batches it holds, which never reach the consumer to give their credits
            back, and the run ends only when this source does.

        Cancellation:
            Safe: a cancelled wait takes nothing.
        """
        while True:
            with self._lock:
                if self._free > 0:
                    self._free -= 1
                    return True
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            while not fut.done():
                await asyncio.wait((fut,), timeout=_CHECK_EVERY)
                if run_failed():
                    return False

    def give(self) -> None:
        """Give one credit back (any thread)."""
        with self._lock:
            self._free += 1
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            with contextlib.suppress(RuntimeError):  # the run's loop is closed: it is over
                waiter[0].call_soon_threadsafe(_wake, waiter[1])


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class GatedSource:
    """An epoch's index batches, each let into the pipeline once it has a credit. The
    sampler is drawn on the run's loop, a batch at a time, as torch's main process draws it.
    """

    def __init__(self, batches: Iterator[Indexed], credits: Credits) -> None:
        self.batches, self.credits = batches, credits

    def __aiter__(self) -> AsyncIterator[Indexed]:
        return self._gated()

    async def _gated(self) -> AsyncIterator[Indexed]:
        batches = self.batches
        try:
            while True:
                if not await self.credits.take():
                    return
                batch = next(batches, None)
                if batch is None:
                    return
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()


class GatedEpoch(EpochIterator):
    """An epoch's iterator that gives a credit back for each batch it receives."""

    def __init__(self, *args: Any, credits: Credits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._credits = credits

    def _pull(self) -> Positioned:
        item = super()._pull()
        self._credits.give()
        return item

    async def _apull(self) -> Positioned:
        item = await super()._apull()
        self._credits.give()
        return item
