"""``Lineage.trace`` and ``Lineage.hold``: the positions behind one output, kept for a journal."""

from __future__ import annotations

from types import SimpleNamespace

from asyncflow.pipeline._ledger import MapLedger
from asyncflow.pipeline._lineage import Lineage
from asyncflow.workers import FAILED


def _lineage() -> Lineage:
    """source -> map (item 3 failed) -> batch(2): 10 positions, 9 mapped, 5 batches."""
    lineage = Lineage()
    mapped = MapLedger(in_order=True)
    nodes = [SimpleNamespace(ledger=lineage.source), SimpleNamespace(ledger=mapped),
             SimpleNamespace()]  # the batch: a FixedLedger from its items_per_output
    lineage.attach(["source", "m", "b"], nodes,
                   [SimpleNamespace(items_per_output=None), SimpleNamespace(items_per_output=2)])
    lineage.source.emitted = 10
    values = [FAILED if i == 3 else i for i in range(10)]
    mapped.emit(list(range(10)), values, [(3, ValueError("3"))])
    return lineage


def test_trace_gives_an_outputs_positions_in_order() -> None:
    lineage = _lineage()
    assert [lineage.trace(n) for n in range(5)] == [[0, 1], [2, 4], [5, 6], [7, 8], [9]]


def test_hold_keeps_records_that_compaction_would_drop() -> None:
    held = _lineage()
    held.hold(2)
    held.compact(4)  # the consumer has received 4 batches; the journal traced 2
    assert held.trace(2) == [5, 6] and held.trace(3) == [7, 8]
    free = _lineage()
    free.compact(4)
    assert free.trace(2) == []  # compacted: what hold() prevents


def test_trace_is_none_when_a_stage_keeps_no_ledger() -> None:
    lineage = _lineage()
    lineage.missing = "custom"
    assert lineage.trace(0) is None
