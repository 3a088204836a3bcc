"""``.cache()`` reads what a pipeline yields from ``describe()``: assemble and custom stages."""

from __future__ import annotations

from typing import Any

from asyncflow import Pipeline
from asyncflow.cache._cached import _layout
from asyncflow.pipeline import CustomSpec, NodeContext, Receiver, Sender


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


def test_a_custom_stage_declaring_a_batch_size_yields_batches() -> None:
    def custom(options: dict[str, Any]) -> CustomSpec:
        return CustomSpec(label="pass", factory=_Pass, options=options)

    base = Pipeline(range(4))
    assert _layout(base.with_stage(custom({"batch_size": 8})), None) == "batches"
    assert _layout(base.with_stage(custom({"device": "cpu"})), None) == "samples"
    assert _layout(base.batch(2).with_stage(custom({})), None) == "batches"
