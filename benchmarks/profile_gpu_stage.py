"""Where ``image.folder``'s GPU stage spends its time: for the next CUDA box.

On the H100 (2026-11-27) ``image.folder(train=True, device="cuda")`` alone made 2,590-2,665
img/s at batch 256, bottlenecked by its GPU stage (``batch``: busy 93%, about 420 us of host
time an image), not by its readers (8 or 16 of them gave 2,424 and 2,583) nor by the
resampler (5x cheaper since, with no change there). This script runs the loader alone for
``--seconds`` after a warm-up, with the GPU stage's parts timed on the host, and prints:

* the loader's rate and ``stats()``;
* each part's host time per image: the wait for the side stream at a batch's start, the
  decoder's calls (how many, and how many pictures a call), the CPU kernel's fallbacks in
  the stage, the resampler, the rest of ``make``;
* how many JPEGs the decoder refused, and whether it takes gray ones (``takes_gray``);
* this process's CPU time per image by thread (the run loop, the pool's readers, the GPU
  stage's worker...): the threads that share its GIL;
* with ``--trace``, the CUDA kernels of a few batches by device time (``torch.profiler``).

Run it on the box::

    python benchmarks/profile_gpu_stage.py --images 10000 --seconds 8 --trace

``--dry-run-cpu`` runs it on the CPU with a PIL stand-in decoder (to test the script).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _PilDecoder:
    """The dry run's decoder: whole pictures decoded by PIL, planar (as nvJPEG gives them)."""

    name = "PIL (dry run)"
    layout = "chw"
    takes_gray = True

    def decode(self, data: Any) -> list[Any]:
        import numpy as np
        import torch
        from PIL import Image

        out = []
        for d in data:
            with Image.open(io.BytesIO(bytes(d))) as im:
                arr = np.asarray(im.convert("RGB")).copy()
            out.append(torch.from_numpy(arr).permute(2, 0, 1).contiguous())
        return out


class Timers:
    """Host seconds and calls by part; the stage runs one batch at a time."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.sizes: list[int] = []

    def wrap(self, owner: Any, attr: str, part: str, size: bool = False) -> None:
        real = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.calls[part] += 1
                if size:
                    self.sizes.append(len(args[-1]))

        setattr(owner, attr, timed)


def _instrument(timers: Timers, decoder: Any) -> None:
    from asyncflow.image import _gpu

    timers.wrap(_gpu.GpuDecodeNode, "make", "make (all of a batch)")
    timers.wrap(_gpu.GpuDecodeNode, "_on_cpu", "CPU kernel fallbacks")
    timers.wrap(_gpu, "resample", "resample")
    timers.wrap(decoder, "decode", "decoder calls", size=True)
    import torch

    if torch.cuda.is_available():  # only the GPU stage synchronizes a stream here
        timers.wrap(torch.cuda.Stream, "synchronize", "side stream wait")


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by name (threads of one name added up)."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for t in psutil.Process().threads():
        name = names.get(t.id, "other (not a Python thread)")
        out[name.rstrip("0123456789_-") or name] += t.user_time + t.system_time
    return out


def _endless(pipe: Any) -> Any:
    """Epoch after epoch of ``pipe``'s batches."""
    while True:
        yield from pipe


def run(args: argparse.Namespace) -> str:
    """The loader alone, instrumented; the report's text."""
    import torch
    from _imagedata import build_dataset

    from asyncflow import image
    from asyncflow.image import _config, _folder

    root = args.root or str(build_dataset(args.images))
    timers = Timers()
    device = "cpu" if args.dry_run_cpu else "cuda"
    decoder: Any
    if args.dry_run_cpu:
        decoder = _PilDecoder()
        _folder.decode_path = lambda d, dev: (torch.device("cpu"), decoder, "dry run")
    else:
        decoder = _config.choose(torch.device("cuda"))
        _folder.decode_path = lambda d, dev: (torch.device("cuda"), decoder, decoder.name)
    _instrument(timers, decoder)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    pipe = image.folder(root, batch_size=args.batch_size, size=224, train=True,
                        drop_last=True, device=device, decode="cuda")
    n, start, trace = 0, 0.0, None
    batches = _endless(pipe)
    for _ in range(args.warmup):
        next(batches)
    sync()
    timers.reset()  # the window only
    threads_before = _thread_cpu()
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        _, labels = next(batches)
        n += len(labels)
    sync()
    seconds = time.perf_counter() - start
    threads = {k: v - threads_before.get(k, 0.0) for k, v in _thread_cpu().items()}
    if args.trace and device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                next(batches)
            sync()
        trace = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
    batches.close()
    lines = [f"{decoder.name}: {n / seconds:,.0f} img/s alone, batch {args.batch_size}, "
             f"{seconds:.1f} s; takes gray JPEGs: {getattr(decoder, 'takes_gray', '?')}",
             "", str(pipe.stats()), "", "| part (host time) | ms per image | calls |",
             "|---|---:|---:|"]
    for part, secs in sorted(timers.seconds.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {part} | {1000 * secs / max(n, 1):.3f} | {timers.calls[part]} |")
    lines += ["", "| this process's thread | CPU ms per image |", "|---|---:|"]
    for name, secs in sorted(threads.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"| {name} | {1000 * secs / max(n, 1):.3f} |")
    if timers.sizes:
        lines.append(f"\ndecoder calls: {len(timers.sizes)}, pictures a call: mean "
                     f"{sum(timers.sizes) / len(timers.sizes):.1f}, min {min(timers.sizes)}")
    if trace:
        lines += ["", "CUDA kernels of 3 batches (torch.profiler):", trace]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--root", help="an ImageFolder tree (default: build ImageNet-like JPEGs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=int, default=3, help="batches before the window")
    parser.add_argument("--trace", action="store_true", help="torch.profiler on 3 batches")
    parser.add_argument("--dry-run-cpu", action="store_true",
                        help="on the CPU, with a PIL stand-in decoder (tests the script)")
    print(run(parser.parse_args()), flush=True)


if __name__ == "__main__":
    main()
