"""Shared test doubles: child-process runners and instrumented stage functions."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_child(code: str, *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with faulthandler armed; return its result."""
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=ROOT,
    )


def start_child(code: str) -> subprocess.Popen[str]:
    """Start ``code`` in a fresh interpreter, stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT,
    )


class InFlight:
    """Counts concurrent calls of a function and remembers the peak."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.now = 0
        self.peak = 0
        self.calls = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1

    def sync(self, item: Any) -> Any:
        self.enter()
        try:
            time.sleep(self.delay)
            return item
        finally:
            self.leave()

    async def async_(self, item: Any) -> Any:
        import asyncio

        self.enter()
        try:
            await asyncio.sleep(self.delay)
            return item
        finally:
            self.leave()


class Tracked:
    """An item that counts how many of its kind are alive."""

    alive = 0
    peak = 0
    _lock = threading.Lock()

    def __init__(self, index: int, size: int = 0) -> None:
        self.index = index
        self.payload = bytearray(size)
        with Tracked._lock:
            Tracked.alive += 1
            Tracked.peak = max(Tracked.peak, Tracked.alive)

    def __del__(self) -> None:
        with Tracked._lock:
            Tracked.alive -= 1

    @classmethod
    def reset(cls) -> None:
        cls.alive = 0
        cls.peak = 0
