"""Crop, resize and flip a batch of decoded pictures of different sizes in a few tensor ops.

The GPU decode path (``_gpu.py``) gets each picture whole, as the JPEG decoder made it: in
the file's stored orientation, at full size. This module turns a batch of them into the
``N x 3 x H x W`` rows that the CPU kernel (``_decode.py``) would have made from the same
files and crop boxes, with one set of batched kernels whatever the pictures' sizes: no Python
loop per picture, so the thread that runs it holds the GIL for about a millisecond a batch.

It follows the CPU kernel step by step:

1. **Draft scale.** Where the crop is at least twice the output, the CPU kernel decodes with
   libjpeg's DCT scaling at 1/2, 1/4 or 1/8 (``Image.draft``). Here each output pixel of
   that reduced picture is the mean of its ``f x f`` block of the full one, blocks aligned on
   the stored picture's origin as libjpeg's are, rounded to 8 bits.
2. **Orientation.** The EXIF orientation is applied by reading the stored picture through the
   transposition (an index map), so the crop box is in the upright picture, as on the CPU.
3. **Resize.** PIL's own two-pass resampling: its bilinear filter widened by the scale when
   reducing (antialiased), the same tap positions, weights and rounding, horizontal pass first
   with the intermediate rounded to 8 bits, on the region of the reduced picture that the taps
   reach (gathered from a flat buffer of every picture, so the regions of one batch share one
   padded tensor).
4. **Flip.** A flipped row reads its horizontal taps in reverse.

The pictures are read from one flat ``uint8`` buffer (``torch.cat`` of every decoded picture,
planar ``3 x H x W`` or interleaved ``H x W x 3``). Works on any device; the CPU tests compare
it with the CPU kernel on the same boxes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ._decode import _scaled_box
from ._gpu_plan import Placement

__all__ = ["resample"]

#: Pictures resampled together: bounds the index and region tensors of one pass
#: (about 40 MB of indices for 64 regions of 450 x 450).
CHUNK = 64

# (p, q) in the stored picture, as coefficients of the upright (u, v) and the constants
# (last row, last column): p = pu * u + pv * v + ph * (H - 1), and likewise q.
# The same transpositions as PIL.ImageOps.exif_transpose (see _geometry._ORIENTATION).
_MAPS: dict[int, tuple[int, int, int, int, int, int]] = {
    1: (1, 0, 0, 0, 1, 0),
    2: (1, 0, 0, 0, -1, 1),
    3: (-1, 0, 1, 0, -1, 1),
    4: (-1, 0, 1, 0, 1, 0),
    5: (0, 1, 0, 1, 0, 0),
    6: (0, -1, 1, 1, 0, 0),
    7: (0, -1, 1, -1, 0, 1),
    8: (0, 1, 0, -1, 0, 1),
}


def resample(
    images: Sequence[torch.Tensor], places: Sequence[Placement], size: tuple[int, int],
    *, layout: str = "chw",
) -> torch.Tensor:
    """Crop, resize and flip each picture into one ``N x 3 x H x W`` float32 batch of 8-bit
    values (whole numbers from 0 to 255), on the pictures' device.

    Args:
        images: Decoded pictures, ``uint8``, each ``3 x h x w`` (``layout="chw"``) or
            ``h x w x 3`` (``"hwc"``), contiguous, all on one device.
        places: Each picture's :class:`Placement` (its ``height`` and ``width`` must match).
        size: The output's ``(height, width)``.
        layout: How the pictures' channels are stored.

    Returns:
        The batch, in the order of ``images``.

    Cancellation:
        Not a coroutine: the kernels are queued on the current CUDA stream (on the CPU, run)
        before it returns.
    """
    out_h, out_w = size
    device = images[0].device if images else torch.device("cpu")
    out = torch.empty((len(images), 3, out_h, out_w), dtype=torch.float32, device=device)
    for lo in range(0, len(images), CHUNK):
        hi = min(lo + CHUNK, len(images))
        out[lo:hi] = _chunk(images[lo:hi], places[lo:hi], out_h, out_w, layout)
    return out


def _chunk(
    images: Sequence[torch.Tensor], places: Sequence[Placement], out_h: int, out_w: int,
    layout: str,
) -> torch.Tensor:
    device = images[0].device
    flat = torch.cat([image.reshape(-1) for image in images])
    sizes = np.array([image.numel() for image in images], np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    reduced = np.array([p.reduced() for p in places], np.int64)  # upright (h, w) per row
    # the box in the reduced upright picture, clamped to it, as the CPU kernel's
    boxes = np.array([_scaled_box(p.box, p.factor, p.reduced()[::-1]) for p in places],
                     np.float64)
    ystart, wy = _coefficients(reduced[:, 0], boxes[:, 1], boxes[:, 3], out_h)
    xstart, wx = _coefficients(reduced[:, 1], boxes[:, 0], boxes[:, 2], out_w)
    flips = np.array([p.flip for p in places])
    xstart[flips], wx[flips] = xstart[flips, ::-1], wx[flips, ::-1]
    # The region of the reduced upright picture that the taps reach.
    top, left = ystart.min(1), xstart.min(1)
    # (rounded up, so that batches reuse the allocator's blocks of a few sizes)
    rows = -(-int((ystart.max(1) + wy.shape[2] - top).max()) // 32) * 32
    cols = -(-int((xstart.max(1) + wx.shape[2] - left).max()) // 32) * 32
    region = _region(flat, offsets, places, reduced, top, left, rows, cols, layout, device)
    # Horizontal pass first, rounded to 8 bits, as PIL's two-pass resampling.
    across = _taps(region, 3, xstart - left[:, None], wx, cols, device)
    across = across.add_(0.5).floor_().clamp_(0, 255)
    down = _taps(across, 2, ystart - top[:, None], wy, rows, device)
    return down.add_(0.5).floor_().clamp_(0, 255)


def _coefficients(
    in_size: np.ndarray, in0: np.ndarray, in1: np.ndarray, out: int
) -> tuple[np.ndarray, np.ndarray]:
    """PIL's ``precompute_coeffs`` for the bilinear filter, for every row of a batch at once:
    the first input index of each output pixel's taps, and the taps' normalized weights
    (``N x out x K``, zero past each pixel's own count)."""
    scale = (in1 - in0) / out
    filterscale = np.maximum(scale, 1.0)
    support = filterscale  # the bilinear filter's support is 1, widened when reducing
    ksize = math.ceil(float(support.max())) * 2 + 1
    center = in0[:, None] + (np.arange(out) + 0.5) * scale[:, None]
    # C's (int) truncates toward zero
    xmin = np.maximum(np.trunc(center - support[:, None] + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support[:, None] + 0.5), in_size[:, None]).astype(np.int64)
    k = np.arange(ksize)
    x = k[None, None, :] + xmin[:, :, None] - center[:, :, None] + 0.5
    x /= filterscale[:, None, None]
    weights = np.maximum(0.0, 1.0 - np.abs(x))
    weights[k[None, None, :] >= (xmax - xmin)[:, :, None]] = 0.0
    total = weights.sum(2, keepdims=True)
    np.divide(weights, total, out=weights, where=total != 0)
    return xmin, weights


def _region(
    flat: torch.Tensor, offsets: np.ndarray, places: Sequence[Placement], reduced: np.ndarray,
    top: np.ndarray, left: np.ndarray, rows: int, cols: int, layout: str, device: torch.device,
) -> torch.Tensor:
    """``N x 3 x rows x cols`` float32: the reduced upright pictures from ``(top, left)``,
    each pixel the rounded mean of its ``f x f`` block of the stored picture."""
    n = len(places)
    heights = np.array([p.height for p in places], np.int64)
    widths = np.array([p.width for p in places], np.int64)
    factors = np.array([p.factor for p in places], np.int64)
    maps = np.array([_MAPS.get(p.orientation, _MAPS[1]) for p in places], np.int64)
    stored_h, stored_w = -(-heights // factors), -(-widths // factors)  # reduced, as stored
    if layout == "chw":
        plane, row_step, px = heights * widths, widths, np.ones(n, np.int64)
    else:
        plane, row_step, px = np.ones(n, np.int64), widths * 3, np.full(n, 3, np.int64)
    # upright reduced coordinates of the region, clamped into each picture
    u = np.minimum(top[:, None] + np.arange(rows), reduced[:, 0:1] - 1)
    v = np.minimum(left[:, None] + np.arange(cols), reduced[:, 1:2] - 1)

    def stored(a: np.ndarray, b: np.ndarray, c: np.ndarray, last: np.ndarray) -> torch.Tensor:
        # a * u + b * v + c * last, as an N x rows x cols tensor made on the device (only
        # the N x rows and N x cols parts cross the bus)
        rows_part = torch.from_numpy(a[:, None] * u + c[:, None] * last[:, None]).to(device)
        cols_part = torch.from_numpy(b[:, None] * v).to(device)
        return rows_part[:, :, None] + cols_part[:, None, :]

    p = stored(maps[:, 0], maps[:, 1], maps[:, 2], stored_h - 1)
    q = stored(maps[:, 3], maps[:, 4], maps[:, 5], stored_w - 1)
    region = torch.zeros((n, 3, rows, cols), dtype=torch.float32, device=device)
    for factor in sorted(set(factors.tolist())):
        sel = np.flatnonzero(factors == factor)
        at = torch.from_numpy(sel).to(device)
        block = _block_mean(flat, p[at], q[at], factor, offsets[sel], heights[sel],
                            widths[sel], plane[sel], row_step[sel], px[sel], device)
        region[at] = block
    return region


def _block_mean(
    flat: torch.Tensor, p: torch.Tensor, q: torch.Tensor, factor: int, offsets: np.ndarray,
    heights: np.ndarray, widths: np.ndarray, plane: np.ndarray, row_step: np.ndarray,
    px: np.ndarray, device: torch.device,
) -> torch.Tensor:
    def column(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(values).to(device)[:, None, None]

    last_row, last_col = column(heights - 1), column(widths - 1)
    base, rstep, cstep, cplane = column(offsets), column(row_step), column(px), column(plane)
    total = torch.zeros((len(offsets), 3, *p.shape[1:]), dtype=torch.float32, device=device)
    for a in range(factor):
        row = torch.clamp(p * factor + a, max=last_row) * rstep + base
        for b in range(factor):
            index = row + torch.clamp(q * factor + b, max=last_col) * cstep
            for channel in range(3):
                total[:, channel] += flat[index + channel * cplane]
    if factor == 1:
        return total
    return total.div_(factor * factor).add_(0.5).floor_()


def _taps(
    src: torch.Tensor, dim: int, start: np.ndarray, weights: np.ndarray, limit: int,
    device: torch.device,
) -> torch.Tensor:
    """Sum over each output pixel's taps along ``dim`` (3: across, 2: down) of ``src``."""
    n, _, h, w = src.shape
    out_len, ksize = weights.shape[1], weights.shape[2]
    starts = torch.from_numpy(start).to(device)
    taps = torch.from_numpy(weights.astype(np.float32)).to(device)
    shape = (n, 3, h, out_len) if dim == 3 else (n, 3, out_len, w)
    total = torch.zeros(shape, dtype=torch.float32, device=device)
    for k in range(ksize):
        index = torch.clamp(starts + k, max=limit - 1)
        weight = taps[:, :, k]
        if dim == 3:
            gathered = src.gather(3, index[:, None, None, :].expand(shape))
            total.addcmul_(gathered, weight[:, None, None, :])
        else:
            gathered = src.gather(2, index[:, None, :, None].expand(shape))
            total.addcmul_(gathered, weight[:, None, :, None])
    return total
