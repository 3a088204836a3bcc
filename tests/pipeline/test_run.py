"""The consumer's handle on a run (``Run``): what it keeps once the run has ended."""

from __future__ import annotations

import asyncio
import gc
import time
import traceback
import weakref
from typing import Any

import pytest

from asyncflow import Pipeline, PipelineError, Processes, StallError
from tests.conftest import _children

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(120)]


class Heavy:
    """A stage function holding a large resource (as image.folder's decoder holds slabs)."""

    def __init__(self) -> None:
        self.buffer = bytearray(8 << 20)

    def __call__(self, x: int) -> int:
        return fail_at_50(x)


def fail_at_50(x: int) -> int:
    if x == 50:
        raise ValueError(f"bad item {x}")
    return x


_WORKERS: dict[str, Any] = {
    "threads": "threads",
    "persistent processes": Processes(persistent=True),
}


def _gone(ref: weakref.ref[Any], limit: float = 5.0) -> bool:
    deadline = time.monotonic() + limit
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    return ref() is None


def _frames(exc: BaseException) -> list[Any]:
    """Every frame in the tracebacks of ``exc``, its groups, causes and contexts."""
    frames, todo, seen = [], [exc], set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
    return frames


@pytest.mark.parametrize("workers", list(_WORKERS))
def test_a_kept_pipeline_error_keeps_nothing_of_the_run(workers: str) -> None:
    before = _children()
    pipe = Pipeline(range(200)).map(fail_at_50, workers=_WORKERS[workers], name="heavy")
    refs = [weakref.ref(pipe), weakref.ref(pipe._pools)]
    kept: PipelineError | None = None
    try:
        for _ in pipe:
            pass
    except PipelineError as exc:
        kept = exc
    assert kept is not None
    del pipe
    # the pipeline and its persistent workers go with the last reference to the pipeline,
    # though the error is kept
    assert all(_gone(ref) for ref in refs)
    deadline = time.monotonic() + 5.0
    while (_children() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _children() - before  # the persistent workers stopped
    # the run's frames hold nothing (image.folder's decoder, which holds the batch slabs,
    # is one's local); the consumer's hold the handle (which has let go of the run) and the
    # hand-off; the kept error still tells the whole story
    ours = [f for f in _frames(kept) if "/asyncflow/" in f.f_code.co_filename]
    holding = {f.f_code.co_filename.rsplit("/", 1)[1] for f in ours if f.f_locals}
    assert len(ours) > len(holding) and holding <= {"_run.py", "_bridge.py", "_channel.py"}
    handles = [f.f_locals["self"] for f in ours if f.f_code.co_name == "__next__"]
    assert handles and all(h._rt is None and h._make_runtime is None for h in handles)
    text = "".join(traceback.format_exception(kept))
    assert "bad item 50" in text and "stage 'heavy'" in text
    if workers == "threads":
        assert "in fail_at_50" in text  # the user's frame, with its line


def test_a_closed_run_keeps_its_figures_not_its_pipeline() -> None:
    pipe = Pipeline(range(40)).map(Heavy())
    run = pipe.open()
    assert [next(run) for _ in range(3)] == [0, 1, 2]
    run.close()
    refs = [weakref.ref(pipe.stages[0].fn), weakref.ref(pipe)]
    del pipe
    assert all(_gone(ref) for ref in refs)
    assert run.delivered == 3
    assert run.stats().stages[0].items_out >= 3
    assert run.epoch == 0 and run.lineage is None and run.failure_records() == [[], []]


def test_a_stall_error_names_the_busiest_stage_only_when_one_is_known() -> None:
    # With no stage busy enough to name, `for` said "(stats: None is the busiest stage)";
    # `async for` never named it, even when one was
    async def late() -> Any:
        yield 1
        await asyncio.sleep(3)
        yield 2

    with pytest.raises(StallError) as info:
        for _ in Pipeline(late).open(timeout=0.3):
            pass
    assert "None" not in str(info.value)

    def slow(x: int) -> int:
        time.sleep(2.0 if x == 1 else 0)
        return x

    async def consume() -> None:
        async for _ in Pipeline(range(3), stop_timeout=3).map(slow).open(timeout=0.3):
            pass

    with pytest.raises(StallError, match="'slow' is the busiest stage"):
        asyncio.run(consume())
