"""Pacing: after a host throttles, starts spaced at the rate it was seen to deliver.

A window of requests in flight (:mod:`._limiter`) caps concurrency, but a store that limits a
*rate* (a token bucket, as S3 does per prefix) throttles any window whose round trips outrun
it, and the window's halving and regrowth probe that rate many times a second. Each probe
costs rejected requests, and with ``Retry-After`` each rejected request waits a second or
more: one rejected in a run's last second makes the run a second longer.

So on a throttle the limiter also measures the rate the host delivered over the last
:data:`SPAN` seconds and spaces request starts at :data:`BACKOFF` of it. Below the rate where
the host last throttled, the pace stays put for :data:`HOLD` seconds (4), twice as long
after each throttle in a row at about the same rate (up to 64 s). Then it regrows quickly up
to that rate (its growth doubling every :data:`FAST` seconds) and slowly above it (doubling
every :data:`SLOW` seconds from :data:`GAIN`, 1% a second). A host whose limit stays put is
probed less and less often, not many times a second; one whose capacity grows is followed
once the hold is over. Starts are
scheduled on a virtual clock, a slot after the previous one, with a few slots of credit, so
that a busy event loop waking late does not lower the rate. Pacing ends once the window would
bind before it, or the pace has doubled the rate at the last throttle.

A host that throttled before any answer came back has no rate to measure: starts are then
spaced :data:`MIN_GAP` apart, twice as far on each throttle up to :data:`MAX_GAP`. In a run's
first :data:`SPAN` seconds the rate is not measured (the first round trips, and the burst a
store lets through first, would distort it): the window alone adapts until it is down to its
floor, and then starts are spaced as with no answer (one request at a time, each rejected
within a round trip, was otherwise retried hundreds of times a second).
"""

from __future__ import annotations

import bisect
import random
from collections import deque

__all__ = ["BACKOFF", "MAX_GAP", "MIN_GAP", "Pace"]

#: Seconds of answers the delivered rate is measured over.
SPAN = 0.5
#: Fewest answers within :data:`SPAN` that make a rate.
MIN_ANSWERS = 8
#: After a throttle, starts are paced at this share of the rate the host delivered.
BACKOFF = 0.95
#: Growth of the pace per second, as a share of it, just after a throttle.
GAIN = 0.01
#: Seconds without a throttle that double the growth, below and above the last limit.
FAST, SLOW = 1.0, 4.0
#: After a throttle, the pace stays at :data:`BACKOFF` of the rate then delivered for this many
#: seconds, twice as long for each throttle in a row at about the same rate (within
#: :data:`SAME` of it), up to :data:`MAX_HOLDS` doublings (64 s).
HOLD, SAME, MAX_HOLDS = 4.0, 0.1, 4
#: Slots of credit: after an idle moment, up to this many starts may go at once.
CREDIT = 4.0
#: With no rate to measure: starts this far apart, twice as far on each throttle.
MIN_GAP, MAX_GAP = 0.01, 1.0


class Pace:
    """When the next request may start, for one host.

    All times are the event loop's clock.
    """

    __slots__ = ("_answers", "_first", "_held", "_hold_until", "_limit", "_next", "gap")

    def __init__(self) -> None:
        self._answers: deque[float] = deque()  # when the recent answers came
        self._first = float("inf")  # when the first answer came
        self._limit = 0.0  # the rate delivered when the host last throttled
        self._held = 0  # throttles in a row at about the same rate
        self._hold_until = float("-inf")  # the pace stays at or below the limit until then
        self._next = float("-inf")  # the next start's slot on the virtual clock
        self.gap = 0.0  # seconds between starts; 0: not paced

    def delay(self, now: float) -> float:
        """Seconds until the next start may go (0 or less: now)."""
        return self._next - now

    def started(self, now: float) -> None:
        """A request started: the next one's slot is a gap later."""
        if self.gap:
            self._next = max(self._next, now - CREDIT * self.gap) + self.gap

    def answered(self, now: float, *, limiting: bool, window: float, latency: float) -> None:
        """An answer came; ``limiting``: requests were waiting for a start.

        Pacing ends when the pace has grown to twice the rate of the last throttle or, paced
        with no rate measured, when the window binds first: ``window`` requests a round trip
        (``latency``, the host's median) is slower than the pace.
        """
        answers = self._answers
        answers.append(now)
        self._first = min(self._first, now)
        while now - answers[0] > SPAN:
            answers.popleft()
        if not self.gap or not limiting or now < self._hold_until:
            return
        rate = 1.0 / self.gap
        # back up to the limit quickly; above it, a slow probe
        doubling = FAST if rate < self._limit or not self._limit else SLOW
        rate += GAIN * 2.0 ** min(12.0, (now - self._hold_until) / doubling)
        if rate > 2.0 * self._limit if self._limit else latency > 0 and rate * latency > window:
            self.gap = 0.0  # the host took twice its old limit, or the window binds first
            return
        self.gap = 1.0 / rate

    def throttled(self, now: float, *, decrease: bool, floor: bool = False) -> None:
        """The host throttled a request; ``decrease``: the first throttle of a window's worth
        of requests, which sets the pace anew; ``floor``: the window is as small as it gets,
        so only spacing can slow the starts further."""
        rate = self.delivered(now)
        if not decrease:
            return
        if rate is None and (floor or not self._answers):  # no rate yet: double the spacing
            self.gap = min(MAX_GAP, max(self.gap * 2, MIN_GAP))
            self._next = now + random.uniform(self.gap / 2, self.gap)
        elif rate is not None:
            same = abs(rate - self._limit) <= SAME * self._limit
            self._held = min(self._held + 1, MAX_HOLDS) if same else 0
            self._hold_until = now + HOLD * 2.0 ** self._held
            self._limit = rate
            self.gap = 1.0 / (BACKOFF * rate)
            self._next = max(self._next, now)

    def delivered(self, now: float) -> float | None:
        """Answers per second over the last :data:`SPAN` seconds; ``None`` with too few, or
        before the first answer is :data:`SPAN` old (a run's first round trips, and the
        burst a store lets through first, would make it up)."""
        answers = self._answers
        while answers and now - answers[0] > SPAN:
            answers.popleft()
        if len(answers) < MIN_ANSWERS or now - self._first < SPAN:
            return None
        # The busier half counts too: a throttle after a lull (the window just halved, the
        # process busy) would otherwise be taken for a lower limit, and a pace too low
        # never meets the throttle that corrects it, where one too high soon does.
        recent = len(answers) - bisect.bisect_left(answers, now - SPAN / 2)
        return max(len(answers) / SPAN, recent / (SPAN / 2))

    @property
    def rate(self) -> float | None:
        """The paced rate in requests per second; ``None`` when not paced."""
        return 1.0 / self.gap if self.gap else None
