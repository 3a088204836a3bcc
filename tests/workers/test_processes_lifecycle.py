"""Worker processes' lifetime: deaths, persistent workers, stopping, Ctrl-C, interpreter exit."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from asyncflow import Pipeline, PipelineError, Processes, WorkerError, worker_info
from asyncflow.workers import ProcessPool, _segments
from tests.conftest import _children
from tests.doubles import ROOT, child_env

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(60)]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan may wait a while for a container's init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: Iterable[int], limit: float) -> list[int]:
    deadline = time.monotonic() + limit
    while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def _segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir(_segments.SHM_DIR) if n.startswith(f"asyncflow-{pid}-")]


def _run_script(tmp_path: Path, text: str) -> subprocess.Popen[str]:
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(script)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT, start_new_session=True,
    )


def _communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # show where it hangs: faulthandler dumps on SIGABRT
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"still running after {timeout} s; its threads:\n{err[-8000:]}")
    return out, err, time.monotonic() - start


# -- 6. a worker that dies ---------------------------------------------------------------------


def die_on_five(x: int) -> tuple[int, int, int]:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    info = worker_info()
    assert info is not None
    time.sleep(0.002)
    return x, info.id, os.getpid()


def test_killed_worker_fails_the_run_naming_worker_stage_and_item() -> None:
    pipe = Pipeline(range(40)).map(die_on_five, concurrency=3, workers="processes",
                                   name="fragile")
    with pytest.raises(PipelineError) as info:
        list(pipe)
    [error] = [e for e in _leaves(info.value) if isinstance(e, WorkerError)]
    message = str(error)
    assert "worker" in message and "'fragile'" in message and "item 5" in message
    assert "SIGKILL" in message


@pytest.mark.parametrize("concurrency", [1, 3])
def test_killed_worker_under_a_budget_loses_only_its_item_and_is_replaced(
    concurrency: int, caplog: pytest.LogCaptureFixture,
) -> None:
    pipe = Pipeline(range(60), max_failures=1).map(
        die_on_five, concurrency=concurrency, workers="processes", name="fragile"
    )
    with caplog.at_level(logging.WARNING, logger="asyncflow"):
        out = list(pipe)
    assert Counter(x for x, _, _ in out) == Counter(x for x in range(60) if x != 5)
    [stage] = [s for s in pipe.stats().stages if s.name == "fragile"]
    assert stage.failures == 1
    [record] = stage.failed_items
    assert record.error_type == "WorkerError" and "item 5" in record.message
    assert "replaced" in caplog.text
    if concurrency == 1:  # the one worker died: a second process with the same number went on
        assert {wid for _, wid, _ in out} == {0}
        assert len({pid for _, _, pid in out}) == 2


async def test_work_submitted_while_the_only_worker_is_replaced_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_spawn = ProcessPool._spawn

    def slow_replacement(self: ProcessPool, wid: int) -> Any:
        if self._reader is not None:  # started: this is a replacement
            time.sleep(1.0)
        return real_spawn(self, wid)

    monkeypatch.setattr(ProcessPool, "_spawn", slow_replacement)
    pool = ProcessPool(die_on_five, 1, Processes(seed=1), "solo")
    await asyncio.to_thread(pool.start)
    try:
        async with asyncio.timeout(30):
            doomed = pool.submit([5], 0, 0)
            while pool.deaths == 0:  # the reader thread is now starting the replacement
                await asyncio.sleep(0.01)
            later = pool.submit([1], 1, 0)
            (values, failures, _), (values2, failures2, _) = await asyncio.gather(doomed, later)
    finally:
        await asyncio.to_thread(pool.shutdown)
    assert len(values) == 1 and isinstance(failures[0][1], WorkerError)
    assert failures2 == [] and values2[0][0] == 1


def init_raises(info: Any) -> None:
    raise RuntimeError(f"no GPU for worker {info.id}")


def init_exits(info: Any) -> None:
    os._exit(3)


@pytest.mark.parametrize(("init", "expected"), [
    (init_raises, ["could not start", "RuntimeError: no GPU for worker", "init_raises"]),
    (init_exits, ["died while starting", "exit code 3"]),
], ids=["raises", "exits"])
def test_worker_that_dies_at_start_is_a_clear_worker_error(init: Any, expected: list[str]) -> None:
    pipe = Pipeline(range(10)).map(abs, concurrency=2, workers=Processes(init=init),
                                   name="boot")
    start = time.monotonic()
    with pytest.raises(PipelineError) as info:
        list(pipe)
    assert time.monotonic() - start < 20
    errors = [e for e in _leaves(info.value) if isinstance(e, WorkerError)]
    assert errors, _leaves(info.value)
    assert "'boot'" in str(errors[0])
    for text in expected:
        assert text in str(errors[0])


def exits_on_three(x: int) -> int:
    if x == 3:
        raise SystemExit(3)
    return x


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_system_exit_in_the_function_ends_the_loop(workers: str) -> None:
    with pytest.raises(SystemExit):
        list(Pipeline(range(10)).map(exits_on_three, concurrency=2, workers=workers))


# -- 8. persistent workers ---------------------------------------------------------------------


def slow_pid(x: int) -> int:
    time.sleep(0.005)
    return os.getpid()


def test_persistent_workers_live_across_epochs_and_stop_when_the_pipeline_is_collected() -> None:
    pipe = Pipeline(range(40)).map(slow_pid, concurrency=2,
                                   workers=Processes(persistent=True))
    first, second = set(pipe), set(pipe)
    assert second <= first and len(first) == 2
    assert all(_running(pid) for pid in first)  # between epochs too
    del pipe
    gc.collect()
    assert _wait_gone(first, 5.0) == []


def test_non_persistent_workers_are_new_each_epoch() -> None:
    pipe = Pipeline(range(40)).map(slow_pid, concurrency=2, workers="processes")
    first = set(pipe)
    assert _wait_gone(first, 5.0) == []  # they stop with their run
    second = set(pipe)
    assert first.isdisjoint(second)


EXIT_SCRIPT = """
import os, time
import numpy as np
from asyncflow import Pipeline, Processes

def work(x):
    return os.getpid(), np.zeros(100_000)

def stuck(x):
    if x >= 2:
        time.sleep(1000)
    return os.getpid(), None

if __name__ == "__main__":
    pipe = Pipeline(range(50)).map(work, concurrency=2, workers=Processes(persistent=True))
    pids = {pid for pid, _ in pipe}
    # and a run of another pipeline, started and never stopped
    it = iter(Pipeline(range(10**6)).map(work, concurrency=2, workers="processes"))
    pids.update(next(it)[0] for _ in range(20))
    # and one whose workers are stuck in the function
    stuck_it = iter(Pipeline(range(100)).map(stuck, concurrency=2, workers="processes"))
    pids.update(next(stuck_it)[0] for _ in range(2))
    print(*sorted(pids), flush=True)
    # exits with the workers of all three running
"""


def test_persistent_workers_and_an_unstopped_run_stop_at_interpreter_exit(
    tmp_path: Path,
) -> None:
    proc = _run_script(tmp_path, EXIT_SCRIPT)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]  # the script's last line
    _, err, elapsed = _communicate(proc, timeout=30)
    assert proc.returncode == 0, err
    assert elapsed < 10.0
    assert len(pids) >= 3 and _wait_gone(pids, 10.0) == []
    assert _segments_of(proc.pid) == []
    assert "Exception ignored" not in err and "Traceback" not in err, err


# -- 9. stopping -------------------------------------------------------------------------------


def _workers(before: set[int]) -> set[int]:
    found = _children() - before
    assert found, "no worker process was running"
    return found


def test_break_after_three_items_stops_the_workers() -> None:
    before = _children()
    pipe = Pipeline(range(10_000)).map(slow_pid, concurrency=3, workers="processes")
    for i, _ in enumerate(pipe):
        if i == 2:
            workers = _workers(before)
            break
    assert _wait_gone(workers, 3.0) == []


def test_an_exception_in_the_consumer_stops_the_workers() -> None:
    before = _children()
    with pytest.raises(KeyError):
        for _ in Pipeline(range(10_000)).map(slow_pid, concurrency=3, workers="processes"):
            workers = _workers(before)
            raise KeyError("consumer")
    assert _wait_gone(workers, 3.0) == []


def test_del_of_the_iterator_and_gc_stops_the_workers() -> None:
    before = _children()
    it = iter(Pipeline(range(10_000)).map(slow_pid, concurrency=3, workers="processes"))
    next(it)
    next(it)
    workers = _workers(before)
    del it
    gc.collect()
    assert _wait_gone(workers, 3.0) == []


def test_persistent_workers_after_a_break_serve_the_next_epoch_whole() -> None:
    pipe = Pipeline(range(60)).map(slow_pid, concurrency=2, ordered=False,
                                   workers=Processes(persistent=True))
    for i, _ in enumerate(pipe):
        if i == 2:
            break
    assert len(list(pipe)) == 60
    pipe2 = Pipeline(range(60)).map(abs, concurrency=2, ordered=False,
                                    workers=Processes(persistent=True))
    for i, _ in enumerate(pipe2):
        if i == 2:
            break
    assert Counter(pipe2) == Counter(range(60))
    del pipe, pipe2
    gc.collect()


async def test_break_out_of_async_for_stops_the_workers() -> None:
    before = _children()
    i = 0
    async for _ in Pipeline(range(10_000)).map(slow_pid, concurrency=2, workers="processes"):
        i += 1
        if i == 3:
            workers = _workers(before)
            break
    async with asyncio.timeout(3.0):
        while any(_running(p) for p in workers):
            await asyncio.sleep(0.02)


def stuck_on_four(x: int) -> int:
    if x == 4:
        time.sleep(1000)
    return x


def test_a_worker_stuck_in_its_function_is_terminated_within_stop_timeout() -> None:
    before = _children()
    pipe = Pipeline(range(100), stop_timeout=1.0).map(
        stuck_on_four, concurrency=2, ordered=False, workers="processes"
    )
    got = []
    for x in pipe:
        got.append(x)
        if len(got) == 3:
            workers = _workers(before)
            start = time.monotonic()
            break
    assert _wait_gone(workers, 1.0 + 3.0) == []
    assert time.monotonic() - start < 1.0 + 3.0


SIGINT_SCRIPT = """
import os, signal, time
import numpy as np
from asyncflow import Pipeline

# Ctrl-C raises KeyboardInterrupt, as in a terminal, even when the tests run as a background
# job (a shell without job control starts those with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

def work(x):
    time.sleep(0.002)
    return os.getpid(), np.zeros(100_000)  # 800 KB: through shared memory

if __name__ == "__main__":
    pipe = Pipeline(range(10**6)).map(work, concurrency=2, workers="processes")
    pids = set()
    for i, (pid, _) in enumerate(pipe):
        pids.add(pid)
        if i == 50:
            print(*sorted(pids), flush=True)
"""


@pytest.mark.parametrize("target", ["process", "group"])  # group: what a terminal's Ctrl-C does
def test_ctrl_c_in_a_child_ends_it_cleanly(tmp_path: Path, target: str) -> None:
    proc = _run_script(tmp_path, SIGINT_SCRIPT)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, proc.stderr.read() if proc.stderr else ""
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)  # the workers and the forkserver get it too
        else:
            proc.send_signal(signal.SIGINT)
        _, err, elapsed = _communicate(proc, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert elapsed < 5.0
    assert proc.returncode != 0
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "KeyboardInterrupt" in err
    for noise in ("Exception ignored", "Task was destroyed", "never retrieved", "leaked"):
        assert noise not in err, err
    assert _wait_gone(pids, 5.0) == []
    assert _segments_of(proc.pid) == []
