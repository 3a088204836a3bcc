"""``workers="auto"``: processes where they are safe and help, threads otherwise, with the
reason shown in ``stats()``."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from .._errors import ConfigError
from ._worker_options import Processes, resolve_workers

__all__ = ["choose_workers", "usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def choose_workers(
    fn: Any, workers: int, *, stage: str, min_cores: int = 2, small: str = "",
    needed: str | None = None,
) -> tuple[Processes | None, str]:
    """What ``workers="auto"`` picks for a sync stage: processes where they are safe and
    there are at least ``min_cores`` usable cores.

    Args:
        fn: The stage function (it must pickle).
        workers: How many workers the stage would have.
        stage: The stage's name, for messages.
        min_cores: Fewer usable cores than this: threads (``small`` says why).
        small: Why threads win below ``min_cores``, with the figures behind it.
        needed: Why only worker processes give the stage's meaning (say, torch's
            ``worker_init_fn``): then any number of cores and workers takes processes,
            where they are safe (not in a daemonic process, nor without writable shared
            memory, nor for a function that does not pickle).

    Returns:
        ``(Processes or None for threads, the reason)``; the reason is shown in ``stats()``.
    """
    from ._segments import SHM_DIR

    cores = usable_cpus()
    why_not: str | None = None
    if needed is None and (cores < 2 or workers < 2):
        why_not = f"{min(cores, workers)} worker(s) on {cores} usable core(s) gain nothing"
    elif needed is None and cores < min_cores:
        why_not = f"{cores} usable cores: {small}"
    elif multiprocessing.current_process().daemon:
        why_not = "this is already a worker process (daemonic processes cannot have children)"
    elif not os.access(SHM_DIR, os.W_OK):
        why_not = f"shared memory ({SHM_DIR}) is not writable"
    if why_not is None:
        try:
            from ._boot import check_picklable

            check_picklable(fn, Processes(), stage)
        except ConfigError as exc:
            why_not = str(exc)
    if why_not is not None:
        return None, f"threads (workers='auto'): {why_not}"
    if needed is not None:
        return resolve_workers("processes"), f"processes (workers='auto'): {needed}"
    return resolve_workers("processes"), (
        f"processes (workers='auto'): {workers} worker processes on {cores} usable cores; "
        "the GIL caps threads, and a training loop's own Python competes with them for it"
    )
