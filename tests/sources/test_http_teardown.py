"""Closing a run mid-stream over HTTP releases every response, connection and session before
the run's loop ends: nothing is left for the garbage collector to find unclosed.

A run stopped just as it ended (its consumer closes it right after the last item) used to skip
closing its run scope, leaving the scope's aiohttp session (or S3 client) and its pooled
connections open when the loop closed: "unclosed transport" in a few such runs in a hundred.
"""

from __future__ import annotations

import gc
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import asyncflow
from asyncflow import Pipeline, sources
from tests.servers import FaultServer

from .test_tar import make_tar

pytestmark = pytest.mark.usefixtures("leak_check")

_RUNS = 100  # each a few tens of milliseconds


@pytest.fixture
def unraisable() -> Iterator[list[str]]:
    """What reaches ``sys.unraisablehook`` (a ResourceWarning raised in ``__del__`` or by a
    closing loop) during the test."""
    caught: list[str] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        yield caught
    finally:
        gc.collect()
        sys.unraisablehook = previous


def _close_runs(pipe: Pipeline[Any], total: int, sessions: list[Any], seed: int) -> None:
    """Take ``k`` items of ``pipe`` and close it, ``_RUNS`` times: half of them right after the
    last item (the run ends as it is stopped), the others mid-stream."""
    rng = random.Random(seed)
    for i in range(_RUNS):
        k = total if i % 2 else rng.randint(0, total - 1)
        with pipe.open() as run:
            for _ in range(k):
                next(run)
        assert sessions and all(s.closed for s in sessions), (i, k)


def test_tar_shards_closed_mid_stream_leave_nothing_open(
    http_server: FaultServer, unique: str, count_sessions: list[Any], unraisable: list[str]
) -> None:
    shards = [http_server.put(f"{unique}/{s}.tar", make_tar(
        [(f"s{s}/{i:03d}.txt", bytes([s, i]) * 3000) for i in range(12)])) for s in range(3)]
    for ordered in (True, False):
        pipe = Pipeline(shards).flat_map(sources.tar_samples, concurrency=2, ordered=ordered)
        _close_runs(pipe, 36, count_sessions, seed=int(ordered))
    assert unraisable == []


def test_unordered_reads_closed_mid_stream_leave_nothing_open(
    http_server: FaultServer, unique: str, count_sessions: list[Any], unraisable: list[str]
) -> None:
    urls = [http_server.url(f"/gen/{100_000 + i}/{unique}-{i}") for i in range(24)]
    pipe = Pipeline(urls).map(asyncflow.read_bytes, concurrency=8, ordered=False)
    _close_runs(pipe, 24, count_sessions, seed=2)
    assert unraisable == []


async def test_s3_runs_closed_mid_stream_leave_nothing_open(
    s3: Any, bucket: str, warm_executor: None, async_leak_check: object,
    unraisable: list[str],
) -> None:
    """The S3 client lives in the same run scope as the HTTP session: the same holds."""
    for s in range(3):
        await s3.put_object(Bucket=bucket, Key=f"{s}.tar", Body=make_tar(
            [(f"s{s}/{i:03d}.txt", bytes([s, i]) * 3000) for i in range(12)]))
    shards = [f"s3://{bucket}/{s}.tar" for s in range(3)]
    pipe = Pipeline(shards).flat_map(sources.tar_samples, concurrency=2, ordered=False)
    rng = random.Random(3)
    for i in range(_RUNS // 4):
        async with pipe.open() as run:
            for _ in range(36 if i % 2 else rng.randint(0, 35)):
                await anext(run)
    gc.collect()
    assert unraisable == []
