"""image.folder's decode processes: forked from this process where that is safe, as
``asyncflow.DataLoader``'s workers (they share its imported modules), else started from the
forkserver with a note saying why."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import pytest
import torch

from asyncflow import Processes, image
from asyncflow.image._config import decode_workers

from ._pictures import write_tree

pytestmark = [pytest.mark.usefixtures("leak_check"), pytest.mark.timeout(120),
              pytest.mark.fresh_process]  # fork needs a process with no other thread

OPTIONS = {"batch_size": 4, "size": 16, "train": True, "seed": 5}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"cat": 5, "dog": 4})
    return root


def _batches(pipe: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in pipe]  # type: ignore[attr-defined]


def _descendants(pid: int) -> dict[int, list[int]]:
    """Each process under ``pid`` with its own children."""
    tree: dict[int, list[int]] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        kids: list[int] = []
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    kids += [int(c) for c in fh.read().split()]
        except OSError:
            continue
        tree[p] = kids
        todo += kids
    return tree


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")


def test_auto_and_processes_ask_for_fork_with_the_forkserver_behind_it() -> None:
    chosen, _ = decode_workers("processes", 2)
    assert chosen is not None
    assert (chosen.start_method, chosen.fallback, chosen.persistent) == ("fork", "forkserver",
                                                                         True)
    if len(os.sched_getaffinity(0)) >= 2:
        auto, note = decode_workers("auto", 2)
        assert auto is not None and "processes (workers='auto')" in str(note)
        assert (auto.start_method, auto.fallback, auto.persistent) == ("fork", "forkserver",
                                                                       True)
    mine = Processes(start_method="spawn")  # the user's choice stands
    assert decode_workers(mine, 2)[0] is mine


def test_decoders_fork_from_this_process_and_give_the_batches_of_threads(tree: Path) -> None:
    threads = _batches(image.folder(tree, workers="threads", **OPTIONS))
    pipe = image.folder(tree, workers="processes", decode_concurrency=2, **OPTIONS)
    forked = _batches(pipe)
    assert len(forked) == len(threads) == 3
    for (xt, yt), (xf, yf) in zip(threads, forked, strict=True):
        assert torch.equal(xt, xf) and torch.equal(yt, yf)
    assert "stage 'decode': worker processes forked from this process, as torch's" in (
        pipe.stats().notes)
    # persistent: the template (a child of this process, not the forkserver) holds the two
    # decoders between epochs
    tree_now = _descendants(os.getpid())
    templates = [p for p in tree_now[os.getpid()]
                 if tree_now.get(p) and "forkserver" not in _cmdline(p)]
    assert [len(tree_now[p]) for p in templates] == [2]
    del pipe
    gc.collect()


def test_with_another_thread_running_decoders_start_from_the_forkserver_saying_why(
    tree: Path,
) -> None:
    threads = _batches(image.folder(tree, workers="threads", **OPTIONS))
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="metrics-writer")
    other.start()
    try:
        pipe = image.folder(tree, workers="processes", decode_concurrency=2, **OPTIONS)
        served = _batches(pipe)
    finally:
        stop.set()
        other.join()
    for (xt, yt), (xs, ys) in zip(threads, served, strict=True):
        assert torch.equal(xt, xs) and torch.equal(yt, ys)
    assert any(n.startswith("stage 'decode': worker processes start from the forkserver, not "
                            "forked: 1 other Python thread(s) run in this process "
                            "(metrics-writer)") for n in pipe.stats().notes)
    del pipe
    gc.collect()
