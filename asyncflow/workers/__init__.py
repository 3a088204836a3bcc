"""Worker threads and processes: what runs a stage's sync calls, on the run's threads or in
other processes (their results back through shared memory).

A layer below the engine (``asyncflow.pipeline``), which it never imports: the engine builds a
run's :class:`WorkerPool`, and a :class:`ProcessPool` for a map stage on
``workers=Processes(...)``, and awaits their chunks' results; features reach it through the
engine's public paths (``run_thread``, ``choose_workers``, ``asyncflow.pipeline.shm``,
``asyncflow.pipeline.seeding``, the ``Processes`` options). What is here, by module
(``README.md`` has one line per file):

* the threads: ``_thread_pool`` (a run's :class:`WorkerPool`, :func:`run_thread`,
  :func:`run_failed`), ``_offload`` (a chunk's sync calls, an iterator's next chunk);
* the choice: ``_auto`` (``workers="auto"``: :func:`choose_workers`, :func:`usable_cpus`);
* the processes' options and the worker's view: ``_worker_options`` (:class:`Processes`,
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
  way a future is settled, from the pool's reader thread as from the run's threads).

``ProcessPool`` is imported when first used: a pipeline loads it only once a stage runs on
processes.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._auto import choose_workers, usable_cpus
from ._boot import check_picklable
from ._offload import SOURCE_CHUNK, aclose_iterator, next_chunk, run_chunk, run_chunk_remote
from ._portable import FAILED
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
from ._thread_pool import RunLocal, WorkerPool, enter_run, run_failed, run_thread
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
    "SOURCE_CHUNK",
    "KeyedIterator",
    "ProcessPool",
    "Processes",
    "RunLocal",
    "WorkerInfo",
    "WorkerPool",
    "aclose_iterator",
    "allocate",
    "check_picklable",
    "choose_workers",
    "enter_run",
    "epoch_random",
    "epoch_rng",
    "epoch_seed",
    "fresh_seed",
    "item_random",
    "item_seed",
    "next_chunk",
    "register_lazy_reducers",
    "register_reducer",
    "register_worker_setup",
    "resolve_workers",
    "run_chunk",
    "run_chunk_remote",
    "run_failed",
    "run_thread",
    "seed_everything",
    "segment_prefix",
    "settle",
    "settle_all",
    "settle_soon",
    "sweep",
    "usable_cpus",
    "worker_info",
]

__getattr__ = lazy_getattr(__name__, {"ProcessPool": "asyncflow.workers._process_pool"})
