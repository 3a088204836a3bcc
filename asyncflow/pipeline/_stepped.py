"""Stepping a coroutine by hand: run it up to its first suspension, and await the rest.

An async ``map`` at ``concurrency=1`` calls its function on a chunk of items. Most calls of a
cheap function complete without ever suspending; stepping each call once tells those apart
from the calls that wait, so the stage can hand on finished results before it waits, and
pays no task, future or wake-up for the calls that complete at once.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from typing import Any

__all__ = ["Resume"]


class Resume:
    """Awaits a coroutine that has already run up to its first suspension, where it yielded
    ``signal`` (what a coroutine yields to its task: a future to wait on, or ``None``).

    Await it in the task that started the coroutine: the coroutine then sees one task and one
    context throughout, as if it had been awaited directly.

    Cancellation:
        Cancellation is the coroutine's own: what the task throws in is thrown into the
        coroutine, and closing this closes it.
    """

    __slots__ = ("coro", "signal")

    def __init__(self, coro: Coroutine[Any, Any, Any], signal: Any) -> None:
        self.coro = coro
        self.signal = signal

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, signal = self.coro, self.signal
        step: Callable[[Any], Any]
        while True:
            try:
                value = yield signal
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (cancellation): forwarded
                step, value = coro.throw, exc
            else:
                step = coro.send
            try:
                signal = step(value)
            except StopIteration as done:
                return done.value
