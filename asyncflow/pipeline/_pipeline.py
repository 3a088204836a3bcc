"""The immutable, fluent description of a pipeline, and its iteration entry points."""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Self

from .._errors import ConfigError
from ._handle import ConsumerHook, Run
from ._run import PoolHolder, RunOptions, Runtime
from ._spec import (
    BatchSpec,
    CustomSpec,
    MapSpec,
    PrefetchSpec,
    ShuffleSpec,
    StageSpec,
    UnbatchSpec,
    check_budget,
    check_positive,
)
from ._stats import PipelineStats
from ._workers import Processes, resolve_workers

if TYPE_CHECKING:
    import os

__all__ = ["Pipeline"]


class _Source:
    """The user's source plus what all pipelines derived from it share: the epoch count, and
    whether a one-shot iterator has been used up."""

    def __init__(self, source: Any) -> None:
        self.source = source
        # A class (``itertools.count``) is a factory even though it defines __iter__.
        self.is_factory = isinstance(source, type) or (callable(source) and not (
            hasattr(source, "__iter__") or hasattr(source, "__aiter__")
        ))
        self.one_shot = not self.is_factory and (
            (hasattr(source, "__next__") and iter(source) is source)
            or (hasattr(source, "__anext__"))
        )
        self.runs = 0
        self.first = 0  # the first run's epoch number (with_source may start later)
        self.resume_offset = 0
        self.lock = threading.Lock()

    def next_epoch(self) -> int:
        with self.lock:
            epoch, self.runs = self.runs, self.runs + 1
        if self.one_shot and epoch > self.first:
            raise ConfigError(
                f"the source {type(self.source).__name__} is an iterator, so it can be read "
                "once, and an earlier run has read it; pass a list, or a zero-argument "
                "callable that returns a fresh iterable, to iterate more than one epoch"
            )
        return epoch

    def open(self) -> Any:
        if not self.is_factory:
            return self.source
        source = self.source()
        if not (hasattr(source, "__iter__") or hasattr(source, "__aiter__")):
            raise ConfigError(
                f"the source callable {getattr(self.source, '__name__', self.source)!r} "
                f"returned {type(source).__name__}, not an iterable or async iterable"
            )
        return source

    def describe(self) -> dict[str, Any]:
        source = self.source
        info: dict[str, Any] = {"type": type(source).__name__}
        if self.is_factory:
            info["callable"] = getattr(source, "__qualname__", None) or type(source).__qualname__
        try:
            info["len"] = len(source)
        except TypeError:
            pass
        return info


def _check_number(what: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{what} must be a positive number of seconds, got {value!r}")


class Pipeline:
    """An immutable description of a dataflow: a source and stages joined by bounded queues.

    Building runs nothing: each method returns a new pipeline. Every iteration is a new run
    (an epoch) on a loop thread of its own; ``for`` and ``async for`` both work, in scripts,
    in async training loops and in Jupyter.

    Args:
        source: An iterable, an async iterable, or a zero-argument callable returning one
            (called again for each epoch).
        name: Names the pipeline in logs and thread names.
        max_failures: The default failure budget of every stage: ``0`` (default) fails on
            the first error; an int allows that many failed items per stage; a float in
            [0, 1] allows that fraction of the items a stage has seen. Skipped items are
            counted, logged (rate-limited) and listed in :meth:`stats`.
        retry: The default ``asyncflow.Retry`` policy of reads in this pipeline.
        timeout: The default ``asyncflow.Timeout`` of reads in this pipeline.
        stall_timeout: Fail a stage that has had work in hand and produced nothing for this
            many seconds (``StallError`` naming it). ``None`` (default) never does.
        report_every: Log the stats table at INFO every this many seconds.
        stop_timeout: How long stopping waits for a stage function to return before
            abandoning its thread (it cannot be interrupted) and saying so.
        progress: Show a progress bar for every run (as :meth:`progress` does).
        buffer: Capacity of the source's output queue, in items (default 64): lower it
            when the source yields large items, such as whole batches.
        buffer_bytes: A byte budget for every queue of the pipeline (a stage's own
            ``buffer_bytes`` overrides it): a queue takes no more items once the ones it holds
            reach this many bytes (``nbytes`` of arrays and tensors, the length of bytes,
            summed over tuples, lists and dicts), and a stage's chunks in hand stay within
            half of it. For large items (videos, shards, big tensors) without hand-tuned item
            counts. ``None`` (default): queues are bounded in items only.
        notes: Lines shown in ``stats().notes`` of every run: what a library built on
            pipelines chose for the user, and why (``image.folder`` says whether it decodes
            on threads or processes).

    Raises:
        ConfigError: An option is invalid.
    """

    def __init__(
        self,
        source: Any,
        *,
        name: str | None = None,
        max_failures: int | float = 0,
        retry: Any = None,
        timeout: Any = None,
        stall_timeout: float | None = None,
        report_every: float | None = None,
        stop_timeout: float = 2.0,
        progress: bool = False,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
        notes: tuple[str, ...] = (),
    ) -> None:
        if source is None or not (
            callable(source) or hasattr(source, "__iter__") or hasattr(source, "__aiter__")
        ):
            raise ConfigError(
                "Pipeline(source): the source must be an iterable, an async iterable or a "
                f"zero-argument callable returning one; got {type(source).__name__}"
            )
        check_budget(max_failures)
        check_positive("buffer", buffer, allow_none=True)
        check_positive("buffer_bytes", buffer_bytes, allow_none=True)
        _check_number("stall_timeout", stall_timeout)
        _check_number("report_every", report_every)
        _check_number("stop_timeout", stop_timeout)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"name must be a non-empty string, got {name!r}")
        if retry is not None or timeout is not None:
            from ..sources._retry import Retry, Timeout  # light: dataclasses, no aiohttp

            for what, value, cls in (("retry", retry, Retry), ("timeout", timeout, Timeout)):
                if value is not None and not isinstance(value, cls):
                    raise ConfigError(
                        f"{what} must be an asyncflow.{cls.__name__}, got {value!r:.80}"
                    )
        settings = tuple((k, v) for k, v in (("retry", retry), ("timeout", timeout)) if v)
        self._source = _Source(source)
        self._stages: tuple[StageSpec, ...] = ()
        self._hooks: tuple[Callable[[Run], ConsumerHook], ...] = ()
        if progress:
            from .._progress import progress_hook

            self._hooks = (progress_hook(),)
        self._options = RunOptions(
            name=name or "pipeline",
            max_failures=max_failures,
            stall_timeout=stall_timeout,
            report_every=report_every,
            stop_timeout=stop_timeout,
            settings=settings,
            source_buffer=buffer,
            notes=tuple(str(n) for n in notes),
            buffer_bytes=buffer_bytes,
        )
        self._last: list[Runtime] = []
        self._pools = PoolHolder()

    # -- building -----------------------------------------------------------------------

    def _then(self, spec: StageSpec) -> Self:
        """A copy of this pipeline with ``spec`` appended (subclasses keep their type)."""
        if self._stages and getattr(self._stages[-1], "terminal", False):
            last = self._stages[-1]
            raise ConfigError(
                f"{last.name or last.default_name()}() must be the last stage: the stages "
                f"after it would receive batches still in flight (move {spec.kind}() before it)"
            )
        new = copy.copy(self)
        new._stages = (*self._stages, spec)
        new._last = []
        new._pools = PoolHolder()  # a new pipeline object: persistent workers of its own
        return new

    def with_source(self, source: Any, *, epoch: int = 0, start: int = 0) -> Self:
        """The same stages over another source, sharing this pipeline's persistent workers.

        For a loader that builds each epoch's source itself (a new list of index batches),
        while its worker processes (``Processes(persistent=True)``) live on from epoch to
        epoch.

        Args:
            source: As for :class:`Pipeline`.
            epoch: The number of the copy's first run (it seeds shuffles and the per-item
                seeds of worker processes).
            start: The position in the epoch of ``source``'s first item, when it resumes an
                epoch part-way: per-item seeds then match those of an uninterrupted run.

        Raises:
            ConfigError: ``source`` is not an iterable, an async iterable or a callable, or
                ``epoch`` is not an int >= 0.
        """
        for what, value in (("epoch", epoch), ("start", start)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{what} must be an int >= 0, got {value!r}")
        if source is None or not (
            callable(source) or hasattr(source, "__iter__") or hasattr(source, "__aiter__")
        ):
            raise ConfigError(
                "with_source(source): the source must be an iterable, an async iterable or a "
                f"zero-argument callable returning one; got {type(source).__name__}"
            )
        new = copy.copy(self)
        new._source = _Source(source)
        new._source.runs = new._source.first = epoch
        new._source.resume_offset = start
        new._last = []
        return new

    def _with_hook(self, factory: Callable[[Run], ConsumerHook]) -> Self:
        """A copy with a consumer-side hook, built per run by ``factory(run)``.

        The copy runs the same stages, so it shares this pipeline's latest-run statistics:
        ``pipe.stats()`` also shows a run of ``pipe.progress()``.
        """
        new = copy.copy(self)
        new._hooks = (*self._hooks, factory)
        return new

    def map(
        self,
        fn: Callable[[Any], Any],
        *,
        concurrency: int = 1,
        ordered: bool = True,
        executor: Executor | None = None,
        workers: str | Processes = "threads",
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Self:
        """Apply ``fn`` to each item.

        An ``async def`` function runs on the run's event loop, ``concurrency`` calls in
        flight. A plain function runs on the run's worker threads (``concurrency`` at once),
        given several queued items per hand-off when it is cheap. With
        ``workers="processes"`` (or an :class:`~asyncflow.Processes`) it runs in
        ``concurrency`` worker processes instead, for Python code that holds the GIL: ``fn``
        goes to each worker once, items in chunks, arrays and tensors come back through shared
        memory (see :class:`~asyncflow.Processes`). ``executor=`` runs it in any
        ``concurrent.futures.Executor``.

        Args:
            fn: Takes one item, returns the new item.
            concurrency: Items in ``fn`` at once (>= 1).
            ordered: Yield in input order (default; a reorder buffer bounded by the
                concurrency). ``False`` yields in completion order: no head-of-line blocking.
            executor: A ``concurrent.futures.Executor`` for a sync ``fn``.
            workers: ``"threads"`` (default), ``"processes"``, an
                :class:`~asyncflow.Processes` with options (persistent workers, an init hook,
                the seed, the start method), or ``"auto"``: processes where they are safe
                (two or more usable cores, a picklable ``fn``, not already in a worker),
                threads
                otherwise; ``stats().notes`` says which, and why.
            name: The stage's name in stats and errors (default: ``fn``'s name).
            max_failures: This stage's failure budget (default: the pipeline's).
            buffer: Capacity of the stage's output queue, in items.
            buffer_bytes: A byte budget for the stage's output queue (see
                :class:`Pipeline`).

        Raises:
            ConfigError: An argument is invalid, ``fn`` cannot take one argument, or (with
                processes) ``fn`` cannot be pickled.
        """
        return self._then(MapSpec(
            mode="map", fn=fn, concurrency=concurrency, ordered=ordered, executor=executor,
            name=name, max_failures=max_failures, buffer=buffer, buffer_bytes=buffer_bytes,
            **_workers_options(fn, workers, concurrency, name),
        ))

    def filter(
        self,
        predicate: Callable[[Any], Any],
        *,
        concurrency: int = 1,
        ordered: bool = True,
        executor: Executor | None = None,
        workers: str | Processes = "threads",
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Self:
        """Keep the items for which ``predicate`` returns a true value. Runs like :meth:`map`."""
        return self._then(MapSpec(
            mode="filter", fn=predicate, concurrency=concurrency, ordered=ordered,
            executor=executor, name=name, max_failures=max_failures, buffer=buffer,
            buffer_bytes=buffer_bytes, **_workers_options(predicate, workers, concurrency, name),
        ))

    def flat_map(
        self,
        fn: Callable[[Any], Any],
        *,
        concurrency: int = 1,
        ordered: bool = True,
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Self:
        """Replace each item by the items of the iterable, generator or async iterable that
        ``fn`` returns (tar shards into samples, files into lines).

        With ``concurrency > 1`` and ``ordered``, each item's expansion is buffered (up to
        ``buffer`` items) until the earlier items' expansions have been yielded. A failure
        part-way through an expansion counts as the item's failure; what it yielded before
        stays yielded.
        """
        return self._then(MapSpec(
            mode="flat_map", fn=fn, concurrency=concurrency, ordered=ordered,
            name=name, max_failures=max_failures, buffer=buffer, buffer_bytes=buffer_bytes,
        ))

    def batch(self, size: int, *, drop_last: bool = False, name: str | None = None) -> Self:
        """Group items into lists of ``size``; the last one shorter unless ``drop_last``."""
        return self._then(BatchSpec(size=size, drop_last=drop_last, name=name))

    def unbatch(self, *, name: str | None = None) -> Self:
        """Emit the elements of each item (a list, tuple, tensor, or any iterable)."""
        return self._then(UnbatchSpec(name=name))

    def prefetch(self, size: int, *, name: str | None = None) -> Self:
        """Keep up to ``size`` items ready ahead of the consumer."""
        return self._then(PrefetchSpec(size=size, name=name))

    def shuffle(
        self, *, buffer_size: int = 1024, seed: int | None = None, name: str | None = None
    ) -> Self:
        """Shuffle items through a buffer of ``buffer_size``.

        With a ``seed`` the order is reproducible, and differs from epoch to epoch (it
        depends on the seed and the epoch number).
        """
        return self._then(ShuffleSpec(buffer_size=buffer_size, seed=seed, name=name))

    def to_device(
        self, device: Any, *, non_blocking: bool = True, pool_size: int | None = None
    ) -> Self:
        """Copy batches to ``device``: staged in pinned memory, copied on a side CUDA stream,
        waited for by the consumer's stream (see :func:`asyncflow.torch.to_device`).

        Must be the last stage. ``"cpu"`` returns the pipeline unchanged.

        Raises:
            ConfigError: ``device`` is CUDA and CUDA is not available.
        """
        from ..torch._transfer import to_device

        if pool_size is None:
            return to_device(self, device, non_blocking=non_blocking)
        return to_device(self, device, non_blocking=non_blocking, pool_size=pool_size)

    def cache(self, path: str | os.PathLike[str], **options: Any) -> Pipeline:
        """Store the output on the first pass, replay it afterwards (see :mod:`asyncflow.cache`)."""
        from ..cache._pipeline import cache

        return cache(self, path, **options)

    def progress(self, **options: Any) -> Self:
        """Show a progress bar (tqdm: a widget in notebooks, a bar in terminals)."""
        from .._progress import progress_hook

        return self._with_hook(progress_hook(**options))

    # -- running ------------------------------------------------------------------------

    def _runtime(self) -> Runtime:
        return self._new_runtime(self._source.open, self._options)

    def _new_runtime(self, open_source: Callable[[], Any], options: RunOptions) -> Runtime:
        """A new run's runtime, opening its source with ``open_source`` (subclasses may open
        it otherwise, or change the options, when no stage follows the source, say)."""
        epoch = self._source.next_epoch()
        rt = Runtime(open_source, self._stages, options, epoch, pools=self._pools,
                     start=self._source.resume_offset)
        rt.start_offset, self._source.resume_offset = self._source.resume_offset, 0
        self._last[:] = [rt]
        return rt

    def _items_per_output(self) -> int:
        """Source items behind each output item, when the stages make that a constant."""
        factor = 1
        for spec in self._stages:
            budget = getattr(spec, "max_failures", None)
            budget = self._options.max_failures if budget is None else budget
            if isinstance(spec, MapSpec) and spec.mode == "map" and spec.ordered and not budget:
                continue
            if isinstance(spec, BatchSpec):
                factor *= spec.size
                continue
            if isinstance(spec, PrefetchSpec):
                continue
            if isinstance(spec, CustomSpec) and spec.items_per_output is not None:
                factor *= spec.items_per_output
                continue
            raise ConfigError(
                f"this pipeline cannot be resumed: stage {spec.name or spec.default_name()!r} "
                f"({spec.kind}) does not map source items to outputs in a fixed, ordered way "
                "(resumable pipelines use ordered maps with max_failures=0, batch and prefetch)"
            )
        return factor

    def state_dict(self) -> dict[str, Any]:
        """Where the latest run stands, for resuming after a crash.

        For a pipeline whose source is a sampler (it has ``state_dict`` /
        ``load_state_dict``): the sampler's state, with ``offset`` counting the source items
        whose outputs the consumer has received. :meth:`load_state_dict` on a new pipeline
        then makes its next run yield exactly the remaining items, in the same order.

        Raises:
            ConfigError: The source is not a sampler, or a stage makes the count ambiguous
                (a filter, flat_map, shuffle, unordered map or failure budget).
        """
        source = self._source.source
        if not callable(getattr(source, "state_dict", None)):
            raise ConfigError(
                f"state_dict() needs a sampler source (with state_dict/load_state_dict); "
                f"this pipeline reads a {type(source).__name__}"
            )
        factor = self._items_per_output()
        state = dict(source.state_dict())
        if self._last:
            rt = self._last[0]
            run = rt.consumer() if rt.consumer is not None else None
            delivered = run.delivered if run is not None else rt.delivered
            state["offset"] = min(len(source), rt.start_offset + delivered * factor)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`: the next run resumes where it stood.

        Raises:
            ConfigError: The source is not a sampler, or the state does not fit it.
        """
        source = self._source.source
        if not callable(getattr(source, "load_state_dict", None)):
            raise ConfigError(
                f"load_state_dict() needs a sampler source; this pipeline reads a "
                f"{type(source).__name__}"
            )
        self._items_per_output()
        source.load_state_dict(state)
        self._source.resume_offset = int(state.get("offset", 0))

    def open(self, *, timeout: float | None = None) -> Run:
        """A new run, for ``with pipe.open() as run:`` or ``async with pipe.open() as run:``.

        Args:
            timeout: Raise ``StallError`` when no item arrives for this many seconds.
        """
        _check_number("timeout", timeout)
        return Run(self._runtime, timeout=timeout, hooks=self._hooks, on_start=_link)

    def __iter__(self) -> Run:
        return self.open()

    def __aiter__(self) -> Run:
        return self.open()

    # -- introspection ------------------------------------------------------------------

    @property
    def source(self) -> Any:
        """The source given to the constructor."""
        return self._source.source

    @property
    def stages(self) -> tuple[StageSpec, ...]:
        """The stage specs after the source, in order."""
        return self._stages

    @property
    def options(self) -> RunOptions:
        return self._options

    def stats(self) -> PipelineStats:
        """Statistics of the latest run of this pipeline object (during or after it)."""
        return self._last[0].snapshot() if self._last else PipelineStats()

    def describe(self) -> list[dict[str, Any]]:
        """A JSON-able description: the source, then each stage's kind, name and settings."""
        out: list[dict[str, Any]] = [
            {"kind": "source", "name": "source", **self._source.describe()}
        ]
        for spec in self._stages:
            out.append({
                "kind": spec.kind, "name": spec.name or spec.default_name(), **spec.settings(),
            })
        return out

    def __repr__(self) -> str:
        parts = [f"Pipeline({type(self._source.source).__name__})"]
        for stage in self.describe()[1:]:
            settings = ", ".join(
                f"{k}={v}" for k, v in stage.items() if k not in ("kind", "name") and v is not None
                and not (k == "fn" and v == stage["name"])
            )
            parts.append(f".{stage['kind']}({stage['name']}{', ' if settings else ''}{settings})")
        return "\n    ".join(parts)

    def _repr_html_(self) -> str:
        from .._display import pipeline_html

        return pipeline_html(self)


def _workers_options(
    fn: Callable[[Any], Any], workers: str | Processes, concurrency: int, name: str | None
) -> dict[str, Any]:
    if workers != "auto":
        return {"processes": resolve_workers(workers)}
    from ._auto import choose_workers
    from ._spec import fn_name

    processes, note = choose_workers(fn, concurrency, stage=name or fn_name(fn))
    return {"processes": processes, "note": note}


def _link(rt: Runtime, run: Run) -> None:
    rt.consumer = weakref.ref(run)
