"""Real servers on 127.0.0.1 for tests: a fault-injecting HTTP server and moto's S3.

Plain context managers, usable from any test (pytest fixtures wrap them in
``tests/sources/conftest.py``)::

    with fault_server() as server:             # aiohttp, on its own thread and loop
        url = server.url("/gen/1000/a.bin?fail=2&status=503&retry_after=0")
    with fault_server_process() as server:     # the same, in a child process
        ...
    with moto_server() as s3:                  # moto's S3 on a free port
        os.environ.update(s3.env())

The fault server answers ``GET`` on these paths:

- ``/gen/<size>/<name>``: ``size`` bytes derived from the path (the same every time).
- ``/store/<name>``: bytes stored before with ``server.put(name, data)`` (or HTTP ``PUT``).
- ``/status/<code>/<name>``: always that status.
- ``/redirect/<name>?to=<url>``: a 302 to ``to``.
- ``/hits?path=<path?query>``: how often that exact path and query (percent-decoded) were
  asked for.
- ``/f/<faults>/<path>``: ``<path>`` with the faults written into the path, as
  ``k=v,k=v`` (for clients that cannot add a query, such as an S3 client: bucket ``f``).

and these query parameters on any of them (counters are per exact path and query):

- ``delay=S``: wait S seconds before answering.
- ``fail=N&status=C&retry_after=R``: the first N requests get status C (default 503), with
  ``Retry-After: R`` when given (``R`` = seconds, or ``date+S`` for an HTTP date S seconds
  ahead), and an S3 error document with ``code=SlowDown`` (any error code).
- ``reset=N``: the first N connections are dropped before any byte is sent.
- ``truncate=N``: the first N responses (``-1``: all) promise the full Content-Length and send
  half the body, then drop the connection.
- ``drip=B&interval=S``: send the body B bytes at a time, S seconds apart.
- ``stall=S``: send half the body, then wait S seconds before the rest.
- ``norange=1``: ignore ``Range`` headers (answer 200 with the whole body).

What a resumed read must check (``/gen`` and ``/store`` answers):

- ``validator=strong|weak|date|newdate|none``: the object's validator: a strong ``ETag``
  (the default), a weak one (``W/"..."``), only a ``Last-Modified`` date (long past, or the
  answer's own second, which is too weak to prove anything), or none. A ``Range``
  with an ``If-Range`` that does not match it strongly gets the whole object (200).
- ``swap=N``: after N requests, the object is replaced by another version (``/gen``: other
  bytes of the same size; ``/store/<name>``: what is stored as ``<name>.v2``).
- ``ifrange=ignore``: answer a ``Range`` even when its ``If-Range`` does not match.
- ``crange=V``: a 206 carries ``Content-Range: V`` instead of the true one, where
  ``{start}``, ``{end}``, ``{total}`` (and ``{start_plus}``, ``{end_minus}``, ``{total_plus}``,
  one more or less) stand for the true values.
- ``clen=V``: the answer carries ``Content-Length: V`` (verbatim), then the body.
- ``encoding=gzip|deflate|rawdeflate&cut=K``: the body is sent compressed with that
  ``Content-Encoding``, less its last K bytes, under a Content-Length that matches what is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gzip
import hashlib
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FaultServer",
    "S3Server",
    "fault_app",
    "fault_server",
    "fault_server_process",
    "free_port",
    "moto_server",
    "moto_set_auth",
]

LOOPBACK = "127.0.0.1"
_RANGE_HEADERS = frozenset({"Range", "If-Range"})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def generated(path: str, size: int) -> bytes:
    """The body ``/gen/<size>/...`` answers for ``path``: deterministic pseudo-random bytes."""
    return random.Random(path).randbytes(size)


# ---------------------------------------------------------------------------------------------
# The fault-injecting HTTP server
# ---------------------------------------------------------------------------------------------


def fault_app(
    store: dict[str, bytes] | None = None,
    hits: Counter[str] | None = None,
    seen: list[tuple[str, dict[str, str]]] | None = None,
) -> Any:
    """The aiohttp application of the fault server (``store``, ``hits`` and ``seen``, the
    range headers of each request, may be shared)."""
    from aiohttp import web

    store = {} if store is None else store
    hits = Counter() if hits is None else hits
    seen = [] if seen is None else seen

    def split(request: web.Request) -> tuple[str, dict[str, str]]:
        """The content path and the faults: the query's, plus any in an ``/f/<k=v,...>`` prefix."""
        faults = dict(request.query)
        path = request.path
        if path.startswith("/f/"):
            _, _, spec, *rest = path.split("/", 3)
            faults.update(item.split("=", 1) for item in spec.split(",") if "=" in item)
            path = "/" + (rest[0] if rest else "")
        return path, faults

    def body_for(path: str) -> bytes | None:
        parts = path.strip("/").split("/")
        if parts[0] == "gen" and len(parts) >= 2 and parts[1].isdigit():
            return generated(path, int(parts[1]))
        if parts[0] == "store" and len(parts) >= 2:
            return store.get("/".join(parts[1:]))
        return None

    def validators(body: bytes, kind: str) -> dict[str, str]:
        digest = hashlib.sha1(body).hexdigest()[:20]
        if kind == "date":  # a distinct date per version, long before the answer's Date
            return {"Last-Modified": email.utils.formatdate(1e9 + int(digest, 16) % 10**8,
                                                             usegmt=True)}
        if kind == "newdate":  # modified within the answer's second: too weak to prove anything
            return {"Last-Modified": email.utils.formatdate(time.time(), usegmt=True)}
        if kind == "none":
            return {}
        return {"ETag": f'{"W/" if kind == "weak" else ""}"{digest}"'}

    def encoded(body: bytes, coding: str) -> bytes:
        if coding == "gzip":
            return gzip.compress(body)
        packer = zlib.compressobj(wbits=-15 if coding == "rawdeflate" else 15)
        return packer.compress(body) + packer.flush()

    def retry_after(value: str) -> str:
        if value.startswith("date+"):
            when = time.time() + float(value[5:])
            return email.utils.formatdate(when, usegmt=True)
        return value

    def drop(request: web.Request) -> None:
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:  # an RST, as a crashed peer would send, not a polite FIN
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
            transport.abort()

    async def dropped(request: web.Request) -> web.StreamResponse:
        drop(request)
        # Losing the connection cancels this handler (handler_cancellation=True), quietly.
        await asyncio.sleep(3600)
        raise AssertionError("unreachable: the handler is cancelled first")

    def failure(status: int, q: dict[str, str]) -> web.Response:
        headers = {"Retry-After": retry_after(q["retry_after"])} if "retry_after" in q else {}
        if "code" in q:  # an S3-style error document, as botocore parses it
            body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{q['code']}</Code>"
                    f"<Message>injected</Message></Error>")
            return web.Response(status=status, headers=headers, text=body,
                                content_type="application/xml")
        return web.Response(status=status, headers=headers, text="injected failure")

    async def handle_get(request: web.Request) -> web.StreamResponse:
        path, q = split(request)
        key = urllib.parse.unquote(request.path_qs)
        hits[key] += 1
        n = hits[key]
        seen.append((key, {k: v for k, v in request.headers.items() if k in _RANGE_HEADERS}))
        if "delay" in q:
            await asyncio.sleep(float(q["delay"]))
        if n <= int(q.get("reset", 0)):
            return await dropped(request)
        if n <= int(q.get("fail", 0)):
            return failure(int(q.get("status", 503)), q)
        parts = path.strip("/").split("/")
        if parts[0] == "status" and len(parts) >= 2:
            return failure(int(parts[1]), q)
        if parts[0] == "redirect":
            raise web.HTTPFound(q["to"])
        swapped = "swap" in q and n > int(q["swap"])
        body = body_for(path + ".v2" if swapped else path)
        if body is None:
            return web.Response(status=404, text="not found")
        status, start = 200, 0
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   **validators(body, q.get("validator", "strong"))}
        if "encoding" in q:
            body = encoded(body, q["encoding"])[: -int(q["cut"]) or None if "cut" in q else None]
            headers["Content-Encoding"] = q["encoding"].removeprefix("raw")
        rng = request.headers.get("Range", "")
        if_range = request.headers.get("If-Range")
        current = headers.get("ETag", headers.get("Last-Modified"))
        fresh = if_range is None or (if_range == current and not if_range.startswith("W/"))
        fresh = fresh or q.get("ifrange") == "ignore"
        if rng.startswith("bytes=") and not q.get("norange") and fresh:
            start = int(rng[6:].split("-")[0] or 0)
            if start >= len(body):
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(body)}"})
            status = 206
            end, total = len(body) - 1, len(body)
            headers["Content-Range"] = q.get("crange", "bytes {start}-{end}/{total}").format(
                start=start, end=end, total=total, start_plus=start + 1, end_minus=end - 1,
                total_plus=total + 1)
            body = body[start:]
        truncate = int(q.get("truncate", 0))
        resp = web.StreamResponse(status=status, headers=headers)
        if "clen" in q:
            resp.headers["Content-Length"] = q["clen"]
        elif "chunked" in q:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(body)
        await resp.prepare(request)
        if n <= int(q.get("dropend", 0)):  # every byte sent, then the connection lost
            await resp.write(body)
            await asyncio.sleep(0.01)
            return await dropped(request)
        if truncate == -1 or n <= truncate:
            await resp.write(body[: len(body) // 2])
            await asyncio.sleep(0.01)
            return await dropped(request)
        if "stall" in q:
            await resp.write(body[: len(body) // 2])
            await asyncio.sleep(float(q["stall"]))
            body = body[len(body) // 2:]
        if "drip" in q:
            step, interval = int(q["drip"]), float(q.get("interval", 0.01))
            for pos in range(0, len(body), step):
                await resp.write(body[pos:pos + step])
                await asyncio.sleep(interval)
        else:
            await resp.write(body)
        await resp.write_eof()
        return resp

    async def handle_put(request: web.Request) -> web.Response:
        store[request.path.strip("/").split("/", 1)[1]] = await request.read()
        return web.Response(status=201)

    async def handle_hits(request: web.Request) -> web.Response:
        return web.Response(text=str(hits[request.query["path"]]))

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/hits", handle_hits)
    app.router.add_put("/store/{name:.+}", handle_put)
    app.router.add_get("/{tail:.*}", handle_get)
    return app


@dataclass
class FaultServer:
    """A running fault server: its base URL, its store and its hit counts."""

    base: str
    _store: dict[str, bytes] | None = None
    _hits: Counter[str] | None = None
    _seen: list[tuple[str, dict[str, str]]] | None = None

    def url(self, path: str) -> str:
        """The full URL of ``path`` (``"/gen/10/a.bin?fail=1"``)."""
        return self.base + path

    def put(self, name: str, data: bytes) -> str:
        """Store ``data`` under ``/store/<name>``; returns its URL."""
        if self._store is not None:
            self._store[name] = data
        else:
            req = urllib.request.Request(self.url(f"/store/{name}"), data=data, method="PUT")
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()
        return self.url(f"/store/{name}")

    def requests(self, url_or_path: str) -> list[dict[str, str]]:
        """The ``Range`` and ``If-Range`` headers of each request for exactly this path and
        query, in order (a server on a thread only)."""
        if self._seen is None:
            raise RuntimeError("requests() needs the fault server on a thread")
        path = url_or_path[len(self.base):] if url_or_path.startswith(self.base) else url_or_path
        path = urllib.parse.unquote(path)
        return [headers for key, headers in self._seen if key == path]

    def hits(self, url_or_path: str) -> int:
        """How many requests asked for exactly this path and query."""
        path = url_or_path[len(self.base):] if url_or_path.startswith(self.base) else url_or_path
        path = urllib.parse.unquote(path)
        if self._hits is not None:
            return self._hits[path]
        query = urllib.parse.urlencode({"path": path})
        with urllib.request.urlopen(self.url(f"/hits?{query}"), timeout=10) as resp:
            return int(resp.read())


async def _serve(app: Any, host: str, port: int, started: Any, stop: asyncio.Event) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=4096)
        await site.start()
        started(runner.addresses[0][1])
        await stop.wait()
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def serve_in_thread(make_app: Callable[[], Any], name: str) -> Iterator[str]:
    """Serve ``make_app()`` (built on the server's loop) on 127.0.0.1 (a free port) on a
    thread with its own loop; yield its base URL; stop it on exit."""
    ready = threading.Event()
    port: list[int] = []
    failure: list[BaseException] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def started(p: int) -> None:
        port.append(p)
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_serve(make_app(), LOOPBACK, 0, started, stop))
        except BaseException as exc:  # reported to the starting thread
            failure.append(exc)
            ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait(30)
    if failure or not port:
        raise RuntimeError(f"the {name} did not start: {failure}")
    try:
        yield f"http://{LOOPBACK}:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


@contextlib.contextmanager
def fault_server() -> Iterator[FaultServer]:
    """Run the fault server on 127.0.0.1 (a free port) on a thread with its own loop."""
    store: dict[str, bytes] = {}
    hits: Counter[str] = Counter()
    seen: list[tuple[str, dict[str, str]]] = []
    with serve_in_thread(lambda: fault_app(store, hits, seen), "fault server") as base:
        yield FaultServer(base, store, hits, seen)


@contextlib.contextmanager
def fault_server_process() -> Iterator[FaultServer]:
    """Run the fault server in a child process (``python -m tests.servers fault``)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers", "fault"],
        cwd=root, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the fault server process did not start: {line!r}")
        yield FaultServer(f"http://{LOOPBACK}:{int(line)}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# moto's S3 in server mode
# ---------------------------------------------------------------------------------------------


@dataclass
class S3Server:
    """A running moto server and the fake credentials that go with it."""

    endpoint_url: str
    region: str = "us-east-1"
    access_key: str = "testing"
    secret_key: str = "testing"
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """Environment variables that point the standard AWS chain at this server only."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            # Keep a developer's own ~/.aws out of the tests.
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            **self.extra_env,
        }


def moto_set_auth(endpoint_url: str, free_actions: float) -> None:
    """Check credentials on every request after the next ``free_actions`` (``inf``: never).

    moto accepts any credentials by default; with ``free_actions=0`` each request must be
    signed with an access key that moto's IAM knows, and be allowed by that user's policies.
    """
    req = urllib.request.Request(
        f"{endpoint_url}/moto-api/reset-auth",
        data=str(free_actions).encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},  # a form type would hide the body from moto
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def moto_reset(endpoint_url: str) -> None:
    """Forget every bucket and object the server holds."""
    req = urllib.request.Request(f"{endpoint_url}/moto-api/reset", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


@contextlib.contextmanager
def moto_server() -> Iterator[S3Server]:
    """Run moto's server (``ThreadedMotoServer``) on 127.0.0.1, on a free port."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO, whatever ``verbose`` says.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()


def _main(argv: list[str]) -> None:
    if argv[:1] != ["fault"]:
        raise SystemExit("usage: python -m tests.servers fault")

    async def run() -> None:
        stop = asyncio.Event()

        def started(port: int) -> None:
            print(port, flush=True)

        await _serve(fault_app(), LOOPBACK, 0, started, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    _main(sys.argv[1:])
