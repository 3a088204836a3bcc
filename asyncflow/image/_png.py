"""A PNG proved whole: every chunk's CRC checked, up to its ``IEND``; every row decoded.

PIL checks the CRCs of the small chunks but not of the image data, and decodes a PNG cut short
to a picture with its last rows missing; the decode kernel checks the bytes first
(:func:`check`). A PNG whose chunks are whole can still hold a zlib stream that ends, properly
closed, before the last row: PIL's decoder stops there without an error and leaves the rest of
the picture black. :func:`check_rows` catches that after the decode: PIL's rows start zeroed, so
such a picture has a blank row at its end (the last row, or the one above it for an interlaced
file, whose last pass fills the odd rows); only then is the image data inflated again and
measured against the header.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from PIL import Image

from .._errors import DecodeError

__all__ = ["SIGNATURE", "check", "check_rows"]

SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: Samples a pixel for each PNG colour type (grey, RGB, palette, grey+alpha, RGBA).
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
#: Adam7's passes: (first column, first row, column step, row step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))
#: Deflate's largest expansion, 1032 bytes out per byte in (zlib's FAQ; zlib itself reaches
#: 1030 on a blank picture), and room for the stream's headers and first literals.
_MAX_RATIO, _SLACK = 1032, 1 << 16


def check(data: bytes | memoryview, label: str) -> None:
    """Verify every chunk's CRC (PIL checks the small chunks but not the image data), and
    that the image data is large enough to hold the rows the header claims.

    Deflate inflates a byte to at most 1032 (a 258-byte match coded in two bits), so a header
    claiming more rows than that can hold is refused here, before PIL allocates the picture:
    a few kilobytes that claim 9000x9000 pixels would otherwise cost up to 324 MB a decoder.
    """
    if bytes(memoryview(data)[:8]) != SIGNATURE:
        raise DecodeError(f"cannot decode {label}: not a PNG signature")
    idat = sum(len(body) for ctype, body in _chunks(data, label) if ctype == b"IDAT")
    want = _expected_size(data)
    if want > _MAX_RATIO * idat + _SLACK:
        raise DecodeError(
            f"cannot decode {label}: damaged PNG: its header claims {want:,} bytes of rows, "
            f"more than its {idat:,} bytes of image data can hold (a decompression bomb?)"
        )


def check_rows(im: Image.Image, data: bytes | memoryview, label: str) -> None:
    """Refuse a decoded PNG whose image data ends before its last row.

    ``im`` is the loaded picture of ``data`` (already through :func:`check`). On a whole
    picture this costs a look at its last two rows; the data is inflated again only when one
    of them is blank (all zero bytes).
    """
    height = im.size[1]
    if height == 0 or not any(_blank(im, y) for y in range(max(0, height - 2), height)):
        return
    want, got = _expected_size(data), _inflated_size(data, label)
    if got < want:
        raise DecodeError(
            f"cannot decode {label}: damaged PNG: its image data ends early ({got:,} of "
            f"{want:,} bytes; the header claims more rows than the data holds)"
        )


def _blank(im: Image.Image, y: int) -> bool:
    row = im.crop((0, y, im.size[0], y + 1)).tobytes()
    return row.count(0) == len(row)


def _chunks(data: bytes | memoryview, label: str) -> Iterator[tuple[bytes, memoryview]]:
    """Each chunk's type and body, up to and with its ``IEND``, its CRC checked first."""
    view, pos = memoryview(data), 8
    while pos + 12 <= len(view):
        length = int.from_bytes(view[pos : pos + 4], "big")
        stop = pos + 8 + length
        if stop + 4 > len(view):
            raise DecodeError(f"cannot decode {label}: truncated PNG chunk")
        ctype = bytes(view[pos + 4 : pos + 8])
        if zlib.crc32(view[pos + 4 : stop]) != int.from_bytes(view[stop : stop + 4], "big"):
            raise DecodeError(f"cannot decode {label}: bad PNG checksum in chunk {ctype!r}")
        yield ctype, view[pos + 8 : stop]
        if ctype == b"IEND":
            return
        pos = stop + 4
    raise DecodeError(f"cannot decode {label}: truncated PNG (no IEND chunk)")


def _expected_size(data: bytes | memoryview) -> int:
    """Bytes the header's rows inflate to: each row a filter byte and its packed samples."""
    ihdr = bytes(memoryview(data)[16:29])
    width, height = int.from_bytes(ihdr[0:4], "big"), int.from_bytes(ihdr[4:8], "big")
    bits = ihdr[8] * _CHANNELS.get(ihdr[9], 1)
    total = 0
    # Adam7's seven passes, or, not interlaced, one pass over every pixel.
    for x0, y0, dx, dy in _ADAM7 if ihdr[12] else ((0, 0, 1, 1),):
        cols, rows = max(0, -(-(width - x0) // dx)), max(0, -(-(height - y0) // dy))
        if cols and rows:
            total += rows * (1 + (cols * bits + 7) // 8)
    return total


def _inflated_size(data: bytes | memoryview, label: str) -> int:
    """How many bytes the ``IDAT`` chunks inflate to (read in pieces, never held whole)."""
    inflater, total = zlib.decompressobj(), 0
    for ctype, body in _chunks(data, label):
        if ctype != b"IDAT":
            continue
        pending = bytes(body)
        while pending and not inflater.eof:
            try:
                total += len(inflater.decompress(pending, 1 << 20))
            except zlib.error:
                return total
            pending = inflater.unconsumed_tail
    return total
