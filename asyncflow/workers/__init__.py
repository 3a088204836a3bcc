"""Worker processes: a stage's sync calls run in other processes, their results back through
shared memory.

A layer below the engine (``asyncflow.pipeline``), which it never imports: the engine builds a
:class:`ProcessPool` for a map stage on ``workers=Processes(...)`` and awaits its chunks'
results; features reach it through the engine's public paths (``asyncflow.pipeline.shm``,
``asyncflow.pipeline.seeding``, the ``Processes`` options). What is here, by module
(``README.md`` has one line per file):

* the options and the worker's view: ``_worker_options`` (:class:`Processes`,
  :class:`WorkerInfo`, setup hooks);
* the parent's side: ``_process_pool`` (dispatch, dead workers replaced), ``_pool_reader``
  (its reader thread), ``_jobs`` (the chunks a worker holds), ``_boot`` (what a worker boots
  from, the forkserver), ``_fork`` (``start_method="fork"``'s template);
* the worker's side: ``_worker_process`` (boot once, run chunks, seed per item);
* what crosses between them: ``_segments`` (pickles with large buffers in ``/dev/shm``),
  ``_reducers`` (how a type travels), ``_portable`` (exceptions as themselves; ``FAILED``, a
  failed item's place in a chunk's results);
* what the engine shares with them: ``_seeding`` (every random stream, the per-item seeds of
  the workers among them; public as ``asyncflow.pipeline.seeding``) and ``_settle`` (the one
  way a future is settled, from the pool's reader thread as from the engine's threads).

``ProcessPool`` is imported when first used: a pipeline loads it only once a stage runs on
processes.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._boot import check_picklable
from ._portable import FAILED, ChunkResult, noted, portable
from ._reducers import register_lazy_reducers, register_reducer
from ._seeding import (
    SEED_MASK,
    KeyedIterator,
    epoch_random,
    epoch_rng,
    epoch_seed,
    fresh_seed,
    item_random,
    item_seed,
    seed_everything,
)
from ._segments import SHM_DIR, SHM_THRESHOLD, allocate, segment_prefix, sweep
from ._settle import settle, settle_all, settle_soon
from ._worker_options import (
    Processes,
    WorkerInfo,
    register_worker_setup,
    resolve_workers,
    worker_info,
)

if TYPE_CHECKING:
    from ._process_pool import ProcessPool

__all__ = [
    "FAILED",
    "SEED_MASK",
    "SHM_DIR",
    "SHM_THRESHOLD",
    "ChunkResult",
    "KeyedIterator",
    "ProcessPool",
    "Processes",
    "WorkerInfo",
    "allocate",
    "check_picklable",
    "epoch_random",
    "epoch_rng",
    "epoch_seed",
    "fresh_seed",
    "item_random",
    "item_seed",
    "noted",
    "portable",
    "register_lazy_reducers",
    "register_reducer",
    "register_worker_setup",
    "resolve_workers",
    "seed_everything",
    "segment_prefix",
    "settle",
    "settle_all",
    "settle_soon",
    "sweep",
    "worker_info",
]

__getattr__ = lazy_getattr(__name__, {"ProcessPool": "asyncflow.workers._process_pool"})
