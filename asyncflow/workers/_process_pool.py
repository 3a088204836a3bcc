"""Worker processes for one sync stage: start, dispatch chunks, collect results, replace the dead.

The parent keeps one duplex pipe per worker and sends each chunk to the worker with the least
work queued (at most a few chunks each), so it always knows which chunks a worker holds; the
shared status file says which item of its current chunk. One reader thread per pool waits on
every pipe and every worker's process sentinel at once (``multiprocessing.connection.wait``),
unpickles results (mapping their shared-memory segments) and settles the futures on the run's
loop. Results are tied to no loop, so persistent workers serve one run after another.

A worker that dies is reported with the item it held: that item fails with a
:class:`~asyncflow.WorkerError` (which counts against the stage's failure budget), the other
items of its chunks go to the other workers, and a new worker takes its number.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import mmap
import multiprocessing
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .._errors import ConfigError, WorkerError
from .._redact import describe_item
from . import _segments
from ._boot import Boot, boot_payload, start_context, without_main, worker_setup
from ._fork import ForkRefused, ForkTemplate, fork_refused
from ._jobs import Job, Slot, blame, exit_reason, merge, settle, stop_workers
from ._pool_reader import PoolReader
from ._portable import ChunkResult
from ._worker_options import Processes
from ._worker_process import STATUS, map_status, send, serve

__all__ = ["ProcessPool"]

logger = logging.getLogger("asyncflow")

class ProcessPool(PoolReader):
    """``size`` worker processes running ``fn`` for the stage ``stage``.

    Args:
        fn: The stage function; pickled once, by value if it cannot be by reference.
        size: How many workers.
        spec: Start method, init hook, seed.
        stage: The stage's name, for messages and the workers' :class:`WorkerInfo`.
        round_robin: Chunk ``first`` goes to worker ``first % size`` rather than to the least
            loaded (the engine reads it off ``fn``: ``asyncflow_round_robin``, see its
            ``_protocols.round_robin``); its caller bounds what each worker holds (the
            loader's prefetch_factor).

    Raises:
        ConfigError: ``fn`` or ``spec.init`` cannot be pickled (names it; suggests threads);
            or ``spec`` asks for ``fork`` where the parent cannot be forked safely (says why),
            with no ``fallback`` (with one, the pool starts its workers that way instead and
            says so in :attr:`start_note`).
    """

    def __init__(self, fn: Callable[[Any], Any], size: int, spec: Processes, stage: str, *,
                 round_robin: bool = False):
        self.size = size
        self.spec = spec
        self.stage = stage
        self.prefix = _segments.segment_prefix(secrets.token_hex(4))
        self._status_path = os.path.join(_segments.SHM_DIR, f"{self.prefix}status")
        self._template: ForkTemplate | None = None
        #: How the workers start, and why, where ``spec.fallback`` left a choice (the run
        #: shows it in ``stats().notes``).
        self.start_note: str | None = None
        refusal = None
        if spec.start_method == "fork":  # its template forks now, before the run's threads
            setup = worker_setup(fn, size, spec, stage, self.prefix)
            try:
                self._template = ForkTemplate(setup, self._status_path, f"asyncflow-{stage}-fork")
            except ForkRefused as exc:
                if spec.fallback is None:
                    raise fork_refused(stage, str(exc)) from None
                refusal = str(exc)
                self.spec = replace(spec, start_method=spec.fallback, fallback=None)
            self.start_note = _start_note(spec, refusal)
        self.boot: Boot | None = None
        if self._template is None:
            try:
                self.boot = boot_payload(fn, size, self.spec, stage, self.prefix)
            except ConfigError as exc:
                if refusal is None:
                    raise
                raise ConfigError(f"{exc}; forked workers need no pickling, but this "
                                  f"process cannot be forked now: {refusal}") from None
        self.deaths = 0
        self.round_robin = round_robin
        self._jids = itertools.count()
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._slots: list[Slot] = []
        self._broken: BaseException | None = None
        self._closed = False
        self._started = False
        self._start_lock = threading.Lock()  # held while the workers are spawned
        self._start_error: BaseException | None = None
        self._reader: threading.Thread | None = None
        self._status: mmap.mmap | None = None

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers (blocking: call it off the run's loop). Idempotent.

        Runs sharing a persistent pool may call it at once: each returns once the workers
        are spawned (else it would send chunks to no worker, and wait forever).

        Raises:
            WorkerError: An earlier start failed (it raised why).

        Cancellation:
            Blocks its thread until the workers are spawned (they boot on their own).
        """
        with self._start_lock:
            if self._start_error is not None:
                raise WorkerError(f"the workers of stage {self.stage!r} could not start: "
                                  f"{self._start_error!r}") from self._start_error
            if self._closed:
                raise RuntimeError("the process pool is shut down")
            if not self._started:
                try:
                    self._start()
                except BaseException as exc:
                    self._start_error = exc
                    self.shutdown(0.0)
                    raise
                self._started = True

    def _start(self) -> None:
        _segments.sweep_stale()
        self._status = map_status(self._status_path, self.size)
        if self.boot is not None:
            self._context = start_context(self.spec, self.boot.core)
        for wid in range(self.size):
            self._slots.append(self._spawn(wid))
        self._reader = threading.Thread(
            target=self._read_loop, name=f"asyncflow-{self.stage}-results", daemon=True
        )
        self._reader.start()

    def _spawn(self, wid: int) -> Slot:
        if self._template is not None:
            return Slot(wid, *self._template.spawn(wid))
        assert self.boot is not None
        parent, child = multiprocessing.Pipe(duplex=True)
        process = self._context.Process(
            target=serve, args=(child, self.boot.share(self._name), self._status_path, wid),
            name=f"asyncflow-{self.stage}-{wid}", daemon=True,
        )
        with without_main():
            process.start()
        child.close()
        return Slot(wid, process, parent)

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop every worker (asked, then terminated, then killed: never abandoned) and sweep
        their segments. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots = list(self._slots)
            pending = self._take_jobs()
        stop_workers(slots, timeout)  # their sentinels wake the reader, which sees it closed
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout + 1.0)
        for slot in slots:
            slot.close()
        if self._status is not None:
            self._status.close()
        if self._template is not None:
            self._template.close()
        _segments.sweep(self.prefix)
        error = RuntimeError("the process pool was shut down")
        for job in pending:
            settle(job, None, error)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- work ---------------------------------------------------------------------------

    def submit(self, items: list[Any], first: int, epoch: int, *,
               keys: list[int] | None = None) -> asyncio.Future[ChunkResult]:
        """Run ``fn`` on ``items`` (positions ``first``, ``first + 1``, ... in the stage's
        input; seeded from them, or from ``keys`` when given, and ``epoch``) in a worker.

        Returns:
            A future of the running loop: ``(values with FAILED at failed places,
            [(index, exception)], seconds the worker spent)``.

        Cancellation:
            Cancelling the future drops the result; the worker finishes the chunk.
        """
        loop = asyncio.get_running_loop()
        job = Job(next(self._jids), items, first, epoch, keys, loop, loop.create_future())
        self._dispatch(job)
        return job.fut

    def _dispatch(self, job: Job) -> None:
        try:
            payload, segments = _segments.dumps(job.message(), self._name, by_value=job.by_value)
        except Exception as exc:
            settle(job, None, exc)
            return
        with self._lock:
            if self._broken is not None or self._closed or not self._started:
                _segments.discard(segments)
                settle(job, None, self._broken or RuntimeError(
                    f"the process pool is {'shut down' if self._closed else 'not started'}"))
                return
            slot = self._pick(job)
            slot.jobs.append(job)
            # Sent under the lock: the reader matches each answer to the oldest job of its
            # slot, so jobs must reach a worker in the order they were queued for it, also
            # when the loop (submit) and the reader thread (resubmit) dispatch at once.
            try:
                send(slot.conn, "job", payload, segments)
            except (OSError, ValueError):  # the worker died: its replacement takes the job
                _segments.discard(segments)

    def _pick(self, job: Job) -> Slot:
        """The worker for ``job`` (lock held): the least loaded, or in turn (see
        ``round_robin``; a replacement takes its dead worker's slot, and its jobs)."""
        if self.round_robin and job.keys is None:
            return self._slots[job.first % self.size]
        return min(self._slots, key=lambda s: len(s.jobs))

    def _take_jobs(self) -> list[Job]:
        """Every job the workers hold, taken from them (lock held)."""
        jobs = [job for slot in self._slots for job in slot.jobs]
        for slot in self._slots:
            slot.jobs.clear()
        return jobs

    def _name(self) -> str:
        return f"{self.prefix}p{next(self._names)}"

    def _died(self, slot: Slot) -> None:
        """The worker of ``slot`` is gone: fail the item it was on, and start a replacement
        that takes its jobs over (and those sent to it meanwhile), or fail the pool."""
        slot.process.join(0.5)
        reason, pid = exit_reason(slot.process.exitcode), slot.process.pid
        with self._lock:
            if self._closed or self._broken is not None:
                return
            jobs = list(slot.jobs)
            slot.jobs.clear()
            self.deaths += 1
        died = f"worker {slot.wid} of stage {self.stage!r} (pid {pid}) died"
        if not slot.ready:
            self._fail_pool(WorkerError(f"{died} while starting ({reason})"), jobs)
            return
        if jobs:  # before the replacement, which writes its own status in the same slot
            assert self._status is not None
            blame(jobs[0], STATUS.unpack_from(self._status, slot.wid * STATUS.size),
                  lambda item: WorkerError(
                      f"{died} ({reason}) while processing item {describe_item(item)}"))
        try:
            replacement = self._spawn(slot.wid)
        except OSError as exc:  # a fork pool's template is gone (stopped at exit, killed)
            self._fail_pool(WorkerError(f"{died} ({reason}) and could not be replaced: {exc}"),
                            jobs)
            return
        with self._lock:
            closed = self._closed  # then shutdown() stopped the workers it saw: not this one
            if not closed:
                self._slots[self._slots.index(slot)] = replacement
                jobs += slot.jobs  # sent to the dead worker while its replacement started
        slot.close()
        if closed:
            stop_workers([replacement], 0.0)
            replacement.close()
            for job in jobs:
                settle(job, None, RuntimeError("the process pool was shut down"))
            return
        for job in jobs:
            if len(job.skipped) < len(job.items):
                self._dispatch(job)
            else:
                settle(job, merge(job, [], [], 0.0), None)
        logger.warning("asyncflow: worker %d of stage %r (pid %s) died (%s); replaced",
                       slot.wid, self.stage, pid, reason)

    def _fail_pool(self, error: BaseException, held: list[Job] | None = None) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = error
            jobs = self._take_jobs() + (held or [])
        for job in jobs:
            settle(job, None, self._broken)
        # A broken pool serves nothing more: stop its workers and its reader now (from
        # another thread: this may be the reader), rather than when its owner is collected.
        threading.Thread(target=self.shutdown, name=f"asyncflow-{self.stage}-stop",
                         daemon=True).start()


def _start_note(spec: Processes, refusal: str | None) -> str | None:
    """What the run's notes say of a pool that asked for fork: nothing without a fallback
    (the user chose fork, and got it), else which start method the workers got, and why."""
    if spec.fallback is None:
        return None
    if refusal is None:
        return "worker processes forked from this process, as torch's"
    how = "start from the forkserver" if spec.fallback == "forkserver" else "are spawned"
    return f"worker processes {how}, not forked: {refusal}"
