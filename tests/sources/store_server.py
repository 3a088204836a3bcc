"""An object store on 127.0.0.1 that throttles and has a latency tail, as real ones do.

``store_server(...)`` runs an aiohttp server on a thread with its own loop. Every ``GET``
whose last path segment is a number ``i`` answers ``size`` bytes derived from ``i`` (so
``http://127.0.0.1:port/obj/7`` and, through an S3 client, ``s3://bucket/obj/7`` work alike).

Behaviours (fixed per server, so that the whole store shares one budget, as a real one does):

- ``rate`` / ``burst``: a token bucket. A request that finds it empty is answered ``503`` with
  an S3 ``SlowDown`` error document, and ``Retry-After: <retry_after>`` when one is given.
- ``latency``: seconds each answer waits; ``slow``: ``{index: seconds}`` for the first
  ``slow_requests`` requests of those objects only (1 by default: a tail that a second request
  escapes).
- ``stuck``: objects whose every request waits an hour.
- ``service``: at most this many answers are served at once (each taking ``latency``); the
  other requests wait their turn, as at a store (or a link) that queues rather than rejects.
- ``truncate_second``: the second request of each ``slow`` object promises the whole body and
  sends half of it, then drops the connection.

``Store`` counts requests, rejections and requests whose client went away before the answer
(``abandoned``: a hedge's loser, cancelled and closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.servers import serve_in_thread

__all__ = ["Store", "body_of", "store_server"]

_SLOWDOWN = ("<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
             "<Message>Please reduce your request rate.</Message></Error>")


def body_of(index: int, size: int) -> bytes:
    """The bytes the store answers for object ``index``."""
    return random.Random(index).randbytes(size)


@dataclass
class Store:
    """A running store: its base URL and what it saw."""

    base: str
    size: int
    hits: Counter[int] = field(default_factory=Counter)
    requests: int = 0
    rejected: int = 0
    abandoned: int = 0

    def url(self, index: int, prefix: str = "obj") -> str:
        return f"{self.base}/{prefix}/{index}"


class _Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.at = asyncio.get_running_loop().time()

    def take(self) -> bool:
        now = asyncio.get_running_loop().time()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def _app(store: Store, *, rate: float | None, burst: float, retry_after: str | None,
         latency: float, slow: dict[int, float], stuck: frozenset[int],
         truncate_second: bool, slow_requests: int = 1, service: int | None = None) -> Any:
    from aiohttp import web

    buckets: list[_Bucket] = []
    counters: list[asyncio.Semaphore] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        last = request.path.rstrip("/").rsplit("/", 1)[-1]
        if not last.isdigit():
            return web.Response(status=404, text="not found")
        index = int(last)
        store.requests += 1
        store.hits[index] += 1
        n = store.hits[index]
        if rate is not None:
            if not buckets:
                buckets.append(_Bucket(rate, burst))
            if not buckets[0].take():
                store.rejected += 1
                headers = {"Retry-After": retry_after} if retry_after is not None else {}
                return web.Response(status=503, headers=headers, text=_SLOWDOWN,
                                    content_type="application/xml")
        body = body_of(index, store.size)
        answered = False
        try:
            wait = slow[index] if n <= slow_requests and index in slow else latency
            if service is None:
                await asyncio.sleep(3600 if index in stuck else wait)
            else:
                if not counters:
                    counters.append(asyncio.Semaphore(service))
                async with counters[0]:
                    await asyncio.sleep(wait)
            answered = True
        finally:  # cancelled: the client went away (handler_cancellation=True)
            store.abandoned += not answered
        headers = {"ETag": f'"{index}-{store.size}"', "Content-Type": "application/octet-stream"}
        if truncate_second and index in slow and n == 2:
            resp = web.StreamResponse(headers=headers)
            resp.content_length = len(body)
            await resp.prepare(request)
            await resp.write(body[: len(body) // 2])
            assert request.transport is not None
            request.transport.abort()
            return resp
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


@contextlib.contextmanager
def store_server(
    *,
    size: int = 2000,
    rate: float | None = None,
    burst: float = 10,
    retry_after: str | None = None,
    latency: float = 0.0,
    slow: dict[int, float] | None = None,
    stuck: frozenset[int] = frozenset(),
    truncate_second: bool = False,
    slow_requests: int = 1,
    service: int | None = None,
) -> Iterator[Store]:
    """Run the store on 127.0.0.1 (a free port) on a thread with its own loop."""
    store = Store("", size)

    def make() -> Any:
        return _app(store, rate=rate, burst=burst, retry_after=retry_after, latency=latency,
                    slow=slow or {}, stuck=stuck, truncate_second=truncate_second,
                    slow_requests=slow_requests, service=service)

    with serve_in_thread(make, "store server") as base:
        store.base = base
        yield store
