"""The run whose event loop runs in this thread: what code on a run's loop may reach of it.

Set by the run's loop thread for its lifetime. :func:`~asyncflow.pipeline.run_thread` finds
the run's thread pool here, and :func:`run_failed` the run's failures.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["RunLocal", "current_run", "enter_run", "run_failed"]


@dataclass(frozen=True)
class RunLocal:
    """What code running on a run's loop thread may reach of its run.

    Attributes:
        pool: The run's thread pool (a ``WorkerPool``), which :func:`run_thread` uses.
        errors: The run's failures so far (appended as stages fail).
    """

    pool: Any
    errors: list[BaseException]


_local = threading.local()


def enter_run(run: RunLocal | None) -> None:
    """Make ``run`` the run of this thread (its loop thread); ``None``: no run."""
    _local.run = run


def current_run() -> RunLocal | None:
    """The run whose event loop runs in this thread, else None."""
    return getattr(_local, "run", None)


def run_failed() -> bool:
    """Whether a stage of the run whose loop runs in this thread has failed so far.

    A stage that ends its output because its input ended cannot tell an end from a failure
    before it (the failing stage ends its output stream, so later stages drain what was
    made before the failure): a stage that must act only on a complete stream (a cache
    committing what it wrote) asks this when its input ends. ``False`` outside a run.
    """
    run = current_run()
    return run is not None and bool(run.errors)
