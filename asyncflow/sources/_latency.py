"""The one record of a host's latencies, read two ways: in answer order for hedging and the
pace, in send order for the window.

**In answer order** (:meth:`Latencies.median`, :meth:`Latencies.hedge_after`): the last
:data:`KEEP` latencies, hedges' included, in a ring whose quantiles say when a read is late
(``Retry.hedge_quantile``, at least :data:`MEDIAN_FLOOR` times the median; see ``_hedge``)
and how long a round trip takes (``_pace``).

**In send order** (:attr:`Latencies.ratio`, :attr:`~Latencies.queued`,
:attr:`~Latencies.drain`): queueing delay, whether the window has grown past what can be
served at once. A window larger than the host (or this process: its event loop, its CPU, its
connections) can serve at once adds no throughput: the extra requests only wait, and every
answer takes longer by the wait (Little's law: latency = requests in flight / rate). TCP
Vegas reads that from the round-trip time: the lowest one seen lately is the path's own, and
what a recent one adds to it is queueing. Here the same is read from the median of each
:data:`GROUP` requests sent one after another (a median, so that a store's latency tail does
not pass for a queue), against the lowest such median of the last :data:`BASE_SPAN` seconds.
The window grows only while the recent median stays under :data:`GROW_BELOW` times that base,
and shrinks towards it above :data:`SHRINK_ABOVE`. The groups follow the send order, not the
answer order: the first answers of a burst are its quickest, and a median of them would be
too low.

Measured on two cores (``benchmarks/bench_remote.py``'s plain and tail stores, 2,000 objects
of 100 KB): a fixed 256 reads in flight delivered 8-13% fewer objects a second than 128, with
a p99 latency 1.7-2.4 times as long (the client's own event loop was the queue).
"""

from __future__ import annotations

from collections import deque

__all__ = ["BASE_SPAN", "DOUBLE_BELOW", "GROUP", "GROW_BELOW", "KEEP", "MEDIAN_FLOOR",
           "MIN_BASE", "MIN_SAMPLES", "SHRINK_ABOVE", "SHRINK_AFTER", "Latencies"]

#: Latencies seen before the quantiles are taken (no hedge, no paced round trip before).
MIN_SAMPLES = 32
#: The latencies a quantile is taken over: the host's recent behaviour.
KEEP = 512
_EVERY = 32  # the quantiles are recomputed after this many new samples
#: A request is never late before this many times the median latency: below it, lateness is
#: more likely this process's own queueing than the host's tail.
MEDIAN_FLOOR = 2.0
#: Requests per median, in send order.
GROUP = 64
#: Seconds a median stays a candidate for the base (the host's own latency may change).
BASE_SPAN = 10.0
#: Slow start doubles the window again only while the recent median is under this many times
#: the base (as TCP's HyStart leaves slow start when round trips lengthen).
DOUBLE_BELOW = 1.5
#: The window grows while the recent median is under this many times the base.
GROW_BELOW = 1.75
#: Above this many times the base, the window shrinks (to ``GROW_BELOW`` times, at most half).
SHRINK_ABOVE = 2.5
#: Groups in a row above ``SHRINK_ABOVE`` before the window shrinks: one alone can be a store's
#: latency tail drawn unevenly, and a real queue lasts.
SHRINK_AFTER = 2
#: A base below this counts as this: a millisecond more is no queue worth a smaller window.
MIN_BASE = 0.001
_OPEN_GROUPS = 64  # a group this many behind the latest settled one is left unsettled


class Latencies:
    """The recent latencies of one host's requests: quantiles, and send-order medians.

    Args:
        first: Requests numbered below this are left out of the medians: the first window's
            answers include the connections' set-up.
    """

    __slots__ = ("_added", "_bases", "_floor", "_groups", "_guard", "_ring", "_settled",
                 "_sorted", "high", "ratio")

    def __init__(self, first: int = 0) -> None:
        self._ring: deque[float] = deque(maxlen=KEEP)
        self._added = 0
        self._sorted: list[float] = []
        self._groups: dict[int, list[float]] = {}
        self._settled: set[int] = set()
        self._floor = 0  # groups below this one are left out: too old to settle
        self._bases: deque[tuple[float, float]] = deque()  # (when, median): rising medians
        self._guard = first
        #: The latest group's median over the base (1.0 until a group is complete).
        self.ratio = 1.0
        #: Groups in a row whose ratio was above :data:`SHRINK_ABOVE`.
        self.high = 0

    def add(self, seconds: float, seq: int | None = None, now: float = 0.0) -> bool:
        """One request's time, from its start to its whole body; ``seq``: its number in send
        order (``None``: a hedge, which counts only in the quantiles), answered at ``now``.

        Returns:
            Whether it settled its group's median (:attr:`ratio` is then new).
        """
        self._ring.append(seconds)
        self._added += 1
        if self._added % _EVERY == 0 or self._added == MIN_SAMPLES:
            self._sorted = sorted(self._ring)
        return seq is not None and self._settle(seq, seconds, now)

    def median(self) -> float:
        """The median of the recent latencies (0 until :data:`MIN_SAMPLES` were seen)."""
        ranked = self._sorted
        return ranked[len(ranked) // 2] if len(ranked) >= MIN_SAMPLES else 0.0

    def hedge_after(self, quantile: float) -> float | None:
        """Seconds after which a request is late: ``quantile`` of the recent ones, at least
        twice the median; ``None`` until :data:`MIN_SAMPLES` have been seen."""
        ranked = self._sorted
        if len(ranked) < MIN_SAMPLES:
            return None
        at = ranked[min(len(ranked) - 1, int(quantile * len(ranked)))]
        return max(at, MEDIAN_FLOOR * ranked[len(ranked) // 2])

    def _settle(self, seq: int, seconds: float, now: float) -> bool:
        """A group of :data:`GROUP` requests sent one after another has its median once more
        than half of them have answered: the slowest of those, without waiting for the
        group's tail. Requests sent before the last :meth:`restart` are left out: they were
        sent under the window before it changed."""
        key = seq // GROUP
        if seq < self._guard or key < self._floor or key in self._settled:
            return False
        group = self._groups.setdefault(key, [])
        group.append(seconds)
        if len(group) <= GROUP // 2:
            return False
        median = max(group)
        del self._groups[key]
        self._settled.add(key)
        if key - _OPEN_GROUPS > self._floor:
            self._floor = key - _OPEN_GROUPS
            self._settled = {k for k in self._settled if k >= self._floor}
            for old in [k for k in self._groups if k < self._floor]:
                del self._groups[old]
        bases = self._bases
        while bases and bases[0][0] < now - BASE_SPAN:
            bases.popleft()
        while bases and bases[-1][1] >= median:  # never the lowest again while this one lasts
            bases.pop()
        bases.append((now, median))
        self.ratio = median / max(bases[0][1], MIN_BASE)
        self.high = self.high + 1 if self.ratio > SHRINK_ABOVE else 0
        return True

    def restart(self, next_seq: int) -> None:
        """The window changed: medians count only requests numbered ``next_seq`` or later."""
        self._guard = next_seq
        self._groups.clear()
        self.high = 0

    @property
    def drain(self) -> bool:
        """Whether the answers have queued long for :data:`SHRINK_AFTER` groups in a row."""
        return self.high >= SHRINK_AFTER

    @property
    def queued(self) -> bool:
        """Whether the latest group waited long enough that the window should not grow."""
        return self.ratio >= GROW_BELOW
