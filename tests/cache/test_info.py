"""``asyncflow.cache.info``: what a cache on disk holds, for ``asyncflow cache info``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import asyncflow.cache
from asyncflow.cache import CacheInfo, info
from asyncflow.cache._lock import WriterLock
from asyncflow.cache._writer import Writer

from .test_reader import batches, write


def test_public_names() -> None:
    assert asyncflow.cache.__all__ == sorted(asyncflow.cache.__all__)
    for name in asyncflow.cache.__all__:
        assert getattr(asyncflow.cache, name) is not None


def test_info_of_a_usable_cache(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    result = info(tmp_path / "c")
    assert isinstance(result, CacheInfo)
    assert result.usable and result.problem is None
    assert (result.count, result.items, result.batch_size, result.layout) == (10, 3, 4, "batches")
    assert [f.shape for f in result.fields] == [(3, 4, 5), ()]
    assert result.nbytes == (tmp_path / "c" / "field0.npy").stat().st_size + (
        tmp_path / "c" / "field1.npy").stat().st_size
    text = str(result)
    assert "usable" in text and "batches of 4" in text and "item[0]" in text
    assert "uint8" in text and "(3, 4, 5)" in text and "60 bytes per sample" in text
    json.dumps(result.to_dict())


def test_a_cache_named_by_the_current_folder_is_described(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "." (or "sub/..") has no name of its own: the writer's lock file beside it needs one.
    from asyncflow import Pipeline

    assert [int(x) for x in Pipeline(range(5)).cache(tmp_path / "c")] == list(range(5))
    monkeypatch.chdir(tmp_path / "c")
    assert info(".").usable and info("").count == 5
    assert info(os.path.join("sub", "..")).count == 5  # the path need not exist on the way


def test_info_of_a_damaged_cache_says_why(tmp_path: Path) -> None:
    write(tmp_path / "c", batches(10, 4))
    (tmp_path / "c" / "field1.npy").unlink()
    result = info(tmp_path / "c")
    assert not result.usable and result.problem == "field1.npy is missing"
    assert "not usable: field1.npy is missing" in str(result)


def test_info_while_a_writer_works_and_after_it_died(tmp_path: Path) -> None:
    path = tmp_path / "c"
    lock = WriterLock(path)
    assert lock.acquire()
    writer = Writer(path, layout="samples", meta={})
    writer.write(np.zeros(3))
    try:
        busy = info(path)
        assert busy.writer is not None and not busy.usable and busy.problem == "not written yet"
        assert "is writing a new copy now" in str(busy)
    finally:
        lock.release()
    dead = info(path)  # the lock is free, the temporary directory remains
    assert dead.problem == "a writer did not finish" and dead.unfinished == (writer.tmp.name,)
    writer.abort()


def test_info_of_nothing_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no cache"):
        info(tmp_path / "missing")


def test_lock_in_one_process(tmp_path: Path) -> None:
    one, two = WriterLock(tmp_path / "c"), WriterLock(tmp_path / "c")
    assert one.acquire() and one.holder() == os.getpid()
    assert not two.acquire()
    assert two.holder() is not None
    with pytest.raises(RuntimeError):
        one.acquire()
    one.release()
    one.release()
    assert two.acquire() and two.holder() == os.getpid() and not one.acquire()
    two.release()
    assert two.holder() is None and one.acquire()
    one.release()
