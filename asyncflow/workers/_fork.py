"""Workers that share the parent's pages: ``Processes(start_method="fork")``.

Forking a process that runs other threads can deadlock the child on a lock one of them held
(a buffered stream's, a logging handler's, one of the user's). So the parent is forked once per
pool, while the run is being built on the consumer's thread, before the run's own threads start,
and only when no other Python thread is alive (:func:`fork_refusal`). That child, the
*template*, runs one thread and does nothing but fork the pool's workers on request, from the
parent's pages as they were at that moment: the workers share them copy-on-write, as torch's
forked workers do, and need no pickling of the stage function or its Dataset. A dead worker's
replacement forks from the template too, at any time. The template lives as long as its pool.

Threads of C libraries (OpenBLAS's pool, started by importing NumPy; torch's intra-op pool)
are not Python threads: they register fork handlers of their own, and torch's DataLoader forks
beside them too. Nor are the reader threads of asyncflow's process pools (another loader's
persistent workers): each holds its :class:`ReaderGate` except while it waits on its pipes,
holding nothing, and the template forks only with every gate in hand. Python 3.12 warns about
any fork of a process with several threads; that warning is muted for the template's fork
alone, once the check has found no other Python thread.

The template freezes the garbage collector's view of every object it inherited
(``gc.freeze()``, as CPython's docs advise before a fork): the workers inherit that, so their
collections never walk the parent's objects. A full collection writes to every tracked
object's header, which copies each page of the parent's heap into the worker (41 MiB per
worker for a parent that imported torch, docs/performance.md). The parent's own collector
is untouched.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import socket
import struct
import threading
import warnings
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from .._errors import ConfigError
from ._worker_process import serve

__all__ = [
    "ForkRefused", "ForkTemplate", "ForkedWorker", "ReaderGate", "fork_refusal", "fork_refused",
]

_INT = struct.Struct("<i")
_gates: dict[threading.Thread, threading.Lock] = {}  # the pools' reader threads, see ReaderGate
_gates_lock = threading.Lock()


class ReaderGate:
    """Held by a pool's reader thread for its whole life except while it waits on its pipes
    (:meth:`waiting`), when it holds no lock and runs no Python: a fork taken with every gate
    in hand (:func:`_every_gate`) finds each reader there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> ReaderGate:
        self._lock.acquire()
        with _gates_lock:
            _gates[threading.current_thread()] = self._lock
        return self

    def __exit__(self, *exc: object) -> None:
        with _gates_lock:
            _gates.pop(threading.current_thread(), None)
        self._lock.release()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()


@contextlib.contextmanager
def _every_gate() -> Iterator[None]:
    with _gates_lock:
        locks = list(_gates.values())
    with contextlib.ExitStack() as taken:  # released, those taken, however this ends
        for lock in locks:
            taken.enter_context(lock)
        yield


def fork_refusal() -> str | None:
    """Why the parent cannot be forked now, or ``None`` when it can: no other Python thread
    than pools' readers (the caller holds their gates, see :class:`ReaderGate`)."""
    if not hasattr(os, "pidfd_open") or "fork" not in multiprocessing.get_all_start_methods():
        return "this platform has no fork with process descriptors (Linux only)"
    others = [t.name for t in threading.enumerate()
              if t is not threading.current_thread() and t not in _gates]
    if others:
        return (f"{len(others)} other Python thread(s) run in this process ("
                f"{', '.join(sorted(others)[:4])}{', ...' if len(others) > 4 else ''}); a "
                "child forked now could deadlock on a lock one of them holds")
    return None


def fork_refused(stage: str, reason: str) -> ConfigError:
    """The error for a pool that asked for fork alone, refused for ``reason``."""
    return ConfigError(
        f"stage {stage!r}: its workers cannot fork from this process now: {reason}. "
        "Start them from the forkserver (start_method='forkserver'; the function and its "
        "data are then pickled), or build the run where no other thread runs"
    )


class ForkRefused(RuntimeError):
    """The parent cannot be forked now; the message is :func:`fork_refusal`'s reason, checked
    with every :class:`ReaderGate` in hand. The pool raises :func:`fork_refused` or starts its
    workers another way."""


class ForkedWorker:
    """The parent's handle on a worker forked by the template (``multiprocessing.Process``'s
    methods that the pool uses). The template writes the exit code to ``sentinel`` when it
    reaps the worker; end of file there without one means the template itself is gone."""

    def __init__(self, pid: int, sentinel: int) -> None:
        self.pid = pid
        self.sentinel = sentinel
        self.exitcode: int | None = None
        self._ended = False

    def _poll(self, timeout: float | None) -> bool:
        if not self._ended and self.sentinel >= 0 and wait([self.sentinel], timeout):
            data = os.read(self.sentinel, _INT.size)
            self.exitcode = _INT.unpack(data)[0] if len(data) == _INT.size else None
            self._ended = True
        return self._ended

    def is_alive(self) -> bool:
        return not self._poll(0)

    def join(self, timeout: float | None = None) -> None:
        self._poll(timeout)

    def _signal(self, signum: int) -> None:
        if not self._poll(0):  # reaped workers' pids may be reused: never signal those
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        if not self._poll(0):
            raise ValueError("cannot close a worker that is still running")
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


class ForkTemplate:
    """A child forked from the parent now, that forks the workers of one pool on request.

    Args:
        setup: What each worker serves from (``_boot.worker_setup``), as it is: it may hold
            anything of the parent (a Dataset that cannot be pickled, say).
        status_path: The pool's status file.
        name: The template's process name.

    Raises:
        ForkRefused: :func:`fork_refusal` gives a reason.
    """

    def __init__(self, setup: dict[str, Any], status_path: str, name: str) -> None:
        self._lock = threading.Lock()
        self._sock, theirs = socket.socketpair()
        self.process = multiprocessing.get_context("fork").Process(
            target=_template_main, args=(theirs, setup, status_path), name=name, daemon=True)
        with _every_gate(), warnings.catch_warnings():
            reason = fork_refusal()  # with the gates in hand: no reader can start a thread
            if reason is not None:
                self._sock.close()
                theirs.close()
                raise ForkRefused(reason)
            # Python 3.12 counts the OS's threads: C libraries' pools (see the module's
            # docstring), which fork_refusal has just found to be the only others. No other
            # Python thread runs, so nothing else reads or changes the filters meanwhile.
            warnings.filterwarnings("ignore", message=r".*is multi-threaded, use of fork\(\)",
                                    category=DeprecationWarning)
            self.process.start()
        theirs.close()
        self._finalizer = weakref.finalize(self, _stop, self._sock, self.process)
        self._finalizer.atexit = False  # at exit, after its pool's workers (the pool stops it)

    def spawn(self, wid: int) -> tuple[ForkedWorker, Connection]:
        """Fork worker ``wid``; its handle and the parent's end of its duplex pipe.

        Raises:
            OSError: The template is gone.

        Cancellation:
            Blocks its thread until the template has forked (milliseconds).
        """
        ours, child = multiprocessing.Pipe(duplex=True)
        sentinel_r, sentinel_w = os.pipe()
        try:
            with self._lock:
                socket.send_fds(self._sock, [_INT.pack(wid)], [child.fileno(), sentinel_w])
                data = self._sock.recv(_INT.size)
            if len(data) != _INT.size:
                raise OSError("the fork template of the pool is gone")
        except BaseException:
            ours.close()
            os.close(sentinel_r)
            raise
        finally:
            child.close()
            os.close(sentinel_w)
        return ForkedWorker(_INT.unpack(data)[0], sentinel_r), ours

    def close(self) -> None:
        """Stop the template (its workers are the pool's to stop first)."""
        self._finalizer()


def _stop(sock: socket.socket, process: Any) -> None:
    sock.close()  # the template exits at the end of its socket
    process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join()
    process.close()


def _template_main(sock: socket.socket, setup: dict[str, Any], status_path: str) -> None:
    gc.freeze()  # before anything here can collect: see the module's docstring
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    children: dict[int, tuple[int, int]] = {}  # pidfd: (pid, sentinel's write end)
    while True:
        ready: list[Any] = wait([sock.fileno(), *children])  # poll: no FD_SETSIZE limit
        for fd in ready:
            if fd in children:
                pid, sentinel = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the parent closed its end
                    os.write(sentinel, _INT.pack(os.waitstatus_to_exitcode(status)))
                os.close(sentinel)
                os.close(fd)
        if sock.fileno() not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, _INT.size, 2)
        if not data:
            return  # the parent closed the socket, or is gone
        conn_fd, sentinel = fds
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                os.close(sentinel)
                for pidfd, (_, other) in children.items():
                    os.close(pidfd)
                    os.close(other)
                serve(Connection(conn_fd), setup, status_path, _INT.unpack(data)[0])
                code = 0
            finally:
                os._exit(code)
        os.close(conn_fd)
        children[os.pidfd_open(pid)] = (pid, sentinel)
        sock.sendall(_INT.pack(pid))
