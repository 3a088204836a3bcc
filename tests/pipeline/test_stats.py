"""Stage statistics count user items: chunks, groups, internal stages, labels, busy time."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from asyncflow import Pipeline
from asyncflow.pipeline import (
    CustomSpec,
    ItemGroup,
    NodeContext,
    Receiver,
    Sender,
    StageStats,
    label_stage,
)
from asyncflow.pipeline._stats import count_items, find_bottleneck


def _double(x: int) -> int:
    return 2 * x


def test_a_map_stage_on_threads_counts_items_not_chunks(leak_check: None) -> None:
    pipe = Pipeline(range(256)).map(_double, concurrency=2)
    assert sorted(pipe) == [2 * i for i in range(256)]
    stage = pipe.stats()["_double"]
    assert (stage.items_in, stage.items_out) == (256, 256)
    assert 0 < stage.chunks < 256  # handed to its threads in chunks, counted apart
    assert stage.items_per_second == stage.items_out / pipe.stats().elapsed


def test_an_async_map_stage_counts_one_chunk_per_item() -> None:
    async def inc(x: int) -> int:
        return x + 1

    pipe = Pipeline(range(40)).map(inc, concurrency=4)
    assert sorted(pipe) == list(range(1, 41))
    stage = pipe.stats()["inc"]
    assert (stage.items_in, stage.items_out, stage.chunks) == (40, 40, 40)


def _groups() -> Any:
    for start in range(0, 256, 16):
        yield ItemGroup(range(start, start + 16))


def _each(group: list[int]) -> ItemGroup:
    return ItemGroup(x + 1 for x in group)


def test_groups_count_as_their_items_and_splitting_them_is_internal() -> None:
    pipe = Pipeline(_groups).map(_each, name="work").unbatch(name="split")
    assert list(pipe) == list(range(1, 257))
    stats = pipe.stats()
    assert stats["source"].items_out == 256
    assert (stats["work"].items_in, stats["work"].items_out) == (256, 256)
    assert (stats["split"].items_in, stats["split"].items_out) == (256, 256)
    assert stats["split"].internal and not stats["work"].internal
    assert [s.name for s in stats.user_stages] == ["source", "work"]
    assert "split" in [s.name for s in stats.stages]  # kept, for those who ask


def test_an_unbatch_of_plain_lists_is_the_users_stage() -> None:
    pipe = Pipeline(range(10)).batch(4).unbatch()
    assert list(pipe) == list(range(10))
    stats = pipe.stats()
    assert not stats["unbatch"].internal
    assert (stats["unbatch"].items_in, stats["unbatch"].items_out) == (3, 10)


def test_count_items() -> None:
    assert count_items([1, 2, 3]) == 3
    assert count_items([ItemGroup([1, 2]), 3, ItemGroup()]) == 3
    assert count_items([[1, 2]]) == 1  # a plain list is one item


def test_a_batch_stage_handles_its_input_items() -> None:
    pipe = Pipeline(range(100)).batch(10)
    assert len(list(pipe)) == 10
    stats = pipe.stats()
    batch = stats["batch"]
    assert (batch.items_in, batch.items_out) == (100, 10)
    assert batch.items_per_second == 100 / stats.elapsed
    assert batch.busy_seconds == 0.0 and batch.mean_seconds_per_item == 0.0  # no function
    assert stats.delivered == 10  # the consumer received batches


def _same(x: int) -> int:
    return x


def _also_same(x: int) -> int:
    return x


def test_a_stage_function_names_its_kind_and_marks_itself_internal() -> None:
    inner = label_stage(_same, internal=True)
    outer = label_stage(_also_same, kind="assemble")
    pipe = Pipeline(range(5)).map(inner, name="inner").map(outer, name="outer")
    assert list(pipe) == list(range(5))
    stats = pipe.stats()
    assert stats["inner"].internal and stats["inner"].kind == "map"
    assert stats["outer"].kind == "assemble" and not stats["outer"].internal
    assert [s.name for s in stats.user_stages] == ["source", "outer"]


def test_describe_and_stats_name_each_stage_alike() -> None:
    pipe = (
        Pipeline(range(20)).map(_double).filter(bool, name="nonzero").batch(4)
        .flat_map(lambda b: b, name="again").prefetch(2)
    )
    list(pipe)
    described = [(d["name"], d["kind"]) for d in pipe.describe()]
    assert [(s.name, s.kind) for s in pipe.stats().stages] == described


def _stage(name: str, utilization: float, *, internal: bool = False) -> StageStats:
    return StageStats(
        name=name, kind="map", concurrency=1, items_in=1, items_out=1, failures=0,
        failed_items=(), busy_seconds=utilization, mean_seconds_per_item=0.0,
        utilization=utilization, in_flight=0, queue_fill=0, queue_capacity=4,
        mean_queue_fill=0.0, internal=internal,
    )


def test_an_internal_stage_s_time_counts_for_the_next_stage() -> None:
    stages = (
        _stage("source", 0.1), _stage("claim", 0.9, internal=True), _stage("decode", 0.5),
        _stage("rows", 0.0, internal=True), _stage("batch", 0.2),
    )
    assert find_bottleneck(stages, 0.0) == "decode"
    assert find_bottleneck(stages[:2], 0.0) == "claim"  # nothing after it to stand for it
    assert find_bottleneck(stages, 1.0) == "consumer"


class _Slow:
    """A custom stage that hands each item to a worker thread with ``ctx.run_timed``."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(4):
            self.ctx.counters.items_in += len(items)
            for item in items:
                await out.put(await self.ctx.run_timed(_sleep, item))
                self.ctx.produced()


def _sleep(x: int) -> int:
    time.sleep(0.01)
    return x


def _sleep_longer(x: int) -> int:
    time.sleep(0.03)
    return x


def test_run_timed_counts_a_custom_stage_s_work_as_busy_time() -> None:
    spec = CustomSpec(label="slow", factory=_Slow, concurrency=1, items_per_output=1)
    pipe = Pipeline(range(20)).with_stage(spec)
    assert list(pipe) == list(range(20))
    stats = pipe.stats()
    slow = stats["slow"]
    assert slow.busy_seconds >= 20 * 0.009
    assert (slow.items_out, slow.chunks) == (20, 20)
    assert slow.mean_seconds_per_item == slow.busy_seconds / 20
    assert slow.utilization == min(1.0, slow.busy_seconds / (stats.elapsed * slow.concurrency))
    assert stats.bottleneck == "slow"


def _slow_consumer(pipe: Pipeline[Any]) -> None:
    for _ in pipe:
        time.sleep(0.06)  # a training step: the consumer is the slowest part (2.4 s for 40,
        # so that a start slowed by a loaded machine stays under the 20% find_bottleneck allows)


@pytest.mark.parametrize("budget", [None, 1], ids=["items", "bytes"])
def test_a_slow_consumer_is_named_the_bottleneck(budget: int | None) -> None:
    # With a byte budget of one item on the last queue (as image.folder's batch stage has)
    # the queue never holds many items: it is full by its bytes, the consumer's item (lent)
    # included, and that says the consumer does not keep up as a full item queue does.
    pipe = Pipeline(range(40)).map(lambda x: np.zeros(256) + x, buffer=4, buffer_bytes=budget)
    _slow_consumer(pipe)
    assert pipe.stats().bottleneck == "consumer"


def test_a_byte_budget_alone_does_not_name_a_fast_consumer() -> None:
    pipe = Pipeline(range(15)).map(_sleep_longer, buffer=4, buffer_bytes=1)
    assert len(list(pipe)) == 15
    assert pipe.stats().bottleneck == "_sleep_longer"
