"""``image._png.check``: a PNG proved whole, chunk by chunk, before PIL decodes it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from asyncflow import DecodeError
from asyncflow.image import _png


def good_png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.arange(40 * 30 * 3, dtype=np.uint8).reshape(30, 40, 3)).save(buf, "PNG")
    return buf.getvalue()


def test_a_whole_png_passes() -> None:
    _png.check(good_png(), "ok.png")
    _png.check(memoryview(good_png()), "ok.png")


def test_a_flipped_bit_in_the_image_data_names_the_file_and_chunk() -> None:
    data = bytearray(good_png())
    at = data.index(b"IDAT") + 8  # inside the chunk's data
    data[at] ^= 0x01
    why = r"cannot decode cat\.png: bad PNG checksum in chunk b'IDAT'"
    with pytest.raises(DecodeError, match=why):
        _png.check(bytes(data), "cat.png")


@pytest.mark.parametrize(("cut", "why"), [
    (lambda d: d[: d.index(b"IDAT") + 20], "truncated PNG chunk"),
    (lambda d: d[: d.index(b"IEND") - 4], r"truncated PNG \(no IEND chunk\)"),
    (lambda d: b"\x89PNX" + d[4:], "not a PNG signature"),
])
def test_cut_or_foreign_bytes_are_refused(cut: object, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        _png.check(cut(good_png()), "cut.png")  # type: ignore[operator]
