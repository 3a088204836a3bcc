"""The loaders that ``bench_images.py`` races, each run in a child process of its own.

Run as ``python benchmarks/_loaders.py KIND --root R --workers W ...``; prints one JSON line.
Every loader does the same job, as ImageNet evaluation does it: decode, resize the shorter
side to ``size``, centre-crop ``size``, batches of ``batch_size``, normalized float32 NCHW,
and is timed over whole epochs after one warm-up epoch (so worker start-up is not counted).

Only torch, NumPy and PIL are imported at module level, so the ``dataloader`` kind also runs
in a second environment with stock Pillow, where asyncflow is not installed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from PIL import Image

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def list_images(root: str) -> list[tuple[str, int]]:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    return [
        (os.path.join(root, c, f), i)
        for i, c in enumerate(classes)
        for f in sorted(os.listdir(os.path.join(root, c)))
        if f.lower().endswith((".jpg", ".jpeg"))
    ]


def pil_resize_crop(path: str, size: int) -> Image.Image:
    """torchvision's ``Resize(size)`` + ``CenterCrop(size)`` on a PIL image, as written there."""
    with Image.open(path) as im:
        im = im.convert("RGB")
    w, h = im.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    im = im.resize((nw, nh), Image.Resampling.BILINEAR)
    left, top = round((nw - size) / 2.0), round((nh - size) / 2.0)
    return im.crop((left, top, left + size, top + size))


def _normalize_batch(batch: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    return batch.float().sub_(mean).div_(std)


# -- torch DataLoader ---------------------------------------------------------------------


class _Folder(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, samples: list[tuple[str, int]], size: int) -> None:
        self.samples, self.size = samples, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        arr = np.array(pil_resize_crop(path, self.size))  # PILToTensor: uint8 CHW
        return torch.from_numpy(arr).permute(2, 0, 1), label


class _FolderFloat(_Folder):
    """``_Folder`` whose samples come normalized (float32 CHW), for torch's ``default_collate``
    to stack as they are (``bench_loader_memory.py --default-collate``)."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = super().__getitem__(i)
        return _normalize_batch(image[None])[0], label


def _collate_normalize(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import default_collate

    images, labels = default_collate(items)
    return _normalize_batch(images), labels


def dataloader(root: str, size: int, batch_size: int, workers: int) -> Callable[[], Iterable[Any]]:
    loader = torch.utils.data.DataLoader(
        _Folder(list_images(root), size), batch_size=batch_size, num_workers=workers,
        collate_fn=_collate_normalize, persistent_workers=workers > 0,
    )
    return lambda: loader


# -- SPDL -------------------------------------------------------------------------------


def spdl(root: str, size: int, batch_size: int, workers: int) -> Callable[[], Iterable[Any]]:
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    samples = list_images(root)
    filter_desc = spdl.io.get_video_filter_desc(
        scale_width=size, scale_height=size, scale_mode="crop", scale_algo="bilinear",
        pix_fmt="rgb24",
    )

    def decode(item: tuple[str, int]) -> tuple[Any, int]:
        path, label = item
        packets = spdl.io.demux_image(path)
        return spdl.io.decode_packets(packets, filter_desc=filter_desc), label

    def collate(items: list[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        buffer = spdl.io.convert_frames([frames for frames, _ in items])
        nhwc = spdl.io.to_torch(buffer)
        images = _normalize_batch(nhwc.permute(0, 3, 1, 2).contiguous())
        return images, torch.tensor([label for _, label in items])

    def epoch() -> Iterable[Any]:
        pipeline = (
            PipelineBuilder()
            .add_source(samples)
            .pipe(decode, concurrency=workers, output_order="input")
            .aggregate(batch_size)
            .pipe(collate)
            .add_sink(3)
            .build(num_threads=workers)
        )

        def run() -> Iterable[Any]:
            with pipeline.auto_stop():
                yield from pipeline.get_iterator(timeout=120)

        return run()

    return epoch


# -- asyncflow --------------------------------------------------------------------------


def asyncflow(root: str, size: int, batch_size: int, workers: int,
              in_kernel: bool = False) -> Callable[[], Iterable[Any]]:
    from asyncflow import image
    from asyncflow.image import _folder

    _folder._NORMALIZE_IN_KERNEL = in_kernel  # float32 rows, as before issue 23's change
    pipe = image.folder(root, batch_size=batch_size, size=size, decode_concurrency=workers)
    return lambda: pipe


LOADERS = {"dataloader": dataloader, "spdl": spdl, "asyncflow": asyncflow,
           # image.folder normalizing in its decoders (float32 rows), to compare (issue 23)
           "asyncflow-kernel": functools.partial(asyncflow, in_kernel=True)}


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time of a process and all its descendants: the live ones, and those
    that exited and were reaped (their time is in their parent's cutime / cstime)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid or os.getpid()]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def race(
    kind: str, root: str, size: int, batch_size: int, workers: int, epochs: int
) -> dict[str, Any]:
    torch.set_num_threads(max(1, min(workers, len(os.sched_getaffinity(0)))))
    make = LOADERS[kind](root, size, batch_size, workers)
    rates, cpu_ms, shapes = [], [], set()
    n = 0
    for epoch in range(1 + epochs):
        n = 0
        cpu0, start = tree_cpu_seconds(), time.perf_counter()
        for images, labels in make():
            n += len(labels)
            shapes.add((tuple(images.shape[1:]), str(images.dtype), images.is_contiguous()))
        seconds, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu0
        if epoch > 0:
            rates.append(n / seconds)
            cpu_ms.append(1000 * cpu / n)
    return {
        "kind": kind, "workers": workers, "images": n, "img_per_s": max(rates),
        "rates": rates, "cpu_ms_per_img": min(cpu_ms), "outputs": sorted(map(str, shapes)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=sorted(LOADERS))
    parser.add_argument("--root", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    result = race(args.kind, args.root, args.size, args.batch_size, args.workers, args.epochs)
    import PIL

    result["pil"] = PIL.__version__
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
