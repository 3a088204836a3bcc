"""What a run measures about each stage, and the snapshots users read (``pipe.stats()``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .._redact import redact

__all__ = ["FailureRecord", "PipelineStats", "StageCounters", "StageStats"]

_MAX_RECORDS = 10_000


@dataclass(frozen=True)
class FailureRecord:
    """One skipped or fatal item: where it failed, on what, and why."""

    stage: str
    item: str
    error_type: str
    message: str


class StageCounters:
    """Live, mutable counters of one stage; written only on the run's loop thread."""

    def __init__(self, name: str, kind: str, concurrency: int, capacity: int) -> None:
        self.name = name
        self.kind = kind
        self.concurrency = concurrency
        self.capacity = capacity
        self.items_in = 0
        self.items_out = 0
        self.failures = 0
        self.records: list[FailureRecord] = []
        self.busy = 0.0
        self.in_flight = 0
        self.last_progress = time.monotonic()
        self.fill_area = 0.0  # integral of output-queue fill over time
        self.output: Any = None  # the output channel, for its current fill
        self.abandoned = False

    def record(self, item: str, exc: BaseException) -> None:
        self.failures += 1
        if len(self.records) < _MAX_RECORDS:
            self.records.append(
                FailureRecord(self.name, redact(item), type(exc).__name__, redact(str(exc)))
            )

    def snapshot(self, elapsed: float) -> StageStats:
        done = self.items_out if self.kind != "filter" else self.items_in
        span = max(elapsed, 1e-9)
        fill = len(self.output) if self.output is not None else 0
        return StageStats(
            name=self.name,
            kind=self.kind,
            concurrency=self.concurrency,
            items_in=self.items_in,
            items_out=self.items_out,
            failures=self.failures,
            failed_items=tuple(self.records),
            busy_seconds=self.busy,
            mean_seconds_per_item=self.busy / done if done else 0.0,
            utilization=min(1.0, self.busy / (span * self.concurrency)),
            in_flight=self.in_flight,
            queue_fill=fill,
            queue_capacity=self.capacity,
            mean_queue_fill=self.fill_area / span,
            abandoned=self.abandoned,
        )


@dataclass(frozen=True)
class StageStats:
    """A snapshot of one stage.

    Attributes:
        name: The stage's name (``name=`` or derived from its function).
        kind: ``source``, ``map``, ``filter``, ``flat_map``, ``batch``, ...
        concurrency: Items the stage may work on at once.
        items_in: Items it took from its input.
        items_out: Items it produced.
        failures: Items that failed (skipped under a budget, or the fatal one).
        failed_items: The failures, item repr and exception (the first 10,000).
        busy_seconds: Time spent in the stage's function, summed over workers.
        mean_seconds_per_item: ``busy_seconds`` per item produced.
        utilization: ``busy_seconds / (elapsed * concurrency)``: near 1.0 means the stage
            is saturated.
        in_flight: Items in the function right now.
        queue_fill: Items waiting in the stage's output queue now.
        queue_capacity: That queue's capacity.
        mean_queue_fill: Time-averaged ``queue_fill``.
        abandoned: A worker was still stuck in this stage's function when the run stopped.
    """

    name: str
    kind: str
    concurrency: int
    items_in: int
    items_out: int
    failures: int
    failed_items: tuple[FailureRecord, ...]
    busy_seconds: float
    mean_seconds_per_item: float
    utilization: float
    in_flight: int
    queue_fill: int
    queue_capacity: int
    mean_queue_fill: float
    abandoned: bool = False


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of a run: per-stage statistics and which stage limits throughput.

    Attributes:
        stages: One :class:`StageStats` per stage, source first.
        elapsed: Seconds since the run started.
        delivered: Items handed to the consumer.
        running: Whether the run is still going.
        bottleneck: The stage with the highest utilization, or ``"consumer"`` when the
            output stays full (the loader is waiting for the training loop), or ``None``
            before enough is known.
        notes: What the run wants you to know: which workers a stage runs on and why,
            stages abandoned while stopping.
        loop_delay_max: The longest the run's event loop was late to wake up (seconds):
            the longest callback that ran on it, to within its 50 ms sampling. Blocking work
            on the loop shows here; under 10 ms is healthy.
    """

    stages: tuple[StageStats, ...] = ()
    elapsed: float = 0.0
    delivered: int = 0
    running: bool = False
    bottleneck: str | None = None
    notes: tuple[str, ...] = field(default=())
    loop_delay_max: float = 0.0

    @property
    def throughput(self) -> float:
        """Items delivered per second."""
        return self.delivered / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def failures(self) -> tuple[FailureRecord, ...]:
        """Every recorded failure, in stage order."""
        return tuple(r for s in self.stages for r in s.failed_items)

    def __getitem__(self, name: str) -> StageStats:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def __str__(self) -> str:
        from .._display import stats_text

        return stats_text(self)

    def _repr_html_(self) -> str:
        from .._display import stats_html

        return stats_html(self)


def find_bottleneck(
    stages: tuple[StageStats, ...], output_fill: float, output_cap: int
) -> str | None:
    """The consumer if the output stays mostly full; else the most utilized stage."""
    if not stages:
        return None
    if output_cap and output_fill >= 0.8 * output_cap:
        return "consumer"
    busiest = max(stages, key=lambda s: s.utilization)
    return busiest.name if busiest.utilization > 0 else None
