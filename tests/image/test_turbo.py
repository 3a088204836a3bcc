"""The decode kernel's JPEG decoders: simplejpeg where installed, PIL without it (_turbo.py).

Each test runs on both paths (the ``decoder`` fixture hides simplejpeg for ``"pil"``), so
the tolerance against a full decode and the damage guarantees hold whichever one a user has.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from asyncflow import DecodeError, image
from asyncflow.image import _turbo

from ._pictures import PHOTOS, cut, encode, progressive_jpeg, scan_starts

#: The issue's bound on the training kernel's distance from a full decode, in 0-255 levels:
#: the mean over the images, and the worst image's own mean.
MEAN_LEVELS, WORST_LEVELS = 0.5, 3.0


@pytest.fixture(params=["simplejpeg", "pil"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "pil":
        monkeypatch.setattr(_turbo, "_simplejpeg", None)
    else:
        assert _turbo.available(), "simplejpeg is a dependency: pip install simplejpeg"
    yield request.param


@pytest.fixture
def fast_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each ``_turbo.decode`` call decoded the picture (``False``: PIL's path did)."""
    calls: list[bool] = []
    real = _turbo.decode

    def spy(*args: object, **kwargs: object) -> Image.Image | None:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(result is not None)
        return result

    monkeypatch.setattr(_turbo, "decode", spy)
    return calls


def _photos() -> list[tuple[str, bytes]]:
    """The shipped photos, plus a grayscale one and a progressive one made from them."""
    out = [(p.name, p.read_bytes()) for p in PHOTOS]
    with Image.open(PHOTOS[0]) as im:
        out.append(("gray", encode(im.convert("L"), "JPEG", quality=90)))
    with Image.open(PHOTOS[1]) as im:
        out.append(("progressive", encode(im.convert("RGB"), "JPEG", quality=85,
                                          progressive=True)))
    return out


def _full_decode(data: bytes, box: tuple[float, ...], size: int, flip: bool) -> np.ndarray:
    """PIL at full size on the kernel's own box: what the kernel approximates."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    arr = np.asarray(rgb.resize((size, size), Image.Resampling.BILINEAR, box=box))
    return arr[:, ::-1] if flip else arr


@pytest.mark.parametrize("size", [224, 160])
def test_training_crops_stay_within_the_bound_of_a_full_decode(
    decoder: str, fast_calls: list[bool], size: int
) -> None:
    """RandomResizedCrop, as in training: the crops at least twice the output are DCT-scaled
    (the whole distance is theirs), the others decoded at full scale. On these 300-600 px
    photos 2% of the 224 crops are scaled and 22% of the 160 ones (17% in the benchmark's
    ImageNet-sized set at 224)."""
    levels = []
    for name, data in _photos():
        for index in range(24):
            keys = {"size": size, "train": True, "seed": 7, "index": index}
            got = image.decode(data, name=name, **keys)
            crop = image.augmentation(data, name=name, **keys)
            want = _full_decode(data, crop.box, size, crop.flip)
            levels.append(np.abs(got.astype(np.int16) - want.astype(np.int16)).mean())
    assert np.mean(levels) <= MEAN_LEVELS and max(levels) <= WORST_LEVELS, levels
    assert all(fast_calls) == (decoder == "simplejpeg") and fast_calls


def test_both_decoders_give_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Normalized CHW rows, as image.folder writes them, from either decoder."""
    rows = {}
    for hidden in (False, True):
        if hidden:
            monkeypatch.setattr(_turbo, "_simplejpeg", None)
        rows[hidden] = np.stack([
            image.decode(data, size=160, train=True, seed=3, index=i, layout="chw",
                         normalize=True)
            for i, (_, data) in enumerate(_photos())
        ])
    # one level of 0-255, normalized by ImageNet's std: libjpeg-turbo's versions may differ
    assert np.abs(rows[False] - rows[True]).max() <= 1.0 / (255 * 0.224) + 1e-5


@pytest.mark.parametrize("mapped", [True, False])
def test_rgb_mapped_or_copied_into_pil_gives_the_same_pixels(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[bool], mapped: bool
) -> None:
    """pillow-simd resizes the decoded array mapped as RGBX, stock Pillow a copy as RGB."""
    monkeypatch.setattr(_turbo, "_MAP_RGBX", mapped)
    data = PHOTOS[2].read_bytes()
    for layout in ("hwc", "chw"):
        got = image.decode(data, size=(120, 100), train=True, seed=1, layout=layout)
        with monkeypatch.context() as m:
            m.setattr(_turbo, "_simplejpeg", None)
            want = image.decode(data, size=(120, 100), train=True, seed=1, layout=layout)
        assert np.abs(got.astype(np.int16) - want.astype(np.int16)).max() <= 1
    assert fast_calls == [True, False, True, False]


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.9, 0.99])
def test_a_cut_photo_is_a_decode_error(decoder: str, fraction: float) -> None:
    data = PHOTOS[2].read_bytes()
    for eoi in (True, False):
        damaged = cut(data, int(len(data) * fraction), eoi=eoi)
        with pytest.raises(DecodeError, match=r"damaged JPEG"):
            image.decode(damaged, name="cut.jpg", size=96, train=True, seed=0)


def test_simplejpeg_itself_refuses_a_scan_cut_short(fast_calls: list[bool]) -> None:
    """The fast path's own check, not PIL's: the cut is found before PIL's path would run."""
    data = PHOTOS[0].read_bytes()
    with pytest.raises(DecodeError, match=r"scan data ends early \(Corrupt JPEG data"):
        image.decode(cut(data, -40), name="cut.jpg", size=64)
    assert fast_calls == []  # it raised from inside _turbo.decode


def test_a_progressive_file_missing_its_last_scans_is_refused(decoder: str) -> None:
    """libjpeg decodes it blurred without a warning; the marker walk refuses it first."""
    data = progressive_jpeg(160, 120)
    starts = scan_starts(data)
    with pytest.raises(DecodeError, match=r"scans are missing"):
        image.decode(cut(data, starts[-2]), name="blur.jpg", size=64)


def test_a_warning_that_is_not_damage_is_decoded_by_pil(fast_calls: list[bool]) -> None:
    """Junk bytes between header segments: libjpeg warns (strict simplejpeg refuses); PIL's
    path decodes the picture as it always has."""
    data = PHOTOS[1].read_bytes()
    at = 4 + int.from_bytes(data[4:6], "big")  # after the first segment (APP0)
    junk = data[:at] + b"\x00\x00" + data[at:]
    got = image.decode(junk, size=128)
    assert fast_calls == [False]
    np.testing.assert_array_equal(got, image.decode(data, size=128))


def test_without_simplejpeg_the_kernel_decodes_with_pil(tmp_path: Path) -> None:
    """simplejpeg not importable at all: the same pixels, and backend_info says so."""
    script = (
        "import sys; sys.modules['simplejpeg'] = None\n"
        "import numpy as np\n"
        "from asyncflow import image\n"
        "from asyncflow.image import _turbo\n"
        "assert not _turbo.available()\n"
        "info = image.backend_info()\n"
        "assert info['simplejpeg'] is None, info\n"
        "assert any('simplejpeg' in p for p in info['problems']), info\n"
        f"np.save({str(tmp_path / 'rows.npy')!r}, image.decode({str(PHOTOS[0])!r}, size=96))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    np.testing.assert_array_equal(np.load(tmp_path / "rows.npy"), image.decode(PHOTOS[0],
                                                                                size=96))


def test_backend_info_names_simplejpeg() -> None:
    assert image.backend_info()["simplejpeg"] == _turbo.version() is not None
