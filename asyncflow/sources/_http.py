"""The ``http`` and ``https`` transport: whole bodies, resumed streams and manifests.

The pieces: :mod:`._http_session` (the shared aiohttp session, requests, redirects, status
and error translation, bodies: Content-Length, decoding) and :mod:`._http_ranges` (one try
from a byte offset, proven to continue the same object). Retries go through
:func:`~._retry.with_retries`, the one retry loop.

A body comes back only whole and from one version of the object: a try resumed with
``Range`` carries ``If-Range`` with the strong ETag or Last-Modified date of the first
answer, and without one the body starts again from zero; a gzip or deflate body is decoded
and must reach the end of its stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable
from contextlib import aclosing

import aiohttp

from .._redact import Operation, redact_url
from ._http_ranges import Changed, Resume, open_from, stream
from ._http_session import body, http_session
from ._limiter import limiter_for
from ._manifest import remote_entries
from ._objects import ObjectInfo
from ._retry import Retry, Timeout, Transient, with_retries
from ._retry_stream import retry_stream

__all__ = ["HttpTransport", "host_of"]


class _Partial:
    """What the tries of one :meth:`HttpTransport.fetch` got so far, and what proves where
    it came from."""

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
        resp, start, expected = await open_from(
            session, url, partial.size, partial.resume, what, retry, timeout
        )
    except Changed as exc:
        partial.restart()
        partial.resume = Resume()  # the next try asks for the new object whole
        raise Transient(str(exc).removeprefix(f"{what}: ")) from None
    try:
        if start == 0:  # whole: the first answer, or the object could not be resumed
            partial.restart()
            partial.resume.learn(resp, expected)
        async with aclosing(body(resp, expected, what, timeout)) as chunks:
            async for chunk in chunks:
                partial.chunks.append(chunk)
                partial.size += len(chunk)
    finally:
        resp.release()
    return b"".join(partial.chunks)


class HttpTransport:
    """``http://`` and ``https://`` URLs, on the run's shared aiohttp session."""

    async def fetch(self, url: str, *, retry: Retry, timeout: Timeout) -> bytes:
        """GET ``url`` and return the whole body, retrying as ``retry`` says.

        Each try goes through the host's adaptive window (:mod:`._limiter`), and the first
        may be hedged (:mod:`._hedge`): the hedge is a whole request of its own, checked as
        any other. A try that breaks mid-body resumes where it stopped, with ``Range`` and
        ``If-Range``; a server that answers with the whole object instead (it changed, or
        ignores ranges), or an object with no strong validator, starts the body again from
        zero.

        Raises:
            SourceNotFound: HTTP 404 or 410.
            SourcePermissionError: HTTP 401 or 403, or a redirect to another scheme.
            SourceTimeout: The last try timed out.
            SourceError: Any other failure, including a Content-Length or Content-Range that
                is malformed or does not match the request; the message names the redacted
                URL, the status and the number of attempts.
        """
        what = Operation("GET", url)
        partial = _Partial()
        host = host_of(url)

        async with http_session() as session:
            gate = await limiter_for(host, host)

            def attempt() -> Awaitable[bytes]:
                return _fetch_once(session, url, what, retry, timeout, partial)

            def hedge() -> Awaitable[bytes]:
                # A whole request with its own record: it never shares (or splices) the bytes
                # of the try it races.
                return _fetch_once(session, url, what, retry, timeout, _Partial())

            return await with_retries(attempt, what=what, retry=retry, timeout=timeout,
                                      gate=gate, hedge=hedge)

    def stream(self, url: str, *, retry: Retry, timeout: Timeout) -> AsyncGenerator[bytes, None]:
        """The body in chunks; a broken try resumes at the byte where it stopped."""
        what = f"GET {redact_url(url)}"
        resume = Resume()  # one per read: every resumed try proves the same object

        def open_at(session: aiohttp.ClientSession, offset: int) -> AsyncGenerator[bytes, None]:
            return stream(session, url, offset, what=what, retry=retry, timeout=timeout,
                          resume=resume)

        return retry_stream(http_session(), open_at, what=what, retry=retry, timeout=timeout)

    async def list(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[ObjectInfo, None]:
        """The entries of the manifest at ``url``: one URL a line, relative ones resolved."""
        for entry in remote_entries(await self.fetch(url, retry=retry, timeout=timeout), url):
            yield entry


def host_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, without any user name or password."""
    scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return f"{scheme.lower()}{sep}{netloc.rpartition('@')[2].lower()}"
