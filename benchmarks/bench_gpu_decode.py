"""GPU JPEG decoders side by side, and ``image.folder``'s GPU path alone (issue 22).

How to run (a CUDA machine; the images as ``bench_gpu_train.py`` builds them)::

    python benchmarks/bench_gpu_decode.py [--images 2000] [--seconds 4]

Rows, each timed over ``--seconds`` after a warm-up, every row in one run:

* each GPU decoder (nvImageCodec, torchvision's nvJPEG) decoding batches of 64 files' bytes,
  decode alone (pictures left on the GPU, synchronized at the end);
* ``image.folder(train=True, device="cuda")`` alone with each decoder (reads, plans, decodes,
  crops, resizes, flips, normalizes; batches of 64, no training);
* ``image.folder(train=True, device="cuda", decode="cpu")`` alone, for reference.

Each row also gives the CPU seconds of the process per wall second (worker processes not
counted), and how long a thread that wakes every millisecond waited for the GIL meanwhile (a
training loop's Python needs the GIL too: what the row's own threads hold, it waits for).
Writes ``benchmarks/results/bench_gpu_decode.md``.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class Probe:
    """A thread that sleeps 1 ms at a time and records how late it wakes: how long a thread
    that needs the GIL now and then (as a training loop does) waits for it."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            time.sleep(0.001)
            self.late.append(time.perf_counter() - start - 0.001)

    def __enter__(self) -> Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def timed(run: Callable[[], int], seconds: float) -> dict[str, float]:
    """``run()`` repeatedly for ``seconds`` (it returns images done): rate, CPU, GIL waits."""
    run()  # warm-up
    with Probe() as probe:
        cpu0, start, done = time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            done += run()
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    late = sorted(probe.late) or [0.0]
    return {"img_per_s": done / wall, "cpu_cores": cpu / wall,
            "late_ms": 1e3 * sum(late) / len(late),
            "late_p99_ms": 1e3 * late[len(late) * 99 // 100]}


def main() -> None:
    import torch
    from _imagedata import build_dataset

    from asyncflow import image
    from asyncflow.image import _gpu_decoders

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu_decode: needs a CUDA GPU")
    root = build_dataset(args.images)
    paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))[:2048]
    datas = [bytearray(Path(p).read_bytes()) for p in paths]
    device = torch.device("cuda", 0)
    with Probe() as idle:
        time.sleep(1.0)
    baseline = 1e3 * sum(idle.late) / max(1, len(idle.late))
    rows: list[tuple[str, dict[str, float]]] = []

    for name in _gpu_decoders.available():
        try:
            decoder = _gpu_decoders.choose(device, name)
        except Exception as exc:
            print(f"{name}: unusable here: {exc}", flush=True)
            continue
        position = [0]

        def decode_batch(decoder: Any = decoder, position: list[int] = position) -> int:
            lo = position[0] % (len(datas) - args.batch)
            position[0] += args.batch
            decoder.decode(datas[lo:lo + args.batch])
            torch.cuda.current_stream().synchronize()
            return args.batch

        rows.append((f"{decoder.name}: decode alone, batches of {args.batch}",
                     timed(decode_batch, args.seconds)))
        print(rows[-1], flush=True)

    def folder_row(label: str, **kw: Any) -> None:
        pipe = image.folder(root, batch_size=args.batch, size=224, train=True,
                            device="cuda", drop_last=True, **kw)
        it = iter(pipe)

        def step() -> int:
            nonlocal it
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(pipe)
                x, y = next(it)
            x.sum()
            return len(y)

        result = timed(step, args.seconds)
        torch.cuda.synchronize()
        it.close()
        result["notes"] = " | ".join(pipe.stats().notes)  # type: ignore[assignment]
        rows.append((label, result))
        print(rows[-1], flush=True)

    for name in _gpu_decoders.available():
        original = _gpu_decoders.available
        _gpu_decoders.available = lambda name=name: [name]  # type: ignore[misc]
        try:
            folder_row(f'image.folder(train=True, device="cuda") alone, {name}')
        except Exception as exc:
            print(f"{name}: folder failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            _gpu_decoders.available = original  # type: ignore[misc]
    folder_row('image.folder(train=True, device="cuda", decode="cpu") alone', decode="cpu")

    from _common import table

    lines = [[label, f"{r['img_per_s']:,.0f}", f"{r['cpu_cores']:.2f}",
              f"{r['late_ms']:.2f} / {r['late_p99_ms']:.1f}"] for label, r in rows]
    text = "\n".join([
        f"GPU decode on {torch.cuda.get_device_name(0)}, {len(os.sched_getaffinity(0))} usable "
        f"cores; {len(datas)} ImageNet-like JPEGs; {args.seconds:.0f} s a row.", "",
        f"A thread sleeping 1 ms at a time woke {baseline:.2f} ms late on average when idle.",
        table(["row", "img/s", "CPU cores (process)", "GIL wait, mean / p99 ms"], lines),
    ])
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_gpu_decode.md").write_text(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
