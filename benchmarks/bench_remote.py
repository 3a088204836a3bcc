"""Remote reads: asyncflow against bare aiohttp, SPDL and torch's DataLoader, in one run.

A loopback HTTP server in its own process serves N objects (JPEGs of ~60 KB), each answered
after 50 ms, as a remote object store would. Every row fetches all N once; the table gives
objects per second and each row's ratio to the others. Run::

    python benchmarks/bench_remote.py            # 2,000 objects
    python benchmarks/bench_remote.py --quick    # 500 objects, a smoke test of the harness

Rows:
  bare aiohttp      one ClientSession, asyncio.gather under a semaphore of 256
  asyncflow         Pipeline(urls).map(asyncflow.read_bytes, concurrency=256, ordered=False)
  spdl              spdl.pipeline with an aiohttp fetch at concurrency 256 (if installed)
  torch DataLoader  32 workers, each item fetched with urllib
  asyncflow e2e     fetch + asyncflow.image.decode(size=224) + batch(64), end to end
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

CONCURRENCY = 256
LATENCY = 0.05
VARIANTS = 16
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# The server (its own process)
# ---------------------------------------------------------------------------------------------


def _images(target: int = 60_000) -> list[bytes]:
    """``VARIANTS`` distinct JPEGs of about ``target`` bytes each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    side, out = 320, []
    for _ in range(VARIANTS):
        base = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)
        noise = rng.integers(0, 96, (side, side, 3), dtype=np.uint8)
        pixels = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8)) // 2 + noise
        buf = io.BytesIO()
        for quality in range(95, 20, -5):
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, "JPEG", quality=quality)
            if buf.tell() <= target:
                break
        out.append(buf.getvalue())
    return out


class _Http(asyncio.Protocol):
    """A minimal keep-alive HTTP/1.1 server for ``GET /obj/<i>``: answers after ``LATENCY``.

    Hand-written on purpose: the server shares this machine's two cores with the clients, and
    a full framework's per-request cost would be charged to every row. This one costs a few
    tens of microseconds per request, so the rows measure the clients.
    """

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        loop = asyncio.get_running_loop()
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            path = head.split(b" ", 2)[1]
            index = int(path.rsplit(b"/", 1)[1]) if path.startswith(b"/obj/") else -1
            loop.call_later(LATENCY, self._respond, index)

    def _respond(self, index: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if index < 0:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        body = self.blobs[index % VARIANTS]
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def serve() -> None:
    """Serve ``/obj/<i>`` after ``LATENCY`` seconds; print the port, run until killed."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    blobs = _images()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Http(blobs), "127.0.0.1", 0, backlog=4096
        )
        print(server.sockets[0].getsockname()[1], len(blobs[0]), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


class Server:
    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        assert self.proc.stdout is not None
        port, size = self.proc.stdout.readline().split()
        self.base, self.object_size = f"http://127.0.0.1:{port}", int(size)
        return self

    def urls(self, n: int) -> list[str]:
        return [f"{self.base}/obj/{i}" for i in range(n)]

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# The rows: each returns the number of objects (or images) it received
# ---------------------------------------------------------------------------------------------


def bare_aiohttp(urls: list[str]) -> int:
    import aiohttp

    async def main() -> int:
        sem = asyncio.Semaphore(CONCURRENCY)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def get(url: str) -> bytes:
                async with sem, session.get(url) as resp:
                    resp.raise_for_status()
                    return await resp.read()

            bodies = await asyncio.gather(*(get(u) for u in urls))
        return len(bodies)

    return asyncio.run(main())


def asyncflow_read(urls: list[str]) -> int:
    import asyncflow

    pipe = asyncflow.Pipeline(urls).map(
        asyncflow.read_bytes, concurrency=CONCURRENCY, ordered=False
    )
    return sum(1 for _ in pipe)


def spdl_fetch(urls: list[str]) -> int:
    import aiohttp
    from spdl.pipeline import PipelineBuilder

    state: dict[str, Any] = {"done": 0}

    async def fetch(url: str) -> bytes:
        session = state.get("session")
        if session is None:  # created on SPDL's own loop, on first use
            connector = aiohttp.TCPConnector(limit=CONCURRENCY)
            session = state["session"] = aiohttp.ClientSession(connector=connector)
        async with session.get(url) as resp:
            resp.raise_for_status()
            body = await resp.read()
        state["done"] += 1
        if state["done"] == len(urls):
            await session.close()
        return body

    pipeline = (
        PipelineBuilder()
        .add_source(urls)
        .pipe(fetch, concurrency=CONCURRENCY)
        .add_sink(CONCURRENCY)
        .build(num_threads=4)
    )
    with pipeline.auto_stop():
        return sum(1 for _ in pipeline)


class _UrlDataset:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, index: int) -> bytes:
        with urllib.request.urlopen(self.urls[index], timeout=30) as resp:
            return resp.read()  # type: ignore[no-any-return]


def torch_dataloader(urls: list[str]) -> int:
    import warnings

    from torch.utils.data import DataLoader

    with warnings.catch_warnings():  # "32 workers is more than the suggested max": on purpose
        warnings.simplefilter("ignore", UserWarning)
        loader = DataLoader(_UrlDataset(urls), batch_size=None, num_workers=32,
                            prefetch_factor=4)
        return sum(1 for _ in loader)


def asyncflow_e2e(urls: list[str]) -> int:
    import asyncflow

    try:
        from asyncflow.image import decode
    except ImportError:
        decode = None
    if decode is None:
        raise RuntimeError("asyncflow.image.decode is not available")
    pipe = (
        asyncflow.Pipeline(urls)
        .map(asyncflow.read_bytes, concurrency=CONCURRENCY, ordered=False)
        .map(lambda b: decode(b, size=224), concurrency=2)
        .batch(64)
    )
    return sum(len(batch) for batch in pipe)


ROWS: list[tuple[str, Callable[[list[str]], int]]] = [
    ("bare aiohttp (gather, sem 256)", bare_aiohttp),
    ("asyncflow read_bytes (c=256)", asyncflow_read),
    ("spdl async fetch (c=256)", spdl_fetch),
    ("torch DataLoader (32 workers)", torch_dataloader),
    ("asyncflow fetch+decode+batch", asyncflow_e2e),
]


def run_row(
    fn: Callable[[list[str]], int], urls: list[str], repeat: int
) -> tuple[float | None, str]:
    """Objects per second of the best of ``repeat`` passes (the machine may be shared)."""
    best: float | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            got = fn(urls)
        except ImportError as exc:
            return None, f"not installed ({exc.name})"
        except Exception as exc:
            return None, f"failed: {type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - start
        if got != len(urls):
            return None, f"got {got} of {len(urls)} objects"
        best = elapsed if best is None else min(best, elapsed)
    assert best is not None
    return len(urls) / best, f"{best:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 objects instead of 2,000")
    parser.add_argument("--objects", type=int, default=None, help="number of objects")
    parser.add_argument("--repeat", type=int, default=None,
                        help="passes per row, the best counted (default: 1 quick, 3 full)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    n = args.objects or (500 if args.quick else 2000)
    repeat = args.repeat or (1 if args.quick else 3)
    results: dict[str, float | None] = {}
    with Server() as server:
        urls = server.urls(n)
        print(f"{n} objects of {server.object_size / 1000:.0f} KB, each answered after "
              f"{LATENCY * 1000:.0f} ms; {os.cpu_count()} CPUs; server in its own process; "
              f"best of {repeat} pass{'es' if repeat > 1 else ''} per row\n")
        bare_aiohttp(urls[: min(n, 256)])  # warm the server up
        print(f"{'row':34} {'objects/s':>10} {'time':>9}")
        for name, fn in ROWS:
            rate, note = run_row(fn, urls, repeat)
            results[name] = rate
            shown = f"{rate:10.0f}" if rate is not None else f"{'-':>10}"
            print(f"{name:34} {shown} {note:>9}", flush=True)
    print()
    ours = results[ROWS[1][0]]
    targets = [(ROWS[0][0], 0.9, "of bare aiohttp"), (ROWS[2][0], 2.0, "x SPDL"),
               (ROWS[3][0], 8.0, "x DataLoader")]
    for other, target, label in targets:
        theirs = results.get(other)
        if ours is None or theirs is None:
            print(f"asyncflow vs {other}: n/a")
            continue
        ratio = ours / theirs
        shown = f"{ratio:.0%} {label}" if target < 1 else f"{ratio:.2f}{label}"
        wanted = f"{target:.0%}" if target < 1 else f"{target:.0f}x"
        verdict = "met" if ratio >= target else "NOT met"
        print(f"asyncflow / {other}: {shown} (target >= {wanted}: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
