"""Shared fixtures. ``leak_check`` fails a test that leaves anything running behind."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

#: Set in the interpreter a ``fresh_process`` test runs in (see :func:`pytest_pyfunc_call`).
FRESH_PROCESS = "ASYNCFLOW_TEST_FRESH_PROCESS"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked ``fresh_process`` runs in a new interpreter of its own (``pytest`` on its
    node id), and passes or fails as it does there. Forking worker processes needs a process
    where no other Python thread runs, which a long session cannot promise: servers, monitors
    and the loaders of earlier tests may still be running or stopping."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(FRESH_PROCESS):
        return None
    done = subprocess.run(
        [sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-p", "no:cacheprovider"],
        cwd=pyfuncitem.config.rootpath, env={**os.environ, FRESH_PROCESS: "1"},
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid} failed in a fresh process (pytest exit "
                    f"{done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}",
                    pytrace=False)
    return True


@pytest.fixture(scope="session", autouse=True)
def _warm_process_wide_resources() -> None:
    """Create once what libraries keep for the whole process (libuv's signal pipe, the
    default selector), so that ``leak_check`` does not count them against the first test."""
    try:
        import uvloop
    except ImportError:
        pass
    else:
        uvloop.new_event_loop().close()
    asyncio.new_event_loop().close()
    # The forkserver lives as long as the process, like the selector above: start it now so
    # that the first test that starts worker processes is not charged with it.
    # Its preload list (asyncflow's worker module, NumPy, PIL, torch) makes a worker start in
    # milliseconds.
    from multiprocessing import forkserver

    import asyncflow.torch  # noqa: F401  (the tensor reducer: torch is preloaded too)
    from asyncflow.workers import Processes, _boot

    # (a boot pickle naming torch: the server preloads it, since the tests start workers often)
    _boot.start_context(Processes(), b"torch")
    forkserver.ensure_running()


def _fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _children() -> set[int]:
    """Every descendant process (workers forked by the forkserver are grandchildren)."""
    pids: set[int] = set()
    todo = ["self"]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    found = [int(p) for p in fh.read().split()]
            except OSError:
                continue
            pids.update(found)
            todo.extend(str(p) for p in found)
    return pids


def _segments() -> set[str]:
    """Our shared-memory segments (``/dev/shm/asyncflow-<pid>-...``) of this process."""
    from asyncflow.workers import SHM_DIR

    mine = f"asyncflow-{os.getpid()}-"
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(mine)}
    except OSError:
        return set()


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def _describe_threads(idents: set[int]) -> list[str]:
    return [t.name for t in threading.enumerate() if t.ident in idents]


@pytest.fixture
def leak_check() -> Iterator[None]:
    """Fail the test if it leaves threads, child processes, descriptors or tasks behind.

    Stopping is asynchronous in places (a garbage-collected run stops itself on its own
    thread), so the check waits up to a few seconds for things to settle before failing.
    """
    gc.collect()
    threads, fds, children, segments = _threads(), _fds(), _children(), _segments()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    yield
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        extra_threads = _threads() - threads
        extra_fds = _fds() - fds
        extra_children = _children() - children
        extra_segments = _segments() - segments
        if not (extra_threads or extra_fds or extra_children or extra_segments) or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(0.02)
    problems = []
    if extra_segments:
        problems.append(f"shared-memory segments left: {sorted(extra_segments)}")
    if extra_threads:
        problems.append(f"threads left running: {_describe_threads(extra_threads)}")
    if extra_children:
        problems.append(f"child processes left: {sorted(extra_children)}")
    if extra_fds:
        described = []
        for fd in sorted(extra_fds):
            try:
                described.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:
                continue
        if described:
            problems.append(f"descriptors left open: {described}")
    if loop is not None:
        pending = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task(loop)]
        pending = [t for t in pending if not t.done()]
        if pending:
            problems.append(f"asyncio tasks left pending: {pending}")
    if problems:
        pytest.fail("; ".join(problems))


@pytest.fixture
async def async_leak_check() -> object:
    """``leak_check`` for async tests: also fails on tasks left pending on the test's loop."""
    gc.collect()
    loop = asyncio.get_running_loop()
    before = set(asyncio.all_tasks(loop))
    threads, fds, children, segments = _threads(), _fds(), _children(), _segments()
    yield None
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        pending = [
            t for t in asyncio.all_tasks(loop)
            if t not in before and t is not asyncio.current_task() and not t.done()
        ]
        extra_threads = _threads() - threads
        extra_fds = _fds() - fds
        extra_children = _children() - children
        extra_segments = _segments() - segments
        if not (pending or extra_threads or extra_fds or extra_children or extra_segments):
            return
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    pytest.fail(
        f"left behind: tasks={pending} threads={_describe_threads(extra_threads)} "
        f"children={sorted(extra_children)} fds={sorted(extra_fds)} "
        f"segments={sorted(extra_segments)}"
    )


@pytest.fixture
def as_worker() -> Iterator[None]:
    """This process allocates segments as a worker process does (``shm.allocate``), under
    names only the test uses, swept after it."""
    import itertools

    from asyncflow.workers import _segments

    count = itertools.count()
    _segments.allocate_as(lambda: f"asyncflow-{os.getpid()}-alloctest-{next(count)}")
    try:
        yield
    finally:
        _segments.allocate_as(None)
        _segments._made.clear()
        _segments.sweep(f"asyncflow-{os.getpid()}-alloctest-")
