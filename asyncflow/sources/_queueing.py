"""Queueing delay: whether a host's window has grown past what can be served at once.

A window larger than the host (or this process: its event loop, its CPU, its connections) can
serve at once adds no throughput: the extra requests only wait, and every answer takes longer
by the wait (Little's law: latency = requests in flight / rate). TCP Vegas reads that from
the round-trip time: the lowest one seen lately is the path's own, and what a recent one
adds to it is queueing. Here the same is read from the median of each :data:`GROUP` answers
(a median, so that a store's latency tail does not pass for a queue), against the lowest such
median of the last :data:`BASE_SPAN` seconds. The window grows only while the recent median
stays under :data:`GROW_BELOW` times that base, and shrinks towards it above
:data:`SHRINK_ABOVE`.

Measured on two cores (``benchmarks/bench_remote.py``'s stores, 2,000 objects of 100 KB): a
fixed 256 requests in flight delivered 13% fewer objects a second than 128 and took 2.4x as
long over each (the client's own event loop was the queue).
"""

from __future__ import annotations

from collections import deque

__all__ = ["BASE_SPAN", "DOUBLE_BELOW", "GROUP", "GROW_BELOW", "SHRINK_ABOVE", "Queueing"]

#: Answers per median.
GROUP = 64
#: Seconds a median stays a candidate for the base (the host's own latency may change).
BASE_SPAN = 10.0
#: Slow start doubles the window again only while the recent median is under this many times
#: the base (as TCP's HyStart leaves slow start when round trips lengthen).
DOUBLE_BELOW = 1.5
#: The window grows while the recent median is under this many times the base.
GROW_BELOW = 2.0
#: Above this many times the base, the window shrinks (to ``GROW_BELOW`` times, at most half).
SHRINK_ABOVE = 3.0


class Queueing:
    """The medians of a host's recent answers, grouped, and the lowest of them lately."""

    __slots__ = ("_bases", "_group", "_guard", "ratio")

    def __init__(self, first: int) -> None:
        self._group: list[float] = []
        self._bases: deque[tuple[float, float]] = deque()  # (when, median): rising medians
        # The first window's answers are left out: they include the connections' set-up,
        # and the first to arrive are the quickest of them, not a sample.
        self._guard = first
        #: The latest group's median over the base (1.0 until a group is complete).
        self.ratio = 1.0

    def add(self, seq: int, seconds: float, now: float) -> bool:
        """The answer of request ``seq`` took ``seconds``; ``True`` when it completed a group
        (:attr:`ratio` is then new). Requests sent before the last :meth:`restart` are left
        out: they were sent under the window before it changed."""
        if seq < self._guard:
            return False
        group = self._group
        group.append(seconds)
        if len(group) < GROUP:
            return False
        group.sort()
        median = group[GROUP // 2]
        group.clear()
        bases = self._bases
        while bases and bases[0][0] < now - BASE_SPAN:
            bases.popleft()
        while bases and bases[-1][1] >= median:  # never the lowest again while this one lasts
            bases.pop()
        bases.append((now, median))
        base = bases[0][1]
        self.ratio = median / base if base > 0 else 1.0
        return True

    def restart(self, next_seq: int) -> None:
        """The window changed: count only requests numbered ``next_seq`` or later."""
        self._guard = next_seq
        self._group.clear()

    @property
    def queued(self) -> bool:
        """Whether the latest group waited long enough that the window should not grow."""
        return self.ratio >= GROW_BELOW
