"""Retry and timeout policies for remote reads, and the one loop that applies them.

A :class:`Retry` and a :class:`Timeout` can be given per call (``read_bytes(url, retry=...)``)
or per pipeline (``Pipeline(..., retry=..., timeout=...)``, which the run publishes in its
scope's settings); a per-call value wins. Backends (``_http``, ``_s3``) signal a failure worth
another try by raising :class:`Transient` (``throttled=True`` for 429, 503 and S3's
``SlowDown``); anything else they raise is final.

:func:`with_retries` is the one retry loop. A whole read (``fetch``, a listing page) is one
call of it, through the host's adaptive limiter (``_limiter.HostLimiter``, the ``gate``); a
stream (a tar shard) is one call per chunk, through :func:`~._retry_stream.retry_stream`
(``fetch`` goes through its :func:`~._retry_stream.retry_whole`).
Throttling never uses up ``attempts``: a throttled read gives up only when nothing from its
host has succeeded for ``Retry.patience`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .._errors import (
    ConfigError,
    SourceError,
    SourceNotFound,
    SourcePermissionError,
    SourceTimeout,
    check_fraction,
    check_int,
    check_seconds,
)
from .._scope import current_scope

__all__ = [
    "THROTTLE_STATUSES",
    "Limiter",
    "Retry",
    "Timeout",
    "Transient",
    "failed_answer",
    "http_date",
    "parse_retry_after",
    "resolve_policy",
    "with_retries",
]

T = TypeVar("T")


class Limiter(Protocol):
    """What the retry loop needs of a host's limiter (``_limiter.HostLimiter`` is one)."""

    last_success: float  # the event loop's time of the host's last successful read

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        retried: bool,
        retry: Retry,
        hedge: Callable[[], Awaitable[T]] | None = None,
    ) -> T:
        """One try within the host's window (see ``HostLimiter.run``)."""
        ...

log = logging.getLogger("asyncflow.sources")

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The statuses that mean "too many requests": they shrink the host's window and never use up
#: ``Retry.attempts`` (when they are in ``Retry.statuses``).
THROTTLE_STATUSES = frozenset({429, 503})
#: Throttled tries back off as if this were at most their failure count: the host's window,
#: not a growing wait, paces them (0.8 s at most by default).
_THROTTLE_BACKOFF_STEPS = 4


@dataclass(frozen=True)
class Retry:
    """How often, and after how long, a failed remote read is tried again; hedged reads.

    Retried: HTTP 429, 500, 502, 503 and 504 (``statuses``), S3 ``SlowDown`` and other
    throttling or internal errors, connection resets, truncated bodies and timeouts. Never
    retried: 401, 403 and 404 (and their S3 equivalents), which fail at once.

    Throttling (429, 503, S3 ``SlowDown`` and its kin) is not a failure of the read: the host's
    window of requests in flight halves, the throttled read gives up its place and waits, then
    goes before the reads not yet sent. It never uses up ``attempts``; it gives up only when no
    read from the same host (or S3 bucket and prefix) has succeeded for ``patience`` seconds.

    The wait before try ``n + 1`` is drawn uniformly from ``[0, min(max_backoff,
    backoff * 2 ** (n - 1))]`` ("full jitter"), so that many clients throttled together do
    not come back together. A ``Retry-After`` of ``R`` seconds from the server (seconds or an
    HTTP date, capped at ``max_retry_after``) makes the wait ``R`` plus a jitter drawn from
    ``[0, max(R / 2, that cap)]``: never earlier than asked, and never all at once. A
    throttled read asked to wait past the end of its ``patience`` waits only until then, and
    gives up there unless a read from its host succeeded meanwhile.

    One HTTP attempt may hold two requests: aiohttp reconnects once by itself when a
    connection drops before the response begins, as a stale keep-alive connection does.

    Args:
        attempts: Tries in all, the first included, of a read that fails other than by
            throttling; ``1`` turns retrying off, after throttling too.
        backoff: Base of the exponential back-off, in seconds.
        max_backoff: Cap on the jittered wait, in seconds.
        max_retry_after: Cap on a server's ``Retry-After``, in seconds.
        statuses: HTTP statuses worth another try.
        patience: Seconds of throttling with no read from the host succeeding before a
            throttled read gives up (with a ``SourceError`` naming the URL and the status).
        hedge: Hedged reads: the most extra requests they may add, as a fraction of the
            requests sent (``0.15``: 15%); ``0`` turns hedging off. A read still running when
            the host's recent latencies say it should be done (see ``hedge_quantile``) sends a
            second request; the first complete, checked answer wins and the other is
            cancelled and its connection closed.
        hedge_quantile: The quantile of the host's recent latencies (p90 by default) after
            which a read is hedged (and at least twice their median).
    """

    attempts: int = 5
    backoff: float = 0.1
    max_backoff: float = 10.0
    max_retry_after: float = 60.0
    statuses: frozenset[int] = field(default=_RETRY_STATUSES)
    patience: float = 60.0
    hedge: float = 0.15
    hedge_quantile: float = 0.9

    def __post_init__(self) -> None:
        check_int("attempts", self.attempts)
        check_seconds("backoff", self.backoff, zero=True)
        for name in ("max_backoff", "max_retry_after", "patience"):  # inf: no cap, no end
            check_seconds(name, getattr(self, name), zero=True, infinite=True)
        check_fraction("hedge", self.hedge, low=0.0, high=1.0)
        check_fraction("hedge_quantile", self.hedge_quantile, low=0.5, high=0.999)
        object.__setattr__(self, "statuses", frozenset(self.statuses))
        if any(s in (401, 403, 404) for s in self.statuses):
            raise ConfigError("401, 403 and 404 are never retried; remove them from statuses")

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed try (``failures >= 1``)."""
        cap = min(self.max_backoff, self.backoff * 2.0 ** max(failures - 1, 0))
        if retry_after is None:
            return random.uniform(0.0, cap)
        floor = min(max(retry_after, 0.0), self.max_retry_after)
        return floor + random.uniform(0.0, max(floor / 2, cap))


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
        for name in ("connect", "read", "total"):
            check_seconds(name, getattr(self, name), allow_none=True)


class Transient(Exception):
    """One try failed in a way worth another; ``reason`` is already free of secrets.

    ``throttled``: the server said it gets too many requests (429, 503, S3 ``SlowDown``).
    """

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        timeout: bool = False,
        throttled: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.timeout = timeout
        self.throttled = throttled


def http_date(value: str | None) -> float | None:
    """The POSIX time of an HTTP date with a time zone; ``None`` for anything else."""
    try:
        when = email.utils.parsedate_to_datetime(value) if value else None
    except (TypeError, ValueError, IndexError):
        return None
    return None if when is None or when.tzinfo is None else when.timestamp()


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        when = http_date(value)
    return None if when is None else max(0.0, when - (time.time() if now is None else now))


def failed_answer(
    what: object, label: str, status: int | None, retry: Retry, retry_after: str | None, *,
    gone: bool = False, denied: bool = False, retried: bool = False, throttled: bool = False,
) -> Exception:
    """The error for an answer that failed: final (naming ``what``) or :class:`Transient`.

    The one place a status decides: 404 is not found, 401 and 403 are refused, and
    ``retry.statuses`` are tried again (:data:`THROTTLE_STATUSES` as throttling). A store's
    own error code may say so too (``gone``, ``denied``, ``retried``, ``throttled``).

    Args:
        label: What the answer said, free of secrets (``"HTTP 503 Service Unavailable"``).
        retry_after: The answer's ``Retry-After`` header, if any.
    """
    if gone or status == 404:
        return SourceNotFound(f"{what}: {label}")
    if denied or status in (401, 403):
        return SourcePermissionError(f"{what}: {label}")
    if retried or status in retry.statuses:
        return Transient(label, status=status, retry_after=parse_retry_after(retry_after),
                         throttled=throttled or status in THROTTLE_STATUSES)
    return SourceError(f"{what}: {label}")


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


async def _wait_patiently(
    wait: float, started: float, gate: Limiter | None, patience: float
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
    gate: Limiter | None = None,
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
                    return await gate.run(attempt, retried=tries > 1, retry=retry,
                                          hedge=hedge if tries == 1 else None)
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
                else:
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
