"""One lane of an iterable-dataset loader: a worker's own iterator, a batch at a call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data._utils.fetch import _IterableDatasetFetcher as IterableFetcher

from ..pipeline import worker_info
from ._fetch import Failed, Positioned, Snapshot, init_failure, is_stateful, pin

__all__ = ["END", "LaneFetch"]


class _End:
    """A lane's iterator has ended (pickled by name: one object in every process)."""

    def __reduce__(self) -> str:
        return "END"

    def __repr__(self) -> str:
        return "END"


END = _End()


class LaneFetch:
    """One lane's batches: its own iterator over the dataset, one batch a call, as torch's
    iterable fetcher makes them. Called with ``(epoch, position)``: a new epoch starts a new
    iterator.

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

    def __call__(self, task: tuple[int, int]) -> Positioned:
        epoch, position = task
        if epoch != self._epoch:
            self.begin(epoch)
        if self._ended or self._fetcher.ended:
            return Positioned(position, END)
        try:
            if (failure := init_failure()) is not None:
                raise failure
            batch = self._next_batch()
        except StopIteration:
            self._ended = True  # with the states of the exhausted iterator, for the next epoch
            return Positioned(position, END, self.snapshot())
        except Exception as exc:
            batch = Failed(exc, f"asyncflow.DataLoader: batch {position} of worker "
                                f"{_worker_id()} failed in stage 'fetch'")
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


def _worker_id() -> int:
    info = worker_info()
    if info is None:
        return 0
    from torch.utils.data import get_worker_info

    torch_info = get_worker_info()
    return torch_info.id if torch_info is not None else info.id
