"""One writer per cache across processes: an exclusive ``flock`` on ``<path>.lock``.

The lock belongs to an open file, so the kernel drops it when the writer's process dies, even
by SIGKILL: a crashed writer never leaves a stale lock behind. The lock file itself stays (it
holds the writer's pid while locked); removing it would let two writers lock two different
files of the same name.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
from pathlib import Path

from ..pipeline import run_thread

__all__ = ["WriterLock", "take_lock"]


class WriterLock:
    """An exclusive lock that marks the one process writing the cache at ``path``.

    Two ``WriterLock`` objects on one path exclude each other even within one process.
    """

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if it is free; return whether it was taken (it never waits: to wait
        for a writer from a run, :func:`take_lock` polls from the loop)."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Give the lock up. Safe to call when not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the flock

    def holder(self) -> int | None:
        """The pid of the process holding the lock now, or None when nobody holds it."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.read(fd, 32).decode(errors="replace").strip()
                return int(text) if text.isdigit() else -1
            return None
        finally:
            os.close(fd)  # also drops the shared lock taken to test


async def take_lock(lock: WriterLock, *, wait: bool = False) -> bool:
    """``lock.acquire()`` on a worker thread; return whether it was taken.

    Args:
        lock: The lock to take.
        wait: Try again (pausing 5 ms, doubling up to 0.2 s, on the loop) until it is taken.

    Cancellation:
        A try in progress runs on in its thread; should it take the lock after all, it gives
        it back at once.
    """
    delay = 0.005
    while not await _try(lock):
        if not wait:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
    return True


async def _try(lock: WriterLock) -> bool:
    taking = asyncio.ensure_future(run_thread(lock.acquire))
    taken = False
    try:
        taken = await asyncio.shield(taking)
    finally:
        if not taken:  # cancelled (or failed) while the thread was taking it
            taking.add_done_callback(functools.partial(_give_back, lock))
    return taken


def _give_back(lock: WriterLock, taking: asyncio.Future[bool]) -> None:
    if not taking.cancelled() and taking.exception() is None and taking.result():
        lock.release()  # truncating the lock file and closing it: too little to hand off
