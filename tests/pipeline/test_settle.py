"""The incremental walk of a run's ledgers (``Ledger.settle``, ``GrowingSpan``) against the
full one (``settled_inputs``, ``compact``): the same settled inputs, the same extras, the
same states."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from asyncflow import Pipeline
from asyncflow.pipeline import _lineage
from asyncflow.pipeline import state_checksum as _checksum
from asyncflow.pipeline._channel import ChannelBase
from asyncflow.pipeline._expansion import SplitLedger
from asyncflow.pipeline._ledger import FixedLedger, Ledger, MapLedger, ShuffleLedger
from asyncflow.pipeline._lineage import SourceLedger, SourcePlan
from asyncflow.pipeline._offload import FAILED
from asyncflow.pipeline._span import GrowingSpan, Span, runs


@pytest.mark.parametrize("seed", range(30))
def test_growing_span_gives_what_is_new(seed: int) -> None:
    rng = random.Random(seed)
    grown, model = GrowingSpan(), set[int]()
    for _ in range(40):
        ranges = []
        for _ in range(rng.randrange(5)):
            start = rng.randrange(80)
            ranges.append((start, start + rng.randrange(-2, 12)))
        new = grown.add(ranges)
        given = {i for a, b in ranges for i in range(a, b)}
        fresh = [i for a, b in new for i in range(a, b)]
        assert sorted(fresh) == sorted(given - model)  # each new one once, no old one
        model |= given
        assert grown.span() == Span.of(0, sorted(model))
        assert grown.to_json() == grown.span().to_json()


def test_runs_are_the_ordinals_joined() -> None:
    assert runs([5, 1, 2, 2, 9, 3, 6]) == [(1, 4), (5, 7), (9, 10)]
    assert runs([]) == []


def _grow(rng: random.Random, settled: set[int], end: int) -> Span:
    """More settled outputs below ``end``: a prefix and a few others."""
    settled.update(range(min(end, max(settled, default=-1) + 1 + rng.randrange(4))))
    for _ in range(rng.randrange(3)):
        if end:
            settled.add(rng.randrange(end))
    return Span.of(0, sorted(settled))


class _Twins:
    """Two ledgers given the same records: one walked in full, one incrementally."""

    def __init__(self, walked: Any, settling: Any) -> None:
        self.walked, self.settling = walked, settling
        settling.start_settling()
        self.outputs, self.inputs = GrowingSpan(), GrowingSpan()

    def check(self, outputs: Span, compact: bool) -> Span:
        answer: Span = self.walked.settled_inputs(outputs)
        if compact:
            self.walked.compact(outputs, answer)
        fresh = self.outputs.add(outputs.intervals())
        self.inputs.add(self.settling.settle(fresh, self.outputs.mark))
        assert self.inputs.span() == answer
        return answer


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("kind", ["filter", "unordered", "shuffle"])
def test_map_ledgers_settle_as_they_walk(seed: int, kind: str) -> None:
    rng = random.Random(seed)

    def make() -> MapLedger:
        if kind == "shuffle":
            return ShuffleLedger()
        return MapLedger(in_order=kind == "filter", is_filter=kind == "filter")

    twins = _Twins(make(), make())
    settled: set[int] = set()
    taken = 0
    for _ in range(300):
        roll = rng.random()
        if roll < 0.5:
            size = rng.randrange(1, 4)
            for ledger in (twins.walked, twins.settling):
                if kind == "shuffle":
                    order = list(range(taken, taken + size))
                    random.Random(taken).shuffle(order)
                    ledger.record(order)
                elif kind == "filter":
                    ledger.emit([0] * size, [(taken + i) % 3 != 0 for i in range(size)], [])
                else:
                    items = [0] * size
                    ledger.take(items)
                    values = [0 if (taken + i) % 4 else None for i in range(size)]
                    failures = [(i, ValueError()) for i, v in enumerate(values) if v is None]
                    ledger.emit(items, [FAILED if v is None else v for v in values], failures)
            taken += size
        else:
            outputs = _grow(rng, settled, len(twins.walked.sources) + twins.walked.first_out)
            twins.check(outputs, compact=rng.random() < 0.3)


@pytest.mark.parametrize("seed", range(30))
def test_split_ledger_settles_as_it_walks(seed: int) -> None:
    """The settled inputs, and the partial expansions (extras) with their JSON text."""
    rng = random.Random(seed)
    twins = _Twins(SplitLedger(), SplitLedger())

    def key_of(ordinal: int) -> tuple[tuple[int, int], ...]:
        return ((ordinal * 2, ordinal * 2 + 1),)

    twins.walked.key_of = twins.settling.key_of = key_of

    settled: set[int] = set()
    opened: list[int] = []
    for _ in range(300):
        roll = rng.random()
        if roll < 0.2 or not opened:
            opened.append(twins.walked.begin())
            twins.settling.begin()
        elif roll < 0.5:
            ordinal, count = rng.choice(opened), rng.randrange(3)
            twins.walked.keep(ordinal, [0] * count)
            twins.settling.keep(ordinal, [0] * count)
        elif roll < 0.6:
            ordinal = opened.pop(rng.randrange(len(opened)))
            twins.walked.end(ordinal)
            twins.settling.end(ordinal)
        else:
            last = twins.walked.first_out + len(twins.walked.sources)
            outputs = _grow(rng, settled, last)
            twins.check(outputs, compact=rng.random() < 0.3)
            state = twins.walked.get_state(outputs)
            assert twins.settling.get_state(Span()) == state
            text = twins.settling.state_text
            assert (text is None) == (state is None)
            if state is not None:
                assert text == json.dumps(state, sort_keys=True, separators=(",", ":"))


def test_split_ledger_keeps_a_resumed_runs_partials() -> None:
    """Partials of an earlier run stay saved until met again; met, they skip what was
    settled then."""
    saved = {"partial": [{"input": [[4, 5]], "done": {"mark": 0, "ranges": [[1, 2]]}},
                         {"input": [[8, 9]], "done": {"mark": 1, "ranges": []}}]}
    ledger = SplitLedger()
    ledger.set_state(saved)
    ledger.key_of = lambda ordinal: ((ordinal * 4, ordinal * 4 + 1),)
    ledger.start_settling()
    assert ledger.get_state(Span()) == saved
    ordinal = ledger.begin()  # input 0: positions [0, 1), not saved
    ordinal = ledger.begin()  # input 1: positions [4, 5), saved: index 1 settled
    assert ledger.keep(ordinal, ["a", "b", "c"]) == ["a", "c"]
    state = ledger.get_state(Span())
    assert state == {"partial": [
        {"input": [[4, 5]], "done": {"mark": 0, "ranges": [[1, 2]]}},
        {"input": [[8, 9]], "done": {"mark": 1, "ranges": []}}]}
    assert ledger.state_text == json.dumps(state, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("counted", [True, False])
def test_fixed_ledger_settles_as_it_walks(counted: bool) -> None:
    twins = _Twins(FixedLedger(4, counted=counted), FixedLedger(4, counted=counted))
    for ledger in (twins.walked, twins.settling):
        ledger.take(14)
        ledger.drop_rest(2)
    for outputs in (Span(1), Span(1, [(2, 3)]), Span(3)):
        twins.check(outputs, compact=False)


def test_source_ledger_settles_as_it_walks() -> None:
    """A resumed run's source: ordinals map to the positions not skipped; ordinals not
    emitted yet wait."""
    plan = SourcePlan(first=0, skip=Span(3, [(5, 7), (9, 10), (12, 20)]))
    twins = _Twins(SourceLedger(plan), SourceLedger(plan))
    for emitted, outputs in [(2, Span(0, [(1, 4)])), (6, Span(5)), (7, Span(5, [(8, 9)])),
                             (9, Span(9))]:
        twins.walked.emitted = twins.settling.emitted = emitted
        twins.check(outputs, compact=False)
    assert twins.settling.positions(0, 9) == [(3, 5), (7, 9), (10, 12), (20, 23)]


def test_undo_after_compaction_forgets_the_right_records() -> None:
    ledger = MapLedger(in_order=True)
    ledger.emit([0, 0], [1, 2], [])
    token = ledger.emit([0, 0], [3, 4], [])
    ledger.settle([(0, 2)], 2)  # the first two outputs settled: their records dropped
    ledger.undo(token)
    assert ledger.sources == [] and ledger.first_out == 2 and ledger.taken == 2


def _pipeline() -> Pipeline[Any]:
    """Every stage kind with a ledger, in a deterministic order (one call at a time)."""

    def shaky(x: int) -> int:
        if x % 23 == 5:
            raise ValueError(x)
        return x

    return (
        Pipeline(range(3000), max_failures=1.0)
        .map(shaky, ordered=False)
        .filter(lambda x: x % 5 != 0)
        .flat_map(lambda x: [x] * (x % 3))
        .shuffle(buffer_size=64, seed=3)
        .batch(8)
        .prefetch(4)
    )


def _items(batches: list[list[int]]) -> list[int]:
    return sorted(x for batch in batches for x in batch)


def _resumed(state: dict[str, Any]) -> list[int]:
    pipe = _pipeline()
    pipe.load_state_dict(json.loads(json.dumps(state)))
    return _items(list(pipe))


@pytest.mark.parametrize(("walk", "hold_at"), [("settling", None), ("settling", 30),
                                               ("full", None)])
def test_states_taken_while_reading_resume_exactly(
    walk: str, hold_at: int | None, monkeypatch: pytest.MonkeyPatch, leak_check: None
) -> None:
    """A state taken after each batch (each walk settles only what changed since the last
    one), also after a switch to the full walk mid-run (``hold``, as a journal does), and
    with the full walk only: one taken early and the last both resume with exactly the
    items not delivered yet."""
    if walk == "full":
        monkeypatch.setattr(_lineage, "_SETTLING", ())
    everything = _items(list(_pipeline()))
    pipe = _pipeline()
    delivered: list[list[int]] = []
    states = []
    with pipe.open() as run:
        for step, batch in enumerate(itertools.islice(run, 90)):
            delivered.append(batch)
            if step == hold_at:
                pipe._last[0].lineage.hold(1 << 62)
            state = pipe.state_dict()
            assert state["check"] == _checksum({k: v for k, v in state.items() if k != "check"})
            states.append(state)
        assert pipe._last[0].lineage._settling is (hold_at is None and walk == "settling")
    assert any(state["nodes"] for state in states)  # partial expansions were saved
    for step in (20, 89):
        assert sorted(_items(delivered[: step + 1]) + _resumed(states[step])) == everything


class _Pairs(Ledger):
    """A ledger with no incremental walk of its own: output ``n`` is inputs ``2n, 2n + 1``."""

    def settled_inputs(self, outputs: Span) -> Span:
        return Span(outputs.mark * 2, [(a * 2, b * 2) for a, b in outputs.ranges])

    def inputs_of(self, ordinal: int) -> list[int]:
        return [ordinal * 2, ordinal * 2 + 1]


def test_a_ledger_without_its_own_walk_settles_through_settled_inputs() -> None:
    twins = _Twins(_Pairs(), _Pairs())
    for outputs in (Span(0, [(2, 3)]), Span(1, [(2, 3), (5, 7)]), Span(3, [(5, 7)]), Span(8)):
        twins.check(outputs, compact=False)


def test_ledgers_and_channels_must_answer_what_the_engine_asks() -> None:
    class Half(Ledger):  # no inputs_of
        def settled_inputs(self, outputs: Span) -> Span:
            return outputs

    with pytest.raises(TypeError, match="inputs_of"):
        Half()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="_readers_ready"):
        ChannelBase(4)  # type: ignore[abstract]
