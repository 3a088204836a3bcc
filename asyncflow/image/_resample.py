"""Crop, resize and flip a batch of decoded pictures of different sizes in a few tensor ops.

The GPU decode path (``_gpu.py``) gets each picture whole, as the JPEG decoder made it: in
the file's stored orientation, at full size. This module turns a batch of them into the
``N x 3 x H x W`` rows that the CPU kernel (``_decode.py``) would have made from the same
files and crop boxes, with one set of batched kernels per group of pictures whatever their
sizes: no Python loop per picture, so the thread that runs it holds the GIL for about a
millisecond a batch.

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
   reach.
4. **Flip.** A flipped row reads its horizontal taps in reverse.

**Cost.** The work is one gather of the full-size pixels under each picture's region (the
block means need them all), then a few taps. The pictures are grouped by draft scale and
by region size, so that little padding is gathered, and each group's gather is bounded
(:data:`GATHER_BUDGET`): its index is ``int32`` (4 bytes a pixel) wherever the group's
pictures hold under 2**31 bytes, and the block means are one reduction over that gather.
Every small table a group needs (its pictures' offsets, taps and weights) reaches the device
in one copy from pinned memory that does not wait: a copy from pageable memory would
synchronize the stream, and the host would wait for the GPU at every table.

The pictures are read from one flat ``uint8`` buffer per group (``torch.cat`` of its decoded
pictures, planar ``3 x H x W`` or interleaved ``H x W x 3``). Works on any device; the CPU
tests compare it with the CPU kernel on the same boxes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ._decode import _scaled_box
from ._gpu_plan import Placement

__all__ = ["resample"]

#: Pictures resampled together at most.
CHUNK = 64
#: Full-size pixel values (3 a pixel) gathered at once for one group of pictures: with its
#: index, 5 bytes each (9 where the group holds 2**31 bytes or more), so about 320 MB.
GATHER_BUDGET = 64 * 2**20

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
        before it returns, and the host never waits for the device.
    """
    out_h, out_w = size
    device = images[0].device if images else torch.device("cpu")
    out = torch.empty((len(images), 3, out_h, out_w), dtype=torch.float32, device=device)
    groups = _groups(places, out_h, out_w)
    if len(groups) == 1 and groups[0] == list(range(len(images))):
        return _group(images, places, groups[0], out_h, out_w, layout)
    order = _to_device([np.concatenate(groups)], [], device)[0][0]
    done = 0
    for group in groups:
        values = _group(images, places, group, out_h, out_w, layout)
        out.index_copy_(0, order[done:done + len(group)], values)
        done += len(group)
    return out


def _groups(places: Sequence[Placement], out_h: int, out_w: int) -> list[list[int]]:
    """The pictures by group: one draft scale each, similar region sizes together, at most
    :data:`CHUNK` pictures and :data:`GATHER_BUDGET` values (a picture alone may exceed it)."""
    if not places:
        return []
    factors = np.array([p.factor for p in places], np.int64)
    boxes = np.array([p.box for p in places], np.float64)
    spans = np.stack([boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]], 1) / factors[:, None]
    # the region the taps reach: the box, plus the filter's support on each side
    pad = 2 * np.ceil(np.maximum(spans / np.array([out_h, out_w]), 1.0)) + 2
    extent = np.ceil(spans + pad).astype(np.int64)  # reduced (rows, cols), about
    order = np.lexsort((-extent.max(1), factors))
    groups: list[list[int]] = []
    rows = cols = 0
    for i in order.tolist():
        r, c = max(rows, _round(extent[i, 0])), max(cols, _round(extent[i, 1]))
        f = int(factors[i])
        group = groups[-1] if groups else None
        if (group is None or places[group[0]].factor != f or len(group) >= CHUNK
                or (len(group) + 1) * 3 * r * c * f * f > GATHER_BUDGET):
            groups.append([i])
            rows, cols = _round(extent[i, 0]), _round(extent[i, 1])
        else:
            group.append(i)
            rows, cols = r, c
    return groups


def _round(n: int) -> int:
    """Rounded up to 32, so that groups reuse the allocator's blocks of a few sizes."""
    return -(-int(n) // 32) * 32


def _group(
    images: Sequence[torch.Tensor], all_places: Sequence[Placement], group: list[int],
    out_h: int, out_w: int, layout: str,
) -> torch.Tensor:
    """One group's rows (see :func:`_groups`), in the group's order."""
    pictures = [images[i] for i in group]
    places = [all_places[i] for i in group]
    device = pictures[0].device
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
    rows = _round((ystart.max(1) + wy.shape[2] - top).max())
    cols = _round((xstart.max(1) + wx.shape[2] - left).max())
    sizes = np.array([picture.numel() for picture in pictures], np.int64)
    starts, offsets = _offsets(places, reduced, top, left, rows, cols, sizes, layout)
    (bases, down_rows, across_cols, ys, xs), (wys, wxs) = _to_device(
        [starts, *offsets, ystart - top[:, None], xstart - left[:, None]],
        [wy, wx], device)
    flat = torch.cat([picture.reshape(-1) for picture in pictures])
    region = _region(flat, bases, down_rows, across_cols, places[0].factor, rows, cols)
    # Horizontal pass first, rounded to 8 bits, as PIL's two-pass resampling.
    across = _taps(region, 3, xs, wxs, cols)
    across = across.add_(0.5).floor_().clamp_(0, 255)
    down = _taps(across, 2, ys, wys, rows)
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


def _offsets(
    places: Sequence[Placement], reduced: np.ndarray, top: np.ndarray, left: np.ndarray,
    rows: int, cols: int, sizes: np.ndarray, layout: str,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Where each full-size pixel under the region lies in the group's flat buffer, as three
    parts that add up: each picture's channel starts (``m x 3``), and the offsets that the
    region's rows (``m x rows*f``) and columns (``m x cols*f``) each add, ``f`` full-size
    lines for each reduced one (the rows and columns of its blocks).

    The upright reduced row ``u`` reads a stored row (orientations 1-4) or a stored column
    (5-8), and the column ``v`` the other; past the picture, the last is read again."""
    factor = places[0].factor
    heights = np.array([p.height for p in places], np.int64)
    widths = np.array([p.width for p in places], np.int64)
    maps = np.array([_MAPS.get(p.orientation, _MAPS[1]) for p in places], np.int64)
    stored_h, stored_w = -(-heights // factor), -(-widths // factor)  # reduced, as stored
    if layout == "chw":
        plane, row_step, col_step = heights * widths, widths, np.ones_like(widths)
    else:
        plane, row_step, col_step = np.ones_like(widths), widths * 3, np.full_like(widths, 3)
    starts = (np.concatenate(([0], np.cumsum(sizes)[:-1]))[:, None]
              + np.arange(3)[None, :] * plane[:, None])
    u = np.minimum(top[:, None] + np.arange(rows), reduced[:, 0:1] - 1)
    v = np.minimum(left[:, None] + np.arange(cols), reduced[:, 1:2] - 1)
    swaps = maps[:, 1] != 0  # the stored row follows v, the stored column u
    # each stored axis: (coefficient of u, of v, constant, last full-size line, step)
    row_axis = (maps[:, 0], maps[:, 1], maps[:, 2] * (stored_h - 1), heights - 1, row_step)
    col_axis = (maps[:, 3], maps[:, 4], maps[:, 5] * (stored_w - 1), widths - 1, col_step)
    blocks = np.arange(factor)

    def lines(x: np.ndarray, axis: tuple[np.ndarray, ...], coefficient: np.ndarray,
              pick: np.ndarray) -> np.ndarray:
        at = coefficient[:, None] * x + axis[2][:, None]  # the stored reduced line
        full = np.minimum(at[:, :, None] * factor + blocks, axis[3][:, None, None])
        return np.where(pick[:, None, None], full * axis[4][:, None, None], 0).reshape(len(x), -1)

    by_u = (lines(u, row_axis, row_axis[0], ~swaps) + lines(u, col_axis, col_axis[0], swaps))
    by_v = (lines(v, col_axis, col_axis[1], ~swaps) + lines(v, row_axis, row_axis[1], swaps))
    return starts, (by_u, by_v)


def _to_device(
    ints: Sequence[np.ndarray], floats: Sequence[np.ndarray], device: torch.device
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The arrays as tensors on ``device`` (int64 and float32): one copy for each kind,
    from pinned memory, that the host does not wait for (see the module docstring)."""

    def move(arrays: Sequence[np.ndarray], dtype: type[np.generic]) -> list[torch.Tensor]:
        if not arrays:
            return []
        host = torch.from_numpy(np.concatenate([np.ravel(a).astype(dtype) for a in arrays]))
        if device.type == "cuda":
            host = host.pin_memory()
        flat = host.to(device, non_blocking=True)
        out, at = [], 0
        for a in arrays:
            out.append(flat[at:at + a.size].view(a.shape))
            at += a.size
        return out

    return move(ints, np.int64), move(floats, np.float32)


def _region(
    flat: torch.Tensor, starts: torch.Tensor, by_rows: torch.Tensor, by_cols: torch.Tensor,
    factor: int, rows: int, cols: int,
) -> torch.Tensor:
    """``m x 3 x rows x cols`` float32: the reduced upright pictures' regions, each pixel the
    rounded mean of its ``f x f`` block of the stored picture (one gather, one reduction)."""
    m = len(starts)
    kind = torch.int32 if flat.numel() < 2**31 else torch.int64
    index = (starts.to(kind)[:, :, None, None] + by_rows.to(kind)[:, None, :, None]
             + by_cols.to(kind)[:, None, None, :])
    values = flat.index_select(0, index.view(-1))
    del index
    if factor == 1:
        return values.view(m, 3, rows, cols).to(torch.float32)
    blocks = values.view(m, 3, rows, factor, cols, factor).sum((3, 5), dtype=torch.int32)
    return blocks.to(torch.float32).div_(factor * factor).add_(0.5).floor_()


def _taps(
    src: torch.Tensor, dim: int, starts: torch.Tensor, taps: torch.Tensor, limit: int
) -> torch.Tensor:
    """Sum over each output pixel's taps along ``dim`` (3: across, 2: down) of ``src``."""
    n, _, h, w = src.shape
    out_len, ksize = taps.shape[1], taps.shape[2]
    shape = (n, 3, h, out_len) if dim == 3 else (n, 3, out_len, w)
    total = torch.zeros(shape, dtype=torch.float32, device=src.device)

    def spread(t: torch.Tensor) -> torch.Tensor:  # ``n x out_len`` as a view along ``dim``
        return t[:, None, None, :] if dim == 3 else t[:, None, :, None]

    for k in range(ksize):
        index = torch.clamp(starts + k, max=limit - 1)
        total.addcmul_(src.gather(dim, spread(index).expand(shape)), spread(taps[:, :, k]))
    return total
