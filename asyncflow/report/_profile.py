"""``asyncflow.profile``: each stage at several concurrencies, on a sample of the input.

The way SPDL's ``profile_pipeline`` does it: take the first ``sample`` items of the source, then
for each stage in order feed it the items the stage before it produced, once per concurrency
setting, and time it. A stage's items/s is its capacity; the whole pipeline runs at the pace of
its slowest stage. The recommended concurrency is the smallest setting that comes within
``tolerance`` of the best rate: more would cost threads and memory and buy nothing.

Only the stage's input is replayed: the stages after it run as in a real run, consuming its
output through an unbounded buffer. A stage function may wait on progress downstream (the
decoders of ``image.folder`` claim rows of batches that a later stage releases, and wait when
they run too far ahead): measured with nothing after it, such a stage would wait at every item
past the first few batches, and report that wait as its cost. The stage is timed up to its
last output, so a slow stage after it does not slow it down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .._errors import ConfigError, check_int
from ._tables import _rate, _Raw, _seconds, table_html, table_text

__all__ = ["ProfileReport", "StageProfile", "profile"]


@dataclasses.dataclass(frozen=True)
class StageProfile:
    """One stage's measurements.

    Attributes:
        name: The stage's name.
        kind: ``map``, ``filter``, ``flat_map``, ``batch``, ...
        items_in: Items fed to the stage (each setting got the same).
        items_out: Items it produced (at the first setting).
        rates: Items per second (input items) by concurrency setting. Stages without a
            concurrency (``batch``, ``shuffle``, ...) have one entry, under their own.
        seconds_per_item: Time inside the function per item, single-worker (map stages).
        failures: Items that failed at the first setting (skipped while profiling).
        recommended: The smallest setting within tolerance of the best rate, or ``None`` for
            stages whose concurrency is not a setting.
        configured: The concurrency the pipeline gives the stage now.
    """

    name: str
    kind: str
    items_in: int
    items_out: int
    rates: dict[int, float]
    seconds_per_item: float
    failures: int
    recommended: int | None
    configured: int

    @property
    def best_rate(self) -> float:
        return max(self.rates.values(), default=0.0)


@dataclasses.dataclass(frozen=True, repr=False)
class ProfileReport:
    """What :func:`profile` measured; prints as a table, and as HTML in notebooks.

    Attributes:
        stages: One :class:`StageProfile` per stage, in pipeline order.
        sample: Items taken from the source.
        concurrencies: The settings tried.
        source_rate: Items per second the source alone produced the sample at.
    """

    stages: tuple[StageProfile, ...]
    sample: int
    concurrencies: tuple[int, ...]
    source_rate: float

    @property
    def recommended(self) -> dict[str, int]:
        """Recommended concurrency by stage name (stages that have the setting)."""
        return {s.name: s.recommended for s in self.stages if s.recommended is not None}

    @property
    def bottleneck(self) -> str | None:
        """The stage with the lowest best rate (per source item), the pipeline's limit."""
        measured = [s for s in self.stages if s.best_rate > 0]
        if not measured:
            return None
        # A batch stage sees 1/32 as many items as the source: compare rates in source items
        # (a stage with a rate was fed some).
        return min(measured, key=lambda s: s.best_rate * self.sample / s.items_in).name

    def apply(self, pipe: Any) -> Any:
        """``pipe`` with each stage's concurrency set to the recommendation."""
        stages = list(pipe.stages)
        by_name = self.recommended
        for i, spec in enumerate(stages):
            name = spec.name or spec.default_name()
            if name in by_name and spec.traits.tunable:
                stages[i] = dataclasses.replace(spec, concurrency=by_name[name])
        return pipe.with_stages(stages)

    def _rows(self, *, html: bool) -> list[list[str]]:
        rows = []
        for s in self.stages:
            cells = [""] * len(self.concurrencies)
            if s.recommended is None:  # not a setting: one run, as configured
                cells[0] = _rate(next(iter(s.rates.values()), 0.0))
            else:
                for i, c in enumerate(self.concurrencies):
                    text = _rate(s.rates[c]) if c in s.rates else ""
                    cells[i] = _Raw(f"<b>{text}</b>") if html and c == s.recommended else text
            row = [
                s.name, s.kind, f"{s.items_in:,}", _seconds(s.seconds_per_item), *cells,
                _rate(s.best_rate), "-" if s.recommended is None else str(s.recommended),
                str(s.configured),
            ]
            if self._any_failures:
                row.append(f"{s.failures:,}")
            rows.append(row)
        return rows

    @property
    def _any_failures(self) -> bool:
        return any(s.failures for s in self.stages)

    def _headers(self) -> list[str]:
        return [
            "stage", "kind", "items", "per item",
            *(f"c={c} items/s" for c in self.concurrencies),
            "best", "recommended", "now",
            *(["failures"] if self._any_failures else []),
        ]

    def _align(self) -> str:
        return "ll" + "r" * (len(self._headers()) - 2)

    def _caption(self) -> str:
        text = (
            f"each stage on {self.sample:,} source items; the source alone: "
            f"{_rate(self.source_rate)} items/s"
        )
        if self.bottleneck:
            text += f"; slowest stage: {self.bottleneck}"
        return text

    def __str__(self) -> str:
        table = table_text(self._headers(), self._rows(html=False), align=self._align())
        return table + "\n" + self._caption()

    __repr__ = __str__

    def _repr_html_(self) -> str:
        limit = self.bottleneck
        marked = [i for i, s in enumerate(self.stages) if s.name == limit]
        return table_html(
            self._headers(), self._rows(html=True), highlight=marked, caption=self._caption(),
            align=self._align(),
        )


#: The buffer between the profiled stage and the stages after it: never full, so that the
#: stage never waits on a slower stage after it.
_UNBOUNDED = 1 << 40


class _Tap:
    """An async map after the profiled stage: keeps its outputs (if asked) and the time of
    the last one, and passes them on to the stages after it."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.outputs: list[Any] = []
        self.last: float | None = None

    async def __call__(self, item: Any) -> Any:
        self.last = time.perf_counter()
        if self.keep:
            self.outputs.append(item)
        return item


def _skipping(spec: Any) -> Any:
    # Profiling measures capacity: failed items are skipped and counted, never fatal.
    if getattr(spec, "max_failures", None) is not None:
        return dataclasses.replace(spec, max_failures=None)
    return spec


def _sub_pipeline(pipe: Any, items: list[Any], spec: Any, after: Sequence[Any], tap: _Tap) -> Any:
    """``pipe``'s options and type, with ``items`` as the source, then ``spec``, the tap,
    and the stages ``after`` it."""
    new = (
        pipe.with_source(items)
        .without_hooks()
        .with_options(max_failures=1.0, report_every=None)
        .with_stages((_skipping(spec),))
        .map(tap, name="profile-tap", buffer=_UNBOUNDED)
    )
    return new.with_stages((*new.stages, *(_skipping(s) for s in after)))


def _timed_run(pipe: Any, tap: _Tap) -> tuple[float, Any]:
    start = time.perf_counter()
    with pipe.open() as run:
        for _ in run:
            pass
        end = time.perf_counter()
        stats = run.stats()
    # The stage's time is up to its last output (all of the run's if it produced none).
    return (end if tap.last is None else tap.last) - start, stats


def _take(pipe: Any, sample: int) -> tuple[list[Any], float]:
    from ..pipeline import Pipeline

    start = time.perf_counter()
    with Pipeline(pipe.source).open() as run:
        items = list(itertools.islice(run, sample))  # stops at the sample: reads no further
    return items, len(items) / max(time.perf_counter() - start, 1e-9)


def _check(sample: int, concurrencies: Iterable[int], tolerance: float) -> tuple[int, ...]:
    check_int("sample", sample)
    settings = tuple(sorted({check_int("each of concurrencies", c) for c in concurrencies}))
    if not settings:
        raise ConfigError(f"concurrencies must hold an int >= 1, got {concurrencies!r}")
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance must lie in [0, 1), got {tolerance!r}")
    return settings


def profile(
    pipe: Any,
    *,
    sample: int = 256,
    concurrencies: Sequence[int] = (1, 2, 4, 8),
    tolerance: float = 0.1,
) -> ProfileReport:
    """Measure each stage of ``pipe`` at several concurrencies, and recommend one.

    Each stage gets a replay of what the stage before it produced, and is timed up to its last
    output while the stages after it consume that output, as in a real run (a stage may wait
    on their progress: ``image.folder``'s decoders do).

    Args:
        pipe: The pipeline. Its source is read for ``sample`` items (an iterator source is
            consumed that far).
        sample: Source items to profile with. Every stage's function runs on its share of
            them once per setting of itself and of each stage before it, so keep side
            effects in mind.
        concurrencies: The settings tried for stages whose traits say their concurrency is
            worth tuning (``StageTraits.tunable``: ``map``, ``filter``, ``flat_map``); other
            stages (``batch``, ``shuffle``, ...) run once as configured.
        tolerance: Recommend the smallest setting whose rate is within this fraction of
            the best.

    Returns:
        A :class:`ProfileReport`: ``print()`` it, display it in a notebook, read
        ``report.recommended``, or ``report.apply(pipe)`` for a pipeline that uses the
        recommendations.

    Raises:
        ConfigError: An argument is invalid.

    Cancellation:
        Ctrl-C stops the run in progress and propagates; nothing is left running.
    """
    settings = _check(sample, concurrencies, tolerance)
    with _quiet_skips():
        return _profile(pipe, sample, settings, tolerance)


@contextlib.contextmanager
def _quiet_skips() -> Iterator[None]:
    """Failures are counted in the report; the engine's per-item skip log would repeat each
    one once per setting."""
    logger = logging.getLogger("asyncflow")
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)


def _profile(pipe: Any, sample: int, settings: tuple[int, ...], tolerance: float) -> ProfileReport:
    items, source_rate = _take(pipe, sample)
    results = []
    for index, spec in enumerate(pipe.stages):
        name = spec.name or spec.default_name()
        configured = spec.concurrency
        tunable = spec.traits.tunable
        rates: dict[int, float] = {}
        outputs: list[Any] = []
        per_item, failures = 0.0, 0
        after = pipe.stages[index + 1:]
        for c in settings if tunable else (configured,):
            variant = dataclasses.replace(spec, concurrency=c) if tunable else spec
            tap = _Tap(keep=not rates)  # the first setting's outputs feed the next stage
            elapsed, stats = _timed_run(_sub_pipeline(pipe, items, variant, after, tap), tap)
            if not rates:
                outputs = tap.outputs
                stage = stats.stages[1]  # after the source
                per_item, failures = stage.mean_seconds_per_item, stage.failures
            rates[c] = len(items) / max(elapsed, 1e-9)
        recommended = None
        if tunable:
            best = max(rates.values())
            recommended = min(c for c, r in rates.items() if r >= (1 - tolerance) * best)
        results.append(StageProfile(
            name=name, kind=spec.kind, items_in=len(items), items_out=len(outputs), rates=rates,
            seconds_per_item=per_item, failures=failures, recommended=recommended,
            configured=configured,
        ))
        items = outputs
    return ProfileReport(
        stages=tuple(results), sample=sample, concurrencies=settings, source_rate=source_rate
    )
