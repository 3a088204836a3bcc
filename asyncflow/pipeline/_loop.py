"""The run's event loop: making it, cancelling what a crashed run left on it, and stopping
the runs still going at interpreter exit. A future is settled, or a waiter woken, on its loop
or from another thread by ``asyncflow.workers``' ``settle`` / ``settle_soon`` (the one way:
worker processes' results reach the loop by it too)."""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing.util  # noqa: F401  (why: see _stop_all_at_exit)
import os
import time
import weakref
from typing import Any

__all__ = ["LIVE_RUNS", "cancel_pending", "new_loop"]


def new_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop: uvloop when installed, unless ``ASYNCFLOW_LOOP=asyncio``."""
    if os.environ.get("ASYNCFLOW_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a crashed run left behind, and let them finish (as asyncio.run)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


#: Runs started and not yet garbage-collected (``Runtime`` objects: ``request_stop()`` and
#: ``join(timeout)``), stopped at interpreter exit should they still be going.
LIVE_RUNS: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop runs still going at interpreter exit, so that their resources close cleanly.

    Registered after ``multiprocessing``'s own exit hook (imported above), so it runs first
    (``atexit`` runs last-registered first): runs stop their worker processes before
    ``multiprocessing`` joins its children.
    """
    runs = list(LIVE_RUNS)
    for run in runs:
        run.request_stop()
    deadline = time.monotonic() + 3.0
    for run in runs:
        run.join(max(0.0, deadline - time.monotonic()))
