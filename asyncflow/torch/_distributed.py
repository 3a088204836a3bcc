"""``even_steps``: every rank takes the same number of batches, even when one runs short.

Splitting a source (:class:`asyncflow.Split`) gives every rank the same number of *items*; a
filter, a failure skipped within ``max_failures`` or tar shards of different lengths can still
leave one rank with fewer *batches*, and a DDP step on the others would then wait forever for
it. ``even_steps`` agrees on each step: before yielding a batch, every rank contributes how
many it has in hand (1, or up to ``agree_every``) to an ``all_reduce(MIN)``, and all of them
yield that many, stopping once one has run out.
The batches a longer rank had left are read and counted, never yielded (nor silently lost):
:meth:`EvenSteps.stats` and a warning in the log say how many, per rank.

A rank whose batches fail (an exception) contributes "failed": every other rank stops at the
same step with a :class:`~asyncflow.WorkerError` naming it, instead of hanging, and the failed
rank raises its own exception.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from .._errors import ConfigError, WorkerError, check_int

__all__ = ["EvenSteps", "StepStats", "even_steps", "gather_states", "worker_states"]

T = TypeVar("T")
log = logging.getLogger("asyncflow.ranks")

_FAILED = -1


@dataclass(frozen=True)
class StepStats:
    """How the ranks' last epoch through :class:`EvenSteps` ended.

    Attributes:
        steps: Batches yielded, the same on every rank.
        leftover: Batches this rank had left when the shortest rank ran out (read, not
            yielded).
        leftover_by_rank: ``leftover`` of every rank, by rank.
        failed_ranks: Ranks whose batches raised an exception, by rank.
    """

    steps: int = 0
    leftover: int = 0
    leftover_by_rank: tuple[int, ...] = ()
    failed_ranks: tuple[int, ...] = ()


class EvenSteps(Generic[T]):
    """``batches`` read in step with the other ranks: see :func:`even_steps`."""

    def __init__(self, batches: Iterable[T], group: Any = None, agree_every: int = 1) -> None:
        check_int("agree_every", agree_every, 1)
        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError("even_steps needs an initialized torch.distributed process group "
                              "(torch.distributed.init_process_group)")
        self.batches = batches
        self.group = group
        self.agree_every = agree_every
        self._stats = StepStats()

    def stats(self) -> StepStats:
        """How the last epoch ended (empty before the first has)."""
        return self._stats

    def __iter__(self) -> Iterator[T]:
        """One epoch: yield while every rank has a batch.

        Raises:
            WorkerError: Another rank's batches failed (this rank stops at the same step).
            Exception: This rank's batches failed: their own exception, after the other
                ranks were told.

        Cancellation:
            Each round blocks in ``all_reduce`` until every rank has fetched its next
            ``agree_every`` batches. Closing the generator early (``break``) closes
            ``batches`` but tells no other rank: leave an epoch early on every rank alike,
            or not at all.
        """
        nccl = dist.get_backend(self.group) == "nccl"  # its collectives take GPU tensors
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        flag = torch.zeros(1, dtype=torch.int64, device=device)
        it = iter(self.batches)
        steps, leftover, error = 0, 0, None
        try:
            while True:
                held, error = _fetch(it, self.agree_every)
                flag.fill_(_FAILED if error is not None else len(held))
                dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
                agreed = int(flag.item())
                if agreed == _FAILED:
                    # The run is over: the batches in hand are counted, the rest not read.
                    leftover = len(held)
                    break
                for _ in range(agreed):
                    steps += 1
                    yield held.popleft()
                if agreed < self.agree_every:  # a rank ran out: this is the last round
                    more = len(held) + agreed == self.agree_every
                    leftover = len(held) + (_drain(it) if more else 0)
                    break
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        self._finish(steps, leftover, error, device)

    def _finish(self, steps: int, leftover: int, error: Exception | None,
                device: torch.device) -> None:
        world = dist.get_world_size(self.group)
        mine = torch.tensor([leftover, int(error is not None)], dtype=torch.int64, device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=self.group)
        by_rank = tuple(int(t[0]) for t in every)
        failed = tuple(rank for rank, t in enumerate(every) if int(t[1]))
        self._stats = StepStats(steps, leftover, by_rank, failed)
        rank = dist.get_rank(self.group)
        if error is not None:
            raise error
        if failed:
            raise WorkerError(f"rank {rank} stopped after {steps} batches: the batches of "
                              f"rank(s) {list(failed)} failed (see their errors)")
        if leftover:
            log.warning("rank %d stopped after %d batches, with %d left unread by even_steps: "
                        "the shortest rank had no more (leftovers by rank: %s)",
                        rank, steps, leftover, list(by_rank))


def _fetch(it: Iterator[T], count: int) -> tuple[deque[T], Exception | None]:
    """Up to ``count`` batches of ``it`` (fewer at its end), or the error it raised."""
    held: deque[T] = deque()
    try:
        for batch in itertools.islice(it, count):  # stops at count: no batch read past it
            held.append(batch)
    except Exception as exc:
        return held, exc
    return held, None


def _drain(it: Iterator[Any]) -> int:
    """Read what is left of ``it``; how many batches that was (up to an error, logged)."""
    count = 0
    try:
        for _ in it:
            count += 1
    except Exception as exc:
        log.warning("even_steps: reading the leftover batches failed after %d: %r", count, exc)
    return count


def even_steps(
    batches: Iterable[T], *, group: Any = None, agree_every: int = 1
) -> EvenSteps[T]:
    """``batches`` (a pipeline, a DataLoader), yielded while *every* rank still has one.

    Each step, the ranks ``all_reduce(MIN)`` how many batches they have in hand (one int64,
    on the GPU for NCCL, else on the CPU), and all stop at the shortest rank's count, so
    every rank yields the same number of batches and no DDP collective waits on a rank that
    ran out. A longer rank reads its leftover batches and counts them
    (``stats().leftover_by_rank``, and a logged warning); a rank whose batches fail makes
    every rank stop at that step (the others raise :class:`~asyncflow.WorkerError`).

    Iterate it once per epoch, on every rank, to the end::

        for images, labels in even_steps(pipe):
            loss = ddp_model(images, labels) ...

    Args:
        batches: What each rank iterates (each epoch calls ``iter(batches)``).
        group: The process group (default: the world).
        agree_every: Fetch this many batches ahead and agree on them in one collective
            (fewer collectives, as many batches held). A failure stops every rank at the
            start of the round it falls in.

    Returns:
        An :class:`EvenSteps`: iterable once per epoch, with :meth:`EvenSteps.stats`.

    Raises:
        ConfigError: ``torch.distributed`` is not initialized, or ``agree_every < 1``.
    """
    return EvenSteps(batches, group, agree_every)


def gather_states(state: dict[str, Any], *, group: Any = None) -> list[dict[str, Any]]:
    """Every rank's pipeline states, on every rank: what :meth:`asyncflow.Split.resume`
    takes, after a change of world size (or of DataLoader workers), to resume the epoch.

    ``state`` is this rank's ``pipe.state_dict()``, or its ``asyncflow.DataLoader``'s
    ``state_dict()`` when the pipelines run in the loader's workers (an ``IterableDataset``
    over a ``Split`` share): then each worker's pipeline state (:func:`worker_states`). With
    ``torch.distributed`` initialized they are gathered with ``all_gather_object`` over
    ``group`` (pickled, on the CPU for gloo, the current GPU for NCCL) and listed rank by
    rank; without, this rank's alone. Save the list (rank 0 writing it is enough): the ranks
    that resume read it whole.

    Raises:
        ConfigError: A loader's state holds no worker's pipeline state (see
            :func:`worker_states`).

    Cancellation:
        A collective: it blocks until every rank of ``group`` calls it, and cannot be
        interrupted; a rank that never calls it hangs the others until the group's timeout.
    """
    loader = isinstance(state, Mapping) and "iterable" in state and "batches" in state
    local = worker_states(state) if loader else [state]
    if not (dist.is_available() and dist.is_initialized()):
        return local
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local, group=group)
    return [dict(item) for states in gathered for item in states]


def worker_states(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pipeline state of each worker (lane) that an ``asyncflow.DataLoader``'s
    ``state_dict()`` holds: what :meth:`asyncflow.Split.resume` needs from this rank when
    the dataset, an ``IterableDataset``, iterates a pipeline over a ``Split`` share in each
    worker (cut between the ranks and, again, between the workers).

    The loader saves each worker's ``dataset.state_dict()`` as of the latest batch it
    delivered; the dataset's ``state_dict()`` returns its pipeline's (or a dict or list
    holding it, found there). A worker that delivered no batch yet has no state in the
    loader's: it settled nothing, and its state is made from another worker's (its part of
    the same cut, with nothing settled).

    Args:
        loader_state: ``loader.state_dict()`` (through JSON or not), taken mid-epoch.

    Returns:
        One pipeline state per worker, by worker: give every rank's to ``Split.resume``.

    Raises:
        ConfigError: ``loader_state`` is not an iterable-dataset loader's state; a worker's
            dataset state holds more than one pipeline state; or no worker's holds one (no
            batch delivered yet, or a dataset without ``state_dict()``).
    """
    from ..ranks import untouched_state

    iterable = loader_state.get("iterable") if isinstance(loader_state, Mapping) else None
    lanes = iterable.get("lanes") if isinstance(iterable, Mapping) else None
    if not isinstance(lanes, list) or not lanes:
        raise ConfigError(
            "worker_states() takes the state_dict() of an asyncflow.DataLoader over an "
            f"IterableDataset (with its workers' 'iterable' lanes), not {loader_state!r:.80}"
        )
    found: list[dict[str, Any] | None] = []
    for lane, entry in enumerate(lanes):
        states = _pipeline_states(entry.get("state") if isinstance(entry, Mapping) else None)
        if len(states) > 1:
            raise ConfigError(f"worker {lane}'s dataset state holds {len(states)} pipeline "
                              "states; elastic resume needs one pipeline per worker")
        found.append(dict(states[0]) if states else None)
    known = [(lane, state) for lane, state in enumerate(found) if state is not None]
    if not known:
        raise ConfigError(
            "no worker's dataset state holds a pipeline state: save after a batch was "
            "delivered, from a dataset whose state_dict() returns its pipeline's"
        )
    lane, sibling = known[0]
    index = int(sibling.get("split", {}).get("index", 0)) - lane  # worker 0's part
    return [state if state is not None else untouched_state(sibling, index + k)
            for k, state in enumerate(found)]


def _pipeline_states(value: Any) -> list[Mapping[str, Any]]:
    """The pipeline states (mappings with ``positions`` and ``check``) within ``value``."""
    if isinstance(value, Mapping):
        if "positions" in value and "check" in value:
            return [value]
        return [state for item in value.values() for state in _pipeline_states(item)]
    if isinstance(value, list | tuple):
        return [state for item in value for state in _pipeline_states(item)]
    return []
