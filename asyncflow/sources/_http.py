"""The ``http`` and ``https`` transport: whole bodies, resumed streams and manifests.

The pieces: :mod:`._http_session` (the shared aiohttp session, requests, redirects, status
and error translation, bodies: Content-Length, decoding) and :mod:`._http_ranges` (one try
from a byte offset, proven to continue the same object). Retries and resumes go through
:mod:`._tries`, as S3's do.

A body comes back only whole and from one version of the object: a try resumed with
``Range`` carries ``If-Range`` with the strong ETag or Last-Modified date of the first
answer, and without one the body starts again from zero; a gzip or deflate body is decoded
and must reach the end of its stream.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable

import aiohttp

from .._redact import Operation, redact_url
from ._http_ranges import Resume, stream
from ._http_session import http_session
from ._limiter import limiter_for
from ._manifest import remote_entries
from ._objects import ObjectInfo
from ._retry import Retry, Timeout
from ._tries import retry_stream, retry_whole

__all__ = ["HttpTransport", "host_of"]


def _tries(
    url: str, what: object, retry: Retry, timeout: Timeout, session: aiohttp.ClientSession
) -> Callable[[int], AsyncGenerator[bytes, None]]:
    """One read's tries on ``session``, each from a byte offset, all proving one object."""
    return functools.partial(stream, session, url, what=what, retry=retry, timeout=timeout,
                             resume=Resume())


class HttpTransport:
    """``http://`` and ``https://`` URLs, on the run's shared aiohttp session."""

    async def fetch(self, url: str, *, retry: Retry, timeout: Timeout) -> bytes:
        """GET ``url`` and return the whole body, retrying as ``retry`` says.

        Each try goes through the host's adaptive window (:mod:`._limiter`), and the first
        may be hedged (:mod:`._hedge`): the hedge is a whole request of its own, checked as
        any other. A try that breaks mid-body resumes where it stopped, with ``Range`` and
        ``If-Range``, as :meth:`stream` does (:func:`~._http_ranges.stream` is every try);
        where the object changed between tries, the next try reads it again from zero.

        Raises:
            SourceNotFound: HTTP 404 or 410.
            SourcePermissionError: HTTP 401 or 403, or a redirect to another scheme.
            SourceTimeout: The last try timed out.
            SourceError: Any other failure, including a Content-Length or Content-Range that
                is malformed or does not match the request; the message names the redacted
                URL, the status and the number of attempts.
        """
        what = Operation("GET", url)
        host = host_of(url)
        gate = await limiter_for(host, host)
        reader = functools.partial(_tries, url, what, retry, timeout)
        return await retry_whole(http_session(), reader, what=what, retry=retry,
                                 timeout=timeout, gate=gate)

    def stream(self, url: str, *, retry: Retry, timeout: Timeout) -> AsyncGenerator[bytes, None]:
        """The body in chunks; a broken try resumes at the byte where it stopped."""
        what = f"GET {redact_url(url)}"
        reader = functools.partial(_tries, url, what, retry, timeout)
        return retry_stream(http_session(), reader, what=what, retry=retry, timeout=timeout)

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
