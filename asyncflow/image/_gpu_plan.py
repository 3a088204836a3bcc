"""The GPU decode path's CPU side, torch-free (it also runs in worker processes): read each
file, settle its crop, and route it.

For each image, on the read workers (``image.folder``'s ``decode`` stage under
``decode="cuda"``; threads, or processes that never import torch):

1. the file is read whole (the CPU kernel's reader, with its checks and errors);
2. its header is parsed: size, EXIF orientation, and the JPEG's marker walk
   (``_jpeg.inspect``), which refuses a damaged file as the CPU kernel does;
3. the crop box and flip are drawn by the CPU kernel's own function (``_decode._crop``) from
   ``item_random(seed, epoch, item)``, and the draft scale by its ``_draft``;
4. a JPEG that the GPU decoders take (baseline Huffman, 8-bit, YCbCr or gray) leaves as an
   :class:`Encoded` row; anything else (PNG, CMYK, progressive, arithmetic-coded, ...) is
   decoded there by the CPU kernel, to the same ``3 x H x W`` uint8 row the CPU path makes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from ..pipeline import ItemGroup
from ..pipeline.seeding import item_random
from . import _jpeg
from ._decode import DEFAULT_MAX_BYTES, _crop, _orientation, _read, check_pixels, decode
from ._geometry import draft_request, orientation_op, target_size
from ._rows import Claimed, Failed, Ticket

__all__ = ["Encoded", "Payload", "Placement", "PlanClaimed", "Planned", "plan"]

_SCALE = (0.08, 1.0)
_RATIO = (3 / 4, 4 / 3)
#: Frames the GPU decoders take: baseline and extended sequential, Huffman-coded.
_GPU_FRAMES = frozenset({0xC0, 0xC1})


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one output row comes from.

    Attributes:
        height, width: The decoded picture's size, as stored (before its orientation).
        orientation: Its EXIF orientation (1-8; 1 is upright).
        factor: The draft scale the CPU kernel decodes it at (1, 2, 4 or 8).
        box: The crop ``(left, top, right, bottom)`` in the upright full-size picture.
        flip: Mirror the row horizontally.
    """

    height: int
    width: int
    orientation: int
    factor: int
    box: tuple[float, float, float, float]
    flip: bool

    def reduced(self) -> tuple[int, int]:
        """The upright picture's ``(height, width)`` at the draft scale."""
        h, w = -(-self.height // self.factor), -(-self.width // self.factor)
        return (w, h) if orientation_op(self.orientation)[1] else (h, w)


class Encoded(NamedTuple):
    """A JPEG for the GPU decoder, with where its row comes from."""

    data: bytearray
    place: Placement
    name: str
    epoch: int  # with the item: the key of its crop, for a CPU fallback
    item: int

    def __repr__(self) -> str:
        return f"Encoded({self.name!r})"


#: An ndarray: a 3 x H x W uint8 row, decoded on the CPU; a Failed: a row that failed there.
Payload = Encoded | np.ndarray | Failed


class Planned(NamedTuple):
    """A row on its way to the assembler: its ticket and its payload."""

    ticket: Ticket
    payload: Payload


def plan(
    src: Any, *, size: tuple[int, int], train: bool, resize: int | None, max_pixels: int,
    seed: int, epoch: int, index: int, gpu: bool = True, name: str | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES, gray: bool = True,
) -> Payload:
    """Read and route one image: an :class:`Encoded` JPEG for the GPU decoder (``gpu``; a
    gray one only if ``gray``, the decoder's ``takes_gray``), or its row decoded on the CPU,
    exactly as ``decode(..., layout="chw")`` makes it.

    Raises:
        DecodeError: The file is not a decodable image (the CPU kernel's checks and message).
        SourceError: The file cannot be read.

    Cancellation:
        Synchronous (a read thread's work); not interruptible.
    """
    dims = target_size(size)
    label, data = _read(src, name, max_bytes=max_bytes)
    if gpu and len(data) > 0:
        encoded = _gpu_jpeg(data, label, dims, train, resize, max_pixels, seed, epoch, index,
                            gray)
        if encoded is not None:
            return encoded
    row: np.ndarray = decode(data, size=dims, train=train, resize=resize, seed=seed,
                             epoch=epoch, index=index, layout="chw", max_pixels=max_pixels,
                             name=label, max_bytes=max_bytes)
    return row


def _gpu_jpeg(
    data: bytes | memoryview, label: str, dims: tuple[int, int], train: bool,
    resize: int | None, max_pixels: int, seed: int, epoch: int, index: int, gray: bool,
) -> Encoded | None:
    """The :class:`Encoded` row of a JPEG the GPU decoders take; ``None`` for any other
    image (the CPU kernel decodes it, and gives its own errors)."""
    try:
        im = Image.open(io.BytesIO(data))
    except Exception:
        return None
    with im:
        if im.format != "JPEG" or im.mode not in ("RGB", "L") or (im.mode == "L" and not gray):
            return None
        if im.info.get("adobe_transform") == 0 and im.mode == "RGB":
            return None  # RGB stored without the YCbCr transform
        width, height = im.size
        check_pixels(width, height, max_pixels, label)
        layout = _jpeg.inspect(data, label)
        if not layout.single_scan or layout.sof not in _GPU_FRAMES:
            return None
        orientation = _orientation(im)
        rng = item_random(seed, epoch, index) if train else None
        crop = _crop(im.size, orientation, dims, resize, rng, _SCALE, _RATIO, True)
        factor = _draft_factor(im.size, crop.box, dims, orientation_op(orientation)[1])
        # The proof that the scan data is whole (the GPU decoders, as libjpeg, decode data
        # that ends early to grey without a word): the CPU kernel's, at 1/8 scale, where
        # the entropy decoding is nearly all the work (about a third of a full decode).
        im.draft(im.mode, (-(-width // 8), -(-height // 8)))
        _jpeg.load(im, layout, data, label)
    place = Placement(height, width, orientation, factor, crop.box, crop.flip)
    return Encoded(bytearray(data), place, label, epoch, index)


def _draft_factor(
    raw: tuple[int, int], box: tuple[float, float, float, float], dims: tuple[int, int],
    swaps: bool,
) -> int:
    """The DCT scale the CPU kernel's ``Image.draft`` picks for this crop (``_decode._draft``),
    computed as PIL does, without drafting the image."""
    request = draft_request(raw, box, dims, swaps=swaps)
    if request is None:
        return 1
    scale = min(raw[0] // request[0], raw[1] // request[1])
    return next(s for s in (8, 4, 2, 1) if scale >= s)


class PlanClaimed:
    """The ``decode`` stage's function under ``decode="cuda"``: plan each claimed item (in a
    worker process, or on the read threads). Failures are returned as rows, as on the CPU
    path."""

    def __init__(self, seed: int, options: dict[str, Any]) -> None:
        self.seed = seed
        keys = ("size", "train", "resize", "max_pixels", "max_bytes", "gray")
        self.options = {k: options[k] for k in keys if k in options}
        self.__name__ = "decode"

    def __call__(self, items: Iterable[Claimed]) -> ItemGroup:
        return ItemGroup(self._one(item) for item in items)

    def _one(self, item: Claimed) -> Planned | Failed:
        try:
            payload = plan(item.path, seed=self.seed, epoch=item.epoch, index=item.sample,
                           **self.options)
        except Exception as exc:
            return Failed(item.path, exc, item.ticket)
        return Planned(item.ticket, payload)
