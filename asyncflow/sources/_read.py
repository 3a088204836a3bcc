"""``read_bytes``: one call for local paths, ``file://``, ``http(s)://`` and ``s3://``.

Only enabled schemes are read: ``schemes=`` on the call, else the running pipeline's
``schemes`` setting, else all of :data:`DEFAULT_SCHEMES`.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError, SourceError, SourcePermissionError
from .._scope import RunScope, current_scope, use_scope
from ._redact import redact_url
from ._retry import Retry, Timeout, resolve_policy

__all__ = ["DEFAULT_SCHEMES", "ObjectInfo", "read_bytes", "session"]

DEFAULT_SCHEMES = frozenset({"file", "http", "https", "s3"})
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: what ``list_objects(..., detail=True)`` yields.

    ``read_bytes`` accepts it in place of its URL.

    Attributes:
        url: The object's full URL (``"s3://bucket/key"``), or its path for a local file.
        size: Its size in bytes, when the listing says.
        etag: The store's entity tag, when the listing says.
    """

    url: str
    size: int | None = None
    etag: str | None = None

    def __repr__(self) -> str:
        return f"ObjectInfo(url={redact_url(self.url)!r}, size={self.size!r}, etag={self.etag!r})"


def as_url(item: object) -> str:
    """The URL or path string of ``item`` (a ``str``, a path, or an :class:`ObjectInfo`)."""
    if isinstance(item, ObjectInfo):
        return item.url
    if isinstance(item, str):
        return item
    if isinstance(item, os.PathLike):
        path = os.fspath(item)
        return path if isinstance(path, str) else os.fsdecode(path)
    raise ConfigError(f"expected a URL, a path or an ObjectInfo, got {type(item).__name__}")


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url``; ``"file"`` for a plain path."""
    sep = url.find("://")
    if sep > 0 and (head := url[:sep]) in DEFAULT_SCHEMES:  # the common case, no regex
        return head
    match = _SCHEME.match(url)
    if match is None or ("://" not in url and match.group(1).lower() != "file"):
        return "file"
    return match.group(1).lower()


def _enabled(schemes: Iterable[str] | None) -> frozenset[str]:
    if schemes is None:
        scope = current_scope()
        schemes = scope.settings.get("schemes") if scope is not None else None
    if schemes is None:
        return DEFAULT_SCHEMES
    if isinstance(schemes, str):
        raise ConfigError(f"schemes must be a collection of names, got the string {schemes!r}")
    enabled = frozenset(s.lower() for s in schemes)
    unknown = enabled - DEFAULT_SCHEMES
    if unknown:
        raise ConfigError(
            f"unsupported schemes {sorted(unknown)}; supported: {sorted(DEFAULT_SCHEMES)}"
        )
    return enabled


def check_scheme(url: str, schemes: Iterable[str] | None) -> str:
    """The scheme of ``url`` if it is enabled; refuses it otherwise.

    Raises:
        SourcePermissionError: The scheme is supported but not enabled.
        SourceError: The scheme is not one asyncflow reads.
    """
    scheme = scheme_of(url)
    enabled = _enabled(schemes)
    if scheme not in DEFAULT_SCHEMES:
        raise SourceError(f"{redact_url(url)}: unsupported scheme {scheme!r}")
    if scheme not in enabled:
        raise SourcePermissionError(
            f"{redact_url(url)}: scheme {scheme!r} is not enabled "
            f"(enabled: {', '.join(sorted(enabled))})"
        )
    return scheme


async def read_bytes(
    url: str | os.PathLike[str] | ObjectInfo,
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    endpoint_url: str | None = None,
) -> bytes:
    """The whole content of a local file, an HTTP(S) resource or an S3 object.

    Inside a pipeline run, every call shares one aiohttp session and one S3 client, closed
    when the run stops. Outside a run, each call opens and closes its own, unless the calls
    sit inside ``async with asyncflow.sources.session():``.

    Args:
        url: A path, ``file://``, ``http://``, ``https://`` or ``s3://bucket/key`` URL, or an
            :class:`ObjectInfo` from :func:`list_objects`.
        retry: Retry policy; default: the pipeline's, else ``Retry()``.
        timeout: Deadlines; default: the pipeline's, else ``Timeout()``.
        schemes: The schemes that may be read; default: the pipeline's, else all.
        endpoint_url: An S3-compatible endpoint; default: the standard AWS configuration
            (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the config file).

    Returns:
        The complete body; a truncated one is never returned.

    Raises:
        SourceNotFound: No such file, object or URL (404), at once.
        SourcePermissionError: Access refused (401, 403), or the scheme is not enabled.
        SourceTimeout: The last try timed out, or ``timeout.total`` passed.
        SourceError: Anything else; the message names the URL (credentials and query values
            masked), the status and the number of attempts.

    Cancellation:
        Cancelling the caller cancels the request or back-off in progress; its connection is
        closed, not reused.
    """
    text = as_url(url)
    scheme = check_scheme(text, schemes)
    policy, deadlines = resolve_policy(retry, timeout)
    if scheme == "file":
        from ._files import file_path, read_file

        return await read_file(file_path(text))
    if scheme == "s3":
        from . import _s3

        return await _s3.fetch(text, retry=policy, timeout=deadlines, endpoint_url=endpoint_url)
    from . import _http

    return await _http.fetch(text, retry=policy, timeout=deadlines)


@asynccontextmanager
async def session(
    *,
    retry: Retry | None = None,
    timeout: Timeout | None = None,
    schemes: Iterable[str] | None = None,
    connections: int | None = None,
) -> AsyncIterator[RunScope]:
    """Share one HTTP session and one S3 client among the calls inside the block.

    Outside a pipeline, ``read_bytes`` otherwise opens a connection pool per call. The
    pool is closed when the block ends, whatever way it ends::

        async with asyncflow.sources.session(retry=Retry(attempts=3)):
            blobs = await asyncio.gather(*(asyncflow.read_bytes(u) for u in urls))

    Args:
        retry: Default retry policy for the calls inside.
        timeout: Default deadlines for the calls inside.
        schemes: The schemes that may be read inside.
        connections: Most HTTP connections open at once (default 256); more requests wait.
    """
    if connections is not None and (isinstance(connections, bool) or connections < 1):
        raise ConfigError(f"connections must be >= 1, got {connections!r}")
    settings: dict[str, Any] = {
        "retry": retry, "timeout": timeout, "schemes": schemes, "connections": connections,
    }
    resolve_policy(retry, timeout)  # fail on a bad policy now, not on the first read
    if schemes is not None:
        _enabled(schemes)
    scope = RunScope({k: v for k, v in settings.items() if v is not None})
    try:
        with use_scope(scope):
            yield scope
    finally:
        await scope.aclose()
