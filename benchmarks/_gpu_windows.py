"""Issue 22's protocol for ``bench_gpu_train.py --windows``: does the loader keep the GPU busy?

Each row runs in a child process of its own (``--window-child``), which:

1. builds the model (ResNet-50 or ResNet-18, bf16 autocast, channels_last, SGD) and warms it
   up on one batch already on the GPU;
2. times that **GPU-alone** rate for ``--alone`` seconds, just before the loader's window;
3. starts the loader, warms it up, and times training fed by it over a window of
   ``--window`` seconds (whole steps; the GPU synchronized at both ends), counting the CPU
   seconds of the whole process tree over the window (workers included);
4. stops the loader, and times the GPU-alone rate again, just after.

The row's share is its rate over the mean of the two GPU-alone rates (the GPU's own rate drifts
by up to 20% within one run: clocks and temperature). The parent measures each child's peak
PSS over its process tree (``bench_gil.run_child``); a row ``gpu`` (the trainer on data
already on the GPU, no loader) gives the trainer's own peak, which the memory column
subtracts, so that loaders are compared by what they add.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

#: (model, batch, loader kind, window seconds): the rows of the 16-core box, in order.
BOX_ROWS = [
    ("resnet50", 64, "gpu", 5),
    ("resnet50", 64, "folder", 30),
    ("resnet50", 64, "torch", 30),
    ("resnet50", 256, "folder", 20),
    ("resnet18", 256, "folder", 20),
]
#: Not run by default (``--only folder-cpu,folder-nvimgcodec``): the CPU path, and the GPU
#: path with nvImageCodec (the hardware JPEG engine, which leaves the GPU's cores to the
#: trainer) instead of ``"auto"``'s torchvision, fed to the same trainer.
EXTRA_ROWS = [("resnet50", 64, "folder-cpu", 20), ("resnet50", 64, "folder-nvimgcodec", 20)]
LABELS = {
    "gpu": "trainer alone (data on the GPU)",
    "folder": 'image.folder(train=True, device="cuda")',
    "folder-cpu": 'image.folder(train=True, device="cuda", decode="cpu")',
    "folder-nvimgcodec": 'image.folder(train=True, device="cuda"), nvImageCodec decoding',
    "torch": "torch DataLoader (16 workers, persistent, pinned)",
}


def _model(name: str, tiny: bool) -> Any:
    import bench_gpu_train as bench

    if tiny:
        return bench.make_model(tiny=True)[0]
    try:
        from torchvision import models

        return getattr(models, name)()
    except ImportError:
        layers = (3, 4, 6, 3) if name == "resnet50" else (2, 2, 2, 2)
        return bench._resnet(layers, 64, 1000)


def _loader(kind: str, root: str, batch: int, workers: int, cuda: bool) -> Any:
    import bench_gpu_train as bench

    if kind == "torch":
        return bench.make_loader("torch", root, batch, workers, "cuda" if cuda else "cpu", cuda)
    from asyncflow import image

    extra = {"decode": "cpu"} if kind == "folder-cpu" else {}
    if kind == "folder-nvimgcodec":  # "auto" would take torchvision where it imports
        from asyncflow.image import _gpu_decoders

        _gpu_decoders.available = lambda: ["nvimagecodec"]
    return image.folder(root, batch_size=batch, size=224, train=True, drop_last=True,
                        device="cuda" if cuda else None, **extra)


def _tree_cpu() -> float:
    """CPU seconds of this process and its live descendants."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def window_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One row (see the module docstring); returns its figures as a dict."""
    import torch

    tiny = bool(spec.get("dry_run"))
    cuda = not tiny
    device = torch.device("cuda" if cuda else "cpu")
    batch = int(spec["batch"])
    model = _model(spec["model"], tiny).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    import bench_gpu_train as bench

    step = bench.make_step(model, opt, device)

    fixed = (torch.randn(batch, 3, 224, 224, device=device),
             torch.randint(0, 10, (batch,), device=device))

    def alone(seconds: float) -> float:
        sync()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            step(*fixed)
            n += batch
            if n % (8 * batch) == 0:
                sync()
        sync()
        return n / (time.perf_counter() - start)

    for _ in range(3 if tiny else 15):
        step(*fixed)
    out: dict[str, Any] = {"kind": spec["kind"], "model": spec["model"], "batch": batch,
                           "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    out["alone_before"] = alone(float(spec["alone"]))
    if spec["kind"] == "gpu":
        out["img_per_s"] = out["alone_after"] = out["alone_before"]
        return out
    loader = _loader(spec["kind"], spec["root"], batch, int(spec["workers"]), cuda)
    batches = bench._endless(loader)
    warm_until = time.perf_counter() + float(spec["warmup"])
    while time.perf_counter() < warm_until:
        step(*next(batches))
    sync()
    cpu0, n, start = _tree_cpu(), 0, time.perf_counter()
    while time.perf_counter() - start < float(spec["window"]):
        images, labels = next(batches)
        n += len(labels)
        step(images, labels)
    sync()
    seconds = time.perf_counter() - start
    out["cpu_cores"] = (_tree_cpu() - cpu0) / seconds
    out["img_per_s"], out["images"], out["seconds"] = n / seconds, n, seconds
    out["notes"] = list(getattr(getattr(loader, "stats", lambda: None)(), "notes", ()) or ())
    if cuda:
        out["max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    batches.close()
    del batches, loader
    out["alone_after"] = alone(float(spec["alone"]))
    return out


def run_rows(args: Any, root: str, workers: int,
             on_row: Any = None) -> list[dict[str, Any]]:
    """Each row in a child of its own, printed as it ends (and given to ``on_row`` with the
    rows so far, so that a run cut short by its lease keeps them); the rows' results."""
    from bench_gil import run_child

    rows = BOX_ROWS
    if args.only:  # the extra rows beside the box's rows of their model and batch
        rows = sorted(BOX_ROWS + EXTRA_ROWS, key=lambda r: (r[0] != "resnet50", r[1]))
    if args.dry_run_cpu:
        rows = [(m, 4, k, 2) for m, _, k, _ in rows]
    only = set(args.only.split(",")) if args.only else None
    results = []
    for model, batch, kind, window in rows:
        if only is not None and kind not in only and kind != "gpu":
            continue
        spec = {"model": model, "batch": args.window_batch or batch, "kind": kind,
                "window": args.window or window, "alone": args.alone, "warmup": args.warmup,
                "root": root, "workers": workers, "dry_run": args.dry_run_cpu}
        print(f"  {model} batch {spec['batch']}: {LABELS[kind]} ...", flush=True)
        cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "bench_gpu_train.py"),
               "--window-child", json.dumps(spec)]
        result = run_child(cmd, timeout=300)
        result.setdefault("kind", kind)
        result.update(model=model, batch=spec["batch"])
        print("    -> " + _line(result), flush=True)
        results.append(result)
        if on_row is not None:
            on_row(results)
    return results


def _line(r: dict[str, Any]) -> str:
    if "img_per_s" not in r:
        return str(r.get("na") or r.get("error", "?"))[:300]
    share = r["img_per_s"] / ((r["alone_before"] + r["alone_after"]) / 2)
    return (f"{r['img_per_s']:.0f} img/s, GPU alone {r['alone_before']:.0f} -> "
            f"{r['alone_after']:.0f} ({share:.0%}), CPU {r.get('cpu_cores', 0):.1f} cores, "
            f"peak PSS {r.get('peak_pss', 0) / 2**20:.0f} MiB")


def report(results: list[dict[str, Any]], cores: int) -> str:
    """The rows as a markdown table, with the memory each loader adds over the trainer."""
    from _common import table

    trainer = {r["model"]: r.get("peak_pss", 0) for r in results if r["kind"] == "gpu"}
    base = trainer.get("resnet50", 0)
    torch_added = next((r["peak_pss"] - base for r in results
                        if r["kind"] == "torch" and "peak_pss" in r), None)
    rows = []
    for r in results:
        label = f"{r['model']}, batch {r['batch']}: {LABELS.get(r['kind'], r['kind'])}"
        if "img_per_s" not in r:
            rows.append([label, "failed: " + str(r.get("error", r.get("na", "?")))[:60],
                         "", "", "", "", ""])
            continue
        mean = (r["alone_before"] + r["alone_after"]) / 2
        added = r.get("peak_pss", 0) - trainer.get(r["model"], base)
        vs = f" ({added / torch_added:.2f}x torch)" if torch_added and r["kind"] != "gpu" else ""
        rows.append([
            label, f"{r['img_per_s']:,.0f}",
            f"{r['alone_before']:,.0f} -> {r['alone_after']:,.0f}",
            f"{r['img_per_s'] / mean:.0%}", f"{r.get('cpu_cores', 0):.1f}",
            f"{r.get('peak_pss', 0) / 2**20:,.0f}",
            "" if r["kind"] == "gpu" else f"{added / 2**20:,.0f}{vs}",
        ])
    device = next((r["device"] for r in results if "device" in r), "?")
    return "\n".join([
        f"Training on {device}, {cores} usable cores: bf16 autocast, channels_last, SGD; "
        "random-resized-crop 224 + flip + normalize by the loader; each row's window after "
        "its warm-up, the GPU-alone rate timed just before and just after it.",
        "",
        table(["row", "img/s", "GPU alone before -> after", "of GPU alone (mean)",
               "CPU cores (tree)", "peak PSS MiB", "PSS over trainer alone MiB"], rows),
    ])


def start_watchdog(seconds: float) -> None:
    """End a child that outlives its budget (a hung loader must not eat the lease)."""

    def fire() -> None:
        time.sleep(seconds)
        sys.stderr.write(f"window child: over {seconds:.0f} s, ending\n")
        os._exit(3)

    threading.Thread(target=fire, daemon=True).start()
