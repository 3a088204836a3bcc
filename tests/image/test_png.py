"""``image._png.check``: a PNG proved whole, chunk by chunk, before PIL decodes it."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from asyncflow import DecodeError, image
from asyncflow.image import _png

from ._pictures import encode, png_bomb


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


# -- a zlib stream that ends, properly closed, before the last row ---------------------------

_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))


def _chunk(ctype: bytes, body: bytes) -> bytes:
    return (len(body).to_bytes(4, "big") + ctype + body
            + zlib.crc32(ctype + body).to_bytes(4, "big"))


def _rows_png(arr: np.ndarray, colour: int, depth: int, *, interlace: bool = False,
         keep: float = 1.0) -> bytes:
    """A PNG of ``arr`` (rows of samples), with all its chunks whole, whose image data holds
    only the first ``keep`` of its rows (of each Adam7 pass when ``interlace``)."""
    height, width = arr.shape[:2]

    def packed(rows: np.ndarray) -> list[bytes]:
        if depth == 1:
            return [np.packbits(r.reshape(-1)).tobytes() for r in rows]
        dtype = ">u2" if depth == 16 else np.uint8
        return [r.astype(dtype).tobytes() for r in rows]

    passes = [arr] if not interlace else [arr[y0::dy, x0::dx] for x0, y0, dx, dy in _ADAM7]
    raw = b""
    for part in passes:
        if part.size:
            rows = packed(part)
            raw += b"".join(b"\0" + r for r in rows[: max(1, int(len(rows) * keep))])
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes(
        [depth, colour, 0, 0, int(interlace)])
    plte = _chunk(b"PLTE", bytes(range(256)) * 3) if colour == 3 else b""
    return (_png.SIGNATURE + _chunk(b"IHDR", ihdr) + plte + _chunk(b"IDAT", zlib.compress(raw))
            + _chunk(b"IEND", b""))


_RNG = np.random.default_rng(0)
_KINDS = {
    "rgb": (_RNG.integers(1, 256, (30, 41, 3)), 2, 8, False),
    "rgb, interlaced": (_RNG.integers(1, 256, (30, 41, 3)), 2, 8, True),
    "rgb, interlaced, odd height": (_RNG.integers(1, 256, (29, 41, 3)), 2, 8, True),
    "grey 16-bit": (_RNG.integers(1, 65536, (30, 41)), 0, 16, False),
    "palette": (_RNG.integers(1, 256, (30, 41)), 3, 8, False),
    "one bit": (_RNG.integers(0, 2, (30, 41)), 0, 1, False),
    "rgba, interlaced": (_RNG.integers(1, 256, (30, 41, 4)), 6, 8, True),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_image_data_that_ends_before_the_last_row_is_refused(kind: str, keep: float) -> None:
    arr, colour, depth, interlace = _KINDS[kind]
    data = _rows_png(arr, colour, depth, interlace=interlace, keep=keep)
    _png.check(data, "short.png")  # every chunk is whole: only the rows are missing
    with pytest.raises(DecodeError, match=r"cannot decode short\.png: damaged PNG: its image "
                                          r"data ends early"):
        image.decode(data, name="short.png")
    with pytest.raises(DecodeError, match=r"short\.png"):
        image.decode(data, name="short.png", size=16, train=True, seed=0)


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_whole_png_with_blank_last_rows_is_decoded_as_pil_does(kind: str) -> None:
    """Blank last rows are what a cut stream leaves, so they send a whole file to the slow
    check: it must measure every kind of row exactly, or whole pictures would be refused."""
    arr, colour, depth, interlace = _KINDS[kind]
    arr = arr.copy()
    arr[-2:] = 0
    data = _rows_png(arr, colour, depth, interlace=interlace)
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        _png.check_rows(im, data, "blank.png")
    assert image.decode(data, name="blank.png").shape == (*arr.shape[:2], 3)


# -- a header claiming more rows than the data can hold --------------------------------------


def test_a_header_claiming_more_rows_than_its_data_can_hold_is_refused_before_decoding() -> None:
    """9000x9000 grey pixels over 26 bytes of data: refused from the chunk walk, which runs
    before PIL allocates the picture (81 MB here, 324 MB for RGB)."""
    why = r"cannot decode bomb\.png: damaged PNG: its header claims 81,009,000 bytes of rows, "
    with pytest.raises(DecodeError, match=why + r".*decompression bomb"):
        _png.check(png_bomb(9000, 9000), "bomb.png")
    with pytest.raises(DecodeError, match=why):
        image.decode(png_bomb(9000, 9000), name="bomb.png", size=32)


@pytest.mark.parametrize("mode", ["1", "L", "RGB", "RGBA"])
def test_the_most_compressible_whole_pngs_pass(mode: str) -> None:
    """A blank picture at zlib's best, 1030 bytes of rows a byte of data, is whole."""
    data = encode(Image.new(mode, (3000, 2000)), "PNG", compress_level=9)
    _png.check(data, "blank.png")
    assert image.decode(data, size=8).shape == (8, 8, 3)
