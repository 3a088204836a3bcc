"""Batches of images: one contiguous uint8 buffer per batch, and the float normalization.

``N x 3 x H x W`` (NCHW) throughout, because that is what ends up cheapest: the channel split
costs nothing extra when each image is written (PIL hands out one band at a time), and the
normalization of a contiguous NCHW uint8 batch is a plain element-wise conversion, 2-3x
cheaper than normalizing an NHWC batch into NCHW (a strided transpose).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "collate", "normalize"]

#: ImageNet's per-channel mean and standard deviation (RGB, on a 0-1 scale), the defaults.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def collate(items: Sequence[Any]) -> Any:
    """Copy images into one new contiguous ``N x 3 x H x W`` uint8 tensor.

    Args:
        items: ``H x W x 3`` (as :func:`~asyncflow.image.decode` returns by default) or
            ``3 x H x W`` uint8 arrays or tensors, all of one size; or ``(image, label)``
            pairs, whose labels become an int64 tensor.

    Returns:
        The batch tensor, or ``(batch, labels)`` when given pairs. Each image is copied once,
        straight into its slot (no per-image tensors, no ``torch.stack``).

    Raises:
        ConfigError: The batch is empty, or the images differ in size or are not RGB uint8.
    """
    import torch

    if len(items) == 0:
        raise ConfigError("collate needs at least one image")
    pairs = isinstance(items[0], tuple | list)
    images = [it[0] for it in items] if pairs else list(items)
    first = _chw_shape(images[0])
    batch = torch.empty((len(images), *first), dtype=torch.uint8)
    for i, img in enumerate(images):
        if _chw_shape(img) != first:
            raise ConfigError(
                f"image {i} is {tuple(img.shape)}, image 0 is {tuple(images[0].shape)}"
            )
        _write_slot(batch[i], img)
    if not pairs:
        return batch
    labels = torch.tensor([it[1] for it in items], dtype=torch.int64)
    return batch, labels


def _chw_shape(img: Any) -> tuple[int, int, int]:
    shape = tuple(img.shape)
    if len(shape) != 3 or 3 not in (shape[0], shape[2]):
        raise ConfigError(f"expected an H x W x 3 or 3 x H x W image, got shape {shape}")
    if str(img.dtype) not in ("uint8", "torch.uint8"):
        raise ConfigError(f"expected uint8 images, got {img.dtype}")
    return (3, shape[0], shape[1]) if shape[2] == 3 else (3, shape[1], shape[2])


def _write_slot(slot: torch.Tensor, img: Any) -> None:
    hwc = img.shape[2] == 3
    if isinstance(img, np.ndarray):  # read-only ones too, which torch refuses to wrap
        slot.numpy()[...] = img.transpose(2, 0, 1) if hwc else img
    else:
        slot.copy_(img.permute(2, 0, 1) if hwc else img)


def normalize(
    batch: torch.Tensor,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    *,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(batch / 255 - mean) / std`` for a uint8 ``N x 3 x H x W`` (or ``3 x H x W``) tensor.

    One conversion and two in-place operations with a precomputed per-channel scale and
    offset: ``x * (1 / (255 std)) + (-mean / std)``. Works on any device: normalizing on the
    GPU after copying the uint8 batch moves 4x fewer bytes.

    Args:
        batch: uint8 images, channels in dimension -3.
        mean, std: Per-channel statistics on a 0-1 scale (default: ImageNet's).
        dtype: A floating dtype for the result (default float32).
        out: A tensor of the batch's shape to write into instead of a new one.

    Returns:
        The normalized tensor (``out`` when given).

    Raises:
        ConfigError: ``batch`` is not uint8 with 3 channels in dimension -3, ``mean`` /
            ``std`` do not have one value per channel, ``dtype`` or ``out`` is not a
            floating type, or ``out`` is not of the batch's shape.
    """
    import torch

    if batch.dtype != torch.uint8 or batch.dim() < 3 or batch.shape[-3] != len(mean):
        raise ConfigError(
            f"normalize takes uint8 images with {len(mean)} channels in dimension -3, got "
            f"{batch.dtype} {tuple(batch.shape)}"
        )
    if len(std) != len(mean) or any(s <= 0 for s in std):
        raise ConfigError(f"std must hold {len(mean)} positive values, got {tuple(std)}")
    dtype = dtype or (out.dtype if out is not None else torch.float32)
    if not dtype.is_floating_point or (out is not None and not out.dtype.is_floating_point):
        raise ConfigError(f"normalize makes a floating dtype, got dtype={dtype}"
                          f"{'' if out is None else f', out of {out.dtype}'}")
    if out is not None and out.shape != batch.shape:
        raise ConfigError(f"out's shape {tuple(out.shape)} is not the batch's "
                          f"{tuple(batch.shape)}")
    scale, offset = _affine(tuple(mean), tuple(std), dtype, batch.device)
    if out is None:
        result = batch.to(dtype)
    else:
        result = out
        result.copy_(batch)
    return result.mul_(scale).add_(offset)


@functools.lru_cache(maxsize=32)
def _affine(
    mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    m = torch.tensor(mean, dtype=torch.float64)
    s = torch.tensor(std, dtype=torch.float64)
    scale = (1.0 / (255.0 * s)).view(-1, 1, 1).to(device=device, dtype=dtype)
    offset = (-m / s).view(-1, 1, 1).to(device=device, dtype=dtype)
    return scale, offset
