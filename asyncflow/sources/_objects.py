"""What every transport shares and none owns: a listed object, a URL's scheme, and the
clients a run (or ``sources.session()``) shares: :func:`shared` and :func:`connections`.

Kept apart from :mod:`._transport`, which picks a transport (and so imports every one of
them), so that the transports themselves and the manifest reader import only this.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from .._redact import redact_url
from .._scope import current_scope

__all__ = ["DEFAULT_CONNECTIONS", "DEFAULT_SCHEMES", "ObjectInfo", "connections", "scheme_of",
           "shared"]

T = TypeVar("T")

DEFAULT_SCHEMES = frozenset({"file", "http", "https", "s3"})
DEFAULT_CONNECTIONS = 256
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


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url``; ``"file"`` for a plain path."""
    sep = url.find("://")
    if sep > 0 and (head := url[:sep]) in DEFAULT_SCHEMES:  # the common case, no regex
        return head
    match = _SCHEME.match(url)
    if match is None or ("://" not in url and match.group(1).lower() != "file"):
        return "file"
    return match.group(1).lower()


def connections() -> int:
    """The most connections a shared client opens at once, which is also each host's
    ceiling: the run's (or session's) ``connections`` setting, else
    :data:`DEFAULT_CONNECTIONS`."""
    scope = current_scope()
    found = scope.settings.get("connections") if scope is not None else None
    return found or DEFAULT_CONNECTIONS


@asynccontextmanager
async def shared(key: str, make: Callable[[], AbstractAsyncContextManager[T]]) -> AsyncIterator[T]:
    """The running pipeline's (or session's) client ``make()``, entered on first use and
    kept under ``key`` until the run stops; outside any, a private one for the block.

    Cancellation:
        As ``RunScope.get`` while the client is made; a private client is closed on exit.
    """
    scope = current_scope()
    if scope is not None:
        yield await scope.get(key, make)
        return
    async with make() as client:
        yield client
