"""Image-loading throughput: torch DataLoader vs SPDL vs asyncflow ``image.folder``.

    python benchmarks/bench_images.py [--quick] [--workers 1,2,4] [--no-stock-pillow]

One command, one run. It builds the data set once (``_imagedata.py``: ~2,000 ImageNet-like
JPEGs cut from real photographs; ``--quick``: 400), then, side by side at each worker count,
runs each loader in a child process of its own (``_loaders.py``) while sampling the resident
memory of that process and all its children. The job, as ImageNet evaluation does it:
decode, resize the shorter side to 224, centre-crop 224, batches of 32, normalized float32
NCHW. Also measured in the same run: the single-thread rate of asyncflow's per-image work
(decode + resize + crop + normalize, each image written into its row of a batch buffer)
against a naive PIL version of it, the machine limit (cores x that rate), and how far
asyncflow's uint8 output is from a plain full decode + resize + crop. A row for torch
DataLoader under stock Pillow runs in a second environment
(``benchmarks/_data/venv-pillow``, built once). SPDL is installed into a side folder
(``benchmarks/_data/spdl-site``), with FFmpeg's shared libraries from Debian packages when
they are missing. Prints a table; writes ``benchmarks/results/bench_images.{json,md,svg}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _imagedata import DATA_DIR, build_dataset  # noqa: E402
from _loaders import list_images, pil_resize_crop  # noqa: E402
from _svgplot import line_chart  # noqa: E402

RESULTS = HERE / "results"
SPDL_SITE = DATA_DIR / "spdl-site"
PILLOW_VENV = DATA_DIR / "venv-pillow"
SIZE, BATCH = 224, 32


# -- helpers: child processes and their memory -------------------------------------------


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (summed, as the issue asks)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


def _machine_busy_seconds() -> float:
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_child(
    cmd: list[str], env: dict[str, str], timeout: float,
    measure: Callable[[int], tuple[int, ...]] = lambda pid: (_tree_rss(pid),),
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Run one race, sampling ``measure(pid)`` (memory figures of the child's tree) for their
    peaks; also note how many cores other programs kept busy meanwhile."""
    busy0, own0, t0 = _machine_busy_seconds(), _own_cpu_seconds(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=HERE.parent)
    peaks: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = measure(proc.pid)
            peaks[:] = [max(a, b) for a, b in zip(peaks, now, strict=True)] if peaks else now
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n(timed out after {timeout:.0f} s)"
    done.set()
    sampler.join()
    wall = time.perf_counter() - t0
    others = max(0.0, (_machine_busy_seconds() - busy0) - (_own_cpu_seconds() - own0)) / wall
    result = tuple(peaks) or tuple(0 for _ in measure(os.getpid()))
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit {proc.returncode}", "others": others}, result
    return {**json.loads(lines[-1]), "others": others}, result


def _env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    return env


# -- SPDL and stock Pillow: set up on demand ------------------------------------------------


def _spdl_ready() -> str | None:
    """Install SPDL (into a side folder, not the project's venv); None, or why it cannot run."""
    if not (SPDL_SITE / "spdl").is_dir():
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
               str(SPDL_SITE), "spdl", "spdl-io", "spdl-core"]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            return "pip install spdl failed"
    probe = [sys.executable, "-c", "import spdl.io, spdl.io.lib as l; l._libspdl.__name__"]
    if subprocess.run(probe, capture_output=True, env=_env(SPDL_SITE)).returncode == 0:
        return None
    if shutil.which("apt-get") and os.geteuid() == 0:
        pkgs = ["libavcodec59", "libavformat59", "libavutil57", "libswscale6", "libavfilter8",
                "libavdevice59", "libswresample4"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-qq", *pkgs], capture_output=True, env=env)
        if subprocess.run(probe, capture_output=True, env=_env(SPDL_SITE)).returncode == 0:
            return None
    return "SPDL needs FFmpeg's shared libraries (libavutil etc.), which could not be installed"


def _stock_pillow_python() -> Path | None:
    """A second environment with torch and stock Pillow (built once, under _data/)."""
    python = PILLOW_VENV / "bin" / "python"
    if python.is_file():
        return python
    import torch

    subprocess.run([sys.executable, "-m", "venv", str(PILLOW_VENV)], check=True)
    pins = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}", "pillow"]
    res = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins],
                         capture_output=True, text=True)
    if res.returncode != 0:
        shutil.rmtree(PILLOW_VENV, ignore_errors=True)
        print(f"  (no stock-Pillow environment: {res.stderr.strip().splitlines()[-1:]})")
        return None
    return python


# -- single-thread kernels, the machine limit and the output check ---------------------------


def _naive(path: str) -> Any:
    """The usual per-image code: PIL decode, resize, crop, ToTensor, Normalize."""
    import torch

    arr = np.asarray(pil_resize_crop(path, SIZE))
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous().float().div(255)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    return (x - mean) / std


def _kernel_rates(paths: list[str]) -> dict[str, float]:
    import torch

    from asyncflow import image

    torch.set_num_threads(1)
    # Each image goes to its row of a batch buffer, the batches in turn, as in a loader: the
    # output leaves the cache. One reused 600 KB buffer would stay in cache and overstate the
    # rate (by 3-4% here).
    batches = np.zeros((4, BATCH, 3, SIZE, SIZE), np.float32)
    rows = iter(itertools.cycle(batches.reshape(-1, 3, SIZE, SIZE)))

    def ours(path: str) -> None:
        image.decode(path, size=SIZE, layout="chw", normalize=True, out=next(rows))

    rates = {}
    for name, fn in (("naive_pil", _naive), ("asyncflow", ours)):
        best = 0.0
        for _ in range(3):
            # CPU time of this thread: other programs on the machine barely change it
            start = time.thread_time()
            for p in paths:
                fn(p)
            best = max(best, len(paths) / (time.thread_time() - start))
        rates[name] = best
    torch.set_num_threads(os.cpu_count() or 1)
    return rates


def _output_check(root: Path, limit: int = 300) -> dict[str, float]:
    from asyncflow import image

    pipe = image.folder(root, batch_size=BATCH, size=SIZE, normalize=False)
    diffs: list[float] = []
    for images, _ in pipe:
        for img in images:
            if len(diffs) == min(limit, len(pipe.samples)):
                break
            ref = np.asarray(pil_resize_crop(pipe.samples[len(diffs)][0], SIZE))
            ours = img.numpy().transpose(1, 2, 0).astype(np.int16)
            diffs.append(float(np.abs(ours - ref).mean()))
    return {"images": len(diffs), "mean_abs_diff": float(np.mean(diffs)),
            "max_image_mean_abs_diff": float(np.max(diffs))}


# -- the run ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 images, one timed epoch")
    parser.add_argument("--images", type=int, help="data set size (default 2000; quick 400)")
    parser.add_argument("--workers", default="1,2,4", help="worker / thread counts")
    parser.add_argument("--no-stock-pillow", action="store_true",
                        help="skip the DataLoader row under stock Pillow (a second venv, built "
                        "once under benchmarks/_data/)")
    parser.add_argument("--no-spdl", action="store_true")
    parser.add_argument("--repeat", type=int, help="interleaved repeats, best kept (default "
                        "1 quick, 2 full)")
    args = parser.parse_args()
    n_images = args.images or (400 if args.quick else 2000)
    epochs = 1 if args.quick else 2
    repeats = args.repeat or (1 if args.quick else 2)
    workers = [int(w) for w in args.workers.split(",")]
    cores = len(os.sched_getaffinity(0))

    print(f"building / reusing the data set ({n_images} JPEGs) ...", flush=True)
    root = build_dataset(n_images)
    paths = [p for p, _ in list_images(str(root))]
    for p in paths:  # warm the page cache: every loader reads from memory
        Path(p).read_bytes()

    from asyncflow import image

    info = image.backend_info()
    print(f"PIL {info['pil_version']} (pillow-simd: {bool(info['pillow_simd'])}, libjpeg-turbo "
          f"{info['libjpeg_turbo_version']}), {cores} cores, {platform.processor() or ''}")

    print("single-thread kernels ...", flush=True)
    kernels = _kernel_rates(paths[: min(len(paths), 400)])
    limit = cores * kernels["asyncflow"]
    print("output check ...", flush=True)
    check = _output_check(root)

    systems: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, str, list[str], dict[str, str]]] = []
    loaders = str(HERE / "_loaders.py")
    plan.append(("torch DataLoader", "dataloader", [sys.executable, loaders, "dataloader"], _env()))
    if not args.no_spdl:
        why = _spdl_ready()
        if why:
            systems["SPDL"] = {"note": why}
        else:
            plan.append(("SPDL", "spdl", [sys.executable, loaders, "spdl"], _env(SPDL_SITE)))
    plan.append(
        ("asyncflow image.folder", "asyncflow", [sys.executable, loaders, "asyncflow"], _env())
    )
    if not args.no_stock_pillow:
        python = _stock_pillow_python()
        if python:
            plan.append(("torch DataLoader, stock Pillow", "dataloader",
                         [str(python), loaders, "dataloader"], _env()))
        else:
            systems["torch DataLoader, stock Pillow"] = {"note": "could not build the environment"}

    for rep in range(repeats):
        for w in workers:
            for label, _kind, cmd, env in plan:
                print(f"  {label}, {w} worker(s) ({rep + 1}/{repeats}) ...", flush=True)
                full = [*cmd, "--root", str(root), "--workers", str(w), "--epochs", str(epochs),
                        "--size", str(SIZE), "--batch-size", str(BATCH)]
                result, (peak,) = run_child(full, env, timeout=900)
                runs = systems.setdefault(label, {"runs": {}}).setdefault("runs", {})
                old = runs.get(w)
                if old is None or result.get("img_per_s", 0) > old.get("img_per_s", 0):
                    runs[w] = {**result, "peak_rss": max(peak, (old or {}).get("peak_rss", 0))}
                else:
                    old["peak_rss"] = max(old["peak_rss"], peak)
    others = [r.get("others", 0.0) for sy in systems.values() for r in sy.get("runs", {}).values()]
    load = (float(np.mean(others)) if others else 0.0, max(others, default=0.0))

    report = _report(systems, workers, kernels, limit, cores, check, info, n_images, epochs,
                     repeats, load)
    print("\n" + report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_images.md").write_text(report + "\n")
    (RESULTS / "bench_images.json").write_text(json.dumps({
        "images": n_images, "cores": cores, "kernels": kernels, "machine_limit": limit,
        "output_check": check, "backend": info, "systems": systems,
    }, indent=1, default=str))
    series = {
        label: [(w, s["runs"][w].get("img_per_s")) for w in workers if w in s.get("runs", {})]
        for label, s in systems.items() if "runs" in s
    }
    series["machine limit"] = [(w, min(w, cores) * kernels["asyncflow"]) for w in workers]
    svg = line_chart(series, title=f"Decode + resize + crop + normalize, {n_images} JPEGs, "
                     f"{cores} cores", x_label="workers / threads", y_label="images / s",
                     dashed=frozenset({"machine limit"}))
    (RESULTS / "bench_images.svg").write_text(svg)
    print(f"\nwrote {RESULTS / 'bench_images.md'}, .json and .svg")


def _report(systems: dict[str, dict[str, Any]], workers: list[int], kernels: dict[str, float],
            limit: float, cores: int, check: dict[str, float], info: dict[str, Any],
            n_images: int, epochs: int, repeats: int, load: tuple[float, float]) -> str:
    base = systems.get("torch DataLoader", {}).get("runs", {})
    head = "| loader | " + " | ".join(f"{w} worker{'s' * (w > 1)}" for w in workers)
    head += " | CPU ms / image | peak RSS (all processes) |"
    lines = [head, "|---" * (len(workers) + 3) + "|"]
    for label, s in systems.items():
        if "runs" not in s:
            lines.append(f"| {label} | " + " | ".join("n/a" for _ in workers)
                         + f" | | {s['note']} |")
            continue
        cells = []
        for w in workers:
            r = s["runs"].get(w, {})
            if "img_per_s" not in r:
                cells.append(f"failed: {r.get('error', '?')[:60]}")
                continue
            ratio = ""
            if label != "torch DataLoader" and "img_per_s" in base.get(w, {}):
                ratio = f" ({r['img_per_s'] / base[w]['img_per_s']:.2f}x)"
            limit_w = min(w, cores) * kernels["asyncflow"]
            eff = ""
            if label.startswith("asyncflow"):
                eff = f", {r['img_per_s'] / limit_w:.0%} of limit"
            cells.append(f"{r['img_per_s']:.0f}{ratio}{eff}")
        peaks = [s["runs"][w]["peak_rss"] for w in workers if w in s["runs"]]
        base_peaks = [base[w]["peak_rss"] for w in workers if w in base]
        mem = f"{max(peaks) / 2**20:.0f} MiB"
        if label != "torch DataLoader" and base_peaks:
            mem += f" ({max(peaks) / max(base_peaks):.2f}x)"
        cpu = [r["cpu_ms_per_img"] for r in s["runs"].values() if "cpu_ms_per_img" in r]
        cpu_cell = f"{min(cpu):.2f}" if cpu else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {cpu_cell} | {mem} |")
    lines.append(f"| machine limit ({cores} cores x single-thread rate) | "
                 + " | ".join(f"{min(w, cores) * kernels['asyncflow']:.0f}" for w in workers)
                 + f" | {1000 / kernels['asyncflow']:.2f} | |")
    return "\n".join([
        f"Images/s, {n_images} JPEGs (long side 400-900 px, quality 75-95), decode + resize "
        f"{SIZE} + centre-crop + normalize float32 NCHW, batch {BATCH}; best of {epochs} "
        f"epoch(s) after a warm-up epoch, best of {repeats} interleaved run(s); ratios against "
        "torch DataLoader at the same worker count. CPU ms / image: CPU time of all the "
        "loader's processes per image (the least over worker counts), which other programs "
        "running at the same time change far less than they change images/s.",
        "",
        *lines,
        "",
        f"Single thread, per image: asyncflow decode+resize+crop+normalize "
        f"{kernels['asyncflow']:.0f} img/s vs naive PIL + torch {kernels['naive_pil']:.0f} "
        f"img/s ({kernels['asyncflow'] / kernels['naive_pil']:.2f}x). Machine limit "
        f"{limit:.0f} img/s.",
        f"Output check: asyncflow uint8 vs plain full decode + resize + crop over "
        f"{check['images']} images: mean abs diff {check['mean_abs_diff']:.3f} "
        f"(worst image {check['max_image_mean_abs_diff']:.3f}) levels of 255.",
        f"Backend: PIL {info['pil_version']}, pillow-simd {info['pillow_simd']}, libjpeg-turbo "
        f"{info['libjpeg_turbo_version']}. Other programs kept {load[0]:.2f} of {cores} cores "
        f"busy on average during the races (at worst {load[1]:.2f})"
        + (": the images/s columns are unreliable; run again on an idle machine."
           if load[1] > 0.2 else "."),
    ])


if __name__ == "__main__":
    main()
