"""How a DataLoader's epochs run: threads or worker processes, and the stages after fetch."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data.dataloader import _DatasetKind

from .._errors import ConfigError
from ..pipeline import Pipeline, Processes, check_picklable, choose_workers, usable_cpus
from ._args import start_method
from ._fetch import Failed, Fetch, Indexed, Positioned, TorchWorkerInit, is_stateful, pin

if TYPE_CHECKING:
    from ._facade import Loader

__all__ = [
    "choose",
    "dataset_of",
    "dataset_states_of",
    "default_workers",
    "deliver",
    "epoch_length",
    "epoch_pipeline",
    "fetch_notes",
    "index_batches",
    "pinning",
    "restore_dataset_states",
    "restored",
    "worker_spec",
]

# Below this many cores a loader's threads beat its processes: a PIL-decoding Dataset holds
# the GIL 7-16% of its time (measured: benchmarks/bench_gil.py), so two threads hardly wait for
# it, while a process pays ~0.6 ms per image to send its collated float batch back. From 4
# cores on, the GIL caps threads (PIL decoding stopped scaling near 4 threads on a 16-core
# machine) and processes win. docs/performance.md has the figures.
PROCESS_CORES = 4
_SMALL = ("a PIL-style Dataset's threads wait little for the GIL, and sending each batch back "
          "from a process costs more (docs/performance.md); pass workers='processes' for a "
          "Dataset whose Python holds the GIL")


def dataset_of(loader: Loader) -> Any:
    """The dataset the loader's threads read, untyped (its optional methods, ``state_dict``,
    are duck-typed): persistent thread workers' own copy once they have it."""
    return loader.dataset if loader._copy is None else loader._copy


def pinning(loader: Loader) -> bool:
    """Whether batches get page-locked: ``pin_memory`` asked, CUDA present, no ``device=``."""
    return bool(loader.pin_memory) and loader.device is None and torch.cuda.is_available()


def worker_spec(loader: Loader, init: TorchWorkerInit) -> Processes:
    """The worker processes' options, from the loader's torch arguments.

    No ``multiprocessing_context`` over a map-style dataset: fork where the pool can when it
    is built, else the forkserver (``Processes.fallback``; the run's notes say which). An
    ``IterableDataset``'s pools are built inside the loader's run, beside its threads, where
    fork is never safe: the forkserver.
    """
    method = start_method(loader.multiprocessing_context)
    default_fork = (loader.multiprocessing_context is None
                    and loader._dataset_kind != _DatasetKind.Iterable)
    return Processes(
        start_method="fork" if default_fork else method,  # type: ignore[arg-type]
        fallback="forkserver" if default_fork else None,
        persistent=bool(loader.persistent_workers),
        init=init,
        seed=loader._worker_seed,
        # a worker_init_fn owns the workers' seeding, as in torch (Lightning's seeds them so)
        reseed=loader.worker_init_fn is None,
    )


def default_workers(loader: Loader) -> int:
    """``num_workers`` for a loader not given one: torch's default, ``0``, wherever workers
    would change what the loader delivers or calls, and the usable cores elsewhere.

    Workers change it for an ``IterableDataset`` (each worker iterates its own copy: every
    item once per worker, unless the dataset splits itself), a ``worker_init_fn`` (torch
    calls none without workers) and a dataset that asks ``get_worker_info()`` (``None``
    without workers). A map-style dataset's batches are the same whoever fetches them.
    """
    if (loader._dataset_kind == _DatasetKind.Iterable or loader.worker_init_fn is not None
            or _asks_worker_info(loader.dataset, loader.collate_fn)):
        return 0
    return usable_cpus()


def _by_worker(loader: Loader) -> str | None:
    """Why what the loader delivers depends on the workers' identities, if it does: an
    iterable dataset read by several workers, or a dataset that asks which worker it is in."""
    if loader._dataset_kind == _DatasetKind.Iterable and loader.num_workers > 1:
        return ("each worker process iterates its own copy of the IterableDataset and takes "
                "its share through get_worker_info(), as torch's")
    if _asks_worker_info(loader.dataset, loader.collate_fn):
        return "the dataset asks torch's get_worker_info(), which only worker processes answer"
    return None


def _asks_worker_info(*objects: Any) -> bool:
    """Whether a dataset's fetching methods (or the collate) call ``get_worker_info``."""
    for obj in objects:
        methods = [getattr(type(obj), m, None) for m in ("__getitem__", "__getitems__",
                                                         "__iter__", "__call__")]
        for fn in [*methods, obj]:
            code = getattr(fn, "__code__", None)
            if code is not None and "get_worker_info" in code.co_names:
                return True
    return False


def choose(loader: Loader, fn: Any, spec: Processes, stage: str
           ) -> tuple[Processes | None, str | None]:
    """Threads (``None``) or worker processes for ``fn``, and why when chosen here."""
    if loader.num_workers == 0 or loader.workers == "threads":
        return None, None  # num_workers=0: load in this process, as torch does
    if loader.workers == "processes":
        return spec, None
    # Why only worker processes give torch's meaning to this loader, if they do. Threads
    # cannot: torch's get_worker_info() is one global, None in this process, so a
    # worker_init_fn would have no worker to run in, and a dataset that asks which worker it
    # is (an IterableDataset taking its share, say) would read everything.
    needed = ("worker_init_fn runs in each worker process, as torch's"
              if loader.worker_init_fn is not None else _by_worker(loader))
    chosen, note = choose_workers(
        fn, loader.num_workers, stage=stage, min_cores=PROCESS_CORES, small=_SMALL,
        needed=needed,
    )
    if chosen is not None:
        try:  # choose_workers checked the function alone; the init goes to the workers too
            # as the fallback sends them: fork, refused at build time, would not be chosen here
            check_picklable(fn, replace(spec, start_method=spec.fallback, fallback=None)
                            if spec.fallback else spec, stage)
        except ConfigError as exc:
            chosen, note = None, f"threads (workers='auto'): {exc}"
    if chosen is None:
        if _by_worker(loader) is not None:  # then needed says why
            raise ConfigError(
                f"{needed}, but worker processes cannot run it ({note}); on threads this "
                "loader would not deliver the items torch's does. Make the dataset picklable, "
                "or pass workers='threads' to read it in this process, where "
                "get_worker_info() is None (as with num_workers=0)"
            )
        if needed is not None:
            note = (f"{note}; on threads, torch's get_worker_info() is None and worker_init_fn "
                    "is not called")
        return None, note
    # Chosen for the user: workers that live as long as the loader, since starting them
    # (and sending the dataset) every epoch is what makes torch's default slow.
    return replace(spec, persistent=True), note


def epoch_pipeline(loader: Loader, fetch: Fetch) -> Pipeline:
    """The template of a map-style loader's epochs: fetch (and collate) on threads or worker
    processes, then pin or copy to the device. Each epoch runs it over its own source."""
    states = loader._state.dataset_states
    init = TorchWorkerInit(
        loader.dataset, loader.worker_init_fn,
        dataset_states={w: s for w, s in states.items() if w is not None} or (
            {w: states[None] for w in range(loader.num_workers)} if None in states else None),
    )
    processes, note = choose(loader, fetch, worker_spec(loader, init), "fetch")
    loader._thread_fetches = [fetch] if processes is None else []
    loader._kept_alive = processes is not None and processes.persistent \
        and not loader.persistent_workers
    if processes is None and states and is_stateful(loader.dataset):
        # the one copy, in this process: its state as of the latest batch delivered, loaded
        # when the next epoch has drawn its order (as torchdata does)
        loader._restore_main = states.get(None, next(iter(states.values())))
    # Worker processes fetch at most prefetch_factor * num_workers batches ahead of the
    # consumer, as torch's: the pipeline's own queues (chunks queued per worker, the reorder
    # window, the output buffer) would hold several times that many 150 MB batches. The
    # run's window bounds them (a batch failed within the budget gives its place back).
    ahead = (loader.prefetch_factor or 2) * loader.num_workers if processes is not None else None
    # ... and batch i from worker i % num_workers, as torch's (then no worker holds more
    # than prefetch_factor batches)
    fetch.asyncflow_round_robin = ahead is not None
    fetch.pin_device = loader.pin_memory_device or None
    fetch.pin = pinning(loader) and processes is None  # pinned in the loading threads
    fetch.catch = loader.max_failures == 0
    workers = max(1, loader.num_workers)
    pipe = Pipeline(
        [], name="DataLoader", max_failures=loader.max_failures, window=ahead,
        notes=fetch_notes(note),
    ).map(
        fetch, concurrency=workers, name="fetch", ordered=loader._ordered(),
        buffer=(loader.prefetch_factor or 2) * workers, workers=processes or "threads",
    )
    return deliver(pipe, loader, processes)


def fetch_notes(note: str | None) -> tuple[str, ...]:
    """The run's note that says where ``fetch`` runs and why (``note``: :func:`choose`'s)."""
    return (f"stage 'fetch' runs on {note}",) if note else ()


def deliver(pipe: Pipeline, loader: Loader, processes: Processes | None) -> Pipeline:
    """``pipe``'s batches pinned in this process when worker ``processes`` fetched them
    (page-locked memory is this process's), then copied to ``device=``."""
    if processes is not None and pinning(loader):
        pipe = pipe.map(_pin_positioned, name="pin")
    if loader.device is not None:
        pipe = pipe.to_device(loader.device)  # a failure or a snapshot is no tensor: left alone
    return pipe


def _pin_positioned(item: Positioned) -> Positioned:
    return item if isinstance(item.batch, Failed) else item._replace(batch=pin(item.batch))


def dataset_states_of(loader: Loader) -> dict[str, Any] | None:
    """The dataset's saved state for a loader's state dict: the copy in this process and
    each worker process's, as of the latest batch delivered; ``None`` for a dataset without
    ``state_dict()``."""
    if not is_stateful(loader.dataset) or loader._iterable is not None:
        return None
    states = loader._state.dataset_states
    main = states.get(None) if states else dataset_of(loader).state_dict()
    return {"main": main, "workers": {w: s for w, s in states.items() if w is not None}}


def restore_dataset_states(loader: Loader, saved: dict[str, Any] | None) -> None:
    """Keep a state dict's dataset states for the loader's next workers (or its own copy).

    Raises:
        ConfigError: ``saved`` is not a dataset state record.
    """
    if saved is None or not is_stateful(loader.dataset):
        return
    try:
        main, workers = saved["main"], dict(saved["workers"])
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"not a dataset state record: {saved!r:.200}") from exc
    states: dict[int | None, Any] = {int(w): s for w, s in workers.items()}
    if main is not None:
        states[None] = main
    loader._state.dataset_states = states


def index_batches(sampler: Iterable[Any], skip: int, ahead: set[int],
                   moved_on: Callable[[], bool]) -> Iterator[Indexed]:
    """The epoch's index batches with their positions, drawn lazily (the pipeline's source
    advances it on a worker thread, from the consumer's first request), from the ``skip``-th
    on, less those in ``ahead`` (unless ``moved_on()`` says, at that first request, that the
    epoch starts afresh)."""
    if moved_on():
        skip, ahead = 0, set()
    for position, indices in enumerate(sampler):
        if position >= skip and position not in ahead:
            yield Indexed(position, indices)


def restored(source: Iterator[Indexed], dataset: Any, state: Any) -> Iterator[Indexed]:
    """``source`` with its first batch drawn now, then ``dataset``'s state loaded."""
    first = next(source, None)
    dataset.load_state_dict(state)
    return source if first is None else itertools.chain([first], source)


def epoch_length(loader: Loader) -> int:
    """``len(loader)``, or 0 where the dataset has no length; torch's ``len()`` notes that
    an ``IterableDataset``'s was asked (to warn past it), which this does not."""
    asked = loader._IterableDataset_len_called
    try:
        return len(loader)
    except TypeError:
        return 0
    finally:
        loader._IterableDataset_len_called = asked
