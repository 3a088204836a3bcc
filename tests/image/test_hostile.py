"""Hostile and odd input to image.decode and image.folder: each case named or decoded right.

Cases held elsewhere are not repeated here: cut JPEGs and the marker walk (test_jpeg.py),
PNG checksums, short image data and bombs (test_png.py), empty, text and bomb files, modes
and EXIF orientations (test_decode.py), device files, FIFOs, link loops and empty class
folders (test_folder.py).
"""

from __future__ import annotations

import io
import os
import re
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from asyncflow import image

from ._pictures import encode, jpeg, smooth, with_orientation, write_tree

# -- image.decode ---------------------------------------------------------------------------

_COLOUR = (10, 200, 30)


@pytest.mark.parametrize("width,height", [(1, 1), (1, 500), (500, 1), (3, 2)])
def test_tiny_pictures_and_strips_crop_to_their_own_colour(width: int, height: int) -> None:
    """Training and evaluation crops of a picture smaller than the output, or one pixel
    wide: every output pixel is the picture's colour, never padding or garbage."""
    data = encode(Image.new("RGB", (width, height), _COLOUR), "PNG")
    for seed in range(20):
        out = image.decode(data, size=32, train=True, seed=seed, index=seed)
        assert out.shape == (32, 32, 3) and (out == _COLOUR).all(), seed
    assert (image.decode(data, size=(24, 40)) == _COLOUR).all()
    assert (image.decode(data, size=32, resize=36) == _COLOUR).all()


def test_an_animated_gif_decodes_to_its_first_frame() -> None:
    frames = [Image.new("RGB", (40, 30), c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(data)).n_frames == 3
    assert (image.decode(data) == (255, 0, 0)).all()


def test_bytes_after_the_end_of_image_marker_are_ignored() -> None:
    """Trailing bytes (a second file, padding, junk) do not damage a whole picture."""
    whole = jpeg(64, 48)
    for tail in (os.urandom(5000), b"\0" * 5000, whole):
        np.testing.assert_array_equal(image.decode(whole + tail), image.decode(whole))


def test_a_png_named_jpg_is_decoded_by_its_content(tmp_path: Path) -> None:
    pixels = smooth(40, 30)
    (tmp_path / "really.jpg").write_bytes(encode(Image.fromarray(pixels), "PNG"))
    np.testing.assert_array_equal(image.decode(tmp_path / "really.jpg"), pixels)


@pytest.mark.parametrize("damage", [b"\xff" * 20, b"MM\0\x2a\xff\xff\xff\xff", b"II*\0\x08\0"])
def test_a_damaged_exif_block_leaves_the_picture_as_stored(damage: bytes) -> None:
    """The orientation cannot be read, so none is applied. (PIL's open warns "Corrupt EXIF
    data" for some damage; where warnings are errors, as in this suite, that warning is the
    DecodeError's reason, so the decodes here ignore it.)"""
    data = with_orientation(Image.fromarray(smooth(96, 64)), 6)
    at = data.index(b"Exif\0\0") + 6
    broken = data[:at] + damage + data[at + len(damage):]
    stored = image.decode(data[:2] + data[data.index(b"\xff\xdb"):])  # no EXIF at all
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Corrupt EXIF data", UserWarning)
        np.testing.assert_array_equal(image.decode(broken), stored)
        box = image.augmentation(broken, size=16).box
    assert stored.shape == (96, 64, 3)  # stored turned: orientation 6 would stand it up
    assert box == (0.0, 16.0, 64.0, 80.0)


def test_a_ycck_jpeg_matches_pil() -> None:
    """A four-channel JPEG whose Adobe marker says YCCK (transform 2), as Photoshop writes."""
    data = bytearray(encode(Image.fromarray(smooth(64, 48)).convert("CMYK"), "JPEG",
                            quality=95))
    at = data.index(b"Adobe")
    data[at + 11] = 2
    with Image.open(io.BytesIO(bytes(data))) as im:
        want = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    np.testing.assert_array_equal(image.decode(bytes(data)), want)
    assert image.decode(bytes(data), size=12).shape == (12, 12, 3)  # drafted


# -- image.folder ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_odd_names_and_vanished_files_are_named_and_counted(
    tmp_path: Path, leak_check: None, workers: str
) -> None:
    """A broken link, a file deleted between the listing and its read, and a PNG whose
    rows stop short are named failures; a non-UTF-8 name, a unicode name and a PNG named
    ``.jpg`` decode."""
    root = tmp_path / "train"
    write_tree(root, {"cat": 3, "dog": 3}, size=(40, 30))
    os.symlink(root / "nowhere.jpg", root / "cat" / "broken.jpg")
    with open(os.path.join(os.fsencode(root / "cat"), b"\xff\xfe latin.jpg"), "wb") as f:
        f.write(jpeg(40, 30, seed=7))
    (root / "dog" / "Ünïcødé 日本 😀.jpg").write_bytes(jpeg(40, 30, seed=8))
    (root / "dog" / "png.jpg").write_bytes(encode(Image.fromarray(smooth(40, 30)), "PNG"))
    short = bytearray(encode(Image.fromarray(smooth(40, 60)), "PNG"))
    short[16:24] = (40).to_bytes(4, "big") + (61).to_bytes(4, "big")  # one row too many
    ihdr_crc = zlib.crc32(bytes(short[12:29])).to_bytes(4, "big")
    short[29:33] = ihdr_crc
    (root / "dog" / "short.png").write_bytes(bytes(short))
    pipe = image.folder(root, batch_size=4, size=16, max_failures=3, workers=workers,
                        decode="cpu")
    (root / "cat" / "001.jpg").unlink()
    count = sum(len(labels) for _, labels in pipe)
    assert count == 11 - 3  # 6 + 3 good odd ones listed, 2 bad ones, 1 deleted
    failures = {Path(re.findall(r"[^'\"]+\.(?:jpg|png)", f.item)[-1]).name: f
                for f in pipe.stats().failures}
    assert sorted(failures) == ["001.jpg", "broken.jpg", "short.png"]
    assert failures["broken.jpg"].error_type == "SourceNotFound"
    assert failures["001.jpg"].error_type == "SourceNotFound"
    assert failures["short.png"].error_type == "DecodeError"
    assert "its image data ends early" in failures["short.png"].message
