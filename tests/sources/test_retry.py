"""Retry and Timeout: validation, full-jitter back-off, Retry-After, policy precedence, and
the one retry loop for whole reads and for resumed streams."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import nullcontext

import pytest

from asyncflow import ConfigError, Retry, SourceError, SourceNotFound, SourceTimeout, Timeout
from asyncflow._scope import RunScope, use_scope
from asyncflow.sources._limiter import HostLimiter
from asyncflow.sources._retry import Transient, parse_retry_after, resolve_policy
from asyncflow.sources._tries import Changed, retry_stream, retry_whole, with_retries


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": 1.5},
        {"attempts": True},
        {"backoff": -1},
        {"max_backoff": float("nan")},
        {"max_retry_after": "1"},
        {"statuses": {503, 404}},
        {"statuses": {403}},
        {"patience": None},
        {"patience": -1},
        {"hedge": 1.5},
        {"hedge": -0.1},
        {"hedge_quantile": 0.2},
        {"hedge_quantile": 1.0},
    ],
)
def test_retry_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Retry(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"connect": 0}, {"read": -1}, {"total": "5"}, {"read": True}])
def test_timeout_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Timeout(**kwargs)  # type: ignore[arg-type]


def test_policies_are_frozen_and_hashable() -> None:
    retry, timeout = Retry(statuses={503}), Timeout(read=5)
    assert retry.statuses == frozenset({503})
    assert hash(retry) == hash(Retry(statuses=frozenset({503})))
    with pytest.raises(AttributeError):
        retry.attempts = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        timeout.read = 3  # type: ignore[misc]
    assert Timeout().total is None  # a steady large download is never cut off by default


def test_delay_is_full_jitter_within_an_exponential_cap() -> None:
    retry = Retry(backoff=0.1, max_backoff=1.0)
    for failures, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (30, 1.0)]:
        waits = [retry.delay(failures) for _ in range(300)]
        assert all(0.0 <= w <= cap for w in waits)
        assert max(waits) > cap * 0.7  # spread over the whole range, not pinned to one end
        assert min(waits) < cap * 0.3


def test_retry_after_is_a_floor_with_jitter_above_it_and_is_capped() -> None:
    retry = Retry(backoff=0.01, max_backoff=0.01, max_retry_after=5.0)
    waits = [retry.delay(1, retry_after=2.0) for _ in range(300)]
    assert all(2.0 <= w <= 3.0 for w in waits)
    # Never all at once: the throttled come back spread over half the server's wait.
    assert max(waits) > 2.7 and min(waits) < 2.3
    assert all(5.0 <= retry.delay(1, retry_after=3600) <= 7.5 for _ in range(50))
    assert retry.delay(1, retry_after=-3) <= 0.01


def test_parse_retry_after_seconds_and_dates() -> None:
    now = time.time()
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("-5") == 0.0
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(10, abs=1.01)
    past = email.utils.formatdate(now - 100, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0
    for junk in (None, "", "soon", "Mon, 99 Foo 2020"):
        assert parse_retry_after(junk) is None


async def test_policy_precedence_call_then_pipeline_then_default() -> None:
    assert resolve_policy(None, None) == (Retry(), Timeout())
    scope = RunScope({"retry": Retry(attempts=2), "timeout": Timeout(read=1)})
    with use_scope(scope):
        assert resolve_policy(None, None) == (Retry(attempts=2), Timeout(read=1))
        assert resolve_policy(Retry(attempts=9), None) == (Retry(attempts=9), Timeout(read=1))
    await scope.aclose()
    with pytest.raises(ConfigError):
        resolve_policy("3", None)  # type: ignore[arg-type]


async def test_with_retries_counts_attempts_and_names_the_reason() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        raise Transient("HTTP 500 Internal Server Error")

    with pytest.raises(SourceError) as info:
        await with_retries(flaky, what="GET http://h/x", retry=Retry(attempts=3, backoff=0),
                           timeout=Timeout())
    assert calls == 3
    assert str(info.value) == (
        "GET http://h/x: HTTP 500 Internal Server Error (gave up after 3 attempts)"
    )
    assert info.value.__cause__ is None and info.value.__context__ is None


async def test_throttling_never_uses_up_attempts() -> None:
    calls = 0

    async def throttled_a_while() -> str:
        nonlocal calls
        calls += 1
        if calls <= 12:
            raise Transient("HTTP 503 Slow Down", throttled=True)
        return "ok"

    retry = Retry(attempts=3, backoff=0)
    assert await with_retries(throttled_a_while, what="GET x", retry=retry,
                              timeout=Timeout()) == "ok"
    assert calls == 13


async def test_throttling_gives_up_after_patience_without_progress() -> None:
    calls = 0

    async def throttled() -> str:
        nonlocal calls
        calls += 1
        raise Transient("HTTP 429 Too Many Requests", throttled=True)

    with pytest.raises(SourceError) as info:
        async with asyncio.timeout(10):
            await with_retries(throttled, what="GET http://h/x",
                               retry=Retry(attempts=2, backoff=0.01, patience=0.3),
                               timeout=Timeout())
    assert calls > 2  # not stopped by attempts
    assert str(info.value) == (
        f"GET http://h/x: HTTP 429 Too Many Requests (gave up after {calls} attempts; "
        "throttled, nothing from this host succeeded for 0.3s)"
    )


class _Host:
    """A host limiter double whose other reads keep succeeding (``gate.last_success``)."""

    def __init__(self) -> None:
        self.last_success = asyncio.get_running_loop().time()

    async def run(self, attempt: Callable[[], object], **_: object) -> object:
        return await attempt()  # type: ignore[misc]


async def test_a_throttled_try_waits_all_of_retry_after_while_the_host_makes_progress() -> None:
    loop = asyncio.get_running_loop()
    host, tries = _Host(), []

    async def throttled_once() -> str:
        tries.append(loop.time())
        if len(tries) == 1:
            raise Transient("HTTP 429", retry_after=0.6, throttled=True)
        return "ok"

    async def others_succeed() -> None:
        while True:
            await asyncio.sleep(0.05)
            host.last_success = loop.time()

    beside = asyncio.create_task(others_succeed())
    try:
        async with asyncio.timeout(10):
            assert await with_retries(throttled_once, what="GET x", gate=host,  # type: ignore[arg-type]
                                      retry=Retry(patience=0.3), timeout=Timeout()) == "ok"
    finally:
        beside.cancel()
    assert tries[1] - tries[0] >= 0.6  # the server's Retry-After, past the patience: all of it


async def test_one_attempt_turns_retrying_off_for_throttling_too() -> None:
    calls = 0

    async def throttled() -> str:
        nonlocal calls
        calls += 1
        raise Transient("HTTP 503", throttled=True)

    with pytest.raises(SourceError, match=r"gave up after 1 attempt\)"):
        await with_retries(throttled, what="GET x", retry=Retry(attempts=1), timeout=Timeout())
    assert calls == 1


async def test_with_retries_stops_at_a_final_error() -> None:
    calls = 0

    async def gone() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Transient("reset")
        raise SourceNotFound("GET http://h/x: HTTP 404 Not Found")

    with pytest.raises(SourceNotFound, match=r"404 Not Found \(2 attempts; not retryable\)"):
        await with_retries(gone, what="GET http://h/x", retry=Retry(backoff=0),
                           timeout=Timeout())
    assert calls == 2


async def test_total_deadline_covers_tries_and_back_off() -> None:
    async def slow() -> str:
        raise Transient("HTTP 503", retry_after=10)

    start = time.monotonic()
    with pytest.raises(SourceTimeout, match=r"total=0\.2s"):
        await with_retries(slow, what="GET x", retry=Retry(attempts=50),
                           timeout=Timeout(total=0.2))
    assert time.monotonic() - start < 2


async def test_cancelling_a_back_off_leaves_nothing_running(async_leak_check: None) -> None:
    async def throttled() -> str:
        raise Transient("HTTP 429", retry_after=30)

    task = asyncio.create_task(
        with_retries(throttled, what="GET x", retry=Retry(), timeout=Timeout())
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def broken_stream(
    data: bytes, breaks: list[int | None], opened: list[int]
) -> Callable[[None], Callable[[int], AsyncGenerator[bytes, None]]]:
    """Tries at ``data``: the n-th delivers up to ``breaks[n]`` bytes in all, then breaks."""

    async def open_at(offset: int) -> AsyncGenerator[bytes, None]:
        stop = breaks[len(opened)] if len(opened) < len(breaks) else None
        opened.append(offset)
        for at in range(offset, len(data), 10):
            if stop is not None and at >= stop:
                raise Transient("connection failed (reset)")
            yield data[at:at + 10]
        if stop is not None and stop >= len(data):
            raise Transient("body truncated")

    return lambda client: open_at


async def test_a_stream_resumes_where_each_try_broke() -> None:
    data, opened = bytes(range(100)), []
    chunks = retry_stream(nullcontext(), broken_stream(data, [30, 30, 70], opened),
                          what="GET x", retry=Retry(attempts=3, backoff=0), timeout=Timeout())
    assert b"".join([c async for c in chunks]) == data
    # Two failures in a row at byte 30, then one at 70: each stall within 3 attempts.
    assert opened == [0, 30, 30, 70]


async def test_a_whole_read_resumes_and_starts_again_where_the_object_changed() -> None:
    data, opened = bytes(range(100)), []
    gate = HostLimiter("x", ceiling=4)
    whole = retry_whole(nullcontext(), broken_stream(data, [30, 70], opened), what="GET x",
                        retry=Retry(attempts=3, backoff=0), timeout=Timeout(), gate=gate)
    assert await whole == data and opened == [0, 30, 70]  # each try from where one broke

    tries: list[int] = []

    async def changed(offset: int) -> AsyncGenerator[bytes, None]:
        tries.append(offset)
        if len(tries) == 1:
            yield data[:40]
            raise Transient("connection failed (reset)")
        if offset:
            raise Changed("GET x: the object changed")
        yield data

    whole = retry_whole(nullcontext(), lambda client: changed, what="GET x",
                        retry=Retry(attempts=3, backoff=0), timeout=Timeout(), gate=gate)
    assert await whole == data and tries == [0, 40, 0]  # never the old 40 bytes spliced


async def test_a_streams_budget_is_per_stall_and_names_the_byte() -> None:
    data, opened = bytes(range(100)), []
    chunks = retry_stream(nullcontext(), broken_stream(data, [20, 20, 20], opened),
                          what="GET x", retry=Retry(attempts=3, backoff=0), timeout=Timeout())
    got = bytearray()
    with pytest.raises(SourceError) as info:
        async for chunk in chunks:
            got += chunk
    assert bytes(got) == data[:20] and opened == [0, 20, 20]
    assert str(info.value) == (
        "GET x: connection failed (reset) at byte 20 (gave up after 3 attempts)"
    )
    assert not isinstance(info.value, SourceTimeout)


async def test_a_streams_total_deadline_spans_its_chunks() -> None:
    async def slow(offset: int) -> AsyncGenerator[bytes, None]:
        for _ in range(100):
            await asyncio.sleep(0.05)
            yield b"x"

    chunks = retry_stream(nullcontext(), lambda client: slow, what="GET x", retry=Retry(),
                          timeout=Timeout(total=0.3))
    got = 0
    with pytest.raises(SourceTimeout, match=r"total=0\.3s"):
        async with asyncio.timeout(5):
            async for _ in chunks:
                got += 1
    assert 1 <= got < 10
