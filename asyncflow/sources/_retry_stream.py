"""A ranged read retried chunk by chunk: :func:`retry_stream` reopens a stream at the byte
where a try broke, one :func:`~._retry.with_retries` per chunk, so its budget of tries is per
stall and its ``total`` deadline spans the whole stream. It is every remote transport's
``stream``: the transport gives it the client its tries share and one try's opener."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from ._retry import Retry, Timeout, Transient, with_retries

__all__ = ["retry_stream"]

C = TypeVar("C")


class _Reopening:
    """A ranged read's current try, reopened at the byte where the last one broke."""

    __slots__ = ("_it", "_open_at", "offset")

    def __init__(self, open_at: Callable[[int], AsyncGenerator[bytes, None]]) -> None:
        self._open_at = open_at
        self._it: AsyncGenerator[bytes, None] | None = None
        self.offset = 0

    async def next(self) -> bytes | None:
        """The next chunk (``None`` at the end); a broken try raises :class:`Transient`."""
        if self._it is None:
            self._it = self._open_at(self.offset)
        try:
            chunk = await anext(self._it, None)
        except Transient as exc:
            self._it = None  # it ended by raising: nothing to close
            raise Transient(f"{exc.reason} at byte {self.offset}", status=exc.status,
                            retry_after=exc.retry_after, timeout=exc.timeout,
                            throttled=exc.throttled) from None
        if chunk is None:
            self._it = None
        else:
            self.offset += len(chunk)
        return chunk

    async def aclose(self) -> None:
        if self._it is not None:
            await self._it.aclose()
            self._it = None


async def retry_stream(
    client: AbstractAsyncContextManager[C],
    open_at: Callable[[C, int], AsyncGenerator[bytes, None]],
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
) -> AsyncGenerator[bytes, None]:
    """The bytes of a ranged read, each chunk fetched through :func:`with_retries`.

    Args:
        client: The session or client the tries share, entered for the stream's lifetime.
        open_at: One try at the bytes from an offset on, on the entered client; raises
            :class:`Transient` when it breaks, and is then called again at the byte where it
            stopped.

    Raises:
        SourceError: A try failed for good, or ``retry.attempts`` tries in a row delivered
            nothing; the message names ``what``, the reason and the byte where it stalled.
        SourceTimeout: The last try timed out, or ``timeout.total`` (for the whole stream)
            passed.

    Cancellation:
        Cancelling the consumer cancels the try or back-off in progress; closing the
        generator closes the try's connection, then the client (if it is the stream's own).
    """
    async with client as opened:
        deadline = None
        if timeout.total is not None:
            deadline = asyncio.get_running_loop().time() + timeout.total
        reader = _Reopening(functools.partial(open_at, opened))
        try:
            while True:
                chunk = await with_retries(
                    reader.next, what=what, retry=retry, timeout=timeout, deadline=deadline
                )
                if chunk is None:
                    return
                yield chunk
        finally:
            await reader.aclose()
