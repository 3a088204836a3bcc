"""An iterable-dataset loader's epoch as its consumer sees it, and its statistics: every
lane's run in one :class:`~asyncflow.pipeline.PipelineStats`.

With worker processes each lane is its own run, so each run's statistics hold one worker.
``stats()`` puts them side by side, each lane's stages named ``worker<i>/<stage>`` (as a
merge names its branches' stages ``label/stage``), and adds them up: ``delivered`` is every
batch the consumer received, ``failures`` every failed batch, each under its worker.

Two things only the consumer knows are put in here. A lane's run goes on asking its worker
for batches after the worker's iterator has ended (the worker answers each with an end
marker), so once the consumer has reached a lane's end its stages count the batches before
it, not the markers. And a batch whose fetch raised travels to the consumer in the batch's
place, to be raised there (as torch's), so the run itself saw no failure: the consumer's
record of it is its worker's ``fetch`` failure.
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
    """One epoch's lanes: each lane's run (``None`` for a lane that had ended before a
    resumed epoch started), the position it started from, the position of its end marker
    once the consumer reached it, and the batches the consumer received from it.

    Args:
        runs: Each lane's run.
        starts: Each lane's first position this epoch (batches it delivered before a resume).
        named: Name each lane's stages after its worker (several worker processes).
    """

    def __init__(self, runs: list[Run | None], starts: list[int], named: bool) -> None:
        self.runs = runs
        self.starts = starts
        self.named = named
        self.ends: list[int | None] = [None] * len(runs)
        self.received = [0] * len(runs)
        self.failed: list[list[FailureRecord]] = [[] for _ in runs]
        self.failures = [0] * len(runs)

    def ended(self, lane: int, position: int) -> None:
        """The consumer reached ``lane``'s end marker, at ``position``."""
        if self.ends[lane] is None:
            self.ends[lane] = position

    def received_batch(self, lane: int, position: int, batch: object) -> None:
        """The consumer received a batch (or a failed batch) from ``lane``."""
        self.received[lane] += 1
        if isinstance(batch, Failed):
            self.failures[lane] += 1
            if len(self.failed[lane]) < MAX_RECORDS:
                self.failed[lane].append(
                    record_of(batch, self._name(lane, "fetch"), f"batch {position}"))

    def close(self) -> None:
        for run in self.runs:
            if run is not None:
                run.close()

    async def aclose(self) -> None:
        for run in self.runs:
            if run is not None:
                await run.aclose()

    def stats(self) -> PipelineStats:
        """Every lane's stages, in lane order, and the epoch's totals."""
        lanes = [(lane, run.stats()) for lane, run in enumerate(self.runs) if run is not None]
        stages = tuple(s for lane, one in lanes for s in self._stages(lane, one))
        notes = [n for _, one in lanes for n in one.notes]
        notes += [f"worker {lane}'s iterator had ended before this epoch resumed: no run"
                  for lane, run in enumerate(self.runs) if run is None]
        return PipelineStats(
            stages=stages,
            elapsed=max((one.elapsed for _, one in lanes), default=0.0),
            delivered=sum(self.received),
            running=any(one.running for _, one in lanes),
            bottleneck=self._bottleneck(lanes, stages),
            notes=tuple(dict.fromkeys(notes)),
            loop_delay_max=max((one.loop_delay_max for _, one in lanes), default=0.0),
        )

    def _name(self, lane: int, stage: str) -> str:
        return f"worker{lane}/{stage}" if self.named else stage

    def _stages(self, lane: int, one: PipelineStats) -> list[StageStats]:
        end = self.ends[lane]
        batches = None if end is None else end - self.starts[lane]
        stages = []
        for stage in one.stages:
            if batches is not None:
                stage = _before_end(stage, batches)
            if stage.name == "fetch":
                stage = with_failed(stage, self.failures[lane], self.failed[lane])
            stages.append(replace(
                stage, name=self._name(lane, stage.name),
                failed_items=tuple(replace(r, stage=self._name(lane, stage.name))
                                   if r.stage == stage.name else r
                                   for r in stage.failed_items),
            ))
        return stages

    def _bottleneck(self, lanes: list[tuple[int, PipelineStats]],
                    stages: tuple[StageStats, ...]) -> str | None:
        """The consumer when every lane's output stays full; else the busiest of the
        lanes' own bottlenecks."""
        named = [(lane, one.bottleneck) for lane, one in lanes if one.bottleneck is not None]
        if not named:
            return None
        if all(b == "consumer" for _, b in named):
            return "consumer"
        by_name = {s.name: s for s in stages}
        candidates = [by_name[self._name(lane, b)] for lane, b in named if b != "consumer"
                      and self._name(lane, b) in by_name]
        if not candidates:
            return None
        return max(candidates, key=lambda s: s.utilization).name


def _before_end(stage: StageStats, batches: int) -> StageStats:
    """``stage`` counting only a lane's ``batches``, not the end markers after them."""
    items_in, items_out = min(stage.items_in, batches), min(stage.items_out, batches)
    was, done = max(stage.items_in, stage.items_out), max(items_in, items_out)
    if was == done:
        return stage
    return replace(
        stage, items_in=items_in, items_out=items_out,
        mean_seconds_per_item=stage.busy_seconds / done if done else 0.0,
        items_per_second=stage.items_per_second * done / was,
    )
