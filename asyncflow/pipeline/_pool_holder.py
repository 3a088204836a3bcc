"""``PoolHolder``: the persistent worker-process pools that belong to one pipeline object."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["PoolHolder"]


class PoolHolder:
    """The persistent worker-process pools of one pipeline object, by stage index.

    They stop when the holder (the pipeline object) is garbage-collected, or at exit. Each
    is a ``ProcessPool``, not imported here: a pipeline loads it only once a stage runs on
    processes.
    """

    def __init__(self) -> None:
        self.pools: dict[int, Any] = {}
        self._lock = threading.Lock()
        weakref.finalize(self, _shutdown_pools, self.pools)

    def get(self, index: int, make: Callable[[], Any]) -> Any:
        """The persistent pool of stage ``index``, made by ``make()`` when it has none (or
        its pool was shut down)."""
        with self._lock:
            pool = self.pools.get(index)
            if pool is None or pool.closed:
                pool = self.pools[index] = make()
            return pool

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop every persistent worker now."""
        _shutdown_pools(self.pools, timeout)


def _shutdown_pools(pools: dict[int, Any], timeout: float = 2.0) -> None:
    for pool in list(pools.values()):
        pool.shutdown(timeout)
    pools.clear()
