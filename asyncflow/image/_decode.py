"""The decode kernel: bytes or a path in, an RGB uint8 array of the requested size out.

Pure, synchronous and thread-safe: no global state is read or written (PIL's
``LOAD_TRUNCATED_IMAGES`` stays ``False``), and PIL releases the GIL while it decodes and
resizes, so a thread pool scales it across cores.

One pass, cheapest first: the header gives the size and the EXIF orientation, from which the
whole crop is settled; a JPEG is then decoded with DCT-domain downscaling (``Image.draft``)
when the crop is at least twice the output, by simplejpeg where it is installed
(``_turbo.py``: the same libjpeg-turbo, less around it), by PIL otherwise; one ``resize``
call with a ``box`` crops and scales together; the small result is converted to RGB and
written once, into ``out`` when given (a slot of a batch buffer), mirrored on the way for a
training flip.

A JPEG is proved whole on the way (``_jpeg.py``): libjpeg pads a scan whose data ends early
with grey and only warns, and Pillow drops the warning.
"""

from __future__ import annotations

import functools
import io
import os
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from .._blob import Blob, check_max_bytes, describe_size, read_regular
from .._errors import ConfigError, DecodeError, check_int
from .._redact import redact_url
from ..pipeline.seeding import item_random
from . import _jpeg, _png, _turbo
from ._batch import IMAGENET_MEAN, IMAGENET_STD
from ._geometry import (
    Crop,
    centre_box,
    draft_request,
    orientation_op,
    random_resized_box,
    target_size,
)
from ._modes import Affine, Layout, affine, before_resize, write_rgb

__all__ = [
    "DEFAULT_MAX_BYTES", "DEFAULT_MAX_PIXELS", "Source", "augmentation", "check_pixels", "decode",
]

Source = bytes | bytearray | memoryview | str | os.PathLike[str]

#: PIL's own default limit (about 89.5 million pixels, a quarter GiB as RGBA).
DEFAULT_MAX_PIXELS = 89_478_485

#: The largest encoded image read or decoded (256 MiB): far above any real photograph, and
#: below what a few decoders at once can hold.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

_DRAFTABLE = frozenset({"JPEG", "MPO"})
_WHITE = (255, 255, 255)


def decode(
    src: Source,
    *,
    size: int | tuple[int, int] | None = None,
    resize: int | None = None,
    train: bool = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    seed: int | None = None,
    epoch: int = 0,
    index: int = 0,
    rng: random.Random | None = None,
    out: np.ndarray | None = None,
    layout: Layout = "hwc",
    normalize: bool = False,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    background: tuple[int, int, int] | None = _WHITE,
    name: str | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """Decode an image to RGB uint8, resized and cropped to ``size``.

    Args:
        src: The encoded bytes, or a path to read them from.
        size: Output ``height x width`` (an int: square). ``None`` keeps the full picture.
        resize: Evaluation only: scale the shorter side to this before the centre crop
            (the classic 256 for a 224 crop). ``None`` scales just enough to cover ``size``.
        train: ``False``: resize and centre-crop. ``True``: random-resized-crop (``scale``,
            ``ratio`` as torchvision's ``RandomResizedCrop``) and, if ``flip``, a horizontal
            flip with probability 1/2.
        seed, epoch, index: Fix the training randomness: the same triple always gives the
            same crop, in any thread and any order. ``seed=None`` draws fresh randomness.
        rng: A generator to draw from instead of ``seed``/``epoch``/``index``.
        out: An array to write into (``size`` x 3 for ``"hwc"``, 3 x ``size`` for ``"chw"``;
            uint8, or float32 with ``normalize``), for example a row of a batch buffer. A new
            one is made if omitted.
        layout: ``"hwc"`` (the default, as PIL and NumPy) or ``"chw"`` (as torch models).
        normalize: Return float32 ``(x / 255 - mean) / std`` instead of uint8, computed on
            the final write (cheaper than a separate pass over the image).
        mean, std: Per-channel statistics on a 0-1 scale for ``normalize`` (ImageNet's).
        max_pixels: Refuse pictures larger than this (decompression bombs), from the header
            alone, before any pixel is decoded.
        background: Colour (3 ints, 0-255) that transparent pixels are composited onto;
            ``None`` drops the alpha channel as ``PIL.Image.convert("RGB")`` does.
        name: How errors name the image when ``src`` is bytes (a path names itself, and so
            do the bytes ``read_bytes`` returns: they carry their URL).
        max_bytes: Refuse encoded data larger than this (default :data:`DEFAULT_MAX_BYTES`,
            256 MiB; ``None``: no limit): a path is checked before it is read, and only a
            regular file is read (not a FIFO, a device such as ``/dev/zero``, a socket).

    Returns:
        ``out``, or a new array: ``H x W x 3`` (or ``3 x H x W``), RGB, upright; uint8, or
        float32 with ``normalize``.

    Raises:
        DecodeError: The data is not a complete, decodable image of at most ``max_pixels``
            (truncated, empty, a bad PNG checksum, not an image; a JPEG whose scan data ends
            early, even with an end-of-image marker after it, or whose header claims more
            pixels than its data holds), or bytes over ``max_bytes``. The message names the
            image; ``out`` is left untouched, never half written.
        SourceError: ``src`` is a path that cannot be read (``SourceNotFound`` and
            ``SourcePermissionError`` for the usual two), is not a regular file, or holds
            more than ``max_bytes``.
        ConfigError: An argument is invalid.
    """
    dims = None if size is None else target_size(size)
    check_int("resize", resize, allow_none=True)
    check_int("max_pixels", max_pixels)
    if background is not None and (len(background) != 3 or not all(
            isinstance(c, int | np.integer) and not isinstance(c, bool) and 0 <= c <= 255
            for c in background)):
        raise ConfigError(f"background must be None or 3 ints from 0 to 255, got {background!r}")
    if layout not in ("hwc", "chw"):
        raise ConfigError(f"layout must be 'hwc' or 'chw', got {layout!r}")
    if train:
        _check_train(dims, scale, ratio)
    to_float = affine(tuple(mean), tuple(std)) if normalize else None
    label, data = _read(src, name, max_bytes=max_bytes)
    if train and rng is None:
        rng = random.Random() if seed is None else item_random(seed, epoch, index)
    try:
        return _decode(data, dims, resize, rng if train else None, scale, ratio, flip,
                       out, layout, to_float, max_pixels, background, label)
    except (DecodeError, ConfigError, MemoryError):
        raise
    except Exception as exc:
        raise DecodeError(f"cannot decode {label}: {_reason(exc)}") from exc


def augmentation(
    src: Source,
    *,
    size: int | tuple[int, int],
    resize: int | None = None,
    train: bool = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    seed: int | None = None,
    epoch: int = 0,
    index: int = 0,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    name: str | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Crop:
    """The crop and flip that :func:`decode` draws for this image and key, from its header.

    The same function decides them inside :func:`decode` (``_crop``), from the same
    ``item_random(seed, epoch, index)``, so the two cannot drift: this is how
    ``asyncflow.explain`` names the augmentation a batch held.

    Args:
        src, size, resize, train, scale, ratio, flip, seed, epoch, index, max_pixels, name:
            As for :func:`decode` (``seed`` is required with ``train``).
        max_bytes: As for :func:`decode`.

    Returns:
        ``Crop(box, flip)``: ``box`` is ``(left, top, right, bottom)`` in the upright
        picture's pixels (after its EXIF orientation), ``flip`` a horizontal mirror.

    Raises:
        DecodeError: The header cannot be read, or the picture is over ``max_pixels``.
        SourceError: ``src`` is a path that cannot be read.
        ConfigError: An argument is invalid (``train`` without a ``seed``).
    """
    dims = target_size(size)
    check_int("resize", resize, allow_none=True)
    check_int("max_pixels", max_pixels)
    if train:
        _check_train(dims, scale, ratio)
        if seed is None:
            raise ConfigError("augmentation(train=True) needs the seed the decoder used")
    label, data = _read(src, name, max_bytes=max_bytes)
    try:
        with Image.open(io.BytesIO(data)) as im:
            check_pixels(*im.size, max_pixels, label)
            size, orientation = im.size, _orientation(im)
    except (DecodeError, ConfigError):
        raise
    except Exception as exc:
        raise DecodeError(f"cannot decode {label}: {_reason(exc)}") from exc
    rng = item_random(seed, epoch, index) if train and seed is not None else None
    return _crop(size, orientation, dims, resize, rng, scale, ratio, flip)


def _check_train(
    dims: tuple[int, int] | None, scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    if dims is None:
        raise ConfigError("train=True needs a size to crop to")
    for name, pair, top in (("scale", scale, 1.0), ("ratio", ratio, float("inf"))):
        if not (isinstance(pair, Sequence) and len(pair) == 2 and all(  # not 0.5, nor NaN
                isinstance(v, int | float) for v in pair) and 0 < pair[0] <= pair[1] <= top):
            raise ConfigError(f"{name} must satisfy 0 < low <= high"
                              f"{' <= 1' if top == 1 else ''}, got {pair!r:.80}")


def _read(
    src: Source, name: str | None, *, max_bytes: int | None = DEFAULT_MAX_BYTES
) -> tuple[str, bytes | memoryview]:
    """``(label, data)``: how errors name ``src``, and its encoded bytes.

    The one way the image kernels take their input (a GPU decoder may call it too): bytes
    are used as they are (a :class:`~asyncflow._blob.Blob` from ``read_bytes`` is named by
    its URL); a path is read with :func:`~asyncflow._blob.read_regular`: regular files only,
    at most ``max_bytes``, and the open never blocks.

    Raises:
        DecodeError: ``src`` is bytes over ``max_bytes``.
        SourceError: ``src`` is a path that cannot be read, is not a regular file, or holds
            more than ``max_bytes`` (``SourceNotFound``, ``SourcePermissionError`` as usual).
        ConfigError: ``src`` is neither bytes nor a path, or ``max_bytes`` is not an int
            >= 0 or ``None``.

    Cancellation:
        Blocks for the read of a path (bounded by ``max_bytes``).
    """
    check_max_bytes(max_bytes)
    if isinstance(src, bytes | bytearray | memoryview):
        data = src if isinstance(src, bytes) else memoryview(src)
        if name is None and isinstance(src, Blob):
            name = redact_url(src.url)
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        label = name or f"<{size} bytes>"
        if max_bytes is not None and size > max_bytes:
            raise DecodeError(f"cannot decode {label}: {describe_size(size)}, over "
                              f"max_bytes={max_bytes:,}")
        return label, data
    if not isinstance(src, str | os.PathLike):
        raise ConfigError(f"expected bytes or a path, got {type(src).__name__}")
    label = name or os.fspath(src)
    return label, read_regular(src, label, max_bytes)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnidentifiedImageError):
        return "not an image in any format PIL reads"
    if isinstance(exc, Image.DecompressionBombError):  # PIL's limit holds whatever max_pixels
        return (f"DecompressionBombError: {exc} (PIL's own limit, 2 x "
                "PIL.Image.MAX_IMAGE_PIXELS: raise that too)")
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_pixels(width: int, height: int, max_pixels: int, label: str) -> None:
    """Raise ``DecodeError`` naming ``label`` for a picture over ``max_pixels`` pixels."""
    if width * height > max_pixels:
        raise DecodeError(
            f"cannot decode {label}: {width}x{height} is {width * height} pixels, over "
            f"the limit of {max_pixels} (max_pixels; a decompression bomb?)"
        )


def _decode(
    data: bytes | memoryview,
    dims: tuple[int, int] | None,
    resize: int | None,
    rng: random.Random | None,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
    out: np.ndarray | None,
    layout: Layout,
    affine: Affine | None,
    max_pixels: int,
    background: tuple[int, int, int] | None,
    label: str,
) -> np.ndarray:
    if len(data) == 0:
        raise DecodeError(f"cannot decode {label}: the file is empty (0 bytes)")
    with Image.open(io.BytesIO(data)) as im:
        check_pixels(*im.size, max_pixels, label)
        if im.format == "PNG":
            _png.check(data, label)
        scans = _jpeg.inspect(data, label) if im.format in _DRAFTABLE else None
        if scans is not None and im.format == "MPO":
            _jpeg.check_frames(im, scans, data, label)
        orientation = _orientation(im)
        op, swaps = orientation_op(orientation)
        crop = None if dims is None else _crop(im.size, orientation, dims, resize, rng, scale,
                                               ratio, flip)
        factor = 1
        if crop is not None and im.format in _DRAFTABLE:
            factor = _draft(im, crop.box, dims, swaps)  # type: ignore[arg-type]
        fast = _turbo.decode(data, im.mode, im.size, label) if im.format == "JPEG" else None
        if fast is None and scans is not None:
            _jpeg.load(im, scans, data, label)
        elif fast is None:
            im.load()
            if im.format == "PNG":
                _png.check_rows(im, data, label)
        pic: Image.Image = im if fast is None else fast
        pic = before_resize(pic if op is None else pic.transpose(op))
        if crop is not None:
            assert dims is not None
            box = _scaled_box(crop.box, factor, pic.size)
            pic = pic.resize((dims[1], dims[0]), Image.Resampling.BILINEAR, box=box)
        shape = (pic.size[1], pic.size[0])
        target = _output(out, shape, layout, np.float32 if affine is not None else np.uint8)
        write_rgb(pic, target, layout=layout, flip=crop is not None and crop.flip,
                  background=background, affine=affine)
        return target


def _orientation(im: Image.Image) -> int:
    if im.format == "TIFF" and _tiff_loads_upright():
        return 1  # PIL turns it upright as it loads, and gives its size upright
    try:
        value = im.getexif().get(0x0112, 1)
    except Exception:  # a damaged EXIF block does not make the picture undecodable
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


@functools.cache
def _tiff_loads_upright() -> bool:
    """Whether PIL applies a TIFF's orientation tag itself (newer Pillow does, in ``load_end``)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.new("L", (2, 1)).save(buf, "TIFF", exif=exif)
    with Image.open(buf) as im:
        return im.size == (1, 2)


def _crop(
    size: tuple[int, int],
    orientation: int,
    dims: tuple[int, int],
    resize: int | None,
    rng: random.Random | None,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
) -> Crop:
    """The crop drawn for a picture stored at ``size`` (``(width, height)``) in this EXIF
    ``orientation``: its box in the upright picture, and whether it is mirrored. The one
    place the kernel, :func:`augmentation` and the GPU path's readers settle a crop."""
    width, height = (size[1], size[0]) if orientation_op(orientation)[1] else size
    if rng is None:
        return Crop(centre_box(width, height, dims[0], dims[1], resize), False)
    box = random_resized_box(rng, width, height, scale, ratio)
    return Crop(box, flip and rng.random() < 0.5)


def _draft(im: Any, box: Sequence[float], dims: tuple[int, int], swaps: bool) -> int:
    """Ask for DCT-domain downscaling; return the scale the decoder will apply (1, 2, 4, 8)."""
    request = draft_request(im.size, box, dims, swaps=swaps)
    if request is None or im.draft(im.mode, request) is None:
        return 1
    return int(im.decoderconfig[0])


def _scaled_box(
    box: tuple[float, float, float, float], factor: int, size: tuple[int, int]
) -> tuple[float, float, float, float]:
    if factor != 1:
        box = (box[0] / factor, box[1] / factor, box[2] / factor, box[3] / factor)
    w, h = size
    return (min(max(0.0, box[0]), w), min(max(0.0, box[1]), h), min(box[2], w), min(box[3], h))


def _output(
    out: np.ndarray | None, shape: tuple[int, int], layout: Layout, dtype: type[np.generic]
) -> np.ndarray:
    want = (*shape, 3) if layout == "hwc" else (3, *shape)
    if out is None:
        return np.empty(want, dtype)
    if out.shape != want or out.dtype != dtype:
        raise ConfigError(
            f"out must be a {np.dtype(dtype).name} array of shape {want}, got {out.dtype} "
            f"{out.shape}"
        )
    return out
