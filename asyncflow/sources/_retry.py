"""Retry and timeout policies for remote reads, and what a failed answer means.

A :class:`Retry` and a :class:`Timeout` can be given per call (``read_bytes(url, retry=...)``)
or per pipeline (``Pipeline(..., retry=..., timeout=...)``, which the run publishes in its
scope's settings); a per-call value wins. Backends (``_http``, ``_s3``) signal a failure worth
another try by raising :class:`Transient` (``throttled=True`` for 429, 503 and S3's
``SlowDown``); anything else they raise is final.

The one retry loop that applies them is :func:`~._tries.with_retries`: a whole read
(``fetch``, a listing page) is one call of it, through the host's adaptive limiter
(``_limiter.HostLimiter``); a stream (a tar shard) is one call per chunk.
Throttling never uses up ``attempts``: a throttled read gives up only when nothing from its
host has succeeded for ``Retry.patience`` seconds.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field
from typing import Any

from .._errors import (
    ConfigError,
    SourceError,
    SourceNotFound,
    SourcePermissionError,
    check_fraction,
    check_int,
    check_seconds,
)
from .._scope import current_scope

__all__ = [
    "THROTTLE_STATUSES",
    "Retry",
    "Timeout",
    "Transient",
    "failed_answer",
    "http_date",
    "parse_retry_after",
    "resolve_policy",
]


_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The statuses that mean "too many requests": they shrink the host's window and never use up
#: ``Retry.attempts`` (when they are in ``Retry.statuses``).
THROTTLE_STATUSES = frozenset({429, 503})


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
        retry_after: float | None = None,
        timeout: bool = False,
        throttled: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
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
        return Transient(label, retry_after=parse_retry_after(retry_after),
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
