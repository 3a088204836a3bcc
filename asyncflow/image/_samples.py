"""Sample data: an ImageFolder tree of JPEGs made from the photographs that ship with asyncflow.

What the ``asyncflow demo`` command, the examples and the notebook read, made public as
:func:`sample_folder` so that a first run needs no dataset.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

__all__ = ["sample_folder", "sample_photos"]

_GENERATED_CLASSES = ("circles", "stripes", "blobs", "rings")


def sample_photos() -> list[Path]:
    """The photographs that ship with asyncflow (``asyncflow/_data/*.jpg``), sorted."""
    folder = Path(__file__).resolve().parent.parent / "_data"
    return sorted(folder.glob("*.jpg")) if folder.is_dir() else []


def sample_folder(root: str | os.PathLike[str], images: int = 256, *, seed: int = 0) -> Path:
    """Write ``images`` JPEGs in the ImageFolder layout under ``root`` and return its path:
    sample data for :func:`folder`, for a first run, a notebook or a test::

        root = asyncflow.image.sample_folder("/tmp/images", 256)
        pipe = asyncflow.image.folder(root, batch_size=32, size=224)

    One class per photograph that ships with asyncflow (a cat, a cup of coffee, an
    astronaut): each image is a random crop of its class's photo, flipped or not, slightly
    brighter or darker, resized so that its long side is 400-640 px and saved at quality
    75-95, about the sizes and qualities of ImageNet's. Without the photographs (a stripped
    install), the pictures are generated instead: smooth gradients with shapes drawn on
    them, which decode like photographs (smooth areas, soft edges), not like noise.
    """
    import numpy as np

    root = Path(root)
    photos = sample_photos()
    classes = [p.stem for p in photos] or list(_GENERATED_CLASSES)
    rng = np.random.default_rng(seed)
    for cls in classes:
        (root / cls).mkdir(parents=True, exist_ok=True)
    jobs = []
    for i in range(images):
        k = i % len(classes)
        path, seed = root / classes[k] / f"{i:05d}.jpg", int(rng.integers(2**31))
        jobs.append(partial(_write_crop, path, photos[k], seed) if photos else
                    partial(_write_picture, path, classes[k], seed))
    # PIL releases the GIL while it decodes, resizes and encodes.
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda job: job(), jobs))
    return root


def _write_crop(path: Path, photo: Path, seed: int) -> None:
    import numpy as np
    from PIL import Image, ImageEnhance, ImageOps

    rng = np.random.default_rng(seed)
    with Image.open(photo) as src:
        img = src.convert("RGB")
    w, h = img.size
    area = w * h * rng.uniform(0.35, 1.0)
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    cw = min(w, round((area * aspect) ** 0.5))
    ch = min(h, round((area / aspect) ** 0.5))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = img.crop((x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        img = ImageOps.mirror(img)
    img = ImageEnhance.Brightness(img).enhance(float(rng.uniform(0.8, 1.2)))
    scale = int(rng.integers(400, 641)) / max(cw, ch)
    img = img.resize((max(1, round(cw * scale)), max(1, round(ch * scale))),
                     Image.Resampling.BICUBIC)
    img.save(path, quality=int(rng.integers(75, 96)))


def _write_picture(path: Path, cls: str, seed: int) -> None:
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    long_side = int(rng.integers(400, 641))
    short_side = int(long_side * rng.uniform(0.6, 0.9))
    w, h = (long_side, short_side) if rng.random() < 0.7 else (short_side, long_side)
    # A smooth gradient computed small and scaled up: cheap, and photo-like in its smoothness.
    sw, sh = w // 16, h // 16
    yy, xx = np.mgrid[0:sh, 0:sw].astype(np.float32)
    a, b = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
    t = (xx / sw * rng.uniform(0.3, 1) + yy / sh * rng.uniform(0.3, 1))[..., None] / 2
    small = (a * (1 - t) + b * t).clip(0, 255).astype(np.uint8)
    img = Image.fromarray(small, "RGB").resize((w, h), Image.Resampling.BILINEAR)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        r = int(rng.integers(10, max(11, min(w, h) // 3)))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        box = (x0 - r, y0 - r, x0 + r, y0 + r)
        if cls == "circles":
            draw.ellipse(box, fill=colour)
        elif cls == "stripes":
            draw.rectangle((0, y0, w, y0 + r // 3), fill=colour)
        elif cls == "rings":
            draw.ellipse(box, outline=colour, width=max(2, r // 6))
        else:
            draw.polygon([(x0, y0 - r), (x0 + r, y0 + r), (x0 - r, y0 + r)], fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 2.0))))
    img.save(path, quality=int(rng.integers(75, 96)))
