"""How much of a function's time holds the GIL: a forecast of how it scales on threads.

A probe thread sleeps a short interval over and over and notes how late each wake-up is. A
thread that wakes needs the GIL before it can run a line of Python, so while the function
under test holds the GIL, the probe wakes late by at least the switch interval (which is
lowered during the measurement); while the function runs C code that released the GIL
(libjpeg, zlib, a ``sleep``), the probe wakes on time.

On a busy machine a wake-up is also late when no core is free. On Linux the probe reads its
own run-queue wait (``/proc/thread-self/schedstat``) around each sleep and subtracts it, so
that only the wait for the GIL (a futex sleep, not a run-queue wait) is left. "Late" then
means later than the probe's own lateness with the calling thread idle, measured before and
after (its 90th percentile plus a margin, capped at half the switch interval); the share of
late wake-ups, less the share that is late with the GIL free, estimates the share of time
held. A hold shorter than the margin (25 us) is missed in part, so short, frequent holds read
a little low.

Benchmark tooling, not part of the library: ``bench_gil.py`` measures each kernel with it,
and docs/performance.md quotes the readings. It imports only the standard library and
asyncflow's errors, so that the probe itself adds no work to what it measures.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncflow import ConfigError

__all__ = ["GilProfile", "measure_gil"]

_PROBE_INTERVAL = 0.0005  # s the probe sleeps between wake-ups
_SWITCH_INTERVAL = 0.001  # s, while measuring: a held GIL delays a wake-up at least this long
_MARGIN = 0.000025  # s beyond the probe's quiet p90 that marks a wake-up as late
_BASELINE_SAMPLES = 200
_MIN_SAMPLES = 50  # wake-ups under load before min_seconds may end the measurement


@dataclass(frozen=True)
class GilProfile:
    """What :func:`measure_gil` found.

    Attributes:
        seconds_per_item: Wall time per call on one thread (with the probe running).
        held_share: Fraction of that time the calling thread held the GIL, 0 to 1.
        items: Calls measured (the warm-up call not counted).
    """

    seconds_per_item: float
    held_share: float
    items: int

    @property
    def max_thread_speedup(self) -> float:
        """Amdahl's bound on calls running in parallel on threads: ``1 / held_share``."""
        return 1 / self.held_share if self.held_share > 0 else float("inf")


class _Probe:
    """Sleeps ``interval`` over and over on its own thread; records each wake-up's lateness.

    ``lateness`` excludes the time the probe spent waiting for a core (where the kernel
    reports it), so that it counts the wait for the GIL, not for the scheduler.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.lateness: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asyncflow-gil-probe", daemon=True)

    def _run(self) -> None:
        clock, sleep, interval, out = time.perf_counter, time.sleep, self.interval, self.lateness
        with _RunQueueClock() as queued:
            while not self._stop.is_set():
                q0 = queued()
                start = clock()
                sleep(interval)
                q1 = queued()
                out.append(clock() - start - interval - (q1 - q0))

    def __enter__(self) -> _Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _RunQueueClock:
    """Seconds the calling thread has waited for a core (0 where the kernel does not say).

    Read with libc's ``pread`` through :class:`ctypes.PyDLL`, which keeps the GIL:
    ``os.pread`` releases it and takes it back, and the run-queue wait of taking it back
    would be counted between two reads but fall outside the sleep they bracket.
    """

    def __init__(self) -> None:
        self._fd = -1
        self._buf = ctypes.create_string_buffer(64)
        self._pread: Any = None

    def __enter__(self) -> Callable[[], float]:
        try:
            pread = ctypes.PyDLL(None).pread
            pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
            pread.restype = ctypes.c_ssize_t
            self._pread = pread
            # Opened by the thread that reads it: thread-self names that thread's task.
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self._read()
        except (OSError, AttributeError, ValueError, IndexError):
            self._close()
            return lambda: 0.0
        return self._read

    def _read(self) -> float:
        n = self._pread(self._fd, self._buf, len(self._buf), 0)
        if n <= 0:
            raise OSError("cannot read /proc/thread-self/schedstat")
        return int(self._buf.raw[:n].split()[1]) / 1e9

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __exit__(self, *exc: object) -> None:
        self._close()


def _quiet_lateness(interval: float, samples: int) -> list[float]:
    """The probe's lateness while the calling thread waits (the GIL free)."""
    with _Probe(interval) as probe:
        deadline = time.perf_counter() + 1.0
        while len(probe.lateness) < samples and time.perf_counter() < deadline:
            time.sleep(0.005)
    return list(probe.lateness)


def _threshold(quiet: Sequence[float]) -> tuple[float, float]:
    """A lateness threshold (p90 + margin) and the share of quiet wake-ups above it (noise)."""
    samples = sorted(quiet) or [0.0]
    # A held GIL delays a wake-up by a switch interval or more: a threshold above half of it
    # would miss holds; the noise share measured at the capped threshold corrects for that.
    threshold = min(samples[min(len(samples) - 1, int(0.9 * len(samples)))] + _MARGIN,
                    _SWITCH_INTERVAL / 2)
    return threshold, sum(1 for s in samples if s > threshold) / len(samples)


def _held_share(lateness: Sequence[float], threshold: float, noise: float) -> float:
    """Late wake-ups, less those late with the GIL free: ``(late - noise) / (1 - noise)``.

    A wake-up is late if the GIL was held at that instant (nearly always, unless the hold
    ended within ``_MARGIN``), or, with probability ``noise``, for reasons of its own.
    """
    if not lateness:
        return 0.0
    late = sum(1 for x in lateness if x > threshold) / len(lateness)
    return min(1.0, max(0.0, (late - noise) / (1.0 - noise)))


def measure_gil(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    min_seconds: float = 0.2,
    max_seconds: float = 2.0,
) -> GilProfile:
    """Measure the share of ``fn``'s time that holds the GIL, on the calling thread.

    Calls ``fn(item)`` over ``items`` (once each, then cycling until ``min_seconds`` have
    passed and enough probe samples are in), never starting a call after ``max_seconds``;
    one warm-up call comes first, not counted. Meanwhile a probe thread wakes every 0.5 ms
    and notes whether it had to wait for the GIL. ``sys.setswitchinterval`` is lowered to
    1 ms for the measurement and restored afterwards, so that pure Python hands the GIL to
    the probe quickly; this also slows pure-Python code slightly, so ``seconds_per_item``
    is an upper bound.

    How to read ``held_share``: by Amdahl's law, threads can run at most about
    ``1 / held_share`` calls at once, whatever the core count. Near 0 (``time.sleep``,
    zlib, hashing a large buffer, libjpeg decoding) scales with cores on threads; near 1
    (a Python loop) runs one call at a time however many threads are given, and wants
    processes. A consumer that holds the GIL itself (a training loop's own Python) shrinks
    what is left for the threads further. The figure is a statistical estimate (a few
    hundred samples): read it to about 0.05 (a function that never holds the GIL reads 0 to
    0.05), with more noise on a loaded machine; on Linux the probe's wait for a free core is
    subtracted, which keeps other programs' load from reading as GIL. On a machine with
    more runnable threads than cores, the calling thread also waits for a core at times
    with the GIL free, and a pure-Python function then reads below 1 (0.7 to 0.95). The
    probe cannot tell which thread holds the GIL, and the switch interval is process-wide:
    measure with no other Python thread of the process busy (not inside a running
    pipeline's workers). On a free-threaded build with the GIL disabled it reads near 0.

    Args:
        fn: The function to measure, called with one item at a time.
        items: The arguments to call it with (cycled).
        min_seconds: Measure at least this long (seconds).
        max_seconds: Start no call after this long (seconds).

    Returns:
        A :class:`GilProfile`: wall seconds per call, the GIL-held share and calls measured.

    Raises:
        ConfigError: ``items`` is empty, or the time bounds are negative or out of order.
        Exception: Whatever ``fn`` raises, after the probe has stopped and the switch
            interval is restored.

    Cancellation:
        Blocks the calling thread for up to ``max_seconds`` plus one call of ``fn``; call it
        through a thread (``asyncio.to_thread``) from async code. It cannot be interrupted
        between calls other than by an exception from ``fn``.
    """
    if len(items) == 0:
        raise ConfigError("measure_gil needs at least one item to call fn with")
    if not 0 <= min_seconds <= max_seconds:
        raise ConfigError(
            f"need 0 <= min_seconds <= max_seconds, got {min_seconds!r}, {max_seconds!r}"
        )
    old = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL)
    try:
        # The quiet lateness is sampled before and after: other programs' load drifts.
        quiet = _quiet_lateness(_PROBE_INTERVAL, _BASELINE_SAMPLES // 2)
        fn(items[0])
        calls, elapsed, lateness = _run_under_probe(fn, items, min_seconds, max_seconds)
        quiet += _quiet_lateness(_PROBE_INTERVAL, _BASELINE_SAMPLES // 2)
    finally:
        sys.setswitchinterval(old)
    held = _held_share(lateness, *_threshold(quiet))
    return GilProfile(seconds_per_item=elapsed / calls, held_share=held, items=calls)


def _run_under_probe(
    fn: Callable[[Any], Any], items: Sequence[Any], min_seconds: float, max_seconds: float
) -> tuple[int, float, list[float]]:
    """Call ``fn`` over ``items`` (cycling) while the probe runs: calls, seconds, lateness."""
    n, calls, clock = len(items), 0, time.perf_counter
    with _Probe(_PROBE_INTERVAL) as probe:
        start = clock()
        elapsed = 0.0
        while elapsed < max_seconds and (
            calls < n or elapsed < min_seconds or len(probe.lateness) < _MIN_SAMPLES
        ):
            fn(items[calls % n])
            calls += 1
            elapsed = clock() - start
    return calls, elapsed, list(probe.lateness)
