"""``multiprocessing_context=None``: a map-style loader's workers fork from this process where
that is safe when the epoch's pool is built, as torch's do, else start from the forkserver;
``stats().notes`` says which, and why."""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

import pytest
import torch
import torch.utils.data as tud

from asyncflow import DataLoader
from tests.torch.test_loader_processes import Counting, Locked, Pairs, Pids

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(120),
              pytest.mark.fresh_process]  # fork needs a process with no other thread


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")


def _notes(loader: Any) -> str:
    return " ".join(loader.stats().notes)


def test_the_default_forks_when_no_other_thread_runs() -> None:
    loader = DataLoader(Pids(8), batch_size=None, num_workers=2, workers="processes")
    it = iter(loader)
    first = next(it)
    template = first[1]  # the workers' parent: a fork of this process, alive with the epoch
    assert template != os.getpid() and _parent(template) == os.getpid()
    assert "forkserver" not in _cmdline(template)
    samples = [first, *it]
    assert [i for *_, i in samples] == list(range(8))
    assert {ppid for _, ppid, _ in samples} == {template}
    assert "stage 'fetch': worker processes forked from this process, as torch's" in _notes(loader)


def test_the_default_falls_back_to_the_forkserver_while_a_user_thread_runs() -> None:
    loader = DataLoader(Pids(8), batch_size=None, num_workers=2, workers="processes",
                        persistent_workers=True)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="metrics-writer")
    other.start()  # after DataLoader(): the choice is the epoch's, when its pool is built
    try:
        samples = list(loader)
    finally:
        stop.set()
        other.join()
    assert [i for *_, i in samples] == list(range(8))
    [server] = {ppid for _, ppid, _ in samples}
    assert "forkserver" in _cmdline(server)
    notes = _notes(loader)
    assert "worker processes start from the forkserver, not forked" in notes
    assert "metrics-writer" in notes and "deadlock" in notes
    assert {ppid for _, ppid, _ in loader} == {server}  # persistent: the same workers
    del loader
    gc.collect()


def test_the_default_falls_back_when_the_pools_own_check_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncflow.workers._fork as fork

    loader = DataLoader(Pairs(8), batch_size=4, num_workers=2, workers="processes")
    # a thread that starts between the loader's plan and the pool: only the pool's check
    # (under the readers' gates) sees it
    monkeypatch.setattr(fork, "fork_refusal", lambda: "1 other Python thread(s) (late)")
    batches = list(loader)
    reference = list(tud.DataLoader(Pairs(8), batch_size=4))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, reference, strict=True))
    assert "start from the forkserver, not forked: 1 other Python thread(s) (late)" in \
        _notes(loader)
    monkeypatch.undo()
    assert len(list(loader)) == 2  # the next epoch forks
    assert "forked from this process" in _notes(loader)


def test_a_dataset_that_cannot_be_pickled_works_by_default_where_fork_is_picked() -> None:
    loader = DataLoader(Locked(6), batch_size=2, num_workers=2, workers="processes")
    assert [y.tolist() for _, y in loader] == [[0, 7], [14, 21], [28, 35]]
    assert "forked from this process" in _notes(loader)


def test_an_iterable_dataset_keeps_the_forkserver_by_default() -> None:
    loader = DataLoader(Counting(), num_workers=2, workers="processes")
    assert sorted(int(b) for b in loader) == [0, 0, 1, 1, 2, 2, 3, 3]  # a copy per worker
    assert "forked" not in _notes(loader)


def test_two_default_loaders_at_once_the_second_one_built_mid_epoch() -> None:
    a = DataLoader(Pids(12), batch_size=None, num_workers=2, workers="processes")
    b = DataLoader(Pids(12), batch_size=None, num_workers=2, workers="processes")
    it_a = iter(a)
    first = next(it_a)  # a's run threads now run: b cannot fork, and does not raise
    it_b = iter(b)
    pairs = list(zip(it_a, it_b, strict=False))  # a has one left fewer: b's last comes next
    assert [first[2], *(x[2] for x, _ in pairs)] == list(range(12))
    assert [*(y[2] for _, y in pairs), *(y[2] for y in it_b)] == list(range(12))
    assert "forked from this process" in _notes(a)
    assert "start from the forkserver, not forked" in _notes(b)
