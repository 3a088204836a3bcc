"""Training throughput on a CUDA GPU: ResNet-50 fed by each loader (issue 12).

How to run::

    python benchmarks/bench_gpu_train.py                 # many-core CUDA machine
    python benchmarks/bench_gpu_train.py --quick         # fewer steps and images
    python benchmarks/bench_gpu_train.py --root /data/imagenet/train --batch-size 256
    python benchmarks/bench_gpu_train.py --dry-run-cpu   # smoke test anywhere: tiny model, CPU
    python benchmarks/bench_gpu_train.py --windows       # issue 22's protocol (_gpu_windows.py)

``--windows`` times each loader over a long window (30 s at batch 64, 20 s at 256) against the
GPU-alone rate timed just before and just after it in the same process, with the process
tree's CPU over the window and its peak PSS over the trainer's own: ResNet-50 at batch 64
(``image.folder`` with its defaults on a CUDA device, torch DataLoader, ``decode="cpu"``) and
256, ResNet-18 at 256. Its table goes to ``benchmarks/results/bench_gpu_windows.md``.

It needs a CUDA GPU and exits with a message without one (``--dry-run-cpu`` runs every row
for 2 steps of a tiny model on the CPU instead, to check the script). Writes
``benchmarks/results/bench_gpu_train.{json,md}``. The images come from ``--root`` (an
ImageFolder tree) or are built once by ``_imagedata.py`` (that needs network access).

Each training step: random-resized-crop 224 + horizontal flip + normalize on the loader's
side, the batch copied to the GPU (pinned memory, ``non_blocking``), ResNet-50 (torchvision's
if importable, else the same network defined here) in channels_last under bf16 autocast,
cross-entropy, SGD with momentum. Rows: torch DataLoader (``--workers`` processes, persistent,
pinned) over a torchvision-style Dataset (torchvision's transforms, or the same written with
PIL), ``image.folder(train=True)`` (defaults, ``workers="threads"``, ``workers="processes"``;
batches copied by its ``device="cuda"`` stage), ``asyncflow.DataLoader`` over the same
Dataset (same three), and "data already on the GPU": one batch reused, the GPU's own
ceiling. A row whose ``workers=`` the installed asyncflow does not take yet reads ``n/a``.
Each row runs in a child process of its own, timed over ``--steps`` steps after
``--warmup`` steps (loaders re-iterated at each epoch's end); peak memory is PSS summed over
the process tree (RSS for reference).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results"
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

ROWS = [  # (kind, label), the most telling first: a run cut short keeps those
    ("gpu", "data already on the GPU (ceiling)"),
    ("torch", "torch DataLoader (persistent, pinned)"),
    ("folder", "image.folder(train=True) (defaults)"),
    ("loader", "asyncflow.DataLoader (defaults)"),
    ("folder-processes", 'image.folder(train=True, workers="processes")'),
    ("folder-threads", 'image.folder(train=True, workers="threads")'),
    ("loader-processes", 'asyncflow.DataLoader(workers="processes")'),
    ("loader-threads", 'asyncflow.DataLoader(workers="threads")'),
]


# -- the model: torchvision's ResNet-50, or the same network written out -----------------------


def _resnet(layers: tuple[int, int, int, int], width: int, classes: int) -> Any:
    """ResNet with bottleneck blocks (torchvision's ``resnet50`` at ``[3, 4, 6, 3]``, 64)."""
    from torch import nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            out = planes * self.expansion
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # v1.5: stride here
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or inplanes != out:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x: Any) -> Any:
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + idt)

    stages: list[Any] = []
    inplanes = width
    for i, blocks in enumerate(layers):
        planes = width * 2**i
        for b in range(blocks):
            stages.append(Bottleneck(inplanes, planes, 2 if (b == 0 and i > 0) else 1))
            inplanes = planes * Bottleneck.expansion
    model = nn.Sequential(
        nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(inplanes, classes),
    )
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def make_model(tiny: bool) -> tuple[Any, str]:
    if tiny:
        return _resnet((1, 1, 1, 1), 8, 10), "tiny ResNet (bottleneck [1,1,1,1], width 8)"
    try:
        from torchvision.models import resnet50

        return resnet50(), "torchvision resnet50"
    except ImportError:
        return _resnet((3, 4, 6, 3), 64, 1000), "ResNet-50 (defined in this script)"


# -- a torchvision-style training Dataset ---------------------------------------------------


def _rrc_box(w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params``: scale (0.08, 1), ratio (3/4, 4/3)."""
    area = w * h
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            return x, y, cw, ch
    ratio = w / h
    if ratio < 3 / 4:
        cw, ch = w, round(w / (3 / 4))
    elif ratio > 4 / 3:
        cw, ch = round(h * (4 / 3)), h
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


class TrainFolder:
    """``ImageFolder`` + RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize."""

    def __init__(self, samples: list[tuple[str, int]], size: int) -> None:
        self.samples, self.size = samples, size
        self._tv: Any = None
        try:
            from torchvision import transforms as T

            self._tv = T.Compose([
                T.RandomResizedCrop(size, antialias=True), T.RandomHorizontalFlip(),
                T.ToTensor(), T.Normalize(MEAN, STD),
            ])
        except ImportError:
            pass

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as f:
            im = f.convert("RGB")
        if self._tv is not None:
            return self._tv(im), label
        return self._pil_transform(im), label

    def _pil_transform(self, im: Any) -> Any:
        import numpy as np
        import torch
        from PIL import Image

        rng = random.Random()  # fresh entropy per call, as torch's global RNG in each worker
        w, h = im.size
        x, y, cw, ch = _rrc_box(w, h, rng)
        im = im.resize((self.size, self.size), Image.Resampling.BILINEAR,
                       box=(x, y, x + cw, y + ch))
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
        mean = torch.tensor(MEAN).view(3, 1, 1)
        std = torch.tensor(STD).view(3, 1, 1)
        return t.sub_(mean).div_(std)


# -- the contenders ------------------------------------------------------------------------


def make_loader(kind: str, root: str, batch: int, workers: int, device: str, pin: bool) -> Any:
    from _loaders import list_images

    mode = {"threads": "threads", "processes": "processes"}.get(kind.rpartition("-")[2])
    extra: dict[str, Any] = {} if mode is None else {"workers": mode}
    if kind == "torch":
        import torch

        return torch.utils.data.DataLoader(
            TrainFolder(list_images(root), 224), batch_size=batch, shuffle=True,
            num_workers=workers, pin_memory=pin, persistent_workers=workers > 0, drop_last=True)
    if kind.startswith("folder"):
        from asyncflow import image

        return image.folder(root, batch_size=batch, size=224, train=True, drop_last=True,
                            decode_concurrency=workers,
                            device=device if device != "cpu" else None, **extra)
    import asyncflow

    if mode == "processes":
        extra["persistent_workers"] = True
    return asyncflow.DataLoader(
        TrainFolder(list_images(root), 224), batch_size=batch, shuffle=True,
        num_workers=workers, pin_memory=pin, drop_last=True, **extra)


def _endless(loader: Any) -> Iterator[Any]:
    while True:
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise RuntimeError("the loader gave no batch: too few images for one batch?")


def make_step(model: Any, opt: Any, device: Any) -> Callable[[Any, Any], None]:
    """One training step: the batch to the device in channels_last, bf16 autocast, SGD."""
    import torch
    import torch.nn.functional as F

    def step(images: Any, labels: Any) -> None:
        x = images.to(device, non_blocking=True).to(memory_format=torch.channels_last)
        y = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def train(kind: str, root: str, batch: int, workers: int, steps: int, warmup: int,
          dry_run: bool) -> dict[str, Any]:
    import torch

    device = torch.device("cpu" if dry_run else "cuda")
    model, model_name = make_model(tiny=dry_run)
    model = model.to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    torch.backends.cudnn.benchmark = True

    step = make_step(model, opt, device)
    if kind == "gpu":
        fixed = (torch.randn(batch, 3, 224, 224, device=device),
                 torch.randint(0, 10, (batch,), device=device))
        loader: Any = None
        batches: Iterator[Any] = iter(lambda: fixed, None)
    else:
        try:
            loader = make_loader(kind, root, batch, workers, device.type, pin=not dry_run)
        except TypeError as exc:
            if "workers" not in str(exc):
                raise
            return {"kind": kind, "na": f"{type(exc).__name__}: {exc}"}
        batches = _endless(loader)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    for _ in range(warmup):
        step(*next(batches))
    sync()
    n, start = 0, time.perf_counter()
    for _ in range(steps):
        images, labels = next(batches)
        n += len(labels)
        step(images, labels)
    sync()
    seconds = time.perf_counter() - start
    from _gil_loaders import _mode_notes

    return {"kind": kind, "img_per_s": n / seconds, "images": n, "seconds": seconds,
            "model": model_name, "device": torch.cuda.get_device_name(0) if not dry_run else "cpu",
            "modes": _mode_notes(loader) if loader is not None else []}


# -- the parent: one child per row, a table ---------------------------------------------------


def _report(results: dict[str, dict[str, Any]], args: argparse.Namespace, workers: int,
            device: str, model: str) -> str:
    from _common import table
    from bench_gil import _mib, _short, mode_summary

    base = results.get("torch", {}).get("img_per_s")
    ceiling = results.get("gpu", {}).get("img_per_s")
    rows = []
    for kind, label in ROWS:
        if kind not in results:
            continue  # not chosen (--only)
        r = results[kind]
        if "img_per_s" not in r:
            why = f"n/a: {_short(r['na'])}" if "na" in r else f"failed: {r.get('error', '?')[:80]}"
            rows.append([label, why, "", "", "", "", ""])
            continue
        rows.append([
            label, f"{r['img_per_s']:.0f}", f"{r['img_per_s'] / base:.2f}x" if base else "",
            f"{r['img_per_s'] / ceiling:.0%}" if ceiling else "", _mib(r["peak_pss"]),
            _mib(r["peak_rss"]), mode_summary(r.get("modes", [])),
        ])
    notes = sorted({f"{label}: {n}" for kind, label in ROWS
                    for n in results.get(kind, {}).get("modes", [])
                    if "auto" in n and "runs on" in n})
    return "\n".join([
        f"Training images/s on {device}: {model}, batch {args.batch_size}, bf16 autocast, "
        f"channels_last, SGD; random-resized-crop 224 + flip + normalize; {workers} workers / "
        f"threads on {len(os.sched_getaffinity(0))} usable cores; {args.steps} steps timed after "
        f"{args.warmup} warm-up steps." + (" DRY RUN on the CPU: the figures mean nothing."
                                           if args.dry_run_cpu else ""),
        "",
        table(["loader", "img/s", "vs torch DataLoader", "of GPU ceiling", "peak PSS (tree)",
               "peak RSS (tree)", "workers picked"], rows),
        *([""] + [f"Note, {n}" for n in notes] if notes else []),
    ])


def parent(args: argparse.Namespace) -> None:
    from _imagedata import build_dataset
    from bench_gil import _said, run_child

    workers = args.workers or len(os.sched_getaffinity(0))
    root = args.root or str(build_dataset(args.images))
    only = set(args.only.split(",")) if args.only else {k for k, _ in ROWS}
    results: dict[str, dict[str, Any]] = {}
    for rep in range(args.repeat):
        for kind, label in ROWS:
            if kind not in only:
                continue
            print(f"  {label} ({rep + 1}/{args.repeat}) ...", flush=True)
            cmd = [sys.executable, __file__, "--child", kind, "--root", root, "--workers",
                   str(workers), "--batch-size", str(args.batch_size), "--steps",
                   str(args.steps), "--warmup", str(args.warmup)]
            if args.dry_run_cpu:
                cmd.append("--dry-run-cpu")
            new = run_child(cmd, timeout=600)
            print(f"    -> {_said(new)}", flush=True)
            old = results.get(kind)
            if old is None or new.get("img_per_s", 0) > old.get("img_per_s", 0):
                if old is not None:
                    new["peak_pss"] = max(new["peak_pss"], old["peak_pss"])
                    new["peak_rss"] = max(new["peak_rss"], old["peak_rss"])
                results[kind] = new
            else:
                old["peak_pss"] = max(old["peak_pss"], new["peak_pss"])
                old["peak_rss"] = max(old["peak_rss"], new["peak_rss"])
            _write(results, args, workers)  # after every row: a cut-short run keeps its rows
    print("\n" + _write(results, args, workers))
    print(f"\nwrote {RESULTS / _stem(args)}.md and .json")


def windows(args: argparse.Namespace) -> None:
    """``--windows``: every row of ``_gpu_windows.BOX_ROWS``, then its table."""
    import _gpu_windows
    from _imagedata import build_dataset

    workers = args.workers or len(os.sched_getaffinity(0))
    root = args.root or str(build_dataset(args.images))
    if args.warmup is None or args.warmup > 10:
        args.warmup = 1 if args.dry_run_cpu else 5  # seconds, here
    stem = "bench_gpu_windows" + ("_dry_run" if args.dry_run_cpu else "")

    def write(results: list[dict[str, Any]]) -> str:
        text = _gpu_windows.report(results, len(os.sched_getaffinity(0)))
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{stem}.md").write_text(text + "\n")
        (RESULTS / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
        return text

    print("\n" + write(_gpu_windows.run_rows(args, root, workers, on_row=write)))


def _stem(args: argparse.Namespace) -> str:
    return "bench_gpu_train_dry_run" if args.dry_run_cpu else "bench_gpu_train"


def _write(results: dict[str, dict[str, Any]], args: argparse.Namespace, workers: int) -> str:
    model = next((r["model"] for r in results.values() if "model" in r), "?")
    device = "CPU (dry run)" if args.dry_run_cpu else next(
        (r["device"] for r in results.values() if "device" in r), "?")
    report = _report(results, args, workers, device, model)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{_stem(args)}.md").write_text(report + "\n")
    (RESULTS / f"{_stem(args)}.json").write_text(json.dumps(
        {"device": device, "model": model, "workers": workers, "args": vars(args),
         "results": results}, indent=1, default=str))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 images, 30 steps")
    parser.add_argument("--dry-run-cpu", action="store_true",
                        help="smoke test: every row, 2 steps of a tiny model on the CPU")
    parser.add_argument("--root", help="an ImageFolder tree (default: build ImageNet-like JPEGs)")
    parser.add_argument("--images", type=int, help="images to build (default 5000; quick 1000)")
    parser.add_argument("--batch-size", type=int, help="default 256 (dry run 4)")
    parser.add_argument("--workers", type=int, help="loader workers (default: usable cores)")
    parser.add_argument("--steps", type=int, help="timed steps (default 100; quick 30; dry 2)")
    parser.add_argument("--warmup", type=int, help="warm-up steps (default 20; quick 10; dry 1)")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repeats, best kept")
    parser.add_argument("--only", help="comma-separated kinds: " + ",".join(k for k, _ in ROWS))
    parser.add_argument("--child", choices=[k for k, _ in ROWS], help=argparse.SUPPRESS)
    parser.add_argument("--windows", action="store_true", help="issue 22's protocol")
    parser.add_argument("--window", type=float, help="--windows: seconds timed per row")
    parser.add_argument("--alone", type=float, default=6.0,
                        help="--windows: seconds of GPU-alone timing before and after")
    parser.add_argument("--window-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.window_child:
        import _gpu_windows

        _gpu_windows.start_watchdog(280)
        sys.stdout.write(json.dumps(_gpu_windows.window_child(json.loads(args.window_child)))
                         + "\n")
        return
    args.window_batch = args.batch_size  # --windows: each row's own batch unless given
    dry, quick = args.dry_run_cpu, args.quick
    args.images = args.images or (400 if dry else 1000 if quick else 5000)
    args.batch_size = args.batch_size or (4 if dry else 256)
    args.steps = args.steps or (2 if dry else 30 if quick else 100)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 10 if quick else 20)
    if not dry:
        import torch

        if not torch.cuda.is_available():
            sys.exit("bench_gpu_train: this benchmark needs a CUDA GPU, and torch sees none "
                     f"(torch {torch.__version__}). Run it on a CUDA machine, or pass "
                     "--dry-run-cpu to smoke-test the script on the CPU.")
    if args.windows:
        windows(args)
        return
    if args.child:
        result = train(args.child, args.root, args.batch_size, args.workers, args.steps,
                       args.warmup, dry)
        sys.stdout.write(json.dumps(result) + "\n")
        return
    parent(args)


if __name__ == "__main__":
    main()
