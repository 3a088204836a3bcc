"""image.decode: sizes, modes, orientation, draft decoding, augmentation, and every bad input."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

from asyncflow import ConfigError, DecodeError, SourceError, SourceNotFound, image
from asyncflow._blob import Blob

from ._pictures import (
    PHOTOS,
    encode,
    jpeg,
    mad,
    png_bomb,
    png_with_bad_crc,
    progressive_jpeg,
    reference,
    smooth,
    with_frame_size,
    with_orientation,
)
from ._pictures import cut as cut_short

# -- shapes, dtypes, output buffers -------------------------------------------------------


def test_full_decode_is_rgb_uint8_hwc() -> None:
    arr = image.decode(jpeg(64, 48))
    assert arr.shape == (48, 64, 3) and arr.dtype == np.uint8


@pytest.mark.parametrize("size,shape", [(32, (32, 32)), ((24, 40), (24, 40))])
def test_size_gives_height_by_width(size: object, shape: tuple[int, int]) -> None:
    arr = image.decode(jpeg(120, 90), size=size)  # type: ignore[arg-type]
    assert arr.shape == (*shape, 3)
    chw = image.decode(jpeg(120, 90), size=size, layout="chw")  # type: ignore[arg-type]
    assert chw.shape == (3, *shape)
    np.testing.assert_array_equal(chw, arr.transpose(2, 0, 1))


def test_decodes_into_out_and_returns_it() -> None:
    out = np.zeros((3, 32, 32), np.uint8)
    got = image.decode(jpeg(100, 80), size=32, out=out, layout="chw")
    assert got is out and out.any()


def test_out_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ConfigError, match="shape"):
        image.decode(jpeg(100, 80), size=32, out=np.zeros((32, 32, 3), np.float32))


def test_path_and_bytes_agree(tmp_path: Path) -> None:
    data = jpeg(90, 60)
    (tmp_path / "a.jpg").write_bytes(data)
    np.testing.assert_array_equal(
        image.decode(tmp_path / "a.jpg", size=32), image.decode(data, size=32)
    )
    np.testing.assert_array_equal(
        image.decode(str(tmp_path / "a.jpg")), image.decode(bytearray(data))
    )


def test_normalize_matches_the_float_formula() -> None:
    data = jpeg(100, 80)
    u8 = image.decode(data, size=32, layout="chw").astype(np.float64)
    f32 = image.decode(data, size=32, layout="chw", normalize=True, mean=(0.5, 0.4, 0.3),
                       std=(0.2, 0.25, 0.3))
    assert f32.dtype == np.float32
    mean = np.array([0.5, 0.4, 0.3])[:, None, None]
    std = np.array([0.2, 0.25, 0.3])[:, None, None]
    np.testing.assert_allclose(f32, (u8 / 255 - mean) / std, atol=1e-5)
    hwc = image.decode(data, size=32, normalize=True, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    np.testing.assert_allclose(hwc, f32.transpose(1, 2, 0), atol=1e-6)


# -- matching a plain decode + resize + crop ------------------------------------------------


def _short_side(photo: Path) -> int:
    with Image.open(photo) as im:
        return min(im.size)


@pytest.mark.parametrize("photo", PHOTOS, ids=lambda p: p.name)
def test_photos_match_torchvision_geometry(photo: Path) -> None:
    """Photos decoded at full scale give the reference pixels (off by one at most)."""
    size = 224 if _short_side(photo) < 448 else _short_side(photo) // 2 + 1
    ours = image.decode(photo, size=size)
    ref = reference(photo, size)
    assert np.abs(ours.astype(int) - ref).max() <= 1
    assert mad(ours, ref) < 0.01


@pytest.mark.parametrize("photo", PHOTOS, ids=lambda p: p.name)
def test_draft_decoding_stays_close_to_a_full_decode(photo: Path) -> None:
    """At 96 px every photo is decoded at 1/2 or 1/4 scale in the DCT domain."""
    ours = image.decode(photo, size=96)
    assert mad(ours, reference(photo, 96)) < 2.0


def test_draft_kicks_in_only_from_2x() -> None:
    data = jpeg(600, 400, seed=3)
    full = reference(data, 224)
    assert mad(image.decode(data, size=224), full) < 0.01  # 400/224 < 2: full decode
    big = jpeg(1000, 800, seed=4)
    assert 0.0 < mad(image.decode(big, size=224), reference(big, 224)) < 2.0


def test_resize_then_centre_crop() -> None:
    data = jpeg(300, 200)
    ours = image.decode(data, size=100, resize=120)  # 200 / 120 < 2: no draft
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB").resize((180, 120), Image.Resampling.BILINEAR)
    ref = np.asarray(im.crop((40, 10, 140, 110)))
    assert mad(ours, ref) < 0.2  # stock Pillow's fixed-point resize differs a little more


# -- modes ------------------------------------------------------------------------------


def _solid(mode: str, value: object, size: tuple[int, int] = (40, 30)) -> Image.Image:
    return Image.new(mode, size, value)  # type: ignore[arg-type]


def test_grayscale_jpeg_is_spread_to_three_channels() -> None:
    data = encode(Image.fromarray(smooth(80, 60)[:, :, 0]), "JPEG")
    arr = image.decode(data, size=32)
    assert arr.shape == (32, 32, 3)
    assert (arr[..., 0] == arr[..., 1]).all() and (arr[..., 1] == arr[..., 2]).all()
    chw = image.decode(data, size=32, layout="chw")
    np.testing.assert_array_equal(chw, arr.transpose(2, 0, 1))


def test_cmyk_jpeg_becomes_rgb() -> None:
    data = encode(_solid("CMYK", (0, 255, 255, 0)), "JPEG", quality=95)  # pure red
    arr = image.decode(data, size=16)
    assert arr.shape == (16, 16, 3)
    assert np.abs(arr.astype(int) - [255, 0, 0]).max() <= 3


def test_sixteen_bit_png_keeps_its_range() -> None:
    arr16 = np.full((30, 40), 40000, np.uint16)
    data = encode(Image.fromarray(arr16), "PNG")
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode.startswith("I")
    arr = image.decode(data)
    assert arr.shape == (30, 40, 3)
    assert (arr == 40000 >> 8).all()


def test_sixteen_bit_rgb_png() -> None:
    raw = np.zeros((30, 40, 3), np.uint16)
    raw[...] = (65535, 32768, 0)
    # PIL cannot write 16-bit RGB; build the PNG by hand.
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in raw)
    data = _png(40, 30, bit_depth=16, color_type=2, idat=rows)
    arr = image.decode(data)
    assert (arr == (255, 128, 0)).all()


def _png(width: int, height: int, *, bit_depth: int, color_type: int, idat: bytes) -> bytes:
    import struct
    import zlib

    def chunk(ctype: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(ctype + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + ctype + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(idat))
            + chunk(b"IEND", b""))


def test_palette_png_becomes_rgb() -> None:
    im = Image.fromarray(smooth(40, 30)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    arr = image.decode(encode(im, "PNG"))
    np.testing.assert_array_equal(arr, np.asarray(im.convert("RGB")))


def test_palette_with_transparency_is_composited() -> None:
    im = Image.new("P", (8, 8), 0)
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    im.paste(1, (0, 0, 4, 8))
    data = encode(im, "PNG", transparency=0)  # palette entry 0 (red) is transparent
    arr = image.decode(data)
    assert (arr[:, :4] == (0, 0, 255)).all()
    assert (arr[:, 4:] == (255, 255, 255)).all()


@pytest.mark.parametrize(("mode", "key"), [("L", 10), ("RGB", (10, 20, 30)), ("1", 0)])
def test_a_transparent_colour_key_is_composited(mode: str, key: int | tuple[int, ...]) -> None:
    # A grey, RGB or 1-bit PNG's tRNS chunk names one colour as transparent, as a palette
    # PNG's names entries: its pixels are composited onto the background alike.
    im = Image.new(mode, (8, 8), key)
    im.paste(Image.new(mode, (4, 8), 255 if mode != "RGB" else (0, 0, 255)), (0, 0))
    data = encode(im, "PNG", transparency=key)
    arr = image.decode(data)
    assert (arr[:, 4:] == (255, 255, 255)).all()  # the transparent colour: the background
    assert (arr[:, :4] == np.asarray(im.convert("RGB"))[:, :4]).all()  # opaque: unchanged
    assert (image.decode(data, background=(7, 8, 9))[:, 4:] == (7, 8, 9)).all()
    dropped = image.decode(data, background=None)  # as PIL's convert("RGB")
    np.testing.assert_array_equal(dropped, np.asarray(im.convert("RGB")))


def test_alpha_is_composited_on_white_or_dropped() -> None:
    rgba = np.zeros((10, 10, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:, :5, 3] = 255  # left half opaque red, right half fully transparent
    data = encode(Image.fromarray(rgba, "RGBA"), "PNG")
    arr = image.decode(data)
    assert (arr[:, :5] == (200, 0, 0)).all() and (arr[:, 5:] == (255, 255, 255)).all()
    dropped = image.decode(data, background=None)
    assert (dropped == (200, 0, 0)).all()
    gray = image.decode(data, background=(128, 128, 128), size=(10, 10))
    assert (gray[:, 7:] == 128).all()


def test_la_png() -> None:
    la = Image.merge("LA", [_solid("L", 90, (6, 6)), _solid("L", 255, (6, 6))])
    assert (image.decode(encode(la, "PNG")) == 90).all()


def test_one_bit_image() -> None:
    im = _solid("1", 1, (9, 7))
    assert (image.decode(encode(im, "PNG")) == 255).all()


# -- EXIF orientation -------------------------------------------------------------------


def _quadrants(width: int, height: int) -> Image.Image:
    """Red, green / blue, white quadrants: unmistakable in any orientation."""
    arr = np.zeros((height, width, 3), np.uint8)
    arr[: height // 2, : width // 2] = (255, 0, 0)
    arr[: height // 2, width // 2 :] = (0, 255, 0)
    arr[height // 2 :, : width // 2] = (0, 0, 255)
    arr[height // 2 :, width // 2 :] = (255, 255, 255)
    return Image.fromarray(arr)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    upright = _quadrants(96, 64)
    data = with_orientation(upright, orientation)
    arr = image.decode(data)
    assert arr.shape == (64, 96, 3)
    assert mad(arr, np.asarray(upright)) < 3.0
    small = image.decode(data, size=(16, 24)).astype(int)  # drafted at 1/4
    for (y, x), colour in {(4, 6): (255, 0, 0), (4, 18): (0, 255, 0), (12, 6): (0, 0, 255),
                           (12, 18): (255, 255, 255)}.items():
        assert np.abs(small[y, x] - colour).max() <= 12, (y, x, small[y, x])


@pytest.mark.parametrize("orientation", [6, 8])
def test_exif_rotation_with_draft(orientation: int) -> None:
    upright = _quadrants(800, 400)
    data = with_orientation(upright, orientation)
    ours = image.decode(data, size=(100, 200))  # 4x smaller: draft at 1/4
    ref = np.asarray(upright.resize((200, 100), Image.Resampling.BILINEAR))
    assert mad(ours, ref) < 3.0



@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_tiff_is_turned_upright_once_as_exif_transpose_does(orientation: int) -> None:
    """PIL turns a TIFF upright itself as it loads (and gives its size upright): turning it
    again by its orientation tag would undo a flip and lay a rotation on its side."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(Image.fromarray(smooth(96, 64)), "TIFF", exif=exif)
    with Image.open(io.BytesIO(data)) as im:
        upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    np.testing.assert_array_equal(image.decode(data), upright)
    height, width = upright.shape[:2]
    box = image.augmentation(data, size=16).box  # the centre square of the upright picture
    side = min(height, width)
    assert box == ((width - side) / 2, (height - side) / 2, (width + side) / 2,
                   (height + side) / 2)

# -- training augmentation --------------------------------------------------------------


def test_train_crops_are_fixed_by_seed_epoch_and_index() -> None:
    data = jpeg(200, 150)
    a = image.decode(data, size=64, train=True, seed=7, epoch=2, index=5)
    b = image.decode(data, size=64, train=True, seed=7, epoch=2, index=5)
    np.testing.assert_array_equal(a, b)
    others = [
        image.decode(data, size=64, train=True, seed=7, epoch=3, index=5),
        image.decode(data, size=64, train=True, seed=7, epoch=2, index=6),
        image.decode(data, size=64, train=True, seed=8, epoch=2, index=5),
    ]
    assert all(not np.array_equal(a, o) for o in others)


def test_train_crops_are_the_same_in_any_thread() -> None:
    data = jpeg(200, 150)
    expected = [image.decode(data, size=48, train=True, seed=1, index=i) for i in range(16)]
    got: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        got[i] = image.decode(data, size=48, train=True, seed=1, index=i)

    threads = [threading.Thread(target=work, args=(i,)) for i in reversed(range(16))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(16):
        np.testing.assert_array_equal(got[i], expected[i])


def test_flip_mirrors_the_crop() -> None:
    import random

    data = jpeg(120, 90)
    seen = set()
    for i in range(40):
        rng_state = random.Random(i)
        a = image.decode(data, size=32, train=True, rng=random.Random(i), flip=True)
        b = image.decode(data, size=32, train=True, rng=rng_state, flip=False)
        if np.array_equal(a, b):
            seen.add("same")
        else:
            np.testing.assert_array_equal(a, b[:, ::-1])
            seen.add("flipped")
    assert seen == {"same", "flipped"}


def test_train_crop_covers_scale_range() -> None:
    data = jpeg(160, 120)
    full = image.decode(data, size=32, train=True, seed=0, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3),
                        flip=False)
    whole = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32),
                       Image.Resampling.BILINEAR))
    assert mad(full, whole) < 1.0


def test_train_needs_a_size_and_sane_ranges() -> None:
    with pytest.raises(ConfigError):
        image.decode(jpeg(20, 20), train=True)
    with pytest.raises(ConfigError, match="scale"):
        image.decode(jpeg(20, 20), size=8, train=True, scale=(0.5, 0.2))
    with pytest.raises(ConfigError, match="ratio"):
        image.decode(jpeg(20, 20), size=8, train=True, ratio=(0.0, 1.0))


@pytest.mark.parametrize("bad", [0.5, (0.5,), (0.1, "a"), (float("nan"), 1.0), "ab"])
@pytest.mark.parametrize("name", ["scale", "ratio"])
def test_a_scale_or_ratio_that_is_not_a_pair_of_numbers_is_named(name: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=f"^{name} must satisfy 0 < low <= high"):
        image.decode(jpeg(20, 20), size=8, train=True, **{name: bad})


# -- bad input --------------------------------------------------------------------------


def test_truncated_jpeg_names_the_file(tmp_path: Path) -> None:
    data = jpeg(300, 200)
    for cut in (len(data) // 3, len(data) // 2, len(data) - 200):
        path = tmp_path / f"cut{cut}.jpg"
        path.write_bytes(data[:cut])
        with pytest.raises(DecodeError, match=f"cut{cut}.jpg"):
            image.decode(path, size=64)
        with pytest.raises(DecodeError):
            image.decode(path)  # full size, no draft
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_cut_jpeg_with_an_end_marker_appended_names_the_file(tmp_path: Path) -> None:
    """Issue 13: libjpeg decodes this to grey rows with no error; it must be a DecodeError."""
    for kind, data in (("base", jpeg(300, 200)), ("prog", progressive_jpeg(300, 200))):
        for cut_at in (len(data) // 3, len(data) // 2, len(data) - 200):
            path = tmp_path / f"{kind}{cut_at}.jpg"
            path.write_bytes(cut_short(data, cut_at))
            with pytest.raises(DecodeError, match=rf"{kind}{cut_at}\.jpg"):
                image.decode(path, size=64)
            with pytest.raises(DecodeError, match=rf"{kind}{cut_at}\.jpg"):
                image.decode(path)
            with pytest.raises(DecodeError, match=r"<\d+ bytes>"):
                image.decode(path.read_bytes())
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_header_claiming_more_pixels_than_the_data_holds(tmp_path: Path) -> None:
    """Issue 13: 9000x9000 declared over 16x16 of data decoded to an all-grey picture."""
    path = tmp_path / "claims.jpg"
    path.write_bytes(with_frame_size(jpeg(16, 16), 9000, 9000))
    with pytest.raises(DecodeError, match=r"claims\.jpg"):
        image.decode(path, size=224)
    with pytest.raises(DecodeError, match=r"claims\.jpg"):
        image.decode(path)


def test_truncated_jpeg_leaves_out_untouched(tmp_path: Path) -> None:
    data = jpeg(300, 200)
    out = np.full((3, 64, 64), 7, np.uint8)
    with pytest.raises(DecodeError):
        image.decode(data[: len(data) // 2], size=64, out=out, layout="chw", name="half.jpg")
    assert (out == 7).all()


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(DecodeError, match=r"empty\.jpg.*empty"):
        image.decode(tmp_path / "empty.jpg")


def test_text_named_jpg(tmp_path: Path) -> None:
    (tmp_path / "notes.jpg").write_text("this is not a picture\n" * 20)
    with pytest.raises(DecodeError, match=r"notes\.jpg"):
        image.decode(tmp_path / "notes.jpg", size=32)


@pytest.mark.parametrize("chunk", [b"IHDR", b"IDAT", b"IEND"])
def test_png_with_a_bad_checksum(tmp_path: Path, chunk: bytes) -> None:
    good = encode(Image.fromarray(smooth(40, 30)), "PNG")
    path = tmp_path / "bad.png"
    path.write_bytes(png_with_bad_crc(good, chunk))
    with pytest.raises(DecodeError, match=r"bad\.png"):
        image.decode(path)


def test_png_with_damaged_data(tmp_path: Path) -> None:
    good = bytearray(encode(Image.fromarray(smooth(40, 30)), "PNG"))
    good[60:70] = b"\xff" * 10
    with pytest.raises(DecodeError, match=r"photo\.png"):
        image.decode(bytes(good), name="photo.png")


def test_truncated_png() -> None:
    good = encode(Image.fromarray(smooth(40, 30)), "PNG")
    with pytest.raises(DecodeError, match=r"short\.png"):
        image.decode(good[: len(good) // 2], name="short.png")


def test_decompression_bomb_is_refused_from_the_header(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(png_bomb(50_000, 50_000))  # 2.5 gigapixels declared, a few bytes sent
    with pytest.raises(DecodeError, match=r"bomb\.png"):
        image.decode(path, size=224)


def test_pixel_limit_is_configurable() -> None:
    data = jpeg(100, 100)
    with pytest.raises(DecodeError, match="max_pixels"):
        image.decode(data, max_pixels=9_999, name="x.jpg")
    assert image.decode(data, max_pixels=10_000).shape == (100, 100, 3)


def test_a_max_pixels_above_pil_s_own_limit_says_which_limit_refused() -> None:
    """PIL refuses twice its MAX_IMAGE_PIXELS when it opens the file, before max_pixels is
    read: the error says so, instead of naming a limit the caller had raised."""
    with pytest.raises(DecodeError, match=r"big\.png: DecompressionBombError: .*"
                                          r"PIL\.Image\.MAX_IMAGE_PIXELS: raise that too"):
        image.decode(png_bomb(20_000, 10_000), max_pixels=10**9, name="big.png")


def test_missing_file_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFound, match=r"gone\.jpg"):
        image.decode(tmp_path / "gone.jpg")


def test_bytes_are_named_in_errors() -> None:
    with pytest.raises(DecodeError, match="<5 bytes>"):
        image.decode(b"hello")
    with pytest.raises(DecodeError, match=r"https://host/a\.jpg"):
        image.decode(b"hello", name="https://host/a.jpg")


def test_decode_error_is_a_value_error_with_a_cause() -> None:
    with pytest.raises(ValueError) as info:
        image.decode(b"GIF89a broken")
    assert isinstance(info.value, DecodeError)
    assert info.value.__cause__ is not None


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        image.decode(jpeg(20, 20), size=0)
    with pytest.raises(ConfigError):
        image.decode(jpeg(20, 20), layout="nhwc")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        image.decode(12345)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        image.decode(jpeg(20, 20), normalize=True, std=(0.1, 0.0, 0.2))


@pytest.mark.parametrize("resize", [0, -5, True, 2.5, "256"])
def test_resize_must_be_an_int_of_at_least_one(resize: object) -> None:
    # Not a picture's fault: a ConfigError naming the argument, never a DecodeError (which
    # image.folder would count against max_failures, once per image).
    data = jpeg(64, 48)
    with pytest.raises(ConfigError, match="resize"):
        image.decode(data, size=16, resize=resize)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="resize"):
        image.augmentation(data, size=16, resize=resize)  # type: ignore[arg-type]
    assert image.decode(data, size=16, resize=None).shape == (16, 16, 3)


@pytest.mark.parametrize("background", ["red", (1, 2), (300, 0, 0), (-1, 0, 0), (0.5, 0, 0),
                                        (1, 2, 3, 4), (True, 0, 0)])
def test_background_must_be_three_levels_of_0_to_255(background: object) -> None:
    # (300, 0, 0) used to wrap to (44, 0, 0), and (-1, 0, 0) to (255, 0, 0); the others were
    # a DecodeError blaming the picture, and only for pictures with an alpha channel.
    data = encode(Image.new("RGBA", (4, 4), (9, 9, 9, 0)), "PNG")
    for src in (data, jpeg(8, 8)):
        with pytest.raises(ConfigError, match="background"):
            image.decode(src, background=background)  # type: ignore[arg-type]
    assert (image.decode(data, background=(0, 128, 255)) == (0, 128, 255)).all()
    assert (image.decode(data, background=np.array([0, 128, 255])) == (0, 128, 255)).all()


@pytest.mark.parametrize("max_pixels", [0, -1, None, "1e8", 1.5])
def test_max_pixels_must_be_an_int_of_at_least_one(max_pixels: object) -> None:
    data = jpeg(8, 8)  # 64 pixels: each value above used to fail it as a DecodeError
    with pytest.raises(ConfigError, match="max_pixels"):
        image.decode(data, max_pixels=max_pixels)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_pixels"):
        image.augmentation(data, size=4, max_pixels=max_pixels)  # type: ignore[arg-type]
    assert image.decode(data, max_pixels=64).shape == (8, 8, 3)


# -- only regular files, at most max_bytes (issue 25.6); bytes that name their URL (25.11) --


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "odd.jpg").symlink_to("/dev/zero")  # read whole, it would never end
    with pytest.raises(SourceError, match=r"odd\.jpg: is a character device"):
        image.decode(tmp_path / "odd.jpg", size=8)
    os.mkfifo(tmp_path / "pipe.jpg")  # opened for reading, it blocks until a writer comes
    with pytest.raises(SourceError, match=r"pipe\.jpg: is a FIFO"):
        image.decode(tmp_path / "pipe.jpg", size=8)


def test_max_bytes_caps_paths_and_bytes(tmp_path: Path) -> None:
    data = jpeg(64, 48)
    (tmp_path / "a.jpg").write_bytes(data)
    assert image.DEFAULT_MAX_BYTES == 256 * 1024 * 1024
    assert image.decode(tmp_path / "a.jpg", max_bytes=len(data)).shape == (48, 64, 3)
    with pytest.raises(SourceError, match=rf"a\.jpg: .*over max_bytes={len(data) - 1:,}"):
        image.decode(tmp_path / "a.jpg", max_bytes=len(data) - 1)
    with pytest.raises(DecodeError, match=rf"over max_bytes={len(data) - 1:,}"):
        image.decode(data, max_bytes=len(data) - 1)
    assert image.decode(data, max_bytes=None).shape == (48, 64, 3)
    with pytest.raises(ConfigError, match="max_bytes"):
        image.decode(data, max_bytes=-1)


def test_bytes_read_by_read_bytes_are_named_by_their_url() -> None:
    with pytest.raises(DecodeError, match=r"cannot decode https://host/a\.jpg\?sig=\*\*\*: "):
        image.decode(Blob(b"junk", "https://host/a.jpg?sig=secret"))
