"""A PNG proved whole: every chunk's CRC checked, up to its ``IEND``.

PIL checks the CRCs of the small chunks but not of the image data, and decodes a PNG cut short
to a picture with its last rows missing; the decode kernel checks the bytes first.
"""

from __future__ import annotations

import zlib

from .._errors import DecodeError

__all__ = ["SIGNATURE", "check"]

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check(data: bytes | memoryview, label: str) -> None:
    """Verify every chunk's CRC: PIL checks the small chunks but not the image data."""
    view = memoryview(data)
    if bytes(view[:8]) != SIGNATURE:
        raise DecodeError(f"cannot decode {label}: not a PNG signature")
    pos, end = 8, len(view)
    while pos + 12 <= end:
        length = int.from_bytes(view[pos : pos + 4], "big")
        stop = pos + 8 + length
        if stop + 4 > end:
            raise DecodeError(f"cannot decode {label}: truncated PNG chunk")
        ctype = bytes(view[pos + 4 : pos + 8])
        if zlib.crc32(view[pos + 4 : stop]) != int.from_bytes(view[stop : stop + 4], "big"):
            raise DecodeError(f"cannot decode {label}: bad PNG checksum in chunk {ctype!r}")
        if ctype == b"IEND":
            return
        pos = stop + 4
    raise DecodeError(f"cannot decode {label}: truncated PNG (no IEND chunk)")
