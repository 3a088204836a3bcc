"""The one way a future is settled or a waiter woken: on its loop (:func:`settle`,
:func:`settle_all`), or from any other thread (:func:`settle_soon`): a worker process's results
from its pool's reader thread, a worker thread's, a consumer's wake-ups of the run's loop."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["settle", "settle_all", "settle_soon"]


def settle(
    fut: asyncio.Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    """Settle ``fut`` with ``result``, or ``error`` if not ``None``, unless it is done by then
    (cancelled). On ``fut``'s loop."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def settle_all(futs: list[asyncio.Future[None]]) -> None:
    """:func:`settle` each of ``futs`` with ``None`` (waiters woken)."""
    for fut in futs:
        settle(fut)


def settle_soon(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], result: Any = None,
                error: BaseException | None = None) -> None:
    """From any thread: :func:`settle` ``fut`` (of ``loop``) there; nothing when ``loop`` is
    closed (nobody waits on it any more: its run abandoned the call)."""
    try:  # not contextlib.suppress: a wake-up per chunk handed to a consumer comes here
        loop.call_soon_threadsafe(settle, fut, result, error)
    except RuntimeError:
        pass
