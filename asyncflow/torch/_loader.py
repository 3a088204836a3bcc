"""``asyncflow.DataLoader``: torch's DataLoader interface over an asyncflow pipeline."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils.data import RandomSampler as TorchRandomSampler
from torch.utils.data import default_collate, default_convert

from .._errors import ConfigError
from ..pipeline import Pipeline, PipelineStats
from ..sources._samplers import RandomSampler, SequentialSampler
from ._state import EpochIterator, LoaderState
from ._structure import map_tensors

__all__ = ["DataLoader"]


def _default_workers() -> int:
    return min(8, os.cpu_count() or 1)


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
    """Batches from a map-style dataset, loaded by threads, with ``torch.utils.data.DataLoader``'s
    interface: ``for batch in loader``, ``async for``, ``len(loader)``, ``set_epoch(n)``,
    ``state_dict()`` / ``load_state_dict()``.

    ``dataset`` is anything with ``__len__`` and ``__getitem__`` (a plain list will do); like
    torch, a ``__getitems__(indices)`` method, if present, fetches a whole batch at once.
    Batches come in sampler order. Arguments mean what they mean in torch, except:

    Args:
        dataset: A map-style dataset. Its ``__getitem__`` is called from several threads at
            once, so it must be thread-safe (reading files and decoding images are).
        batch_size: As torch; ``None`` yields single samples (``collate_fn`` defaults to
            ``default_convert`` then).
        shuffle: As torch, but the order is reproducible: it comes from ``seed`` (or
            ``generator``) and the epoch, and each new iteration advances the epoch unless
            :meth:`set_epoch` says otherwise.
        sampler: As torch; asyncflow's samplers (``asyncflow.RandomSampler``,
            ``DistributedSampler``, ...) also make resuming exact. Any iterable of indices
            works.
        batch_sampler: As torch.
        num_workers: **Threads**, not processes: how many batches are fetched at once. ``0``
            still fetches on one background thread (torch fetches in the main process).
            Default ``min(8, cpu_count)``. CPU-heavy pure-Python ``__getitem__`` code is
            limited by the GIL; NumPy, PIL, torch and file reads release it.
        collate_fn: As torch: ``default_collate`` (torch's own) by default.
        drop_last: As torch.
        pin_memory: As torch, done in the worker threads. Ignored (silently, where torch
            warns) without CUDA, and unneeded with ``device=``, which stages through pinned
            memory anyway.
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

    Not supported, because threads make them unnecessary: ``worker_init_fn``,
    ``multiprocessing_context``, ``persistent_workers`` (threads are cheap to start),
    ``pin_memory_device``, and iterable-style datasets (use ``asyncflow.Pipeline``).

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
        self._pipe: Pipeline | None = None
        self._check_pipeline()

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

    def _fetch(self) -> Callable[[Any], Any]:
        dataset, collate = self.dataset, self.collate_fn
        getitems = getattr(dataset, "__getitems__", None)
        pin = self.pin_memory and self.device is None and torch.cuda.is_available()

        def fetch(indices: Any) -> Any:
            if not self._auto_collation:
                out = collate(dataset[indices])
            elif getitems is not None:
                out = collate(getitems(list(indices)))
            else:
                out = collate([dataset[i] for i in indices])
            return map_tensors(torch.Tensor.pin_memory, out) if pin else out

        return fetch

    def _pipeline(self, batches: list[Any]) -> Pipeline:
        workers = max(1, self.num_workers)
        pipe = Pipeline(batches, name="DataLoader", max_failures=self.max_failures).map(
            self._fetch(), concurrency=workers, name="fetch",
            buffer=self.prefetch_factor * workers,
        )
        if self.device is not None:
            pipe = pipe.to_device(self.device)
        return pipe

    def _check_pipeline(self) -> None:
        # Build (and discard) one pipeline now, so that a bad device or max_failures raises
        # from the constructor rather than from the first iteration.
        self._pipeline([])

    def _start_epoch(self) -> EpochIterator:
        epoch, skip = self._state.begin()
        batches = self._epoch_batches(epoch)
        self._pipe = self._pipeline(batches[skip:])
        run = self._pipe.open(timeout=self.timeout or None)
        return EpochIterator(run, self._state, len(batches))
