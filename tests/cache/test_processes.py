"""Crash safety and concurrency across processes: a killed writer, racing fillers, readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from asyncflow.cache._format import leftovers
from asyncflow.cache._lock import WriterLock
from asyncflow.cache._reader import Reader

from ._proc import digest_of, make_batch

PROC = Path(__file__).with_name("_proc.py")
COUNT = 30
EXPECTED = digest_of(make_batch(i) for i in range(COUNT))


def start(path: Path, *, delay: float = 0.0, ready_after: int = -1, wait: bool = False,
          count: int = COUNT) -> subprocess.Popen[str]:
    args = [sys.executable, str(PROC), str(path), str(count), str(delay), str(ready_after)]
    return subprocess.Popen([*args, *(["wait"] if wait else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_writer_killed_midway_leaves_no_cache_and_the_next_run_rebuilds(
    tmp_path: Path, leak_check: None
) -> None:
    path = tmp_path / "c"
    writer = start(path, delay=0.05, ready_after=12)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while not any((d / "field0.npy").exists() for d in leftovers(path)):
        assert time.monotonic() < deadline, "the writer wrote nothing"
        time.sleep(0.01)
    os.kill(writer.pid, signal.SIGKILL)
    writer.communicate(timeout=10)
    assert writer.returncode == -signal.SIGKILL
    assert not path.exists()  # nothing published
    assert leftovers(path) and WriterLock(path).holder() is None  # the kernel dropped the lock

    rebuild = finish(start(path))
    assert rebuild["digest"] == EXPECTED and rebuild["made"] == COUNT
    assert any("did not finish; rebuilding" in m for m in rebuild["log"]), rebuild["log"]
    assert any("written" in m for m in rebuild["log"])
    assert leftovers(path) == []

    replayed = finish(start(path))
    assert replayed["digest"] == EXPECTED and replayed["made"] == 0


@pytest.mark.parametrize("wait", [False, True], ids=["read-upstream", "wait"])
def test_racing_processes_write_once_and_all_see_the_same_data(
    tmp_path: Path, leak_check: None, wait: bool
) -> None:
    path = tmp_path / "c"
    procs = [start(path, delay=0.01, wait=wait) for _ in range(4)]
    results = [finish(p) for p in procs]
    assert all(r["digest"] == EXPECTED for r in results)
    writers = [r for r in results if any(m.endswith("items") and "written" in m for m in r["log"])]
    assert len(writers) == 1, [r["log"] for r in results]
    others = [r for r in results if r is not writers[0]]
    # the others started while the writer held the lock, or after it had committed
    for r in others:
        assert r["made"] in (0, COUNT)
        if r["made"] == COUNT:  # read upstream meanwhile
            assert not wait and any("being written by process" in m for m in r["log"])
    if wait:
        assert all(r["made"] == 0 for r in others)
    assert Reader.open(path).count == COUNT * 4


def test_concurrent_readers_replay_the_same_cache(tmp_path: Path, leak_check: None) -> None:
    path = tmp_path / "c"
    assert finish(start(path, count=400))["made"] == 400
    expected = digest_of(make_batch(i) for i in range(400))
    readers = [start(path, count=400) for _ in range(6)]
    results = [finish(p) for p in readers]
    assert all(r["digest"] == expected and r["made"] == 0 for r in results)
    assert all(not r["log"] for r in results)  # nothing to say: the cache was used


def test_lock_is_exclusive_across_processes_and_dies_with_its_holder(
    tmp_path: Path, leak_check: None
) -> None:
    path = tmp_path / "c"
    code = (
        "import sys, time; from pathlib import Path; from asyncflow.cache._lock import "
        "WriterLock; lock = WriterLock(Path(sys.argv[1])); assert lock.acquire(); "
        "print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = WriterLock(path)
        assert not lock.acquire()
        assert lock.holder() == holder.pid
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    assert lock.acquire()
    lock.release()
