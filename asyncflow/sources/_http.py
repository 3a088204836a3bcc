"""HTTP(S) reads through one shared aiohttp session.

Inside a pipeline run the session lives in the run's scope (one per run, closed when the run
stops); outside any run each call opens and closes its own, unless the caller wraps its calls
in ``async with asyncflow.sources.session():``.

Redirects are followed by hand (at most :data:`MAX_REDIRECTS`), so that a redirect can never
move a read to another scheme. Every aiohttp failure is translated here: a failure worth
another try becomes :class:`~asyncflow.sources._retry.Transient`, anything else a
:class:`~asyncflow.SourceError` whose message holds no secret.

A body comes back only whole and from one version of the object: Content-Length and
Content-Range are validated before use (well-formed, in bounds, the range asked for); a try
resumed with ``Range`` carries ``If-Range`` with the strong ETag or Last-Modified date of the
first answer (:class:`Resume`), and without one the body starts again from zero; a gzip or
deflate body is decoded here and must reach the end of its stream.
"""

from __future__ import annotations

import email.utils
import functools
import re
import time
import weakref
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any

import aiohttp
from yarl import URL

from .._errors import SourceError, SourceNotFound, SourcePermissionError
from .._scope import RunScope, current_scope
from ._redact import Operation, describe_exception, redact_url
from ._retry import Retry, Timeout, Transient, with_retries

__all__ = [
    "HTTP_KEY",
    "MAX_CONTENT_LENGTH",
    "MAX_REDIRECTS",
    "Resume",
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
MAX_CONTENT_LENGTH = 1 << 48  # far above any real object (S3's limit is 5 TiB)
_DIGITS = re.compile(r"[0-9]{1,20}")
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,20})-([0-9]{1,20})/([0-9]{1,20})")


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
        headers={"Accept-Encoding": "identity"},
        # A server may encode anyway; aiohttp's own decoder does not notice a gzip stream
        # cut short, so bodies are decoded here, after Content-Length is checked.
        auto_decompress=False,
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
    if isinstance(exc, aiohttp.ClientResponseError):  # aiohttp could not parse the answer
        return SourceError(f"{what}: malformed HTTP response ({describe_exception(exc)})")
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


def _content_length(resp: aiohttp.ClientResponse, what: object) -> int | None:
    """The validated Content-Length, or ``None`` when the server sent none."""
    values = resp.headers.getall("Content-Length", [])
    if not values:
        return None
    raw = values[0].strip()
    if len(set(values)) > 1 or not _DIGITS.fullmatch(raw) or int(raw) > MAX_CONTENT_LENGTH:
        raise SourceError(f"{what}: invalid Content-Length {', '.join(values)[:60]!r}")
    return int(raw)


def _http_date(value: str | None) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(value) if value else None
    except (TypeError, ValueError, IndexError):
        return None
    return None if when is None or when.tzinfo is None else when.timestamp()


class Resume:
    """What the first answer told about an object, which every resumed answer must match.

    One per read: give the same instance to each :func:`stream` call of that read. A resumed
    request carries ``If-Range`` with the strong ETag (else a strong Last-Modified date), so a
    server whose object changed answers with the new object whole instead of a piece of it.
    """

    __slots__ = ("encoded", "etag", "last_modified", "total")

    def __init__(self) -> None:
        self.etag: str | None = None
        self.last_modified: str | None = None
        self.total: int | None = None
        self.encoded = False

    def learn(self, resp: aiohttp.ClientResponse, length: int | None) -> None:
        """Take the validators and size of a whole (non-range) answer."""
        etag = resp.headers.get("ETag")
        self.etag = etag if etag and etag.startswith('"') else None  # W/"..." cannot prove
        # RFC 9110 13.1.5: a date only where there is no entity tag, and only a strong one
        # (at least a second older than the answer's Date).
        modified, date = resp.headers.get("Last-Modified"), resp.headers.get("Date")
        when, now = _http_date(modified), _http_date(date)
        strong = etag is None and when is not None and now is not None and now - when >= 1
        self.last_modified = modified if strong else None
        self.total = length
        self.encoded = _coding(resp) != "identity"

    def if_range(self) -> str | None:
        """The ``If-Range`` value that proves a resumed answer continues this object."""
        # A decoder's state dies with its connection, so an encoded body is never resumed.
        return None if self.encoded else self.etag or self.last_modified

    def same(self, resp: aiohttp.ClientResponse, length: int | None) -> bool:
        """Whether a whole answer is the very object this read began with."""
        validator = self.if_range()
        header = resp.headers.get("ETag" if self.etag else "Last-Modified")
        return validator is not None and header == validator and length == self.total


class _Changed(SourceError):
    """The object changed between two tries of one read."""


def _range_answer(
    resp: aiohttp.ClientResponse, offset: int, resume: Resume, length: int | None, what: object
) -> int:
    """How many bytes a 206 to ``Range: bytes=<offset>-`` holds; refuses any other range."""
    raw = resp.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(raw.strip())
    asked = f"bytes={offset}-" + (f" of {resume.total}" if resume.total is not None else "")
    if match is None:
        raise SourceError(f"{what}: HTTP 206 with an unusable Content-Range {raw[:60]!r} "
                          f"(asked for {asked})")
    header = "ETag" if resume.etag else "Last-Modified"
    sent = resp.headers.get(header)
    if sent is not None and sent != resume.if_range():
        raise _Changed(f"{what}: the object changed (another {header}) between tries")
    start, end, total = (int(g) for g in match.groups())
    if start != offset or end != total - 1 or total > MAX_CONTENT_LENGTH or (
        resume.total is not None and total != resume.total
    ) or (length is not None and length != end - start + 1):
        raise SourceError(f"{what}: HTTP 206 answered {raw[:60]!r} with Content-Length "
                          f"{length} to a request for {asked}")
    if _coding(resp) != "identity":
        raise SourceError(f"{what}: HTTP 206 with a Content-Encoding to a resumed request")
    return end - start + 1


async def _open(
    session: aiohttp.ClientSession,
    url: str,
    offset: int,
    resume: Resume,
    what: object,
    retry: Retry,
    timeout: Timeout,
) -> tuple[aiohttp.ClientResponse, int, int | None]:
    """``(response, where its body starts, how many bytes it holds)`` for the body from
    ``offset`` on; the body starts at 0 when the object cannot be resumed, has changed, or
    the server ignores ranges."""
    validator = resume.if_range() if offset else None
    headers = {"Range": f"bytes={offset}-", "If-Range": validator} if validator else None
    resp = await _get(session, url, what=what, retry=retry, timeout=timeout, headers=headers)
    try:
        length = _content_length(resp, what)
        if resp.status != 206:
            return resp, 0, length
        if headers is None:
            raise SourceError(f"{what}: HTTP 206 to a request without Range")
        return resp, offset, _range_answer(resp, offset, resume, length, what)
    except BaseException:
        resp.release()
        raise


class _Decoder:
    """Inflates a gzip or deflate body, and proves that it reached the end of its stream."""

    __slots__ = ("_inflater", "_wbits", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._wbits = 31 if name.endswith("gzip") else 0
        self._inflater: Any = None  # until the first byte: an empty body is a whole one

    def feed(self, data: bytes, what: object) -> bytes:
        if self._inflater is None:  # deflate is zlib-wrapped (RFC 9110); some servers send it raw
            wrapped = len(data) > 1 and data[0] & 0x0F == 8 and int.from_bytes(data[:2]) % 31 == 0
            self._wbits = self._wbits or (15 if wrapped else -15)
            self._inflater = zlib.decompressobj(self._wbits)
        out = []
        while data:
            if self._inflater.eof:
                if self._wbits != 31:
                    raise SourceError(f"{what}: data after the end of the {self.name} stream")
                self._inflater = zlib.decompressobj(31)  # gzip members may follow one another
            try:
                out.append(self._inflater.decompress(data))
            except zlib.error as exc:
                raise SourceError(f"{what}: corrupt {self.name} body ({exc})") from None
            data = self._inflater.unused_data if self._inflater.eof else b""
        return b"".join(out)

    def finish(self) -> None:
        if self._inflater is not None and not self._inflater.eof:
            raise Transient(f"{self.name} body ends before the end of its stream")


def _coding(resp: aiohttp.ClientResponse) -> str:
    return resp.headers.get("Content-Encoding", "").strip().lower() or "identity"


def _decoder(resp: aiohttp.ClientResponse, what: object) -> _Decoder | None:
    coding = _coding(resp)
    if coding == "identity":
        return None
    if coding in ("gzip", "x-gzip", "deflate"):
        return _Decoder(coding)
    raise SourceError(f"{what}: unsupported Content-Encoding {coding[:40]!r}")


async def _body(
    resp: aiohttp.ClientResponse, expected: int | None, what: object, timeout: Timeout
) -> AsyncGenerator[bytes, None]:
    """The decoded body in chunks; raises :class:`Transient` unless all of it arrived."""
    decoder = _decoder(resp, what)
    got = 0
    try:
        async for chunk in resp.content.iter_chunked(_CHUNK):
            got += len(chunk)
            if decoder is not None:
                chunk = decoder.feed(chunk, what)
            if chunk:
                yield chunk
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise _translate(exc, what, timeout) from None
    if expected is not None and got != expected:
        raise Transient(f"body truncated: got {got} of {expected} bytes")
    if decoder is not None:
        decoder.finish()


class _Partial:
    """What the tries of one :func:`fetch` got so far, and what proves where it came from."""

    __slots__ = ("chunks", "resume", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.resume = Resume()

    def restart(self) -> None:
        self.chunks.clear()
        self.size = 0


async def _fetch_once(
    session: aiohttp.ClientSession,
    url: str,
    what: object,
    retry: Retry,
    timeout: Timeout,
    partial: _Partial,
) -> bytes:
    try:
        resp, start, expected = await _open(
            session, url, partial.size, partial.resume, what, retry, timeout
        )
    except _Changed as exc:
        partial.restart()
        partial.resume = Resume()  # the next try asks for the new object whole
        raise Transient(str(exc).removeprefix(f"{what}: ")) from None
    try:
        if start == 0:  # whole: the first answer, or the object could not be resumed
            partial.restart()
            partial.resume.learn(resp, expected)
        async with aclosing(_body(resp, expected, what, timeout)) as body:
            async for chunk in body:
                partial.chunks.append(chunk)
                partial.size += len(chunk)
    finally:
        resp.release()
    return b"".join(partial.chunks)


async def fetch(url: str, *, retry: Retry, timeout: Timeout) -> bytes:
    """GET ``url`` and return the whole body, retrying as ``retry`` says.

    A try that breaks mid-body resumes where it stopped, with ``Range`` and ``If-Range``; a
    server that answers with the whole object instead (it changed, or ignores ranges), or an
    object with no strong validator, starts the body again from zero.

    Raises:
        SourceNotFound: HTTP 404 or 410.
        SourcePermissionError: HTTP 401 or 403, or a redirect to another scheme.
        SourceTimeout: The last try timed out.
        SourceError: Any other failure, including a Content-Length or Content-Range that is
            malformed or does not match the request; the message names the redacted URL,
            the status and the number of attempts.
    """
    what = Operation("GET", url)
    partial = _Partial()

    def retrying(session: aiohttp.ClientSession) -> Awaitable[bytes]:
        return with_retries(lambda: _fetch_once(session, url, what, retry, timeout, partial),
                            what=what, retry=retry, timeout=timeout)

    scope = current_scope()
    if scope is None:  # outside a run: a session of its own, closed on return
        async with new_session() as session:
            return await retrying(session)
    return await retrying(await _scope_session(scope))  # no context manager per request


_LEFT_BEHIND: weakref.WeakKeyDictionary[aiohttp.ClientSession, dict[tuple[str, int], Resume]] = (
    weakref.WeakKeyDictionary()
)
_MAX_LEFT_BEHIND = 1024


def _leave(session: aiohttp.ClientSession, url: str, offset: int, resume: Resume) -> None:
    left = _LEFT_BEHIND.setdefault(session, {})
    left[(url, offset)] = resume
    if len(left) > _MAX_LEFT_BEHIND:
        del left[next(iter(left))]


def _cannot_resume(resume: Resume) -> str:
    if resume.encoded:
        return "its body was content-encoded"
    return "no strong ETag or Last-Modified proves the object unchanged"


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    offset: int,
    *,
    what: object,
    retry: Retry,
    timeout: Timeout,
    resume: Resume | None = None,
) -> AsyncGenerator[bytes, None]:
    """One try at the body of ``url`` from byte ``offset`` on, in chunks.

    Args:
        resume: What proves that a resumed try continues the object the first try began
            (one :class:`Resume` per read, given to every try). Without one, a try at
            ``offset > 0`` uses what the try that broke at ``offset`` on the same session
            and URL left behind.

    Raises:
        Transient: A failure worth resuming from where it stopped.
        SourceError: The object changed since the read began, or cannot be proven unchanged
            (no strong validator, or a content-encoded body), so the bytes already yielded
            cannot be continued; or the server answered another range than asked for.
    """
    own = resume is None
    if resume is None:
        left = _LEFT_BEHIND.get(session, {})
        resume = (left.pop((url, offset), None) if offset else None) or Resume()
    delivered = 0
    try:
        if offset and resume.if_range() is None:
            raise SourceError(f"{what}: cannot resume at byte {offset}: {_cannot_resume(resume)}")
        resp, start, expected = await _open(session, url, offset, resume, what, retry, timeout)
        try:
            if not offset:
                resume.learn(resp, expected)
            elif start == 0 and not resume.same(resp, expected):
                raise _Changed(f"{what}: the object changed after {offset} bytes were read; "
                               "cannot resume")
            skip = offset - start  # a server that ignores ranges sends the same object whole
            async with aclosing(_body(resp, expected, what, timeout)) as body:
                async for chunk in body:
                    if skip:
                        cut = min(skip, len(chunk))
                        skip -= cut
                        chunk = chunk[cut:]
                        if not chunk:
                            continue
                    delivered += len(chunk)
                    yield chunk
        finally:
            resp.release()
    except Transient:
        if own and offset + delivered:
            _leave(session, url, offset + delivered, resume)
        raise
