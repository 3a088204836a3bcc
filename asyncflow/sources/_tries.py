"""Every remote read's tries: the one retry loop, and reads resumed where a try broke.

:func:`with_retries` is the one retry loop: each try through the host's adaptive limiter
(``_limiter.HostLimiter``, the ``gate``), the first one raced by a hedge when it runs late
(:func:`~._hedge.race`). Throttling never uses up ``attempts``: a throttled read gives up
only when nothing from its host has succeeded for ``Retry.patience`` seconds.

Resumed reads, whole or streamed, run on every remote transport's one opener of a try: a
read's tries share one record of the object (its validators), and each try starts at the
byte where the last one broke. :func:`retry_stream` (``Transport.stream``) runs one
:func:`with_retries` per chunk, so its budget of tries is per stall and its ``total``
deadline spans the whole stream. :func:`retry_whole` (``Transport.fetch``) runs one for the
whole body, through the host's limiter, and may hedge it with a read of its own; an object
that changed between its tries (:class:`Changed`) is read again from byte 0, where a stream
has to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from .._errors import SourceError, SourceTimeout
from ._hedge import race
from ._limiter import HostLimiter
from ._retry import Retry, Timeout, Transient

__all__ = ["Changed", "Reader", "retry_stream", "retry_whole", "with_retries"]

C = TypeVar("C")
T = TypeVar("T")

log = logging.getLogger("asyncflow.sources")

#: Throttled tries back off as if this were at most their failure count: the host's window,
#: not a growing wait, paces them (0.8 s at most by default).
_THROTTLE_BACKOFF_STEPS = 4
#: One read's tries on an entered client: ``reader(client)`` makes the read's record of the
#: object (:class:`Changed` says it differs), and returns the opener of a try at an offset.
Reader = Callable[[C], Callable[[int], AsyncGenerator[bytes, None]]]


class Changed(SourceError):
    """The object changed between two tries of one read, or nothing proves it did not."""


_NO_DEADLINE = contextlib.nullcontext()


def _plural(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


async def _wait_patiently(
    wait: float, started: float, gate: HostLimiter | None, patience: float
) -> bool:
    """Sleep ``wait`` seconds, unless the host goes ``patience`` seconds without a success
    (any read of it, counted from ``started`` at the earliest) first.

    Returns:
        ``True`` once the whole wait has passed (never earlier than a ``Retry-After`` asked);
        ``False`` as soon as the patience is spent: give up.

    Cancellation:
        Cancelling the caller cancels the sleep; nothing is left running.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + wait
    while True:
        progress = started if gate is None else max(started, gate.last_success)
        left = progress + patience - loop.time()
        if left <= 0:
            return False
        if (remaining := end - loop.time()) <= 0:
            return True
        await asyncio.sleep(min(remaining, left))  # another read's success extends the patience


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
    deadline: float | None = None,
    gate: HostLimiter | None = None,
    hedge: Callable[[], Awaitable[T]] | None = None,
) -> T:
    """Run ``attempt()`` until it returns, fails for good, or ``retry`` gives up.

    Args:
        attempt: One try; raises :class:`Transient` for a failure worth another try.
        what: The operation and redacted URL for messages (``"GET https://host/a.jpg"``, or an
            :class:`~._redact.Operation` that redacts only when a message is made).
        deadline: The event loop time by which ``timeout.total`` runs out, when it bounds an
            operation of several calls (a stream's chunks); default: ``timeout.total`` from
            now.
        gate: The host's limiter: each try waits for a place in its window (a retried one
            before fresh ones), and tells it how the try went. ``None``: no limit.
        hedge: A whole request for the same object, independent of ``attempt``'s state: the
            first try may be raced by it (``retry.hedge``, through ``gate``).

    Raises:
        SourceTimeout: The last try timed out, or ``timeout.total`` passed.
        SourceError: The last try failed with a retryable error, or throttling went on for
            ``retry.patience`` with no progress; the message names ``what``, the reason
            (status) and the number of attempts.

    Cancellation:
        Cancelling the caller cancels the try (and its hedge) or the back-off in progress,
        and gives its place in the window back; nothing is left running.
    """
    loop = asyncio.get_running_loop()
    tries = errors = throttles = 0
    started = loop.time()
    failure: Transient | None = None
    fatal: SourceError | None = None
    stalled = False
    # No total deadline (the default): no timeout context to enter for every read.
    if deadline is None and timeout.total is not None:
        deadline = loop.time() + timeout.total
    limit = None if deadline is None else asyncio.timeout_at(deadline)
    try:
        async with limit or _NO_DEADLINE:
            while True:
                tries += 1
                try:
                    if gate is None:
                        return await attempt()
                    if tries == 1 and hedge is not None and retry.hedge > 0:
                        raced = functools.partial(race, attempt, hedge, gate, retry.hedge_quantile)
                        return await gate.run(raced, retried=False, retry=retry)
                    return await gate.run(attempt, retried=tries > 1, retry=retry)
                except Transient as exc:
                    failure = exc
                except SourceError as exc:
                    fatal = exc
                    break
                if failure.throttled and retry.attempts > 1:
                    throttles += 1
                    wait = retry.delay(min(throttles, _THROTTLE_BACKOFF_STEPS),
                                       failure.retry_after)
                    log.debug("%s: %s (throttled %d times); try again in %.2fs", what,
                              failure.reason, throttles, wait)
                    if stalled := not await _wait_patiently(wait, started, gate, retry.patience):
                        break
                    continue
                errors += 1
                if errors >= retry.attempts:
                    break
                wait = retry.delay(errors, failure.retry_after)
                # The first retry is a WARNING: a stalled body otherwise waits attempts x
                # Timeout.read (about 151 s by default) in silence.
                log.log(logging.WARNING if errors == 1 else logging.DEBUG,
                        "%s: %s; try %d of %d in %.2fs", what, failure.reason,
                        errors + 1, retry.attempts, wait)
                await asyncio.sleep(wait)
    except TimeoutError:
        if limit is None or not limit.expired():
            raise
        failure = Transient(f"no result within total={timeout.total}s", timeout=True)
    # Raised here, outside any except block, so that no foreign exception (whose text may
    # hold a presigned URL) rides along as __context__.
    if fatal is not None:
        raise type(fatal)(f"{fatal} ({_plural(tries)}; not retryable)")
    reason = failure.reason if failure is not None else "failed"
    why = f"; throttled, nothing from this host succeeded for {retry.patience}s" if stalled else ""
    message = f"{what}: {reason} (gave up after {_plural(tries)}{why})"
    if failure is not None and failure.timeout:
        raise SourceTimeout(message)
    raise SourceError(message)


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
            exc.reason = f"{exc.reason} at byte {self.offset}"
            raise

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
    gate: HostLimiter,
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
