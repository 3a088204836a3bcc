"""A stage is one spec and one node: the spec declares its traits (``_traits.py``), its node
is registered for it (``node_for``), and the builder, resume, journal, cache and profiler
read the traits, never a list of stage kinds.

The third party's stages here have kinds nobody knows (``scale``, ``tag``, ``custom``), so
each test fails if its reader goes back to a table of kinds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

import asyncflow as af
from asyncflow import ConfigError, Pipeline
from asyncflow.cache._cached import _layout
from asyncflow.pipeline import (
    CustomSpec,
    NodeContext,
    Receiver,
    Sender,
    Span,
    StageSpec,
    StageTraits,
    node_for,
    state_checksum,
)
from asyncflow.pipeline._build import thread_count
from asyncflow.pipeline._spec import FlatMapSpec, MapSpec


@dataclass(frozen=True, kw_only=True)
class Scale(StageSpec):
    """A third party's stage: each item times ``factor``, on the run's threads."""

    kind: ClassVar[str] = "scale"
    TRAITS: ClassVar[StageTraits] = StageTraits(ordered=True, per_item=True, tunable=True)
    factor: int
    concurrency: int = 1

    @property
    def items_per_output(self) -> int | None:
        return 1

    def settings(self) -> dict[str, Any]:
        return {"factor": self.factor, "concurrency": self.concurrency}


@node_for(Scale)
class ScaleNode:
    def __init__(self, ctx: NodeContext, spec: Scale) -> None:
        self.ctx, self.factor = ctx, spec.factor

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(8):
            self.ctx.counters.items_in += len(items)
            scaled = await self.ctx.run_timed(self._scale, items)
            await out.put_many(scaled)
            self.ctx.produced(len(scaled))

    def _scale(self, items: list[int]) -> list[int]:
        return [item * self.factor for item in items]


@dataclass(frozen=True, kw_only=True)
class Tag(StageSpec):
    """A stateful stage: each item tagged with the session that delivered it; a resumed run
    is the next session (its state: the session number)."""

    kind: ClassVar[str] = "tag"
    TRAITS: ClassVar[StageTraits] = StageTraits(ordered=True, stateful=True, worker="loop")

    def check_state(self, extras: dict[str, Any], what: str) -> None:
        session = extras.get("session")
        if type(session) is not int or session < 0:
            raise ConfigError(f"{what}['session'] must be an int >= 0, got {session!r}")


@node_for(Tag)
class TagNode:
    def __init__(self, ctx: NodeContext, spec: Tag) -> None:
        self.session = 0

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(4):
            await out.put_many([(item, self.session) for item in items])

    @staticmethod
    def settled_inputs(outputs: Span) -> Span:
        return outputs  # one output per input, in order

    def get_state(self) -> dict[str, Any]:
        return {"session": self.session}

    def set_state(self, state: dict[str, Any]) -> None:
        self.session = state["session"] + 1


def test_a_third_party_stage_runs_as_one_spec_and_one_node(leak_check: None) -> None:
    pipe = Pipeline(range(20)).with_stage(Scale(factor=3, concurrency=2)).batch(5)
    assert [x for batch in pipe for x in batch] == [3 * i for i in range(20)]
    assert pipe.stats()["scale"].items_out == 20
    assert pipe.describe()[1] == {"kind": "scale", "name": "scale", "factor": 3,
                                  "concurrency": 2}
    # its traits reserve its threads, and keep the stages after it in step with the source
    assert thread_count(pipe.stages) == 1 + 2


def test_a_subclass_builds_its_parents_node_and_an_unregistered_spec_is_refused(
    leak_check: None,
) -> None:
    @dataclass(frozen=True, kw_only=True)
    class Double(Scale):
        factor: int = 2

    assert list(Pipeline(range(3)).with_stage(Double())) == [0, 2, 4]

    @dataclass(frozen=True, kw_only=True)
    class Orphan(StageSpec):
        kind: ClassVar[str] = "orphan"

    with pytest.raises(ConfigError, match=r"'orphan'.*no node is registered for Orphan"):
        list(Pipeline(range(3)).with_stage(Orphan()))


def test_a_stage_that_declares_state_resumes_with_it(leak_check: None) -> None:
    pipe = Pipeline(range(10)).with_stage(Tag())
    run = iter(pipe)
    first = [next(run) for _ in range(3)]
    state = pipe.state_dict()
    run.close()
    assert first == [(0, 0), (1, 0), (2, 0)]
    assert state["nodes"]["tag"] == {"session": 0}
    again = Pipeline(range(10)).with_stage(Tag())
    again.load_state_dict(state)
    assert list(again) == [(i, 1) for i in range(3, 10)]


def test_a_stage_checks_its_own_extras_when_a_state_is_loaded(leak_check: None) -> None:
    pipe = Pipeline(range(10)).with_stage(Tag())
    with pipe.open() as run:
        [next(run) for _ in range(3)]
        state = pipe.state_dict()
    body = {k: v for k, v in state.items() if k != "check"}
    body["nodes"] = {"tag": {"session": "garbage"}}  # the checksum made again, as a forger
    forged = {**body, "check": state_checksum(body)}
    with pytest.raises(ConfigError, match=r"nodes\['tag'\]\['session'\] must be an int"):
        Pipeline(range(10)).with_stage(Tag()).load_state_dict(forged)
    again = Pipeline(range(10)).with_stage(Tag())
    again.load_state_dict(state)  # what it saved passes its check
    assert list(again) == [(i, 1) for i in range(3, 10)]


def test_state_is_declared_or_refused_naming_the_stage(leak_check: None) -> None:
    @dataclass(frozen=True, kw_only=True)
    class Silent(Tag):
        TRAITS: ClassVar[StageTraits] = StageTraits(ordered=True, worker="loop")

    with pytest.raises(ConfigError, match=r"'tag'.*does not declare stateful=True"):
        list(Pipeline(range(3)).with_stage(Silent()))
    claims = CustomSpec(label="claims", factory=lambda ctx: ScaleNode(ctx, Scale(factor=1)),
                        traits=StageTraits(stateful=True))
    with pytest.raises(ConfigError, match=r"'claims'.*lacks settled_inputs, get_state"):
        list(Pipeline(range(3)).with_stage(claims))


def test_the_builder_reads_worker_and_grouping_from_the_traits(leak_check: None) -> None:
    def passing(ctx: NodeContext) -> ScaleNode:
        return ScaleNode(ctx, Scale(factor=1))

    on_loop = CustomSpec(label="on loop", factory=passing, concurrency=4,
                         traits=StageTraits(worker="loop"))
    on_threads = dataclasses.replace(on_loop, traits=StageTraits())
    assert thread_count([on_loop]) == 1 and thread_count([on_threads]) == 1 + 4
    # a stage that makes lists gives the stages after it the batched queue (2 x concurrency)
    lists = dataclasses.replace(on_threads, label="lists", traits=StageTraits(grouping="lists"))
    pipe = Pipeline(range(4)).with_stage(lists).map(lambda x: x, name="after")
    assert list(pipe) == [0, 1, 2, 3]
    assert pipe.stats()["after"].queue_capacity == 2
    plain = Pipeline(range(4)).with_stage(on_threads).map(lambda x: x, name="after")
    assert list(plain) == [0, 1, 2, 3] and plain.stats()["after"].queue_capacity == 64


def _tagged(per_item: bool) -> CustomSpec:
    def passing(ctx: NodeContext) -> ScaleNode:
        return ScaleNode(ctx, Scale(factor=1))

    return CustomSpec(label="pass", factory=passing, items_per_output=1,
                      traits=StageTraits(ordered=True, per_item=per_item))


def test_the_journal_rebuilds_through_a_stage_its_traits_call_replayable(
    tmp_path: Path, leak_check: None
) -> None:
    pipe = Pipeline(list(range(12))).with_stage(Scale(factor=10)).with_stage(_tagged(True))
    pipe = pipe.batch(4)
    delivered = list(pipe.journal(tmp_path))
    record = af.explain(tmp_path, epoch=0, step=1)
    assert record.positions == (4, 5, 6, 7)
    assert af.rebuild(pipe, record) == delivered[1] == [40, 50, 60, 70]
    opaque = Pipeline(list(range(12))).with_stage(_tagged(False)).batch(4)
    list(opaque.journal(tmp_path / "opaque"))
    with pytest.raises(ConfigError, match="stage 'pass' is a custom stage"):
        af.rebuild(opaque, af.explain(tmp_path / "opaque", epoch=0, step=0))


def test_the_journal_refuses_a_map_its_traits_call_unordered(tmp_path: Path) -> None:
    pipe = Pipeline(list(range(8))).map(lambda x: x, ordered=False, concurrency=2).batch(4)
    list(pipe.journal(tmp_path))
    with pytest.raises(ConfigError, match="is unordered"):
        af.rebuild(pipe, af.explain(tmp_path, epoch=0, step=0))


def test_the_profiler_tunes_what_the_traits_call_tunable(leak_check: None) -> None:
    fixed = dataclasses.replace(_tagged(True), label="fixed")
    pipe = Pipeline(range(40)).with_stage(Scale(factor=2)).with_stage(fixed)
    report = af.profile(pipe, sample=40, concurrencies=(1, 2))
    scale, untuned = report.stages
    assert sorted(scale.rates) == [1, 2] and scale.recommended in (1, 2)
    assert sorted(untuned.rates) == [1] and untuned.recommended is None


def test_the_cache_layout_follows_a_third_party_stage_through_its_traits() -> None:
    base = Pipeline(range(8)).batch(4)
    assert _layout(base.with_stage(Scale(factor=1)), None) == "batches"  # changes items
    keeps = CustomSpec(label="hold", factory=lambda ctx: ScaleNode(ctx, Scale(factor=1)),
                       traits=StageTraits(keeps_items=True))
    assert _layout(base.with_stage(keeps), None) == "lists"


@pytest.mark.parametrize(
    ("spec", "ordered", "per_item", "grouping", "keeps_items", "stateful", "worker", "tunable"),
    [
        (MapSpec(fn=abs), True, True, None, False, False, "threads", True),
        (MapSpec(fn=abs, ordered=False), False, True, None, False, False, "threads", True),
        (MapSpec(fn=abs, mode="filter"), True, True, None, True, False, "threads", True),
        (FlatMapSpec(fn=abs), True, True, "elements", False, True, "threads",
         True),
    ],
)
def test_a_map_declares_its_traits_from_its_settings(
    spec: StageSpec, ordered: bool, per_item: bool, grouping: str | None, keeps_items: bool,
    stateful: bool, worker: str, tunable: bool,
) -> None:
    assert spec.traits == StageTraits(ordered=ordered, per_item=per_item, grouping=grouping,  # type: ignore[arg-type]
                                      keeps_items=keeps_items, stateful=stateful,
                                      worker=worker, tunable=tunable)  # type: ignore[arg-type]


def test_traits_are_checked() -> None:
    with pytest.raises(ConfigError, match="grouping must be one of"):
        StageTraits(grouping="piles")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="worker must be one of"):
        StageTraits(worker="gpu")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ordered must be True or False"):
        StageTraits(ordered=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="traits must be a StageTraits"):
        CustomSpec(label="x", factory=ScaleNode, traits={"ordered": True})  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [
    lambda: Pipeline(range(4)).batch(2, drop_last="no"),
    lambda: Pipeline(range(4)).map(str, ordered=1),
    lambda: af.Processes(persistent="yes"),
])
def test_a_flag_that_is_not_a_bool_is_refused_by_name(make: Any) -> None:
    # batch(drop_last="no") read as true and dropped the short last batch
    with pytest.raises(ConfigError, match=r"(drop_last|ordered|persistent) must be True or False"):
        make()
