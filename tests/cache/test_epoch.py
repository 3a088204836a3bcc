"""One epoch's decision: replay, fill (writing as items pass), or read upstream meanwhile."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncflow import ConfigError, SourceError
from asyncflow._scope import use_epoch
from asyncflow.cache._epoch import CacheSource
from asyncflow.cache._format import HEADER_BYTES, leftovers
from asyncflow.cache._lock import WriterLock
from asyncflow.cache._reader import Reader

from .test_reader import write


class Upstream:
    """Counts the passes and items it makes; each item a batch (uint8 [4, 8], int64 [4])."""

    def __init__(self, batches: int = 5, shape: tuple[int, ...] = (8,)) -> None:
        self.batches, self.shape = batches, shape
        self.passes = self.made = 0

    def __call__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.passes += 1
        for i in range(self.batches):
            self.made += 1
            yield np.full((4, *self.shape), i, np.uint8), np.arange(4 * i, 4 * i + 4)


@dataclass(frozen=True)
class Epochs(CacheSource):
    """A cache source whose calls start epochs over ``upstream`` (each call: a fresh pass),
    as a filling run's ``cache`` stage starts them with the items it receives."""

    upstream: Callable[[], Iterable[Any]] | None = None

    def __call__(self) -> AsyncGenerator[Any, None]:
        if self.upstream is None:
            return super().__call__()  # an epoch that can only replay
        upstream = self.upstream

        async def items() -> AsyncGenerator[Any, None]:
            for item in upstream():
                yield item

        return self.run_epoch(items)


def source(path: Path, upstream: Any, **options: Any) -> Epochs:
    options.setdefault("fingerprint", "fp")
    return Epochs(upstream=upstream, path=path, layout="batches", **options)


def collect(epoch: Any, limit: int | None = None) -> list[Any]:
    """Run one epoch (an async iterator) to its end, or for ``limit`` items, then close it."""

    async def main() -> list[Any]:
        out: list[Any] = []
        try:
            async for item in epoch:
                out.append(item)
                if len(out) == limit:
                    break
        finally:
            await epoch.aclose()
        return out

    return asyncio.run(main())


def labels(items: Any) -> list[int]:
    if hasattr(items, "__anext__"):
        items = collect(items)
    return [int(x) for _, batch in items for x in batch]


def test_first_epoch_fills_later_epochs_replay(tmp_path: Path, caplog: Any) -> None:
    up = Upstream()
    src = source(tmp_path / "c", up)
    caplog.set_level(logging.INFO, "asyncflow.cache")
    assert labels(src()) == list(range(20))
    assert "does not exist yet" in caplog.text and "written: 20 samples in 5 items" in caplog.text
    assert labels(src()) == list(range(20))
    assert labels(src()) == list(range(20))
    assert up.passes == 1


def test_an_epoch_stopped_early_writes_nothing(tmp_path: Path) -> None:
    up = Upstream()
    src = source(tmp_path / "c", up)
    assert len(collect(src(), limit=2)) == 2
    assert not (tmp_path / "c").exists() and leftovers(tmp_path / "c") == []
    assert WriterLock(tmp_path / "c").holder() is None
    assert labels(src()) == list(range(20)) and up.passes == 2
    labels(src())
    assert up.passes == 2


def test_variable_shapes_fail_and_leave_nothing(tmp_path: Path) -> None:
    def upstream() -> Iterator[Any]:
        yield np.zeros((4, 3, 8, 8), np.uint8), np.arange(4)
        yield np.zeros((4, 3, 8, 9), np.uint8), np.arange(4)

    with pytest.raises(ConfigError, match=r"(?i)item\[0\] changed shape .*resize"):
        collect(source(tmp_path / "c", upstream)())
    assert list(tmp_path.iterdir()) == [tmp_path / "c.lock"]
    assert WriterLock(tmp_path / "c").holder() is None


def test_a_changed_fingerprint_rebuilds_and_says_what_changed(
    tmp_path: Path, caplog: Any
) -> None:
    up = Upstream()
    old = [{"kind": "source", "len": 5}, {"kind": "map", "name": "decode", "size": 224}]
    new = [{"kind": "source", "len": 5}, {"kind": "map", "name": "decode", "size": 256}]
    collect(source(tmp_path / "c", up, fingerprint="a", summary=old)())
    caplog.set_level(logging.INFO, "asyncflow.cache")
    collect(source(tmp_path / "c", up, fingerprint="b", summary=new)())
    assert up.passes == 2
    assert "upstream pipeline changed" in caplog.text
    assert "upstream[1]['size']: 224 -> 256" in caplog.text
    assert Reader.open(tmp_path / "c").manifest["fingerprint"] == "b"


def test_a_changed_key_rebuilds(tmp_path: Path, caplog: Any) -> None:
    up = Upstream()
    collect(source(tmp_path / "c", up, fingerprint="a", key="v1")())
    caplog.set_level(logging.INFO, "asyncflow.cache")
    collect(source(tmp_path / "c", up, fingerprint="b", key="v2")())
    assert up.passes == 2 and "key 'v1' -> 'v2'" in caplog.text


def test_a_truncated_cache_is_rebuilt_with_the_reason_logged(
    tmp_path: Path, caplog: Any
) -> None:
    up = Upstream()
    src = source(tmp_path / "c", up)
    collect(src())
    data = tmp_path / "c" / "field0.npy"
    with open(data, "r+b") as fh:
        fh.truncate(data.stat().st_size // 2)
    caplog.set_level(logging.INFO, "asyncflow.cache")
    assert labels(src()) == list(range(20))
    assert "field0.npy is truncated" in caplog.text and "rebuilding" in caplog.text
    assert up.passes == 2
    caplog.clear()
    labels(src())
    assert up.passes == 2 and caplog.text == ""


def test_a_cache_of_another_layout_is_rebuilt(tmp_path: Path, caplog: Any) -> None:
    write(tmp_path / "c", [(np.zeros(2), 1)], layout="samples")
    caplog.set_level(logging.INFO, "asyncflow.cache")
    up = Upstream()
    collect(source(tmp_path / "c", up, fingerprint="test")())
    assert up.passes == 1 and "holds samples, upstream yields batches" in caplog.text


def test_leftovers_of_a_dead_writer_are_removed(tmp_path: Path, caplog: Any) -> None:
    stale = tmp_path / "c.tmp-999999-0123abcd"
    stale.mkdir()
    (stale / "field0.npy").write_bytes(b"partial")
    caplog.set_level(logging.INFO, "asyncflow.cache")
    assert labels(source(tmp_path / "c", Upstream())()) == list(range(20))
    assert "left by a writer that did not finish" in caplog.text
    assert not stale.exists()


def test_while_another_writes_an_epoch_reads_upstream(tmp_path: Path, caplog: Any) -> None:
    other = WriterLock(tmp_path / "c")
    assert other.acquire()
    up = Upstream()
    caplog.set_level(logging.INFO, "asyncflow.cache")
    try:
        assert labels(source(tmp_path / "c", up)()) == list(range(20))
    finally:
        other.release()
    assert "being written by process" in caplog.text and "reads upstream" in caplog.text
    assert not (tmp_path / "c").exists()  # it only read


def test_with_wait_an_epoch_waits_for_the_writer_and_replays(tmp_path: Path) -> None:
    other = WriterLock(tmp_path / "c")
    assert other.acquire()
    up = Upstream()
    released = threading.Event()

    def finish_writing() -> None:
        write(tmp_path / "c", list(Upstream()()), layout="batches")
        released.set()
        other.release()

    timer = threading.Timer(0.3, finish_writing)
    timer.start()
    try:
        out = labels(source(tmp_path / "c", up, fingerprint="test", wait=True)())
    finally:
        timer.join()
    assert released.is_set() and out == list(range(20)) and up.passes == 0


def test_refuses_to_overwrite_a_directory_that_is_not_a_cache(tmp_path: Path) -> None:
    data = tmp_path / "c"
    data.mkdir()
    (data / "train.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ConfigError, match="not an asyncflow cache"):
        collect(source(data, Upstream())())
    assert (data / "train.jpg").exists()


def test_a_rebuild_does_not_disturb_a_reader_of_the_old_cache(tmp_path: Path) -> None:
    collect(source(tmp_path / "c", Upstream(), fingerprint="a")())
    old = source(tmp_path / "c", Upstream(), fingerprint="a")()
    with asyncio.Runner() as runner:
        first = runner.run(old.__anext__())  # the old cache is mapped and being replayed
        collect(source(tmp_path / "c", Upstream(batches=2), fingerprint="b")())
        rest = runner.run(_rest(old))
    assert labels([first, *rest]) == list(range(20))  # its files live on until unmapped
    assert Reader.open(tmp_path / "c").count == 8


async def _rest(epoch: Any) -> list[Any]:
    return [item async for item in epoch]


def test_shuffled_order_depends_on_seed_and_epoch(tmp_path: Path) -> None:
    # The epoch is the run's (current_epoch()): outside a run, 0; use_epoch stands for a run.
    src = source(tmp_path / "c", Upstream())
    collect(src())
    one, two = src.shuffled(0), src.shuffled(0)
    first = labels(one())
    with use_epoch(1):
        second = labels(one())
        assert labels(two()) == second
    assert sorted(first) == list(range(20)) and first != list(range(20))
    assert first != second
    with use_epoch(0):
        assert labels(two()) == first
    assert labels(src.shuffled(1)()) != first
    assert sorted(labels(src.shuffled(None)())) == list(range(20))


def test_a_damaged_block_fails_its_epoch_and_the_next_rebuilds(
    tmp_path: Path, caplog: Any
) -> None:
    up = Upstream(shape=(3, 40, 40))  # 4,800 bytes a sample: a checksum each
    src = source(tmp_path / "c", up)
    collect(src())
    with open(tmp_path / "c" / "field0.npy", "r+b") as fh:
        fh.seek(HEADER_BYTES + 6 * 4800 + 3)
        fh.write(b"\xff")
    with pytest.raises(SourceError, match=rf"^cache {tmp_path / 'c'}: field0\.npy \(field "
                                          r"item\[0\]\) is damaged: row 6, bytes"):
        collect(src())
    assert not src.ready()  # so a run is built to fill it
    caplog.set_level(logging.INFO, "asyncflow.cache")
    assert labels(src()) == list(range(20)) and up.passes == 2 and src.ready()
    assert "cannot be used: field0.npy (field item[0]) is damaged: row 6" in caplog.text
    assert "rebuilding" in caplog.text
    assert labels(src()) == list(range(20)) and up.passes == 2


async def test_an_epoch_cancelled_while_taking_the_lock_gives_it_back(
    tmp_path: Path, monkeypatch: Any
) -> None:
    entered, taken = threading.Event(), threading.Event()
    real = WriterLock.acquire

    def slow(self: WriterLock, **options: Any) -> bool:
        entered.set()
        time.sleep(0.2)  # the epoch is cancelled meanwhile
        got = real(self, **options)
        taken.set()
        return got

    monkeypatch.setattr(WriterLock, "acquire", slow)
    epoch = source(tmp_path / "c", Upstream())()
    task = asyncio.ensure_future(epoch.__anext__())
    await asyncio.to_thread(entered.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(taken.wait, 5)
    async with asyncio.timeout(5):
        while WriterLock(tmp_path / "c").holder() is not None:
            await asyncio.sleep(0.01)
