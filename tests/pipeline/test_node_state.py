"""State on every node: any pipeline resumes exactly (none lost, none twice), from a state
that is plain JSON, bounded by what is in flight, and checked against the pipeline."""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline
from asyncflow.pipeline import CustomSpec, NodeContext, Receiver, Sender, Span

pytestmark = pytest.mark.usefixtures("leak_check")

Build = Callable[[], Pipeline]


def flat(items: list[Any]) -> list[Any]:
    return [x for item in items for x in (item if isinstance(item, list) else [item])]


def interrupted(build: Build, taken: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``taken`` outputs of a run, and the state then (through JSON)."""
    pipe = build()
    with pipe.open() as run:
        got = list(itertools.islice(run, taken))
        state = json.loads(json.dumps(pipe.state_dict()))
    return got, state


def resumed(build: Build, state: dict[str, Any]) -> list[Any]:
    pipe = build()
    pipe.load_state_dict(state)
    return list(pipe)


def check_exact(build: Build, points: list[int], *, ordered: bool) -> None:
    """Interrupted after each of ``points`` outputs, the run plus its resumption yields
    the items of an uninterrupted run: in order, or as the same multiset."""
    full = flat(list(build()))
    for taken in points:
        before, state = interrupted(build, taken)
        after = resumed(build, state)
        got = flat(before) + flat(after)
        if ordered:
            assert got == full, f"interrupted after {taken}"
        else:
            assert Counter(got) == Counter(full), f"interrupted after {taken}"


def shaky(x: int) -> int:
    """A map that fails on some items and takes a varying time (so that workers finish
    out of order)."""
    if x % 7 == 3:
        raise ValueError(x)
    time.sleep(random.random() * 0.0005)
    return x * 10


async def ashaky(x: int) -> int:
    if x % 11 == 5:
        raise ValueError(x)
    return x + 1


def expand(x: int) -> list[int]:
    return [x * 100 + i for i in range(x % 4)]  # none, one, two or three


POINTS = [0, 1, 17, 150, 401]


@pytest.mark.parametrize(
    ("build", "ordered"),
    [
        (lambda: Pipeline(list(range(500))).filter(lambda x: x % 3 != 0), True),
        (lambda: Pipeline(range(500), max_failures=1000).map(shaky, concurrency=3), True),
        (lambda: Pipeline(range(500), max_failures=1000).map(shaky, concurrency=4,
                                                              ordered=False), False),
        (lambda: Pipeline(range(500), max_failures=1000).map(ashaky, concurrency=8,
                                                              ordered=False), False),
        (lambda: Pipeline(range(500), max_failures=1000).map(ashaky), True),
        (lambda: Pipeline(range(300)).flat_map(expand), True),
        (lambda: Pipeline(range(300)).flat_map(expand, concurrency=4), True),
        (lambda: Pipeline(range(300)).flat_map(expand, concurrency=4, ordered=False), False),
        (lambda: Pipeline(range(500)).prefetch(8), True),
        (lambda: Pipeline(range(2000)).batch(7), True),
        (lambda: Pipeline(range(2000)).batch(7, drop_last=True), True),
        (lambda: Pipeline(range(500)).batch(9).unbatch(), True),
        (lambda: Pipeline(range(500)).shuffle(buffer_size=64, seed=3), False),
    ],
    ids=["filter", "map-failures", "map-unordered-failures", "async-unordered-failures",
         "async-ordered-failures", "flat_map", "flat_map-ordered-4", "flat_map-unordered",
         "prefetch", "batch", "batch-drop-last", "batch-unbatch", "shuffle"],
)
def test_each_stage_resumes_exactly(build: Build, ordered: bool) -> None:
    check_exact(build, POINTS, ordered=ordered)


def test_combinations_resume_exactly() -> None:
    def build() -> Pipeline:
        return (
            Pipeline(range(600), max_failures=1000)
            .map(shaky, concurrency=4, ordered=False)
            .filter(lambda x: x % 20 != 0)
            .flat_map(expand, concurrency=2)
            .shuffle(buffer_size=32, seed=5)
            .batch(5)
            .unbatch()
            .prefetch(4)
        )

    check_exact(build, [0, 3, 100, 333], ordered=False)


def test_ordered_stages_resume_in_order_through_batches() -> None:
    def build() -> Pipeline:
        return (Pipeline(range(700), max_failures=1000).map(shaky, concurrency=3)
                .flat_map(expand).batch(4).prefetch(2))

    check_exact(build, [1, 40, 200], ordered=True)


def test_a_partly_delivered_expansion_resumes_after_its_delivered_part() -> None:
    def build() -> Pipeline:
        return Pipeline(range(20)).flat_map(lambda x: range(x * 10, x * 10 + 10))

    before, state = interrupted(build, 23)  # items 0, 1 and three of item 2's ten
    assert state["positions"]["mark"] == 2
    assert state["nodes"]["flat_map"]["partial"] == [
        {"input": [[2, 3]], "done": {"mark": 3, "ranges": []}}
    ]
    assert before + resumed(build, state) == list(range(200))


def test_resume_twice_in_a_row() -> None:
    def build() -> Pipeline:
        return (Pipeline(range(400), max_failures=1000)
                .map(shaky, concurrency=4, ordered=False).flat_map(expand).batch(3))

    full = flat(list(build()))
    first, state = interrupted(build, 30)
    pipe = build()
    pipe.load_state_dict(state)
    with pipe.open() as run:
        second = list(itertools.islice(run, 40))
        state = json.loads(json.dumps(pipe.state_dict()))
    rest = resumed(build, state)
    assert Counter(flat(first + second + rest)) == Counter(full)


@pytest.mark.parametrize("kind", ["generator", "async"])
def test_iterator_sources_are_read_past_the_settled_positions(kind: str) -> None:
    def numbers() -> Any:
        return iter(range(300))

    async def anumbers() -> Any:
        for i in range(300):
            yield i

    def build() -> Pipeline:
        source = numbers if kind == "generator" else anumbers
        return (Pipeline(source, max_failures=1000)
                .map(shaky, concurrency=3, ordered=False).batch(4))

    check_exact(build, [5, 50], ordered=False)


def test_the_resumed_run_is_the_saved_epoch_and_the_next_run_the_one_after() -> None:
    def build() -> Pipeline:
        return Pipeline(range(100)).shuffle(buffer_size=16, seed=7)

    reference = build()
    epochs = [list(reference) for _ in range(3)]
    pipe = build()
    list(pipe)  # epoch 0
    with pipe.open() as run:  # epoch 1
        before = list(itertools.islice(run, 30))
        state = json.loads(json.dumps(pipe.state_dict()))
    assert state["epoch"] == 1
    assert before == epochs[1][:30]
    again = build()
    again.load_state_dict(state)
    assert Counter(before + list(again)) == Counter(epochs[1])
    assert list(again) == epochs[2]


def test_failures_within_the_budget_stay_failures_and_are_counted() -> None:
    calls: list[int] = []

    def record(x: int) -> int:
        calls.append(x)
        return shaky(x)

    def build() -> Pipeline:
        return Pipeline(range(100), max_failures=100).map(record, concurrency=2)

    before, state = interrupted(build, 40)
    settled = Span.from_json(state["positions"], "positions")
    failed = [x for x in range(100) if x % 7 == 3 and x in settled]
    assert failed and state["failed"]["record"] >= len(failed)
    calls.clear()
    after = resumed(build, state)
    assert before + after == [x * 10 for x in range(100) if x % 7 != 3]
    assert not set(failed) & set(calls)  # not retried


def test_state_size_follows_what_is_in_flight_not_the_epochs_length() -> None:
    def build() -> Pipeline:
        return (Pipeline(range(200_000), max_failures=1.0)
                .map(shaky, concurrency=4, ordered=False)
                .filter(lambda x: x % 3 != 0).batch(16))

    pipe = build()
    with pipe.open() as run:
        for _ in itertools.islice(run, 5_000):  # about 120,000 source items
            pass
        text = json.dumps(pipe.state_dict())
    state = json.loads(text)
    assert state["positions"]["mark"] > 100_000
    assert len(text) < 20_000


def test_state_before_any_run_resumes_from_the_start() -> None:
    pipe = Pipeline(range(50)).filter(lambda x: x % 2 == 0).batch(4)
    state = json.loads(json.dumps(pipe.state_dict()))
    assert state["positions"] == {"mark": 0, "ranges": []}
    again = Pipeline(range(50)).filter(lambda x: x % 2 == 0).batch(4)
    again.load_state_dict(state)
    assert list(again) == list(pipe)


# -- bad states --------------------------------------------------------------------------


def saved() -> dict[str, Any]:
    return interrupted(lambda: Pipeline(list(range(100))).filter(bool).batch(4), 3)[1]


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (lambda: Pipeline(list(range(100))).map(abs).batch(4), "stage 1 is map"),
        (lambda: Pipeline(list(range(100))).filter(bool), "1 stage"),
        (lambda: Pipeline(list(range(90))).filter(bool).batch(4), "length differs: 90"),
        (lambda: Pipeline([str(i) for i in range(100)]).filter(bool).batch(4), "listing"),
        (lambda: Pipeline(tuple(range(100))).filter(bool).batch(4), "type differs"),
    ],
)
def test_a_state_from_another_pipeline_says_what_differs(other: Build, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        other().load_state_dict(saved())


def test_an_edited_or_cut_state_is_refused() -> None:
    state = saved()
    pipe = Pipeline(list(range(100))).filter(bool).batch(4)
    edited = {**state, "positions": {"mark": 90, "ranges": []}}
    with pytest.raises(ConfigError, match="edited"):
        pipe.load_state_dict(edited)
    cut = {k: v for k, v in state.items() if k != "nodes"}
    with pytest.raises(ConfigError, match="edited or damaged"):
        pipe.load_state_dict(cut)
    with pytest.raises(ConfigError, match="version"):
        pipe.load_state_dict({**state, "version": 99})
    with pytest.raises(ConfigError, match="not a pipeline state"):
        pipe.load_state_dict("{}")  # type: ignore[arg-type]
    with pytest.raises(json.JSONDecodeError):
        json.loads(json.dumps(state)[:-10])  # a cut file fails before it reaches asyncflow


def test_span_json_is_checked() -> None:
    assert Span.from_json({"mark": 3, "ranges": [[5, 7]]}, "x") == Span(3, [(5, 7)])
    for bad in ({"mark": -1, "ranges": []}, {"mark": 3, "ranges": [[2, 4]]},
                {"mark": 3, "ranges": [[5, 7], [6, 9]]}, {"mark": 3}, [3]):
        with pytest.raises(ConfigError):
            Span.from_json(bad, "x")
    with pytest.raises(ConfigError, match="source of 10"):
        Span.from_json({"mark": 3, "ranges": [[5, 12]]}, "x", 10)
    rng = random.Random(5)
    for _ in range(200):
        ordinals = rng.sample(range(40), rng.randrange(20))
        span = Span.of(0, list(ordinals))
        assert set(ordinals) == {o for o in range(40) if o in span}


# -- custom stages -----------------------------------------------------------------------


class Doubler:
    """Each item becomes two; reports its position by implementing ``settled_inputs``."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(16):
            await out.put_many([x for item in items for x in (item, item)])

    @staticmethod
    def settled_inputs(outputs: Span) -> Span:
        # input n made outputs 2n and 2n + 1: settled once both are
        return Span(outputs.mark // 2, [((a + 1) // 2, b // 2) for a, b in outputs.ranges])


class Opaque(Doubler):
    settled_inputs = None  # type: ignore[assignment]


def test_a_custom_stage_reports_its_position_itself() -> None:
    def build() -> Pipeline:
        return Pipeline(range(100)).with_stage(CustomSpec(label="double", factory=Doubler))

    # (an odd count would leave half of an input delivered: this node does not save that)
    check_exact(build, [2, 78], ordered=True)


def test_a_custom_stage_with_items_per_output_resumes() -> None:
    class Pairs(Doubler):
        settled_inputs = None  # type: ignore[assignment]

        async def run(self, inp: Receiver | None, out: Sender) -> None:
            assert inp is not None
            pending: list[Any] = []
            while items := await inp.get_many(16):
                pending.extend(items)
                while len(pending) >= 2:
                    await out.put((pending.pop(0), pending.pop(0)))

    def build() -> Pipeline:
        return Pipeline(range(100)).with_stage(
            CustomSpec(label="pairs", factory=Pairs, items_per_output=2))

    full = list(build())
    before, state = interrupted(build, 11)
    assert state["offset"] == 22
    assert before + resumed(build, state) == full


def test_a_custom_stage_that_cannot_report_is_named() -> None:
    pipe = Pipeline(range(10)).with_stage(CustomSpec(label="opaque", factory=Opaque))
    assert len(list(pipe)) == 20  # it runs all the same
    with pytest.raises(ConfigError, match="'opaque'"):
        pipe.state_dict()


# -- per-item seeds ----------------------------------------------------------------------


def draw(x: int) -> tuple[int, float]:
    return x, random.random()


def test_per_item_seeds_keep_the_source_positions_across_a_resume_with_gaps() -> None:
    from asyncflow.pipeline import Processes

    def build() -> Pipeline:
        return (Pipeline(range(60)).map(draw, concurrency=2, workers=Processes(seed=7))
                .filter(lambda r: r[0] % 3 != 0).prefetch(16))

    full = list(build())
    pipe = build()
    with pipe.open() as run:
        before = list(itertools.islice(run, 2))
        deadline = time.monotonic() + 10
        while True:  # until filtered items above the watermark leave gaps to skip
            state = json.loads(json.dumps(pipe.state_dict()))
            if state["positions"]["ranges"] or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    assert state["positions"]["ranges"]
    assert before + resumed(build, state) == full  # the same draws for the same items


def test_a_merge_branch_stage_that_cannot_report_is_named() -> None:
    from asyncflow import mix

    opaque = Pipeline(range(5), name="web").with_stage(CustomSpec(label="opaque", factory=Opaque))
    pipe = mix([opaque, Pipeline(range(3))], stop="all").batch(2)
    assert len(flat(list(pipe))) == 13
    with pytest.raises(ConfigError, match="cannot be resumed: stage 'web/opaque'"):
        pipe.state_dict()
    nested = mix([mix([Pipeline(range(5)), Pipeline(range(3))], stop="all"), Pipeline(range(2))],
                 stop="all")
    assert len(list(nested)) == 10
    with pytest.raises(ConfigError, match="cannot be resumed: stage 'mix/mix'"):
        nested.state_dict()  # a merge within a merge: not yet
