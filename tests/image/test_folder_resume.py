"""image.folder resumes exactly: an epoch interrupted after k batches yields the rest."""

from __future__ import annotations

import gc
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncflow import ConfigError, image

from ._pictures import jpeg, write_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"cat": 9, "dog": 8, "ant": 6})  # 23 images
    return root


def _make(tree: Path, workers: str, **extra: Any) -> image.ImageFolder:
    options: dict[str, Any] = {"batch_size": 10, "size": 16, "train": True, "seed": 7,
                               "workers": workers, **extra}
    if workers == "processes":
        options["decode_concurrency"] = 2
    return image.folder(tree, **options)


def _take(pipe: image.ImageFolder, k: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``k`` batches of a run, and the state after them (through JSON)."""
    with pipe.open() as run:
        got = [next(run) for _ in range(k)]
        state = json.loads(json.dumps(pipe.state_dict()))
    return got, state


def _same(a: list[Any], b: list[Any]) -> None:
    assert [len(y) for _, y in a] == [len(y) for _, y in b]
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("workers", ["threads", "processes"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_resumed_epoch_yields_exactly_the_remaining_batches(
    tree: Path, workers: str, k: int, leak_check: None
) -> None:
    reference = _make(tree, workers)
    reference.set_epoch(2)  # crops and order fixed by (seed, epoch, item)
    full = list(reference)
    assert [len(y) for _, y in full] == [10, 10, 3]
    first = _make(tree, workers)
    first.set_epoch(2)
    head, state = _take(first, k)
    _same(head, full[:k])
    assert state["epoch"] == 2
    resumed = _make(tree, workers)
    resumed.load_state_dict(state)
    _same(list(resumed), full[k:])
    # the run after the resumed one is the next epoch, whole
    after = _make(tree, workers)
    after.set_epoch(3)
    _same(list(resumed), list(after))
    del reference, first, resumed, after
    gc.collect()


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_failed_images_stay_failed_and_batches_keep_their_boundaries(
    tree: Path, workers: str, leak_check: None
) -> None:
    (tree / "cat" / "cut.jpg").write_bytes(jpeg(96, 72)[:400])
    (tree / "dog" / "text.jpg").write_bytes(b"not a picture at all")
    full = list(_make(tree, workers, max_failures=2))
    assert sum(len(y) for _, y in full) == 23
    for k in range(len(full)):
        head, state = _take(_make(tree, workers, max_failures=2), k)
        _same(head, full[:k])
        resumed = _make(tree, workers, max_failures=2)
        resumed.load_state_dict(state)
        _same(list(resumed), full[k:])
    gc.collect()


@pytest.mark.parametrize(("workers", "batch_size"),
                         [("threads", 4), ("threads", 6), ("processes", 5)])
def test_a_resumed_run_can_be_interrupted_and_resumed_again(
    tree: Path, workers: str, batch_size: int, leak_check: None
) -> None:
    reference = list(_make(tree, workers, batch_size=batch_size))
    head, state = _take(_make(tree, workers, batch_size=batch_size), 1)
    second = _make(tree, workers, batch_size=batch_size)
    second.load_state_dict(state)
    middle, state = _take(second, 2)
    third = _make(tree, workers, batch_size=batch_size)
    third.load_state_dict(state)
    _same(head + middle + list(third), reference)
    done = third.state_dict()
    assert done["positions"]["ranges"] == []  # the whole listing settled
    del second, third
    gc.collect()


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_decoder_group_delivered_in_part_is_not_delivered_twice(
    tree: Path, workers: str, leak_check: None
) -> None:
    # batches of 20 (threads decode groups of 8, processes groups of 16): the first batch
    # ends inside a group, whose rest is decoded again on resume but assembled only once
    full = list(_make(tree, workers, batch_size=20, drop_last=True))
    assert [len(y) for _, y in full] == [20]
    every = list(_make(tree, workers, batch_size=20))
    head, state = _take(_make(tree, workers, batch_size=20), 1)
    _same(head, every[:1])
    assert state["nodes"]["rows"]["partial"]  # the group of positions 16.. in part
    resumed = _make(tree, workers, batch_size=20)
    resumed.load_state_dict(state)
    _same(list(resumed), every[1:])
    gc.collect()


def test_the_state_is_small_and_names_the_settled_rows(tree: Path) -> None:
    pipe = _make(tree, "threads")
    _, state = _take(pipe, 1)
    rows = state["nodes"]["batch"]["rows"]
    assert rows == {"mark": 10, "ranges": []}
    assert len(json.dumps(state)) < 2000


# -- the listing a state was taken over (issue 25, point 3) -------------------------------


def _state_after_one_batch(tree: Path) -> dict[str, Any]:
    return _take(_make(tree, "threads"), 1)[1]


def _copy(tree: Path, where: Path) -> list[Path]:
    shutil.copytree(tree, where)
    return sorted(where.rglob("*.jpg"))


def test_the_same_tree_at_another_root_resumes(tree: Path, tmp_path: Path,
                                               leak_check: None) -> None:
    reference = list(_make(tree, "threads"))
    state = _state_after_one_batch(tree)
    _copy(tree, tmp_path / "moved")
    resumed = _make(tmp_path / "moved", "threads")
    resumed.load_state_dict(state)
    _same(list(resumed), reference[1:])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("add", r"24 items here, 23 in the state; the listing differs from item 6: item 6 is "
                r"'ant/zz\.jpg 0' here, 'cat/000\.jpg 1'"),
        ("remove", r"22 items here, 23 in the state; the listing differs from item 3: item 3 "
                   r"is 'ant/004\.jpg 0' here, 'ant/003\.jpg 0'"),
        ("swap", r"the same names, but the content of a file in item 2 \(from 'ant/002\.jpg"),
        ("rewrite", r"the content of a file in item 7 \(from 'cat/001\.jpg 1'\) changed"),
        ("another tree", r"the content of a file in item 0 \(from 'ant/000\.jpg 0'\)"),
    ],
)
def test_a_state_of_another_tree_is_refused_saying_what_differs(
    tree: Path, tmp_path: Path, change: str, message: str
) -> None:
    state = _state_after_one_batch(tree)
    files = _copy(tree, tmp_path / "other")
    if change == "add":
        shutil.copy(files[3], files[3].parent / "zz.jpg")
    elif change == "remove":
        files[3].unlink()
    elif change == "swap":  # one file's bytes for another's: the same count and names
        first, second = files[2].read_bytes(), files[12].read_bytes()
        files[2].write_bytes(second)
        files[12].write_bytes(first)
    elif change == "rewrite":  # the same size, other pixels, the time put back
        data, stamp = bytearray(files[7].read_bytes()), files[7].stat()
        data[-100] ^= 0xFF
        files[7].write_bytes(bytes(data))
        os.utime(files[7], ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    else:  # the same layout, other images
        for index, path in enumerate(files):
            path.write_bytes(jpeg(40 + index, 30, seed=100 + index))
    with pytest.raises(ConfigError, match=message):
        _make(tmp_path / "other", "threads").load_state_dict(state)


def _broken_hook(run: Any) -> Any:
    raise RuntimeError("the hook failed as its run started")


def test_the_listing_reads_the_runs_epoch_after_a_run_that_never_listed(
    tree: Path, leak_check: None
) -> None:
    """Issue 24 (one owner of the epoch): a run stopped before its listing was made (a
    consumer hook failed as it started) took its epoch all the same. The next run is epoch
    1, its state says so, and the listing, keeping no count of its own to fall behind,
    lists epoch 1's order and crops: the ones a resume from that state lists again."""
    reference = _make(tree, "threads")
    reference.set_epoch(1)
    full = list(reference)
    pipe = _make(tree, "threads")
    broken = pipe.with_hook(_broken_hook)  # shares the pipeline's source and epoch count
    with pytest.raises(RuntimeError, match="hook failed"), broken.open() as run:
        next(run)
    head, state = _take(pipe, 1)
    assert state["epoch"] == 1
    _same(head, full[:1])
    resumed = _make(tree, "threads")
    resumed.load_state_dict(state)
    _same(list(resumed), full[1:])
    del reference, pipe, broken, resumed
    gc.collect()
