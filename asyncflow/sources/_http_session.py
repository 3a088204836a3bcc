"""HTTP(S) sessions, requests and redirects: aiohttp's side of the ``http`` transport.

Inside a pipeline run the session lives in the run's scope (one per run, closed when the run
stops); outside any run each call opens and closes its own, unless the caller wraps its calls
in ``async with asyncflow.sources.session():``.

Redirects are followed by hand (at most :data:`MAX_REDIRECTS`), so that a redirect can never
move a read to another scheme. Every aiohttp failure is translated here: a failure worth
another try becomes :class:`~asyncflow.sources._retry.Transient`, anything else a
:class:`~asyncflow.SourceError` whose message holds no secret.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager

import aiohttp
from yarl import URL

from .._errors import SourceError, SourcePermissionError
from .._redact import describe_exception, redact_url
from ._objects import connections, shared
from ._retry import Retry, Timeout, Transient, failed_answer

__all__ = [
    "HTTP_KEY",
    "MAX_REDIRECTS",
    "get",
    "http_session",
    "new_session",
    "translate",
]

HTTP_KEY = "asyncflow.http"
MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def new_session() -> aiohttp.ClientSession:
    """A session with a bounded connection pool and a DNS cache; use it as a context manager.

    Requests above :func:`~._objects.connections` wait for a free connection; that wait
    does not count against :attr:`Timeout.connect`, so thousands of queued requests never
    time out merely for being queued.
    """
    connector = aiohttp.TCPConnector(limit=connections(), ttl_dns_cache=300, use_dns_cache=True)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        # trust_env=True would look up proxies and ~/.netrc on a worker thread for every
        # request, doubling the cost of a small read.
        trust_env=False,
        headers={"Accept-Encoding": "identity"},
        # A server may encode anyway; aiohttp's own decoder does not notice a gzip stream
        # cut short, so bodies are decoded here, after Content-Length is checked.
        auto_decompress=False,
    )


def http_session() -> AbstractAsyncContextManager[aiohttp.ClientSession]:
    """The running pipeline's shared session, or a private one for the duration of the block."""
    return shared(HTTP_KEY, new_session)


@functools.lru_cache(maxsize=64)
def _client_timeout(timeout: Timeout) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=timeout.connect, sock_read=timeout.read
    )


def translate(exc: BaseException, what: object, timeout: Timeout) -> Exception:
    """The asyncflow error for an aiohttp (or socket) failure, free of secrets."""
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return SourceError(f"{what}: invalid URL")
    if isinstance(exc, aiohttp.ClientSSLError | aiohttp.ServerFingerprintMismatch):
        return SourceError(f"{what}: TLS failure: {describe_exception(exc)}")
    if isinstance(exc, TimeoutError):
        kind = "connect" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "read"
        limit = timeout.connect if kind == "connect" else timeout.read
        return Transient(f"{kind} timed out ({kind}={limit}s)", timeout=True)
    if isinstance(exc, aiohttp.ClientResponseError):  # aiohttp could not parse the answer
        return SourceError(f"{what}: malformed HTTP response ({describe_exception(exc)})")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return Transient(f"body truncated ({describe_exception(exc)})")
    return Transient(f"connection failed ({describe_exception(exc)})")


def _check_status(resp: aiohttp.ClientResponse, what: object, retry: Retry) -> None:
    status = resp.status
    if not 200 <= status < 300:
        raise failed_answer(what, f"HTTP {status} {resp.reason or ''}".rstrip(), status, retry,
                            resp.headers.get("Retry-After"), gone=status == 410)


def _next_hop(current: URL, resp: aiohttp.ClientResponse, scheme: str, what: object) -> URL:
    location = resp.headers.get("Location")
    if not location:
        raise SourceError(f"{what}: HTTP {resp.status} redirect without a Location")
    try:
        target = current.join(URL(location))
    except ValueError:
        raise SourceError(f"{what}: redirect to an invalid URL") from None
    if target.scheme.lower() != scheme:
        raise SourcePermissionError(
            f"{what}: redirect from {scheme}:// to {target.scheme}:// refused "
            f"({redact_url(str(target))})"
        )
    return target


async def get(
    session: aiohttp.ClientSession,
    url: str,
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
    headers: Mapping[str, str] | None = None,
) -> aiohttp.ClientResponse:
    """The final response to GET ``url`` after redirects, its status already checked.

    The caller must ``release()`` it. A plain coroutine rather than a context manager: it
    runs once per object read, where every layer costs.
    """
    try:
        target = URL(url)
    except ValueError:
        raise SourceError(f"{what}: invalid URL") from None
    scheme = target.scheme.lower()
    client_timeout = _client_timeout(timeout)
    for _ in range(MAX_REDIRECTS + 1):
        try:
            resp = await session.get(
                target, allow_redirects=False, headers=headers, timeout=client_timeout
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise translate(exc, what, timeout) from None
        try:
            if resp.status in _REDIRECTS:
                target = _next_hop(target, resp, scheme, what)
                resp.release()
                continue
            _check_status(resp, what, retry)
        except BaseException:
            resp.release()
            raise
        return resp
    raise SourceError(f"{what}: more than {MAX_REDIRECTS} redirects")
