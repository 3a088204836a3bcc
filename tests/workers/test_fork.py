"""``Processes(start_method="fork")``: workers forked from a template of the parent, built while
no other Python thread runs; nothing pickled; deaths replaced; every stop leaves nothing."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, Processes, worker_info
from asyncflow.workers._fork import fork_refusal
from tests.conftest import _children
from tests.workers.test_processes_lifecycle import _wait_gone

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(120),
              pytest.mark.fresh_process]  # fork needs a process with no other thread

FORK = Processes(start_method="fork")


class Unpicklable:
    """Data no forkserver or spawn worker could receive: it holds a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.table = {i: i * i for i in range(100)}

    def __call__(self, x: int) -> tuple[int, int, int]:
        with self.lock:
            return self.table[x], os.getpid(), os.getppid()


def test_fork_workers_need_no_pickling_and_are_not_the_parents_children() -> None:
    fn = Unpicklable()
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(fn)
    out = list(Pipeline(range(100)).map(fn, concurrency=2, workers=FORK))
    assert [v for v, _, _ in out] == [i * i for i in range(100)]
    assert os.getpid() not in {pid for _, pid, _ in out}
    # forked by the pool's template, itself a child of this process
    [template] = {ppid for _, _, ppid in out}
    assert template != os.getpid()


def _pid(x: int) -> tuple[int, int]:
    time.sleep(0.005)
    return x, os.getpid()


def test_workers_see_the_parents_data_as_it_was_when_the_run_was_built() -> None:
    box = {"value": "before"}
    pipe = Pipeline(range(4)).map(lambda _: box["value"], workers=FORK)
    it = iter(pipe)
    assert next(it) == "before"
    box["value"] = "after"  # copy-on-write: the workers keep their own pages
    assert list(it) == ["before"] * 3


def _frozen(_: int) -> int:
    return gc.get_freeze_count()


def test_forked_workers_inherit_the_parents_objects_frozen_and_the_parent_does_not() -> None:
    """A worker's collections leave the parent's objects (and so their pages) alone."""
    assert gc.get_freeze_count() == 0
    [frozen] = set(Pipeline(range(4)).map(_frozen, concurrency=2, workers=FORK))
    assert frozen > len(gc.get_objects()) // 2  # all the parent had when the run was built
    assert gc.get_freeze_count() == 0  # the parent's own collector: as it was


def test_another_python_thread_refuses_fork_naming_it() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="user-monitor")
    other.start()
    before = _children()
    try:
        assert "user-monitor" in (fork_refusal() or "")
        with pytest.raises(ConfigError, match=r"user-monitor.*deadlock.*forkserver"):
            list(Pipeline(range(4)).map(abs, workers=FORK))
    finally:
        stop.set()
        other.join()
    assert _children() - before == set()
    assert fork_refusal() is None
    assert list(Pipeline(range(4)).map(abs, workers=FORK)) == [0, 1, 2, 3]


def die_on_five(x: int) -> tuple[int, int, int]:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    info = worker_info()
    assert info is not None
    return x, info.id, os.getpid()


def test_a_killed_worker_loses_only_its_item_and_is_replaced_from_the_template(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pipe = Pipeline(range(40), max_failures=1).map(die_on_five, workers=FORK, name="fragile")
    with caplog.at_level(logging.WARNING, logger="asyncflow"):
        out = list(pipe)
    assert Counter(x for x, _, _ in out) == Counter(x for x in range(40) if x != 5)
    [stage] = [s for s in pipe.stats().stages if s.name == "fragile"]
    [record] = stage.failed_items
    assert record.error_type == "WorkerError" and "item 5" in record.message
    assert "SIGKILL" in record.message and "replaced" in caplog.text
    assert len({pid for _, _, pid in out}) == 2  # the one worker, then its replacement


def _tree(before: set[int]) -> set[int]:
    """The children this test started and theirs (the template's workers)."""
    found: set[int] = set()
    for pid in _children() - before:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                found.update(int(p) for p in fh.read().split())
        except OSError:
            continue
    return found


@pytest.mark.parametrize("how", ["break", "exception", "gc"])
def test_every_stop_ends_the_template_and_its_workers(how: str) -> None:
    before = _children()
    pipe = Pipeline(range(10_000)).map(_pid, concurrency=2, workers=FORK)
    it = iter(pipe)
    next(it)
    tree = _tree(before)
    assert len(tree) == 3  # the template and two workers
    if how == "break":
        it.close()  # type: ignore[attr-defined]
    elif how == "exception":
        with pytest.raises(KeyError):
            for _ in it:
                raise KeyError("consumer")
    del it
    gc.collect()
    assert _wait_gone(tree, 5.0) == []


def test_persistent_fork_workers_serve_every_epoch_and_stop_when_collected() -> None:
    before = _children()
    pipe = Pipeline(range(30)).map(_pid, concurrency=2,
                                   workers=Processes(start_method="fork", persistent=True))
    first = {pid for _, pid in pipe}
    tree = _tree(before)
    second = {pid for _, pid in pipe}
    assert first == second and first <= tree
    del pipe
    gc.collect()
    assert _wait_gone(tree, 5.0) == []


def test_large_results_come_back_through_shared_memory() -> None:
    np = pytest.importorskip("numpy")
    out = list(Pipeline(range(4)).map(lambda i: np.full(1 << 18, i, np.int64), workers=FORK))
    assert [int(a[0]) for a in out] == [0, 1, 2, 3] and out[0].nbytes == 1 << 21


def test_a_fork_pipeline_built_while_another_runs_is_refused_and_the_first_goes_on() -> None:
    a = iter(Pipeline(range(20)).map(_pid, workers=FORK))
    first = next(a)
    with pytest.raises(ConfigError, match="other Python thread"):  # a's loop thread runs
        next(iter(Pipeline(range(20)).map(_pid, workers=FORK)))
    assert [x for x, _ in [first, *a]] == list(range(20))


def test_two_persistent_fork_pipelines_run_at_once_once_both_have_workers() -> None:
    spec = Processes(start_method="fork", persistent=True)
    a = Pipeline(range(20)).map(_pid, workers=spec)
    b = Pipeline(range(20)).map(_pid, workers=spec)
    assert len(list(a)) == len(list(b)) == 20  # each forks its template, one after the other
    pairs = list(zip(a, b, strict=True))  # then both run at once, from their templates
    assert [(x, y) for (x, _), (y, _) in pairs] == [(i, i) for i in range(20)]
    del a, b, pairs
    gc.collect()


def test_a_worker_init_runs_in_each_forked_worker() -> None:
    seen: list[int] = []  # the parent's list: appended to in the workers' copies only

    def init(info: Any) -> None:
        seen.append(info.id)
        os.environ["FORK_INIT"] = str(info.id)

    spec = Processes(start_method="fork", init=init)
    out = list(Pipeline(range(8)).map(lambda _: os.environ.get("FORK_INIT"), concurrency=2,
                                      workers=spec))
    assert set(out) <= {"0", "1"} and seen == []


# -- fallback: fork where safe, else another start method, said in the notes --------------

FORK_OR_SERVER = Processes(start_method="fork", fallback="forkserver")


def _ppid(x: int) -> tuple[int, int]:
    return x, os.getppid()


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_a_fallback_needs_fork_and_a_start_method_that_is_never_refused() -> None:
    with pytest.raises(ConfigError, match="fallback"):
        Processes(fallback="forkserver")  # the forkserver is never refused
    with pytest.raises(ConfigError, match="fallback must be"):
        Processes(start_method="fork", fallback="fork")  # type: ignore[arg-type]


def test_a_fallback_unused_forks_and_the_notes_say_so() -> None:
    pipe = Pipeline(range(8)).map(_ppid, concurrency=2, workers=FORK_OR_SERVER, name="work")
    it = iter(pipe)
    first = next(it)
    template = first[1]  # alive while the run is: a child of this process, not the server
    assert template != os.getpid() and _parent(template) == os.getpid()
    assert "forkserver" not in _cmdline(template)
    assert {ppid for _, ppid in [first, *it]} == {template}
    assert "stage 'work': worker processes forked from this process" in pipe.stats().notes[-1]


def test_without_a_fallback_the_notes_stay_quiet() -> None:
    pipe = Pipeline(range(4)).map(abs, workers=FORK, name="work")
    assert list(pipe) == [0, 1, 2, 3]
    assert not any("forked" in note for note in pipe.stats().notes)


def _refused(monkeypatch: pytest.MonkeyPatch, reason: str) -> None:
    """The engine's own check, under the readers' gates as the pool is built, refuses: as if
    a thread had started between whatever a caller checked and the build."""
    import asyncflow.workers._fork as fork

    monkeypatch.setattr(fork, "fork_refusal", lambda: reason)


def test_a_refused_fork_falls_back_to_the_forkserver_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _refused(monkeypatch, "1 other Python thread(s) run in this process (late-starter)")
    with pytest.raises(ConfigError, match="late-starter"):  # fork alone: refused
        list(Pipeline(range(4)).map(abs, workers=FORK))
    pipe = Pipeline(range(8)).map(_ppid, concurrency=2, workers=FORK_OR_SERVER, name="work")
    out = list(pipe)
    assert [x for x, _ in out] == list(range(8))
    [server] = {ppid for _, ppid in out}
    assert "forkserver" in _cmdline(server)
    assert any(n.startswith("stage 'work': worker processes start from the forkserver, not "
                            "forked: 1 other Python thread(s) run in this process (late-")
               for n in pipe.stats().notes)


def test_a_fallback_while_a_user_thread_runs_and_fork_once_it_has_stopped() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="user-monitor")
    other.start()
    pipe = Pipeline(range(8)).map(_ppid, concurrency=2,
                                  workers=Processes(start_method="fork", fallback="spawn"))
    try:
        assert {ppid for _, ppid in pipe} == {os.getpid()}  # spawned by this process
        assert any("are spawned, not forked" in n and "user-monitor" in n
                   for n in pipe.stats().notes)
    finally:
        stop.set()
        other.join()
    assert os.getpid() not in {ppid for _, ppid in pipe}  # the next run forks
    assert "forked from this process" in " ".join(pipe.stats().notes)


def test_a_fallback_that_cannot_pickle_the_function_names_both_reasons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fn = Unpicklable()
    assert [v for v, _, _ in Pipeline(range(4)).map(fn, workers=FORK_OR_SERVER)] == [0, 1, 4, 9]
    _refused(monkeypatch, "1 other Python thread(s) run in this process (late-starter)")
    with pytest.raises(ConfigError, match=r"cannot be sent to worker processes.*forked "
                                          r"workers need no pickling.*late-starter"):
        list(Pipeline(range(4)).map(fn, workers=FORK_OR_SERVER))
