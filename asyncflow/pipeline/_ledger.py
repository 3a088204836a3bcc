"""Ledgers: how each node translates its output ordinals back into its input ordinals.

A node numbers what it reads (input ordinals: 0, 1, ... in the order it takes items from its
input channel) and what it writes (output ordinals, in the order the items enter its output
channel). Its ledger answers one question, :meth:`Ledger.settle`: given the outputs *settled*
since it was last asked (delivered to the consumer, or settled further down), which inputs
are settled now? An input is settled when every output made from it is, including an input
that made none (a filtered or failed item, a dropped last batch).

The run's lineage (:class:`~asyncflow.pipeline._lineage.Lineage`) keeps each ledger's settled
inputs and asks it only about what changed, so a state taken while the consumer reads costs
what settled since the last one, not a walk over everything in flight. A ledger keeps records
only of what is in flight: it drops those of outputs below the watermark it is given. Records
are written on the run's loop, *before* the items they describe are put out; reading and
dropping them take the run's lineage lock.

The source's ledger (:class:`SourceLedger`) turns source ordinals into positions: a resumed
run's source skips positions (:class:`SourcePlan`: where a run's source starts), so its
ordinals and positions differ. :func:`received` is the consumer's count of the items it took.
"""

from __future__ import annotations

import abc
import bisect
import threading
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any

from ..workers import FAILED
from ._span import Span, runs

__all__ = ["FixedLedger", "Ledger", "MapLedger", "Passthrough", "ShuffleLedger", "SourceLedger",
           "SourcePlan", "received"]


class Ledger(abc.ABC):
    """The base: one node's translation from settled outputs to settled inputs.

    Attributes:
        on: Whether records are kept (off when the run cannot be resumed anyway, and from
            the moment the run stops: :meth:`~asyncflow.pipeline._lineage.Lineage.freeze`).
            Writers check it with :attr:`lock` held.
        lock: The run's lineage lock, held while records change or are read.
    """

    on = True
    #: The canonical JSON text (sorted keys, no spaces) of what :meth:`get_state` returned
    #: last, where the ledger keeps it at hand (the state's checksum then reuses it).
    state_text: str | None = None

    def __init__(self) -> None:
        self.lock: Any = threading.RLock()  # replaced by the run's lineage lock
        self.grew: Callable[[int], None] = lambda records: None  # the run's compaction trigger

    @abc.abstractmethod
    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        """The inputs that ``outputs`` settle (lock held): ``outputs`` are the outputs
        settled since the last call (``[start, end)`` ranges, none given before); returns
        ranges, in any order (one given before may come again). Records of outputs below
        ``mark`` are dropped: every output below it is settled, and none of them is to be
        traced any more (:meth:`~asyncflow.pipeline._lineage.Lineage.hold`)."""

    @abc.abstractmethod
    def inputs_of(self, ordinal: int) -> list[int]:
        """The inputs output ``ordinal`` was made from (lock held)."""

    def lowest(self, ordinal: int) -> int:
        """An input ordinal at or below every input of the outputs from ``ordinal`` on
        still recorded (lock held): the records upstream a trace of those may need. This
        default keeps every record upstream."""
        return 0

    def get_state(self) -> dict[str, Any] | None:
        """Extras to save beyond the settled positions, as of the last walk (lock held)."""
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` saved, before the run starts."""
        return None  # a hook: nothing to do by default

    def join(self, before: Ledger, key_of: Callable[[int], Any]) -> None:
        """Take its place in the run's lineage, after the ledger ``before`` (as the run is
        built): ``key_of(o)`` names output ``o``'s input by its source positions, as sorted
        ``(start, end)`` ranges. A hook: nothing to do by default."""
        return None


class Passthrough(Ledger):
    """Output ``n`` is input ``n`` (``prefetch``; an ordered map that cannot skip items has
    a :class:`MapLedger` with ``identity``, which answers the same)."""

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        return outputs

    def inputs_of(self, ordinal: int) -> list[int]:
        return [ordinal]

    def lowest(self, ordinal: int) -> int:
        return ordinal


class FixedLedger(Ledger):
    """Output ``n`` is made of inputs ``[n * size, (n + 1) * size)``, in order (``batch``, a
    custom stage with ``items_per_output``).

    Attributes:
        taken: Inputs read so far (``None``: not counted; the source clamps instead).
        elements: Inputs settled one by one, not yet given by :meth:`settle`: an
            ``unbatch`` right after this batch settles them element by element
            (``SplitLedger.batch``).
    """

    def __init__(self, size: int, *, counted: bool = True) -> None:
        super().__init__()
        self.size = size
        self.taken: int | None = 0 if counted else None
        self.elements: list[tuple[int, int]] = []

    def take(self, count: int) -> None:
        if self.taken is not None:
            self.taken += count

    def drop_rest(self, count: int) -> None:
        """The last ``count`` inputs make no output (``drop_last``): settled now."""
        if self.taken is not None and count:
            with self.lock:
                if self.on:
                    self.elements.append((self.taken - count, self.taken))

    def _clamp(self, ordinal: int) -> int:
        return ordinal if self.taken is None else min(ordinal, self.taken)

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        size, clamp = self.size, self._clamp
        inputs = [(clamp(a * size), clamp(b * size)) for a, b in outputs]
        if self.elements:
            inputs += self.elements
            self.elements = []
        return inputs

    def inputs_of(self, ordinal: int) -> list[int]:
        return list(range(self._clamp(ordinal * self.size), self._clamp((ordinal + 1) * self.size)))

    def lowest(self, ordinal: int) -> int:
        return self._clamp(ordinal * self.size)


class MapLedger(Ledger):
    """One output per input at most (``map``, ``filter``): the input of each output in
    flight, in output order; inputs that made no output (dead) are settled at once.

    Args:
        in_order: Chunks are recorded in the order they were taken (an ordered stage, or
            a single worker); otherwise :meth:`take` notes each chunk's first input.
        identity: Every input makes one output, in order (an ordered map that cannot skip
            an item): nothing is recorded.
        is_filter: Values are keep / drop flags, not outputs.
    """

    def __init__(self, *, in_order: bool, identity: bool = False, is_filter: bool = False):
        super().__init__()
        self.in_order = in_order
        self.identity = identity
        self.is_filter = is_filter
        self.taken = 0
        self.sources: list[int] = []  # the input of each output from ``first_out`` on
        self.first_out = 0
        self.dead: list[int] = []  # inputs that made no output, until settled
        self.starts: dict[int, int] = {}  # id(chunk) -> its first input, until emitted

    @classmethod
    def of(cls, spec: Any, concurrency: int, budget: float) -> MapLedger:
        """The ledger of a ``map`` / ``filter`` stage (a ``MapSpec``) with ``concurrency``
        calls in flight and a failure budget of ``budget``."""
        return cls(in_order=spec.ordered or concurrency == 1, is_filter=spec.mode == "filter",
                   identity=spec.mode == "map" and spec.ordered and not budget)

    def take(self, items: list[Any]) -> None:
        """``items`` were just read from the input (no await since)."""
        if not self.in_order and self.on and not self.identity:
            self.starts[id(items)] = self.taken
            self.taken += len(items)

    def emit(
        self, items: list[Any], values: list[Any], failures: list[tuple[int, BaseException]]
    ) -> Any:
        """Record the outputs of ``items`` (a chunk, or the next part of one when in order)
        before they are put out: ``values[i]`` is item ``i``'s value, ``FAILED`` where it
        failed (``values`` ends early when the run stopped). Returns a token for
        :meth:`undo`."""
        if not self.on or self.identity:
            return None
        if self.in_order:
            first = self.taken
            self.taken += len(items)
        else:
            first = self.starts.pop(id(items))
        done = len(values)
        with self.lock:
            if not self.on:  # the run stopped meanwhile (``Lineage.freeze``)
                return None
            # the first output's ordinal: settling may drop records before ``undo``
            token = (self.first_out + len(self.sources), len(self.dead), first)
            if self.is_filter or failures:
                keep = self.is_filter
                for i, value in enumerate(values):
                    if value is FAILED or (keep and not value):
                        self.dead.append(first + i)
                    else:
                        self.sources.append(first + i)
            else:
                self.sources.extend(range(first, first + done))
        self.grew(1)
        return token

    def undo(self, token: Any) -> None:
        """Forget what :meth:`emit` recorded (the outputs were not put out after all)."""
        if token is None:
            return
        output, dead, first = token
        with self.lock:
            del self.sources[max(0, output - self.first_out):]
            del self.dead[dead:]
        if self.in_order:
            self.taken = first

    def inputs_of(self, ordinal: int) -> list[int]:
        if self.identity:
            return [ordinal]
        index = ordinal - self.first_out
        return [self.sources[index]] if 0 <= index < len(self.sources) else []

    def lowest(self, ordinal: int) -> int:
        if self.identity:
            return ordinal
        return min(self.sources[max(0, ordinal - self.first_out):], default=self.taken)

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        if self.identity:
            return outputs
        ordinals, self.dead = self.dead, []  # dead inputs are settled at once
        first, sources = self.first_out, self.sources
        listed = len(sources)
        for a, b in outputs:
            low, high = max(a - first, 0), min(b - first, listed)
            if low < high:
                ordinals += sources[low:high]
        drop = min(listed, mark - first)
        if drop > 0:
            del sources[:drop]
            self.first_out += drop
        return runs(ordinals)


class ShuffleLedger(MapLedger):
    """Outputs in any order of the inputs (``shuffle``): the input of each output in
    flight, in output order."""

    def __init__(self) -> None:
        super().__init__(in_order=True)

    def record(self, inputs: list[int]) -> None:
        """Outputs are about to be put out, made from ``inputs`` in this order."""
        if inputs:
            with self.lock:
                if not self.on:
                    return
                self.sources.extend(inputs)
            self.grew(1)


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
        self._pieces = _pieces(plan)
        self._firsts = [piece[0] for piece in self._pieces]
        self._plan_settled = False  # the plan's skipped positions given by settle()
        self._beyond: list[tuple[int, int]] = []  # settled ordinals not yet emitted

    def positions(self, start: int, end: int) -> list[tuple[int, int]]:
        """The position ranges of ordinals ``[start, end)`` (found by bisection)."""
        if not self.plan.skip.ranges:  # ordinals follow the positions from the base, no gap
            return [(self.plan.base + start, self.plan.base + end)]
        pieces, out = self._pieces, []
        index = max(0, bisect.bisect_right(self._firsts, start) - 1)
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
        ordinals = []
        for start, end in outputs:
            if end > emitted:
                self._beyond.append((max(start, emitted), end))
                end = emitted
            if start < end:
                ordinals.append((start, end))
        return positions + self.settled(ordinals)

    def settled(self, ordinals: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The positions of ``ordinals`` (``[start, end)`` ranges), emitted and settled now."""
        return [pair for start, end in ordinals for pair in self.positions(start, end)]


def _pieces(plan: SourcePlan) -> list[tuple[int, int, int]]:
    """``(first ordinal, first position, length)`` of each run of positions yielded
    without a gap; the last is open-ended (length -1)."""
    pieces, ordinal, position = [], 0, plan.base
    for start, end in plan.skip.ranges:
        if end <= position:
            continue
        pieces.append((ordinal, position, start - position))
        ordinal += start - position
        position = end
    pieces.append((ordinal, position, -1))
    return pieces
