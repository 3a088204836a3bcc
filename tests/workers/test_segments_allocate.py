"""``_segments.allocate``: a worker's result made in a shared-memory segment from the start goes
to the parent by name, not copied; a segment never sent is unlinked as its buffer is freed."""

from __future__ import annotations

import errno
import gc
import itertools
import os
from typing import Any

import numpy as np
import pytest

from asyncflow.pipeline import Pipeline, Processes
from asyncflow.workers import _segments

SIZE = 1 << 20  # above SHM_THRESHOLD


def _mine() -> set[str]:
    prefix = f"asyncflow-{os.getpid()}-"
    return {n for n in os.listdir(_segments.SHM_DIR) if n.startswith(prefix)}



@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The segments written (copied into) from now on."""
    paths: list[str] = []
    real_write = _segments._write_segment
    monkeypatch.setattr(_segments, "_write_segment",
                        lambda path, data: paths.append(path) or real_write(path, data))
    return paths


def _names() -> Any:
    count = itertools.count()
    return lambda: f"asyncflow-{os.getpid()}-alloctest-w{next(count)}"


def test_outside_a_worker_or_below_the_threshold_there_is_no_segment(as_worker: None) -> None:
    assert _segments.allocate(_segments.SHM_THRESHOLD - 1) is None
    _segments.allocate_as(None)
    assert _segments.allocate(SIZE) is None
    assert _mine() == set()


def test_a_buffer_spanning_an_allocated_segment_is_sent_by_name_not_written(
    as_worker: None, written: list[str]
) -> None:
    buffer = _segments.allocate(SIZE)
    assert buffer is not None
    made = np.frombuffer(buffer, dtype=np.uint8)
    made[:] = 7
    payload, segments = _segments.dumps({"made": made}, _names())
    assert written == []
    assert len(segments) == 1 and segments[0][1] == SIZE
    assert _segments._made == {}  # the receiver's to unlink now
    del made, buffer
    gc.collect()
    assert os.path.exists(segments[0][0])  # freeing it here no longer unlinks it
    out = _segments.loads(payload, segments)["made"]
    assert out.shape == (SIZE,) and (out == 7).all()
    assert _mine() == set()


def test_a_part_of_an_allocated_segment_is_copied_and_the_segment_unlinked_when_freed(
    as_worker: None, written: list[str]
) -> None:
    buffer = _segments.allocate(SIZE)
    assert buffer is not None
    whole = np.frombuffer(buffer, dtype=np.uint8)
    whole[:] = np.arange(SIZE) % 251
    half = whole[: SIZE // 2]
    payload, segments = _segments.dumps(half, _names())
    assert len(written) == 1 and segments[0][1] == SIZE // 2
    out = _segments.loads(payload, segments)
    assert (out == np.arange(SIZE // 2) % 251).all()
    assert len(_mine()) == 1  # the allocated one, still in use here
    del whole, half, buffer
    gc.collect()
    assert _mine() == set() and _segments._made == {}


def test_an_allocated_buffer_freed_unsent_leaves_no_segment(as_worker: None) -> None:
    buffer = _segments.allocate(SIZE)
    assert buffer is not None and len(_mine()) == 1
    del buffer
    gc.collect()
    assert _mine() == set() and _segments._made == {}


def test_no_room_in_shared_memory_gives_none_and_leaves_no_file(
    as_worker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert _segments.allocate(SIZE) is None
    assert _mine() == set()


# -- in worker processes ---------------------------------------------------------------------


_WRITTEN: list[str] = []  # in a worker: the segments it wrote (copied into) so far


def filled(x: int) -> tuple[np.ndarray, int]:
    """A result made in a segment, as a collate stacking into shared memory makes it, and
    how many segments this worker has written so far (its earlier results included)."""
    if not _WRITTEN:  # counting from the first call in this worker
        real_write = _segments._write_segment
        _WRITTEN.append("")
        _segments._write_segment = (  # type: ignore[assignment]
            lambda path, data: _WRITTEN.append(path) or real_write(path, data))
    buffer = _segments.allocate(SIZE)
    assert buffer is not None, "a worker process allocates in shared memory"
    out = np.frombuffer(buffer, dtype=np.uint8)
    out[:] = x
    return out, len(_WRITTEN) - 1


def allocated_and_dropped(x: int) -> tuple[bool, int]:
    """Whether the segment of a buffer dropped unsent is still there, and how many this
    worker still counts as made and unsent."""
    buffer = _segments.allocate(SIZE)
    assert buffer is not None
    (path, _, _), = _segments._made.values()
    del buffer
    return os.path.exists(path), len(_segments._made)


# fork needs a process with no other Python thread: in a long session, the servers of earlier
# tests may still run (tests/conftest.py, fresh_process)
@pytest.mark.parametrize("start", [pytest.param("fork", marks=pytest.mark.fresh_process),
                                   "forkserver"])
def test_worker_results_made_in_segments_come_back_whole(start: str, leak_check: None) -> None:
    pipe = Pipeline(range(12)).map(filled, concurrency=2,
                                   workers=Processes(start_method=start))  # type: ignore[arg-type]
    for x, (out, written) in enumerate(pipe):
        assert out.shape == (SIZE,) and (out == x).all()
        assert written == 0  # each result went by name, none was copied into a new segment
        out += 1  # writable, as any result
    assert _mine() == set()


def test_segments_a_worker_allocates_and_drops_are_gone_at_once(leak_check: None) -> None:
    pipe = Pipeline(range(6)).map(allocated_and_dropped, workers="processes")
    assert list(pipe) == [(False, 0)] * 6
    assert _mine() == set()
