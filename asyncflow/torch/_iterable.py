"""A DataLoader over an ``IterableDataset``: one iterator per worker, batches round-robin.

As in torch, each worker process iterates its own copy of the dataset, and torch's
``get_worker_info()`` tells it which worker it is, so that it can take its share. Each worker
is a *lane*: a one-process pipeline whose worker keeps its iterator from batch to batch. An
epoch is one run: its lanes are the branches of a merge that takes one batch from each lane
in turn (:class:`LaneTurns`), dropping a lane whose iterator ended (its ``EndOfStream``), so
the order is torch's and does not depend on timing. Each lane's window keeps its worker at
most ``prefetch_factor`` batches ahead of the consumer, as torch's. On threads there is one
lane in this process (``get_worker_info()`` is ``None`` there, as with ``num_workers=0``).
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError, FailureBudgetExceeded, PipelineError
from ..pipeline import FailureBudget, Merge, Pipeline, Run
from ._fetch import Failed, Positioned, TorchWorkerInit
from ._lane import LaneEnd, LaneFetch, LaneTurns
from ._layout import choose, deliver, epoch_length, fetch_notes, pinning, worker_spec
from ._state import EpochIterator, EpochLanes

if TYPE_CHECKING:
    from ._facade import Loader

__all__ = ["IterableEpochs"]


class IterableEpochs:
    """The lanes of an iterable-dataset loader, kept from epoch to epoch (persistent worker
    processes), and where the current epoch stands in each.

    Args:
        loader: The DataLoader.
        saved: ``state_dict()["iterable"]`` of a saved loader, to resume from.

    Raises:
        ConfigError: ``saved`` is not an iterable loader's state.
    """

    def __init__(self, loader: Loader, saved: dict[str, Any] | None) -> None:
        self.loader = loader
        probe = LaneFetch(loader.dataset, loader.collate_fn, loader.batch_size, loader.drop_last)
        spec = worker_spec(loader, TorchWorkerInit(loader.dataset, loader.worker_init_fn))
        self.processes, note = choose(loader, probe, spec, "fetch")
        if self.processes is None and loader.num_workers > 1:
            note = (f"{note or 'threads'}; an IterableDataset on threads is read by one "
                    "iterator (torch's get_worker_info() is None there, as with num_workers=0)")
        self.count = loader.num_workers if self.processes is not None else 1  # the lanes
        resume = _resume_plan(saved, self.count)
        self.yielded = [n for n, _, _ in resume]
        self.ended = [e for _, e, _ in resume]
        self.next_lane = int(saved.get("next", 0)) % self.count if saved else 0
        self.dataset_states: list[Any] = [s for _, _, s in resume]
        self._resume_epoch = loader._state.next_epoch if saved else None
        self.fetches: list[LaneFetch] = []
        self._notes = fetch_notes(note)
        self.templates = [self._template(lane, resume[lane]) for lane in range(self.count)]
        loader._thread_fetches = list(self.fetches) if self.processes is None else []
        loader._kept_alive = self.processes is not None and self.processes.persistent \
            and not loader.persistent_workers
        self.run: Run | None = None  # the current epoch's
        self._iterator: weakref.ref[LanesIterator] | None = None  # the current epoch's

    def _template(self, lane: int, resume: tuple[int, bool, Any]) -> Pipeline:
        """Lane ``lane``'s pipeline: its fetch, on its own worker process (or on threads)."""
        loader = self.loader
        delivered, _, state = resume
        restore = None if self._resume_epoch is None else (self._resume_epoch, delivered, state)
        fetch = LaneFetch(loader.dataset, loader.collate_fn, loader.batch_size,
                          loader.drop_last, resume=restore)
        self.fetches.append(fetch)
        workers = None
        if self.processes is not None:
            init = TorchWorkerInit(loader.dataset, loader.worker_init_fn,
                                   lane=(lane, self.count))
            workers = replace(self.processes, init=init)
        else:
            fetch.pin = pinning(loader)
        # A worker fetches prefetch_factor batches ahead of the consumer, as torch's: its
        # lane's window (its queues and chunks in hand would hold more)
        ahead = loader.prefetch_factor or 2
        return Pipeline([], name=self._label(lane), window=ahead if workers else None).map(
            fetch, name="fetch", buffer=ahead, workers=workers or "threads")

    def _label(self, lane: int) -> str:
        return f"worker{lane}" if self.processes is not None else "main"

    def _epoch_run(self, epoch: int) -> tuple[Run | None, LaneTurns]:
        """The epoch's run: a merge of the lanes not ended, then pinning in this process for
        worker processes' batches and the copy to ``device=``."""
        live = [lane for lane in range(self.count) if not self.ended[lane]]
        turns = LaneTurns(live, self.next_lane)
        if not live:
            return None, turns
        # a lane's tasks: (epoch, position), from the batches it delivered before on
        inputs = [self.templates[lane].with_source(
            zip(itertools.repeat(epoch), itertools.count(self.yielded[lane])),
            epoch=epoch, start=self.yielded[lane]) for lane in live]
        pipe = Pipeline(Merge(inputs, turns, name="workers", on_end=turns.end),
                        name="DataLoader", notes=self._notes)
        return deliver(pipe, self.loader, self.processes).open(), turns

    def start(self, epoch: int) -> LanesIterator:
        """Open the epoch's lanes and return its iterator."""
        self.close_runs()
        if self._resume_epoch != epoch:
            self.yielded = [0] * self.count
            self.ended = [False] * self.count
            self.next_lane = 0
        self._resume_epoch = None
        if self.processes is None and not self.ended[0]:
            # In this process the lane's iterator starts now, so that a state taken before
            # the first batch holds the new iterator's (as torchdata's does).
            fetch = self.fetches[0]
            fetch.begin(epoch)
            snapshot = fetch.snapshot()
            if snapshot is not None:
                self.dataset_states[0] = snapshot.state
        self.run, turns = self._epoch_run(epoch)
        fetches = [None if self.ended[lane] else f"{self._label(lane)}/fetch"
                   for lane in range(self.count)]
        iterator = LanesIterator(self, turns, EpochLanes(self.run, fetches))
        self._iterator = weakref.ref(iterator)
        return iterator

    def state_dict(self, in_epoch: bool) -> dict[str, Any]:
        """Each lane's progress and saved states; between epochs, only the datasets' states
        (the next epoch starts new iterators)."""
        lanes: Iterable[tuple[int, bool, Any]] = zip(
            self.yielded, self.ended, self.dataset_states, strict=True)
        if not in_epoch:
            lanes = ((0, False, {"dataset": s.get("dataset"), "iterator": None} if s else None)
                     for _, _, s in lanes)
        return {"lanes": [{"yielded": n, "ended": e, "state": s} for n, e, s in lanes],
                "next": self.next_lane if in_epoch else 0}

    def close_runs(self) -> None:
        """Stop the current epoch's run; its iterator, if its consumer had not seen the
        epoch's end nor closed it, raises from then on rather than end the epoch short."""
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is not None:
            iterator.supersede()
        if self.run is not None:
            self.run.close()

    def shutdown(self) -> None:
        """Stop the runs and every lane's persistent worker."""
        self.close_runs()
        for template in self.templates:
            template._pools.shutdown()


def _warn_past_len(loader: Loader, yielded: int) -> None:
    """Warn, as torch's loader does, once more batches came than ``len(loader)`` promised."""
    promised = loader._IterableDataset_len_called
    if promised is None or yielded <= promised:
        return
    message = (f"Length of IterableDataset {loader.dataset} was reported to be {promised} "
               f"(when accessing len(dataloader)), but {yielded} samples have been fetched. ")
    if loader.num_workers > 0:
        message += ("For multiprocessing data-loading, this could be caused by not properly "
                    "configuring the IterableDataset replica at each worker.")
    warnings.warn(message, stacklevel=4)


def _resume_plan(saved: dict[str, Any] | None, lanes: int) -> list[tuple[int, bool, Any]]:
    """Per lane: (batches delivered, ended, dataset state) from a saved state."""
    if not saved:
        return [(0, False, None)] * lanes
    try:
        records = [(int(r["yielded"]), bool(r["ended"]), r.get("state"))
                   for r in saved["lanes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"not an iterable DataLoader state: {saved!r:.200}") from exc
    if len(records) != lanes:
        raise ConfigError(
            f"the saved state has {len(records)} worker lane(s), this loader {lanes}: resume "
            "an IterableDataset with the same num_workers and workers= as the saved loader"
        )
    return records


class LanesIterator(EpochIterator):
    """An iterable dataset's epoch: the merge's batches, a batch from each lane in turn; the
    merge's log (:attr:`LaneTurns.log`) says which lane each came from and where lanes
    ended."""

    def __init__(self, epochs: IterableEpochs, turns: LaneTurns, lanes: EpochLanes) -> None:
        loader = epochs.loader
        # the epoch's run (a later epoch opens another), timed out as torch's
        super().__init__(epochs.run, lanes, loader._state, epoch_length(loader), loader.timeout)
        self._epochs = epochs
        self._log = turns.log
        self._yielded = 0
        self._done = False  # its consumer saw the epoch's end or its failure, or closed it
        self._superseded = False
        # max_failures, counted here over every lane's batches (failed batches travel as
        # batches, to be raised at the consumer as torch's)
        limit = loader.max_failures
        self._budget = FailureBudget(limit, "fetch") if limit else None

    def _read_log(self, *, to_batch: bool) -> int:
        """Note the lanes that ended, from the merge's log, up to the lane of the batch just
        received (returned), or to the log's end (``to_batch=False``: the epoch ended)."""
        epochs = self._epochs
        while self._log:
            entry = self._log.popleft()
            if not isinstance(entry, LaneEnd):
                if to_batch:
                    return entry
            elif self._current() and not epochs.ended[entry.lane]:
                epochs.ended[entry.lane] = True
                if entry.snapshot is not None:  # the exhausted iterator's, for the next epoch
                    epochs.dataset_states[entry.lane] = entry.snapshot.state
        assert not to_batch, "the merge put out a batch its log does not list"
        return -1

    def _take(self, item: Positioned) -> bool:
        """Note a received batch; ``True`` unless it is a failed batch ``max_failures``
        lets the epoch skip."""
        epochs, lane = self._epochs, self._read_log(to_batch=True)
        self.lanes.received_batch(lane, item.batch)
        if self._current():
            epochs.yielded[lane] += 1
            epochs.next_lane = (lane + 1) % epochs.count
            if item.snapshot is not None:
                epochs.dataset_states[lane] = item.snapshot.state
        return not self._skip(item)

    def supersede(self) -> None:
        """A new epoch (``iter(loader)`` again) or a restored state stops this one's run
        (each worker keeps one iterator): unless the epoch was over, later calls raise."""
        self._superseded = not self._done

    def _check_superseded(self) -> None:
        if self._superseded:
            self._done, self._superseded = True, False  # said once; then it has ended
            raise ConfigError(
                "this DataLoader iterator was stopped before its epoch's end: iter(loader) "
                "started a new epoch (or load_state_dict() restored one), and an "
                "IterableDataset's workers each keep one iterator, so the loader runs one "
                "epoch at a time; finish or close() an epoch's iterator before the next")

    def close(self) -> None:
        self._done = True
        super().close()

    async def aclose(self) -> None:
        self._done = True
        await super().aclose()

    def _pull(self) -> Positioned:
        self._check_superseded()
        while self._run is not None:
            try:
                item = super()._pull()
            except StopIteration:
                break
            if self._take(item):
                return item
        self._finish()
        raise StopIteration

    async def _apull(self) -> Positioned:
        self._check_superseded()
        while self._run is not None:
            try:
                item = await super()._apull()
            except StopAsyncIteration:
                break
            if self._take(item):
                return item
        self._finish()
        raise StopAsyncIteration

    def _finish(self) -> None:
        """The epoch's run ended: its last turns read, its failure budget checked (a fraction
        of failed batches over it, or every batch failed, fails the epoch:
        :meth:`FailureBudget.check_end`)."""
        self._check_superseded()
        self._done = True
        self._read_log(to_batch=False)
        if self._budget is not None and self._current():
            self._budget.check_end(sum(self.lanes.failures), self.lanes.received,
                                   self.stats().failures)

    def _reraise(self, exc: Exception) -> None:
        """Raise as torch does when the run failed; where several workers failed it (each
        iterator's ``iter()`` raising, say), the first failure, as torch raises the first
        it receives."""
        self._done = True
        if isinstance(exc, PipelineError) and len(exc.exceptions) > 1:
            exc = exc.derive(exc.exceptions[:1])
        super()._reraise(exc)

    def _skip(self, item: Positioned) -> bool:
        """Whether ``item`` is a failed batch that ``max_failures`` lets the epoch skip
        (logged, and counted as delivered and in ``stats()``, as the map-style loader's).

        Raises:
            FailureBudgetExceeded: One failed batch more than the budget allows (the batch's
                own exception is its cause).
        """
        budget, batch = self._budget, item.batch
        if budget is None or not isinstance(batch, Failed):
            return False
        failed, seen = sum(self.lanes.failures), self.lanes.received
        if not budget.allows(failed, seen):
            raise FailureBudgetExceeded(
                f"stage 'fetch': {failed} of {seen} batches failed, over "
                f"max_failures={budget.limit!r} ({batch.where})", stage="fetch",
                failures=self.stats().failures,
            ) from batch.error
        budget.log_skip(batch.where, batch.error)
        if self._current():
            self._state.delivered += 1  # a lane's position is its own, not the epoch's
        return True

    def _delivered(self, item: Positioned) -> Any:
        batch = item.batch
        if self._current():
            self._state.delivered += 1  # a lane's position is its own, not the epoch's
        if isinstance(batch, Failed):
            batch.raise_it()
        self._yielded += 1
        _warn_past_len(self._epochs.loader, self._yielded)
        return batch
