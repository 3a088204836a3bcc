"""An iterable-dataset loader's epoch as its consumer sees it, and its statistics.

The epoch is one run: each lane (a worker's own iterator) a branch of a merge, its stages
named ``worker<i>/<stage>`` (``main/<stage>`` for the one lane in this process). The run's
statistics are the epoch's; one thing only the consumer knows is put in here. A batch whose
fetch raised travels to the consumer in the batch's place, to be raised there (as torch's),
so the run itself saw no failure: the consumer's record of it is its lane's ``fetch`` failure.
"""

from __future__ import annotations

from dataclasses import replace

from .._errors import FailureRecord
from .._redact import redact
from ..pipeline import PipelineStats, Run, StageStats
from ._fetch import Failed

__all__ = ["MAX_RECORDS", "EpochLanes", "record_of", "with_failed"]

MAX_RECORDS = 10_000  # failed batches kept per lane, as a stage keeps its records


def record_of(batch: Failed, stage: str, item: str) -> FailureRecord:
    """The failure record of a failed batch the consumer received (its message redacted)."""
    error = batch.error
    return FailureRecord(stage, item, type(error).__name__, redact(str(error)))


def with_failed(stage: StageStats, count: int, records: list[FailureRecord]) -> StageStats:
    """``stage`` with ``count`` more failures, raised at the consumer (``records``: theirs,
    the first :data:`MAX_RECORDS`), which its run did not see."""
    if not count:
        return stage
    return replace(stage, failures=stage.failures + count,
                   failed_items=stage.failed_items + tuple(records))


class EpochLanes:
    """One epoch's lanes as the consumer sees them: the epoch's run (``None`` when every lane
    had ended before a resumed epoch), the name of each lane's branch (``None`` for a lane
    that had ended before the epoch resumed: no branch), and the batches and failed batches
    the consumer received from each.

    Args:
        run: The epoch's run.
        labels: Each lane's branch label, or ``None``.
    """

    def __init__(self, run: Run | None, labels: list[str | None]) -> None:
        self.run = run
        self.labels = labels
        self.received = [0] * len(labels)
        self.failed: list[list[FailureRecord]] = [[] for _ in labels]
        self.failures = [0] * len(labels)

    def received_batch(self, lane: int, position: int, batch: object) -> None:
        """The consumer received a batch (or a failed batch) from ``lane``."""
        self.received[lane] += 1
        if isinstance(batch, Failed):
            self.failures[lane] += 1
            if len(self.failed[lane]) < MAX_RECORDS:
                self.failed[lane].append(
                    record_of(batch, f"{self.labels[lane]}/fetch", f"batch {position}"))

    def stats(self) -> PipelineStats:
        """The run's statistics, each lane's ``fetch`` counting its failed batches, and a note
        for each lane that had ended before the epoch resumed."""
        stats = self.run.stats() if self.run is not None else PipelineStats()
        fetches = {f"{label}/fetch": lane for lane, label in enumerate(self.labels) if label}
        stages = tuple(
            with_failed(s, self.failures[lane], self.failed[lane])
            if (lane := fetches.get(s.name)) is not None else s
            for s in stats.stages)
        notes = [f"worker {lane}'s iterator had ended before this epoch resumed: no run"
                 for lane, label in enumerate(self.labels) if label is None]
        return replace(stats, stages=stages, notes=(*stats.notes, *notes))
