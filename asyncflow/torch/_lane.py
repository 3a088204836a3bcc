"""One lane of an iterable-dataset loader: a worker's own iterator, a batch at a call; and the
order the epoch's merge reads the lanes in (torch's: a batch from each lane in turn)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info
from torch.utils.data._utils.fetch import _IterableDatasetFetcher as IterableFetcher

from ..pipeline import END_OF_STREAM, BranchEnd, EndOfStream
from ._fetch import Failed, Positioned, Snapshot, is_stateful, pin, raise_init_failure

__all__ = ["LaneEnd", "LaneFetch", "LaneTurns"]


class LaneFetch:
    """One lane's batches: its own iterator over the dataset, one batch a call, as torch's
    iterable fetcher makes them. Called with ``(epoch, position)``: a new epoch starts a new
    iterator. Once the iterator has ended, an ``EndOfStream`` holding the states of the
    exhausted iterator ends the lane's branch of the epoch's merge (``END_OF_STREAM`` for the
    tasks handed to it after that).

    Args:
        dataset: The iterable dataset (in a worker process, that worker's copy).
        collate: The ``collate_fn``.
        batch_size: Items per batch, ``None`` for single items (no auto-collation).
        drop_last: Drop a last short batch.
        resume: Where the lane stood in a saved state, for the epoch it was saved in:
            ``(epoch, batches delivered, {"dataset": ..., "iterator": ...} or None)``. As
            torchdata does, the dataset's state is loaded before ``iter()``, the iterator's
            after; with neither, the delivered batches are replayed and dropped.
    """

    def __init__(self, dataset: Any, collate: Callable[[Any], Any], batch_size: int | None,
                 drop_last: bool, resume: tuple[int, int, Any] | None = None) -> None:
        self.dataset, self.collate = dataset, collate
        self.batch_size, self.drop_last = batch_size, drop_last
        self.resume = resume
        self.pin = False
        self._fetcher: Any = None  # torch's fetcher over this epoch's iterator
        self._epoch = -1
        self._ended = False
        self.__name__ = "fetch"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fetcher": None}  # a worker's copy starts its own iterator

    def __call__(self, task: tuple[int, int]) -> Positioned | EndOfStream:
        epoch, position = task
        if epoch != self._epoch:
            self.begin(epoch)
        if self._ended or self._fetcher.ended:
            return END_OF_STREAM
        try:
            raise_init_failure()
            batch = self._next_batch()
        except StopIteration:
            self._ended = True  # with the states of the exhausted iterator, for the next epoch
            return EndOfStream(self.snapshot())
        except Exception as exc:
            batch = Failed(exc, f"asyncflow.DataLoader: batch {position} of worker "
                                f"{_worker_id()} failed in stage 'fetch'", f"batch {position}")
        else:
            if self.pin:
                batch = pin(batch)
        return Positioned(position, batch, self.snapshot())

    def snapshot(self) -> Snapshot | None:
        """The dataset's and the iterator's states, if they have any."""
        it = self._fetcher.dataset_iter
        state = {
            "dataset": self.dataset.state_dict() if is_stateful(self.dataset) else None,
            "iterator": it.state_dict() if is_stateful(it) else None,
        }
        return Snapshot(_worker_id(), state) if any(state.values()) else None

    def begin(self, epoch: int) -> None:
        """Start epoch ``epoch``'s iterator (restoring a saved state for a resumed epoch)."""
        self._epoch, self._ended = epoch, False
        resume, self.resume = (self.resume, None) if (
            self.resume is not None and self.resume[0] == epoch) else (None, self.resume)
        saved = (resume[2] or {}) if resume is not None else {}
        if saved.get("dataset") is not None:
            self.dataset.load_state_dict(saved["dataset"])
        self._fetcher = IterableFetcher(
            self.dataset, self.batch_size is not None, self.collate, self.drop_last)
        if saved.get("iterator") is not None:
            self._fetcher.dataset_iter.load_state_dict(saved["iterator"])
        elif resume is not None and saved.get("dataset") is None:
            for _ in range(resume[1]):  # replay the batches delivered before the save
                try:
                    self._next_batch()
                except StopIteration:
                    self._ended = True
                    break
                except Exception:
                    continue

    def _next_batch(self) -> Any:
        # torch's own: batch_size items (fewer at the end, unless drop_last), or one item
        return self._fetcher.fetch(range(self.batch_size or 0))

    def __repr__(self) -> str:
        collate = getattr(self.collate, "__qualname__", type(self.collate).__qualname__)
        return f"fetch(dataset={type(self.dataset).__qualname__}, collate_fn={collate})"


@dataclass(frozen=True)
class LaneEnd:
    """In :attr:`LaneTurns.log`: lane ``lane``'s iterator ended, its states then ``snapshot``."""

    lane: int
    snapshot: Snapshot | None


class LaneTurns:
    """The order an epoch's merge reads its lanes in, as torch's: a batch from each live lane
    in turn, from lane ``first`` on; a lane whose iterator ended is dropped (a merge policy,
    and its ``on_end``).

    Its :attr:`log` tells the consumer, in the order the merge puts batches out, each batch's
    lane and each lane's end: an ``int`` per batch, a :class:`LaneEnd` where a lane ended.
    The merge writes it on the run's loop; the consumer reads it as it receives batches (an
    entry it reads was written before the batch it received was put out).

    Args:
        lanes: The lane of each of the merge's branches (lanes that ended before a resumed
            epoch have none).
        first: The lane to read first (a resumed epoch's next one).
    """

    def __init__(self, lanes: list[int], first: int) -> None:
        self.lanes = lanes
        self.log: deque[int | LaneEnd] = deque()
        self.live = list(range(len(lanes)))
        self.at = next((b for b, lane in enumerate(lanes) if lane >= first), 0)

    def open(self, epoch: int, branches: int) -> LaneTurns:
        return self  # one merge run per epoch, and a LaneTurns per epoch

    def choose(self) -> int | None:
        if not self.live:
            return None
        self.at %= len(self.live)
        branch = self.live[self.at]
        self.at += 1
        self.log.append(self.lanes[branch])
        return branch

    def end(self, branch: int, snapshot: Snapshot | None) -> None:
        """``Merge.on_end``: the branch chosen last ended instead of giving a batch."""
        self.log[-1] = LaneEnd(self.lanes[branch], snapshot)

    def ended(self, branch: int, *, empty: bool) -> BranchEnd:
        self.at = self.live.index(branch)
        self.live.remove(branch)
        return "drop"


def _worker_id() -> int:
    """The lane's worker id, as torch's ``get_worker_info()`` has it (its lane's pool sets
    it: :class:`TorchWorkerInit`); ``0`` for the one lane in this process."""
    info = get_worker_info()
    return info.id if info is not None else 0
