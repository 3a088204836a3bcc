"""Ledgers: how each node translates its output ordinals back into its input ordinals.

A node numbers what it reads (input ordinals: 0, 1, ... in the order it takes items from its
input channel) and what it writes (output ordinals, in the order the items enter its output
channel). Its ledger answers one question, :meth:`Ledger.settled_inputs`: given the outputs
that are *settled* (delivered to the consumer, or settled further down), which inputs are?
An input is settled when every output made from it is, including an input that made none (a
filtered or failed item, a dropped last batch).

The records a ledger keeps cover only what is in flight: :meth:`Ledger.compact` drops those
that are settled, and the run compacts its ledgers as the consumer advances (see
:class:`~asyncflow.pipeline._lineage.Lineage`). Records are written on the run's loop, *before*
the items they describe are put out; reading and compacting take the run's lineage lock.

Most ledgers can also be walked *incrementally* (:meth:`Ledger.settle`): given only the
outputs settled since the last walk, they return the inputs that this settles, and drop the
records behind them. A state taken while the consumer reads then costs what changed since the
last one, not a walk over everything in flight (the lineage keeps the settled sets).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from typing import Any

from ._portable import FAILED
from ._span import Span, runs

__all__ = ["FixedLedger", "Ledger", "MapLedger", "Passthrough", "ShuffleLedger"]


def _ignore(records: int) -> None:
    return None


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
        self.grew: Callable[[int], None] = _ignore  # the run's compaction trigger

    @abc.abstractmethod
    def settled_inputs(self, outputs: Span) -> Span:
        """The settled inputs, given the settled outputs (lock held)."""

    @abc.abstractmethod
    def inputs_of(self, ordinal: int) -> list[int]:
        """The inputs output ``ordinal`` was made from (lock held)."""

    def compact(self, outputs: Span, inputs: Span) -> None:
        """Drop the records of settled outputs (lock held); ``inputs`` is what
        :meth:`settled_inputs` returned for ``outputs``."""
        return None  # a hook: nothing to do by default

    def get_state(self, outputs: Span) -> dict[str, Any] | None:
        """Extras to save beyond the settled positions, given the settled outputs (lock
        held)."""
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` saved, before the run starts."""
        return None  # a hook: nothing to do by default

    def start_settling(self) -> None:
        """The lineage walks this ledger with :meth:`settle` from now on (lock held)."""
        return None  # a hook: nothing to do by default

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        """The incremental walk (lock held): ``outputs`` are the outputs settled since the
        last call (``[start, end)`` ranges, none given before), ``mark`` the new watermark
        of all settled outputs; returns the inputs this settles (ranges, any order; one
        given before may come again). Records of outputs below ``mark`` are dropped.

        This default asks :meth:`settled_inputs` for the outputs below ``mark`` and the new
        ranges, and drops records with :meth:`compact`; the engine's own ledgers answer
        from their records directly."""
        below = Span(mark)
        self.compact(below, self.settled_inputs(below))
        return self.settled_inputs(Span(mark, outputs)).intervals()

    def stop_settling(self, inputs: Span) -> None:
        """Back to :meth:`settled_inputs` and :meth:`compact` (a journal holds records
        back): ``inputs`` are the inputs settled so far (lock held)."""
        return None  # a hook: nothing to do by default


class Passthrough(Ledger):
    """Output ``n`` is input ``n`` (prefetch, an ordered map that cannot skip items)."""

    def settled_inputs(self, outputs: Span) -> Span:
        return outputs

    def inputs_of(self, ordinal: int) -> list[int]:
        return [ordinal]

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        return outputs


class FixedLedger(Ledger):
    """Output ``n`` is made of inputs ``[n * size, (n + 1) * size)``, in order (``batch``, a
    custom stage with ``items_per_output``).

    Attributes:
        taken: Inputs read so far (``None``: not counted; the source clamps instead).
    """

    def __init__(self, size: int, *, counted: bool = True) -> None:
        super().__init__()
        self.size = size
        self.taken: int | None = 0 if counted else None
        self.dropped: Span | None = None
        self._dropped_settled = False  # ``dropped`` given by :meth:`settle`

    def take(self, count: int) -> None:
        if self.taken is not None:
            self.taken += count

    def drop_rest(self, count: int) -> None:
        """The last ``count`` inputs make no output (``drop_last``)."""
        if self.taken is not None and count:
            with self.lock:
                if self.on:
                    self.dropped = Span(0, [(self.taken - count, self.taken)])

    def _clamp(self, ordinal: int) -> int:
        return ordinal if self.taken is None else min(ordinal, self.taken)

    def settled_inputs(self, outputs: Span) -> Span:
        size = self.size
        ranges = [(self._clamp(a * size), self._clamp(b * size)) for a, b in outputs.ranges]
        if self.dropped is not None:
            ranges.extend(self.dropped.ranges)
        return Span(self._clamp(outputs.mark * size), ranges)

    def inputs_of(self, ordinal: int) -> list[int]:
        return list(range(self._clamp(ordinal * self.size), self._clamp((ordinal + 1) * self.size)))

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        size, clamp = self.size, self._clamp
        inputs = [(clamp(a * size), clamp(b * size)) for a, b in outputs]
        if self.dropped is not None and not self._dropped_settled:
            self._dropped_settled = True
            inputs.extend(self.dropped.ranges)
        return inputs


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
        self.dead: list[int] = []
        self.base = 0  # every input below it is settled
        self.done: list[tuple[int, int]] = []  # settled inputs above the base
        self.starts: dict[int, int] = {}  # id(chunk) -> its first input, until emitted
        # the last answer of settled_inputs, with everything it was computed from
        self._memo: tuple[Any, ...] | None = None

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
            # the first output's ordinal: compaction may drop records before ``undo``
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

    def settled_inputs(self, outputs: Span) -> Span:
        if self.identity:
            return outputs
        first, sources = self.first_out, self.sources
        # A state taken again with nothing changed (the consumer paused) reuses the answer:
        # comparing the records is a fraction of recomputing it.
        memo = self._memo
        if (memo is not None and memo[0] == outputs and memo[1] == first
                and memo[2] == self.base and memo[3] == sources and memo[4] == self.dead
                and memo[5] == self.done):
            return memo[6]  # type: ignore[no-any-return]
        ordinals = list(self.dead)
        for low, high in outputs.clip(first, first + len(sources)):
            ordinals += sources[low - first : high - first]
        inputs = Span.of(self.base, ordinals, self.done)
        self._memo = (outputs, first, self.base, sources[:], self.dead[:], self.done[:], inputs)
        return inputs

    def inputs_of(self, ordinal: int) -> list[int]:
        if self.identity:
            return [ordinal]
        index = ordinal - self.first_out
        return [self.sources[index]] if 0 <= index < len(self.sources) else []

    def compact(self, outputs: Span, inputs: Span) -> None:
        drop = min(len(self.sources), outputs.mark - self.first_out)
        if drop > 0:
            del self.sources[:drop]
            self.first_out += drop
        self.dead = []  # settled: in ``inputs`` now
        self.base = inputs.mark
        self.done = list(inputs.ranges)

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

    def stop_settling(self, inputs: Span) -> None:
        self.base, self.done = inputs.mark, list(inputs.ranges)


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
