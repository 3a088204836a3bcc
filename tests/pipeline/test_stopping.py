"""Stopping (RELIABILITY 6-11): break, del, zip, Ctrl-C, stuck C code, exit, full queues."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
import time
from typing import Any

import pytest

from asyncflow import Pipeline, PipelineError
from tests.doubles import run_child, start_child

pytestmark = pytest.mark.usefixtures("leak_check")


def slow(x: int) -> int:
    time.sleep(0.01)
    return x


async def aslow(x: int) -> int:
    await asyncio.sleep(0.01)
    return x


def _asyncflow_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("asyncflow")]


def _wait_no_threads(limit: float = 1.0) -> None:
    deadline = time.monotonic() + limit
    while _asyncflow_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _asyncflow_threads(), _asyncflow_threads()


def test_break_out_of_for_stops_everything_within_a_second() -> None:
    for i, _ in enumerate(Pipeline(range(10_000)).map(slow, concurrency=8)):
        if i == 2:
            break
    _wait_no_threads()


async def test_break_out_of_async_for_stops_everything_within_a_second() -> None:
    i = 0
    async for _ in Pipeline(range(10_000)).map(aslow, concurrency=64).map(slow, concurrency=4):
        i += 1
        if i == 3:
            break
    deadline = time.monotonic() + 1.0
    while _asyncflow_threads() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not _asyncflow_threads()


def test_del_and_gc_of_a_started_iterator_stops_it() -> None:
    it = iter(Pipeline(range(10_000)).map(slow, concurrency=4))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    del it
    gc.collect()
    _wait_no_threads()


def test_partial_consumption_through_zip_stops_the_longer_pipeline() -> None:
    short = Pipeline(range(3))
    long = Pipeline(range(10_000)).map(slow, concurrency=4)
    assert list(zip(short, long, strict=False)) == [(0, 0), (1, 1), (2, 2)]
    gc.collect()
    _wait_no_threads()


def test_with_open_stops_on_exit_and_on_exception() -> None:
    pipe = Pipeline(range(10_000)).map(slow, concurrency=4)
    with pipe.open() as run:
        assert next(run) == 0
    assert run.closed
    assert not _asyncflow_threads()
    with pytest.raises(KeyError), pipe.open() as run:
        next(run)
        raise KeyError("consumer failed")
    assert not _asyncflow_threads()


async def test_async_with_open_stops_on_exit() -> None:
    pipe = Pipeline(range(10_000)).map(aslow, concurrency=16)
    async with pipe.open() as run:
        assert await run.__anext__() == 0
    assert not _asyncflow_threads()


def test_close_before_start_is_fine() -> None:
    run = Pipeline(range(10)).open()
    run.close()
    assert list(run) == []


def test_stopping_while_every_queue_is_full_returns_within_a_second() -> None:
    pipe = Pipeline(range(100_000)).map(lambda x: x).map(lambda x: x, buffer=4).batch(2)
    with pipe.open() as run:
        next(run)
        time.sleep(0.3)  # every queue fills, every producer blocks
        stats = run.stats()
        assert stats.stages[0].queue_fill == stats.stages[0].queue_capacity
        start = time.monotonic()
        run.close()
        assert time.monotonic() - start < 1.0


def test_a_stage_stuck_in_c_code_is_abandoned_named_and_does_not_block_exit() -> None:
    result = run_child(
        """
        import time, logging, sys
        from asyncflow import Pipeline
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
        def stuck(x):
            time.sleep(60)   # C code: cannot be interrupted
            return x
        pipe = Pipeline(range(10), stop_timeout=0.5).map(stuck, name="stuck-stage")
        with pipe.open() as run:
            time.sleep(0.3)  # open() started the run: the stage is now stuck in sleep()
            start = time.monotonic()
        print("closed after", round(time.monotonic() - start, 2))
        print("notes:", pipe.stats().notes)
        print("abandoned:", [s.name for s in pipe.stats().stages if s.abandoned])
        """,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    closed_after = float(out.split("closed after")[1].split()[0])
    assert closed_after < 5.0
    assert "stuck-stage" in out.split("abandoned:")[1]
    assert "was abandoned" in out
    assert "Exception ignored" not in result.stderr


def test_process_holding_an_unstopped_pipeline_exits_cleanly() -> None:
    start = time.monotonic()
    result = run_child(
        """
        import time
        from asyncflow import Pipeline
        def slow(x):
            time.sleep(0.01)
            return x
        it = iter(Pipeline(range(10**6)).map(slow, concurrency=4))
        print(next(it), next(it))
        """,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 10
    assert result.stdout.split() == ["0", "1"]
    for noise in ("Exception ignored", "Task was destroyed", "never retrieved", "Traceback"):
        assert noise not in result.stderr, result.stderr


SIGINT_SCRIPT = """
import asyncio, signal, sys, time
from asyncflow import Pipeline

# Ctrl-C raises KeyboardInterrupt, as in a terminal, also when the tests run as a background
# job: a shell without job control starts those with SIGINT ignored, and children inherit it.
signal.signal(signal.SIGINT, signal.default_int_handler)

async def fetch(x):
    await asyncio.sleep(0.005)
    return x

def decode(x):
    time.sleep(0.005)
    return x

pipe = Pipeline(range(10**7)).map(fetch, concurrency=32).map(decode, concurrency=2).batch(4)

def sync_main():
    for i, _ in enumerate(pipe):
        if i == 2:
            print("ready", flush=True)

async def async_main():
    i = 0
    async for _ in pipe:
        i += 1
        if i == 3:
            print("ready", flush=True)

if sys.argv[-1] == "async":
    asyncio.run(async_main())
else:
    sync_main()
"""


@pytest.mark.parametrize("style", ["sync", "async"])
@pytest.mark.timeout(60)
def test_ctrl_c_ends_iteration_within_five_seconds(style: str) -> None:
    import subprocess
    import sys

    from tests.doubles import ROOT, child_env

    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", SIGINT_SCRIPT, style],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # show where it hangs: faulthandler dumps on SIGABRT
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"still running 10 s after Ctrl-C; its threads:\n{err[-8000:]}")
        assert time.monotonic() - start < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    for noise in ("Exception ignored", "Task was destroyed", "never retrieved"):
        assert noise not in err, err


def test_no_task_or_thread_noise_when_a_stage_fails_while_others_run() -> None:
    result = run_child(
        """
        import asyncio, time, gc
        from asyncflow import Pipeline, PipelineError
        async def fetch(x):
            await asyncio.sleep(0.001 * (x % 7))
            if x == 50:
                raise ValueError("bad")
            return x
        try:
            pipe = Pipeline(range(1000)).map(fetch, concurrency=32).map(lambda x: x, concurrency=4)
            for _ in pipe:
                pass
        except PipelineError as exc:
            print("raised", type(exc.exceptions[0]).__name__)
        gc.collect()
        time.sleep(0.2)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "raised ValueError" in result.stdout
    for noise in ("Exception ignored", "Task was destroyed", "never retrieved", "Traceback"):
        assert noise not in result.stderr, result.stderr


def test_rerunning_ten_times_adds_no_threads() -> None:
    pipe = Pipeline(range(100)).map(slow, concurrency=4)
    before = threading.active_count()
    for _ in range(10):
        for i, _ in enumerate(pipe):
            if i == 5:
                break
    gc.collect()
    _wait_no_threads()
    assert threading.active_count() == before


def test_start_child_helper_is_usable() -> None:
    proc = start_child("print('hi')")
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "hi"


async def test_cancelling_the_consuming_task_stops_the_run() -> None:
    async def consume(pipe: Pipeline) -> None:
        async for _ in pipe:
            pass

    async def never(x: int) -> int:
        await asyncio.sleep(3600)
        return x

    task = asyncio.create_task(consume(Pipeline(range(10)).map(never, concurrency=2)))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 1.0
    while _asyncflow_threads() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not _asyncflow_threads()


def test_a_sync_source_generator_is_closed_when_the_run_stops_mid_read() -> None:
    closed = threading.Event()

    def source():
        try:
            for i in range(10**6):
                time.sleep(0.001)
                yield i
        finally:
            closed.set()

    with Pipeline(source).map(slow).open() as run:
        next(run)
    assert closed.wait(2.0)


def test_a_sync_source_generator_is_closed_after_break() -> None:
    closed = threading.Event()

    def source():
        try:
            yield from range(10**6)
        finally:
            closed.set()

    for i in Pipeline(source):
        if i == 5:
            break
    assert closed.wait(2.0)


# -- a stop never hides a failure that came before it -----------------------------------------


class Boom(Exception):
    pass


def _stuck_after(n: int) -> object:
    async def stuck(x: int) -> int:
        if x >= n:
            await asyncio.sleep(3600)  # until the run is stopped
        return x

    return stuck


def _fail_at(n: int) -> object:
    async def fail(x: int) -> int:
        if x == n:
            raise Boom(f"item {x}")
        return x

    return fail


def _wait_for(condition: object, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    assert condition()  # type: ignore[operator]


@pytest.mark.timeout(30)
def test_a_failure_before_a_stop_reaches_a_consumer_still_waiting() -> None:
    # The stage after "stuck" fails on item 0 while "stuck" still runs: the run has failed
    # but not ended when another thread stops it; the consumer waiting in `for` gets the error.
    pipe = Pipeline(range(10)).map(_stuck_after(1), name="stuck").map(_fail_at(0), name="f")
    run = pipe.open()
    got: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in run:
                pass
        except BaseException as exc:
            got.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    # The run's own record of the error (its stats show the failure a moment earlier, while
    # the error is still on its way up the failing stage).
    _wait_for(lambda: run._rt is not None and run._rt.errors)
    run.close()
    consumer.join(10)
    assert not consumer.is_alive()
    [error] = got
    assert isinstance(error, PipelineError) and "Boom: item 0" in str(error)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ended", [True, False], ids=["run-ended", "run-still-going"])
def test_break_after_a_failure_does_not_raise_but_is_noted_and_logged(
    ended: bool, caplog: pytest.LogCaptureFixture
) -> None:
    pipe = Pipeline(range(10), name="noisy").map(_fail_at(3), name="f")
    if not ended:
        pipe = Pipeline(range(10), name="noisy").map(_stuck_after(4)).map(_fail_at(3), name="f")
    with pipe.open() as run:
        for _ in run:
            _wait_for(lambda: run.stats().failures)
            if ended:
                _wait_for(lambda: not run.stats().running)
            break  # leaving the block closes the run: no error is raised here
    notes = run.stats().notes
    assert any("before it was given the run's error" in n and "Boom: item 3" in n
               for n in notes), notes
    assert any(r.levelno == logging.WARNING and "'noisy'" in r.getMessage()
               and "Boom: item 3" in r.getMessage() for r in caplog.records)
    assert list(run) == []  # a closed run yields nothing and raises nothing more


@pytest.mark.timeout(120)
def test_a_stop_from_another_thread_never_takes_the_error_from_a_waiting_consumer() -> None:
    # The race the test above can lose on a loaded machine: the other thread's close() (and
    # the run's own clean-up) used to take the pending error as "undelivered" while the
    # consumer was inside its refill, between starting the run and reading the hand-off.
    for _ in range(20):
        pipe = Pipeline(range(10)).map(_stuck_after(1), name="stuck").map(_fail_at(0), name="f")
        run = pipe.open()
        got: list[BaseException] = []

        def consume(run: Any = run, got: list[BaseException] = got) -> None:
            try:
                for _ in run:
                    pass
            except BaseException as exc:
                got.append(exc)

        consumer = threading.Thread(target=consume)
        consumer.start()
        _wait_for(lambda run=run: run._rt is not None and run._rt.errors)  # type: ignore[misc]
        run.close()
        consumer.join(10)
        assert not consumer.is_alive()
        assert len(got) == 1 and isinstance(got[0], PipelineError)
