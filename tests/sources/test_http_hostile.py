"""HTTP reads against servers that misbehave in ways the fault server's other tests leave out
(RELIABILITY 15, 17, 20, 29): an encoded bomb under ``max_bytes``, a ``Retry-After`` longer
than the read's patience."""

from __future__ import annotations

import time
import tracemalloc

import pytest

import asyncflow
from asyncflow import Retry, SourceError
from tests.servers import FaultServer

pytestmark = [pytest.mark.usefixtures("async_leak_check"), pytest.mark.timeout(60)]


async def test_a_gzip_bomb_is_refused_by_max_bytes_without_inflating_it_whole(
    http_server: FaultServer, unique: str
) -> None:
    # 128 MiB of zeros travel as ~128 KiB of gzip; one inflate call per received chunk held
    # each chunk's whole inflation (hundreds of MiB for a larger bomb) before max_bytes could
    # refuse the first slice of it.
    url = http_server.put(f"{unique}.bin", bytes(128 << 20))
    tracemalloc.start()
    try:
        refused = rf"{unique}\.bin\?encoding=\*\*\*: more than 1\.0 MiB"
        with pytest.raises(SourceError, match=refused):
            await asyncflow.read_bytes(url + "?encoding=gzip", max_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak / 2**20:.1f} MiB for a 1 MiB max_bytes"


@pytest.mark.parametrize("retry_after", ["3600", "1e400", "date%2B3600"])
async def test_a_retry_after_past_the_patience_fails_within_the_patience(
    http_server: FaultServer, unique: str, retry_after: str
) -> None:
    # Retry-After is capped at max_retry_after (60 s) and then jittered up to half above it:
    # a read whose patience is 1 s slept 60 to 90 s before giving up.
    url = http_server.url(f"/gen/10/{unique}?fail=99&status=429&retry_after={retry_after}")
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"HTTP 429.*nothing from this host succeeded for 1"):
        await asyncflow.read_bytes(url, retry=Retry(patience=1.0, backoff=0.01))
    assert time.monotonic() - started < 10  # the bound: the patience, not Retry-After
    assert http_server.hits(url) == 1  # no request sent before the server's Retry-After
