"""``Split``: this process's share of a list of sources, across ranks and DataLoader workers.

The one way asyncflow splits a source (a shard list, a URL list, an object listing, an
``image.folder`` tree) between the processes of a job::

    split = Split()                                    # rank and world size from torch.distributed
    Pipeline(split(shard_urls)).flat_map(sources.tar_samples)
    sources.list_objects("s3://bucket/train/", split=split)
    image.folder(root, batch_size=64, size=224, split=split)

The list is cut as torch's ``DistributedSampler`` cuts it: the parts are numbered
``rank * num_workers + worker`` (``num_workers`` is 1 outside a DataLoader worker, or with
``workers=False``), and part ``p`` of ``P`` takes positions ``p, p + P, p + 2P, ...``. With
``remainder="pad"`` the list is first extended cyclically to a multiple of ``P``, repeating
its first ``P - n % P`` items (none when ``P`` divides ``n``; each once, unless the list is
shorter than ``P``); with
``"drop"`` its last ``n % P`` items are left out. Either way every part gets the same count,
the parts are disjoint, and together they hold every item exactly once, plus the repeats
(``"pad"``) or less the dropped tail (``"drop"``). :func:`cut` is that rule as a pure function.
With ``shuffle=True`` the list is first put in the order ``seeding.epoch_rng(seed, epoch)``
draws, the same on every rank, as ``DistributedSampler`` shuffles.

A pipeline over a share saves the share's part in its state (:meth:`Share.split_state`), and
:meth:`Split.resume` cuts what every rank's states left of the epoch between another number of
ranks (elastic resume, asyncflow/ranks/_elastic.py).

Nothing here imports torch: ``torch.distributed`` is read only when the program has imported it
(a process group cannot be initialized without that), and likewise torch's
``get_worker_info()``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

from .._errors import ConfigError, check_bool, check_int
from ..pipeline import Span, sequence_identity
from ._cut import Remainder, cut, part_size
from ._dealt import AsyncDealt, Dealt
from ._elastic import remaining, resumed_ordinals
from ._world import process_group, world_of_env

__all__ = ["Part", "Share", "Split"]

T = TypeVar("T")


@dataclass(frozen=True)
class Part:
    """Which share of a list this process takes, as :meth:`Split.part` resolved it.

    Attributes:
        rank: This process's rank.
        world_size: How many ranks there are.
        worker: This DataLoader worker (0 outside a worker, or when the split ignores workers).
        num_workers: How many DataLoader workers each rank runs (1 likewise).
        remainder: ``"pad"`` or ``"drop"``.
        shuffle: Whether the list is shuffled by ``(seed, epoch)`` before it is cut.
        seed: The shuffle's seed.
    """

    rank: int
    world_size: int
    worker: int = 0
    num_workers: int = 1
    remainder: Remainder = "pad"
    shuffle: bool = False
    seed: int = 0

    @property
    def index(self) -> int:
        """This part's number: ``rank * num_workers + worker``."""
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        """How many parts: ``world_size * num_workers``."""
        return self.world_size * self.num_workers

    def positions(self, n: int, epoch: int = 0) -> list[int]:
        """The positions of a list of ``n`` that this part takes in ``epoch`` (see
        :func:`cut`; the epoch matters only with ``shuffle``)."""
        return self.order(cut(n, self.index, self.count, remainder=self.remainder), n, epoch)

    def order(self, ordinals: list[int], n: int, epoch: int = 0) -> list[int]:
        """The list positions of ``ordinals`` of ``epoch``'s order (the same without
        ``shuffle``)."""
        if not self.shuffle or not ordinals:
            return ordinals
        from ..pipeline.seeding import epoch_rng  # NumPy: imported when first needed

        order = epoch_rng(self.seed, epoch).permutation(n)
        return [int(order[i]) for i in ordinals]

    def size(self, n: int) -> int:
        """How many items of a list of ``n`` this part (and every other) takes."""
        return part_size(n, self.count, remainder=self.remainder)


@dataclass(frozen=True, kw_only=True)
class Split:
    """How a list of sources is split across the ranks of a job and their DataLoader workers.

    A ``Split`` is resolved (:meth:`part`) when the share is taken, in the process that reads
    it: ``split(items)`` resolves at each iteration, so inside a DataLoader worker the share
    is that worker's. The rank and world size are those of the initialized
    ``torch.distributed`` process group; without one, those given here, else ``$RANK`` and
    ``$WORLD_SIZE`` (set by ``torchrun``, and inherited by DataLoader worker processes,
    where the parent's process group is not initialized), else rank 0 of 1.

    Args:
        rank: This process's rank (default: from ``torch.distributed`` or the environment).
        world_size: How many ranks (likewise).
        workers: Also split each rank's share between the workers of a DataLoader
            (torch's ``get_worker_info()``), so that worker processes read disjoint parts.
        remainder: ``"pad"``: repeat items from the start of the list until every part has
            ``ceil(n / parts)``; ``"drop"``: leave the last ``n % parts`` items out.
        shuffle: Shuffle the list by ``(seed, epoch)`` before cutting it, the same order on
            every rank (the start that ``"pad"`` repeats is then the shuffled list's). As
            with ``DistributedSampler``, the epoch does not advance by itself: pass it to
            :meth:`__call__` or call ``share.set_epoch(epoch)``.
        seed: The shuffle's seed: the same on every rank.

    Raises:
        ConfigError: ``world_size < 1``, ``rank`` outside ``[0, world_size)``, an unknown
            ``remainder``, or ``workers`` or ``shuffle`` not a bool (at once); a ``rank`` or
            ``world_size`` given here that differs from the initialized process group's (by
            :meth:`part`).
    """

    rank: int | None = None
    world_size: int | None = None
    workers: bool = True
    remainder: Remainder = "pad"
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("world_size", self.world_size, 1, allow_none=True)
        if self.rank is not None:
            check_int("rank", self.rank, 0)
            if self.world_size is not None and self.rank >= self.world_size:
                raise ConfigError(f"rank {self.rank} is outside [0, {self.world_size - 1}] "
                                  f"(world_size={self.world_size})")
        if self.remainder not in ("pad", "drop"):
            raise ConfigError(f"remainder must be 'pad' or 'drop', got {self.remainder!r}")
        check_int("seed", self.seed, None)
        check_bool("workers", self.workers)
        check_bool("shuffle", self.shuffle)

    def part(self) -> Part:
        """This process's part, now: its rank, world size and DataLoader worker.

        Raises:
            ConfigError: The rank or world size given differs from the initialized process
                group's, or the environment's are out of range.
        """
        rank, world = self._world()
        worker, workers = self._worker() if self.workers else (0, 1)
        return Part(rank, world, worker, workers, self.remainder, self.shuffle, self.seed)

    def _world(self) -> tuple[int, int]:
        group = process_group()
        if group is not None:
            rank, world = group
            if self.rank not in (None, rank) or self.world_size not in (None, world):
                raise ConfigError(
                    f"Split(rank={self.rank}, world_size={self.world_size}) contradicts the "
                    f"initialized torch.distributed process group (rank {rank} of {world}); "
                    "leave them out to use the group's"
                )
            return rank, world
        env_rank, env_world = world_of_env()
        rank = env_rank if self.rank is None else self.rank
        world = env_world if self.world_size is None else self.world_size
        if world < 1 or not 0 <= rank < world:
            raise ConfigError(f"rank {rank} of world_size {world} is out of range (from "
                              f"Split(rank={self.rank}, world_size={self.world_size}) and "
                              "$RANK / $WORLD_SIZE)")
        return rank, world

    @staticmethod
    def _worker() -> tuple[int, int]:
        data = sys.modules.get("torch.utils.data")
        info = data.get_worker_info() if data is not None else None
        if info is None:
            return 0, 1
        return int(info.id), int(info.num_workers)

    def take(self, items: Sequence[T], *, epoch: int = 0) -> list[T]:
        """This process's share of ``items``, now (see :meth:`part`)."""
        return [items[i] for i in self.part().positions(len(items), epoch)]

    def resume(
        self, items: Iterable[T], states: Sequence[Any], *,
        partial: Literal["refuse", "repeat"] = "refuse",
    ) -> Share[T]:
        """This process's share of the items that ``states`` left of their epoch.

        Elastic resume: ``states`` are the ``pipe.state_dict()`` of every rank of a job whose
        pipelines read ``Split()(items)`` shares (any world size, any number of earlier
        resumes), all taken in one epoch. The items none of them settled are cut between
        this job's ranks as a fresh list is (equal counts; ``"pad"`` repeats the first items
        left, ``"drop"`` leaves the last out), so that across the ranks each is delivered
        once. The share is a fresh pipeline's source: do not load the old states into it.
        From the next epoch on (:meth:`Share.set_epoch`) it is a plain share of ``items``.

        Args:
            items: The whole list, as it was when the states were taken.
            states: Every rank's state, each once, in any order (read from files, or
                gathered with :func:`asyncflow.torch.gather_states`).
            partial: A source item whose outputs a ``flat_map`` or ``unbatch`` delivered
                in part (a tar shard read half-way) is refused (``"refuse"``: a
                ``ConfigError``) or read again whole on its new rank (``"repeat"``).

        Raises:
            ConfigError: The states disagree (list, epoch, seed, world size...), one is
                missing or given twice, or not from a ``Split`` share's pipeline; ``items``
                is not the list they were taken over; this split's ``remainder``,
                ``shuffle`` or ``seed`` differs from theirs (the message says what); an
                item delivered in part, with ``partial="refuse"``.
        """
        left = remaining(states, partial=partial)
        listed = items if isinstance(items, Sequence) else list(items)
        left.check(listed, remainder=self.remainder, shuffle=self.shuffle, seed=self.seed)
        return Share(self, listed, left.epoch, settled=left.settled, history=left.history)

    @overload
    def __call__(self, items: AsyncIterable[T], *, epoch: int = ...) -> AsyncIterator[T]: ...

    @overload
    def __call__(self, items: Iterable[T], *, epoch: int = ...) -> Share[T]: ...

    def __call__(
        self, items: Iterable[T] | AsyncIterable[T], *, epoch: int = 0
    ) -> Share[T] | AsyncIterator[T]:
        """This process's share of ``items``, taken when it is iterated: a pipeline source.

        A sequence (a list of shard URLs) is indexed; another iterable is read whole at each
        iteration, as every rank must see the same list to cut it alike. An async iterable
        (``list_objects``) is read whole, then this share is yielded.

        Args:
            items: The whole list, the same on every rank.
            epoch: The epoch whose order a ``shuffle`` draws (a :class:`Share` takes
                later ones from ``set_epoch``).
        """
        check_int("epoch", epoch, 0)
        if isinstance(items, Iterable):
            return Share(self, items, epoch)
        return AsyncDealt(lambda n: self.part().positions(n, epoch), items)


class Share(Generic[T]):
    """``split(items)``: the items of this process's part, resolved at each iteration.

    Iterable again for every epoch (when ``items`` is); ``len()`` is this part's count, the
    same on every rank and worker. With ``Split(shuffle=True)``, call :meth:`set_epoch` with
    the same value on every rank before each epoch, or every epoch has the same order.

    A share from :meth:`Split.resume` leaves out, in the epoch it resumes, the items its
    states settled; from the next epoch on it is a plain share.
    """

    def __init__(self, split: Split, items: Iterable[T], epoch: int = 0, *,
                 settled: Span | None = None,
                 history: Sequence[dict[str, Any]] = ()) -> None:
        self.split = split
        self.items = items
        self.epoch = epoch
        self._settled = settled
        self._settled_epoch = epoch
        self._history = list(history)
        self._last: Sequence[T] | None = None  # the list the latest iteration dealt
        self._ahead: list[T] | None = None  # the list read for the next one, before it
        self._done: int | None = None
        self._identity: tuple[Sequence[T], dict[str, Any]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Draw the order of ``epoch`` from the next iteration on (with ``shuffle``)."""
        self.epoch = check_int("epoch", epoch, 0)

    def _listed(self) -> Sequence[T]:
        """The whole list for the next iteration: ``items`` when it is a sequence, else
        ``items`` read whole, once per iteration (a read before it, by ``len()`` or a resume
        state's check, is the list it deals)."""
        if isinstance(self.items, Sequence):
            return self.items
        if self._ahead is None:
            self._ahead = list(self.items)
        return self._ahead

    def _current(self) -> Sequence[T]:
        """The list the latest iteration dealt (else the next one's): it is not read again."""
        return self._last if self._last is not None else self._listed()

    def _resumed(self) -> Span | None:
        return self._settled if self.epoch == self._settled_epoch else None

    def _positions(self, part: Part, n: int) -> list[int]:
        ordinals = resumed_ordinals(n, self._resumed(), part.index, part.count, part.remainder)
        return part.order(ordinals, n, self.epoch)

    def __iter__(self) -> Dealt[T]:
        listed = self._last = self._listed()
        self._ahead = None
        return Dealt(listed, self._positions(self.split.part(), len(listed)))

    def __len__(self) -> int:
        settled = self._resumed()
        n = len(self._current())
        if settled is None:
            return self.split.part().size(n)
        if self._done is None:  # settled is fixed: counted once (state_dict() asks len())
            self._done = len(Span(0, list(settled.within(0, n))))
        return self.split.part().size(n - self._done)

    def listing_identity(self) -> dict[str, Any]:
        """What a resume state must find again: every item of the whole list, the same on
        every rank (``asyncflow/_identity.py``). Hashed once per list read."""
        listed = self._current()
        if self._identity is None or self._identity[0] is not listed:
            self._identity = (listed, sequence_identity(listed))
        return self._identity[1]

    def split_state(self) -> dict[str, Any]:
        """This share's part, as a pipeline's state records it (``state["split"]``): what
        :meth:`Split.resume` needs to map the pipeline's settled positions to the list's."""
        listed = self._current()
        part, settled = self.split.part(), self._resumed()
        return {
            "index": part.index, "count": part.count, "rank": part.rank,
            "world_size": part.world_size, "n": len(listed),
            "listing": self.listing_identity()["digest"],
            "remainder": part.remainder, "shuffle": part.shuffle, "seed": part.seed,
            "epoch": self.epoch, "history": [] if settled is None else self._history,
        }

    def __repr__(self) -> str:
        return f"Share({self.split!r}, {type(self.items).__name__})"
