"""What a run measures about each stage, and the snapshots users read (``pipe.stats()``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from .._errors import FailureRecord
from .._redact import redact
from ._features import feature

__all__ = [
    "INTERNAL",
    "KIND",
    "FailureRecord",
    "ItemGroup",
    "PipelineStats",
    "StageCounters",
    "StageStats",
    "count_items",
    "count_one",
    "label_stage",
]

F = TypeVar("F")

_MAX_RECORDS = 10_000

#: A stage function with this attribute set true makes an *internal* stage: one a library
#: added around the user's stages (``image.folder``'s ``claim``), hidden from the default
#: stats table; its time is attributed to the next stage that is not internal.
INTERNAL = "__asyncflow_internal__"
#: A stage function with this attribute (a string) names the stage's kind in ``stats()``,
#: for a library whose ``describe()`` names it so (a stage kind of the engine's own, such as
#: ``assemble``, needs no label: its spec names it).
KIND = "__asyncflow_kind__"


class ItemGroup(list):  # type: ignore[type-arg]
    """Several user items moving through stages as one message (one hand-off, one queue
    slot): stage statistics count its elements, not the group.

    A library that batches items for its own efficiency (``image.folder`` hands decoders
    groups of images) returns an ``ItemGroup`` where it would return a list; an ``unbatch``
    stage that only splits groups back into items is internal (hidden from the default table).
    """

    __slots__ = ()


def label_stage(fn: F, *, kind: str | None = None, internal: bool = False) -> F:
    """Label the stage that runs ``fn`` (a ``map``, ``filter`` or ``flat_map`` function) in
    ``stats()``, and return ``fn``.

    Args:
        fn: The stage function; it gets the attributes :data:`KIND` and :data:`INTERNAL`.
        kind: The kind ``stats()`` shows, as the pipeline's ``describe()`` names it (a library's
            own stage run by a ``map``).
        internal: The stage is a library's, not the user's: the default stats table hides it,
            and its time counts for the next stage that is not internal.
    """
    if kind is not None:
        setattr(fn, KIND, kind)
    setattr(fn, INTERNAL, internal)
    return fn


def count_items(values: list[Any]) -> int:
    """User items in ``values``: one per value, an :class:`ItemGroup` its length."""
    extra = 0
    for value in values:  # a plain loop: no generator to set up for one-item chunks
        if value.__class__ is ItemGroup:
            extra += len(value) - 1
    return len(values) + extra


def count_one(value: Any) -> int:
    """User items in one value: 1, an :class:`ItemGroup` its length."""
    return len(value) if value.__class__ is ItemGroup else 1


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
        self.full_area = 0.0  # integral of its fullness, 0 to 1 (the hand-off's only)
        self.output: Any = None  # the output channel, for its current fill
        self.abandoned = False
        #: Hand-offs of work to the stage's function or workers (chunks, calls).
        self.chunks = 0
        #: A stage a library added (see :data:`INTERNAL`).
        self.internal = False
        #: The kind shown in stats, when the stage's function names one (see :data:`KIND`).
        self.shown_kind: str | None = None

    def label(self, fn: Any) -> None:
        """Take the stage's stats labels from its function (:data:`INTERNAL`, :data:`KIND`)."""
        self.internal = bool(getattr(fn, INTERNAL, False))
        kind = getattr(fn, KIND, None)
        self.shown_kind = kind if isinstance(kind, str) else None

    def record(self, item: str, exc: BaseException) -> None:
        self.failures += 1
        if len(self.records) < _MAX_RECORDS:
            self.records.append(
                FailureRecord(self.name, redact(item), type(exc).__name__, redact(str(exc)))
            )

    def snapshot(self, elapsed: float) -> StageStats:
        # A stage handles the larger of what it takes and what it puts out: a filter's or a
        # batch stage's input, an unbatch or flat_map stage's output.
        done = max(self.items_in, self.items_out)
        span = max(elapsed, 1e-9)
        fill = len(self.output) if self.output is not None else 0
        return StageStats(
            name=self.name,
            kind=self.shown_kind or self.kind,
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
            items_per_second=done / span,
            chunks=self.chunks,
            internal=self.internal,
        )


@dataclass(frozen=True)
class StageStats:
    """A snapshot of one stage.

    Counts are of user items, however the stage moves them: a map stage on threads or
    processes hands its items to workers in adaptive chunks (counted in ``chunks``), and a
    :class:`ItemGroup` of items travelling as one message counts as its items.

    Attributes:
        name: The stage's name (``name=`` or derived from its function), as in
            ``pipe.describe()``.
        kind: ``source``, ``map``, ``filter``, ``flat_map``, ``batch``, ... as in
            ``pipe.describe()`` (``image.folder``'s ``batch`` stage is an ``assemble``).
        concurrency: Items the stage may work on at once.
        items_in: Items it took from its input.
        items_out: Items it produced (a batch stage: batches).
        failures: Items that failed (skipped under a budget, or the fatal one).
        failed_items: The failures, item repr and exception (the first 10,000).
        busy_seconds: Time spent in the stage's function, summed over workers.
        mean_seconds_per_item: ``busy_seconds`` per item handled: the larger of
            ``items_in`` and ``items_out`` (a batch stage's items, not its batches).
        utilization: ``busy_seconds / (elapsed * concurrency)``: near 1.0 means the stage
            is saturated.
        in_flight: Items in the function right now.
        queue_fill: Items waiting in the stage's output queue now.
        queue_capacity: That queue's capacity.
        mean_queue_fill: Time-averaged ``queue_fill``.
        abandoned: A worker was still stuck in this stage's function when the run stopped.
        items_per_second: Items handled (as for ``mean_seconds_per_item``) per second of
            the run.
        chunks: Hand-offs of work to the stage's function: chunks for a sync ``map`` or
            ``filter`` (``items_in / chunks`` is the mean chunk size), calls for an async
            one, a ``flat_map`` or ``to_device``; 0 for stages without a function.
        internal: A library added this stage around the user's (``image.folder``'s
            ``claim`` and ``rows``): the default table hides it, and the bottleneck names the
            next stage that is not internal in its place.
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
    items_per_second: float = 0.0
    chunks: int = 0
    internal: bool = False


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of a run: per-stage statistics and which stage limits throughput.

    Attributes:
        stages: One :class:`StageStats` per stage, source first.
        elapsed: Seconds since the run started.
        delivered: Items handed to the consumer.
        running: Whether the run is still going.
        bottleneck: The stage with the highest utilization (an internal stage's time counts
            for the next stage that is not internal), or ``"consumer"`` when the output stays
            full, by its items or under a byte budget by its bytes (the loader is waiting for
            the training loop), or ``None`` before enough is known.
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
    def user_stages(self) -> tuple[StageStats, ...]:
        """The stages the user wrote: :attr:`stages` less the internal ones."""
        return tuple(s for s in self.stages if not s.internal)

    def table(self, *, internal: bool = False) -> str:
        """The text table (``str(stats)``); ``internal=True`` lists internal stages too."""
        return cast(str, feature("stats_text")(self, internal=internal))

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
        return cast(str, feature("stats_text")(self))

    def _repr_html_(self) -> str:
        return cast(str, feature("stats_html")(self))


def find_bottleneck(stages: tuple[StageStats, ...], output_fullness: float) -> str | None:
    """The consumer if the output stays mostly full (``output_fullness``, its mean over the
    run, 0 to 1: by items, or by bytes under a byte budget); else the most utilized stage, an
    internal stage standing for the next stage that is not internal (the one it works for)."""
    if not stages:
        return None
    if output_fullness >= 0.8:
        return "consumer"
    busiest = max(range(len(stages)), key=lambda i: stages[i].utilization)
    if stages[busiest].utilization <= 0:
        return None
    return next((s.name for s in stages[busiest:] if not s.internal), stages[busiest].name)
