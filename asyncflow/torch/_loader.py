"""``asyncflow.DataLoader``: a ``torch.utils.data.DataLoader`` whose epochs run on asyncflow."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data.dataloader import _DatasetKind

from .._errors import check_int
from ..pipeline import Pipeline, PipelineStats, usable_cpus
from ._args import check_extras, check_fork, refuse_unsupported
from ._copies import copy_for_persistent_threads, stale_kept_workers
from ._draws import TorchDraws, worker_seed
from ._fetch import Fetch, is_stateful
from ._frameworks import record_for_rebuild
from ._iterable import IterableEpochs
from ._layout import (
    dataset_of,
    dataset_states_of,
    default_workers,
    epoch_length,
    epoch_pipeline,
    index_batches,
    restore_dataset_states,
    restored,
)
from ._shuffle import ShuffleSampler
from ._state import EpochIterator, EpochLanes, LoaderState

__all__ = ["DataLoader"]

T_co = TypeVar("T_co", covariant=True)


class DataLoader(TorchDataLoader[T_co]):
    """``torch.utils.data.DataLoader``, with each epoch run by an asyncflow pipeline.

    A subclass of torch's loader, built by torch's own ``__init__``: it takes the same
    arguments, in the same order, validates them with torch's messages, and has the same
    attributes (``dataset``, ``sampler``, ``batch_sampler``, ...), so frameworks that
    inspect or rebuild loaders (Lightning, Accelerate) take it as they take torch's.
    Iterating it (``for`` or ``async for``) runs the epoch on asyncflow: worker processes
    that live as long as the loader, or threads, chosen by measurement; batches in sampler
    order. Arguments mean what they mean in torch, except:

    Args:
        dataset: A map-style dataset (``__getitem__``; ``__getitems__`` fetches a whole
            batch) or an ``IterableDataset``. Each worker process has its own copy; on
            threads, a map-style dataset's ``__getitem__`` is called from several threads
            at once. A dataset with ``state_dict()`` / ``load_state_dict()`` has its state
            saved and restored with the loader's.
        batch_size: As torch.
        shuffle: As torch, and resumable: under the same ``torch.manual_seed`` (or
            ``generator``) each epoch has torch's order, and torch's global generator is
            left where torch's loader leaves it. With ``seed``, each epoch's order comes
            from ``seed`` and the epoch instead.
        sampler: As torch. Any iterable of indices.
        batch_sampler: As torch.
        num_workers: As torch: how many workers fetch batches (processes or threads, see
            ``workers``); ``0`` fetches on one background thread, one batch ahead. Not
            given: torch's ``0`` wherever workers would change what is delivered or called
            (an ``IterableDataset``, a ``worker_init_fn``, a dataset that asks
            ``get_worker_info()``), else the usable cores, whose batches are torch's too.
        collate_fn: As torch.
        pin_memory: As torch, through torch's own pinning (a batch type's ``pin_memory()``
            method included). Without CUDA it does nothing; ``device=`` stages through
            pinned memory anyway.
        drop_last: As torch.
        timeout: As torch: seconds to wait for a batch (``0``: forever); raises
            :class:`asyncflow.LoaderTimeout`, both torch's ``RuntimeError`` and
            :class:`asyncflow.StallError`, as the time passes (the epoch's stop finishes
            in the background). Unlike torch's, it applies without workers too.
        worker_init_fn: As torch: called with the worker's id in each worker process, where
            ``torch.utils.data.get_worker_info()`` answers as in torch's workers.
        multiprocessing_context: ``None`` (default), ``"fork"``, ``"forkserver"`` or
            ``"spawn"``, a name or a context. ``None``, as torch's default on Linux, forks the
            workers from the loader's process over a map-style dataset where that is safe:
            they share its pages as torch's do (on the issue-23 images job on 2 cores,
            0.87-0.97x torch's PSS, where from the forkserver its second copy of torch costs
            about 130 MiB more; docs/performance.md) and take a Dataset that cannot be
            pickled. The process is forked when an epoch's run is built, on the thread that
            iterates, and only if no other Python thread runs then (forking beside a running
            thread can deadlock the worker); else the workers start from the forkserver, and
            ``stats().notes`` says which, and why. An ``IterableDataset``'s workers start
            inside the loader's own run, beside its threads: the forkserver. ``"fork"`` asks
            for fork alone: iterating raises :class:`ConfigError` naming the threads where it
            is unsafe, and it is refused for an ``IterableDataset``. ``"forkserver"`` and
            ``"spawn"`` pickle the dataset.
        generator: As torch: a shuffle then matches torch's DataLoader given an identically
            seeded generator, and each epoch draws a worker base seed from it first.
        prefetch_factor: As torch: batches kept ready per worker (2 when ``None``).
        persistent_workers: As torch: persistent workers keep the dataset as it was when
            they started (on threads, a ``copy.deepcopy`` of it). When ``workers="auto"``
            picks processes, they persist anyway (starting workers every epoch is what makes
            torch's default slow), and start again when the dataset has changed, as torch's
            would.
        pin_memory_device: As torch.
        in_order: Accepted; batches always come in sampler order (exact resume needs it).
        device: *New.* Copy each batch to this device on a side CUDA stream (see
            :func:`asyncflow.torch.to_device`). ``None``: batches stay on the CPU.
        seed: *New.* Seeds the shuffle when no ``generator`` is given, epoch by epoch.
            ``None``: the shuffle draws from torch's global generator, as torch's does.
        max_failures: *New.* ``0`` (default): a batch whose fetch or collate raises raises
            that exception, the batch's own type (stage and indices in its notes), and
            iterating on continues with the next batch, as in torch (:meth:`stats` lists
            it). An int allows that
            many failed batches, a float in [0, 1] that fraction: they are skipped, logged
            and listed in :meth:`stats`, and one more fails the epoch (with an
            ``IterableDataset``, counted over every worker's batches together).
        workers: *New.* ``"auto"`` (default): worker processes on 4 or more usable cores,
            where they are safe; threads otherwise, saying why in ``stats().notes``.
            ``"processes"`` or ``"threads"`` forces one.

    Raises:
        ValueError: Arguments torch refuses, with torch's messages; ``ConfigError`` (a
            ``ValueError``) for asyncflow's own options.
        TypeError: Unknown arguments (``ConfigTypeError``, saying what to use instead).

    Cancellation:
        Breaking out of a loop, an exception, or dropping the iterator stops the epoch's
        pipeline; persistent worker processes stop when the loader is garbage-collected.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Iterable[int] | None = None,
        batch_sampler: Iterable[Sequence[int]] | None = None,
        num_workers: int | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], Any] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        device: str | int | torch.device | None = None,
        seed: int | None = None,
        max_failures: int | float = 0,
        workers: str = "auto",
        **unsupported: Any,
    ) -> None:
        refuse_unsupported(unsupported)
        check_extras(workers=workers, seed=seed, generator=generator,
                     max_failures=max_failures)
        check_fork(multiprocessing_context, dataset, workers, num_workers)
        torch_args = {
            "dataset": dataset, "batch_size": batch_size, "shuffle": shuffle,
            "sampler": sampler, "batch_sampler": batch_sampler, "num_workers": num_workers,
            "collate_fn": collate_fn, "pin_memory": pin_memory, "drop_last": drop_last,
            "timeout": timeout, "worker_init_fn": worker_init_fn,
            "multiprocessing_context": multiprocessing_context, "generator": generator,
            "prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers,
            "pin_memory_device": pin_memory_device, "in_order": in_order,
        }
        recorded = record_for_rebuild(self, {**torch_args, "device": device, "seed": seed,
                                             "max_failures": max_failures, "workers": workers})
        super().__init__(**{
            **torch_args, "num_workers": usable_cpus() if num_workers is None else num_workers,
        })
        self.num_workers = num_workers  # None: settled by default_workers at each read
        self.device = device
        self.max_failures = max_failures
        self.workers = workers
        self.seed = seed
        if (shuffle and sampler is None and batch_sampler is None
                and self._dataset_kind == _DatasetKind.Map):
            # torch's RandomSampler, drawn lazily and resumably (set past torch's guard)
            own = ShuffleSampler(dataset, generator=generator, seed=seed)
            object.__setattr__(self, "sampler", own)
            if self.batch_size is not None:
                object.__setattr__(self, "batch_sampler",
                                   BatchSampler(own, self.batch_size, self.drop_last))
        self._state = LoaderState()
        # the workers' base seed: fixed once (by generator=, as torch's follow it), so that a
        # loader rebuilt by load_state_dict gives its workers the same per-item seeds
        self._worker_seed = worker_seed(generator)
        self._draws = TorchDraws(self)
        self._restore_main: Any = None  # a dataset state to load at the next epoch's start
        self._thread_fetches: list[Any] = []  # what reads the dataset on threads
        self._copy: Any = None  # persistent thread workers' own copy of the dataset
        self._kept_alive = False  # worker processes kept alive though not asked to persist
        self._sent_digest: bytes | None = None  # the dataset they were started with
        self._latest: EpochLanes | None = None  # the latest epoch, as its consumer saw it
        self._iterable: IterableEpochs | None = None
        self._template: Pipeline | None = None
        self._built_for: tuple[Any, ...] | None = None  # what the template was built from
        self._build()  # now, so that a bad option (device="cuda" without CUDA) raises here
        recorded()

    # -- torch's interface ---------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        """The workers that fetch batches: as given, or, when not given, torch's ``0``
        wherever workers would change what the loader delivers (:func:`default_workers`)."""
        asked = self.__dict__.get("_workers_asked")
        return default_workers(self) if asked is None else int(asked)

    @num_workers.setter
    def num_workers(self, value: int | None) -> None:
        self.__dict__["_workers_asked"] = value

    def __iter__(self) -> EpochIterator:  # type: ignore[override]
        return self._start_epoch()

    def __aiter__(self) -> EpochIterator:
        return self._start_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (and tell the samplers that listen).

        Without calls to it, each new iteration is the next epoch, so a shuffled loader
        reshuffles every time, as torch's does.
        """
        check_int("epoch", epoch, 0)
        self._state.set_next_epoch(epoch)
        for s in {id(s): s for s in self._samplers()}.values():
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    # -- resuming ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: enough for :meth:`load_state_dict` to resume exactly.

        Mid-epoch, a loader given this state yields exactly the batches this one has not
        yet yielded in this epoch, in the same order. At an epoch's end it points at the
        start of the next epoch. A dataset with ``state_dict()`` has its state, as of the
        latest batch delivered, saved too (each worker process's copy for its own).
        """
        state = self._state.as_dict()
        self._draws.save(state, self._state)
        if self._iterable is not None:
            state["iterable"] = self._iterable.state_dict(self._state.in_epoch)
        states = dataset_states_of(self)
        if states is not None:
            state["dataset"] = states
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration continues where it stopped.

        The dataset, batch size and sampler must be built the same way as the saved
        loader's. Worker processes already started are replaced, so that each starts from
        its saved dataset state.

        Raises:
            ConfigError: ``state`` is not a loader state.
        """
        self._state.load(state)
        self._draws.load(state)
        restore_dataset_states(self, state.get("dataset"))
        self._build(iterable_state=state.get("iterable"))

    # -- pickling (DDP spawn and deepcopy send loaders to other processes) ---------------

    def __getstate__(self) -> dict[str, Any]:
        """The loader's arguments and position, without its running parts (pipelines,
        worker processes): a copy builds its own when it is first iterated."""
        state = dict(self.__dict__)
        state.update(_template=None, _latest=None, _iterable=None, _built_for=None,
                     _thread_fetches=[], _copy=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # past torch's attribute guard, as unpickling always is

    # -- asyncflow extras ----------------------------------------------------------------

    def stats(self) -> PipelineStats:
        """Statistics of the latest epoch's run (stages, throughput, failures), the failed
        batches raised at the consumer included (:class:`EpochLanes`).

        An ``IterableDataset`` read by several worker processes runs each worker as a branch
        of the epoch's one run: each worker's stages show under its name (``worker0/fetch``,
        ``worker1/fetch``, ...), with the batches it made, its failed batches and its
        timings, and ``delivered`` and ``failures`` count every worker's.
        """
        return self._latest.stats() if self._latest is not None else PipelineStats()

    def _samplers(self) -> tuple[Any, Any]:
        return self.sampler, self.batch_sampler

    def __repr__(self) -> str:
        try:
            size = f" of {len(self.dataset)}"  # type: ignore[arg-type]
        except TypeError:
            size = ""
        return (
            f"asyncflow.DataLoader({type(self.dataset).__name__}{size}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers}, "
            f"device={self.device!r})"
        )

    # -- the pipelines of the epochs ------------------------------------------------------

    def _config(self) -> tuple[Any, ...]:
        """What the epochs' pipelines are built from: torch lets most of it be reassigned
        (Lightning sets ``worker_init_fn`` on a built loader), so a change rebuilds them."""
        return (self.num_workers, self.collate_fn, self.worker_init_fn, self.pin_memory,
                self.pin_memory_device, self.prefetch_factor, self.multiprocessing_context,
                self.timeout, self.device, self.max_failures, self.workers, self.in_order)

    def _build(self, iterable_state: dict[str, Any] | None = None) -> None:
        """(Re)build what runs the epochs: a template pipeline whose persistent workers live
        as long as the loader, or an iterable dataset's lanes.

        Raises:
            ConfigError: ``prefetch_factor`` is ``0``, which torch's workers refuse too (its
                ``None`` means 2; torch's own check refuses a negative one).
            ConfigTypeError: ``prefetch_factor`` is not an int.
        """
        check_int("prefetch_factor", self.prefetch_factor, 1, allow_none=True)
        if self._template is not None:
            self._template._pools.shutdown()  # workers restart from restored dataset states
        if self._iterable is not None:
            self._iterable.shutdown()
        self._built_for = self._config()
        self._copy, self._sent_digest = None, None  # new workers: they get the dataset anew
        if self._dataset_kind == _DatasetKind.Iterable:
            self._template = None
            self._iterable = IterableEpochs(self, iterable_state)
            return
        fetch = Fetch(self.dataset, self.collate_fn, self._auto_collation,
                      keep_state=is_stateful(self.dataset))
        self._template = epoch_pipeline(self, fetch)

    def _moved_on(self, epoch: int, skip: int) -> bool:
        """Whether the epoch starts afresh rather than where a saved state stood: decided
        at its first batch (on the source's thread).

        A trainer resuming from a state saved at an epoch's last batch moves on by telling
        the sampler the next epoch after ``iter()`` (Lightning calls ``sampler.set_epoch``):
        then that epoch starts from its first batch, rather than the saved epoch finishing
        with nothing left. Without such a call the saved epoch resumes, as torchdata's
        loader does.
        """
        if skip == 0:
            return False
        for s in self._samplers():
            told = getattr(s, "next_epoch", None)
            if isinstance(told, int) and told > epoch:
                self._state.moved_on(told)
                return True
        return False

    def _start_epoch(self) -> EpochIterator:
        if self._built_for != self._config():
            self._build()
        if (dataset_now := stale_kept_workers(self)) is not None:
            self._build()
            self._sent_digest = dataset_now
        copy_for_persistent_threads(self)
        epoch, skip, ahead = self._state.begin()
        if self._restore_main is not None and self._draws.loaded_between:
            # a state saved between epochs: as it stood before this epoch drew its seeds
            # (which may come from the global generator that state holds)
            dataset_of(self).load_state_dict(self._restore_main)
            self._restore_main = None
        self._draws.begin()
        if self._iterable is not None:
            iterator = self._iterable.start(epoch)
            self._latest = iterator.lanes
            return iterator
        if isinstance(self.sampler, ShuffleSampler) and self.generator is None:
            self.sampler.set_epoch(epoch)
        source = index_batches(self._index_sampler, skip, ahead,
                                lambda: self._moved_on(epoch, skip))
        if self._restore_main is not None:
            # As torchdata: the order is drawn (from torch's global generator, for torch's
            # RandomSampler) before the dataset's state, which may hold that generator's, is
            # loaded. Drawing happens at the first index, so take the first batch now.
            source = restored(source, dataset_of(self), self._restore_main)
            self._restore_main = None
        assert self._template is not None
        pipe = self._template.with_source(source, epoch=epoch, start=skip)
        self._latest = EpochLanes(pipe, ["fetch"])
        # opened without a deadline: the epoch's iterator keeps torch's timeout
        return EpochIterator(pipe.open(), self._latest, self._state, epoch_length(self),
                             self.timeout, ordered=self._ordered())

    def _ordered(self) -> bool:
        """Whether batches come in sampler order: unless ``in_order=False`` with workers."""
        return bool(self.in_order) or self.num_workers <= 1
