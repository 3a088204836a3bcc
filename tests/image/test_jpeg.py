"""image._jpeg: a JPEG whose entropy-coded data ends early is a DecodeError, as a class.

libjpeg pads a short scan with grey (or, in a progressive file, leaves it blurred) and only
warns; these tests cut pictures of every common kind at many points, with an end-of-image
marker appended or not, and check that each cut is refused by name, and that whole files,
of the same kinds, decode to exactly the pixels they decoded to before the check.
"""

from __future__ import annotations

import re
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from asyncflow import DecodeError, image
from asyncflow.image import _decode, _jpeg

from ._pictures import (
    PHOTOS,
    cut,
    encode,
    jpeg,
    mpo,
    scan_starts,
    smooth,
    with_frame_size,
    with_orientation,
    write_tree,
)

_PICTURE = Image.fromarray(smooth(203, 157, seed=5))  # sizes that are no multiple of 8 or 16

#: Encoder settings for each kind of JPEG the class covers.
KINDS = {
    "baseline": {"quality": 90},
    "baseline-444": {"quality": 95, "subsampling": 0},
    "optimized": {"quality": 80, "optimize": True},
    "progressive": {"quality": 90, "progressive": True},
    "progressive-444": {"quality": 95, "subsampling": 0, "progressive": True},
    "restart-blocks": {"quality": 90, "restart_marker_blocks": 5},
    "restart-rows": {"quality": 90, "restart_marker_rows": 1},
    "progressive-restart": {"quality": 90, "progressive": True, "restart_marker_blocks": 7},
}


def _kind(name: str) -> bytes:
    return encode(_PICTURE, "JPEG", **KINDS[name])


def _gray(progressive: bool = False) -> bytes:
    return encode(_PICTURE.convert("L"), "JPEG", progressive=progressive)


def _cmyk(progressive: bool = False) -> bytes:
    return encode(_PICTURE.convert("CMYK"), "JPEG", progressive=progressive)


def _refused(data: bytes, name: str = "cut.jpg", **kw: object) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        image.decode(data, name=name, **kw)  # type: ignore[arg-type]
    assert name in str(info.value)
    return info.value


def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode as before the check: ``im.load()`` alone."""
    monkeypatch.setattr(_decode, "_jpeg", types.SimpleNamespace(inspect=lambda *_: None))


# -- cut scan data is refused ---------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("eoi", [True, False], ids=["eoi", "no-eoi"])
def test_cut_scan_data_is_refused(kind: str, eoi: bool) -> None:
    data = _kind(kind)
    first_scan = scan_starts(data)[0]
    for fraction in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.97):
        at = first_scan + 20 + int(fraction * (len(data) - first_scan - 60))
        _refused(cut(data, at, eoi))
        _refused(cut(data, at, eoi), size=48)  # draft (DCT-domain) decoding
    _refused(cut(data, -40, eoi))


@pytest.mark.parametrize("make", [_gray, _cmyk], ids=["gray", "cmyk"])
@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_cut_gray_and_cmyk_are_refused(make: object, progressive: bool) -> None:
    data = make(progressive)  # type: ignore[operator]
    for at in (len(data) // 3, len(data) // 2, len(data) - 60):
        _refused(cut(data, at))


@pytest.mark.parametrize("kind", ["baseline", "progressive", "restart-rows"])
def test_every_cut_but_the_last_bytes_is_refused(kind: str) -> None:
    """A sweep: each cut from the first scan to 16 bytes before the end is refused. Within
    the last few bytes, the stand-in bytes the check feeds can complete the last block."""
    data = _kind(kind)
    for at in range(scan_starts(data)[0], len(data) - 16, 37):
        _refused(cut(data, at))


def test_a_progressive_file_cut_at_a_scan_boundary_is_refused() -> None:
    data = _kind("progressive")
    starts = scan_starts(data)
    assert len(starts) > 5
    for at in starts[1:]:
        assert "scans are missing" in str(_refused(cut(data, at)))


def test_a_header_larger_than_its_data_is_refused_without_decoding() -> None:
    small = jpeg(16, 16)
    err = _refused(with_frame_size(small, 9000, 9000), name="huge.jpg")
    assert "claims more than the data holds" in str(err)
    _refused(with_frame_size(small, 9000, 9000), name="huge.jpg", size=224)


def test_a_header_somewhat_larger_than_its_data_is_refused() -> None:
    for kind in ("baseline", "progressive"):
        data = _kind(kind)
        _refused(with_frame_size(data, 203, 157 + 48))
        _refused(with_frame_size(data, 203 + 64, 157))


def test_missing_restart_markers_are_counted() -> None:
    data = _kind("restart-rows")
    err = _refused(cut(data, len(data) // 2))
    assert re.search(r"has \d+ of its \d+ restart markers", str(err))


def test_a_file_without_its_end_marker_is_refused() -> None:
    data = _kind("baseline")
    assert "end-of-image" in str(_refused(data[:-2]))
    assert "end-of-image" in str(_refused(data[:-1]))


def test_a_cut_inside_a_marker_segment_is_refused() -> None:
    data = _kind("baseline")
    for marker in (b"\xff\xdb", b"\xff\xc4", b"\xff\xc0", b"\xff\xda"):
        at = data.index(marker) + 6
        _refused(cut(data, at))
        _refused(cut(data, at, eoi=False))


def test_a_path_is_named(tmp_path: Path) -> None:
    path = tmp_path / "cut-photo.jpg"
    path.write_bytes(cut(_kind("progressive"), -200))
    with pytest.raises(DecodeError, match=r"cut-photo\.jpg"):
        image.decode(path, size=32)


def test_an_mpo_cut_inside_its_second_picture_is_refused() -> None:
    data = mpo(smooth(120, 90, seed=1), smooth(120, 90, seed=2))
    assert "picture 2" in str(_refused(cut(data, -300), name="stereo.mpo"))


def test_the_out_buffer_is_untouched_by_a_refused_file() -> None:
    out = np.full((32, 32, 3), 7, np.uint8)
    _refused(cut(_kind("baseline"), -300), size=32, out=out)
    assert (out == 7).all()


def test_damaged_jpegs_count_under_max_failures(tmp_path: Path, leak_check: None) -> None:
    root = tmp_path / "train"
    write_tree(root, {"cat": 3, "dog": 3}, size=(96, 72))
    whole = jpeg(96, 72, seed=9)
    (root / "cat" / "grey-rows.jpg").write_bytes(cut(whole, len(whole) // 2))
    (root / "dog" / "big-header.jpg").write_bytes(with_frame_size(whole, 960, 720))
    pipe = image.folder(root, batch_size=4, size=16, max_failures=2)
    total = sum(len(labels) for _, labels in pipe)
    assert total == 6
    named = sorted(re.findall(r"[\w-]+\.jpg", f.item)[-1] for f in pipe.stats().failures)
    assert named == ["big-header.jpg", "grey-rows.jpg"]


def test_threads_decoding_whole_and_cut_files_each_get_their_own_answer() -> None:
    whole = _kind("progressive")
    files = [whole if i % 2 else cut(whole, len(whole) // 2 + i) for i in range(32)]
    want = image.decode(whole, size=32)

    def one(i: int) -> str:
        try:
            got = image.decode(files[i], size=32, name=f"f{i}.jpg")
        except DecodeError as exc:
            return "refused" if f"f{i}.jpg" in str(exc) else f"misnamed: {exc}"
        return "whole" if np.array_equal(got, want) else "different"

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(32)))
    assert answers == ["whole" if i % 2 else "refused" for i in range(32)]


# -- whole files decode, and to the same pixels as before ----------------------------------


def _whole() -> dict[str, bytes]:
    files = {kind: _kind(kind) for kind in KINDS}
    files |= {"gray": _gray(), "gray-progressive": _gray(True), "cmyk": _cmyk()}
    files |= {"cmyk-progressive": _cmyk(True), "mpo": mpo(smooth(120, 90), smooth(120, 90, 1))}
    files |= {f"exif-{o}": with_orientation(_PICTURE, o) for o in (3, 6, 8)}
    files |= {"trailing-bytes": _kind("baseline") + b"\x00" * 64 + b"junk after the end"}
    files |= {photo.name: photo.read_bytes() for photo in PHOTOS}
    return files


WHOLE = _whole()


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_whole_files_decode_to_the_same_pixels(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = WHOLE[name]
    settings: list[dict[str, object]] = [{}, {"size": 64}, {"size": 40, "resize": 48}]
    settings.append({"size": 32, "train": True, "seed": 1})
    checked = [image.decode(data, **kw) for kw in settings]  # type: ignore[arg-type]
    _unchecked(monkeypatch)
    for kw, got in zip(settings, checked, strict=True):
        np.testing.assert_array_equal(got, image.decode(data, **kw))  # type: ignore[arg-type]


def test_a_whole_file_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "whole.jpg"
    path.write_bytes(WHOLE["progressive"])
    assert image.decode(path, size=24).shape == (24, 24, 3)


# -- the walk over the markers --------------------------------------------------------------


def test_inspect_finds_the_end_of_the_last_scan() -> None:
    data = _kind("progressive")
    layout = _jpeg.inspect(data, "x.jpg")
    assert layout.end == len(data) - 2 and not layout.single_scan
    assert _jpeg.inspect(_kind("baseline"), "x.jpg").single_scan


def test_inspect_refuses_a_file_with_no_scan() -> None:
    data = _kind("baseline")
    with pytest.raises(DecodeError, match=r"x\.jpg.*no scan"):
        _jpeg.inspect(data[: scan_starts(data)[0]] + b"\xff\xd9", "x.jpg")
