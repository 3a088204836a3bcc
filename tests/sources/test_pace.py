"""Pacing after a throttle (``sources/_pace.py``), driven on a made-up clock."""

from __future__ import annotations

import pytest

from asyncflow.sources._pace import BACKOFF, HOLD, MAX_GAP, MIN_GAP, SPAN, Pace


def answer_at_rate(pace: Pace, rate: float, start: float, seconds: float,
                   *, limiting: bool = True) -> float:
    """Answers ``rate`` a second from ``start`` for ``seconds``; the clock after them."""
    now = start
    for _ in range(int(rate * seconds)):
        now += 1.0 / rate
        pace.answered(now, limiting=limiting, window=256, latency=0.02)
    return now


def test_unthrottled_hosts_are_not_paced() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 400, 0.0, 2.0)
    assert pace.rate is None and pace.delay(now) <= 0
    pace.started(now)
    assert pace.delay(now) <= 0


def test_a_throttle_paces_starts_just_below_the_delivered_rate() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 400, 0.0, 1.0)
    pace.throttled(now, decrease=True)
    assert pace.rate == pytest.approx(BACKOFF * 400, rel=0.02)
    # Starts go a gap apart, scheduled on a virtual clock with a few slots of credit.
    starts = 0
    t = now
    while t < now + 1.0:
        if pace.delay(t) <= 0:
            pace.started(t)
            starts += 1
        t += 0.0005
    assert starts == pytest.approx(BACKOFF * 400, rel=0.05)


def test_a_late_event_loop_does_not_lower_the_paced_rate() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 400, 0.0, 1.0)
    pace.throttled(now, decrease=True)
    gap = pace.gap
    # A loop that wakes 1.7 gaps apart starts every request whose slot has come: each slot
    # is a gap after the previous slot, not after the late wake-up.
    t, starts = now, 0
    while t < now + 1.0:
        while pace.delay(t) <= 0:
            pace.started(t)
            starts += 1
        t += 1.7 * gap
    assert starts == pytest.approx(BACKOFF * 400, rel=0.05)


def test_no_rate_is_measured_in_the_first_span() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 2000, 0.0, SPAN / 2)  # a store's first burst
    pace.throttled(now, decrease=True)
    assert pace.rate is None  # the window alone adapts until a rate can be trusted


def test_a_window_at_its_floor_in_the_first_span_spaces_starts() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 2000, 0.0, SPAN / 2)
    pace.throttled(now, decrease=True, floor=True)  # the window cannot halve any further
    assert pace.gap == MIN_GAP and pace.delay(now) > 0
    pace.throttled(now, decrease=True, floor=True)
    assert pace.gap == 2 * MIN_GAP


def test_throttled_before_any_answer_spaces_starts_twice_as_far_each_time() -> None:
    pace = Pace()
    pace.throttled(0.0, decrease=True)
    assert pace.gap == MIN_GAP and pace.delay(0.0) > 0
    pace.throttled(0.0, decrease=False)  # not the first of its window: no change
    assert pace.gap == MIN_GAP
    for _ in range(12):
        pace.throttled(0.0, decrease=True)
    assert pace.gap == MAX_GAP


def test_the_pace_holds_then_regrows_to_the_limit_and_probes_above_it() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 400, 0.0, 1.0)
    pace.throttled(now, decrease=True)
    # It stays put while the hold lasts.
    now = answer_at_rate(pace, 400, now, HOLD - 0.5)
    assert pace.rate == pytest.approx(BACKOFF * 400, rel=0.02)
    # Then back up to the limit quickly, and a slow probe above it.
    now = answer_at_rate(pace, 400, now, 3.5)
    assert 400 * 1.0 < (pace.rate or 0) < 400 * 1.25


def test_throttles_at_the_same_rate_hold_the_pace_longer() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 400, 0.0, 1.0)
    pace.throttled(now, decrease=True)
    first = pace._hold_until - now
    now = answer_at_rate(pace, 400, now, first + 1.0)
    pace.throttled(now, decrease=True)  # the probe met the same limit
    assert pace._hold_until - now == pytest.approx(2 * first)
    # A throttle at a quite different rate starts over.
    now = answer_at_rate(pace, 200, now, 1.0)
    pace.throttled(now, decrease=True)
    assert pace._hold_until - now == pytest.approx(first)


def test_answers_while_nothing_waits_do_not_grow_the_pace() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 400, 0.0, 1.0)
    pace.throttled(now, decrease=True)
    before = pace.rate
    answer_at_rate(pace, 400, now, 1.0, limiting=False)
    assert pace.rate == before


def test_pacing_ends_once_the_host_takes_twice_its_old_limit() -> None:
    pace = Pace()
    now = answer_at_rate(pace, 100, 0.0, 1.0)
    pace.throttled(now, decrease=True)
    answer_at_rate(pace, 400, now, 60.0)
    assert pace.rate is None
