"""HTTP bodies: Content-Length checked, gzip and deflate decoded, read whole or not at all.

A server may encode a body although asked not to; aiohttp's own decoder does not notice a
gzip stream cut short, so bodies are decoded here (:mod:`._inflate`), and must reach the end
of their stream.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator

import aiohttp

from .._errors import SourceError
from ._http_session import translate
from ._inflate import Inflater
from ._retry import Timeout, Transient

__all__ = ["MAX_CONTENT_LENGTH", "body", "coding", "content_length"]

_CHUNK = 256 * 1024
MAX_CONTENT_LENGTH = 1 << 48  # far above any real object (S3's limit is 5 TiB)
_DIGITS = re.compile(r"[0-9]{1,20}")


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
            while data := inflater.pull():
                yield data
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise translate(exc, what, timeout) from None
    if expected is not None and got != expected:
        raise Transient(f"body truncated: got {got} of {expected} bytes")
    if inflater is not None and inflater.cut:
        raise Transient(f"{inflater.coding} body ends before the end of its stream")
