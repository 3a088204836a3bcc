"""``.cache()`` reads what a pipeline yields from its stages' traits: assemble and custom stages."""

from __future__ import annotations

from typing import Any

from asyncflow import Pipeline
from asyncflow.cache._cached import _layout
from asyncflow.pipeline import CustomSpec, NodeContext, Receiver, Sender, StageTraits


class _Whole:
    """An assembler whose every row is a whole batch of one."""

    def failure(self, row: Any) -> Exception | None:
        return None

    def arrived(self, row: Any, *, ok: bool) -> list[Any]:
        return [row]


class _Pass:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(64):
            await out.put_many(items)


def test_an_assemble_stage_yields_batches_through_later_maps() -> None:
    base = Pipeline([[1], [2]])
    assembled = base.assemble(_Whole(), batch_size=1)
    assert _layout(assembled, None) == "batches"
    assert _layout(assembled.map(lambda b: b).prefetch(2), None) == "batches"
    assert _layout(assembled.unbatch(), None) == "samples"
    assert _layout(assembled, False) == "samples"


def test_a_custom_stage_yields_what_its_traits_declare() -> None:
    def custom(**traits: Any) -> CustomSpec:
        return CustomSpec(label="pass", factory=_Pass, traits=StageTraits(**traits))

    base = Pipeline(range(4))
    assert _layout(base.with_stage(custom(grouping="batches")), None) == "batches"
    assert _layout(base.with_stage(custom(grouping="lists")), None) == "lists"
    assert _layout(base.batch(2).with_stage(custom(grouping="elements")), None) == "samples"
    assert _layout(base.with_stage(custom()), None) == "samples"
    # after a batch stage: lists while every later stage keeps its items, else collated
    assert _layout(base.batch(2).with_stage(custom()), None) == "batches"
    assert _layout(base.batch(2).with_stage(custom(keeps_items=True)), None) == "lists"
    # neither a kind nor a setting decides: a custom stage named and set like a batch
    # stage, whose traits say nothing, groups nothing
    lookalike = CustomSpec(label="batch", factory=_Pass, options={"batch_size": 8})
    assert _layout(base.with_stage(lookalike), None) == "samples"
