"""Where a loader's iteration stands, and the iterator of one epoch that keeps it current.

An epoch is one run. A map-style loader's has one lane, its ``fetch`` stage. An
iterable-dataset loader's has a lane per worker (its own iterator), each a branch of a merge,
its stages named ``worker<i>/<stage>`` (``main/<stage>`` for the one lane in this process).
The run's statistics are the epoch's; one thing only the consumer knows is put in
(:class:`EpochLanes`). A batch whose fetch raised travels to the consumer in the batch's
place, to be raised there (as torch's), so the run itself saw no failure: the consumer's
record of it is its lane's ``fetch`` failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from typing import Any

from .._errors import ConfigError, FailureRecord, LoaderTimeout, PipelineError, check_int
from .._redact import redact
from ..pipeline import Pipeline, PipelineStats, Run
from ._fetch import Failed, Positioned

__all__ = ["EpochIterator", "EpochLanes", "LoaderState"]


class LoaderState:
    """Which epoch is under way and how many of its batches the consumer has received.

    Only the latest epoch counts: an older iterator still being read does not move it.
    """

    def __init__(self) -> None:
        self.next_epoch = 0
        self.epoch = 0
        self.delivered = 0
        self.in_epoch = False
        self.serial = 0
        self._skip = 0
        # positions past ``delivered`` already delivered (batches out of order: in_order=False)
        self.ahead: set[int] = set()
        self._skip_ahead: set[int] = set()
        # the dataset's own state as of the latest delivered batch: by worker process id,
        # or under None for the copy in this process
        self.dataset_states: dict[int | None, Any] = {}

    def begin(self) -> tuple[int, int, set[int]]:
        """Start the next epoch; returns ``(epoch, batches to skip, later positions to skip
        too)``: on resume, the batches delivered before the save."""
        epoch, skip, ahead = self.next_epoch, self._skip, self._skip_ahead
        self.epoch, self.delivered, self._skip, self._skip_ahead = epoch, skip, 0, set()
        self.ahead = set(ahead)
        self.next_epoch = epoch + 1
        self.in_epoch = True
        self.serial += 1
        return epoch, skip, ahead

    def moved_on(self, epoch: int) -> None:
        """The epoch under way is ``epoch``, from its start (not the saved one it resumed)."""
        self.epoch, self.delivered, self.next_epoch = epoch, 0, epoch + 1
        self.ahead = set()

    def count(self, position: int, ordered: bool) -> None:
        """The batch at ``position`` was delivered (or failed). In order, every batch before
        it was too (a skipped failure included); out of order, only it."""
        if ordered:
            self.delivered = max(self.delivered, position + 1)
            return
        self.ahead.add(position)
        while self.delivered in self.ahead:
            self.ahead.discard(self.delivered)
            self.delivered += 1

    def set_next_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``: a saved position within another epoch
        no longer applies."""
        if epoch != self.next_epoch:
            self._skip, self._skip_ahead = 0, set()
        self.next_epoch = epoch

    def as_dict(self) -> dict[str, Any]:
        # within an epoch, where it stands; between epochs, where the next one starts
        epoch, batches, ahead = (self.epoch, self.delivered, self.ahead) if self.in_epoch \
            else (self.next_epoch, self._skip, self._skip_ahead)
        state: dict[str, Any] = {"epoch": epoch, "batches": batches}
        if ahead:
            state["delivered_ahead"] = sorted(ahead)  # out of order: also delivered
        return state

    def load(self, state: dict[str, Any]) -> None:
        try:
            epoch, batches = state["epoch"], state["batches"]
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a DataLoader state dict: {state!r:.200}") from exc
        for what, value in (("epoch", epoch), ("batches", batches)):
            check_int(f"state {what}", value, 0)
        ahead = state.get("delivered_ahead", [])
        if not isinstance(ahead, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p > batches for p in ahead):
            raise ConfigError(
                f"state delivered_ahead must list positions > batches: {ahead!r:.200}")
        self.next_epoch, self._skip, self.in_epoch = epoch, batches, False
        self._skip_ahead = set(ahead)
        self.serial += 1


MAX_RECORDS = 10_000  # failed batches kept per lane, as a stage keeps its records


class EpochLanes:
    """One epoch's lanes as the consumer sees them: each lane's ``fetch`` stage (``None`` for
    a lane that had ended before the epoch resumed: no branch), the failed batches the
    consumer received from each, and how many batches it received in all.

    Args:
        of: What the epoch's statistics come from: its run (``None`` when every lane had ended
            before a resumed epoch), or the pipeline it runs (its latest run's). A loader
            keeps its latest epoch's lanes: a map-style one's hold the pipeline, so that
            dropping the epoch's iterator still stops the run.
        fetches: Each lane's ``fetch`` stage name (``"fetch"``, ``"worker0/fetch"``), or
            ``None``.
    """

    def __init__(self, of: Run | Pipeline | None, fetches: list[str | None]) -> None:
        self.of = of
        self.fetches = fetches
        self.received = 0  # batches (failed ones too) from every lane
        self.failed: list[list[FailureRecord]] = [[] for _ in fetches]
        self.failures = [0] * len(fetches)

    def received_batch(self, lane: int, batch: object) -> None:
        """The consumer received a batch (or a failed batch) from ``lane``."""
        self.received += 1
        if isinstance(batch, Failed):
            self.failures[lane] += 1
            if len(self.failed[lane]) < MAX_RECORDS:
                stage, error = self.fetches[lane], batch.error
                assert stage is not None  # a lane that had ended receives nothing
                self.failed[lane].append(FailureRecord(  # its message redacted, as a stage's
                    stage, batch.item, type(error).__name__, redact(str(error))))

    def stats(self) -> PipelineStats:
        """The run's statistics, each lane's ``fetch`` counting its failed batches (raised at
        the consumer, which the run did not see; the first :data:`MAX_RECORDS` recorded), and
        a note for each lane that had ended before the epoch resumed."""
        stats = self.of.stats() if self.of is not None else PipelineStats()
        lanes = {stage: lane for lane, stage in enumerate(self.fetches) if stage}
        stages = tuple(
            replace(s, failures=s.failures + self.failures[lane],
                    failed_items=s.failed_items + tuple(self.failed[lane]))
            if (lane := lanes.get(s.name)) is not None else s
            for s in stats.stages)
        notes = [f"worker {lane}'s iterator had ended before this epoch resumed: no run"
                 for lane, stage in enumerate(self.fetches) if stage is None]
        return replace(stats, stages=stages, notes=(*stats.notes, *notes))


class EpochIterator(Iterator[Any], AsyncIterator[Any], AbstractContextManager["EpochIterator"],
                    AbstractAsyncContextManager["EpochIterator"]):
    """The iterator of one epoch: ``for`` and ``async for``, ``close()`` / ``aclose()``; its
    own iterator and context manager, sync and async (``__iter__``, ``__enter__`` and their
    async twins return it, from those bases).

    A batch whose fetch failed raises its own exception where the batch would have come,
    and the next call goes on with the next batch, as with torch's loader. Breaking out of
    the loop and dropping the iterator stops the epoch's pipeline; ``with`` (or
    ``close()``) stops it at once.

    Args:
        run: The epoch's run.
        lanes: What its consumer received (a map-style loader's one lane: its ``fetch``).
        state: The loader's.
        length: ``len()`` of the epoch.
        timeout: torch's ``timeout``.
        ordered: Batches come in position order.
    """

    def __init__(self, run: Run[Positioned] | None, lanes: EpochLanes, state: LoaderState,
                 length: int, timeout: float = 0, *, ordered: bool = True) -> None:
        self.lanes = lanes
        self._run = run
        self._ordered = ordered
        self._state = state
        self._serial = state.serial
        self._length = length
        self._timeout = timeout
        self._halted = False  # closed, timed out or failed: no end of the epoch follows

    def __len__(self) -> int:
        return self._length

    # -- where items come from: the run, within torch's timeout (no batch within ``timeout``
    # seconds raises at once); an iterable dataset's lanes read the run through these -------

    def _pull(self) -> Positioned:
        """``next(run)``, raising :class:`LoaderTimeout` once ``timeout`` seconds pass.

        Cancellation:
            At the deadline a timer thread closes the run, which wakes this wait at once;
            the run's stop (up to its ``stop_timeout`` for a stage stuck in a batch)
            finishes on that thread, so the error is not held back by it.
        """
        run = self._run
        assert run is not None
        if not self._timeout:
            return next(run)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            run.close()

        timer = threading.Timer(self._timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            item = next(run)
        except BaseException:
            if expired.is_set():
                raise self._timed_out() from None
            raise
        finally:
            timer.cancel()
        if expired.is_set():  # it came as the deadline passed: the run is closed by now
            raise self._timed_out()
        return item

    async def _apull(self) -> Positioned:
        """``await run.__anext__()``, raising :class:`LoaderTimeout` once ``timeout``
        seconds pass (cancelling the wait stops the run without waiting for it)."""
        run = self._run
        assert run is not None
        if not self._timeout:
            return await run.__anext__()
        deadline = asyncio.timeout(self._timeout)
        try:
            async with deadline:
                return await run.__anext__()
        except TimeoutError:
            if deadline.expired():
                raise self._timed_out() from None
            raise

    def _timed_out(self) -> LoaderTimeout:
        self._halted = True
        return LoaderTimeout(f"DataLoader timed out after {self._timeout} seconds")

    # -- delivering ------------------------------------------------------------------------

    def _current(self) -> bool:
        return self._state.serial == self._serial

    def _delivered(self, item: Positioned) -> Any:
        if self._current():
            self._state.count(item.position, self._ordered)
            if item.snapshot is not None:
                self._state.dataset_states[item.snapshot.wid] = item.snapshot.state
        batch = item.batch
        self.lanes.received_batch(0, batch)
        if isinstance(batch, Failed):
            batch.raise_it()  # the batch's own exception; the next batch may follow
        return batch

    def _reraise(self, exc: Exception) -> None:
        """Raise what a torch user expects for a run that failed: the stage's own exception
        (with the group's notes), and a timeout as torch's ``RuntimeError``."""
        self._halted = True
        if not (isinstance(exc, PipelineError) and len(exc.exceptions) == 1):
            raise exc
        failure = exc.exceptions[0]
        for note in getattr(exc, "__notes__", ()):
            failure.add_note(note)
        failure.__suppress_context__ = True  # not "during handling of" its own group
        raise failure

    def _stopped(self) -> bool:
        """Whether the run was stopped before the call now made (by ``close()``, a timeout,
        its failure): its ``StopIteration`` then ends this iterator, not the epoch, which
        ``state_dict()`` keeps where it stood."""
        return self._halted or (self._run is not None and self._run.closed)

    def _ended(self, stopped: bool) -> None:
        if self._current() and not stopped:
            self._state.in_epoch = False

    def __next__(self) -> Any:
        stopped = self._stopped()
        try:
            item = self._pull()
        except StopIteration:
            self._ended(stopped)
            raise
        except Exception as exc:
            self._reraise(exc)
        return self._delivered(item)

    async def __anext__(self) -> Any:
        stopped = self._stopped()
        try:
            item = await self._apull()
        except StopAsyncIteration:
            self._ended(stopped)
            raise
        except Exception as exc:
            self._reraise(exc)
        return self._delivered(item)

    def close(self) -> None:
        """Stop the epoch's pipeline; the batches not yet received are dropped."""
        self._halted = True
        if self._run is not None:
            self._run.close()

    async def aclose(self) -> None:
        """Like :meth:`close`, without blocking the event loop."""
        self._halted = True
        if self._run is not None:
            await self._run.aclose()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def stats(self) -> PipelineStats:
        """Statistics of this epoch's run so far (:meth:`EpochLanes.stats`)."""
        return self.lanes.stats()
