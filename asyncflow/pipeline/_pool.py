"""``Pool``: what a run's pools of workers (threads, processes) have in common.

A run holds one thread pool (:class:`~asyncflow.pipeline._thread_pool.WorkerPool`), shared by
its sync stages and the loop-side helpers of features; a map stage on worker processes holds a
process pool (:class:`~asyncflow.pipeline._process_pool.ProcessPool`), the run's or, when
persistent, the pipeline object's (:class:`~asyncflow.pipeline._pool_holder.PoolHolder`). Both
answer :class:`Pool`: their statistics, whether they are shut down, and shutting down with
the labels of the calls a stop abandoned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Pool", "PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    """One pool at one moment.

    Attributes:
        kind: ``"threads"`` or ``"processes"``.
        name: The pool's name (the prefix of its threads' or processes' names).
        size: The most workers it runs at once.
        workers: The workers started so far (alive).
        busy: Calls (threads) or chunks (processes) being worked on or queued.
    """

    kind: str
    name: str
    size: int
    workers: int
    busy: int


@runtime_checkable
class Pool(Protocol):
    """A pool of workers owned by a run or a pipeline object."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        ...

    def statistics(self) -> PoolStats:
        """The pool now (any thread)."""
        ...

    def shutdown(self, timeout: float = 2.0) -> list[str]:
        """Stop the workers, waiting up to ``timeout`` seconds; idempotent.

        Returns:
            The labels of the calls still running when it gave up (threads that cannot be
            interrupted); ``[]`` for a pool whose workers can be killed.
        """
        ...
