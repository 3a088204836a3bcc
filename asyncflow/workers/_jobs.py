"""A process pool's bookkeeping: the chunks (jobs) a worker holds, its slot, and how their
results reach the caller's loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ._portable import FAILED, ChunkResult
from ._settle import settle_soon
from ._worker_process import send

__all__ = ["Job", "Slot", "blame", "exit_reason", "merge", "settle", "stop_workers"]


class Job:
    __slots__ = ("by_value", "epoch", "first", "fut", "items", "jid", "keys", "loop", "skipped")

    def __init__(self, jid: int, items: list[Any], first: int, epoch: int,
                 keys: list[int] | None, loop: asyncio.AbstractEventLoop,
                 fut: asyncio.Future[Any]) -> None:
        self.jid, self.items, self.first, self.epoch = jid, items, first, epoch
        self.keys = keys  # the items' seed keys, when not their positions
        self.loop, self.fut = loop, fut
        # the items a dead worker was on, failed: the worker that takes the job over skips them
        self.skipped: list[tuple[int, BaseException]] = []
        self.by_value = False  # the worker could not load the items by reference

    def message(self) -> tuple[int, list[Any], int, int, list[int] | None, list[int]]:
        """What the worker is sent: the items, how it seeds them (item ``k`` from ``keys[k]``,
        else from ``first + k``), and those it skips."""
        skip = [index for index, _ in self.skipped]
        return (self.jid, self.items, self.first, self.epoch, self.keys, skip)


class Slot:
    __slots__ = ("conn", "jobs", "process", "ready", "wid")

    def __init__(self, wid: int, process: Any, conn: Connection) -> None:
        self.wid, self.process, self.conn = wid, process, conn
        self.jobs: deque[Job] = deque()
        self.ready = False

    def close(self) -> None:
        """Release the worker's pipe and process handle (its sentinel is a descriptor) once
        it has ended."""
        self.conn.close()
        with contextlib.suppress(ValueError):  # still running: released when collected
            self.process.close()


def blame(job: Job, status: tuple[int, int], error: Callable[[Any], BaseException]) -> None:
    """Fail with ``error(item)`` the item of ``job`` a dead worker was on (``status``: the
    job id and index its status slot held); the chunk's other items go to another worker.
    Nothing if it died between items."""
    jid, index = status
    if jid == job.jid and 0 <= index < len(job.items):
        job.skipped.append((index, error(job.items[index])))


def stop_workers(slots: list[Slot], timeout: float) -> None:
    """Ask the workers of ``slots`` to stop, wait up to ``timeout`` seconds for them all,
    then terminate, then kill those still alive.

    Cancellation:
        Blocks its thread for up to ``timeout`` plus 2 s per stubborn worker.
    """
    for slot in slots:
        with contextlib.suppress(OSError, ValueError):
            send(slot.conn, "stop", b"", [])
    deadline = time.monotonic() + timeout
    for slot in slots:
        slot.process.join(max(0.0, deadline - time.monotonic()))
    for slot in slots:
        for end in (slot.process.terminate, slot.process.kill):
            if slot.process.is_alive():
                end()
                slot.process.join(1.0)


def exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def merge(job: Job, values: list[Any], failures: list[tuple[int, BaseException]],
          elapsed: float) -> ChunkResult:
    """The worker's results (``[]``: none, every item failed) with the skipped items failed."""
    skipped = dict(job.skipped)
    failures = [(i, exc) for i, exc in failures if i not in skipped] + job.skipped
    failures.sort(key=lambda pair: pair[0])
    return values or [FAILED] * len(job.items), failures, elapsed


def settle(job: Job, result: Any, error: BaseException | None) -> None:
    """From any thread: settle ``job``'s future with ``result`` or ``error`` (``settle_soon``)."""
    settle_soon(job.loop, job.fut, result, error)
