"""Pictures for the image tests, made on the spot (and the photos asyncflow ships)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

DATA = Path(__file__).resolve().parents[2] / "asyncflow" / "_data"
PHOTOS = sorted(DATA.glob("*.jpg"))


def smooth(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A photo-like RGB array: smooth gradients and blobs, some texture, no pure noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    x /= width
    y /= height
    chans = []
    for c in range(3):
        fx, fy, ph = rng.uniform(1, 4), rng.uniform(1, 4), rng.uniform(0, 6)
        v = 0.5 + 0.35 * np.sin(2 * np.pi * (fx * x + ph)) * np.cos(2 * np.pi * fy * y)
        v += 0.1 * np.sin(40 * x + 30 * y + c)
        chans.append(v)
    arr = np.stack(chans, axis=-1)
    arr += rng.normal(0, 0.01, arr.shape).astype(np.float32)
    return (np.clip(arr, 0, 1) * 255).round().astype(np.uint8)


def encode(im: Image.Image, fmt: str = "JPEG", **params: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def jpeg(width: int, height: int, seed: int = 0, quality: int = 90) -> bytes:
    return encode(Image.fromarray(smooth(width, height, seed)), "JPEG", quality=quality)


def progressive_jpeg(width: int, height: int, seed: int = 0, quality: int = 90) -> bytes:
    return encode(Image.fromarray(smooth(width, height, seed)), "JPEG", quality=quality,
                  progressive=True)


def with_orientation(im: Image.Image, orientation: int) -> bytes:
    """A JPEG of ``im`` stored so that EXIF ``orientation`` turns it back into ``im``."""
    inverse = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_90,  # shown by ROTATE_270, so stored rotated by 90
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_270,
    }
    stored = im.transpose(inverse[orientation]) if orientation in inverse else im
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(stored, "JPEG", quality=95, exif=exif.tobytes())


def png_with_bad_crc(data: bytes, chunk: bytes = b"IDAT") -> bytes:
    """``data`` (a PNG) with the CRC of its first ``chunk`` chunk flipped."""
    pos = 8
    while pos < len(data):
        length = struct.unpack(">I", data[pos : pos + 4])[0]
        if data[pos + 4 : pos + 8] == chunk:
            crc_at = pos + 8 + length
            bad = (struct.unpack(">I", data[crc_at : crc_at + 4])[0] ^ 0xFFFF).to_bytes(4, "big")
            return data[:crc_at] + bad + data[crc_at + 4 :]
        pos += 12 + length
    raise ValueError(f"no {chunk!r} chunk")


def png_bomb(width: int, height: int) -> bytes:
    """A small, valid-looking PNG whose header declares ``width x height`` gray pixels."""

    def chunk(ctype: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(ctype + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + ctype + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 4096, 9)  # far too little data: only the header matters
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def reference(data: bytes | Path, size: int) -> np.ndarray:
    """A plain full decode, then torchvision's ``Resize(size)`` and ``CenterCrop(size)``."""
    src = io.BytesIO(data) if isinstance(data, bytes) else data
    with Image.open(src) as im:
        im = im.convert("RGB")
    w, h = im.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    im = im.resize((nw, nh), Image.Resampling.BILINEAR)
    left, top = round((nw - size) / 2.0), round((nh - size) / 2.0)
    return np.asarray(im.crop((left, top, left + size, top + size)))


def mad(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference, in levels of 0-255."""
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def write_tree(root: Path, per_class: dict[str, int], size: tuple[int, int] = (96, 72)) -> None:
    """An ImageFolder tree: ``root/<class>/<n>.jpg`` with ``per_class[class]`` images."""
    for ci, (name, count) in enumerate(sorted(per_class.items())):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (folder / f"{i:03d}.jpg").write_bytes(jpeg(*size, seed=100 * ci + i))


EOI = b"\xff\xd9"


def cut(data: bytes, at: int, eoi: bool = True) -> bytes:
    """``data`` cut after ``at`` bytes (from the end when negative), an end-of-image marker
    appended if ``eoi``: the damage that libjpeg decodes to grey rows without an error."""
    return data[:at] + (EOI if eoi else b"")


def scan_starts(data: bytes) -> list[int]:
    """Where each start-of-scan marker of a JPEG made here is (none hides in an APP segment)."""
    return [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xDA]


def with_frame_size(data: bytes, width: int, height: int) -> bytes:
    """``data`` (a baseline or progressive JPEG) with its frame header claiming another size."""
    at = next(i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC2))
    return data[: at + 5] + struct.pack(">HH", height, width) + data[at + 9 :]


def mpo(*arrays: np.ndarray) -> bytes:
    """A multi-picture (stereo camera) file of the given pictures."""
    first, *rest = (Image.fromarray(a) for a in arrays)
    return encode(first, "MPO", save_all=True, append_images=rest)
