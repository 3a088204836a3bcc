"""Index samplers: which dataset positions to read, in what order, epoch after epoch.

Each sampler is a plain iterable of ``int`` with ``len()``, ``set_epoch(n)``, ``state_dict()``
and ``load_state_dict()``. It can be a pipeline source (``Pipeline(sampler)``), the ``sampler=``
of :class:`asyncflow.DataLoader`, or even the ``sampler=`` of ``torch.utils.data.DataLoader``.

Random orders come from NumPy, seeded by ``(seed, epoch)``: the same seed and epoch give the same
order in every process, and a new epoch gives a new order. Only :class:`DistributedSampler` looks
at torch, and only at ``torch.distributed`` when the program has already imported it.
"""

from __future__ import annotations

import abc
import math
import os
import secrets
import sys
from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np

from .._errors import ConfigError

__all__ = ["DistributedSampler", "RandomSampler", "SequentialSampler", "WeightedRandomSampler"]

_SEED_MASK = (1 << 64) - 1


def _length_of(source: Sized | int) -> int:
    if isinstance(source, bool):
        raise ConfigError(f"expected a dataset or a length, got {source!r}")
    if isinstance(source, int):
        if source < 0:
            raise ConfigError(f"a dataset length must be >= 0, got {source}")
        return source
    try:
        return len(source)
    except TypeError:
        raise ConfigError(
            f"expected a dataset with __len__ or an int length, got {type(source).__name__}"
        ) from None


def _check_seed(seed: int | None) -> int:
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int or None, got {seed!r}")
    return seed


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed & _SEED_MASK, epoch]))


def permutation(n: int, seed: int, epoch: int) -> list[int]:
    """The order of ``range(n)`` for ``(seed, epoch)``: the same in every process and run."""
    return _rng(seed, epoch).permutation(n).tolist()  # type: ignore[no-any-return]


class _Sampler(abc.ABC):
    """What every sampler shares: the epoch, one-shot resume, and state dicts.

    Subclasses implement :meth:`indices`; iteration yields ``indices(epoch)`` from the
    offset given by :meth:`load_state_dict` (once), then from the start again.
    """

    seed: int

    def __init__(self) -> None:
        self.epoch = 0
        self._resume_offset = 0
        self._offset = 0

    @abc.abstractmethod
    def indices(self, epoch: int | None = None) -> list[int]:
        """Every index of one epoch (the current one by default), in order."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[int]:
        start, self._resume_offset = self._resume_offset, 0
        order = self.indices()
        self._offset = start
        for index in order[start:]:
            self._offset += 1
            yield index

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration draws its order for."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """``epoch``, ``seed`` and ``offset`` (indices yielded so far by the last iteration).

        A loader that has handed out fewer items than the sampler yielded (prefetch) should
        overwrite ``offset`` with the number its consumer actually received.
        """
        return {"epoch": self.epoch, "seed": self.seed, "offset": self._offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``epoch`` and ``seed``; the next iteration skips the first ``offset`` indices.

        Raises:
            ConfigError: A field is missing or out of range.
        """
        try:
            epoch, seed, offset = state["epoch"], state["seed"], state.get("offset", 0)
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a sampler state dict: {state!r}") from exc
        self.set_epoch(epoch)
        self.seed = _check_seed(seed)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= len(self):
            raise ConfigError(f"offset must be an int in [0, {len(self)}], got {offset!r}")
        self._resume_offset = offset
        self._offset = offset


class SequentialSampler(_Sampler):
    """``0, 1, ..., n - 1`` every epoch.

    Args:
        data_source: A dataset (anything with ``__len__``) or its length.
    """

    def __init__(self, data_source: Sized | int) -> None:
        super().__init__()
        self._n = _length_of(data_source)
        self.seed = 0

    def indices(self, epoch: int | None = None) -> list[int]:
        return list(range(self._n))

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"SequentialSampler({self._n})"


class RandomSampler(_Sampler):
    """A new random order every epoch, reproducible from ``seed``.

    Args:
        data_source: A dataset (anything with ``__len__``) or its length.
        replacement: Draw with replacement (indices may repeat).
        num_samples: Indices per epoch; the dataset length by default. Without replacement
            and above the length, whole permutations follow one another, as in torch.
        seed: Fixes every epoch's order. ``None`` draws one at construction; it is kept in
            :meth:`state_dict`, so a resumed run replays the same orders.

    Unlike ``torch.utils.data.RandomSampler``, the order depends only on ``(seed, epoch)``:
    call :meth:`set_epoch` to get a new one, as with ``DistributedSampler``.
    """

    def __init__(
        self,
        data_source: Sized | int,
        replacement: bool = False,
        num_samples: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self._n = _length_of(data_source)
        self.replacement = bool(replacement)
        if num_samples is None:
            num_samples = self._n
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise ConfigError(f"num_samples must be an int >= 0, got {num_samples!r}")
        if num_samples > 0 and self._n == 0:
            raise ConfigError("cannot draw samples from an empty dataset")
        self.num_samples = num_samples
        self.seed = _check_seed(seed)

    def indices(self, epoch: int | None = None) -> list[int]:
        rng = _rng(self.seed, self.epoch if epoch is None else epoch)
        if self.replacement:
            return rng.integers(0, self._n, size=self.num_samples).tolist()  # type: ignore[no-any-return]
        out: list[int] = []
        while len(out) < self.num_samples:
            out.extend(rng.permutation(self._n).tolist()[: self.num_samples - len(out)])
        return out

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"RandomSampler({self._n}, replacement={self.replacement}, "
            f"num_samples={self.num_samples}, seed={self.seed})"
        )


class WeightedRandomSampler(_Sampler):
    """Indices drawn with probability proportional to ``weights``, anew each epoch.

    Args:
        weights: One non-negative weight per dataset item (need not sum to one).
        num_samples: Indices per epoch.
        replacement: Draw with replacement; without it ``num_samples`` may not exceed the
            number of items with a non-zero weight.
        seed: As for :class:`RandomSampler`.
    """

    def __init__(
        self,
        weights: Sequence[float] | Any,
        num_samples: int,
        replacement: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1:
            raise ConfigError(f"weights must be one-dimensional, got shape {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ConfigError("weights must be finite, >= 0, and not all zero")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
            raise ConfigError(f"num_samples must be an int > 0, got {num_samples!r}")
        if not replacement and num_samples > int(np.count_nonzero(w)):
            raise ConfigError(
                f"cannot draw {num_samples} samples without replacement from "
                f"{int(np.count_nonzero(w))} items with a non-zero weight"
            )
        self._p = w / w.sum()
        self.num_samples = num_samples
        self.replacement = bool(replacement)
        self.seed = _check_seed(seed)

    def indices(self, epoch: int | None = None) -> list[int]:
        rng = _rng(self.seed, self.epoch if epoch is None else epoch)
        drawn = rng.choice(len(self._p), size=self.num_samples, replace=self.replacement, p=self._p)
        return drawn.tolist()  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"WeightedRandomSampler({len(self._p)} weights, num_samples={self.num_samples}, "
            f"replacement={self.replacement}, seed={self.seed})"
        )


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def _world() -> tuple[int, int]:
    """``(rank, world_size)``: torch.distributed's when initialized, else RANK / WORLD_SIZE.

    torch.distributed is only consulted if the program has imported it: a process group
    cannot be initialized without that, and importing torch here would make samplers heavy.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    return (0 if rank is None else rank), (1 if world is None else world)


class DistributedSampler(_Sampler):
    """This process's share of the dataset, with ``torch.utils.data.DistributedSampler``'s rules.

    Every rank draws the same order for ``(seed, epoch)`` and takes every ``num_replicas``-th
    index starting at its rank, so shards are disjoint and every rank gets the same count.
    Without ``drop_last`` the order is padded by repeating its start until it divides evenly
    (a few items are seen twice per epoch); with it the tail is cut instead. Call
    :meth:`set_epoch` with the same value on every rank before each epoch.

    Args:
        dataset_or_length: A dataset (anything with ``__len__``) or its length.
        num_replicas: The number of ranks; by default the world size of the initialized
            ``torch.distributed`` process group, else ``$WORLD_SIZE``, else 1.
        rank: This process's rank; likewise from ``torch.distributed``, else ``$RANK``, else 0.
        shuffle: Draw a new order each epoch (``False``: ``0 .. n-1``).
        seed: Must be the same on every rank.
        drop_last: Cut the tail instead of padding.

    Raises:
        ConfigError: The rank is outside ``[0, num_replicas)`` or an argument is invalid.
    """

    def __init__(
        self,
        dataset_or_length: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        self._n = _length_of(dataset_or_length)
        if num_replicas is None or rank is None:
            found_rank, found_world = _world()
            num_replicas = found_world if num_replicas is None else num_replicas
            rank = found_rank if rank is None else rank
        if num_replicas < 1:
            raise ConfigError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ConfigError(f"rank {rank} is outside [0, {num_replicas - 1}]")
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.seed = _check_seed(seed)
        if self.drop_last and self._n % num_replicas:
            self.num_samples = math.ceil((self._n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(self._n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def indices(self, epoch: int | None = None) -> list[int]:
        epoch = self.epoch if epoch is None else epoch
        order = permutation(self._n, self.seed, epoch) if self.shuffle else list(range(self._n))
        if self.drop_last:
            order = order[: self.total_size]
        elif order:
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
        return order[self.rank : self.total_size : self.num_replicas]

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"DistributedSampler({self._n}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last})"
        )
