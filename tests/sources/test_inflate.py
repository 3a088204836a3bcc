"""One inflater (``_inflate``) for tar shards and HTTP bodies: gzip members, deflate wrapped
or raw, bounded pulls, and whether the input stopped inside a stream."""

from __future__ import annotations

import gzip
import zlib

import pytest

from asyncflow import SourceError
from asyncflow.sources._inflate import Inflater

RAW = bytes(range(256)) * 200


def inflate_all(inflater: Inflater, data: bytes, limit: int = 1 << 20) -> bytes:
    inflater.push(data)
    out = b""
    while chunk := inflater.pull(limit):
        assert len(chunk) <= limit
        out += chunk
    return out


def test_gzip_members_one_after_another_then_zero_padding() -> None:
    data = gzip.compress(RAW[:10_000]) + gzip.compress(RAW[10_000:]) + bytes(1024)
    inflater = Inflater("s.tar.gz")
    assert inflate_all(inflater, data, limit=4096) == RAW and not inflater.cut


@pytest.mark.parametrize("wbits", [15, -15])
def test_deflate_wrapped_or_raw(wbits: int) -> None:
    packer = zlib.compressobj(wbits=wbits)
    data = packer.compress(RAW) + packer.flush()
    inflater = Inflater("GET http://h/a", "deflate")
    assert inflate_all(inflater, data) == RAW and not inflater.cut
    with pytest.raises(SourceError, match="data after the end of the deflate stream"):
        inflate_all(inflater, b"more")


@pytest.mark.parametrize("wbits", [15, -15])
def test_deflate_whose_first_chunk_is_one_byte(wbits: int) -> None:
    # The first two bytes tell zlib-wrapped from raw deflate: a body that arrived one byte
    # first was taken for raw, and a valid zlib stream was refused as corrupt.
    packer = zlib.compressobj(wbits=wbits)
    data = packer.compress(RAW) + packer.flush()
    inflater = Inflater("GET http://h/a", "deflate")
    assert inflate_all(inflater, data[:1]) == b"" and inflater.cut
    assert inflate_all(inflater, data[1:]) == RAW and not inflater.cut


def test_input_that_stops_inside_a_stream_is_cut() -> None:
    data = gzip.compress(RAW)
    inflater = Inflater("s.tar.gz")
    assert RAW.startswith(inflate_all(inflater, data[: len(data) // 2])) and inflater.cut
    assert not Inflater("empty").cut  # nothing began: an empty body is a whole one
    with pytest.raises(SourceError, match=r"s\.tar\.gz: corrupt gzip data near compressed byte"):
        inflate_all(Inflater("s.tar.gz"), data[:10] + b"\xff" * 64)
