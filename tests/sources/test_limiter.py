"""The per-host adaptive window (``_limiter``) and the latencies that hedging, the pace and
the window read (``_latency``), driven directly, without a server."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from asyncflow import Retry, SourceError, Timeout
from asyncflow._scope import RunScope, use_scope
from asyncflow.sources._latency import BASE_SPAN, GROUP, MIN_SAMPLES, Latencies
from asyncflow.sources._limiter import INITIAL_WINDOW, HostLimiter, limiter_for
from asyncflow.sources._pace import MIN_GAP
from asyncflow.sources._retry import Transient
from asyncflow.sources._tries import with_retries

RETRY = Retry(backoff=0)


async def ok() -> str:
    await asyncio.sleep(0)
    return "ok"


async def throttled() -> str:
    raise Transient("HTTP 503 Slow Down", throttled=True)


async def test_window_grows_by_one_per_success_while_full_then_halves_on_throttle() -> None:
    gate = HostLimiter("http://h", ceiling=256)
    # Answers that take no time: no queue, however busy the machine that runs the test (its
    # own event loop's delays would otherwise pass for the host's queueing, and shrink it).
    gate._time = lambda: 0.0
    assert gate.window == INITIAL_WINDOW
    # A host asked for less than its window proves nothing: the window stays.
    for _ in range(5):
        await gate.run(ok, retried=False, retry=RETRY)
    assert gate.window == INITIAL_WINDOW
    # Full: each success adds one (slow start, doubling each round trip), at most to twice
    # the window of the last median that showed no queue (none yet: twice the first).
    await asyncio.gather(*(gate.run(ok, retried=False, retry=RETRY)
                           for _ in range(4 * INITIAL_WINDOW)))
    assert gate.window == INITIAL_WINDOW * 2
    await asyncio.gather(*(gate.run(ok, retried=False, retry=RETRY)
                           for _ in range(8 * INITIAL_WINDOW)))
    assert gate.window > INITIAL_WINDOW * 2
    before = gate.window
    with pytest.raises(Transient):
        await gate.run(throttled, retried=False, retry=RETRY)
    assert gate.window == before / 2 and gate.throttled == 1
    assert gate.in_flight == 0


async def test_a_burst_of_throttles_halves_the_window_once() -> None:
    gate = HostLimiter("http://h", ceiling=64)
    gate.window = 32.0
    sent = asyncio.Event()

    async def throttled_once_all_are_sent() -> str:
        await sent.wait()
        raise Transient("HTTP 503 Slow Down", throttled=True)

    tries = [asyncio.create_task(gate.run(throttled_once_all_are_sent, retried=False,
                                          retry=RETRY)) for _ in range(32)]
    while gate.in_flight < 32:
        await asyncio.sleep(0)
    sent.set()
    results = await asyncio.gather(*tries, return_exceptions=True)
    assert all(isinstance(r, Transient) for r in results)
    # All 32 were sent before the first answer: one decrease, not 32.
    assert gate.window == 16.0 and gate.throttled == 32
    # A request sent after that decrease, throttled too, halves it again.
    with pytest.raises(Transient):
        await gate.run(throttled, retried=False, retry=RETRY)
    assert gate.window == 8.0


async def test_window_stays_within_one_and_the_ceiling() -> None:
    gate = HostLimiter("http://h", ceiling=4)
    assert gate.window == 4
    await asyncio.gather(*(gate.run(ok, retried=False, retry=RETRY) for _ in range(50)))
    assert gate.window == 4
    for _ in range(10):
        with pytest.raises(Transient):
            await gate.run(throttled, retried=False, retry=RETRY)
    assert gate.window == 1.0


async def test_retried_tries_go_before_fresh_ones() -> None:
    gate = HostLimiter("http://h", ceiling=1)
    release = asyncio.Event()
    order: list[str] = []

    async def hold() -> str:
        await release.wait()
        return "held"

    def tagged(tag: str) -> asyncio.Task[str]:
        async def attempt() -> str:
            order.append(tag)
            return tag
        return asyncio.create_task(gate.run(attempt, retried=tag.startswith("retry"),
                                            retry=RETRY))

    holder = asyncio.create_task(gate.run(hold, retried=False, retry=RETRY))
    await asyncio.sleep(0)
    waiting = [tagged("fresh-1"), tagged("fresh-2"), tagged("retry-1"), tagged("retry-2")]
    await asyncio.sleep(0)
    release.set()
    async with asyncio.timeout(5):
        await asyncio.gather(holder, *waiting)
    assert order == ["retry-1", "retry-2", "fresh-1", "fresh-2"]


async def test_a_cancelled_waiter_gives_its_place_back(async_leak_check: None) -> None:
    gate = HostLimiter("http://h", ceiling=1)
    release = asyncio.Event()

    async def hold() -> str:
        await release.wait()
        return "held"

    holder = asyncio.create_task(gate.run(hold, retried=False, retry=RETRY))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(gate.run(ok, retried=False, retry=RETRY))
    await asyncio.sleep(0)
    waiter.cancel()
    release.set()
    await holder
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.in_flight == 0
    async with asyncio.timeout(5):
        assert await gate.run(ok, retried=False, retry=RETRY) == "ok"


async def test_a_throttled_read_waits_without_holding_a_place(async_leak_check: None) -> None:
    gate = HostLimiter("http://h", ceiling=1)
    tries = 0

    async def throttled_then_ok() -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise Transient("HTTP 503", throttled=True, retry_after=30)
        return "late"

    slow = asyncio.create_task(
        with_retries(throttled_then_ok, what="GET a", retry=Retry(), timeout=Timeout(),
                     gate=gate)
    )
    while tries == 0:
        await asyncio.sleep(0)
    # The throttled read sleeps out its Retry-After; the only place is free for others.
    async with asyncio.timeout(5):
        assert await with_retries(ok, what="GET b", retry=Retry(), timeout=Timeout(),
                                  gate=gate) == "ok"
    assert tries == 1
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert gate.in_flight == 0


async def test_patience_counts_from_the_hosts_last_success(async_leak_check: None) -> None:
    gate = HostLimiter("http://h", ceiling=8)
    calls = 0

    async def throttled_a_while() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if calls < 40:
            raise Transient("HTTP 503", throttled=True)
        return "done"

    async def others() -> None:
        while True:  # other reads of the host keep succeeding
            await gate.run(ok, retried=False, retry=RETRY)
            await asyncio.sleep(0.005)

    # 40 tries take over 0.4 s, four times the patience, but the host makes progress all
    # along (a patience of 0.05 s was once outlasted by a loaded machine's stalls alone).
    retry = Retry(backoff=0.001, patience=0.1)
    progress = asyncio.create_task(others())
    try:
        assert await with_retries(throttled_a_while, what="GET a", retry=retry,
                                  timeout=Timeout(), gate=gate) == "done"
    finally:
        progress.cancel()
        await asyncio.wait([progress])
    assert calls == 40
    with pytest.raises(SourceError, match=r"nothing from this host succeeded for 0\.1s"):
        async with asyncio.timeout(5):
            await with_retries(throttled, what="GET a", retry=retry, timeout=Timeout(),
                               gate=gate)


async def test_limiters_are_shared_within_a_scope_and_reported() -> None:
    scope = RunScope()
    with use_scope(scope):
        one = await limiter_for("http://h:1", "http://h:1")
        assert await limiter_for("http://h:1", "http://h:1") is one
        other = await limiter_for("http://h:2", "http://h:2")
        assert other is not one
        await one.run(ok, retried=False, retry=RETRY)
    assert scope.reports() == [
        f"remote reads from http://h:1: window {INITIAL_WINDOW} of 256 (growing), 1 requests, "
        "0 throttled"
    ]
    await scope.aclose()
    assert len(scope.reports()) == 1  # still there after the run


def test_hedge_delay_is_a_high_quantile_and_at_least_twice_the_median() -> None:
    lat = Latencies()
    for i in range(MIN_SAMPLES - 1):
        lat.add(0.01 + i * 1e-4)
    assert lat.hedge_after(0.95) is None  # too few answers to know what is late
    lat = Latencies()
    for i in range(100):
        lat.add(1.0 if i % 10 == 0 else 0.01)  # a tail of 10%
    for _ in range(28):
        lat.add(0.01)
    assert lat.hedge_after(0.95) == 1.0
    assert lat.hedge_after(0.5) == pytest.approx(0.02)  # twice the median


async def test_throttled_at_a_window_of_one_it_spaces_its_starts(async_leak_check: None) -> None:
    gate = HostLimiter("http://h", ceiling=1)
    loop = asyncio.get_running_loop()
    with pytest.raises(Transient):
        await gate.run(throttled, retried=False, retry=RETRY)
    # Quick rejections would let one request at a time hammer the host: the next start waits.
    start = loop.time()
    await gate.run(ok, retried=False, retry=RETRY)
    assert loop.time() - start >= MIN_GAP / 2 - 1e-3
    # Paced starts, throttled or not, every waiter is served (the pause's timer re-arms).
    for _ in range(3):
        with pytest.raises(Transient):
            await gate.run(throttled, retried=False, retry=RETRY)
    async with asyncio.timeout(10):
        got = await asyncio.gather(*(gate.run(ok, retried=i % 2 == 0, retry=RETRY)
                                     for i in range(20)))
    assert got == ["ok"] * 20 and gate.in_flight == 0


async def test_a_rate_limited_host_is_paced_with_few_rejections(async_leak_check: None) -> None:
    gate = HostLimiter("http://h", ceiling=256)
    loop = asyncio.get_running_loop()
    tokens, at, rate, burst = 10.0, loop.time(), 200.0, 10.0
    rejected = 0
    times: list[float] = []
    start = loop.time()

    async def bucket() -> str:
        nonlocal tokens, at, rejected
        now = loop.time()
        tokens, at = min(burst, tokens + (now - at) * rate), now
        if tokens < 1.0:
            rejected += 1
            times.append(now - start)
            raise Transient("HTTP 503 Slow Down", throttled=True)
        tokens -= 1.0
        await asyncio.sleep(0.005)
        return "ok"

    retry = Retry(backoff=0.05, hedge=0)
    async with asyncio.timeout(60):
        got = await asyncio.gather(*(with_retries(bucket, what=f"GET {i}", retry=retry,
                                                  timeout=Timeout(), gate=gate)
                                     for i in range(600)))
    assert got == ["ok"] * 600 and gate.in_flight == 0
    # The window alone probes the rate many times a second, a few rejections each time.
    # Paced at the rate the host delivered (measured after its first half second), it is
    # not probed again within the hold (4 s): no rejection after the first second.
    assert gate.pace.rate is not None and "paced at" in gate.report()
    assert rejected == len(times) and [t for t in times if t > 1.0] == []


def test_queueing_compares_each_groups_median_with_the_lowest_of_late() -> None:
    q = Latencies(first=GROUP)
    seq = itertools.count()
    # The first window's answers (connection set-up) are not counted.
    assert not any(q.add(5.0, next(seq), now=0.0) for _ in range(GROUP))

    def group(seconds: float, now: float, slow: int = 0) -> bool:
        """A group of requests sent one after another; the ``slow`` last answer last."""
        done = [q.add(10.0 if i >= GROUP - slow else seconds, next(seq), now)
                for i in range(GROUP)]
        # Settled by the answer past half the group's, without waiting for its tail.
        assert done == [i == GROUP // 2 for i in range(GROUP)]
        return q.queued

    assert not group(0.010, now=1.0) and q.ratio == 1.0
    # A tail is not a queue: the median holds.
    assert not group(0.010, now=1.5, slow=GROUP // 2 - 1) and q.ratio == 1.0

    assert group(0.035, now=2.0) and q.ratio == pytest.approx(3.5)
    assert not q.drain  # one group alone may be a tail drawn unevenly
    assert group(0.030, now=2.5) and q.drain  # two in a row: a queue
    assert not group(0.012, now=3.0) and q.ratio == pytest.approx(1.2) and not q.drain
    # A window change: only requests sent after it count.
    sent = next(seq)
    q.restart(sent + 10)
    assert not any(q.add(1.0, sent + i, now=3.5) for i in range(10))
    seq = itertools.count(-(-(sent + 10) // GROUP) * GROUP)  # the next whole group
    assert group(0.030, now=4.0) and q.ratio == pytest.approx(3.0)
    # The base is the lowest median of the last BASE_SPAN seconds: a host that slowed down
    # for good is the new normal once the faster medians are that old.
    assert not group(0.030, now=1.0 + BASE_SPAN + 3.5) and q.ratio == pytest.approx(1.0)


def test_a_groups_quickest_answers_alone_do_not_make_the_base() -> None:
    q = Latencies(first=0)
    # The later half of a burst answers first, and quickest: half a group settles nothing.
    assert not any(q.add(0.001, i, now=0.0) for i in range(GROUP // 2, GROUP))
    assert q.add(0.010, 0, now=0.0)  # past half: the median is the slowest answer so far
    assert not any(q.add(0.010, i, now=0.1) for i in range(1, GROUP // 2))  # settled
    assert not any(q.add(0.010, i, now=0.2) for i in range(GROUP, GROUP + GROUP // 2))
    assert q.add(0.010, GROUP + GROUP // 2, now=0.2) and q.ratio == 1.0


def test_one_record_serves_hedging_the_pace_and_the_window() -> None:
    lat = Latencies(first=0)
    # A hedge has no number in send order: its time counts in the quantiles, in no median.
    assert not any(lat.add(0.5) for _ in range(MIN_SAMPLES))
    assert lat.median() == 0.5 and lat.hedge_after(0.9) == 1.0 and lat.ratio == 1.0
    # A request in send order counts in both.
    settled = [lat.add(0.01, seq, now=0.0) for seq in range(GROUP)]
    assert settled == [seq == GROUP // 2 for seq in range(GROUP)]
    assert lat.median() == 0.01 and lat.ratio == 1.0 and not lat.queued
