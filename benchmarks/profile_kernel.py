"""The one-thread training kernel against plain PIL, and where its time goes (issue 23.3).

How to run::

    python benchmarks/profile_kernel.py              # 300 JPEGs, 3 passes, 5 rounds
    python benchmarks/profile_kernel.py --images 1024 --passes 2

Runs ``image.folder(train=True)``'s per-image call as its decode workers make it (a
random-resized crop to 224, a flip, normalized float32 written into a CHW row of a batch
buffer) on one thread, beside a plain PIL RandomResizedCrop + flip + normalize
(``torchvision``'s recipe, written out) on the same files with the same PIL, and the kernel
with simplejpeg hidden (PIL decoding its JPEGs). The three take turns for ``--rounds`` rounds
(CPU time of this thread; the files in the page cache): the minimum is the least disturbed
round on a shared machine, and the ratio of minimums is the figure to quote. Then each JPEG
decoder alone, on the same files at the DCT scale the kernel picks; the kernel's distance
from PIL decoding in full and resizing the same box (per image, mean absolute difference in
0-255 levels: the mean over images and the worst); and the kernel under
``cProfile``: each function's own time (``tottime``) per image, largest first, in
milliseconds (C calls show as ``{method ...}`` / ``{built-in ...}`` rows; profiling adds a
few percent to Python-heavy rows).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
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


Decoder = Callable[[bytes, int, int, int], object]


def decoders() -> dict[str, Decoder]:
    """Each JPEG decoder that imports: ``(data, k, width, height)``, decoded at 1/``k``."""
    def pil(data: bytes, k: int, width: int, height: int) -> object:
        with Image.open(io.BytesIO(data)) as im:
            if k > 1:
                im.draft(im.mode, (-(-width // k), -(-height // k)))
            im.load()
            return im.im

    found: dict[str, Decoder] = {"PIL (Image.draft)": pil}
    try:
        import simplejpeg
    except ImportError:
        pass
    else:
        found["simplejpeg"] = lambda data, k, width, height: simplejpeg.decode_jpeg(
            data, "RGBX", min_width=-(-width // k), min_height=-(-height // k))
    try:
        import cv2
    except ImportError:
        pass
    else:
        cv2.setNumThreads(1)
        flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
                 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
        found["OpenCV imdecode"] = lambda data, k, width, height: cv2.imdecode(
            np.frombuffer(data, np.uint8), flags[k])
    return found


def time_decoders(paths: list[str], rounds: int) -> None:
    """Each decoder alone on the files in memory, at the kernel's DCT scale for its crop."""
    from asyncflow.image import augmentation

    jobs = []
    for i, path in enumerate(paths):
        data = Path(path).read_bytes()
        with Image.open(path) as im:
            (width, height), gray = im.size, im.mode == "L"
        if gray:
            continue  # the colour photos only: every decoder makes RGB of them
        box = augmentation(data, size=SIZE, train=True, seed=0, index=i).box
        factor, k = min(box[2] - box[0], box[3] - box[1]) / SIZE, 1
        while 2 * k <= factor and k < 8:
            k *= 2
        jobs.append((data, k, width, height))
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, fn in decoders().items():
            start = time.thread_time()
            for job in jobs:
                fn(*job)
            times.setdefault(name, []).append(1000 * (time.thread_time() - start) / len(jobs))
    print(f"\ndecode alone ({len(jobs)} colour JPEGs, one thread, min of {rounds} rounds):")
    for name, ms in times.items():
        print(f"  {name}: {min(ms):.3f} ms per image")


def accuracy(paths: list[str]) -> None:
    """The kernel's uint8 output against PIL decoding in full, resizing the same box."""
    from asyncflow.image import augmentation, decode

    levels = []
    for i, path in enumerate(paths):
        got = decode(path, size=SIZE, train=True, seed=0, index=i)
        crop = augmentation(path, size=SIZE, train=True, seed=0, index=i)
        with Image.open(path) as im:
            full = im.convert("RGB")
        want = np.asarray(full.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=crop.box))
        want = want[:, ::-1] if crop.flip else want
        levels.append(float(np.abs(got.astype(np.int16) - want.astype(np.int16)).mean()))
    print(f"\ndistance from a full decode (0-255 levels, {len(levels)} images): mean "
          f"{statistics.fmean(levels):.3f}, worst image {max(levels):.3f} (bound: 0.5 and 3)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args()
    from asyncflow.image import _turbo, backend_info, decode

    info = backend_info()
    print(f"Pillow {info['pil_version']} (pillow-simd: {bool(info['pillow_simd'])}), "
          f"libjpeg-turbo {info['libjpeg_turbo_version']}, simplejpeg {info['simplejpeg']}, "
          f"NumPy {np.__version__}")
    paths = [p for p, _ in list_images(str(build_dataset(args.images)))]
    row = np.empty((3, SIZE, SIZE), np.float32)
    fast = _turbo._simplejpeg

    def ours() -> None:
        for epoch in range(args.passes):
            for i, path in enumerate(paths):
                decode(path, size=SIZE, train=True, seed=0, epoch=epoch, index=i, out=row,
                       layout="chw", normalize=True)

    def ours_pil() -> None:
        _turbo._simplejpeg = None
        try:
            ours()
        finally:
            _turbo._simplejpeg = fast

    def theirs() -> None:
        rng = random.Random(0)
        for _ in range(args.passes):
            for path in paths:
                plain_pil(path, rng, row)

    n = args.passes * len(paths)
    ours()  # the files into the page cache, the imports done
    contenders = {"plain PIL": theirs, "asyncflow kernel": ours}
    if fast is not None:
        contenders["kernel, PIL decoding"] = ours_pil
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            start = time.thread_time()
            fn()
            times[name].append(1000 * (time.thread_time() - start) / n)
    base = times["plain PIL"]
    print(f"\nms CPU per image, {args.rounds} interleaved rounds of {n} images:")
    print("| | min | median | plain PIL / it (min) | (median) |")
    print("|---|---:|---:|---:|---:|")
    for name, ms in times.items():
        mid = statistics.median(ms)
        print(f"| {name} | {min(ms):.3f} | {mid:.3f} | {min(base) / min(ms):.2f}x | "
              f"{statistics.median(base) / mid:.2f}x |")
    time_decoders(paths, args.rounds)
    accuracy(paths)
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
