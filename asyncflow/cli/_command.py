"""The ``asyncflow`` command: ``demo``, ``info``, ``bench`` and ``cache info PATH``.

Each subcommand imports what it needs when it runs, so ``asyncflow --help`` and
``asyncflow info`` start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .._errors import AsyncflowError
from .._redact import describe_exception, redact

__all__ = ["build_parser", "run"]


# -- info -----------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def pil_status() -> dict[str, Any]:
    """Which PIL build is installed and active (``image.backend_info()``'s keys).

    Falls back to a report of its own when the image package cannot be imported, since
    ``asyncflow info`` is what users run when things are broken.
    """
    try:
        from ..image import backend_info

        return dict(backend_info())
    except Exception as exc:
        return {
            "pil_version": None,
            "pillow_simd": _version("pillow-simd"),
            "pillow": _version("pillow"),
            # the build this platform should have (see pyproject's markers)
            "simd_expected": sys.platform == "linux" and platform.machine() == "x86_64",
            "libjpeg_turbo": None,
            "problems": [f"the image backend cannot be loaded: {describe_exception(exc)}"],
            "ok": False,
        }


def check_pil(status: dict[str, Any]) -> str | None:
    """What is wrong with the PIL install for ``--check-pil``, or ``None`` when it is right.

    Only the installed distributions count here (exactly one of pillow / pillow-simd, and
    pillow-simd where expected); a missing libjpeg-turbo is reported by ``info`` but does not
    fail the set-up.
    """
    if status.get("pil_version") is None:
        return "; ".join(status.get("problems", ())) or "PIL cannot be imported"
    if status["pillow"] and status["pillow_simd"]:
        return (
            "both pillow and pillow-simd are installed; they overwrite each other's PIL "
            "package. Uninstall both, then reinstall asyncflow."
        )
    if status["simd_expected"] and not status["pillow_simd"]:
        return (
            "pillow-simd is expected on Linux x86_64 but stock pillow is installed (a package "
            "that requires pillow replaced it). Run `pip uninstall -y pillow` and reinstall "
            "asyncflow to get pillow-simd back."
        )
    return None


def _torch_status() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"torch": None, "error": describe_exception(exc)}
    out: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda}
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["cuda_devices"] = [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
    except Exception as exc:
        out["cuda_available"] = False
        out["cuda_error"] = describe_exception(exc)
    return out


def collect_info() -> dict[str, Any]:
    """Everything ``asyncflow info`` reports, as a JSON-able dict."""
    from .. import __version__

    return {
        "asyncflow": __version__,
        "python": sys.version.split()[0],
        "platform": f"{sys.platform} {platform.machine()}",
        "cpus": os.cpu_count(),
        **{dist: _version(dist) for dist in ("numpy", "tqdm", "aiohttp", "aiobotocore")},
        "uvloop": _version("uvloop") if sys.platform != "win32" else None,
        "image": pil_status(),
        "torch": _torch_status(),
    }


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def _pil_lines(pil: dict[str, Any]) -> list[str]:
    build = "pillow-simd" if pil.get("pillow_simd") else "pillow" if pil.get("pillow") else "?"
    expected = "" if pil.get("simd_expected") else " (not expected on this platform)"
    turbo = _yes(pil.get("libjpeg_turbo"))
    if pil.get("libjpeg_turbo_version"):
        turbo += f" ({pil['libjpeg_turbo_version']})"
    lines = [
        f"PIL          {pil.get('pil_version') or 'cannot import'} ({build})",
        f"pillow-simd  {_yes(pil.get('pillow_simd') and not pil.get('pillow'))}{expected}",
        f"libjpeg      {pil.get('jpeg_version') or '?'}; libjpeg-turbo {turbo}",
    ]
    lines += [f"warning      {p}" for p in pil.get("problems", ())]
    return lines


def format_info(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`collect_info`."""
    torch_ = info["torch"]
    if torch_.get("cuda_available"):
        cuda = "available: " + ", ".join(torch_.get("cuda_devices", []))
    else:
        cuda = "not available" + (f" ({torch_['cuda_error']})" if "cuda_error" in torch_ else "")
    build = f"CUDA {torch_['cuda_build']} build" if torch_.get("cuda_build") else "CPU build"
    return "\n".join([
        f"asyncflow    {info['asyncflow']}",
        f"python       {info['python']} ({info['platform']}, {info['cpus']} CPUs)",
        f"numpy        {info['numpy'] or 'not installed'}",
        f"torch        {torch_.get('torch') or 'not installed'} ({build})",
        f"CUDA         {cuda}",
        *_pil_lines(info["image"]),
        f"uvloop       {info['uvloop'] or 'not installed (the asyncio loop is used)'}",
        f"aiohttp      {info['aiohttp'] or 'not installed'}",
        f"aiobotocore  {info['aiobotocore'] or 'not installed (pip install asyncflow[s3])'}",
        f"tqdm         {info['tqdm'] or 'not installed'}",
    ])


def cmd_info(args: argparse.Namespace) -> int:
    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(format_info(info))
    if args.check_pil:
        problem = check_pil(info["image"])
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
    return 0


# -- demo -----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    names = ("data", "device", "batch_size", "size", "images", "epochs", "progress")
    return run_demo(**{name: getattr(args, name) for name in names})


# -- bench ----------------------------------------------------------------------------------


def _bench_dir(explicit: str | None) -> Path | None:
    candidates = [Path(explicit)] if explicit else [
        Path.cwd() / "benchmarks",
        Path(__file__).resolve().parent.parent / "benchmarks",
    ]
    for path in candidates:
        if path.is_dir():
            return path
    return None


def bench_scripts(directory: Path) -> dict[str, Path]:
    """Benchmark scripts by short name: ``bench_images.py`` is ``images``."""
    return {path.stem.removeprefix("bench_"): path
            for path in sorted(directory.glob("*.py")) if not path.name.startswith("_")}


# Benchmarks that measure a GPU: skipped by a plain `asyncflow bench` on a machine without one.
_NEEDS_CUDA = frozenset({"gpu_train", "transfer"})


def cmd_bench(args: argparse.Namespace) -> int:
    directory = _bench_dir(args.dir)
    if directory is None:
        print("error: no benchmarks/ folder here; run from a clone of asyncflow or pass --dir",
              file=sys.stderr)
        return 2
    scripts = bench_scripts(directory)
    if args.list or not scripts:
        if not scripts:
            print(f"no benchmarks in {directory}")
        for name, path in scripts.items():
            print(f"{name:20} {path}")
        return 0
    unknown = [n for n in args.names if n not in scripts]
    if unknown:
        print(f"error: unknown benchmark(s) {', '.join(unknown)}; "
              f"choose from {', '.join(scripts)}", file=sys.stderr)
        return 2
    chosen = args.names or list(scripts)
    if not args.names and not _torch_status().get("cuda_available"):
        skipped = [n for n in chosen if n in _NEEDS_CUDA]
        chosen = [n for n in chosen if n not in _NEEDS_CUDA]
        if skipped:
            print(f"skipping {', '.join(skipped)}: no CUDA GPU here")
    status = 0
    for name in chosen:
        script = scripts[name]
        extra = list(args.extra)
        if args.quick and '"--quick"' in script.read_text():
            extra.insert(0, "--quick")
        print(f"\n=== {name} ({script.name} {' '.join(extra)}) ===".replace(" )", ")"), flush=True)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), *extra], cwd=directory.parent)
        print(f"=== {name}: exit {rc} after {time.perf_counter() - start:.1f} s ===", flush=True)
        status = status or rc
    return status


# -- cache ----------------------------------------------------------------------------------


def cmd_cache_info(args: argparse.Namespace) -> int:
    """Print what the cache at ``PATH`` holds; exit 1 when there is none or it is unusable."""
    from ..cache import info

    try:  # absolute: "." names its folder, whose writer's lock file sits beside it
        result = info(os.path.abspath(args.path))
    except FileNotFoundError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(result)
    return 0 if result.usable else 1


# -- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="asyncflow",
        description="asyncflow: an asyncio-native dataflow framework that feeds PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"asyncflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run the image-folder pipeline on sample data")
    demo.add_argument("--data", metavar="DIR",
                      help="an image folder (one sub-folder per class); default: generated")
    demo.add_argument("--device", default=None,
                      help="move batches to this device, e.g. cuda (default: stay on the CPU)")
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--size", type=int, default=224, help="output side in pixels")
    demo.add_argument("--images", type=int, default=256,
                      help="images to generate when --data is not given")
    demo.add_argument("--epochs", type=int, default=1)
    demo.add_argument("--no-progress", dest="progress", action="store_false",
                      help="no progress bar")
    demo.set_defaults(func=cmd_demo)

    info = sub.add_parser("info", help="versions, Pillow-SIMD, libjpeg-turbo, uvloop, CUDA")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--check-pil", action="store_true",
                      help="exit 1 unless the PIL build is the one this platform should have")
    info.set_defaults(func=cmd_info)

    bench = sub.add_parser("bench", help="run the benchmarks in benchmarks/")
    bench.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default all)")
    bench.add_argument("--list", action="store_true", help="list the benchmarks")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes (passed to each benchmark that has --quick)")
    bench.add_argument("--dir", help="the benchmarks folder (default: ./benchmarks)")
    bench.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                       help="arguments passed on to each benchmark script")
    bench.set_defaults(func=cmd_bench)

    cache = sub.add_parser("cache", help="inspect caches written by .cache(path)")
    cache_sub = cache.add_subparsers(dest="cache_command", metavar="COMMAND", required=True)
    cache_info = cache_sub.add_parser("info", help="what a cache holds")
    cache_info.add_argument("path", metavar="PATH")
    cache_info.add_argument("--json", action="store_true", help="print JSON")
    cache_info.set_defaults(func=cmd_cache_info)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the subcommand."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except AsyncflowError as exc:  # its message, redacted, without a traceback
        print(f"error: {describe_exception(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `asyncflow info | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1

