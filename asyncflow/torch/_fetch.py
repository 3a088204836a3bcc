"""What a DataLoader's workers run: fetch and collate one batch, keeping a failure in place."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils.data._utils.fetch import _MapDatasetFetcher as MapFetcher
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory

from .._redact import describe_item, format_exception, redact
from ..pipeline import WorkerInfo, worker_info
from ._collate import collate_in_segments

__all__ = [
    "Failed", "Fetch", "Indexed", "Positioned", "Snapshot", "TorchWorkerInit",
    "is_stateful", "pin", "raise_init_failure",
]


class Indexed(NamedTuple):
    """An epoch's batch of indices and its position; it shows as the indices (in failure
    records, as before)."""

    position: int
    indices: Any

    def __repr__(self) -> str:
        return repr(self.indices)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A dataset's ``state_dict()`` taken just after a batch, in the worker that fetched it
    (``wid``: its id, ``None`` in this process). Not a container: stages that move tensors
    (``to_device``) leave it alone."""

    wid: int | None
    state: Any


class Positioned(NamedTuple):
    """A batch (or a :class:`Failed` in its place), its position in the epoch, and, for a
    dataset with a state of its own, its :class:`Snapshot` after the batch."""

    position: int
    batch: Any
    snapshot: Snapshot | None = None


# In a worker process: the exception its worker_init_fn raised, until a batch reports it
# (as torch's workers do: the first batch the worker fetches raises it, the next go on).
_init_failures: list[BaseException] = []


def raise_init_failure() -> None:
    """Raise the worker_init_fn exception of this worker not yet reported, if any (once)."""
    if _init_failures:
        raise _init_failures.pop()


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` keeps a state of its own to save and restore (torchdata's Stateful)."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


class Failed:
    """A batch whose fetch or collate raised: it travels in the batch's place, so the
    consumer gets the exception at that batch and iteration can go on after it, as torch's.

    Pickled (from a worker process) with the exception itself where it pickles, else a
    ``RuntimeError`` naming its type; the worker's traceback comes along as a note.
    """

    def __init__(self, error: BaseException, where: str, item: str = "") -> None:
        self.error = error
        self.where = where
        self.item = item  # what the failure record names: the batch's indices

    def __reduce__(self) -> tuple[Any, ...]:
        error = self.error
        remote = format_exception(error)
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:
            error = RuntimeError(f"{type(error).__qualname__}: {redact(str(error))}")
        return (_rebuild_failed, (error, self.where, remote, self.item))

    def raise_it(self) -> None:
        """Raise the batch's own exception, noting where it happened."""
        self.error.add_note(self.where)
        raise self.error


def _rebuild_failed(error: BaseException, where: str, remote: str, item: str) -> Failed:
    error.add_note(f"Traceback in the worker process:\n{remote}")
    return Failed(error, where, item)


def pin(batch: Any, device: str | None = None) -> Any:
    """Page-lock a batch as torch's loader does: tensors, containers, and any object with
    a ``pin_memory()`` method of its own."""
    return torch_pin_memory(batch, device or None)  # type: ignore[no-untyped-call]


class Fetch:
    """Load one batch: ``__getitems__`` or ``__getitem__`` per index, then collate (and pin,
    when ``pin`` is set). A class, not a closure, so that worker processes receive the
    dataset once, with it.

    Args:
        dataset: The map-style dataset.
        collate: The ``collate_fn``.
        auto: Auto-collation (index batches) rather than single indices.
        keep_state: Send the dataset's ``state_dict()`` along with each batch (a dataset
            with a state of its own). On threads, the fetch and the snapshot then hold a
            lock, so that each snapshot matches the batches before it.
    """

    def __init__(self, dataset: Any, collate: Callable[[Any], Any], auto: bool, *,
                 keep_state: bool = False) -> None:
        self.dataset, self.collate, self.auto = dataset, collate, auto
        self.pin = False
        self.pin_device: str | None = None
        self.catch = True  # a failure travels in the batch's place (else the engine's budget)
        self.keep_state = keep_state
        self.asyncflow_round_robin = False  # batch i to worker i % num_workers (ProcessPool)
        self._lock: threading.Lock | None = threading.Lock() if keep_state else None
        self.__name__ = "fetch"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lock": None}  # a worker process's copy is its own

    def __call__(self, item: Indexed) -> Positioned:
        position, indices = item
        with self._lock or nullcontext():
            batch = self._load(position, indices)
            return Positioned(position, batch, self._snapshot())

    def _load(self, position: int, indices: Any) -> Any:
        try:
            raise_init_failure()
            # torch's own fetch: __getitems__ where the dataset has it, else __getitem__
            fetcher = MapFetcher(self.dataset, self.auto, self.collate, False)
            out = fetcher.fetch(indices)  # type: ignore[no-untyped-call]
            return pin(out, self.pin_device) if self.pin else out
        except Exception as exc:
            if not self.catch:
                raise
            what = "index" if not self.auto else "indices"
            return Failed(exc, f"asyncflow.DataLoader: batch {position} ({what} "
                               f"{_shown(indices)}) failed in stage 'fetch'",
                          describe_item(indices))

    def _snapshot(self) -> Snapshot | None:
        if not self.keep_state:
            return None
        info = worker_info()
        return Snapshot(info.id if info is not None else None, self.dataset.state_dict())

    def __repr__(self) -> str:
        # what an error names when the fetch cannot go to worker processes: the user's objects
        collate = getattr(self.collate, "__qualname__", type(self.collate).__qualname__)
        return f"fetch(dataset={type(self.dataset).__qualname__}, collate_fn={collate})"


def _shown(indices: Any) -> str:
    text = repr(list(indices) if isinstance(indices, tuple) else indices)
    return text if len(text) <= 120 else text[:117] + "..."


class TorchWorkerInit:
    """In each worker process: make torch's ``get_worker_info()`` answer as in torch's own
    workers, restore the dataset's saved state, then call the user's
    ``worker_init_fn(worker_id)``.

    Args:
        dataset: The dataset. It reaches the worker in one pickle with the fetch, so both
            hold the worker's one copy.
        worker_init_fn: The user's hook, or None.
        dataset_states: Saved dataset states by worker id (from a loader's state dict).
        lane: For an iterable dataset's lane pools (one process each): the worker id and
            count torch's ``get_worker_info()`` reports, ``(id, num_workers)``.
    """

    def __init__(self, dataset: Any, worker_init_fn: Callable[[int], Any] | None,
                 dataset_states: dict[int, Any] | None = None,
                 lane: tuple[int, int] | None = None) -> None:
        self.dataset, self.worker_init_fn = dataset, worker_init_fn
        self.dataset_states = dataset_states or {}
        self.lane = lane

    def __repr__(self) -> str:
        fn = self.worker_init_fn
        return f"(worker_init_fn={getattr(fn, '__qualname__', type(fn).__qualname__)})"

    def __call__(self, info: WorkerInfo) -> None:
        from torch.utils.data._utils import worker

        wid, count = self.lane if self.lane is not None else (info.id, info.num_workers)
        seed = (info.seed + wid) & (2**63 - 1)
        dataset = self.dataset  # the fetch's own (fetch and init are pickled together)
        worker._worker_info = worker.WorkerInfo(
            id=wid, num_workers=count, seed=seed, dataset=dataset
        )
        torch.manual_seed(seed)
        collate_in_segments()  # where torch's workers collate into shared memory, ours do too
        state = self.dataset_states.get(wid)
        if state is not None:
            dataset.load_state_dict(state)
        if self.worker_init_fn is not None:
            try:
                self.worker_init_fn(wid)
            except Exception as exc:
                exc.add_note(f"in worker_init_fn of DataLoader worker process {wid}")
                _init_failures.append(exc)

