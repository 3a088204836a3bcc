"""``Span``: a set of ordinals (positions in a stream) kept as a watermark plus ranges above it.

Everything below ``mark`` is in the set, and so is every ``[start, end)`` of ``ranges``
(sorted, disjoint, each starting above ``mark``). A run's settled positions are such a set:
its size follows what is in flight, not how far the stream has gone.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Any

from .._errors import ConfigError

__all__ = ["GrowingSpan", "Span", "is_count", "runs"]


class Span:
    """An immutable set of non-negative ints: ``[0, mark)`` plus ``ranges``.

    Args:
        mark: Every ordinal below it is in the set.
        ranges: ``(start, end)`` pairs, in any order, overlapping or not: normalized here
            (merged, and those that reach the mark absorbed into it).
    """

    __slots__ = ("_starts", "mark", "ranges")
    mark: int
    ranges: tuple[tuple[int, int], ...]
    _starts: list[int]

    def __init__(self, mark: int = 0, ranges: Iterable[tuple[int, int]] = ()) -> None:
        if not ranges:
            self.mark, self.ranges, self._starts = mark, (), []
            return
        # Sorted by start, each range either extends the last run (the mark's, until the
        # first gap: later ones start past that gap) or begins a new one. (A GrowingSpan
        # would join them too, at three times the cost: a bisection per range.)
        starts: list[int] = []
        ends: list[int] = []
        last = mark
        for start, end in sorted(ranges):
            if start <= last:
                if end > last:
                    last = end
                    if ends:
                        ends[-1] = end
                    else:
                        mark = end
            elif end > start:
                starts.append(start)
                ends.append(end)
                last = end
        self.mark = mark
        self.ranges = tuple(zip(starts, ends, strict=True))
        self._starts = starts

    @classmethod
    def _trusted(cls, mark: int, starts: list[int], ends: list[int]) -> Span:
        """A span of already normalized parts (sorted, disjoint, apart, above ``mark``)."""
        span = cls.__new__(cls)
        span.mark, span._starts = mark, starts[:]
        span.ranges = tuple(zip(starts, ends, strict=True))
        return span

    @classmethod
    def of(cls, mark: int, ordinals: list[int], ranges: Iterable[tuple[int, int]] = ()) -> Span:
        """``[0, mark)``, the single ``ordinals`` (any order) and ``ranges``, joined."""
        return cls(mark, [*ranges, *runs(ordinals)])

    def __contains__(self, ordinal: object) -> bool:
        if not isinstance(ordinal, int):
            return False
        if ordinal < self.mark:
            return True
        index = bisect.bisect_right(self._starts, ordinal) - 1
        return index >= 0 and ordinal < self.ranges[index][1]

    def intervals(self) -> list[tuple[int, int]]:
        """The set as sorted, disjoint ``(start, end)`` pairs (the mark's first)."""
        return [(0, self.mark), *self.ranges] if self.mark else list(self.ranges)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Span) and other.mark == self.mark and other.ranges == self.ranges
        )

    def __hash__(self) -> int:
        return hash((self.mark, self.ranges))

    def __repr__(self) -> str:
        return f"Span(mark={self.mark}, ranges={list(self.ranges)})"

    def __len__(self) -> int:
        return self.mark + sum(end - start for start, end in self.ranges)

    def within(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The parts of ``[start, end)`` that are in the set, in order."""
        if start < self.mark:
            yield start, min(end, self.mark)
            start = self.mark
        if start >= end or not self.ranges:
            return
        ranges = self.ranges
        for index in range(max(0, bisect.bisect_right(self._starts, start) - 1), len(ranges)):
            low, high = ranges[index]
            if low >= end:
                return
            if high > start:
                yield max(low, start), min(high, end)

    def gaps(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The parts of ``[start, end)`` that are not in the set, in order."""
        for low, high in self.within(start, end):
            if low > start:
                yield start, low
            start = high
        if start < end:
            yield start, end

    def union(self, other: Span) -> Span:
        return Span(max(self.mark, other.mark), (*self.ranges, *other.ranges))

    def to_json(self) -> dict[str, Any]:
        """``{"mark": int, "ranges": [[start, end], ...]}``."""
        return {"mark": self.mark, "ranges": [[start, end] for start, end in self.ranges]}

    @classmethod
    def from_json(cls, data: Any, what: str, limit: int | None = None) -> Span:
        """The span :meth:`to_json` gave, checked.

        Raises:
            ConfigError: ``data`` is not such a dict, or its numbers are out of order or
                above ``limit`` (``what`` names it in the message).
        """
        if not isinstance(data, dict) or set(data) != {"mark", "ranges"}:
            raise ConfigError(
                f"{what}: expected {{'mark': int, 'ranges': [...]}}, got {data!r:.80}"
            )
        mark, ranges = data["mark"], data["ranges"]
        if not is_count(mark) or not isinstance(ranges, list):
            raise ConfigError(f"{what}: bad mark or ranges: {data!r:.80}")
        last = mark
        pairs: list[tuple[int, int]] = []
        for pair in ranges:
            if (not isinstance(pair, list) or len(pair) != 2 or not all(map(is_count, pair))
                    or not last < pair[0] < pair[1]):
                raise ConfigError(
                    f"{what}: ranges must be sorted [start, end] pairs above the mark "
                    f"{mark}, each after the last; got {pair!r:.40}"
                )
            pairs.append((pair[0], pair[1]))
            last = pair[1]
        if limit is not None and last > limit:
            raise ConfigError(f"{what}: positions up to {last} in a source of {limit} items")
        return cls(mark, pairs)


class GrowingSpan:
    """A set of ordinals that only grows, kept like :class:`Span` (a mark, then sorted,
    disjoint ranges apart from each other): :meth:`add` returns just the parts that are new,
    in time proportional to what it is given (a bisection and a splice per range)."""

    __slots__ = ("ends", "mark", "starts")

    def __init__(self, mark: int = 0) -> None:
        self.mark = mark
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Join ``[start, end)`` pairs (any order); returns their parts not in the set before."""
        new: list[tuple[int, int]] = []
        starts, ends, mark = self.starts, self.ends, self.mark
        left, right = bisect.bisect_left, bisect.bisect_right
        for start, end in ranges:
            if start < mark:
                start = mark
            if end <= start:
                continue
            low = left(ends, start)  # the first range reaching ``start``
            high = right(starts, end, low)  # past the last one touching ``end``
            if low == high:  # it touches none: the usual case, made quick
                new.append((start, end))
                if start == mark:
                    mark = end
                else:
                    starts.insert(low, start)
                    ends.insert(low, end)
                continue
            position = start
            for index in range(low, high):
                if starts[index] > position:
                    new.append((position, starts[index]))
                if ends[index] > position:
                    position = ends[index]
            if position < end:
                new.append((position, end))
            start, end = min(start, starts[low]), max(end, ends[high - 1])
            if start == mark:  # ``low`` is 0: the mark absorbs them
                mark = end
                del starts[:high], ends[:high]
            else:
                starts[low:high] = [start]
                ends[low:high] = [end]
        self.mark = mark
        return new

    def span(self) -> Span:
        """The set now, as a :class:`Span`."""
        return Span._trusted(self.mark, self.starts, self.ends)


def runs(ordinals: list[int]) -> list[tuple[int, int]]:
    """``ordinals`` (any order, sorted here in place) as ``[start, end)`` runs of consecutive
    ones."""
    ordinals.sort()
    out: list[tuple[int, int]] = []
    start = end = -1
    for ordinal in ordinals:
        if ordinal == end:
            end += 1
        elif ordinal > end:
            if end > start:
                out.append((start, end))
            start, end = ordinal, ordinal + 1
    if end > start:
        out.append((start, end))
    return out


def is_count(value: Any) -> bool:
    """Whether ``value`` is an int >= 0 (not a bool): a position or a count in a state."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
