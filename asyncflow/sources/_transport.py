"""One transport per URL scheme, and the one place that picks it for a URL.

Every reader goes through :func:`transport_for`: ``read_bytes`` (:meth:`Transport.fetch`),
``tar_samples`` / ``tar_members`` (:meth:`Transport.stream`) and ``list_objects``
(:meth:`Transport.list`). It refuses a scheme that is not enabled (``schemes=`` on the
call, else the running pipeline's ``schemes`` setting, else all of :data:`DEFAULT_SCHEMES`)
or not supported, the same way for all of them.

======  ==========================  ============================================
scheme  transport                   what ``list`` reads
======  ==========================  ============================================
file    ``_files.FileTransport``    a folder (recursively), a prefix, a manifest
http    ``_http.HttpTransport``     a manifest of URLs
https   ``_http.HttpTransport``     a manifest of URLs
s3      ``_s3.S3Transport``         every key under a prefix, page by page
======  ==========================  ============================================

Transport modules load on first use, so that importing ``asyncflow.sources`` imports
neither aiohttp nor aiobotocore.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Protocol

from .._errors import ConfigError, SourceError, SourcePermissionError
from .._redact import redact_url
from .._scope import current_scope
from ._objects import DEFAULT_SCHEMES, ObjectInfo, scheme_of
from ._retry import Retry, Timeout

__all__ = [
    "DEFAULT_SCHEMES",
    "ObjectInfo",
    "Transport",
    "as_url",
    "enabled_schemes",
    "scheme_of",
    "transport_for",
]


class Transport(Protocol):
    """How one URL scheme is read. Policies arrive resolved; errors are asyncflow's own.

    A remote transport retries through :func:`~._tries.with_retries` (the one retry loop);
    the local one never retries.
    """

    async def fetch(self, url: str, *, retry: Retry, timeout: Timeout) -> bytes:
        """The whole object; a truncated body is never returned."""
        ...

    def stream(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[bytes, None]:
        """The object's bytes in chunks, in order; a broken try resumes where it stopped."""
        ...

    def list(
        self, url: str, *, retry: Retry, timeout: Timeout
    ) -> AsyncGenerator[ObjectInfo, None]:
        """Every object under ``url`` (a prefix, a folder or a manifest)."""
        ...


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


def enabled_schemes(schemes: Iterable[str] | None) -> frozenset[str]:
    """The schemes that may be read: ``schemes``, else the running pipeline's, else all."""
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


# Transports hold no state of their own (sessions and clients live in the run's scope), so
# each is made once (per S3 endpoint), not once per read.
@functools.cache
def _file() -> Transport:
    from ._files import FileTransport

    return FileTransport()


@functools.cache
def _http() -> Transport:
    from ._http import HttpTransport

    return HttpTransport()


@functools.lru_cache(maxsize=64)
def _s3(endpoint_url: str | None) -> Transport:
    from ._s3 import S3Transport

    return S3Transport(endpoint_url)


#: Each supported scheme's transport, made for an S3 ``endpoint_url`` (ignored by the others).
TRANSPORTS: dict[str, Callable[[str | None], Transport]] = {
    "file": lambda endpoint_url: _file(),
    "http": lambda endpoint_url: _http(),
    "https": lambda endpoint_url: _http(),
    "s3": _s3,
}


def transport_for(
    url: str, schemes: Iterable[str] | None = None, endpoint_url: str | None = None
) -> Transport:
    """The transport that reads ``url``, if its scheme is enabled.

    Args:
        url: A path, or a ``file://``, ``http(s)://`` or ``s3://`` URL.
        schemes: The schemes that may be read; default: the pipeline's, else all.
        endpoint_url: An S3-compatible endpoint, for ``s3://`` URLs.

    Raises:
        SourcePermissionError: The scheme is supported but not enabled.
        SourceError: The scheme is not one asyncflow reads.
    """
    scheme = scheme_of(url)
    enabled = enabled_schemes(schemes)
    if scheme not in DEFAULT_SCHEMES:
        raise SourceError(f"{redact_url(url)}: unsupported scheme {scheme!r}")
    if scheme not in enabled:
        raise SourcePermissionError(
            f"{redact_url(url)}: scheme {scheme!r} is not enabled "
            f"(enabled: {', '.join(sorted(enabled))})"
        )
    return TRANSPORTS[scheme](endpoint_url)
