"""``asyncflow.DataLoader``: torch's DataLoader interface over an asyncflow pipeline."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import RandomSampler as TorchRandomSampler
from torch.utils.data import default_collate, default_convert

from .._errors import ConfigError
from ..pipeline import Pipeline, PipelineStats, Processes, WorkerInfo
from ..pipeline._auto import choose_workers, usable_cpus
from ..sources._samplers import RandomSampler, SequentialSampler
from ._state import EpochIterator, Indexed, LoaderState, Positioned
from ._structure import map_tensors

__all__ = ["DataLoader"]


# Below this many cores a loader's threads beat its processes: a PIL-decoding Dataset holds
# the GIL 7-16% of its time (measured: benchmarks/bench_gil.py), so two threads hardly wait for
# it, while a process pays ~0.6 ms per image to send its collated float batch back. From 4
# cores on, the GIL caps threads (PIL decoding stopped scaling near 4 threads on a 16-core
# machine) and processes win. docs/performance.md has the figures.
_PROCESS_CORES = 4
_SMALL = ("a PIL-style Dataset's threads wait little for the GIL, and sending each batch back "
          "from a process costs more (docs/performance.md); pass workers='processes' for a "
          "Dataset whose Python holds the GIL")


def _default_workers() -> int:
    return usable_cpus()


class _Fetch:
    """Load one batch: ``__getitems__`` or ``__getitem__`` per index, then collate. A class,
    not a closure, so that worker processes receive the dataset once, with it."""

    def __init__(self, dataset: Any, collate: Callable[[Any], Any], auto: bool,
                 pin: bool) -> None:
        self.dataset, self.collate, self.auto, self.pin = dataset, collate, auto, pin
        self.__name__ = "fetch"

    def __call__(self, item: Indexed) -> Positioned:
        position, indices = item
        dataset = self.dataset
        if not self.auto:
            out = self.collate(dataset[indices])
        elif (getitems := getattr(dataset, "__getitems__", None)) is not None:
            out = self.collate(getitems(list(indices)))
        else:
            out = self.collate([dataset[i] for i in indices])
        return Positioned(position, _pin(out) if self.pin else out)

    def __repr__(self) -> str:
        # what an error names when the fetch cannot go to worker processes: the user's objects
        collate = getattr(self.collate, "__qualname__", type(self.collate).__qualname__)
        return f"fetch(dataset={type(self.dataset).__qualname__}, collate_fn={collate})"


def _pin(batch: Any) -> Any:
    return map_tensors(torch.Tensor.pin_memory, batch)


class _TorchWorkerInit:
    """In each worker process: make torch's ``get_worker_info()`` answer as in torch's own
    workers, then call the user's ``worker_init_fn(worker_id)``."""

    def __init__(self, dataset: Any, worker_init_fn: Callable[[int], Any] | None) -> None:
        self.dataset, self.worker_init_fn = dataset, worker_init_fn

    def __repr__(self) -> str:
        fn = self.worker_init_fn
        return f"(worker_init_fn={getattr(fn, '__qualname__', type(fn).__qualname__)})"

    def __call__(self, info: WorkerInfo) -> None:
        from torch.utils.data._utils import worker

        seed = (info.seed + info.id) & (2**63 - 1)
        worker._worker_info = worker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=seed, dataset=self.dataset
        )
        torch.manual_seed(seed)
        if self.worker_init_fn is not None:
            self.worker_init_fn(info.id)


def _start_method(context: Any) -> str:
    if context is None:
        return "forkserver"
    name = context if isinstance(context, str) else getattr(context, "get_start_method",
                                                            lambda: None)()
    if name in ("spawn", "forkserver"):
        return str(name)
    raise ConfigError(
        f"multiprocessing_context={context!r}: asyncflow starts workers with 'spawn' or "
        "'forkserver' only ('fork' is unsafe in a process with threads, and the loader's own "
        "loop is a thread); pass 'forkserver' (the default) or 'spawn'"
    )


def _check_int(what: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{what} must be an int >= {low}, got {value!r}")


class _TorchGeneratorOrder:
    """Shuffling with a ``torch.Generator``, drawing from it exactly as torch's loader does."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.generator = generator
        self._sampler = TorchRandomSampler(range(n), generator=generator)
        self.start_state: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self._sampler)

    def draw(self) -> list[int]:
        self.start_state = self.generator.get_state()
        # torch's iterator takes a worker base seed from the generator before the first index
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        return list(self._sampler)


class DataLoader:
    """Batches from a map-style dataset, loaded by worker processes or threads, with
    ``torch.utils.data.DataLoader``'s interface: ``for batch in loader``, ``async for``,
    ``len(loader)``, ``set_epoch(n)``, ``state_dict()`` / ``load_state_dict()``.

    ``dataset`` is anything with ``__len__`` and ``__getitem__`` (a plain list will do); like
    torch, a ``__getitems__(indices)`` method, if present, fetches a whole batch at once.
    Batches come in sampler order. Arguments mean what they mean in torch, except:

    Args:
        dataset: A map-style dataset. Each worker process has its own copy; on threads its
            ``__getitem__`` is called from several threads at once, so it must be thread-safe
            (reading files and decoding images are).
        batch_size: As torch; ``None`` yields single samples (``collate_fn`` defaults to
            ``default_convert`` then).
        shuffle: As torch, but the order is reproducible: it comes from ``seed`` (or
            ``generator``) and the epoch, and each new iteration advances the epoch unless
            :meth:`set_epoch` says otherwise.
        sampler: As torch; asyncflow's samplers (``asyncflow.RandomSampler``,
            ``DistributedSampler``, ...) also make resuming exact. Any iterable of indices
            works.
        batch_sampler: As torch.
        num_workers: As torch: how many workers fetch batches (processes or threads, see
            ``workers``). ``0`` fetches in this process, on one background thread. Default:
            the usable cores.
        collate_fn: As torch: ``default_collate`` (torch's own) by default.
        drop_last: As torch.
        pin_memory: As torch, done in the worker threads, or in this process after worker
            processes. Ignored (silently, where torch warns) without CUDA, and unneeded with
            ``device=``, which stages through pinned memory anyway.
        device: *New.* Copy each batch to this device on a side CUDA stream, overlapping
            compute (see :func:`asyncflow.torch.to_device`). ``None``: batches stay on the CPU.
        prefetch_factor: As torch: batches kept ready per worker (default 2, also with
            ``num_workers=0``).
        timeout: As torch, seconds to wait for a batch (``0``: forever), but it raises
            ``asyncflow.StallError`` (a ``TimeoutError``), not ``RuntimeError``.
        generator: As torch: a ``torch.Generator`` for shuffling; the order then matches
            torch's DataLoader given an identically seeded generator.
        seed: *New.* Seeds the shuffle (``asyncflow.RandomSampler``) instead of
            ``generator``. With neither, a seed is drawn from torch's global RNG when the
            loader is built, so ``torch.manual_seed`` makes runs reproducible.
        max_failures: *New.* Batches whose fetch or collate may fail before the loader
            raises: ``0`` (default) raises on the first, as torch does; an int allows that
            many; a float in [0, 1] that fraction. Failed batches are skipped, logged and
            listed in :meth:`stats`.
        workers: *New.* ``"auto"`` (default): worker processes on 4 or more usable cores,
            where they are safe; threads otherwise (fewer cores, where a PIL-style Dataset's
            threads win: docs/performance.md; one worker; a dataset, ``collate_fn`` or
            ``worker_init_fn`` that cannot be pickled), saying which and why in
            ``stats().notes``; ``"processes"`` or ``"threads"`` forces one. Workers never
            import the main script again: no ``if __name__ == "__main__":`` guard needed.
        worker_init_fn: As torch: called with the worker's id in each worker process, where
            ``torch.utils.data.get_worker_info()`` answers as in torch's workers.
        persistent_workers: As torch: keep the worker processes from epoch to epoch, until
            the loader is garbage-collected. When ``workers="auto"`` picks processes, they
            persist anyway.
        multiprocessing_context: ``"forkserver"`` (default) or ``"spawn"``, a name or a
            context; ``"fork"`` is refused (the loader's own loop is a thread).

    Not supported: ``pin_memory_device`` (use ``device=``) and iterable-style datasets (use
    ``asyncflow.Pipeline``).

    Raises:
        ConfigError: Arguments that conflict (as torch's ``ValueError``: ``ConfigError`` is
            one) or are out of range.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = False,
        sampler: Iterable[int] | None = None,
        batch_sampler: Iterable[Sequence[int]] | None = None,
        num_workers: int | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        pin_memory: bool = False,
        device: str | int | torch.device | None = None,
        prefetch_factor: int | None = None,
        timeout: float = 0,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        max_failures: int | float = 0,
        workers: str = "auto",
        worker_init_fn: Callable[[int], Any] | None = None,
        persistent_workers: bool = False,
        multiprocessing_context: Any = None,
    ) -> None:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(
                f"DataLoader needs a map-style dataset (__len__ and __getitem__), got "
                f"{type(dataset).__name__}; for streams, use asyncflow.Pipeline"
            )
        num_workers = _default_workers() if num_workers is None else num_workers
        _check_int("num_workers", num_workers, 0)
        prefetch_factor = 2 if prefetch_factor is None else prefetch_factor
        _check_int("prefetch_factor", prefetch_factor, 1)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ConfigError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        if generator is not None and seed is not None:
            raise ConfigError("give generator= or seed=, not both")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ConfigError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ConfigError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
        elif batch_size is not None:
            _check_int("batch_size", batch_size, 1)
        if sampler is not None and shuffle:
            raise ConfigError("sampler option is mutually exclusive with shuffle")

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = bool(pin_memory)
        self.timeout = timeout
        self.generator = generator
        self.device = device
        self.max_failures = max_failures
        self._torch_order: _TorchGeneratorOrder | None = None
        order: Any = None
        self._own_sampler = sampler is None and batch_sampler is None
        if batch_sampler is None and sampler is None:
            if shuffle and generator is not None:
                self._torch_order = order = _TorchGeneratorOrder(len(dataset), generator)
                sampler = order
            elif shuffle:
                if seed is None:
                    seed = int(torch.empty((), dtype=torch.int64).random_().item())
                sampler = RandomSampler(len(dataset), seed=seed)
            else:
                sampler = SequentialSampler(len(dataset))
        self.sampler: Any = sampler
        self.batch_sampler: Any = batch_sampler
        auto = batch_sampler is not None or batch_size is not None
        self.collate_fn = collate_fn or (default_collate if auto else default_convert)
        self._auto_collation = auto
        self._state = LoaderState()
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self.multiprocessing_context = multiprocessing_context
        if workers not in ("auto", "threads", "processes"):
            raise ConfigError(
                f"workers must be 'auto', 'threads' or 'processes', got {workers!r:.80}"
            )
        if persistent_workers and num_workers == 0:
            raise ConfigError("persistent_workers option needs num_workers > 0")
        _start_method(multiprocessing_context)  # refused alike whether or not processes run
        self.workers = workers
        self._pipe: Pipeline | None = None
        # Built once: each epoch runs it over its own index batches (with_source), so that
        # persistent worker processes live as long as the loader.
        self._template = self._pipeline([])

    # -- torch's interface ---------------------------------------------------------------

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        n = len(self.sampler)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> EpochIterator:
        return self._start_epoch()

    def __aiter__(self) -> EpochIterator:
        return self._start_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (and tell the sampler, if it listens).

        Without calls to it, each new iteration is the next epoch, so a shuffled loader
        reshuffles every time, as torch's does.
        """
        _check_int("epoch", epoch, 0)
        self._state.next_epoch = epoch
        for s in (self.sampler, self.batch_sampler):
            if hasattr(s, "set_epoch") and s is not self._torch_order:
                s.set_epoch(epoch)

    # -- resuming ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: enough for :meth:`load_state_dict` to resume exactly.

        Mid-epoch, a loader given this state yields exactly the batches this one has not
        yet yielded in this epoch, in the same order. At an epoch's end it points at the
        start of the next epoch.
        """
        state = self._state.as_dict()
        for key, obj in (("sampler", self.sampler), ("batch_sampler", self.batch_sampler)):
            if obj is self._torch_order and self._torch_order is not None:
                # mid-epoch: the state that epoch began from, to draw its order again
                order = self._torch_order
                start = order.start_state if self._state.in_epoch else None
                current = order.generator.get_state() if start is None else start
                state["generator"] = current.tolist()
            elif hasattr(obj, "state_dict"):
                state[key] = obj.state_dict()
            elif hasattr(obj, "epoch"):
                state[key] = {"epoch": obj.epoch}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration continues where it stopped.

        The dataset, batch size and sampler must be built the same way as the saved loader's.

        Raises:
            ConfigError: ``state`` is not a loader state.
        """
        self._state.load(state)
        for key, obj in (("sampler", self.sampler), ("batch_sampler", self.batch_sampler)):
            saved = state.get(key)
            if saved is None:
                continue
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict({**saved, "offset": 0})
            elif hasattr(obj, "set_epoch") and "epoch" in saved:
                obj.set_epoch(saved["epoch"])
        generator_state = state.get("generator")
        if self._torch_order is not None and generator_state is not None:
            self._torch_order.generator.set_state(torch.tensor(generator_state, dtype=torch.uint8))

    # -- asyncflow extras ----------------------------------------------------------------

    def stats(self) -> PipelineStats:
        """Statistics of the latest epoch's pipeline (stages, throughput, failures)."""
        return self._pipe.stats() if self._pipe is not None else PipelineStats()

    def __repr__(self) -> str:
        return (
            f"asyncflow.DataLoader({type(self.dataset).__name__} of {len(self.dataset)}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers}, "
            f"device={self.device!r})"
        )

    # -- the pipeline of one epoch ------------------------------------------------------

    def _epoch_batches(self, epoch: int) -> list[Any]:
        if self._own_sampler and self._torch_order is None:
            self.sampler.set_epoch(epoch)
        if self._torch_order is not None:
            indices: Iterable[Any] = self._torch_order.draw()
        elif self.batch_sampler is not None:
            return list(self.batch_sampler)
        else:
            indices = self.sampler
        if self.batch_size is None:
            return list(indices)
        batches, size = [], self.batch_size
        current: list[int] = []
        for index in indices:
            current.append(index)
            if len(current) == size:
                batches.append(current)
                current = []
        if current and not self.drop_last:
            batches.append(current)
        return batches

    def _processes(self, fetch: _Fetch) -> tuple[Processes | None, str | None]:
        """Threads or worker processes for the fetch stage, and why (when chosen here)."""
        if self.num_workers == 0 or self.workers == "threads":
            return None, None  # num_workers=0: load in this process, as torch does
        spec = Processes(
            start_method=_start_method(self.multiprocessing_context),  # type: ignore[arg-type]
            persistent=self.persistent_workers,
            init=_TorchWorkerInit(self.dataset, self.worker_init_fn),
            seed=int(torch.empty((), dtype=torch.int64).random_().item()),
        )
        if self.workers == "processes":
            return spec, None
        chosen, note = choose_workers(
            fetch, self.num_workers, stage="fetch", min_cores=_PROCESS_CORES, small=_SMALL
        )
        if chosen is not None and self.worker_init_fn is not None:
            from ..pipeline._boot import check_picklable

            try:  # choose_workers checked the fetch alone; the init goes to the workers too
                check_picklable(fetch, spec, "fetch")
            except ConfigError as exc:
                return None, f"threads (workers='auto'): {exc}"
        if chosen is None:
            return None, note
        # Chosen for the user: workers that live as long as the loader, since starting them
        # (and sending the dataset) every epoch is what makes torch's default slow.
        return replace(spec, persistent=True), note

    def _pipeline(self, batches: list[Any]) -> Pipeline:
        workers = max(1, self.num_workers)
        pin = self.pin_memory and self.device is None and torch.cuda.is_available()
        fetch = _Fetch(self.dataset, self.collate_fn, self._auto_collation, False)
        processes, note = self._processes(fetch)
        if processes is None:
            fetch.pin = pin  # pinned in the loading threads
        pipe = Pipeline(
            batches, name="DataLoader", max_failures=self.max_failures,
            notes=(f"stage 'fetch' runs on {note}",) if note else (),
        ).map(
            fetch, concurrency=workers, name="fetch", buffer=self.prefetch_factor * workers,
            workers=processes or "threads",
        )
        if processes is not None and pin:
            pipe = pipe.map(_pin, name="pin")  # page-locked memory is this process's own
        if self.device is not None:
            pipe = pipe.to_device(self.device)
        return pipe

    def _start_epoch(self) -> EpochIterator:
        epoch, skip = self._state.begin()
        batches = self._epoch_batches(epoch)
        # Each batch carries its position in the epoch, so that a resumed state counts the
        # batches consumed, failed ones included, not only those delivered.
        source = [Indexed(i, b) for i, b in enumerate(batches[skip:], start=skip)]
        self._pipe = self._template.with_source(source, epoch=epoch, start=skip)
        run = self._pipe.open(timeout=self.timeout or None)
        return EpochIterator(run, self._state, len(batches))
