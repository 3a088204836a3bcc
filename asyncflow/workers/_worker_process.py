"""The main function of a worker process (see ``_process_pool.py`` for the parent's side).

A worker boots once (the stage function, the init hook and the reducer modules arrive in one
pickle), then runs chunks of items as they come, seeding before each item and writing which
item it is on into its slot of a shared status file, so that the parent can name the item if
the worker dies. A thread of its own keeps reading the pipe, so that the parent's sends never
wait for a busy worker; when the pipe breaks (the parent is gone) the worker exits at once.

Messages are ``(kind, payload, segments)`` tuples; payloads go through ``_segments``.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import queue
import signal
import struct
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from .._redact import format_exception, redact
from . import _reducers, _segments
from ._portable import FAILED, noted, portable
from ._seeding import item_seed, seed_everything
from ._worker_options import WorkerInfo, run_worker_setups, set_worker_info

__all__ = ["STATUS", "map_status", "send", "serve"]

#: Per worker: the job id and the index in it of the item being processed (int64 each).
STATUS = struct.Struct("<qq")


def send(conn: Connection, kind: str, payload: bytes, segments: list[tuple[str, int]]) -> None:
    conn.send_bytes(pickle.dumps((kind, payload, segments), protocol=5))


def map_status(path: str, workers: int = 0) -> mmap.mmap:
    """The status file at ``path``, mapped shared: made for ``workers`` (the parent), else
    opened (a worker)."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR if workers else os.O_RDWR, 0o600)
    try:
        if workers:
            os.ftruncate(fd, STATUS.size * workers)
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _picklable(exc: BaseException) -> Any:
    """``exc`` as it can travel back through ``_segments`` (see ``_portable.py``)."""
    return portable(exc, lambda obj: _segments.loads(*_segments.dumps(obj)))


def _receive(conn: Connection, jobs: queue.SimpleQueue[Any]) -> None:
    try:
        while True:
            kind, payload, segments = pickle.loads(conn.recv_bytes())
            if kind == "stop":
                break
            try:
                job = _segments.loads(payload, segments)
            except Exception as exc:  # answered in turn by the main thread: results are FIFO
                # (a class of the parent's __main__ this process cannot import, say: the
                # parent sends the job again by value, or fails it): why, as text
                job = "".join(traceback.format_exception_only(exc)).strip()
            jobs.put(job)
    except (EOFError, OSError):
        os._exit(0)  # the parent is gone or closed the pipe: nobody waits for results
    jobs.put(None)


class _Worker:
    def __init__(self, conn: Connection, wid: int, setup: dict[str, Any], status_path: str):
        self.conn = conn
        self.fn = setup["fn"]
        self.seed = setup["info"]["seed"]
        self.reseed = setup.get("reseed", True)
        # The pid too: a dead worker's replacement takes its number, and a segment the dead one
        # wrote but never sent must not collide with the replacement's names.
        self.prefix = f"{setup['prefix']}w{wid}-{os.getpid()}-"
        self._numbers = itertools.count(1)
        _segments.allocate_as(self.name)  # a result made in shared memory: same names
        self.status = map_status(status_path)
        self.offset = wid * STATUS.size

    def name(self) -> str:
        return f"{self.prefix}{next(self._numbers)}"

    def run_job(self, jid: int, items: list[Any], first: int, epoch: int,
                keys: list[int] | None, skip: list[int]) -> None:
        values: list[Any] = []
        failures: list[tuple[int, BaseException]] = []
        start = time.perf_counter()
        for index, item in enumerate(items):
            if index in skip:  # a dead worker was on it: failed by the parent
                values.append(FAILED)
                continue
            STATUS.pack_into(self.status, self.offset, jid, index)
            if self.reseed:
                key = first + index if keys is None else keys[index]
                seed_everything(item_seed(self.seed, epoch, key))
            try:
                values.append(self.fn(item))
            except BaseException as exc:  # returned to the parent, which decides
                values.append(FAILED)
                failures.append((index, noted(exc)))
        STATUS.pack_into(self.status, self.offset, jid, -1)
        self.reply(jid, values, failures, time.perf_counter() - start)

    def reply(self, jid: int, values: list[Any], failures: list[tuple[int, BaseException]],
              elapsed: float) -> None:
        # An exception may pickle and yet not unpickle (an ``__init__`` with two arguments):
        # the parent would then lose the whole chunk, so each is tried both ways here.
        failures = [(i, _picklable(exc)) for i, exc in failures]
        try:
            payload, segments = _segments.dumps((jid, values, failures, elapsed), self.name)
        except Exception:
            values, failures = self._salvage(values, failures)
            payload, segments = _segments.dumps((jid, values, failures, elapsed), self.name)
        try:
            send(self.conn, "result", payload, segments)
        except BaseException:
            _segments.discard(segments)
            raise

    @staticmethod
    def _salvage(
        values: list[Any], failures: list[tuple[int, BaseException]]
    ) -> tuple[list[Any], list[tuple[int, BaseException]]]:
        """Turn each value that cannot be pickled into a failure of its item (``failures``
        are made portable already: made so again, one sent by state would be lost)."""
        from .._errors import WorkerError

        failed = {i for i, _ in failures}
        out = list(failures)
        for i, value in enumerate(values):
            if i in failed:
                continue
            try:
                pickle.dumps(value, protocol=5)
            except Exception as exc:
                values[i] = FAILED
                out.append((i, WorkerError(redact(
                    f"the result ({type(value).__qualname__}) could not be pickled back from "
                    f"the worker: {exc}"))))
        return values, sorted(out, key=lambda pair: pair[0])


def _unpack(boot: bytes) -> dict[str, Any]:
    """The setup a forkserver's or spawn's worker boots from (``_boot.Boot``'s payload), with
    the parent's reducers registered."""
    core, segments = pickle.loads(boot)
    # the setup's large buffers (a Dataset's arrays) on pages every worker shares
    setup: dict[str, Any] = pickle.loads(core, buffers=_segments.map_private(segments))
    for trigger, provider in setup["lazy"].items():
        _reducers.register_lazy_reducers(trigger, provider)
    _reducers.load_reducer_modules(setup["modules"])
    return setup


def serve(conn: Connection, setup: dict[str, Any] | bytes, status_path: str, wid: int) -> None:
    """Start as worker ``wid`` of ``setup`` (a forked worker gets it as it is; a forkserver's
    or spawn's worker, as its boot payload), then run jobs until told to stop. Never raises:
    errors go to the parent."""
    # Ctrl-C is the parent's to handle; ignored from the start: the boot may take a while
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if isinstance(setup, bytes):
            setup = _unpack(setup)
        info = WorkerInfo(id=wid, pid=os.getpid(), **setup["info"])
        set_worker_info(info)
        _reducers.load_lazy()  # the function's own imports (torch for a Dataset) bring these in
        run_worker_setups(setup["setups"])
        if setup["init"] is not None:
            setup["init"](info)
        worker = _Worker(conn, wid, setup, status_path)
    except BaseException as exc:
        send(conn, "boot_error", format_exception(exc).encode(), [])
        return
    send(conn, "ready", b"", [])
    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(conn, jobs), daemon=True).start()
    while (job := jobs.get()) is not None:
        if isinstance(job, str):  # could not be unpickled here
            send(conn, "unloadable", job.encode(), [])
        else:
            worker.run_job(*job)

