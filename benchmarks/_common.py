"""Helpers shared by the benchmarks: timing, tables, peak memory of a process tree."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


def timed(fn: Callable[[], Any], repeat: int = 1) -> float:
    """Best wall time of ``repeat`` calls, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain Markdown table (it reads well in a terminal and pastes into docs)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


class PeakRSS:
    """Samples the summed RSS of this process and its children every ``interval`` s."""

    def __init__(self, interval: float = 0.005) -> None:
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0
        self.baseline = self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        import psutil

        total = 0
        for proc in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            time.sleep(self._interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.sample())
