"""Proof that a JPEG's entropy-coded data is whole, for the decode kernel.

libjpeg treats data that runs out inside a scan as a warning: it pads the scan with zero bits
and carries on, so a file cut short with an end-of-image marker appended, or whose header
claims a larger picture than its data holds, decodes to grey rows (or, in a progressive file,
to blurred ones). Pillow drops libjpeg's warnings, so they cannot be read back. Two checks
stand in for them, both without a second decode:

* ``inspect`` walks the marker segments (the header is parsed in Python; each scan's
  entropy-coded data is skipped by one regular-expression search) and refuses what the
  structure alone gives away: a segment cut short, no frame or no scan, a scan with fewer
  restart markers than its restart interval requires, a scan too short to code one bit per
  block, and a progressive file whose scans do not bring every coefficient to full precision.
* ``load`` replaces ``Image.load``. It feeds the decoder the file up to the end of the last
  scan's data, then bytes that are not a marker instead of the end-of-image marker. A
  decoder that has all the data it needs never asks for those bytes (past the few it reads
  ahead), so it finishes, or waits for a marker having discarded them all; one whose data
  ran out decodes them as data, runs out of them too and suspends holding bytes it could
  not use. Only a cut inside the last ~1-2 blocks of the picture can be completed by them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from PIL import Image

from .._errors import DecodeError

__all__ = ["Layout", "check_frames", "inspect", "load"]

#: A marker that ends an entropy-coded segment: 0xFF followed by anything but a stuffed zero
#: or a restart marker (fill bytes, 0xFF 0xFF, end it too; the walk skips them).
_END = re.compile(rb"\xff[^\x00\xd0-\xd7]")
_RESTART = re.compile(rb"\xff[\xd0-\xd7]")
#: Stands in for the end-of-image marker: no 0xFF, so no marker. libjpeg-turbo refills its
#: 64-bit bit buffer to 57 bits only when a code needs more than it holds, so it reads at most
#: 8 bytes past the byte that holds the last bit it needs: 8 bytes of read-ahead, no more, so
#: that a short scan has as few stand-in bits as possible to decode. 0xFE decodes to long
#: codes in any table (canonical codes that start with ones are the long ones).
_PAD = b"\xfe" * 8
_EOI = b"\xff\xd9"

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_LOSSLESS = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
_ARITHMETIC = frozenset({0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PARAMETERLESS = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})
_ALL_COEFFICIENTS = (1 << 64) - 1


@dataclass(frozen=True)
class _Scan:
    components: tuple[int, ...]  # indices into the frame's components
    ss: int
    se: int
    al: int  # the point transform: 0 once a coefficient band is at full precision
    size: int  # bytes of entropy-coded data, restart markers included
    restarts: int
    interval: int


@dataclass(frozen=True)
class Layout:
    """What ``inspect`` learnt: where the last scan's data ends, and whether the decoder
    writes rows as it reads (one scan holding every component) or only after the last scan."""

    end: int
    single_scan: bool
    mpf: int = -1  # where an MPO's offsets start, -1 if none
    sof: int = 0xC0  # the frame's marker: 0xC0 baseline, 0xC2 progressive, ...


def inspect(data: bytes | memoryview, label: str) -> Layout:
    """Walk the marker segments of a JPEG (the first picture of an MPO) and check its shape.

    Raises:
        DecodeError: A segment is cut short, there is no frame or scan, or a scan cannot
            hold the picture the frame declares (see the module docstring).
    """
    n = len(data)
    pos, sof, frame, interval, mpf, eoi = 2, 0, None, 0, -1, False
    scans: list[_Scan] = []
    end = n
    while pos < n:
        if data[pos] != 0xFF:  # junk between segments, which libjpeg skips as well
            pos += 1
            continue
        if pos + 1 >= n:
            break
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0xD9:
            eoi = True
            break
        if marker in _PARAMETERLESS:
            pos += 2
            continue
        if pos + 4 > n:
            raise _damaged(label, "the file ends inside a marker")
        body, stop = pos + 4, pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if stop < body or stop > n:
            raise _damaged(label, f"the marker segment at byte {pos} runs past the end")
        if marker in _SOF:
            sof, frame = marker, _frame(data[body:stop], label)
        elif marker == 0xE2 and bytes(data[body : body + 4]) == b"MPF\x00":
            mpf = body + 4  # MPO offsets count from here
        elif marker == 0xDD and stop - body >= 2:
            interval = int.from_bytes(data[body : body + 2], "big")
        elif marker == 0xDA:
            if frame is None:
                raise _damaged(label, "a scan comes before the frame header")
            found = _END.search(data, stop)
            end = found.start() if found else n
            while end > stop and data[end - 1] == 0xFF:  # half of a marker, cut off
                end -= 1
            scans.append(_scan(data, body, stop, end, interval, frame[2], label))
            pos = end
            continue
        pos = stop
    if frame is None or not scans:
        raise _damaged(label, "no frame header" if frame is None else "no scan data")
    _check_scans(sof, frame, scans, label)
    if not eoi:  # libjpeg's "premature end of JPEG file", a warning that Pillow drops
        raise _damaged(label, "the file ends before its end-of-image marker")
    single = len(scans) == 1 and sof not in _PROGRESSIVE and len(scans[0].components) == len(
        frame[2]
    )
    return Layout(end=end, single_scan=single, mpf=mpf, sof=sof)


def load(im: Any, layout: Layout, data: bytes | memoryview, label: str) -> None:
    """Decode ``im`` (opened from ``data``, drafted or not) as ``Image.load`` would, proving
    on the way that the last scan's data was all there; ``im`` is loaded when this returns.

    Raises:
        DecodeError: The data ends early, or libjpeg failed.
    """
    if len(im.tile) != 1:
        im.load()
        return
    name, extents, offset, args = im.tile[0]
    im.load_prepare()
    decoder = Image._getdecoder(im.mode, name, args, im.decoderconfig)
    try:
        decoder.setimage(im.im, extents)
        fed = b"".join((memoryview(data)[offset : layout.end], _PAD))
        used, err = decoder.decode(fed)
        if used >= 0:
            # Not finished: a multi-scan decoder waits for the marker after its last scan,
            # having discarded the stand-in bytes; a short one holds some it could not use,
            # or, its buffer used up exactly, cannot take in one more byte.
            if layout.single_scan or used != len(fed) or decoder.decode(_PAD[:1])[0] != 1:
                raise _damaged(
                    label, "the scan data ends early (the rest would decode grey or blurred)"
                )
            used, err = decoder.decode(_EOI)
        if used >= 0 or err < 0:
            raise _damaged(label, "libjpeg could not decode the data (a broken data stream)")
    finally:
        decoder.cleanup()
    im.tile = []
    im.load()


def check_frames(im: Any, layout: Layout, data: bytes | memoryview, label: str) -> None:
    """Refuse an MPO whose index puts a picture past the end of the file: only the first
    picture is decoded, but a file cut inside a later one is still a cut file."""
    entries = getattr(im, "mpinfo", {}).get(0xB002) or []
    for number, entry in enumerate(entries[1:], 2):
        try:
            start, size = layout.mpf + int(entry["DataOffset"]), int(entry["Size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _damaged(label, f"the MPO index entry of picture {number} is unreadable") from exc
        if layout.mpf < 0 or start + size > len(data):
            raise _damaged(label, f"picture {number} of the MPO is cut or missing")


def _damaged(label: str, reason: str) -> DecodeError:
    return DecodeError(f"cannot decode {label}: damaged JPEG: {reason}")


def _frame(body: bytes | memoryview, label: str) -> tuple[int, int, list[tuple[int, int, int]]]:
    if len(body) < 6:
        raise _damaged(label, "the frame header is too short")
    height = int.from_bytes(body[1:3], "big")
    width = int.from_bytes(body[3:5], "big")
    count = body[5]
    if len(body) < 6 + 3 * count or count == 0 or width == 0 or height == 0:
        raise _damaged(label, "the frame header is inconsistent")
    comps = []
    for i in range(count):
        cid, hv = body[6 + 3 * i], body[7 + 3 * i]
        h, v = hv >> 4, hv & 15
        if not (1 <= h <= 4 and 1 <= v <= 4):
            raise _damaged(label, f"component {cid} has sampling factors {h}x{v}")
        comps.append((cid, h, v))
    return width, height, comps


def _scan(
    data: bytes | memoryview,
    body: int,
    stop: int,
    end: int,
    interval: int,
    comps: list[tuple[int, int, int]],
    label: str,
) -> _Scan:
    count = data[body] if body < stop else 0
    if count == 0 or stop - body < 4 + 2 * count:
        raise _damaged(label, "a scan header is too short")
    ids = [c[0] for c in comps]
    chosen = []
    for i in range(count):
        cid = data[body + 1 + 2 * i]
        if cid not in ids:
            raise _damaged(label, f"a scan names component {cid}, which the frame lacks")
        chosen.append(ids.index(cid))
    tail = body + 1 + 2 * count
    ss, se, a = data[tail], data[tail + 1], data[tail + 2]
    restarts = len(_RESTART.findall(data, stop, end)) if interval else 0
    return _Scan(tuple(chosen), ss, se, a & 15, end - stop, restarts, interval)


def _check_scans(
    sof: int,
    frame: tuple[int, int, list[tuple[int, int, int]]],
    scans: list[_Scan],
    label: str,
) -> None:
    width, height, comps = frame
    hmax, vmax = max(c[1] for c in comps), max(c[2] for c in comps)
    done = [0] * len(comps)
    for number, scan in enumerate(scans, 1):
        if len(scan.components) == 1:
            _, h, v = comps[scan.components[0]]
            across = _ceil(_ceil(width * h, hmax), 8)
            units = blocks = across * _ceil(_ceil(height * v, vmax), 8)
        else:
            units = _ceil(width, 8 * hmax) * _ceil(height, 8 * vmax)
            blocks = units * sum(comps[i][1] * comps[i][2] for i in scan.components)
        wanted = _ceil(units, scan.interval) - 1 if scan.interval else 0
        if scan.restarts < wanted:
            raise _damaged(
                label,
                f"scan {number} has {scan.restarts} of its {wanted} restart markers "
                "(its data was cut)",
            )
        if sof not in _ARITHMETIC and sof not in _LOSSLESS and scan.ss == 0:
            # Huffman coding spends at least one bit per block on the DC coefficient, and a
            # sequential scan one more on the AC coefficients (an end-of-block code at least).
            bits = 1 if sof in _PROGRESSIVE else 2
            if 8 * scan.size < bits * blocks:
                raise _damaged(
                    label,
                    f"scan {number} has {scan.size} bytes of data for {blocks} blocks of "
                    f"{width}x{height} pixels (the header claims more than the data holds)",
                )
        if scan.al == 0 or sof not in _PROGRESSIVE:
            band = ((1 << (scan.se + 1)) - 1) ^ ((1 << scan.ss) - 1)
            for i in scan.components:
                done[i] |= _ALL_COEFFICIENTS if sof not in _PROGRESSIVE else band
    if sof not in _LOSSLESS and any(mask != _ALL_COEFFICIENTS for mask in done):
        raise _damaged(label, "scans are missing (not every coefficient is coded in full)")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)
