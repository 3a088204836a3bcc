"""image.collate and image.normalize."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncflow import ConfigError, image


def _images(n: int, h: int = 8, w: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def test_collate_makes_one_contiguous_nchw_uint8_tensor() -> None:
    imgs = _images(4)
    batch = image.collate(imgs)
    assert batch.dtype == torch.uint8 and batch.shape == (4, 3, 8, 6) and batch.is_contiguous()
    for i, img in enumerate(imgs):
        np.testing.assert_array_equal(batch[i].numpy(), img.transpose(2, 0, 1))


def test_collate_pairs_gives_int64_labels() -> None:
    imgs = _images(3)
    batch, labels = image.collate([(img, i * 2) for i, img in enumerate(imgs)])
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 2, 4]
    assert batch.shape == (3, 3, 8, 6)


def test_collate_accepts_chw_read_only_and_tensors() -> None:
    imgs = _images(3)
    chw = imgs[0].transpose(2, 0, 1).copy()
    ro = imgs[1].copy()
    ro.flags.writeable = False
    tensor = torch.from_numpy(imgs[2])
    batch = image.collate([chw, ro, tensor])
    for i, img in enumerate(imgs):
        np.testing.assert_array_equal(batch[i].numpy(), img.transpose(2, 0, 1))


def test_collate_refuses_mixed_sizes_and_bad_dtypes() -> None:
    with pytest.raises(ConfigError):
        image.collate([])
    with pytest.raises(ConfigError, match="image 1"):
        image.collate(_images(1) + _images(1, h=9))
    with pytest.raises(ConfigError, match="uint8"):
        image.collate([np.zeros((4, 4, 3), np.float32)])
    with pytest.raises(ConfigError, match="shape"):
        image.collate([np.zeros((4, 4), np.uint8)])


def test_normalize_equals_the_textbook_formula() -> None:
    batch = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    got = image.normalize(batch)
    mean = torch.tensor(image.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(image.IMAGENET_STD).view(1, 3, 1, 1)
    expected = (batch.float() / 255 - mean) / std
    assert got.dtype == torch.float32 and got.shape == batch.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert batch.dtype == torch.uint8  # the input is left alone


def test_normalize_single_image_custom_stats_out_and_dtype() -> None:
    img = torch.full((3, 2, 2), 255, dtype=torch.uint8)
    got = image.normalize(img, mean=(0.5, 0.5, 0.5), std=(0.5, 0.25, 1.0))
    torch.testing.assert_close(got[:, 0, 0], torch.tensor([1.0, 2.0, 0.5]))
    out = torch.empty((3, 2, 2), dtype=torch.float64)
    assert image.normalize(img, out=out) is out
    half = image.normalize(img, dtype=torch.float16)
    assert half.dtype == torch.float16


def test_normalize_matches_decode_normalize() -> None:
    from ._pictures import jpeg

    data = jpeg(80, 60)
    u8 = torch.from_numpy(image.decode(data, size=32, layout="chw"))
    f32 = image.decode(data, size=32, layout="chw", normalize=True)
    torch.testing.assert_close(image.normalize(u8), torch.from_numpy(f32), atol=1e-5, rtol=0)


def test_normalize_refuses_an_integer_result_or_an_out_of_another_shape() -> None:
    # Each used to return plausible-looking data: 254s for uint8, four copies of one image.
    batch = torch.full((1, 3, 2, 2), 128, dtype=torch.uint8)
    for dtype in (torch.uint8, torch.int32):
        with pytest.raises(ConfigError, match="floating"):
            image.normalize(batch, dtype=dtype)
        with pytest.raises(ConfigError, match="floating"):
            image.normalize(batch, out=torch.zeros((1, 3, 2, 2), dtype=dtype))
    with pytest.raises(ConfigError, match="shape"):
        image.normalize(batch, out=torch.zeros((4, 3, 2, 2)))
    assert image.normalize(batch, out=torch.zeros((1, 3, 2, 2))).shape == (1, 3, 2, 2)


def test_normalize_refuses_non_uint8_or_wrong_channels() -> None:
    with pytest.raises(ConfigError):
        image.normalize(torch.zeros((1, 3, 2, 2)))
    with pytest.raises(ConfigError):
        image.normalize(torch.zeros((1, 4, 2, 2), dtype=torch.uint8))
    with pytest.raises(ConfigError):
        image.normalize(torch.zeros((1, 3, 2, 2), dtype=torch.uint8), std=(1.0, 0.0, 1.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_normalize_on_the_gpu() -> None:
    batch = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    got = image.normalize(batch.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), image.normalize(batch), atol=1e-5, rtol=0)
