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
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from ._offload import FAILED
from ._span import Span, span_json

__all__ = ["FixedLedger", "Ledger", "MapLedger", "Passthrough", "ShuffleLedger", "SplitLedger"]


def _ignore(records: int) -> None:
    return None


class Ledger:
    """The base: one node's translation from settled outputs to settled inputs.

    Attributes:
        on: Whether records are kept (off when the run cannot be resumed anyway).
        lock: The run's lineage lock, held while records change or are read.
    """

    on = True

    def __init__(self) -> None:
        self.lock: Any = threading.RLock()  # replaced by the run's lineage lock
        self.grew: Callable[[int], None] = _ignore  # the run's compaction trigger

    def settled_inputs(self, outputs: Span) -> Span:
        """The settled inputs, given the settled outputs (lock held)."""
        raise NotImplementedError

    def inputs_of(self, ordinal: int) -> list[int]:
        """The inputs output ``ordinal`` was made from (lock held)."""
        raise NotImplementedError

    def compact(self, outputs: Span, inputs: Span) -> None:
        """Drop the records of settled outputs (lock held); ``inputs`` is what
        :meth:`settled_inputs` returned for ``outputs``."""

    def get_state(self, outputs: Span, key_of: Any) -> dict[str, Any] | None:
        """Extras to save beyond the settled positions (lock held); ``key_of(ordinal)``
        names an input by its source positions."""
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` saved, before the run starts."""


class Passthrough(Ledger):
    """Output ``n`` is input ``n`` (prefetch, an ordered map that cannot skip items)."""

    def settled_inputs(self, outputs: Span) -> Span:
        return outputs

    def inputs_of(self, ordinal: int) -> list[int]:
        return [ordinal]


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

    def take(self, count: int) -> None:
        if self.taken is not None:
            self.taken += count

    def drop_rest(self, count: int) -> None:
        """The last ``count`` inputs make no output (``drop_last``)."""
        if self.on and self.taken is not None and count:
            with self.lock:
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
            token = (len(self.sources), len(self.dead), first)
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
        sources, dead, first = token
        with self.lock:
            del self.sources[sources:]
            del self.dead[dead:]
        if self.in_order:
            self.taken = first

    def settled_inputs(self, outputs: Span) -> Span:
        if self.identity:
            return outputs
        first, sources = self.first_out, self.sources
        ordinals = list(self.dead)
        end = first + len(sources)
        for low, high in outputs.intervals():
            low, high = max(low, first), min(high, end)
            if low < high:
                ordinals.extend(sources[low - first : high - first])
        return Span.of(self.base, ordinals, self.done)

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


class SplitLedger(Ledger):
    """Any number of outputs per input (``flat_map``, ``unbatch``), possibly interleaved:
    the input of each output in flight, and its index within that input's expansion.

    An input is settled once its expansion has ended and every output of it is settled.
    One whose outputs are settled in part is saved as *partial*, named by the source
    positions it was made from, with the indices (within its expansion) already settled:
    a resumed run that makes the same input again skips those.
    """

    def __init__(self, *, elementwise: bool = False) -> None:
        super().__init__()
        #: Output ``j`` of an input is its element ``j`` (``unbatch``).
        self.elementwise = elementwise
        self.taken = 0
        self.sources: list[int] = []  # the input of each output from ``first_out`` on
        self.indices: list[int] = []  # its index in that input's expansion
        self.first_out = 0
        # input -> [next index, ended, skip Span | None, outputs made,
        #           indices settled and dropped from ``sources`` by compaction]
        self.open: dict[int, list[Any]] = {}
        self.base = 0
        self.done: list[tuple[int, int]] = []  # settled inputs above the base
        self.partial: dict[tuple[tuple[int, int], ...], Span] = {}
        self.key_of: Any = None  # names an input by its source positions (resume only)
        #: The batch ledger this unbatch splits the outputs of, if it follows one directly:
        #: its outputs then settle that batch's inputs one by one (no partials needed).
        self.batch: FixedLedger | None = None
        self._cache: tuple[Span, list[int], Counter[int]] | None = None

    def begin(self) -> int:
        """An input was read: its ordinal. Its indices to skip are found when resuming."""
        ordinal = self.taken
        self.taken += 1
        if self.on:
            skip = None
            if self.partial and self.key_of is not None:
                skip = self.partial.pop(self.key_of(ordinal), None)
            with self.lock:
                self.open[ordinal] = [0, False, skip, 0, []]
        return ordinal

    def keep(self, ordinal: int, values: list[Any]) -> list[Any]:
        """Record ``values``, the next outputs of input ``ordinal``, before they are put
        out; returns those to put (without the ones a resumed run skips)."""
        if not self.on:
            return values
        with self.lock:
            self._cache = None
            state = self.open[ordinal]
            index, skip = state[0], state[2]
            state[0] = index + len(values)
            if skip is not None and any(True for _ in skip.within(index, state[0])):
                picked = [i for i in range(len(values)) if index + i not in skip]
                self.indices.extend(index + i for i in picked)
                values = [values[i] for i in picked]
            else:
                self.indices.extend(range(index, index + len(values)))
            self.sources.extend([ordinal] * len(values))
            state[3] += len(values)
        self.grew(1)
        return values

    def end(self, ordinal: int) -> None:
        """Input ``ordinal``'s expansion has ended (or failed): it makes no more outputs."""
        if self.on:
            with self.lock:
                self._cache = None
                self.open[ordinal][1] = True

    def _slices(self, outputs: Span) -> list[tuple[int, int]]:
        """The settled outputs still listed, as index ranges into :attr:`sources`."""
        first, end = self.first_out, self.first_out + len(self.sources)
        return [(max(low, first) - first, min(high, end) - first)
                for low, high in outputs.intervals() if high > first and low < end]

    def _settled(self, outputs: Span) -> tuple[list[int], Counter[int]]:
        """The settled inputs, and per input its settled outputs still listed; the last
        answer is kept for the same ``outputs``."""
        cache = self._cache
        if cache is not None and cache[0] is outputs:
            return cache[1], cache[2]
        sources = self.sources
        counts: Counter[int] = Counter()
        for low, high in self._slices(outputs):
            counts.update(sources[low:high])
        settled = [o for o, state in self.open.items()
                   if state[1] and counts[o] + len(state[4]) == state[3]]
        self._cache = (outputs, settled, counts)
        return settled, counts

    def settled_inputs(self, outputs: Span) -> Span:
        settled, _ = self._settled(outputs)
        return Span.of(self.base, settled, self.done)

    def settled_elements(self, outputs: Span) -> Span:
        """The settled inputs of :attr:`batch`: element ``j`` of batch ``n`` is its input
        ``n * size + j``."""
        assert self.batch is not None
        size, clamp = self.batch.size, self.batch._clamp
        settled, _ = self._settled(outputs)
        ranges = [(clamp(a * size), clamp(b * size)) for a, b in self.done]
        ranges.extend((clamp(o * size), clamp((o + 1) * size)) for o in settled)
        if self.batch.dropped is not None:
            ranges.extend(self.batch.dropped.ranges)
        elements = [o * size + j for o, state in self.open.items() for j in state[4]]
        for low, high in self._slices(outputs):
            elements.extend(o * size + j for o, j in
                            zip(self.sources[low:high], self.indices[low:high], strict=True))
        return Span.of(clamp(self.base * size), elements, ranges)

    def inputs_of(self, ordinal: int) -> list[int]:
        index = ordinal - self.first_out
        return [self.sources[index]] if 0 <= index < len(self.sources) else []

    def compact(self, outputs: Span, inputs: Span) -> None:
        settled, _ = self._settled(outputs)
        self._cache = None
        drop = min(len(self.sources), outputs.mark - self.first_out)
        if drop > 0:
            open_ = self.open
            for o, j in zip(self.sources[:drop], self.indices[:drop], strict=True):
                state = open_.get(o)
                if state is not None and o not in inputs:
                    state[4].append(j)  # an input settled in part keeps its count
            del self.sources[:drop], self.indices[:drop]
            self.first_out += drop
        for o in settled:
            del self.open[o]
        self.base = inputs.mark
        self.done = list(inputs.ranges)

    def get_state(self, outputs: Span, key_of: Any) -> dict[str, Any] | None:
        if self.batch is not None:
            return None  # its batch's inputs are settled one by one
        settled, counts = self._settled(outputs)
        done = set(settled)
        wanted = {o for o, state in self.open.items()
                  if o not in done and (counts[o] or state[4] or state[2] is not None)}
        partial = []
        if wanted:
            found: dict[int, list[int]] = {o: list(self.open[o][4]) for o in wanted}
            for low, high in self._slices(outputs):
                for o, j in zip(self.sources[low:high], self.indices[low:high], strict=True):
                    if o in wanted:
                        found[o].append(j)
            for o in sorted(wanted):
                skip = self.open[o][2]
                settled_json = (span_json(found[o]) if skip is None
                                else Span.of(0, found[o]).union(skip).to_json())
                partial.append({"input": [list(r) for r in key_of(o)], "done": settled_json})
        # partials of an earlier run not yet met again stay saved
        partial.extend({"input": [list(r) for r in key], "done": span.to_json()}
                       for key, span in self.partial.items())
        return {"partial": partial} if partial else None

    def set_state(self, state: dict[str, Any]) -> None:
        for entry in state.get("partial", ()):
            key = tuple((int(a), int(b)) for a, b in entry["input"])
            self.partial[key] = Span.from_json(entry["done"], "a partial expansion")


class ShuffleLedger(MapLedger):
    """Outputs in any order of the inputs (``shuffle``): the input of each output in
    flight, in output order."""

    def __init__(self) -> None:
        super().__init__(in_order=True)

    def record(self, inputs: list[int]) -> None:
        """Outputs are about to be put out, made from ``inputs`` in this order."""
        if self.on and inputs:
            with self.lock:
                self.sources.extend(inputs)
            self.grew(1)
