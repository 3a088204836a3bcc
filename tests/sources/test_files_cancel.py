"""Opening a local file to stream it is cancellation-safe: an open that completes after its
caller was cancelled (a run closed mid-read) closes its file instead of leaving it open.

The files are FIFOs: opening one for reading blocks its thread until a writer opens it, so the
test decides when each open completes: after the cancellation. A whole-file read
(``read_file``, ``read_bytes``) never blocks on one: it refuses anything but a regular file
(tests/sources/test_read.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import threading
import time
from typing import Any

import pytest

from asyncflow import Pipeline
from asyncflow.sources._files import stream_file

pytestmark = pytest.mark.usefixtures("leak_check")


async def read_file(path: str | pathlib.Path) -> bytes:
    return b"".join([chunk async for chunk in stream_file(str(path))])


def _fifo(tmp_path: pathlib.Path, name: str) -> str:
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


def _readers_fds(path: str) -> list[int]:
    """This process's descriptors open on ``path``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                found.append(int(fd))
        except OSError:
            continue
    return found


def _complete_the_open(path: str) -> None:
    """Open ``path``'s writing end once a reader is opening it (which lets that open
    complete), then close it; fails if no reader comes (a guard against a hang, not a
    measure: the reader is on its way)."""
    deadline = time.monotonic() + 30.0
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.005)  # no reader opening it yet
            continue
        os.close(fd)
        return


def _wait_closed(path: str) -> list[int]:
    deadline = time.monotonic() + 30.0
    while (left := _readers_fds(path)) and time.monotonic() < deadline:
        time.sleep(0.005)
    return left


def test_a_cancelled_open_closes_the_file_it_opens_afterwards(tmp_path: pathlib.Path) -> None:
    path = _fifo(tmp_path, "f")

    async def main() -> None:
        task = asyncio.create_task(read_file(path))
        await asyncio.sleep(0)  # the open is on its thread now, blocked on the FIFO
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(_complete_the_open, path)  # the open completes now

    asyncio.run(main())
    assert _wait_closed(path) == []


def test_a_run_closed_while_files_are_being_opened_leaves_none_open(
    tmp_path: pathlib.Path,
) -> None:
    paths = [_fifo(tmp_path, f"f{i}") for i in range(3)]
    reading = threading.Semaphore(0)

    async def read(path: str) -> Any:
        reading.release()
        return await read_file(path)

    # The opens stay blocked on their threads after the close: the run gives up on them
    # after stop_timeout, and they complete afterwards.
    pipe = Pipeline(paths, stop_timeout=0.1).map(read, concurrency=3)
    run = pipe.open().start()
    for _ in paths:
        assert reading.acquire(timeout=30.0)
    run.close()
    for path in paths:
        _complete_the_open(path)
    assert [_wait_closed(path) for path in paths] == [[], [], []]


def test_a_file_opened_in_time_is_read_and_closed(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "plain"
    path.write_bytes(b"abc")
    assert asyncio.run(read_file(path)) == b"abc"
    assert _readers_fds(str(path)) == []
