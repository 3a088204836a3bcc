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

pytestmark = [pytest.mark.usefixtures("warm_executor", "async_leak_check"), pytest.mark.timeout(60)]


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


@pytest.mark.parametrize(("validator", "refused"), [
    ("strong", r"the object changed while it was being read \(its ETag"),
    ("none", r"the first answer had no ETag, so nothing proves a resumed range"),
])
async def test_an_s3_store_that_ignores_if_match_never_splices_two_versions(
    http_server: FaultServer, unique: str, monkeypatch: pytest.MonkeyPatch, validator: str,
    refused: str,
) -> None:
    # The fault server as an S3 endpoint ignores IfMatch, as a careless S3-compatible store
    # may: the first try breaks at byte 50,000, the object is replaced, and the resumed range
    # of the new version was joined to the old half and returned as a whole object.
    pytest.importorskip("aiobotocore")
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    url = f"s3://f/validator={validator},swap=1,truncate=1/gen/100000/{unique}.bin"
    with pytest.raises(SourceError, match=rf"{unique}\.bin: {refused}"):
        await asyncflow.read_bytes(url, endpoint_url=http_server.base, max_bytes=1 << 20,
                                   retry=Retry(attempts=4, backoff=0.01, max_backoff=0.05))
