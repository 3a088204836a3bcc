"""Adaptive concurrency per host: a window of requests in flight that grows while the host
answers and halves when it throttles, as TCP's congestion window does.

Every whole read (``read_bytes``) from one host (``http(s)://host:port``) or one S3 bucket and
prefix (``s3://bucket/top-level-prefix/``) goes through that key's :class:`HostLimiter`. The
``concurrency`` a user gives ``map`` (and the run's connection pool) stays the ceiling; below
it the window:

- starts at :data:`INITIAL_WINDOW` and grows by one per success while it is full ("slow
  start", doubling each round trip) until the first throttle, then by one per window of
  successes (additive increase) up to where the host last throttled, and a quarter as fast
  above it;
- halves on 429, 503 or S3 ``SlowDown`` (multiplicative decrease), at most once per window of
  requests: the throttles of requests sent before the last decrease are not counted again;
- on a throttle, also paces request starts at a little below the rate the host delivered
  (:mod:`._pace`): a store that limits a rate rather than a concurrency is then probed every
  few seconds, not many times a second; with one request in flight and no rate to measure
  yet, starts are spaced out (10 ms, twice as far on each throttle): quick rejections would
  otherwise let even one request at a time hammer the host;
- gives a throttled request's place back at once, so its wait holds no slot, and serves
  retried requests before fresh ones, so that no object starves behind newcomers;
- doubles at most once per median of its answers, stops growing while they queue, and
  shrinks when they queue long (:mod:`._latency`): past what the host, or this process,
  serves at once, a larger window adds only waiting.

The limiters of a run live in its scope (one under each host key), and each adds a line to
the run's ``stats().notes``: its window, requests, throttles and hedges.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .._scope import current_scope
from ._latency import DOUBLE_BELOW, GROW_BELOW, Latencies
from ._objects import connections
from ._pace import Pace
from ._retry import Retry, Transient

__all__ = ["HOSTS_KEY", "INITIAL_WINDOW", "PACED_WINDOW", "HostLimiter", "limiter_for"]

T = TypeVar("T")

HOSTS_KEY = "asyncflow.hosts"
INITIAL_WINDOW = 32
#: No hedges for a host that throttled within this many seconds: a hedge is one more request.
HEDGE_QUIET = 2.0
_KEEP_SENT = 8192  # send times kept for hedging's congestion check
#: At this window or below, every throttle (not only the first of a window) spaces starts.
PACED_WINDOW = 2.0
#: Queueing alone never shrinks the window below this.
QUEUE_FLOOR = 8.0


class HostLimiter:
    """The window of requests in flight to one host, and what it has seen.

    Args:
        name: The host's label in ``stats().notes`` (free of credentials).
        ceiling: The window never grows past this (the run's connection pool).
    """

    def __init__(self, name: str, ceiling: int) -> None:
        self.name = name
        self.ceiling = ceiling
        self.window = float(min(INITIAL_WINDOW, ceiling))
        self.in_flight = 0
        # Requests sent: the next one's number in send order (see throttle()).
        self.requests = self.throttled = self.hedges = self.hedges_won = 0
        # One record serves hedging, the pace and the window (:mod:`._latency`); the first
        # window's answers are left out of its medians (the connections' set-up).
        self.latencies = Latencies(int(self.window))
        # The window at most doubles between two medians (:mod:`._latency`), so that slow
        # start cannot outrun the signal that it has grown past what the host serves.
        self._grow_cap = 2 * self.window
        loop = asyncio.get_running_loop()
        self._time = loop.time
        self._create_future = loop.create_future
        self.last_success = self._time()
        self.last_throttle = float("-inf")
        self._slow_start = True
        self._limit = float(ceiling)  # the window when the host last throttled
        self._recovered = 0  # throttles of requests numbered below this were answered already
        self._retried: deque[asyncio.Future[None]] = deque()
        self._fresh: deque[asyncio.Future[None]] = deque()
        # Hedges earned: Retry.hedge per request sent, one spent per hedge, so that hedges
        # never pass that share of the requests, counted over the whole run.
        self._tokens = 0.0
        self._starts: dict[int, float] = {}  # requests in flight: when each began, oldest first
        self._sent_at: list[float] = []  # when the recent requests were sent, in order
        self.pace = Pace()
        self._timer_at = float("-inf")  # when the wake-up at the end of a pause is due

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        retried: bool,
        retry: Retry,
    ) -> T:
        """One try of a read, within the window; ``retried`` tries go before fresh ones.

        Raises:
            Transient: The try failed (a throttled one shrinks the window first).

        Cancellation:
            Cancelling the caller while it waits for a place leaves the queue; while the
            try runs, cancels it and frees its place.
        """
        now = self._time()
        if (self.in_flight < self.window and self.pace.delay(now) <= 0
                and not (self._retried or (self._fresh and not retried))):
            self.in_flight += 1
            self.pace.started(now)
        else:
            await self._wait(self._retried if retried else self._fresh)
        seq = self.requests
        self.requests += 1
        self._tokens += retry.hedge
        start = self._starts[seq] = self._time()
        self._sent_at.append(start)
        if len(self._sent_at) > _KEEP_SENT:
            del self._sent_at[: _KEEP_SENT // 2]
        ok = throttled = False
        try:
            result = await attempt()
            ok = True
            return result
        except Transient as exc:
            throttled = exc.throttled
            raise
        finally:
            del self._starts[seq]
            self._release(seq, self._time() - start, ok=ok, throttled=throttled)

    async def _wait(self, queue: deque[asyncio.Future[None]]) -> None:
        fut = self._create_future()
        queue.append(fut)
        self._wake()  # a place may be free already, or a pause must be timed
        handed = False
        try:
            await fut
            handed = True
        finally:
            if not handed:
                if fut.done() and not fut.cancelled():
                    self._give_back()  # the place was handed over as the caller was cancelled
                else:
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        queue.remove(fut)

    def _release(self, seq: int, elapsed: float, *, ok: bool, throttled: bool) -> None:
        if ok:
            now = self.last_success = self._time()
            if self.latencies.add(elapsed, seq, now):
                self._judge(self.latencies.ratio)
            waiting = bool(self._retried or self._fresh)
            self.pace.answered(now, limiting=waiting, window=self.window,
                               latency=self.latencies.median())
            limits = self.in_flight >= int(self.window) or (waiting and self.pace.rate is None)
            if limits and not self.latencies.queued:
                # Grow only a window that limits (not the pace): a host asked for less
                # proves nothing; nor one whose answers queue.
                self.window = min(float(self.ceiling), self._grow_cap,
                                  self.window + self._step())
        elif throttled:
            self.throttle(seq)
        self._give_back()

    def _step(self) -> float:
        """How much one answer grows the window: one in slow start; after a throttle one per
        window of answers (a round trip) back up to where the host throttled, and a quarter
        of that above it, so that the window probes the known limit rarely: each probe that
        passes it costs a round trip of rejections, and their waits (a ``Retry-After``)."""
        if self._slow_start:
            return 1.0
        return (1.0 if self.window < self._limit else 0.25) / self.window

    def _judge(self, ratio: float) -> None:
        """A new median, ``ratio`` times the base: the window may double again while the
        answers do not wait (slow start), grow by a quarter while they wait a little (and slow
        start ends), and shrinks when they wait long, twice in a row (:meth:`_drain`)."""
        if self.latencies.drain:  # only ever after ratios above SHRINK_ABOVE
            self._drain(ratio)
        elif ratio < DOUBLE_BELOW:
            self._grow_cap = max(self._grow_cap, 2 * self.window)
        elif ratio < GROW_BELOW:
            self._slow_start = False
            self._grow_cap = max(self._grow_cap, 1.25 * self.window)

    def _drain(self, ratio: float) -> None:
        """Answers queue long: shrink the window to where they would not (at most by half,
        not below :data:`QUEUE_FLOOR`), and judge again only requests sent after."""
        smaller = max(min(QUEUE_FLOOR, self.window), self.window * max(0.5, GROW_BELOW / ratio))
        if smaller < self.window:
            self.window = smaller
            self._slow_start = False
            self.latencies.restart(self.requests)

    def throttle(self, seq: int | None = None) -> None:
        """A request numbered ``seq`` (``None``: a hedge, just sent) was throttled."""
        self.throttled += 1
        self.last_throttle = self._time()
        decrease = seq is None or seq >= self._recovered
        floor = self.window <= PACED_WINDOW
        self.pace.throttled(self.last_throttle, decrease=decrease or floor, floor=floor)
        if decrease:
            self._limit = self.window
            self.window = max(1.0, self.window / 2)
            self._slow_start = False
            self._recovered = self.requests
            self.latencies.restart(self.requests)

    def _give_back(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _end_pause(self) -> None:
        self._timer_at = float("-inf")  # asyncio may run it a clock tick early: wake re-arms
        self._wake()

    def _wake(self) -> None:
        """Hand free places to waiters, retried ones first; while paced, each at its start's
        slot (a timer wakes the next)."""
        while self.in_flight < self.window and (self._retried or self._fresh):
            now = self._time()
            pause = self.pace.delay(now)
            if pause > 0:
                due = now + pause
                if self._timer_at != due:
                    self._timer_at = due
                    asyncio.get_running_loop().call_later(pause, self._end_pause)
                return
            fut = (self._retried or self._fresh).popleft()
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)
                self.pace.started(now)

    def overdue(self, due: float, span: float, share: float) -> bool:
        """Whether more than ``share`` of the requests sent from ``due - span`` to ``due``
        (and more than one) are still in flight."""
        sent = self._sent_at
        total = bisect.bisect_right(sent, due) - bisect.bisect_left(sent, due - span)
        pending, low = 0, due - span
        for start in self._starts.values():  # oldest first: stops at the first later one
            if start > due:
                break
            pending += start >= low
        return pending > share * total + 1

    def spend_hedge(self) -> bool:
        """Take one hedge from the budget; ``False`` when none is left, or the host has
        throttled within :data:`HEDGE_QUIET` seconds."""
        if self._tokens < 1.0 or self._time() - self.last_throttle < HEDGE_QUIET:
            return False
        self._tokens -= 1.0
        self.hedges += 1
        return True

    def report(self) -> str:
        """One line for ``stats().notes``."""
        phase = ("queueing" if self.latencies.queued else
                 "growing" if self._slow_start else "adapting")
        paced = self.pace.rate
        pace = f", paced at {paced:,.0f}/s" if paced is not None else ""
        line = (f"remote reads from {self.name}: window {int(self.window)} of {self.ceiling} "
                f"({phase}{pace}), {self.requests} requests, {self.throttled} throttled")
        if self.hedges:
            line += f", {self.hedges} hedged ({self.hedges_won} won)"
        return line


async def limiter_for(key: str, name: str) -> HostLimiter:
    """The running pipeline's (or session's) limiter for ``key``, made on first use; a
    private one outside. Its window's ceiling is the connection pool's size
    (``_objects.connections``).

    Args:
        key: The host (or S3 bucket and prefix) the window is kept for.
        name: Its label in ``stats().notes``, free of credentials.
    """
    scope = current_scope()
    if scope is None:
        return HostLimiter(name, connections())

    def open_host() -> contextlib.nullcontext[HostLimiter]:
        gate = HostLimiter(name, connections())
        scope.add_report(lambda: [gate.report()] if gate.requests else [])
        return contextlib.nullcontext(gate)

    return await scope.get(f"{HOSTS_KEY}|{key}", open_host)
