"""Retry and timeout policies for remote reads, and the one loop that applies them.

A :class:`Retry` and a :class:`Timeout` can be given per call (``read_bytes(url, retry=...)``)
or per pipeline (``Pipeline(..., retry=..., timeout=...)``, which the run publishes in its
scope's settings); a per-call value wins. Backends (``_http``, ``_s3``) signal a failure worth
another try by raising :class:`Transient`; anything else they raise is final.

:func:`with_retries` is the one retry loop. A whole read (``fetch``, a listing page) is one
call of it; a stream (a tar shard) is one call per chunk, through :func:`retry_stream`, which
reopens the stream at the byte where a try broke: its budget of tries is per stall, and its
``total`` deadline spans the whole stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import math
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._errors import ConfigError, SourceError, SourceTimeout
from .._scope import current_scope

__all__ = [
    "Retry",
    "Timeout",
    "Transient",
    "parse_retry_after",
    "resolve_policy",
    "retry_stream",
    "with_retries",
]

T = TypeVar("T")

log = logging.getLogger("asyncflow.sources")

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def _check_seconds(name: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"{name} must be a number of seconds or None, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class Retry:
    """How often, and after how long, a failed remote read is tried again.

    Retried: HTTP 429, 500, 502, 503 and 504 (``statuses``), S3 ``SlowDown`` and other
    throttling or internal errors, connection resets, truncated bodies and timeouts. Never
    retried: 401, 403 and 404 (and their S3 equivalents), which fail at once.

    The wait before try ``n + 1`` is drawn uniformly from ``[0, min(max_backoff,
    backoff * 2 ** (n - 1))]`` ("full jitter"), so that many clients throttled together do
    not come back together. A ``Retry-After`` from the server (seconds or an HTTP date) is a
    floor on that wait, capped at ``max_retry_after``.

    One HTTP attempt may hold two requests: aiohttp reconnects once by itself when a
    connection drops before the response begins, as a stale keep-alive connection does.

    Args:
        attempts: Tries in all, the first included; ``1`` turns retrying off.
        backoff: Base of the exponential back-off, in seconds.
        max_backoff: Cap on the jittered wait, in seconds.
        max_retry_after: Cap on a server's ``Retry-After``, in seconds.
        statuses: HTTP statuses worth another try.
    """

    attempts: int = 5
    backoff: float = 0.1
    max_backoff: float = 10.0
    max_retry_after: float = 60.0
    statuses: frozenset[int] = field(default=_RETRY_STATUSES)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError(f"attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError(f"attempts must be >= 1, got {self.attempts}")
        _check_seconds("backoff", self.backoff, allow_zero=True)
        _check_seconds("max_backoff", self.max_backoff, allow_zero=True)
        _check_seconds("max_retry_after", self.max_retry_after, allow_zero=True)
        object.__setattr__(self, "statuses", frozenset(self.statuses))
        if any(s in (401, 403, 404) for s in self.statuses):
            raise ConfigError("401, 403 and 404 are never retried; remove them from statuses")

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed try (``failures >= 1``)."""
        cap = min(self.max_backoff, self.backoff * 2.0 ** max(failures - 1, 0))
        wait = random.uniform(0.0, cap)
        if retry_after is not None:
            wait = max(wait, min(max(retry_after, 0.0), self.max_retry_after))
        return wait


@dataclass(frozen=True)
class Timeout:
    """Deadlines of a remote read, in seconds; ``None`` means no deadline.

    Args:
        connect: Opening a connection (including waiting for a free one in the pool).
        read: Waiting for each next piece of the response. It restarts with every chunk
            that arrives, so a slow but steady large download is never cut off by it; only a
            read that stalls for this long fails (and is retried).
        total: The whole call, every retry and back-off included. Off by default, so that a
            large download that keeps making progress is never killed.
    """

    connect: float | None = 10.0
    read: float | None = 30.0
    total: float | None = None

    def __post_init__(self) -> None:
        _check_seconds("connect", self.connect)
        _check_seconds("read", self.read)
        _check_seconds("total", self.total)


class Transient(Exception):
    """One try failed in a way worth another; ``reason`` is already free of secrets."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        timeout: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.timeout = timeout


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


_DEFAULT_RETRY = Retry()
_DEFAULT_TIMEOUT = Timeout()


def resolve_policy(retry: Retry | None, timeout: Timeout | None) -> tuple[Retry, Timeout]:
    """The call's own policies, else the running pipeline's, else the defaults."""
    if retry is None or timeout is None:
        scope = current_scope()
        settings: Any = scope.settings if scope is not None else {}
        if retry is None:
            retry = settings.get("retry") or _DEFAULT_RETRY
        if timeout is None:
            timeout = settings.get("timeout") or _DEFAULT_TIMEOUT
    if not isinstance(retry, Retry):
        raise ConfigError(f"retry must be an asyncflow.Retry, got {type(retry).__name__}")
    if not isinstance(timeout, Timeout):
        raise ConfigError(f"timeout must be an asyncflow.Timeout, got {type(timeout).__name__}")
    return retry, timeout


_NO_DEADLINE = contextlib.nullcontext()


def _plural(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
    deadline: float | None = None,
) -> T:
    """Run ``attempt()`` until it returns, fails for good, or ``retry`` gives up.

    Args:
        attempt: One try; raises :class:`Transient` for a failure worth another try.
        what: The operation and redacted URL for messages (``"GET https://host/a.jpg"``, or an
            :class:`~._redact.Operation` that redacts only when a message is made).
        deadline: The event loop time by which ``timeout.total`` runs out, when it bounds an
            operation of several calls (a stream's chunks); default: ``timeout.total`` from
            now.

    Raises:
        SourceTimeout: The last try timed out, or ``timeout.total`` passed.
        SourceError: The last try failed with a retryable error; the message names ``what``,
            the reason (status) and the number of attempts.

    Cancellation:
        Cancelling the caller cancels the try or the back-off in progress; nothing is left
        running.
    """
    tries = 0
    failure: Transient | None = None
    fatal: SourceError | None = None
    # No total deadline (the default): no timeout context to enter for every read.
    if deadline is None and timeout.total is not None:
        deadline = asyncio.get_running_loop().time() + timeout.total
    limit = None if deadline is None else asyncio.timeout_at(deadline)
    try:
        async with limit or _NO_DEADLINE:
            while True:
                tries += 1
                try:
                    return await attempt()
                except Transient as exc:
                    failure = exc
                except SourceError as exc:
                    fatal = exc
                    break
                if tries >= retry.attempts:
                    break
                wait = retry.delay(tries, failure.retry_after)
                log.debug("%s: %s; try %d of %d in %.2fs", what, failure.reason, tries + 1,
                          retry.attempts, wait)
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
    message = f"{what}: {reason} (gave up after {_plural(tries)})"
    if failure is not None and failure.timeout:
        raise SourceTimeout(message)
    raise SourceError(message)


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
                            retry_after=exc.retry_after, timeout=exc.timeout) from None
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
    open_at: Callable[[int], AsyncGenerator[bytes, None]],
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
) -> AsyncGenerator[bytes, None]:
    """The bytes of a ranged read, each chunk fetched through :func:`with_retries`.

    Args:
        open_at: One try at the bytes from an offset on; raises :class:`Transient` when it
            breaks, and is then called again at the byte where it stopped.

    Raises:
        SourceError: A try failed for good, or ``retry.attempts`` tries in a row delivered
            nothing; the message names ``what``, the reason and the byte where it stalled.
        SourceTimeout: The last try timed out, or ``timeout.total`` (for the whole stream)
            passed.

    Cancellation:
        Cancelling the consumer cancels the try or back-off in progress; closing the
        generator closes the try's connection.
    """
    deadline = None
    if timeout.total is not None:
        deadline = asyncio.get_running_loop().time() + timeout.total
    reader = _Reopening(open_at)
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
