"""HTTP bodies: Content-Length checked, gzip and deflate decoded, read whole or not at all.

A server may encode a body although asked not to; aiohttp's own decoder does not notice a
gzip stream cut short, so bodies are decoded here, and must reach the end of their stream.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from .._errors import SourceError
from ._http_session import translate
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


def _decoder(resp: aiohttp.ClientResponse, what: object) -> _Decoder | None:
    name = coding(resp)
    if name == "identity":
        return None
    if name in ("gzip", "x-gzip", "deflate"):
        return _Decoder(name)
    raise SourceError(f"{what}: unsupported Content-Encoding {name[:40]!r}")


async def body(
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
        raise translate(exc, what, timeout) from None
    if expected is not None and got != expected:
        raise Transient(f"body truncated: got {got} of {expected} bytes")
    if decoder is not None:
        decoder.finish()
