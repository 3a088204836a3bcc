"""Index samplers: which dataset positions to read, in what order, epoch after epoch.

Each sampler is a plain iterable of ``int`` with ``len()``, ``set_epoch(n)``, ``state_dict()``
and ``load_state_dict()``. It can be a pipeline source (``Pipeline(sampler)``), the ``sampler=``
of :class:`asyncflow.DataLoader`, or even the ``sampler=`` of ``torch.utils.data.DataLoader``.
Arguments are checked as torch checks them, with torch's messages, raising
:class:`~asyncflow.ConfigError` (a ``ValueError``) or :class:`~asyncflow.ConfigTypeError`
(also a ``TypeError``) where torch raises those.

Random orders come from NumPy, seeded by ``(seed, epoch)``: the same seed and epoch give the same
order in every process. As with torch's samplers, each new iteration of a
:class:`RandomSampler` or :class:`WeightedRandomSampler` draws a new order: it is the next epoch
(the first iteration is epoch 0), unless :meth:`~RandomSampler.set_epoch` or
:meth:`~RandomSampler.load_state_dict` chose one since the last iteration began. An
iteration begins when it yields its first index, as torch's samplers draw theirs: an iterator
dropped unread takes no epoch. A :class:`DistributedSampler` keeps torch's rule instead: the
same order until ``set_epoch``.

A sampler built from a dataset reads ``len(dataset)`` at each iteration and in ``len()``, so a
dataset that grows or shrinks between epochs is followed; one built from an int keeps that
length. Iteration is lazy: the order is one NumPy array, turned into Python ints a few
thousand at a time. Only :class:`DistributedSampler` looks at torch, and only at
``torch.distributed`` when the program has already imported it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np

from .._errors import ConfigError, ConfigTypeError, check_int
from ..ranks import part_size, world
from ._orders import (
    Block,
    check_num_samples,
    check_seed,
    check_source,
    distributed_blocks,
    flatten,
    probabilities,
    random_blocks,
    read_length,
    skip,
    weighted_blocks,
)

__all__ = [
    "DistributedSampler", "RandomSampler", "Sampler", "SequentialSampler", "WeightedRandomSampler",
]


class Sampler(abc.ABC):
    """What every sampler shares: epochs, one-shot resume, state dicts and lazy iteration.

    Subclasses implement :meth:`_blocks` (the order of one epoch, checked when called and
    drawn lazily). Iteration yields it from the offset :meth:`load_state_dict` gave (once).
    """

    seed: int
    # Whether an iteration not preceded by set_epoch / load_state_dict is the next epoch.
    _advances = True

    def __init__(self) -> None:
        self.epoch = 0
        self._pinned = True  # the first iteration is epoch 0
        self._resume_offset = 0
        self._offset = 0
        self._serial = 0

    @abc.abstractmethod
    def _blocks(self, epoch: int) -> Iterator[Block]:
        """The order of ``epoch``; raises at once (not when drawn) if it cannot be drawn."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def indices(self, epoch: int | None = None) -> list[int]:
        """Every index of one epoch in order, as a list; ``epoch`` defaults to :attr:`epoch`
        (the latest iteration's, or the one :meth:`set_epoch` chose for the next)."""
        return list(flatten(self._blocks(self.epoch if epoch is None else epoch)))

    def __iter__(self) -> Iterator[int]:
        # Raise now if an order cannot be drawn (the dataset has become empty, say): _blocks
        # checks when called and draws only when read.
        self._blocks(self.next_epoch)
        return self._walk()

    def _walk(self) -> Iterator[int]:
        # The iteration (and its epoch) begins at its first index, not at iter(): torch's
        # DataLoader with workers calls iter() twice on its first epoch and drops one.
        epoch = self.next_epoch
        blocks = self._blocks(epoch)
        self.epoch, self._pinned, self._serial = epoch, False, self._serial + 1
        start, self._resume_offset = self._resume_offset, 0
        self._offset, serial = start, self._serial
        for position, index in enumerate(flatten(skip(blocks, start)), start + 1):
            if serial == self._serial:  # an older, abandoned iterator does not move the state
                self._offset = position
            yield index

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration draws."""
        return self.epoch + 1 if self._advances and not self._pinned else self.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``, from its first index (an iteration under
        way goes on with its own order, but no longer moves :meth:`state_dict`).

        Raises:
            ConfigError: ``epoch`` is negative (:class:`ConfigTypeError`: not an int).
        """
        self.epoch = check_int("epoch", epoch, 0)
        self._pinned = True
        self._resume_offset = self._offset = 0
        self._serial += 1  # an iteration under way no longer counts in state_dict()

    def state_dict(self) -> dict[str, Any]:
        """``epoch`` (of the iteration under way or last run, or the one :meth:`set_epoch`
        chose), ``seed``, and ``offset``: the indices that iteration has yielded so far.

        A loader that has handed out fewer items than the sampler yielded (prefetch) should
        overwrite ``offset`` with the number its consumer actually received.
        """
        return {"epoch": self.epoch, "seed": self.seed, "offset": self._offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``epoch`` and ``seed``: the next iteration is that epoch, skipping its first
        ``offset`` indices (the iteration after it goes on to the next epoch, from the start).

        Raises:
            ConfigError: A field is missing or out of range.
        """
        try:
            epoch, seed, offset = state["epoch"], state["seed"], state.get("offset", 0)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"not a sampler state dict: {state!r}") from exc
        self.set_epoch(epoch)
        self.seed = check_seed(seed)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= len(self):
            raise ConfigError(f"offset must be an int in [0, {len(self)}], got {offset!r}")
        self._resume_offset = self._offset = offset


class SequentialSampler(Sampler):
    """``0, 1, ..., n - 1`` every epoch, ``n`` read from the dataset at each iteration.

    Args:
        data_source: A dataset (anything with ``__len__``) or its length.
    """

    def __init__(self, data_source: Sized | int) -> None:
        super().__init__()
        self.data_source = check_source(data_source)
        self.seed = 0

    def _blocks(self, epoch: int) -> Iterator[Block]:
        return iter([range(len(self))])

    def __len__(self) -> int:
        return read_length(self.data_source)

    def __repr__(self) -> str:
        return f"SequentialSampler({len(self)})"


class RandomSampler(Sampler):
    """A random order, reproducible from ``seed`` and the epoch; a new one every iteration.

    As with ``torch.utils.data.RandomSampler``, each new iteration reshuffles: it uses the
    next epoch (the first iteration uses epoch 0), unless :meth:`set_epoch` or
    :meth:`load_state_dict` was called since the last iteration began, in which case it uses
    the epoch they gave. Epoch ``e``'s order depends only on ``(seed, e)``, and
    :meth:`state_dict` reports the epoch of the iteration under way (or last run), so that
    :meth:`load_state_dict` replays it.

    Args:
        data_source: A dataset (anything with ``__len__``, read at each iteration) or its
            length.
        replacement: Draw with replacement (indices may repeat).
        num_samples: Indices per epoch; ``None`` (default): the dataset's current length.
            Without replacement and above the length, whole permutations follow one another,
            as in torch.
        seed: Fixes every epoch's order. ``None`` draws one at construction; it is kept in
            :meth:`state_dict`, so a resumed run replays the same orders.

    Raises:
        ConfigTypeError: ``replacement`` is not a bool (torch's ``TypeError``).
        ConfigError: ``num_samples`` is not a positive int, or is ``None`` for an empty
            dataset (torch's ``ValueError``). Iterating raises it too when the dataset has
            become empty.
    """

    def __init__(
        self,
        data_source: Sized | int,
        replacement: bool = False,
        num_samples: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.data_source = check_source(data_source)
        if not isinstance(replacement, bool):
            raise ConfigTypeError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        self.replacement = replacement
        self._num_samples = num_samples
        if isinstance(data_source, int):
            self._drawn(data_source)  # a fixed length: its check will never apply later
        else:
            check_num_samples(self.num_samples)
        self.seed = check_seed(seed)

    @property
    def num_samples(self) -> int:
        """Indices per epoch: the one given, else the dataset's length now."""
        if self._num_samples is None:
            return read_length(self.data_source)
        return self._num_samples

    def _drawn(self, n: int) -> int:
        """Indices per epoch from a dataset of ``n``, checked (torch's messages)."""
        count = check_num_samples(n if self._num_samples is None else self._num_samples)
        if n == 0:
            raise ConfigError(f"cannot draw {count} samples from an empty dataset")
        return count

    def _blocks(self, epoch: int) -> Iterator[Block]:
        n = read_length(self.data_source)
        return random_blocks(
            n, self._drawn(n), seed=self.seed, epoch=epoch, replacement=self.replacement
        )

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"RandomSampler({read_length(self.data_source)}, replacement={self.replacement}, "
            f"num_samples={self.num_samples}, seed={self.seed})"
        )


class WeightedRandomSampler(Sampler):
    """Indices drawn with probability proportional to ``weights``, anew each iteration.

    Epochs advance as for :class:`RandomSampler`: each new iteration is the next epoch unless
    :meth:`set_epoch` or :meth:`load_state_dict` chose one.

    Args:
        weights: One non-negative weight per dataset item (need not sum to one).
        num_samples: Indices per epoch.
        replacement: Draw with replacement; without it ``num_samples`` may not exceed the
            number of items with a non-zero weight.
        seed: As for :class:`RandomSampler`.

    Raises:
        ConfigError: As torch's ``ValueError``: ``num_samples`` is not a positive int,
            ``replacement`` is not a bool, ``weights`` is not one-dimensional; and (where
            torch fails only when drawing) weights that are negative, not finite or all zero,
            or too few non-zero weights to draw without replacement.
    """

    def __init__(
        self,
        weights: Sequence[float] | Any,
        num_samples: int,
        replacement: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.num_samples = check_num_samples(num_samples)
        if not isinstance(replacement, bool):
            raise ConfigError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        self.replacement = replacement
        self._p = probabilities(weights)
        if not replacement and num_samples > int(np.count_nonzero(self._p)):
            raise ConfigError(
                f"cannot draw {num_samples} samples without replacement from "
                f"{int(np.count_nonzero(self._p))} items with a non-zero weight"
            )
        self.seed = check_seed(seed)

    def _blocks(self, epoch: int) -> Iterator[Block]:
        return weighted_blocks(
            self._p, self.num_samples, seed=self.seed, epoch=epoch, replacement=self.replacement
        )

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"WeightedRandomSampler({len(self._p)} weights, num_samples={self.num_samples}, "
            f"replacement={self.replacement}, seed={self.seed})"
        )


class DistributedSampler(Sampler):
    """This process's share of the dataset, with ``torch.utils.data.DistributedSampler``'s rules.

    Every rank draws torch's order for ``(seed, epoch)`` (``torch.randperm`` from a generator
    seeded with ``seed + epoch``, with or without torch) and takes every ``num_replicas``-th
    index starting at its rank, so shards are disjoint and every rank gets the same count.
    Without ``drop_last`` the order is padded by repeating its start until it divides evenly
    (a few items are seen twice per epoch); with it the tail is cut instead. As in torch, the
    epoch does not advance by itself: call :meth:`set_epoch` with the same value on every rank
    before each epoch, or every epoch repeats the same order. The dataset's length is read at
    each iteration (torch reads it once, at construction).

    Args:
        dataset_or_length: A dataset (anything with ``__len__``) or its length.
        num_replicas: The number of ranks; by default the world size of the initialized
            ``torch.distributed`` process group, else ``$WORLD_SIZE``, else 1.
        rank: This process's rank; likewise from ``torch.distributed``, else ``$RANK``, else 0.
        shuffle: Draw the order from ``(seed, epoch)`` (``False``: ``0 .. n-1``).
        seed: Must be the same on every rank.
        drop_last: Cut the tail instead of padding.

    Raises:
        ConfigError: The rank is outside ``[0, num_replicas - 1]`` (torch's ``ValueError``
            and message) or an argument is invalid.
    """

    _advances = False

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
        self.dataset = check_source(dataset_or_length)
        if num_replicas is None or rank is None:
            found_rank, found_world = world()
            num_replicas = found_world if num_replicas is None else num_replicas
            rank = found_rank if rank is None else rank
        self.num_replicas = check_int("num_replicas", num_replicas, 1)
        check_int("rank", rank, None)
        if not 0 <= rank < num_replicas:
            raise ConfigError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.rank = rank
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.seed = check_seed(seed)

    @property
    def num_samples(self) -> int:
        """Indices per rank and epoch, for the dataset's length now."""
        n = read_length(self.dataset)
        return part_size(n, self.num_replicas, remainder="drop" if self.drop_last else "pad")

    @property
    def total_size(self) -> int:
        """Indices per epoch over all ranks (the padded or cut order's length)."""
        return self.num_samples * self.num_replicas

    def _blocks(self, epoch: int) -> Iterator[Block]:
        return distributed_blocks(
            read_length(self.dataset), self.rank, self.num_replicas, seed=self.seed,
            epoch=epoch if self.shuffle else None, drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"DistributedSampler({read_length(self.dataset)}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, "
            f"drop_last={self.drop_last})"
        )
