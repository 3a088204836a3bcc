"""Resuming an ``assemble`` stage: rows in, whole batches out, exactly the rest after a resume."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline
from asyncflow.pipeline import ItemGroup
from asyncflow.pipeline._assemble import AssembleLedger
from asyncflow.pipeline._span import Span


class Bad(ValueError):
    pass


class Positioned:
    """Rows ``(pos, value)`` (an exception: a failed row); batch ``n`` holds the values at
    positions ``[n * size, (n + 1) * size)``, less failed rows and those settled before a
    resume."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.open: dict[int, dict[int, Any]] = {}
        self.next = 0
        self.skip = Span()

    def failure(self, row: tuple[int, Any]) -> Exception | None:
        return row[1] if isinstance(row[1], Exception) else None

    def position(self, row: tuple[int, Any]) -> int:
        return row[0]

    def resume(self, settled: Span) -> None:
        self.skip = settled

    def release(self, row: tuple[int, Any], *, ok: bool) -> list[tuple[Any, list[int]]]:
        pos, value = row
        assert pos not in self.skip
        self.open.setdefault(pos // self.size, {})[pos] = value if ok else None
        out: list[tuple[Any, list[int]]] = []
        while self.next * self.size < self.count:
            low = self.next * self.size
            rows = [p for p in range(low, min(low + self.size, self.count)) if p not in self.skip]
            got = self.open.get(self.next, {})
            if len(got) < len(rows):
                break
            self.open.pop(self.next, None)
            kept = [p for p in rows if got[p] is not None]
            out.append(([got[p] for p in kept] or None, kept))
            self.next += 1
        return out

    def arrived(self, row: tuple[int, Any], *, ok: bool) -> list[Any]:
        return [batch for batch, _ in self.release(row, ok=ok) if batch is not None]


def _rows(count: int, failing: set[int], seed: int = 0) -> list[tuple[int, Any]]:
    rows: list[tuple[int, Any]] = [(p, Bad(p) if p in failing else p) for p in range(count)]
    random.Random(seed).shuffle(rows)
    return rows


def _pipe(rows: list[tuple[int, Any]], size: int) -> Pipeline[Any]:
    return (Pipeline(rows).map(lambda r: r, concurrency=3, ordered=False)
            .assemble(Positioned(len(rows), size), batch_size=size, max_failures=10))


@pytest.mark.parametrize("failing", [set(), {3, 9, 10, 11}, {0, 1, 2, 3, 21}])
def test_exactly_the_remaining_batches_after_each_batch(
    failing: set[int], leak_check: None
) -> None:
    rows = _rows(23, failing)
    full = list(_pipe(rows, 4))
    assert [x for batch in full for x in batch] == [p for p in range(23) if p not in failing]
    for k in range(len(full) + 1):
        first = _pipe(rows, 4)
        with first.open() as run:
            head = [next(run) for _ in range(k)]
            state = json.loads(json.dumps(first.state_dict()))
        assert head == full[:k]
        resumed = _pipe(rows, 4)
        resumed.load_state_dict(state)
        assert list(resumed) == full[k:]
        settled = Span.from_json(resumed.state_dict()["nodes"]["assemble"]["rows"], "rows")
        assert settled == Span(23)


def test_a_failed_row_of_a_batch_not_yet_out_stays_failed() -> None:
    # the rows of batch 0 wait for row 1, which comes last; rows 5 and 6 fail meanwhile
    rows: list[tuple[int, Any]] = [(0, 0), (2, 2), (3, 3), (4, 4), (5, Bad(5)),
                                   (6, Bad(6)), (7, 7), (1, 1)]
    pipe = Pipeline(rows).assemble(Positioned(8, 4), batch_size=4, max_failures=2)
    with pipe.open() as run:
        assert next(run) == [0, 1, 2, 3]
        state = pipe.state_dict()
    resumed = Pipeline(rows).assemble(Positioned(8, 4), batch_size=4, max_failures=2)
    resumed.load_state_dict(state)
    assert list(resumed) == [[4, 7]]
    assert state["failed"] == {"assemble": 2}


def test_the_ledger_maps_a_batch_to_its_rows_and_compacts() -> None:
    ledger = AssembleLedger(Positioned(8, 4))
    ledger.released([3], [3], False)  # a failed row
    ledger.released([0, 1, 2], [2, 0, 1], True)
    ledger.released([4, 5], [5, 4], True)
    assert ledger.inputs_of(0) == [0, 1, 2] and ledger.inputs_of(1) == [4, 5]
    assert ledger.settle([], 0) == [(3, 4)]  # the failed row, at once
    assert ledger.get_state() == {"rows": {"mark": 0, "ranges": [[3, 4]]}}
    assert ledger.inputs_of(0) == [0, 1, 2]  # not dropped: below no settled output
    assert ledger.settle([(0, 1)], 1) == [(0, 3)]
    assert ledger.get_state() == {"rows": {"mark": 4, "ranges": []}}
    assert ledger.inputs_of(0) == [] and ledger.inputs_of(1) == [4, 5]
    assert ledger.settle([(1, 2)], 2) == [(4, 6)]
    assert ledger.get_state() == {"rows": {"mark": 6, "ranges": []}}


def test_an_assembler_without_positions_is_refused_by_name() -> None:
    class Plain:
        def failure(self, row: Any) -> Exception | None:
            return None

        def arrived(self, row: Any, *, ok: bool) -> list[Any]:
            return [[row]]

    pipe = Pipeline(range(4)).assemble(Plain(), batch_size=1, name="rows")
    with pipe.open() as run:
        next(run)
        with pytest.raises(ConfigError, match="stage 'rows'"):
            pipe.state_dict()


def test_rows_grouped_in_one_message_cannot_be_resumed() -> None:
    pipe = Pipeline([ItemGroup([(0, 0), (1, 1)]), ItemGroup([(2, 2), (3, 3)])]).assemble(
        Positioned(4, 2), batch_size=2)
    with pipe.open() as run:
        next(run)
        with pytest.raises(ConfigError, match="several rows in one message"):
            pipe.state_dict()
