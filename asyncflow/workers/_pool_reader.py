"""The reader thread of a :class:`~._process_pool.ProcessPool`: it waits on every worker's pipe
and process sentinel at once (``multiprocessing.connection.wait``), unpickles results (mapping
their shared-memory segments), settles the jobs' futures on their loops, and hands a dead
worker to the pool. It holds a :class:`~._fork.ReaderGate` except while it waits, so that a
fork pool's template forks only while every reader is idle.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from .._errors import WorkerError
from .._redact import describe_exception, describe_item
from . import _segments
from ._fork import ReaderGate
from ._jobs import Job, Slot, merge, settle

__all__ = ["PoolReader"]


class PoolReader(ABC):
    """What the reader thread does with the workers' messages; the pool supplies the rest."""

    stage: str
    _closed: bool
    _lock: threading.Lock
    _slots: list[Slot]

    @abstractmethod
    def _dispatch(self, job: Job) -> None:
        """Send ``job`` to a worker (again)."""

    @abstractmethod
    def _died(self, slot: Slot) -> None:
        """The worker of ``slot`` is gone: blame its item, replace it."""

    @abstractmethod
    def _fail_pool(self, error: BaseException, held: list[Job] | None = None) -> None:
        """Fail every job with ``error`` and stop the pool."""

    def _read_loop(self) -> None:
        with ReaderGate() as gate:  # a fork pool's template forks while this waits (_fork.py)
            while not self._closed:
                with self._lock:
                    by_conn = {s.conn: s for s in self._slots}
                    by_sentinel = {s.process.sentinel: s for s in self._slots}
                with gate.waiting():
                    ready = wait([*by_conn, *by_sentinel])
                if not self._closed:
                    self._handle(ready, by_conn, by_sentinel)

    def _handle(self, ready: list[Any], by_conn: dict[Any, Slot],
                by_sentinel: dict[Any, Slot]) -> None:
        for obj in ready:
            if obj in by_conn:
                self._receive(by_conn[obj])
            elif obj in by_sentinel:
                slot = by_sentinel[obj]
                self._drain(slot)
                self._died(slot)

    def _receive(self, slot: Slot) -> bool:
        """Handle one message; ``False`` when the pipe is at its end (the worker is gone)."""
        try:
            kind, payload, segments = pickle.loads(slot.conn.recv_bytes())
        except (EOFError, OSError):
            return False  # the sentinel reports the death
        if kind == "ready":
            slot.ready = True
        elif kind == "boot_error":
            self._fail_pool(WorkerError(
                f"worker {slot.wid} of stage {self.stage!r} could not start:\n"
                f"{payload.decode(errors='replace')}"
            ))
        elif kind == "result":
            self._result(slot, payload, segments)
        elif kind == "unloadable":
            self._unloadable(slot, payload.decode(errors="replace"))
        return True

    def _drain(self, slot: Slot) -> None:
        """Read what a dead worker sent before it died (a result, a boot error)."""
        with contextlib.suppress(EOFError, OSError):
            # poll() is true at the end of the pipe too: stop there, or this spins forever.
            while slot.conn.poll() and self._receive(slot):
                pass

    def _next_job(self, slot: Slot) -> Job | None:
        """The oldest job of ``slot``, taken from it: the one its worker answered."""
        with self._lock:
            return slot.jobs.popleft() if slot.jobs else None

    def _result(self, slot: Slot, payload: bytes, segments: list[tuple[str, int]]) -> None:
        job = self._next_job(slot)
        try:  # loaded in any case: that unlinks its segments
            _, values, failures, elapsed = _segments.loads(payload, segments)
        except Exception as exc:  # a class this process lacks, a failing __setstate__...
            why = describe_exception(exc)
            if job is not None:
                self._fail_each(job, lambda item: (
                    f"worker {slot.wid} of stage {self.stage!r} processed item {item}, but "
                    f"its chunk's results could not be unpickled: {why}"))
            return
        if job is not None:
            settle(job, merge(job, values, failures, elapsed), None)

    def _unloadable(self, slot: Slot, text: str) -> None:
        """The worker could not unpickle a job: send it again by value, or fail its items."""
        job = self._next_job(slot)
        if job is None:
            return
        if not job.by_value:
            job.by_value = True
            self._dispatch(job)
            return
        self._fail_each(job, lambda item: (
            f"worker {slot.wid} of stage {self.stage!r} could not unpickle item {item}: {text}"))

    @staticmethod
    def _fail_each(job: Job, message: Callable[[str], str]) -> None:
        """Settle ``job`` with each of its items failed: a :class:`WorkerError` with
        ``message(the item, described)``, counted against the stage's failure budget."""
        failures: list[tuple[int, BaseException]] = [
            (i, WorkerError(message(describe_item(item)))) for i, item in enumerate(job.items)
        ]
        settle(job, merge(job, [], failures, 0.0), None)
