"""read_bytes inside a Pipeline: one session per run, closed at the end; pipeline-level
Retry and Timeout; failures that name the URL without its secrets."""

from __future__ import annotations

import functools
import gc
import time
import traceback
from typing import Any

import pytest

import asyncflow
from asyncflow import Pipeline, PipelineError, Retry, SourceError, SourceTimeout, Timeout
from tests.servers import FaultServer, generated

pytestmark = pytest.mark.usefixtures("leak_check")


def test_one_session_per_run_closed_when_it_ends(
    http_server: FaultServer, unique: str, count_sessions: list[Any]
) -> None:
    paths = [f"/gen/{1000 + i}/{unique}-{i}" for i in range(200)]
    pipe = Pipeline([http_server.url(p) for p in paths]).map(asyncflow.read_bytes,
                                                             concurrency=32)
    assert list(pipe) == [generated(p, 1000 + i) for i, p in enumerate(paths)]
    assert len(count_sessions) == 1
    assert count_sessions[0].closed
    assert list(pipe)[:1] == [generated(paths[0], 1000)]  # a second run: a second session
    assert len(count_sessions) == 2 and count_sessions[1].closed


def test_unordered_reads_at_high_concurrency(http_server: FaultServer, unique: str) -> None:
    urls = [http_server.url(f"/gen/2000/{unique}-{i}?delay=0.02") for i in range(600)]
    start = time.monotonic()
    got = list(Pipeline(urls).map(asyncflow.read_bytes, concurrency=256, ordered=False))
    assert sorted(got) == sorted(generated(u.split("?")[0][len(http_server.base):], 2000)
                                 for u in urls)
    assert time.monotonic() - start < 20  # 600 x 20 ms one at a time would take 12 s


def test_pipeline_retry_policy_applies(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/status/500/{unique}?X-Amz-Signature=SIGsecret")
    pipe = Pipeline([url], retry=Retry(attempts=2, backoff=0)).map(asyncflow.read_bytes)
    with pytest.raises(PipelineError) as info:
        list(pipe)
    assert http_server.hits(url) == 2
    [error] = info.value.exceptions
    assert isinstance(error, SourceError)
    assert "HTTP 500" in str(error) and "gave up after 2 attempts" in str(error)
    seen = "".join(traceback.format_exception(info.value)) + repr(info.value) + "".join(
        getattr(error, "__notes__", []))
    assert "SIGsecret" not in seen


def test_per_call_policy_beats_the_pipeline(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/10/{unique}?fail=3&status=503")
    read = functools.partial(asyncflow.read_bytes, retry=Retry(attempts=4, backoff=0))
    pipe = Pipeline([url], retry=Retry(attempts=1)).map(read)
    assert list(pipe) == [generated(f"/gen/10/{unique}", 10)]


def test_pipeline_timeout_applies(http_server: FaultServer, unique: str) -> None:
    url = http_server.url(f"/gen/100000/{unique}?stall=5")
    pipe = Pipeline([url], retry=Retry(attempts=1), timeout=Timeout(read=0.2)).map(
        asyncflow.read_bytes)
    start = time.monotonic()
    with pytest.raises(PipelineError) as info:
        list(pipe)
    assert isinstance(info.value.exceptions[0], SourceTimeout)
    assert time.monotonic() - start < 4


def test_failure_budget_skips_missing_objects(http_server: FaultServer, unique: str) -> None:
    urls = [http_server.url(f"/gen/10/{unique}-{i}" if i % 10 else
                            f"/status/404/{unique}-{i}?sig=SIGsecret") for i in range(100)]
    pipe = Pipeline(urls, max_failures=0.2).map(asyncflow.read_bytes, concurrency=8)
    with pipe.open() as run:
        got = list(run)
        failures = run.stats().failures
    assert len(got) == 90
    assert len(failures) == 10
    assert {f.error_type for f in failures} == {"SourceNotFound"}
    assert all("HTTP 404" in f.message and "SIGsecret" not in f.message + f.item
               for f in failures)


def test_breaking_out_closes_the_session(
    http_server: FaultServer, unique: str, count_sessions: list[Any]
) -> None:
    urls = [http_server.url(f"/gen/1000/{unique}-{i}?delay=0.05") for i in range(500)]
    for _ in Pipeline(urls).map(asyncflow.read_bytes, concurrency=64):
        break
    deadline = time.monotonic() + 5
    while not (count_sessions and count_sessions[0].closed) and time.monotonic() < deadline:
        time.sleep(0.01)
    gc.collect()
    assert count_sessions[0].closed


def test_a_failure_after_read_bytes_names_the_url_not_the_payload(
    http_server: FaultServer, unique: str
) -> None:
    # issue 25.11: the README's pattern once said "cannot decode <1878 bytes>", and its note
    # dumped the bytes
    from asyncflow import DecodeError, image

    url = http_server.url(f"/gen/1878/{unique}.jpg?X-Amz-Signature=secret")
    pipe = (Pipeline([url]).map(asyncflow.read_bytes, concurrency=4, ordered=False)
            .map(lambda data: image.decode(data, size=8), concurrency=2))
    with pytest.raises(PipelineError) as info:
        list(pipe)
    (exc,) = info.value.exceptions
    assert isinstance(exc, DecodeError)
    shown = f"/gen/1878/{unique}.jpg?X-Amz-Signature=***"
    assert str(exc).startswith(f"cannot decode {http_server.base}{shown}: ")
    note = "\n".join(exc.__notes__)
    assert f"failed on item <Blob of 1878 bytes from '{http_server.base}{shown}'>" in note
    assert "secret" not in note + str(exc) and "\\x" not in note
