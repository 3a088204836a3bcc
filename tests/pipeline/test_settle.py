"""The walk of a run's ledgers (``Ledger.settle``, ``GrowingSpan``): each ledger's settled
inputs and extras against a model of its records, and states taken while the consumer reads
resume exactly."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from asyncflow import Pipeline
from asyncflow.pipeline import _lineage
from asyncflow.pipeline import state_checksum as _checksum
from asyncflow.pipeline._assemble import AssembleLedger
from asyncflow.pipeline._channel import ChannelBase
from asyncflow.pipeline._expansion import SplitLedger
from asyncflow.pipeline._ledger import FixedLedger, Ledger, MapLedger, ShuffleLedger
from asyncflow.pipeline._lineage import SourceLedger, SourcePlan
from asyncflow.pipeline._span import GrowingSpan, Span, runs
from asyncflow.workers import FAILED


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


class _Walk:
    """A ledger walked as the lineage walks it: given what settled since the last walk."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.outputs, self.inputs = GrowingSpan(), GrowingSpan()

    def check(self, outputs: Span, expected: set[int]) -> None:
        """Settle ``outputs`` (every settled output); the settled inputs are ``expected``."""
        fresh = self.outputs.add(outputs.intervals())
        self.inputs.add(self.ledger.settle(fresh, self.outputs.mark))
        assert self.inputs.span() == Span.of(0, sorted(expected))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("kind", ["filter", "unordered", "shuffle"])
def test_map_ledgers_settle_what_their_outputs_settle(seed: int, kind: str) -> None:
    """An input is settled once its output is, or at once when it made none; records of
    settled outputs are dropped as the mark passes them."""
    rng = random.Random(seed)
    if kind == "shuffle":
        ledger: MapLedger = ShuffleLedger()
    else:
        ledger = MapLedger(in_order=kind == "filter", is_filter=kind == "filter")
    walk = _Walk(ledger)
    made: list[int] = []  # the input of each output
    dead: set[int] = set()  # inputs that made none
    settled: set[int] = set()
    taken = 0
    for _ in range(300):
        if rng.random() < 0.5:
            size = rng.randrange(1, 4)
            if kind == "shuffle":
                order = list(range(taken, taken + size))
                random.Random(taken).shuffle(order)
                ledger.record(order)
                made += order
            elif kind == "filter":
                keep = [(taken + i) % 3 != 0 for i in range(size)]
                ledger.emit([0] * size, keep, [])
                made += [taken + i for i in range(size) if keep[i]]
                dead |= {taken + i for i in range(size) if not keep[i]}
            else:
                items = [0] * size
                ledger.take(items)
                values = [0 if (taken + i) % 4 else None for i in range(size)]
                failures = [(i, ValueError()) for i, v in enumerate(values) if v is None]
                ledger.emit(items, [FAILED if v is None else v for v in values], failures)
                made += [taken + i for i in range(size) if values[i] is not None]
                dead |= {taken + i for i in range(size) if values[i] is None}
            taken += size
        else:
            outputs = _grow(rng, settled, len(made))
            walk.check(outputs, dead | {made[o] for o in settled})
            assert ledger.first_out == outputs.mark  # the records below it dropped
            assert all(ledger.inputs_of(o) == [made[o]] for o in range(outputs.mark, len(made)))


@pytest.mark.parametrize("seed", range(30))
def test_split_ledger_settles_inputs_and_saves_partials(seed: int) -> None:
    """An input is settled once it ended and all its outputs are; one settled in part is
    saved with its settled indices (extras), and the JSON text kept is that of the extras."""
    rng = random.Random(seed)
    ledger = SplitLedger()
    ledger.key_of = lambda ordinal: ((ordinal * 2, ordinal * 2 + 1),)
    walk = _Walk(ledger)
    made: list[tuple[int, int]] = []  # (input, index) of each output
    outputs_of: dict[int, int] = {}  # input -> outputs made
    ended: set[int] = set()
    settled: set[int] = set()
    opened: list[int] = []
    for _ in range(300):
        roll = rng.random()
        if roll < 0.2 or not opened:
            opened.append(ledger.begin())
            outputs_of[opened[-1]] = 0
        elif roll < 0.5:
            ordinal, count = rng.choice(opened), rng.randrange(3)
            ledger.keep(ordinal, [0] * count)
            made += [(ordinal, outputs_of[ordinal] + j) for j in range(count)]
            outputs_of[ordinal] += count
        elif roll < 0.6:
            ordinal = opened.pop(rng.randrange(len(opened)))
            ledger.end(ordinal)
            ended.add(ordinal)
        else:
            outputs = _grow(rng, settled, len(made))
            waiting = {i for n, (i, _) in enumerate(made) if n not in settled}
            expected = ended - waiting
            walk.check(outputs, expected)
            done: dict[int, list[int]] = {}
            for n in sorted(settled):
                if made[n][0] not in expected:
                    done.setdefault(made[n][0], []).append(made[n][1])
            partial = [{"input": [[o * 2, o * 2 + 1]], "done": Span.of(0, done[o]).to_json()}
                       for o in sorted(done)]
            state = ledger.get_state()
            assert state == ({"partial": partial} if partial else None)
            text = ledger.state_text
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
    assert ledger.get_state() == saved
    ordinal = ledger.begin()  # input 0: positions [0, 1), not saved
    ordinal = ledger.begin()  # input 1: positions [4, 5), saved: index 1 settled
    assert ledger.keep(ordinal, ["a", "b", "c"]) == ["a", "c"]
    state = ledger.get_state()
    assert state == {"partial": [
        {"input": [[4, 5]], "done": {"mark": 0, "ranges": [[1, 2]]}},
        {"input": [[8, 9]], "done": {"mark": 1, "ranges": []}}]}
    assert ledger.state_text == json.dumps(state, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("counted", [True, False])
def test_fixed_ledger_settles_whole_batches_and_the_dropped_rest(counted: bool) -> None:
    walk = _Walk(FixedLedger(4, counted=counted))
    walk.ledger.take(14)
    walk.ledger.drop_rest(2)  # counted: inputs 12 and 13 make no batch, settled at once
    rest = {12, 13} if counted else set()
    walk.check(Span(1), set(range(4)) | rest)
    walk.check(Span(1, [(2, 3)]), set(range(4)) | set(range(8, 12)) | rest)
    walk.check(Span(3), set(range(14 if counted else 12)))


def test_source_ledger_settles_positions() -> None:
    """A resumed run's source: ordinals map to the positions not skipped; ordinals not
    emitted yet wait."""
    plan = SourcePlan(first=0, skip=Span(3, [(5, 7), (9, 10), (12, 20)]))
    walk = _Walk(SourceLedger(plan))
    skipped = {0, 1, 2, 5, 6, 9, *range(12, 20)}
    positions = [3, 4, 7, 8, 10, 11, 20, 21, 22]  # of ordinals 0..8
    for emitted, outputs in [(2, Span(0, [(1, 4)])), (6, Span(5)), (7, Span(5, [(8, 9)])),
                             (9, Span(9))]:
        walk.ledger.emitted = emitted
        walk.check(outputs, skipped | {positions[o] for o in range(9)
                                       if o in outputs and o < emitted})
    assert walk.ledger.positions(0, 9) == [(3, 5), (7, 9), (10, 12), (20, 23)]


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


@pytest.mark.parametrize("traced", [False, True])
def test_states_taken_while_reading_resume_exactly(traced: bool, leak_check: None) -> None:
    """A state taken after each batch (each walk settles only what changed since the last
    one), also while records are held for a trace ten batches behind (``hold``, as a
    journal does: each traced batch gives its own positions): one taken early and the last
    both resume with exactly the items not delivered yet."""
    everything = _items(list(_pipeline()))
    pipe = _pipeline()
    delivered: list[list[int]] = []
    states = []
    with pipe.open() as run:
        lineage = pipe._last[0].lineage
        for step, batch in enumerate(itertools.islice(run, 90)):
            delivered.append(batch)
            if traced:
                lineage.hold(max(0, step - 10))
            state = pipe.state_dict()
            assert state["check"] == _checksum({k: v for k, v in state.items() if k != "check"})
            states.append(state)
            if traced and step >= 10:  # items are their positions (flat_map repeats some)
                assert sorted(lineage.trace(step - 10) or ()) == sorted(delivered[step - 10])
    assert any(state["nodes"] for state in states)  # partial expansions were saved
    for step in (20, 89):
        assert sorted(_items(delivered[: step + 1]) + _resumed(states[step])) == everything


class _Pairs:
    """A custom node's own walk (``SettlingNode``): output ``n`` is inputs ``2n, 2n + 1``."""

    @staticmethod
    def settled_inputs(outputs: Span) -> Span:
        return Span(outputs.mark * 2, [(a * 2, b * 2) for a, b in outputs.ranges])


def test_a_custom_node_settles_through_its_settled_inputs() -> None:
    ledger = _lineage.node_ledger(_Pairs(), None)
    assert ledger is not None
    walk = _Walk(ledger)
    for outputs in (Span(0, [(2, 3)]), Span(1, [(2, 3), (5, 7)]), Span(3, [(5, 7)]), Span(8)):
        walk.check(outputs, {i for o in range(8) if o in outputs for i in (o * 2, o * 2 + 1)})
    assert ledger.lowest(3) == 6  # what a trace of outputs 3 and later may need upstream


def test_ledgers_and_channels_must_answer_what_the_engine_asks() -> None:
    class Half(Ledger):  # no inputs_of
        def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
            return outputs

    with pytest.raises(TypeError, match="inputs_of"):
        Half()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="_readers_ready"):
        ChannelBase(4)  # type: ignore[abstract]


def test_lowest_bounds_the_inputs_a_trace_may_need() -> None:
    """``lowest(n)``: at or below every input of the outputs from ``n`` on still recorded,
    what a journal's ``hold`` keeps upstream."""
    unordered = MapLedger(in_order=False)
    first, second = [0, 0, 0], [0, 0]
    unordered.take(first)
    unordered.take(second)
    unordered.emit(second, [1, 2], [])  # outputs 0, 1: inputs 3, 4
    unordered.emit(first, [1, 2, 3], [])  # outputs 2, 3, 4: inputs 0, 1, 2
    assert [unordered.lowest(n) for n in (0, 2, 4, 5)] == [0, 0, 2, 5]
    assert MapLedger(in_order=True, identity=True).lowest(7) == 7
    batches = FixedLedger(4)
    batches.take(10)
    assert batches.lowest(2) == 8 and batches.lowest(3) == 10  # clamped to what was taken
    split = SplitLedger()
    for ordinal in (split.begin(), split.begin()):
        split.keep(ordinal, [0, 0])
    assert [split.lowest(n) for n in (0, 2, 4)] == [0, 1, 2]
    rows = AssembleLedger(None)
    rows.released([5, 2], [5, 2], True)
    rows.released([0, 7], [0, 7], True)
    assert [rows.lowest(n) for n in (0, 1)] == [0, 0] and rows.lowest(2) > 7
