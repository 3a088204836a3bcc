"""The failure policy (RELIABILITY 1-5): visible by default, budgeted skips counted."""

from __future__ import annotations

import asyncio
import logging
import traceback

import pytest

from asyncflow import AsyncflowError, FailureBudgetExceeded, Pipeline, PipelineError
from asyncflow.pipeline import CustomSpec, NodeContext, Receiver, Sender

pytestmark = pytest.mark.usefixtures("leak_check")


class Boom(Exception):
    pass


def fail_every_100th(x: int) -> int:
    if x % 100 == 37:
        raise Boom(f"bad item {x}")
    return x


def test_one_percent_failing_under_five_percent_budget_completes(caplog) -> None:
    caplog.set_level(logging.WARNING, "asyncflow")
    pipe = Pipeline(range(10_000)).map(fail_every_100th, concurrency=2, name="flaky",
                                       max_failures=0.05)
    out = list(pipe)
    assert len(out) == 9_900
    assert out == [x for x in range(10_000) if x % 100 != 37]
    failures = pipe.stats().failures
    assert len(failures) == 100
    assert {f.stage for f in failures} == {"flaky"}
    assert {f.error_type for f in failures} == {"Boom"}
    assert sorted(int(f.item) for f in failures) == [x for x in range(10_000) if x % 100 == 37]
    assert pipe.stats()["flaky"].failures == 100
    assert 0 < len([r for r in caplog.records if "skipped" in r.getMessage()]) < 20


def test_integer_budget_on_the_pipeline_applies_to_every_stage() -> None:
    pipe = Pipeline(range(1000), max_failures=10).map(fail_every_100th)
    assert len(list(pipe)) == 990


def test_past_the_budget_raises_a_group_with_notes_and_nothing_after() -> None:
    def fail_from_50(x: int) -> int:
        if x >= 50:
            raise Boom(f"item {x}")
        return x

    pipe = Pipeline(range(1000)).map(fail_from_50, name="strict", max_failures=3)
    seen = []
    with pytest.raises(PipelineError) as info:
        for x in pipe:
            seen.append(x)
    assert seen == list(range(50))  # everything before the failure, nothing after
    group = info.value
    assert isinstance(group, ExceptionGroup) and isinstance(group, AsyncflowError)
    boom = group.exceptions[0]
    assert isinstance(boom, Boom) and str(boom) == "item 53"
    assert any("stage 'strict'" in n and "53" in n for n in boom.__notes__)
    assert "strict" in str(group)


def test_default_is_fail_fast_on_the_first_error() -> None:
    seen = []
    with pytest.raises(PipelineError) as info:
        for x in Pipeline(range(500)).map(fail_every_100th, concurrency=4):
            seen.append(x)
    assert seen == list(range(37))
    assert str(info.value.exceptions[0]) == "bad item 37"


def test_except_star_picks_out_the_original_type() -> None:
    caught = []
    try:
        list(Pipeline(range(100)).map(fail_every_100th))
    except* Boom as group:
        caught.extend(group.exceptions)
    assert len(caught) == 1


def _gen_failing_at(n: int):
    yield from range(n)
    raise Boom("source broke")


def test_source_raising_mid_stream_delivers_earlier_items_then_raises_sync() -> None:
    seen = []
    with pytest.raises(PipelineError) as info:
        for x in Pipeline(lambda: _gen_failing_at(500)).map(lambda x: x):
            seen.append(x)
    assert seen == list(range(500))
    original = info.value.exceptions[0]
    assert isinstance(original, Boom)
    frames = [f.name for f in traceback.extract_tb(original.__traceback__)]
    assert "_gen_failing_at" in frames  # the original traceback survives


async def test_source_raising_mid_stream_delivers_earlier_items_then_raises_async() -> None:
    async def agen():
        for i in range(300):
            yield i
        raise Boom("async source broke")

    seen = []
    with pytest.raises(PipelineError) as info:
        async for x in Pipeline(agen).map(lambda x: x, concurrency=2):
            seen.append(x)
    assert seen == list(range(300))
    original = info.value.exceptions[0]
    assert isinstance(original, Boom)
    assert "agen" in [f.name for f in traceback.extract_tb(original.__traceback__)]


def test_epoch_where_every_item_failed_never_ends_quietly() -> None:
    def always(x: int) -> int:
        raise Boom(str(x))

    with pytest.raises(PipelineError, match="every one"):
        list(Pipeline(range(20), max_failures=1000).map(always))


def test_fraction_budget_is_checked_exactly_at_the_end() -> None:
    def fail_first(x: int) -> int:
        if x == 0:
            raise Boom("first")
        return x

    # 1 of 10 failed = 10% > 5%: within the grace mid-run, over the budget at the end.
    seen = []
    with pytest.raises(PipelineError, match="over the budget"):
        for x in Pipeline(range(10)).map(fail_first, max_failures=0.05):
            seen.append(x)
    assert seen == list(range(1, 10))


def test_stage_budget_overrides_the_pipeline_default() -> None:
    pipe = Pipeline(range(300), max_failures=0).map(fail_every_100th, max_failures=5)
    assert len(list(pipe)) == 297


async def test_async_stage_failures_are_counted_the_same() -> None:
    async def afail(x: int) -> int:
        await asyncio.sleep(0)
        return fail_every_100th(x)

    pipe = Pipeline(range(1000)).map(afail, concurrency=8, max_failures=10)
    out = [x async for x in pipe]
    assert len(out) == 990
    assert out == sorted(out)


def test_filter_and_flat_map_failures_follow_the_budget() -> None:
    def pred(x: int) -> bool:
        return fail_every_100th(x) % 2 == 0

    def expand(x: int) -> list[int]:
        return [fail_every_100th(x)]

    pipe = Pipeline(range(1000)).filter(pred, max_failures=10)
    assert len(list(pipe)) == 500  # the failing items are odd: dropped either way
    assert pipe.stats()["pred"].failures == 10
    assert len(list(Pipeline(range(1000)).flat_map(expand, max_failures=10))) == 990


def test_two_failing_stages_both_reported() -> None:
    def fail_on_3(x: int) -> int:
        if x == 3:
            raise Boom("three")
        return x

    with pytest.raises(PipelineError) as info:
        list(Pipeline(range(10)).map(fail_on_3, name="a").batch(2).map(len, name="b")
             .map(lambda n: 1 // (n - 1), name="c"))
    types = sorted(type(e).__name__ for e in info.value.exceptions)
    assert "Boom" in types and "ZeroDivisionError" in types


def test_secrets_in_items_are_redacted_in_notes_and_records() -> None:
    url = "https://user:hunter2@example.com/a.jpg?X-Amz-Signature=abcdef123"

    def fail(x: str) -> str:
        raise Boom("nope")

    pipe = Pipeline([url]).map(fail)
    with pytest.raises(PipelineError) as info:
        list(pipe)
    text = "\n".join(info.value.exceptions[0].__notes__)
    assert "hunter2" not in text and "abcdef123" not in text
    assert "example.com" in text
    assert "hunter2" not in repr(pipe.stats().stages)


def _die_on_3(x: int) -> int:
    import os
    import signal

    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    return x


@pytest.mark.timeout(60)
def test_a_dead_process_pool_worker_is_reported_naming_the_stage() -> None:
    import time
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    start = time.monotonic()
    with ProcessPoolExecutor(2) as pool, pytest.raises(PipelineError) as info:
        list(Pipeline(range(10)).map(_die_on_3, executor=pool, name="gil-bound"))
    assert time.monotonic() - start < 20
    broken = info.value.exceptions[0]
    assert isinstance(broken, BrokenProcessPool)
    assert any("'gil-bound'" in note for note in broken.__notes__)


def test_report_every_logs_the_stats_table(caplog) -> None:
    import time

    caplog.set_level(logging.INFO, "asyncflow")

    def slow(x: int) -> int:
        time.sleep(0.01)
        return x

    list(Pipeline(range(40), report_every=0.1, name="reported").map(slow, name="slowstage"))
    reports = [r.getMessage() for r in caplog.records if "reported" in r.getMessage()]
    assert reports and "slowstage" in reports[0]


# -- RELIABILITY 33: a BaseException in a stage ends the consumer's loop, as itself ----------

_BASE_EXCEPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit]


def _raise_at_5(exc_type: type[BaseException]) -> object:
    def fail(x: int) -> int:
        if x == 5:
            raise exc_type("from a stage")
        return x

    return fail


def _build(kind: str, exc_type: type[BaseException]) -> Pipeline:
    fail = _raise_at_5(exc_type)
    if kind == "source":
        def gen():  # type: ignore[no-untyped-def]
            for x in range(100):
                fail(x)
                yield x

        return Pipeline(gen).map(lambda x: x, concurrency=2)
    if kind == "async":
        async def afail(x: int) -> int:
            return fail(x)  # type: ignore[operator, no-any-return]

        return Pipeline(range(100)).map(afail, concurrency=4)
    concurrency = 1 if kind == "sync" else 4
    return Pipeline(range(100)).map(fail, concurrency=concurrency)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["source", "sync", "sync-concurrent", "async"])
@pytest.mark.parametrize("exc_type", _BASE_EXCEPTIONS)
def test_a_base_exception_in_a_stage_ends_for_as_itself(
    kind: str, exc_type: type[BaseException]
) -> None:
    seen: list[int] = []
    with pytest.raises(exc_type) as info:
        for x in _build(kind, exc_type):
            seen.append(x)
    assert str(info.value) == "from a stage"
    assert any("asyncflow: stage" in n for n in info.value.__notes__)
    assert 5 not in seen and len(seen) <= 5


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["source", "sync-concurrent", "async"])
@pytest.mark.parametrize("exc_type", _BASE_EXCEPTIONS)
async def test_a_base_exception_in_a_stage_ends_async_for_as_itself(
    kind: str, exc_type: type[BaseException]
) -> None:
    with pytest.raises(exc_type):
        async for _ in _build(kind, exc_type):
            pass


@pytest.mark.timeout(30)
def test_a_failing_clean_up_still_ends_the_consumers_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from asyncflow.workers import WorkerPool

    shutdown = WorkerPool.shutdown

    def broken(self: WorkerPool, timeout: float) -> list[str]:
        shutdown(self, timeout)
        raise RuntimeError("clean-up broke")

    monkeypatch.setattr(WorkerPool, "shutdown", broken)
    with pytest.raises(PipelineError, match="Boom: at 3"):
        for _ in Pipeline(range(10), name="fragile").map(_raise_boom_at_3):
            pass
    assert list(Pipeline(range(3), name="fragile").map(lambda x: x)) == [0, 1, 2]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'fragile'" in r.getMessage() and "clean-up broke" in r.getMessage()
               for r in warnings)


def _raise_boom_at_3(x: int) -> int:
    if x == 3:
        raise Boom("at 3")
    return x


# -- an exhausted failure budget is a named error that carries the failures -----------------


def test_an_exhausted_budget_raises_failure_budget_exceeded_with_the_failures() -> None:
    def fail_first(x: int) -> int:
        if x == 0:
            raise Boom("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
        return x

    # 1 of 10 failed = 10% > 5%: within the grace mid-run, over the budget at the end.
    with pytest.raises(PipelineError) as info:
        list(Pipeline(range(10)).map(fail_first, name="f", max_failures=0.05))
    [exceeded] = info.value.exceptions
    assert isinstance(exceeded, FailureBudgetExceeded) and isinstance(exceeded, AsyncflowError)
    assert exceeded.stage == "f" and "over the budget" in str(exceeded)
    assert [(r.stage, r.item, r.error_type) for r in exceeded.failures] == [("f", "0", "Boom")]
    assert "wJalr" not in exceeded.failures[0].message


def test_an_epoch_where_every_item_failed_is_a_failure_budget_exceeded() -> None:
    def always(x: int) -> int:
        raise Boom(str(x))

    with pytest.raises(PipelineError) as info:
        list(Pipeline(range(5), max_failures=1000).map(always))
    [exceeded] = [e for e in info.value.exceptions if isinstance(e, FailureBudgetExceeded)]
    assert len(exceeded.failures) == 5


def test_the_run_checks_every_stages_budget_at_its_end() -> None:
    # unbatch and a custom stage count failures with item_failed and never checked the end
    # themselves: the run does, for every stage, as it did for map, flat_map and assemble
    with pytest.raises(PipelineError) as info:
        list(Pipeline([1, 2, 3], max_failures=1000).unbatch(name="split"))
    [exceeded] = info.value.exceptions
    assert isinstance(exceeded, FailureBudgetExceeded) and exceeded.stage == "split"
    assert "every one of its 3 items failed" in str(exceeded)

    class SkipThree:
        def __init__(self, ctx: NodeContext) -> None:
            self.ctx = ctx

        async def run(self, inp: Receiver | None, out: Sender) -> None:
            assert inp is not None
            while items := await inp.get_many(16):
                self.ctx.counters.items_in += len(items)
                for item in items:
                    if item == 3:
                        self.ctx.item_failed(item, Boom(str(item)))
                    else:
                        await out.put(item)
                        self.ctx.produced()

    def skip_three(budget: float) -> Pipeline[int]:
        spec = CustomSpec(label="skip", factory=SkipThree, items_per_output=1)
        return Pipeline(range(10), max_failures=budget).with_stage(spec)

    assert list(skip_three(0.1)) == [0, 1, 2, 4, 5, 6, 7, 8, 9]  # 1 of 10: within 10%
    # 1 of 10 = 10% > 5%: within the grace mid-run, over the budget at the end
    with pytest.raises(PipelineError) as info:
        list(skip_three(0.05))
    [exceeded] = info.value.exceptions
    assert exceeded.stage == "skip" and "over the budget" in str(exceeded)


def test_unbatch_counts_an_item_whose_iteration_fails_against_the_budget() -> None:
    # Only a TypeError (not iterable) was the item's failure: an item whose iteration raised
    # anything else (a lazy batch whose read fails) ended the run, whatever the budget
    def lazy(rows: int):
        yield from range(rows)
        raise Boom(f"row {rows} unreadable")

    out = list(Pipeline([[1, 2], lazy(3), 7, [3]], max_failures=2).unbatch(name="rows"))
    assert out == [1, 2, 3]
    with pytest.raises(PipelineError, match=r"rows.*Boom: row 3 unreadable"):
        list(Pipeline([[1, 2], lazy(3)]).unbatch(name="rows"))
