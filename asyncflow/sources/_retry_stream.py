"""Resumed reads, whole or streamed, on every remote transport's one opener of a try: a
read's tries share one record of the object (its validators), and each try starts at the
byte where the last one broke.

:func:`retry_stream` (``Transport.stream``) runs one :func:`~._retry.with_retries` per chunk,
so its budget of tries is per stall and its ``total`` deadline spans the whole stream.
:func:`retry_whole` (``Transport.fetch``) runs one for the whole body, through the host's
limiter, and may hedge it with a read of its own; an object that changed between its tries
(:class:`Changed`) is read again from byte 0, where a stream has to stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from .._errors import SourceError
from ._retry import Limiter, Retry, Timeout, Transient, with_retries

__all__ = ["Changed", "Reader", "retry_stream", "retry_whole"]

C = TypeVar("C")
#: One read's tries on an entered client: ``reader(client)`` makes the read's record of the
#: object (:class:`Changed` says it differs), and returns the opener of a try at an offset.
Reader = Callable[[C], Callable[[int], AsyncGenerator[bytes, None]]]


class Changed(SourceError):
    """The object changed between two tries of one read, or nothing proves it did not."""


class _Reopening:
    """A ranged read's current try, reopened at the byte where the last one broke."""

    __slots__ = ("_chunks", "_it", "_open_at", "offset")

    def __init__(self, open_at: Callable[[int], AsyncGenerator[bytes, None]]) -> None:
        self._open_at = open_at
        self._it: AsyncGenerator[bytes, None] | None = None
        self.offset = 0
        self._chunks: list[bytes] = []  # what the tries of a whole read got so far

    async def next(self) -> bytes | None:
        """The next chunk (``None`` at the end); a broken try raises :class:`Transient`,
        naming the byte where it broke."""
        try:
            return await self._pull()
        except Transient as exc:
            raise Transient(f"{exc.reason} at byte {self.offset}", status=exc.status,
                            retry_after=exc.retry_after, timeout=exc.timeout,
                            throttled=exc.throttled) from None

    async def _pull(self) -> bytes | None:
        if self._it is None:
            self._it = self._open_at(self.offset)
        try:
            chunk = await anext(self._it, None)
        except Transient:
            self._it = None  # it ended by raising: nothing to close
            raise
        if chunk is None:
            self._it = None
        else:
            self.offset += len(chunk)
        return chunk

    async def aclose(self) -> None:
        if self._it is not None:
            await self._it.aclose()
            self._it = None

    async def whole(self) -> bytes:
        """One try of a whole read: the body from where the last try broke, joined to what
        the tries before got; an object that changed since is read again from byte 0, by the
        next try."""
        try:
            while (chunk := await self._pull()) is not None:
                self._chunks.append(chunk)
        except Changed:
            self._chunks.clear()
            self.offset = 0
            raise Transient("the object changed between tries; read again from byte 0") from None
        finally:
            await self.aclose()
        return b"".join(self._chunks)


async def retry_stream(
    client: AbstractAsyncContextManager[C],
    reader: Reader[C],
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
) -> AsyncGenerator[bytes, None]:
    """The bytes of a ranged read, each chunk fetched through :func:`with_retries`.

    Args:
        client: The session or client the tries share, entered for the stream's lifetime.
        reader: The read's tries on the entered client (see :data:`Reader`); a try raises
            :class:`Transient` when it breaks, and the next starts at the byte where it
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
        tries = _Reopening(reader(opened))
        try:
            while True:
                chunk = await with_retries(
                    tries.next, what=what, retry=retry, timeout=timeout, deadline=deadline
                )
                if chunk is None:
                    return
                yield chunk
        finally:
            await tries.aclose()


async def retry_whole(
    client: AbstractAsyncContextManager[C],
    reader: Reader[C],
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
    gate: Limiter,
) -> bytes:
    """The whole body of a read, its tries through :func:`with_retries` and the host's
    ``gate``; each try resumes where the last one broke (see :func:`retry_stream`).

    The first try may be hedged (``Retry.hedge``) by a read of its own: another record of
    the object, and its own bytes, so that it never splices into the try it races.

    Raises:
        SourceError, SourceTimeout: As :func:`with_retries`.

    Cancellation:
        As :func:`with_retries`; the try's connection is closed, then the client (if it is
        the read's own).
    """
    async with client as opened:
        primary = _Reopening(reader(opened))

        def hedge() -> Awaitable[bytes]:
            return _Reopening(reader(opened)).whole()

        return await with_retries(primary.whole, what=what, retry=retry, timeout=timeout,
                                  gate=gate, hedge=hedge)
