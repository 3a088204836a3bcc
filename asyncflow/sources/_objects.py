"""What every transport shares and none owns: a listed object, and a URL's scheme.

Kept apart from :mod:`._transport`, which picks a transport (and so imports every one of
them), so that the transports themselves and the manifest reader import only this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._redact import redact_url

__all__ = ["DEFAULT_SCHEMES", "ObjectInfo", "scheme_of"]

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


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url``; ``"file"`` for a plain path."""
    sep = url.find("://")
    if sep > 0 and (head := url[:sep]) in DEFAULT_SCHEMES:  # the common case, no regex
        return head
    match = _SCHEME.match(url)
    if match is None or ("://" not in url and match.group(1).lower() != "file"):
        return "file"
    return match.group(1).lower()
