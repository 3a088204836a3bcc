"""``image.decode_batches``: the GPU decode path for images that arrive as bytes (HTTP, S3, tar
shards, anything), as a stage of any pipeline.

::

    blobs = Pipeline(urls).map(read_bytes, concurrency=256, ordered=False)
    batches = image.decode_batches(blobs, batch_size=256, size=224, device="cuda", train=True)

appends three stages: ``decode`` (readers: parse, prove whole, settle each crop, or decode on the
CPU what the GPU decoders do not take, as ``image.folder``'s readers do), ``batch``, and the GPU
stage (``_gpu.py``) that decodes each batch on the device. Without a GPU decoder
(``decode="auto"`` on a machine without one, or ``decode="cpu"``), every image is decoded by
the CPU kernel and the batch is only stacked, normalized and moved on the last stage.

A training crop is keyed by ``(seed, epoch 0, a hash of the item's name)``: the object's URL
for bytes from ``read_bytes``, so each object gets the same crop wherever it comes in the
stream; ``seed=None`` draws fresh crops each time.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from .._errors import check_int
from ..pipeline import Pipeline, feature
from ._batch import IMAGENET_MEAN, IMAGENET_STD
from ._config import decode_path
from ._decode import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS
from ._geometry import target_size
from ._gpu import Pending, gpu_stage
from ._gpu_plan import plan

__all__ = ["decode_batches"]


class _PlanItem:
    """The ``decode`` stage's function: one item (bytes, or ``(bytes, label)``) planned."""

    def __init__(self, seed: int | None, options: dict[str, Any], gpu: bool) -> None:
        self.seed, self.options, self.gpu = seed, options, gpu
        self.__name__ = "decode"

    def __call__(self, item: Any) -> tuple[Any, int]:
        data, label = item if isinstance(item, tuple) else (item, -1)
        url = getattr(data, "url", None)
        key = zlib.crc32(str(url).encode()) if url is not None else zlib.crc32(bytes(data))
        seed = self.seed if self.seed is not None else random.getrandbits(63)
        # Errors name a Blob by its URL redacted (the kernel's reader), never by ``url``.
        payload = plan(data, seed=seed, epoch=0, index=key, gpu=self.gpu, **self.options)
        return payload, int(label)


def _pending(rows: list[tuple[Any, int]]) -> tuple[Pending, torch.Tensor]:
    labels = torch.tensor([label for _, label in rows], dtype=torch.int64)
    payloads = [payload for payload, _ in rows]
    return Pending(payloads, labels, list(range(len(rows)))), labels


class _NoDecoder:
    """The GPU stage's decoder when every row was decoded on the CPU."""

    name = "the CPU kernel"
    layout = "chw"
    takes_gray = False

    def decode(self, data: Sequence[bytearray]) -> list[torch.Tensor]:
        raise RuntimeError("no GPU decoder: every row is decoded on the CPU")


def decode_batches(
    pipe: Pipeline[Any],
    *,
    batch_size: int,
    size: int | tuple[int, int],
    device: Any = "cuda",
    decode: str = "auto",
    train: bool = False,
    seed: int | None = None,
    resize: int | None = None,
    normalize: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    concurrency: int = 8,
    drop_last: bool = False,
    max_failures: int | float = 0,
) -> Pipeline[tuple[torch.Tensor, torch.Tensor]]:
    """``pipe``'s encoded images as batches of ``(images, labels)`` made on ``device``.

    Args:
        pipe: A pipeline of encoded images: ``bytes`` (a ``Blob`` from
            :func:`~asyncflow.read_bytes` names its URL in errors and keys its crop), or
            ``(bytes, label)`` pairs (labels ``-1`` for bare bytes).
        batch_size: Images per batch.
        size: Output size (an int: square; or ``(height, width)``).
        train: Random-resized-crop and flip (as :func:`asyncflow.image.folder`'s), else
            resize and centre-crop.
        seed: Keys the training crops with each item's name; ``None``: fresh crops.
        resize: Evaluation: shorter side before the centre crop.
        normalize: Float32 normalized by ``mean`` and ``std``; ``False``: uint8.
        mean: Per-channel means on a 0-1 scale (ImageNet's).
        std: Per-channel standard deviations on a 0-1 scale (ImageNet's).
        max_pixels: Refuse images larger than this (decompression bombs).
        max_bytes: Refuse encoded images larger than this.
        drop_last: Drop a last batch smaller than ``batch_size``.
        device: Where batches are made (``"cuda"``; ``"cpu"`` decodes on the CPU).
        decode: ``"auto"``, ``"cuda"`` or ``"cpu"``, as for :func:`asyncflow.image.folder`.
        concurrency: Readers (threads) that parse, prove and plan each image.
        max_failures: Images that may fail (named errors, counted by the ``decode`` stage)
            before the run fails.

    Returns:
        A pipeline of ``(images, labels)``: ``N x 3 x H x W`` float32 (uint8 without
        ``normalize``) on ``device``, int64 labels. Keep it last, as ``to_device``.

    Raises:
        ConfigError: An argument is invalid, or ``decode="cuda"`` cannot be (it says why).
    """
    out_h, out_w = target_size(size)
    check_int("batch_size", batch_size)
    check_int("resize", resize, allow_none=True)
    check_int("max_pixels", max_pixels)
    dev, decoder, note = decode_path(decode, device)
    if dev is None:
        dev = feature("resolve_device")("cpu" if device is None else device)
    options = {"size": (out_h, out_w), "train": train, "resize": resize,
               "max_pixels": max_pixels, "max_bytes": max_bytes}
    stage_options = {**options, "normalize": normalize, "mean": tuple(mean),
                     "std": tuple(std)}
    gray = getattr(decoder, "takes_gray", True)  # else gray JPEGs decode on the CPU
    planned = pipe.map(_PlanItem(seed, {**options, "gray": gray}, gpu=decoder is not None),
                       concurrency=concurrency, ordered=True, name="decode",
                       max_failures=max_failures)
    batches = planned.batch(batch_size, drop_last=drop_last).map(_pending, name="rows")
    spec = gpu_stage(dev, decoder if decoder is not None else _NoDecoder(), stage_options,
                     seed if seed is not None else 0, None)
    out = batches.with_stage(spec)
    return out.with_options(notes=(*out.options.notes, note))  # type: ignore[return-value]
