"""The batched resampler of the GPU path (``asyncflow/image/_resample.py``), run on the CPU:
the same rows as the CPU kernel from the same boxes, for every orientation and draft scale."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from asyncflow.image import _decode
from asyncflow.image._geometry import orientation_op
from asyncflow.image._gpu_plan import Placement
from asyncflow.image._resample import resample
from asyncflow.pipeline.seeding import item_random

from . import _pictures as P


def _placement(data: bytes, size: tuple[int, int], train: bool, index: int,
               resize: int | None = None) -> Placement:
    with Image.open(io.BytesIO(data)) as im:
        width, height = im.size
        orientation = _decode._orientation(im)
        _, swaps = orientation_op(orientation)
        rng = item_random(7, 0, index) if train else None
        crop = _decode._crop(im.size, orientation, size, resize, rng, (0.08, 1.0), (3 / 4, 4 / 3),
                             True)
        factor = _decode._draft(im, crop.box, size, swaps)
    return Placement(height, width, orientation, factor, crop.box, crop.flip)


def _full(data: bytes, layout: str = "chw") -> torch.Tensor:
    """The stored picture at full size, as a GPU decoder gives it (no orientation applied)."""
    with Image.open(io.BytesIO(data)) as im:
        arr = np.asarray(im.convert("RGB")).copy()
    t = torch.from_numpy(arr)
    return t.permute(2, 0, 1).contiguous() if layout == "chw" else t.contiguous()


def _cpu(data: bytes, size: tuple[int, int], train: bool, index: int,
         resize: int | None = None) -> np.ndarray:
    return _decode.decode(data, size=size, train=train, resize=resize, seed=7, epoch=0,
                          index=index, layout="chw")


def _levels(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.numpy() - want.astype(np.float32)).mean())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_orientation_reads_the_upright_picture(orientation: int) -> None:
    upright = Image.fromarray(P.smooth(160, 96, seed=orientation))
    data = P.with_orientation(upright, orientation)
    for index, train in enumerate((False, True, True, True)):
        place = _placement(data, (48, 40), train, index)
        got = resample([_full(data)], [place], (48, 40))[0]
        assert _levels(got, _cpu(data, (48, 40), train, index)) <= 2.0


@pytest.mark.parametrize("side", [300, 700, 1400, 1800])
def test_draft_scales_match_the_cpu_kernel(side: int) -> None:
    """Crops 1x to 40x the output: draft scales 1, 2, 4 and 8."""
    data = P.jpeg(side, side * 3 // 4, seed=side)
    factors = set()
    for index in range(6):
        train = index > 0
        place = _placement(data, (64, 64), train, index)
        factors.add(place.factor)
        got = resample([_full(data)], [place], (64, 64))[0]
        worst = _levels(got, _cpu(data, (64, 64), train, index))
        assert worst <= 4.0, (place, worst)
    assert max(factors) >= (2 if side >= 700 else 1)


def test_a_batch_of_mixed_sizes_equals_each_picture_alone() -> None:
    datas = [P.jpeg(w, h, seed=i) for i, (w, h) in enumerate([(120, 90), (640, 400), (90, 200)])]
    datas.append(P.with_orientation(Image.fromarray(P.smooth(150, 110, seed=9)), 6))
    places = [_placement(d, (40, 56), True, i) for i, d in enumerate(datas)]
    batch = resample([_full(d) for d in datas], places, (40, 56))
    for i, (data, place) in enumerate(zip(datas, places, strict=True)):
        alone = resample([_full(data)], [place], (40, 56))[0]
        assert torch.equal(batch[i], alone)
        assert _levels(batch[i], _cpu(data, (40, 56), True, i)) <= 2.0


def test_interleaved_pictures_give_the_planar_result() -> None:
    datas = [P.jpeg(200, 150, seed=1), P.jpeg(331, 257, seed=2)]
    places = [_placement(d, (32, 32), True, i) for i, d in enumerate(datas)]
    planar = resample([_full(d) for d in datas], places, (32, 32))
    interleaved = resample([_full(d, "hwc") for d in datas], places, (32, 32), layout="hwc")
    assert torch.equal(planar, interleaved)


def test_evaluation_crops_with_resize_match() -> None:
    for i, data in enumerate(P.PHOTOS):
        raw = data.read_bytes()
        place = _placement(raw, (56, 56), False, i, resize=64)
        got = resample([_full(raw)], [place], (56, 56))[0]
        assert _levels(got, _cpu(raw, (56, 56), False, i, resize=64)) <= 1.0


def test_values_are_whole_8_bit_levels() -> None:
    data = P.jpeg(257, 193, seed=4)
    got = resample([_full(data)], [_placement(data, (31, 45), True, 3)], (31, 45))
    assert got.dtype == torch.float32
    assert torch.equal(got, got.round()) and got.min() >= 0 and got.max() <= 255


def test_real_photos_within_the_issue_tolerance() -> None:
    """Mean absolute difference <= 2 levels over the photos, <= 4 for the worst."""
    diffs = []
    for i, path in enumerate(P.PHOTOS):
        raw = path.read_bytes()
        for index in range(8):
            place = _placement(raw, (96, 96), index % 4 != 0, 10 * i + index)
            got = resample([_full(raw)], [place], (96, 96))[0]
            diffs.append(_levels(got, _cpu(raw, (96, 96), index % 4 != 0, 10 * i + index)))
    assert float(np.mean(diffs)) <= 2.0 and max(diffs) <= 4.0


def test_groups_split_by_scale_and_budget_give_each_pictures_own_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pictures are resampled in groups (one draft scale each, similar sizes, a bounded
    gather): the rows come back in the caller's order, each equal to the picture alone."""
    from asyncflow.image import _resample

    datas = [P.jpeg(w, h, seed=i) for i, (w, h) in enumerate(
        [(120, 90), (700, 520), (90, 200), (300, 240), (1500, 1100), (64, 64), (410, 330)])]
    places = [_placement(d, (40, 56), True, i) for i, d in enumerate(datas)]
    assert len({p.factor for p in places}) >= 3
    full = [_full(d) for d in datas]
    alone = [resample([f], [p], (40, 56))[0] for f, p in zip(full, places, strict=True)]
    monkeypatch.setattr(_resample, "CHUNK", 2)
    monkeypatch.setattr(_resample, "GATHER_BUDGET", 3 * 64 * 64)  # a picture or two a group
    groups = _resample._groups(places, 40, 56)
    assert sorted(i for g in groups for i in g) == list(range(len(datas)))
    assert len(groups) > 3 and all(len({places[i].factor for i in g}) == 1 for g in groups)
    batch = resample(full, places, (40, 56))
    for i, row in enumerate(alone):
        assert torch.equal(batch[i], row), i
