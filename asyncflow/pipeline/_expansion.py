"""The ledger of stages that make any number of outputs per input (``flat_map``,
``unbatch``); see :mod:`asyncflow.pipeline._ledger` for what a ledger answers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from ._ledger import FixedLedger, Ledger
from ._span import Span, runs

__all__ = ["SplitLedger"]

_Pairs = tuple[tuple[int, int], ...]
#: A partial input's saved entry: its key, its settled indices (mark, ranges), its text.
_Entry = tuple[_Pairs, int, _Pairs, str]


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
        # input -> [next index, ended, skip Span | None, outputs made]
        self.open: dict[int, list[Any]] = {}
        self.partial: dict[tuple[tuple[int, int], ...], Span] = {}
        self.key_of: Any = None  # names an input by its source positions (resume only)
        # an open input's key, asked once: fixed while it is open (its records upstream stay)
        self._keys: dict[int, _Pairs] = {}
        #: The batch ledger this unbatch splits the outputs of, if it follows one directly:
        #: its outputs then settle that batch's inputs one by one (no partials needed).
        self.batch: FixedLedger | None = None
        # Per open input, the indices of its settled outputs; the inputs ended since the
        # last walk; those a resumed run skips in part; each partial input's saved entry,
        # until its settled outputs change.
        self._got: defaultdict[int, list[int]] = defaultdict(list)
        self._ended: list[int] = []
        self._skipping: set[int] = set()
        self._entries: dict[int, _Entry] = {}
        self._version = 0  # bumped as the partial inputs change
        self._rows: tuple[int, list[_Entry], str] | None = None  # the last, and its text

    def join(self, before: Ledger, key_of: Callable[[int], Any]) -> None:
        """Name partial expansions by ``key_of``; an ``unbatch`` right after a ``batch``
        settles that batch's inputs one by one instead (element ``j`` of batch ``n`` is
        input ``n * size + j``)."""
        self.key_of = key_of
        if self.elementwise and isinstance(before, FixedLedger) and before.taken is not None:
            self.batch = before

    def begin(self) -> int:
        """An input was read: its ordinal. Its indices to skip are found when resuming."""
        ordinal = self.taken
        self.taken += 1
        if self.on:
            skip = None
            with self.lock:
                if self.partial and self.key_of is not None:
                    skip = self.partial.pop(self.key_of(ordinal), None)
                self.open[ordinal] = [0, False, skip, 0]
                if skip is not None:
                    self._skipping.add(ordinal)
                    self._version += 1
        return ordinal

    def keep(self, ordinal: int, values: list[Any]) -> list[Any]:
        """Record ``values``, the next outputs of input ``ordinal``, before they are put
        out; returns those to put (without the ones a resumed run skips)."""
        if not self.on:
            return values
        with self.lock:
            state = self.open.get(ordinal)
            if state is None or not self.on:  # the run stopped (``Lineage.freeze``)
                return values
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
        with self.lock:
            if self.on and ordinal in self.open:
                self.open[ordinal][1] = True
                self._ended.append(ordinal)

    def inputs_of(self, ordinal: int) -> list[int]:
        index = ordinal - self.first_out
        return [self.sources[index]] if 0 <= index < len(self.sources) else []

    def lowest(self, ordinal: int) -> int:
        return min(self.sources[max(0, ordinal - self.first_out):], default=self.taken)

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        got, entries, open_ = self._got, self._entries, self.open
        touched, self._ended = self._ended, []
        if touched or outputs:
            self._version += 1
        first, sources, indices = self.first_out, self.sources, self.indices
        listed = len(sources)
        for a, b in outputs:  # inline, not through _made: this runs at every state save
            low, high = max(a - first, 0), min(b - first, listed)
            for o, j in zip(sources[low:high], indices[low:high], strict=True):
                got[o].append(j)
                entries.pop(o, None)
                touched.append(o)
        if self.batch is not None:  # element ``j`` of batch ``o`` is its input o * size + j
            size = self.batch.size
            self.batch.elements += runs([o * size + j for o, j in self._made(outputs)])
        settled = []
        for o in set(touched):
            state = open_.get(o)
            if state is not None and state[1] and len(got.get(o, ())) == state[3]:
                settled.append(o)
                del open_[o]
                got.pop(o, None)
                entries.pop(o, None)
                self._keys.pop(o, None)
                self._skipping.discard(o)
        drop = min(len(self.sources), mark - self.first_out)
        if drop > 0:
            del self.sources[:drop], self.indices[:drop]
            self.first_out += drop
        return runs(settled)

    def _made(self, outputs: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """The input and index of each output in ``outputs`` (ordinal ranges) still listed."""
        first, listed = self.first_out, len(self.sources)
        for a, b in outputs:
            low, high = max(a - first, 0), min(b - first, listed)
            yield from zip(self.sources[low:high], self.indices[low:high], strict=True)

    def get_state(self) -> dict[str, Any] | None:
        """The inputs expanded in part (their canonical JSON text kept as ``state_text``): an
        input's entry is made once per change of its settled outputs."""
        if self.batch is not None:
            return None  # its batch's inputs are settled one by one
        rows = self._rows
        if rows is None or rows[0] != self._version:
            entries = self._entries
            order = sorted(self._got.keys() | self._skipping if self._skipping else self._got)
            for o in order:
                if o not in entries:
                    entries[o] = self._entry(o)
            listed = [entries[o] for o in order]
            # an earlier run's partials, not met again yet
            listed.extend((key, span.mark, span.ranges, _text(key, span.mark, span.ranges))
                          for key, span in self.partial.items())
            text = '{"partial":[' + ",".join([entry[3] for entry in listed]) + "]}"
            rows = self._rows = (self._version, listed, text)
        self.state_text = rows[2] if rows[1] else None
        if not rows[1]:
            return None
        # new lists each time: the caller may keep or change what it is given (most keys
        # and settled indices are one pair, or none: made without a call)
        return {"partial": [
            {"input": [[*key[0]]] if len(key) == 1 else list(map(list, key)),
             "done": {"mark": mark, "ranges": [] if not ranges else [[*ranges[0]]]
                      if len(ranges) == 1 else list(map(list, ranges))}}
            for key, mark, ranges, _ in rows[1]]}

    def _entry(self, o: int) -> _Entry:
        """Open input ``o``'s partial entry: its source positions, and its outputs settled
        (or skipped, resuming) as a span's mark and ranges."""
        found, skip = self._got.get(o, []), self.open[o][2]
        ranges: _Pairs
        if skip is None and len(found) == 1:  # the usual case: one output settled
            j = found[0]
            mark, ranges = (1, ()) if j == 0 else (0, ((j, j + 1),))
        else:
            done = Span.of(0, found[:]) if skip is None else Span.of(0, found[:]).union(skip)
            mark, ranges = done.mark, done.ranges
        key = self._keys.get(o)
        if key is None:
            key = self._keys[o] = self.key_of(o)
        return key, mark, ranges, _text(key, mark, ranges)

    def set_state(self, state: dict[str, Any]) -> None:
        self._version += 1
        for entry in state.get("partial", ()):
            key = tuple((int(a), int(b)) for a, b in entry["input"])
            self.partial[key] = Span.from_json(entry["done"], "a partial expansion")


def _text(key: Any, mark: int, ranges: Any) -> str:
    """A partial entry's canonical JSON (sorted keys, no spaces; see ``_resume.py``)."""
    return (f'{{"done":{{"mark":{mark},"ranges":[{_pairs(ranges)}]}},'
            f'"input":[{_pairs(key)}]}}')


def _pairs(pairs: Any) -> str:
    return ",".join(f"[{int(a)},{int(b)}]" for a, b in pairs)
