"""HTTP reads against a real fault-injecting server on 127.0.0.1 (RELIABILITY 15-19, 23, 25)."""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import tarfile
import time
import traceback
import urllib.parse
from types import SimpleNamespace
from typing import Any

import pytest

import asyncflow
from asyncflow import (
    ConfigError,
    Retry,
    SourceError,
    SourceNotFound,
    SourcePermissionError,
    SourceTimeout,
    Timeout,
    sources,
)
from asyncflow.sources import _http_ranges, _http_session
from asyncflow.sources._retry import Transient
from tests.servers import FaultServer, fault_server_process, generated

pytestmark = pytest.mark.usefixtures("async_leak_check")

FAST = Retry(attempts=4, backoff=0.01, max_backoff=0.05)


def everything_about(exc: BaseException) -> str:
    """Every text a user could see of ``exc``: message, repr, traceback, notes, chain."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc),
                      *getattr(exc, "__notes__", [])])


async def test_reads_the_whole_body(http_server: FaultServer, unique: str) -> None:
    path = f"/gen/70000/{unique}.bin"
    assert await asyncflow.read_bytes(http_server.url(path)) == generated(path, 70000)


async def test_503_burst_with_retry_after_is_retried(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/1000/{unique}?fail=3&status=503&retry_after=0")
    assert len(await asyncflow.read_bytes(url, retry=FAST)) == 1000
    assert http_server.hits(url) == 4


@pytest.mark.parametrize("status", [429, 500, 502, 504])
async def test_retryable_statuses(http_server: FaultServer, unique: str, status: int) -> None:
    url = http_server.url(f"/gen/10/{unique}?fail=2&status={status}")
    assert len(await asyncflow.read_bytes(url, retry=FAST)) == 10
    assert http_server.hits(url) == 3


async def test_retry_after_seconds_is_honoured(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}?fail=1&status=429&retry_after=1")
    start = time.monotonic()
    await asyncflow.read_bytes(url, retry=FAST)
    assert time.monotonic() - start >= 1.0
    assert http_server.hits(url) == 2


async def test_retry_after_http_date_is_honoured(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}?fail=1&status=503&retry_after=date%2B2")
    start = time.monotonic()
    await asyncflow.read_bytes(url, retry=FAST)
    assert time.monotonic() - start >= 1.0  # an HTTP date has whole seconds: 1 to 2 s ahead


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, SourceNotFound), (410, SourceNotFound), (403, SourcePermissionError),
     (401, SourcePermissionError), (400, SourceError)],
)
async def test_fails_at_once_without_retry(
    http_server: FaultServer, unique: str, status: int, error: type[Exception]
) -> None:
    url = http_server.url(f"/status/{status}/{unique}?X-Amz-Signature=s3cr3t")
    with pytest.raises(error) as info:
        await asyncflow.read_bytes(url, retry=FAST)
    assert http_server.hits(url) == 1
    message = str(info.value)
    assert f"/status/{status}/{unique}?X-Amz-Signature=***" in message
    assert f"HTTP {status}" in message and "1 attempt" in message
    assert "s3cr3t" not in everything_about(info.value)


async def test_final_error_names_url_status_and_attempts(
    http_server: FaultServer, unique: str
) -> None:
    url = http_server.url(f"/status/502/{unique}?token=abc")
    with pytest.raises(SourceError) as info:
        await asyncflow.read_bytes(url, retry=Retry(attempts=3, backoff=0))
    assert str(info.value) == (
        f"GET {http_server.base}/status/502/{unique}?token=***: "
        "HTTP 502 Bad Gateway (gave up after 3 attempts)"
    )
    assert http_server.hits(url) == 3


@pytest.mark.parametrize("status", [429, 503])
async def test_throttling_gives_up_only_without_progress(
    http_server: FaultServer, unique: str, status: int
) -> None:
    url = http_server.url(f"/status/{status}/{unique}?token=abc")
    retry = Retry(attempts=2, backoff=0.01, patience=0.5)
    with pytest.raises(SourceError) as info:
        async with asyncio.timeout(10):
            await asyncflow.read_bytes(url, retry=retry)
    hits = http_server.hits(url)
    assert hits > 2  # throttled tries never use up attempts
    named = f"GET {http_server.base}/status/{status}/{unique}?token=***: HTTP {status}"
    assert str(info.value).startswith(named)
    assert str(info.value).endswith(
        f"(gave up after {hits} attempts; throttled, nothing from this host succeeded for 0.5s)"
    )


async def test_connection_resets_are_retried(http_server: FaultServer, unique: str) -> None:
    path = f"/gen/5000/{unique}"
    url = http_server.url(f"{path}?reset=2")
    body = await asyncflow.read_bytes(url, retry=FAST)
    assert body == generated(path, 5000)
    assert http_server.hits(url) == 3


async def test_truncated_body_is_retried_never_returned(
    http_server: FaultServer, unique: str
) -> None:
    path = f"/gen/50000/{unique}"
    url = http_server.url(f"{path}?truncate=2")
    assert await asyncflow.read_bytes(url, retry=FAST) == generated(path, 50000)
    assert http_server.hits(url) == 3


async def test_always_truncated_body_fails(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/50000/{unique}?truncate=-1")
    with pytest.raises(SourceError, match=r"truncated.*gave up after 3 attempts"):
        await asyncflow.read_bytes(url, retry=Retry(attempts=3, backoff=0))


async def test_stalled_read_times_out_per_read(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/100000/{unique}?stall=5")
    start = time.monotonic()
    with pytest.raises(SourceTimeout, match=r"read timed out \(read=0.2s\).*2 attempts"):
        await asyncflow.read_bytes(url, retry=Retry(attempts=2, backoff=0),
                                   timeout=Timeout(read=0.2))
    assert time.monotonic() - start < 3


async def test_slow_steady_download_is_not_killed(http_server: FaultServer, unique: str) -> None:
    # 40 chunks 40 ms apart: 1.6 s in all, far longer than the per-read timeout.
    path = f"/gen/80000/{unique}"
    url = http_server.url(f"{path}?drip=2000&interval=0.04")
    start = time.monotonic()
    body = await asyncflow.read_bytes(url, retry=Retry(attempts=1), timeout=Timeout(read=0.5))
    assert body == generated(path, 80000)
    assert time.monotonic() - start > 1.0
    assert http_server.hits(url) == 1


async def test_total_deadline(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}?delay=5")
    with pytest.raises(SourceTimeout, match=r"total=0\.3s"):
        await asyncflow.read_bytes(url, timeout=Timeout(total=0.3))


async def test_redirects_are_followed(http_server: FaultServer, unique: str) -> None:
    path = f"/gen/300/{unique}"
    url = http_server.url(f"/redirect/{unique}?to={path}")
    assert await asyncflow.read_bytes(url) == generated(path, 300)


async def test_redirects_are_capped(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}")
    for hop in range(_http_session.MAX_REDIRECTS + 1):
        url = http_server.url(f"/redirect/{unique}-{hop}?to={url}")
    with pytest.raises(SourceError, match="more than 5 redirects"):
        await asyncflow.read_bytes(url)


@pytest.mark.parametrize("target", ["https://{host}/gen/10/x", "s3://bucket/key",
                                    "file:///etc/passwd"])
async def test_redirects_never_change_scheme(
    http_server: FaultServer, unique: str, target: str
) -> None:
    to = target.format(host=http_server.base.removeprefix("http://"))
    url = http_server.url(f"/redirect/{unique}?to={to}")
    with pytest.raises(SourcePermissionError, match="refused"):
        await asyncflow.read_bytes(url)


async def test_only_enabled_schemes_are_read(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}")
    with pytest.raises(SourcePermissionError, match="scheme 'http' is not enabled"):
        await asyncflow.read_bytes(url, schemes={"s3", "file"})
    assert http_server.hits(url) == 0
    assert len(await asyncflow.read_bytes(url, schemes=["HTTP"])) == 10
    with pytest.raises(ConfigError):
        await asyncflow.read_bytes(url, schemes="http")
    with pytest.raises(ConfigError):
        await asyncflow.read_bytes(url, schemes={"http", "ftp"})
    with pytest.raises(SourceError, match="unsupported scheme 'ftp'"):
        await asyncflow.read_bytes("ftp://example.invalid/x")


async def test_session_scope_limits_schemes(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}")
    async with sources.session(schemes={"s3"}):
        with pytest.raises(SourcePermissionError):
            await asyncflow.read_bytes(url)
    assert http_server.hits(url) == 0


async def test_secrets_never_reach_errors_or_logs(
    http_server: FaultServer, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host = http_server.base.removeprefix("http://")
    secrets = ("hunter2", "SIGsecret", "TOKsecret")
    paths = [f"/status/503/{unique}", f"/status/404/{unique}", f"/gen/10/{unique}?reset=9",
             f"/gen/100000/{unique}?stall=3", f"/gen/5000/{unique}?truncate=-1"]
    for path in paths:
        sep = "&" if "?" in path else "?"
        url = (f"http://alice:hunter2@{host}{path}{sep}X-Amz-Signature=SIGsecret"
               "&X-Amz-Security-Token=TOKsecret")
        with pytest.raises(SourceError) as info:
            await asyncflow.read_bytes(url, retry=Retry(attempts=2, backoff=0, patience=0.2),
                                       timeout=Timeout(read=0.3))
        seen = everything_about(info.value)
        assert "X-Amz-Signature=***" in seen
        for secret in secrets:
            assert secret not in seen, (path, seen)
    assert "try 2 of 2" in caplog.text  # the retries were logged ...
    for secret in secrets:
        assert secret not in caplog.text  # ... without a secret


async def test_basic_auth_in_the_url_is_sent(http_server: FaultServer, unique: str) -> None:
    host = http_server.base.removeprefix("http://")
    assert len(await asyncflow.read_bytes(f"http://u:p@{host}/gen/10/{unique}")) == 10


async def test_outside_a_run_no_session_is_left_open(
    http_server: FaultServer, unique: str, count_sessions: list[Any]
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    try:
        for i in range(3):
            await asyncflow.read_bytes(http_server.url(f"/gen/10/{unique}-{i}"))
        with pytest.raises(SourceNotFound):
            await asyncflow.read_bytes(http_server.url(f"/status/404/{unique}"))
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert len(count_sessions) == 4  # one private session per call ...
    assert all(s.closed for s in count_sessions)  # ... each closed when the call returned
    assert not reported, reported


async def test_session_block_shares_one_pool(
    http_server: FaultServer, unique: str, count_sessions: list[Any]
) -> None:
    async with sources.session(retry=FAST):
        bodies = await asyncio.gather(
            *(asyncflow.read_bytes(http_server.url(f"/gen/100/{unique}-{i}")) for i in range(50))
        )
        assert len(count_sessions) == 1 and not count_sessions[0].closed
    assert [len(b) for b in bodies] == [100] * 50
    assert count_sessions[0].closed


async def test_session_options_are_checked() -> None:
    with pytest.raises(ConfigError):
        async with sources.session(connections=0):
            pass
    with pytest.raises(ConfigError):
        async with sources.session(schemes={"gopher"}):
            pass


async def test_thousands_of_requests_above_the_connection_limit(
    http_server: FaultServer, unique: str
) -> None:
    async with asyncio.timeout(60), sources.session(connections=8):
        bodies = await asyncio.gather(
            *(asyncflow.read_bytes(http_server.url(f"/gen/64/{unique}-{i}"))
              for i in range(1500))
        )
    assert len(bodies) == 1500 and all(len(b) == 64 for b in bodies)


async def test_cancelling_a_download_closes_it(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/100000/{unique}?drip=1000&interval=0.05")
    async with sources.session() as scope:
        task = asyncio.create_task(asyncflow.read_bytes(url))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert scope is not None


async def test_fault_server_in_a_child_process(unique: str) -> None:
    with fault_server_process() as server:
        url = server.url(f"/gen/100/{unique}?fail=1&status=503")
        assert await asyncflow.read_bytes(url, retry=FAST) == generated(f"/gen/100/{unique}", 100)
        assert server.hits(url) == 2
        stored = server.put(f"{unique}/x.bin", b"payload")
        assert await asyncflow.read_bytes(stored) == b"payload"


# -- A body comes back whole and from one version of the object (RELIABILITY 17, 28, 29) --

BIG = 200_000


def two_versions(server: FaultServer, unique: str) -> tuple[str, bytes, bytes]:
    """The URL of a stored object, its bytes, and the bytes ``swap=N`` replaces them with."""
    v1, v2 = generated(f"{unique}-v1", BIG), generated(f"{unique}-v2", BIG)
    server.put(f"{unique}/obj.v2", v2)
    return server.put(f"{unique}/obj", v1), v1, v2


async def test_a_broken_read_resumes_with_if_range(http_server: FaultServer, unique: str) -> None:
    url, v1, _ = two_versions(http_server, unique)
    url += "?truncate=1"
    assert await asyncflow.read_bytes(url, retry=FAST) == v1
    first, second = http_server.requests(url)
    assert first == {}
    offset = int(second["Range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < offset < BIG and second["If-Range"].startswith('"')


async def test_a_chunked_body_broken_after_its_last_byte_is_whole(
    http_server: FaultServer, unique: str
) -> None:
    # No Content-Length: the client cannot know the body ended; the resumed range starts at
    # the object's end, and the server's 416 (bytes */size) says nothing is left.
    url, v1, _ = two_versions(http_server, unique)
    url += "?chunked=1&dropend=1"
    assert await asyncflow.read_bytes(url, retry=FAST) == v1
    first, second = http_server.requests(url)
    assert first == {} and second["Range"] == f"bytes={BIG}-"


@pytest.mark.parametrize("raw", ["", "bytes */5", "bytes 0-9/10", "bytes */"])
def test_a_416_that_does_not_end_the_object_where_the_read_stands_is_an_error(raw: str) -> None:
    from asyncflow.sources._http_ranges import Resume, _ends_at

    resp: Any = SimpleNamespace(headers={"Content-Range": raw} if raw else {})
    with pytest.raises(SourceError, match=r"^obj: HTTP 416 with Content-Range .* bytes=10-$"):
        _ends_at(resp, 10, Resume(), "obj")
    whole: Any = SimpleNamespace(headers={"Content-Range": "bytes */10"})
    _ends_at(whole, 10, Resume(), "obj")  # nothing left: no error


@pytest.mark.parametrize("validator", ["strong", "date", "weak", "newdate", "none"])
async def test_an_object_replaced_between_tries_is_never_spliced(
    http_server: FaultServer, unique: str, validator: str
) -> None:
    url, _, v2 = two_versions(http_server, unique)
    url += f"?truncate=1&swap=1&validator={validator}"
    assert await asyncflow.read_bytes(url, retry=FAST) == v2
    second = http_server.requests(url)[1]
    if validator in ("weak", "newdate", "none"):  # nothing proves the object unchanged
        assert second == {}
    else:
        assert "If-Range" in second and "W/" not in second["If-Range"]


async def test_a_206_of_another_version_starts_again(
    http_server: FaultServer, unique: str
) -> None:
    # A server that ignores If-Range answers the range of the new version, with its ETag.
    url, _, v2 = two_versions(http_server, unique)
    url += "?truncate=1&swap=1&ifrange=ignore"
    assert await asyncflow.read_bytes(url, retry=FAST) == v2
    assert [("Range" in r) for r in http_server.requests(url)] == [False, True, False]


async def test_a_200_to_a_range_restarts_from_zero(http_server: FaultServer, unique: str) -> None:
    url, v1, _ = two_versions(http_server, unique)
    url += "?truncate=1&norange=1"
    assert await asyncflow.read_bytes(url, retry=FAST) == v1
    assert http_server.hits(url) == 2


@pytest.mark.parametrize("crange", [
    "bytes {start_plus}-{end}/{total}",
    "bytes 0-{end}/{total}",
    "bytes {start}-{end_minus}/{total}",
    "bytes {start}-{end}/{total_plus}",
    "bytes {start}-{end}/*",
    "bytes {end}-{start}/{total}",
    "bytes={start}-{end}/{total}",
    "bytes {start}-{end}",
    "garbage",
    "",
])
async def test_a_206_with_another_range_than_asked_is_refused(
    http_server: FaultServer, unique: str, crange: str
) -> None:
    stored, _, _ = two_versions(http_server, unique)
    url = f"{stored}?truncate=1&crange={urllib.parse.quote(crange)}&token=s3cr3t"
    with pytest.raises(SourceError, match="HTTP 206") as info:
        await asyncflow.read_bytes(url, retry=FAST)
    assert "not retryable" in str(info.value) and http_server.hits(url) == 2
    assert f"/store/{unique}/obj?truncate=***" in str(info.value)
    assert "s3cr3t" not in everything_about(info.value)


@pytest.mark.parametrize("clen", ["-1", str(2**50), str(10**30)])
async def test_an_invalid_content_length_is_refused(
    http_server: FaultServer, unique: str, clen: str
) -> None:
    url = http_server.url(f"/gen/10/{unique}?clen={clen}")
    with pytest.raises(SourceError, match=r"Content-Length.*not retryable"):
        await asyncflow.read_bytes(url, retry=FAST)
    assert http_server.hits(url) == 1


@pytest.mark.parametrize("coding", ["gzip", "deflate", "rawdeflate"])
async def test_an_encoded_body_is_decoded(
    http_server: FaultServer, unique: str, coding: str
) -> None:
    path = f"/gen/100000/{unique}"
    assert await asyncflow.read_bytes(http_server.url(f"{path}?encoding={coding}")) == generated(
        path, 100000)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "rawdeflate"])
@pytest.mark.parametrize("cut", [1, 8, 1000])
async def test_an_encoded_body_cut_short_is_never_returned(
    http_server: FaultServer, unique: str, coding: str, cut: int
) -> None:
    # Content-Length matches what is sent: only the decoder can tell that the stream is cut.
    url = http_server.url(f"/gen/100000/{unique}?encoding={coding}&cut={cut}")
    with pytest.raises(SourceError, match=r"ends before the end of its stream.*3 attempts"):
        await asyncflow.read_bytes(url, retry=Retry(attempts=3, backoff=0))


async def test_an_unknown_encoding_is_refused(http_server: FaultServer, unique: str) -> None:
    with pytest.raises(SourceError, match="unsupported Content-Encoding 'br'"):
        await asyncflow.read_bytes(http_server.url(f"/gen/100/{unique}?encoding=br"))


async def read_in_two_tries(url: str) -> tuple[bytes, list[bytes]]:
    """The bytes of a first try that breaks, then the chunks of a second from there."""
    what = f"GET {url}"
    resume = _http_ranges.Resume()  # one per read, given to both tries
    got = bytearray()
    async with _http_session.http_session() as session:
        with pytest.raises(Transient):
            async for chunk in _http_ranges.stream(session, url, 0, what=what, retry=FAST,
                                                   timeout=Timeout(), resume=resume):
                got += chunk
        rest = [c async for c in _http_ranges.stream(session, url, len(got), what=what,
                                                     retry=FAST, timeout=Timeout(), resume=resume)]
    return bytes(got), rest


@pytest.mark.parametrize("query", ["truncate=1", "truncate=1&validator=date",
                                   "truncate=1&norange=1",
                                   # issue 25.14: nothing proves the object unchanged, or the
                                   # server ignores Range: read from 0, the prefix re-hashed
                                   "truncate=1&validator=none",
                                   "truncate=1&validator=none&norange=1",
                                   "truncate=1&validator=weak", "truncate=1&validator=newdate",
                                   "truncate=1&encoding=gzip"])
async def test_a_stream_resumes_the_same_object(
    http_server: FaultServer, unique: str, query: str
) -> None:
    url, v1, _ = two_versions(http_server, unique)
    head, rest = await read_in_two_tries(f"{url}?{query}")
    assert 0 < len(head) < BIG and head + b"".join(rest) == v1


@pytest.mark.parametrize("query", ["swap=1", "swap=1&validator=date", "swap=1&ifrange=ignore",
                                   "swap=1&norange=1", "swap=1&validator=weak",
                                   "swap=1&validator=newdate", "swap=1&validator=none",
                                   "swap=1&validator=none&norange=1", "swap=1&encoding=gzip"])
async def test_a_stream_never_continues_another_version(
    http_server: FaultServer, unique: str, query: str
) -> None:
    url, _, _ = two_versions(http_server, unique)
    with pytest.raises(SourceError, match=r"changed") as info:
        await read_in_two_tries(f"{url}?truncate=1&{query}")
    assert not isinstance(info.value, Transient)
    assert f"/store/{unique}/obj?truncate=1&swap=1" in str(info.value)  # it names the object


async def test_a_shorter_object_read_again_is_refused(
    http_server: FaultServer, unique: str
) -> None:
    # read again from 0, the object ends before the bytes already delivered
    url = http_server.put(f"{unique}/obj", generated(f"{unique}-v1", BIG))
    http_server.put(f"{unique}/obj.v2", generated(f"{unique}-v1", BIG)[:1000])
    with pytest.raises(SourceError, match=r"changed: read again from byte 0, it ends after"):
        await read_in_two_tries(f"{url}?truncate=1&swap=1&validator=none")


@pytest.mark.usefixtures("warm_executor")  # before the leak baseline: tar reads on a thread
async def test_a_tar_shard_replaced_mid_read_is_refused(
    http_server: FaultServer, unique: str
) -> None:
    members = [(f"{i:04d}.bin", generated(f"{unique}-{i}", 20000)) for i in range(10)]
    shards = []
    for version in (1, 2):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data[::-1] if version == 2 else data))
        shards.append(buf.getvalue())
    http_server.put(f"{unique}/shard.tar.v2", shards[1])
    url = http_server.put(f"{unique}/shard.tar", shards[0]) + "?truncate=1&swap=1"
    got: list[tuple[str, bytes]] = []
    with pytest.raises(SourceError, match="changed"):
        async for member in sources.tar_members(url, retry=FAST):
            got.append(member)
    assert got == members[:len(got)]  # what came before is all of the first version


async def test_max_bytes_stops_a_larger_body(http_server: FaultServer, unique: str) -> None:
    # issue 25.6: a remote body is given up as soon as it passes max_bytes
    path = f"/gen/70000/{unique}.bin"
    url = http_server.url(path)
    assert await asyncflow.read_bytes(url, max_bytes=70000) == generated(path, 70000)
    with pytest.raises(SourceError, match=r"\.bin: more than 68\.4 KiB .*over max_bytes=69,999"):
        await asyncflow.read_bytes(url, max_bytes=69999)
