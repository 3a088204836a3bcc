"""Remote reads against a store that throttles (a token bucket, with and without
``Retry-After``, over HTTP and S3) and one with a latency tail (hedged reads): every object
arrives, with a bounded number of requests. The rates are measured by
``benchmarks/bench_remote.py``, not asserted here."""

from __future__ import annotations

import asyncio
import functools
import re
import time

import pytest

import asyncflow
from asyncflow import Pipeline, Retry
from asyncflow.sources._hedge import MAX_HEDGES
from tests.sources.store_server import Store, body_of, store_server

SIZE = 2000


def recipe(urls: list[str], **read: object) -> Pipeline[bytes]:
    """The documented recipe, untuned (docs/remote.md)."""
    fn = functools.partial(asyncflow.read_bytes, **read) if read else asyncflow.read_bytes
    return Pipeline(urls).map(fn, concurrency=256, ordered=False)


def check_all(store: Store, got: list[bytes], n: int) -> None:
    assert sorted(got) == sorted(body_of(i, store.size) for i in range(n))


def host_note(pipe: Pipeline[bytes], name: str) -> dict[str, int]:
    """The figures of ``name``'s line in ``stats().notes``."""
    [line] = [n for n in pipe.stats().notes if n.startswith(f"remote reads from {name}: ")]
    found = re.fullmatch(r"remote reads from \S+: window (\d+) of (\d+) "
                         r"\(\w+(?:, paced at [\d,]+/s)?\), (\d+) "
                         r"requests, (\d+) throttled(?:, (\d+) hedged \((\d+) won\))?", line)
    assert found is not None, line
    keys = ("window", "ceiling", "requests", "throttled", "hedged", "won")
    return {k: int(v or 0) for k, v in zip(keys, found.groups(), strict=True)}


@pytest.mark.parametrize("retry_after", [None, "1"], ids=["no-retry-after", "retry-after"])
def test_a_throttling_store_never_fails_the_recipe(
    leak_check: None, retry_after: str | None
) -> None:
    n = 300
    with store_server(size=SIZE, rate=150, burst=10, retry_after=retry_after,
                      latency=0.005) as store:
        pipe = recipe([store.url(i) for i in range(n)])
        got = list(pipe)
        check_all(store, got, n)
        # Without the window, 256 requests at once met a bucket of 10: most were rejected,
        # and objects ran out of tries. The window, and the pace once it is down to one
        # request, keep rejections a small share (about 65 here: 22 of the first 32, and
        # a few while the pace finds the rate; one per object while the window alone
        # adapted in the first half second).
        assert store.rejected <= n // 2
    seen = host_note(pipe, store.base)
    assert 1 <= seen["window"] <= seen["ceiling"] == 256
    # Every request the store heard was counted; a hedge cancelled before it reached the
    # store (its primary answered first), or a primary cancelled so (its hedge won), was not
    # heard.
    assert seen["requests"] - seen["won"] <= store.requests <= seen["requests"] + seen["hedged"]
    assert 0 < seen["throttled"] <= store.rejected  # a hedge's loser may go unanswered


def test_slowdown_from_an_s3_prefix_never_fails_the_recipe(
    leak_check: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("aiobotocore")
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIDSECRETKEY", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
                        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    n = 200
    with store_server(size=SIZE, rate=150, burst=10, latency=0.005) as store:
        urls = [f"s3://bucket/train/{i}" for i in range(n)]
        pipe = recipe(urls, endpoint_url=store.base)
        got = list(pipe)
        check_all(store, got, n)
        assert store.rejected <= n
    seen = host_note(pipe, "s3://bucket/train/")
    assert 0 < seen["throttled"] <= store.rejected
    notes = "\n".join(pipe.stats().notes)
    assert "AKIDSECRETKEY" not in notes and "s3cr3t" not in notes


def test_throttling_stats_hold_no_credentials(leak_check: None) -> None:
    with store_server(size=SIZE, rate=100, burst=5) as store:
        host = store.base.removeprefix("http://")
        urls = [f"http://alice:hunter2@{host}/obj/{i}?X-Amz-Signature=SIG" for i in range(60)]
        pipe = recipe(urls)
        assert len(list(pipe)) == 60
    notes = "\n".join(pipe.stats().notes)
    assert f"remote reads from http://{host}: window" in notes
    assert "hunter2" not in notes and "alice" not in notes and "SIG" not in notes


def test_a_store_that_queues_holds_the_window_near_what_it_serves(leak_check: None) -> None:
    # 64 places, 100 ms each: past 64 requests in flight, more only wait in the store's
    # queue. The window grew to the ceiling (256) before, every request waiting behind 192
    # others (400 ms, not 100); now it stops doubling once answers take longer than they did,
    # and shrinks towards twice the time of the unqueued ones.
    n = 1000
    with store_server(size=SIZE, latency=0.1, service=64) as store:
        pipe = recipe([store.url(i) for i in range(n)], retry=Retry(hedge=0))
        got = list(pipe)
        check_all(store, got, n)
    seen = host_note(pipe, store.base)
    assert seen["window"] <= 192, seen  # three quarters of the ceiling
    assert seen["requests"] == n and seen["throttled"] == 0


def test_breaking_out_of_a_throttled_run_leaves_nothing(leak_check: None) -> None:
    with store_server(size=SIZE, rate=50, burst=5, retry_after="1") as store:
        pipe = recipe([store.url(i) for i in range(500)])
        for count, _ in enumerate(pipe, 1):
            if count == 20:
                break


def test_hedged_reads_cut_the_tail(leak_check: None) -> None:
    n = 400
    slow = {i: 30.0 for i in range(60, n, 40)}  # 9 first requests that would take 30 s
    with store_server(size=SIZE, latency=0.005, slow=slow) as store:
        pipe = recipe([store.url(i) for i in range(n)])
        got = list(pipe)  # without hedging, this takes 30 s: past the test's timeout
        check_all(store, got, n)
        # Each slow object's first request was cancelled and its connection closed; the
        # server hears of a close when its own loop gets to it (up to 10 s under load). A
        # hedge still unanswered when it is late in turn (a loaded machine) has a second.
        assert all(2 <= store.hits[i] <= 1 + MAX_HEDGES for i in slow)
        deadline = time.monotonic() + 10
        while store.abandoned < len(slow) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.abandoned >= len(slow)
        # The budget: at most 15% extra requests, counted over the run.
        assert store.requests <= n * 1.15
    seen = host_note(pipe, store.base)
    assert seen["won"] >= len(slow)


def test_a_hedge_is_checked_like_any_answer(leak_check: None) -> None:
    n = 200
    slow = {i: 1.0 for i in range(100, n, 25)}
    # The second request of each slow object is cut short: the hedge fails its check, and the
    # first request's answer, whole, is the one delivered.
    with store_server(size=SIZE, latency=0.005, slow=slow, truncate_second=True) as store:
        got = list(recipe([store.url(i) for i in range(n)]))
        check_all(store, got, n)
        # A failed hedge sends no other; one sent before it failed (a loaded machine) is whole.
        assert all(2 <= store.hits[i] <= 1 + MAX_HEDGES for i in slow)


def test_a_read_whose_hedge_is_late_too_gets_a_second_hedge(leak_check: None) -> None:
    n = 300
    # Both the first request and the first hedge of these objects would take 30 s.
    slow = {i: 30.0 for i in range(60, n, 60)}
    with store_server(size=SIZE, latency=0.005, slow=slow, slow_requests=2) as store:
        pipe = recipe([store.url(i) for i in range(n)])
        got = list(pipe)  # with one hedge a read, this takes 30 s: past the test's timeout
        check_all(store, got, n)
        assert all(store.hits[i] == 3 for i in slow)
        deadline = time.monotonic() + 10
        while store.abandoned < 2 * len(slow) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.abandoned >= 2 * len(slow)  # both losers cancelled and closed
        assert store.requests <= n * 1.15


def test_hedging_can_be_turned_off(leak_check: None) -> None:
    n = 150
    slow = {i: 0.5 for i in range(80, n, 20)}
    with store_server(size=SIZE, latency=0.005, slow=slow) as store:
        got = list(recipe([store.url(i) for i in range(n)], retry=Retry(hedge=0)))
        check_all(store, got, n)
        assert store.requests == n
        assert store.abandoned == 0


async def test_a_cancelled_hedged_read_closes_both_requests(async_leak_check: None) -> None:
    with store_server(size=SIZE, latency=0.002, stuck=frozenset({40})) as store:
        async with asyncflow.sources.session():
            for i in range(40):
                await asyncflow.read_bytes(store.url(i))
            task = asyncio.create_task(asyncflow.read_bytes(store.url(40)))
            while store.hits[40] < 2:  # the first request, then its hedge
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while store.abandoned < 2:  # the server sees both connections close
                await asyncio.sleep(0.01)
