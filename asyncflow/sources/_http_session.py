"""HTTP(S) sessions, requests, redirects and bodies: aiohttp's side of the ``http`` transport.

Inside a pipeline run the session lives in the run's scope (one per run, closed when the run
stops); outside any run each call opens and closes its own, unless the caller wraps its calls
in ``async with asyncflow.sources.session():``.

Redirects are followed by hand (at most :data:`MAX_REDIRECTS`), so that a redirect can never
move a read to another scheme. Every aiohttp failure is translated here: a failure worth
another try becomes :class:`~asyncflow.sources._retry.Transient`, anything else a
:class:`~asyncflow.SourceError` whose message holds no secret.

A body is read whole or not at all: Content-Length is checked, and a server may encode a body
although asked not to; aiohttp's own decoder does not notice a gzip stream cut short, so bodies
are decoded here (:mod:`._inflate`), and must reach the end of their stream.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncGenerator, Mapping
from contextlib import AbstractAsyncContextManager

import aiohttp
from yarl import URL

from .._errors import SourceError, SourcePermissionError
from .._redact import describe_exception, redact_url
from ._inflate import Inflater
from ._objects import connections, shared
from ._retry import Retry, Timeout, Transient, failed_answer

__all__ = [
    "HTTP_KEY",
    "MAX_CONTENT_LENGTH",
    "MAX_REDIRECTS",
    "body",
    "coding",
    "content_length",
    "get",
    "http_session",
    "new_session",
    "translate",
]

HTTP_KEY = "asyncflow.http"
MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 256 * 1024
MAX_CONTENT_LENGTH = 1 << 48  # far above any real object (S3's limit is 5 TiB)
_DIGITS = re.compile(r"[0-9]{1,20}")


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
    """The final response to GET ``url`` after redirects, its status already checked (a 416
    to a request with ``headers``, a ``Range``, is the caller's to read).

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
            if resp.status != 416 or headers is None:  # a 416 to a Range: where it ends
                _check_status(resp, what, retry)
        except BaseException:
            resp.release()
            raise
        return resp
    raise SourceError(f"{what}: more than {MAX_REDIRECTS} redirects")


def content_length(resp: aiohttp.ClientResponse, what: object) -> int | None:
    """The validated Content-Length, or ``None`` when the server sent none."""
    values = resp.headers.getall("Content-Length", [])
    if not values:
        return None
    raw = values[0].strip()
    if len(set(values)) > 1 or not _DIGITS.fullmatch(raw) or int(raw) > MAX_CONTENT_LENGTH:
        raise SourceError(f"{what}: invalid Content-Length {', '.join(values)[:60]!r}")
    return int(raw)


def coding(resp: aiohttp.ClientResponse) -> str:
    """The response's Content-Encoding, lower-cased; ``"identity"`` when none."""
    return resp.headers.get("Content-Encoding", "").strip().lower() or "identity"


def _inflater(resp: aiohttp.ClientResponse, what: object) -> Inflater | None:
    name = coding(resp)
    if name == "identity":
        return None
    if name in ("gzip", "x-gzip", "deflate"):
        return Inflater(what, name)
    raise SourceError(f"{what}: unsupported Content-Encoding {name[:40]!r}")


async def body(
    resp: aiohttp.ClientResponse, expected: int | None, what: object, timeout: Timeout
) -> AsyncGenerator[bytes, None]:
    """The decoded body in chunks; raises :class:`Transient` unless all of it arrived."""
    inflater = _inflater(resp, what)
    got = 0
    try:
        async for chunk in resp.content.iter_chunked(_CHUNK):
            got += len(chunk)
            if inflater is None:
                yield chunk
                continue
            inflater.push(chunk)
            # A slice at a time: a gzip bomb's 256 KiB inflate to 256 MiB in one call, all
            # of it held before a reader's max_bytes could refuse the first slice.
            while data := inflater.pull(_CHUNK):
                yield data
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise translate(exc, what, timeout) from None
    if expected is not None and got != expected:
        raise Transient(f"body truncated: got {got} of {expected} bytes")
    if inflater is not None and inflater.cut:
        raise Transient(f"{inflater.coding} body ends before the end of its stream")
