"""Where the one-thread training kernel's time goes, per image (issue 23.3).

How to run::

    python benchmarks/profile_kernel.py              # 300 JPEGs, 3 passes
    python benchmarks/profile_kernel.py --images 1024 --passes 2

Runs ``image.folder(train=True)``'s per-image call as its decode workers make it (a
random-resized crop to 224, a flip, normalized float32 written into a CHW row of a batch
buffer) on one thread, first untimed (the files in the page cache), then under ``cProfile``.
Prints each function's own time (``tottime``) per image, largest first, in milliseconds:
C calls (PIL's decoder, its resize, NumPy's multiply) show as ``{method ...}`` / ``{built-in
...}`` rows. A plain PIL RandomResizedCrop + flip + normalize (``torchvision``'s recipe, written
out) runs before it on the same files, for scale. Profiling adds a few percent to Python-heavy
rows; the C rows are as measured.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _imagedata import build_dataset  # noqa: E402
from _loaders import MEAN, STD, list_images  # noqa: E402

SIZE = 224


def plain_pil(path: str, rng: random.Random, out: np.ndarray) -> None:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize."""
    with Image.open(path) as im:
        im = im.convert("RGB")
    w, h = im.size
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = round((target * aspect) ** 0.5), round((target / aspect) ** 0.5)
        if 0 < cw <= w and 0 < ch <= h:
            left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
            break
    else:
        cw, ch, left, top = w, h, 0, 0
    im = im.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    arr = np.asarray(im, dtype=np.float32).transpose(2, 0, 1) / 255.0
    out[...] = (arr - np.array(MEAN, np.float32)[:, None, None]) / np.array(
        STD, np.float32)[:, None, None]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args()
    from asyncflow.image import backend_info, decode

    info = backend_info()
    print(f"Pillow {info['pil_version']} (pillow-simd: {bool(info['pillow_simd'])}), "
          f"libjpeg-turbo {info['libjpeg_turbo_version']}, NumPy {np.__version__}")
    paths = [p for p, _ in list_images(str(build_dataset(args.images)))]
    row = np.empty((3, SIZE, SIZE), np.float32)

    def ours() -> None:
        for epoch in range(args.passes):
            for i, path in enumerate(paths):
                decode(path, size=SIZE, train=True, seed=0, epoch=epoch, index=i, out=row,
                       layout="chw", normalize=True)

    def theirs() -> None:
        rng = random.Random(0)
        for _ in range(args.passes):
            for path in paths:
                plain_pil(path, rng, row)

    n = args.passes * len(paths)
    ours()  # the files into the page cache, the imports done
    for name, fn in (("plain PIL", theirs), ("asyncflow kernel", ours)):
        start = time.thread_time()
        fn()
        print(f"{name}: {1000 * (time.thread_time() - start) / n:.3f} ms CPU per image")
    profile = cProfile.Profile()
    profile.enable()
    ours()
    profile.disable()
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
    total = sum(v[2] for _, v in rows)
    print(f"\nunder cProfile: {1000 * total / n:.3f} ms per image; own time per image:")
    print("| ms | share | function |")
    print("|---:|---:|---|")
    for (file, line, func), (_, _, tottime, _, _) in rows[:args.top]:
        where = func if file == "~" else f"{Path(file).name}:{line} {func}"
        print(f"| {1000 * tottime / n:.3f} | {tottime / total:.0%} | `{where}` |")
    rest = sum(v[2] for _, v in rows[args.top:])
    print(f"| {1000 * rest / n:.3f} | {rest / total:.0%} | the other {len(rows) - args.top} |")


if __name__ == "__main__":
    main()
