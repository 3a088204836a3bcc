"""HTTP(S) reads through one shared aiohttp session.

Inside a pipeline run the session lives in the run's scope (one per run, closed when the run
stops); outside any run each call opens and closes its own, unless the caller wraps its calls
in ``async with asyncflow.sources.session():``.

Redirects are followed by hand (at most :data:`MAX_REDIRECTS`), so that a redirect can never
move a read to another scheme. Every aiohttp failure is translated here: a failure worth
another try becomes :class:`~asyncflow.sources._retry.Transient`, anything else a
:class:`~asyncflow.SourceError` whose message holds no secret.
"""

from __future__ import annotations

import email.utils
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager

import aiohttp
from yarl import URL

from .._errors import SourceError, SourceNotFound, SourcePermissionError
from .._scope import RunScope, current_scope
from ._redact import Operation, describe_exception, redact_url
from ._retry import Retry, Timeout, Transient, with_retries

__all__ = [
    "HTTP_KEY",
    "MAX_REDIRECTS",
    "fetch",
    "http_session",
    "new_session",
    "parse_retry_after",
    "stream",
]

HTTP_KEY = "asyncflow.http"
MAX_REDIRECTS = 5
DEFAULT_CONNECTIONS = 256
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 256 * 1024


def new_session(connections: int = DEFAULT_CONNECTIONS) -> aiohttp.ClientSession:
    """A session with a bounded connection pool and a DNS cache; use it as a context manager.

    Requests above ``connections`` wait for a free connection; that wait does not count
    against :attr:`Timeout.connect`, so thousands of queued requests never time out merely
    for being queued.
    """
    connector = aiohttp.TCPConnector(limit=connections, ttl_dns_cache=300, use_dns_cache=True)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        # trust_env=True would look up proxies and ~/.netrc on a worker thread for every
        # request, doubling the cost of a small read.
        trust_env=False,
        # The body is checked against Content-Length, which only holds for identity encoding.
        headers={"Accept-Encoding": "identity"},
    )


@asynccontextmanager
async def http_session() -> AsyncIterator[aiohttp.ClientSession]:
    """The running pipeline's shared session, or a private one for the duration of the block."""
    scope = current_scope()
    if scope is not None:
        yield await _scope_session(scope)
        return
    async with new_session() as session:
        yield session


def _scope_session(scope: RunScope) -> Awaitable[aiohttp.ClientSession]:
    connections = scope.settings.get("connections") or DEFAULT_CONNECTIONS
    return scope.get(HTTP_KEY, lambda: new_session(connections))


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


@functools.lru_cache(maxsize=64)
@functools.lru_cache(maxsize=64)
def _client_timeout(timeout: Timeout) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=timeout.connect, sock_read=timeout.read
    )


def _translate(exc: BaseException, what: object, timeout: Timeout) -> Exception:
    """The asyncflow error for an aiohttp (or socket) failure, free of secrets."""
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return SourceError(f"{what}: invalid URL")
    if isinstance(exc, aiohttp.ClientSSLError | aiohttp.ServerFingerprintMismatch):
        return SourceError(f"{what}: TLS failure: {describe_exception(exc)}")
    if isinstance(exc, TimeoutError):
        kind = "connect" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "read"
        limit = timeout.connect if kind == "connect" else timeout.read
        return Transient(f"{kind} timed out ({kind}={limit}s)", timeout=True)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return Transient(f"body truncated ({describe_exception(exc)})")
    return Transient(f"connection failed ({describe_exception(exc)})")


def _check_status(resp: aiohttp.ClientResponse, what: object, retry: Retry) -> None:
    status = resp.status
    if 200 <= status < 300:
        return
    text = f"{what}: HTTP {status} {resp.reason or ''}".rstrip()
    if status in (404, 410):
        raise SourceNotFound(text)
    if status in (401, 403):
        raise SourcePermissionError(text)
    if status in retry.statuses:
        retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        raise Transient(f"HTTP {status} {resp.reason or ''}".rstrip(), status=status,
                        retry_after=retry_after)
    raise SourceError(text)


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


async def _get(
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
            raise _translate(exc, what, timeout) from None
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


def _check_length(resp: aiohttp.ClientResponse, got: int, expected: int | None) -> None:
    if expected is None or "Content-Encoding" in resp.headers:
        return
    if got != expected:
        raise Transient(f"body truncated: got {got} of {expected} bytes")


async def _fetch_once(
    session: aiohttp.ClientSession, url: str, what: object, retry: Retry, timeout: Timeout
) -> bytes:
    resp = await _get(session, url, what=what, retry=retry, timeout=timeout)
    try:
        body = await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise _translate(exc, what, timeout) from None
    finally:
        resp.release()
    _check_length(resp, len(body), resp.content_length)
    return body


async def fetch(url: str, *, retry: Retry, timeout: Timeout) -> bytes:
    """GET ``url`` and return the whole body, retrying as ``retry`` says.

    Raises:
        SourceNotFound: HTTP 404 or 410.
        SourcePermissionError: HTTP 401 or 403, or a redirect to another scheme.
        SourceTimeout: The last try timed out.
        SourceError: Any other failure; the message names the redacted URL, the status and
            the number of attempts.
    """
    what = Operation("GET", url)

    def retrying(session: aiohttp.ClientSession) -> Awaitable[bytes]:
        return with_retries(lambda: _fetch_once(session, url, what, retry, timeout),
                            what=what, retry=retry, timeout=timeout)

    scope = current_scope()
    if scope is None:  # outside a run: a session of its own, closed on return
        async with new_session() as session:
            return await retrying(session)
    return await retrying(await _scope_session(scope))  # no context manager per request


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    offset: int,
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
) -> AsyncGenerator[bytes, None]:
    """One try at the body of ``url`` from byte ``offset`` on, in chunks.

    Asks for a range when ``offset > 0`` and skips ahead itself if the server ignores it.
    Raises :class:`Transient` for a failure worth resuming from where it stopped.
    """
    headers = {"Range": f"bytes={offset}-"} if offset else None
    resp = await _get(session, url, what=what, retry=retry, timeout=timeout, headers=headers)
    try:
        skip = offset if resp.status == 200 else 0
        expected = resp.content_length
        got = 0
        try:
            async for chunk in resp.content.iter_chunked(_CHUNK):
                got += len(chunk)
                if skip:
                    cut = min(skip, len(chunk))
                    skip -= cut
                    chunk = chunk[cut:]
                    if not chunk:
                        continue
                yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _translate(exc, what, timeout) from None
        _check_length(resp, got, expected)
    finally:
        resp.release()
