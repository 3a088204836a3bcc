"""The source's side of a run's lineage: where a run's source starts (:class:`SourcePlan`),
its ledger (:class:`SourceLedger`: source ordinals to positions; a resumed run's source
skips positions, so its ordinals and positions differ), and the consumer's count of the items
it took (:func:`received`). See :mod:`asyncflow.pipeline._lineage`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any

from ._ledger import Ledger
from ._span import Span

__all__ = ["SourceLedger", "SourcePlan", "received"]


def received(delivered: int, chunk: Sized) -> int:
    """The items the consumer has taken, of the ``delivered`` handed to it in chunks;
    ``chunk``: what is left of the latest (the consumer's handle takes items out of it).
    Exact after the run stopped too (``break``, ``close()``, garbage collection): the chunk
    outlives the handle, and what it had not taken was never delivered."""
    return delivered - len(chunk)


@dataclass(frozen=True)
class SourcePlan:
    """Where a run's source starts: the position of the opened source's first item, and
    the positions to leave out (settled in an earlier run)."""

    first: int = 0
    skip: Span = field(default_factory=Span)
    #: Each stage's saved extras, by stage name (``Ledger.set_state``).
    nodes: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> int:
        """Every position below it is settled: the first one the run may yield."""
        return max(self.first, self.skip.mark)


class SourceLedger(Ledger):
    """The source's ordinals in order are the positions from :attr:`SourcePlan.base` on,
    leaving out the skipped ones."""

    def __init__(self, plan: SourcePlan) -> None:
        super().__init__()
        self.plan = plan
        self.emitted = 0  # ordinals put out so far (settled outputs beyond do not exist)
        self._split: tuple[SourcePlan, list[int], list[tuple[int, int, int]]] | None = None
        self._plan_settled = False  # the plan's skipped positions given by settle()
        self._beyond: list[tuple[int, int]] = []  # settled ordinals not yet emitted

    def _pieces(self) -> list[tuple[int, int, int]]:
        """``(first ordinal, first position, length)`` of each run of positions yielded
        without a gap; the last is open-ended (length -1)."""
        plan = self.plan
        pieces, ordinal, position = [], 0, plan.base
        for start, end in plan.skip.ranges:
            if end <= position:
                continue
            pieces.append((ordinal, position, start - position))
            ordinal += start - position
            position = end
        pieces.append((ordinal, position, -1))
        return pieces

    def positions(self, start: int, end: int) -> list[tuple[int, int]]:
        """The position ranges of ordinals ``[start, end)`` (found by bisection)."""
        if not self.plan.skip.ranges:  # ordinals follow the positions from the base, no gap
            return [(self.plan.base + start, self.plan.base + end)]
        split = self._split
        if split is None or split[0] is not self.plan:
            pieces = self._pieces()
            split = self._split = (self.plan, [p[0] for p in pieces], pieces)
        _, firsts, pieces = split
        out = []
        index = max(0, bisect.bisect_right(firsts, start) - 1)
        while start < end and index < len(pieces):
            ordinal, position, length = pieces[index]
            stop = end if length < 0 else min(end, ordinal + length)
            if stop > start:
                out.append((position + start - ordinal, position + stop - ordinal))
                start = stop
            index += 1
        return out

    def inputs_of(self, ordinal: int) -> list[int]:
        return [] if ordinal >= self.emitted else [self.positions(ordinal, ordinal + 1)[0][0]]

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        """The positions newly settled (the plan's skipped ones the first time); settled
        ordinals not emitted yet (a custom stage's last output, counted whole) wait."""
        plan, emitted = self.plan, self.emitted
        positions: list[tuple[int, int]] = []
        if not self._plan_settled:
            self._plan_settled = True
            positions += [*plan.skip.ranges, (0, plan.base)]
        if self._beyond:
            outputs = [*self._beyond, *outputs]
            self._beyond = []
        for start, end in outputs:
            if end > emitted:
                self._beyond.append((max(start, emitted), end))
                end = emitted
            if start < end:
                positions += self.settled(start, end)
        return positions

    def settled(self, start: int, end: int) -> list[tuple[int, int]]:
        """The positions of ordinals ``[start, end)``, emitted and settled now."""
        return self.positions(start, end)
