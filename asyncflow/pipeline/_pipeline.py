"""The immutable, fluent ``Pipeline``: its constructor, stage methods and feature methods.

What every pipeline holds, its seams, and how it runs are in ``_core.py``. The feature methods
(``to_device``, ``cache``, ``progress``) look their implementation up by name in the feature
registry (``_features.py``); the engine imports none of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Coroutine, Iterable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast, overload

from .._errors import ConfigError, check_budget, check_int, check_seconds
from ..workers import Processes, choose_workers, resolve_workers
from ._assemble import AssembleSpec
from ._core import HookFactory, PipelineCore
from ._features import feature
from ._options import RunOptions
from ._pool_holder import PoolHolder
from ._run import T_co
from ._shared_source import SharedSource, Source, check_source
from ._spec import BatchSpec, FlatMapSpec, MapSpec, PrefetchSpec, ShuffleSpec, UnbatchSpec, fn_name

if TYPE_CHECKING:
    import os

    from ._protocols import Assembler

__all__ = ["Pipeline"]

U = TypeVar("U")


class Pipeline(PipelineCore[T_co]):
    """An immutable description of a dataflow: a source and stages joined by bounded queues.

    Building runs nothing: each method returns a new pipeline. Every iteration is a new run
    (an epoch) on a loop thread of its own; ``for`` and ``async for`` both work, in scripts,
    in async training loops and in Jupyter.

    ``Pipeline[T]`` yields items of type ``T``, for type checkers: ``Pipeline(range(3))`` is a
    ``Pipeline[int]``, ``.map(str)`` makes it a ``Pipeline[str]``, ``.batch(8)`` a
    ``Pipeline[list[str]]``, and ``for``, ``async for`` and :meth:`open` yield ``T``. The
    methods that keep the items (``filter``, ``shuffle``, ``prefetch``, ``to_device``, the
    ``with_*`` seams) return the pipeline's own class; those that change them return a
    ``Pipeline[U]`` (at run time still an instance of the same class). A bare ``Pipeline``
    annotation means ``Pipeline[Any]``.

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
        window: Items let in by the source and not yet received nor dropped, at most
            (torch's ``prefetch_factor * num_workers``); stages keep items one for one.
        notes: Lines shown in ``stats().notes`` of every run: what a library built on
            pipelines chose for the user, and why (``image.folder`` says whether it decodes
            on threads or processes).

    Raises:
        ConfigError: An option is invalid.
    """

    def __init__(
        self,
        source: Source[T_co],
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
        window: int | None = None,
        notes: tuple[str, ...] = (),
    ) -> None:
        check_source("Pipeline(source)", source)
        check_budget("max_failures", max_failures)
        check_int("buffer", buffer, allow_none=True)
        check_int("buffer_bytes", buffer_bytes, allow_none=True)
        check_seconds("stall_timeout", stall_timeout, allow_none=True)
        check_seconds("report_every", report_every, allow_none=True)
        check_seconds("stop_timeout", stop_timeout)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"name must be a non-empty string, got {name!r}")
        given = {"retry": retry, "timeout": timeout}
        settings = tuple((what, value) for what, value in given.items() if value is not None)
        for what, value in settings:
            cls = feature(what.capitalize())  # asyncflow.Retry / asyncflow.Timeout
            if not isinstance(value, cls):
                raise ConfigError(f"{what} must be an asyncflow.{cls.__name__}, got {value!r:.80}")
        self._source = SharedSource(source)
        self._stages = ()
        self._hooks = (cast(HookFactory, feature("progress_hook")()),) if progress else ()
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
            window=window,
        )
        self._last = []
        self._pools = PoolHolder()

    # -- stages -------------------------------------------------------------------------

    @overload
    def map(
        self,
        fn: Callable[[T_co], Coroutine[Any, Any, U]],
        *,
        concurrency: int = 1,
        ordered: bool = True,
        executor: Executor | None = None,
        workers: str | Processes = "threads",
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Pipeline[U]: ...

    @overload
    def map(
        self,
        fn: Callable[[T_co], U],
        *,
        concurrency: int = 1,
        ordered: bool = True,
        executor: Executor | None = None,
        workers: str | Processes = "threads",
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Pipeline[U]: ...

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
    ) -> Pipeline[Any]:
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
            fn: Takes one item, returns the new item: ``Callable[[T], U]``, or an ``async def``
                function returning ``U``, makes a ``Pipeline[U]``.
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
        return self.with_stage(MapSpec(
            mode="map", fn=fn, concurrency=concurrency, ordered=ordered, executor=executor,
            name=name, max_failures=max_failures, buffer=buffer, buffer_bytes=buffer_bytes,
            **_workers_options(fn, workers, concurrency, name),
        ))

    def filter(
        self,
        predicate: Callable[[T_co], object],
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
        return self.with_stage(MapSpec(
            mode="filter", fn=predicate, concurrency=concurrency, ordered=ordered,
            executor=executor, name=name, max_failures=max_failures, buffer=buffer,
            buffer_bytes=buffer_bytes, **_workers_options(predicate, workers, concurrency, name),
        ))

    def flat_map(
        self,
        fn: Callable[
            [T_co],
            Iterable[U] | AsyncIterable[U] | Coroutine[Any, Any, Iterable[U] | AsyncIterable[U]],
        ],
        *,
        concurrency: int = 1,
        ordered: bool = True,
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Pipeline[U]:
        """Replace each item by the items of the iterable, generator or async iterable that
        ``fn`` returns (tar shards into samples, files into lines): an ``Iterable[U]`` or
        ``AsyncIterable[U]`` (or an ``async def`` function's) makes a ``Pipeline[U]``.

        With ``concurrency > 1`` and ``ordered``, each item's expansion is buffered (up to
        ``buffer`` items) until the earlier items' expansions have been yielded. A failure
        part-way through an expansion counts as the item's failure; what it yielded before
        stays yielded.
        """
        return cast("Pipeline[U]", self.with_stage(FlatMapSpec(
            fn=fn, concurrency=concurrency, ordered=ordered,
            name=name, max_failures=max_failures, buffer=buffer, buffer_bytes=buffer_bytes,
        )))

    def batch(
        self, size: int, *, drop_last: bool = False, name: str | None = None
    ) -> Pipeline[list[T_co]]:
        """Group items into lists of ``size``; the last one shorter unless ``drop_last``."""
        return cast("Pipeline[list[T_co]]", self.with_stage(
            BatchSpec(size=size, drop_last=drop_last, name=name)
        ))

    def assemble(
        self,
        assembler: Assembler[U],
        *,
        batch_size: int,
        drop_last: bool = False,
        name: str | None = None,
        max_failures: int | float | None = None,
        buffer: int | None = None,
        buffer_bytes: int | None = None,
    ) -> Pipeline[U]:
        """Whole batches, in batch order, from rows that arrive in any order.

        For stages that write each item straight into its row of a batch (decoding
        unordered, so that no worker waits for a slower neighbour): each item that arrives
        is a row, handed to ``assembler`` on the run's loop (``assembler.failure(row)``, then
        ``assembler.arrived(row, ok=...)``), and the batches it completes go on in order.
        A failed row counts against ``max_failures`` (named by its repr) after the batches it
        completed. Rows may also arrive several to an ``ItemGroup``. The assembler is an
        ``asyncflow.pipeline.Assembler`` (a protocol); ``image.folder``'s ``batch`` stage is
        one of these.

        Args:
            assembler: Tracks the rows; returns completed batches (a ``Pipeline[U]`` when it
                returns ``U`` batches).
            batch_size: Rows per batch, as the assembler makes them: ``describe()`` shows it
                (``.cache()`` stores batches of this size).
            drop_last: Whether the assembler drops a last, shorter batch (shown likewise).
            name: The stage's name in stats and errors (default ``"assemble"``).
            max_failures: This stage's failure budget (default: the pipeline's).
            buffer: Capacity of the stage's output queue, in batches (default 2).
            buffer_bytes: A byte budget for that queue, as :meth:`map`'s.

        Raises:
            ConfigError: An argument is invalid, or ``assembler`` lacks the methods.
        """
        return cast("Pipeline[U]", self.with_stage(AssembleSpec(
            assembler=assembler, batch_size=batch_size, drop_last=drop_last, name=name,
            max_failures=max_failures, buffer=buffer, buffer_bytes=buffer_bytes,
        )))

    def unbatch(self: Pipeline[Iterable[U]], *, name: str | None = None) -> Pipeline[U]:
        """Emit the elements of each item (a list, tuple, tensor, or any iterable).

        Typing: a ``Pipeline[Iterable[U]]`` (``list[U]``, ``Sequence[U]``, ...) gives a
        ``Pipeline[U]``, and a ``Pipeline[Any]`` a ``Pipeline[Any]``. Python's typing cannot
        say more than that: a tuple of mixed types gives the join of its element types
        (``tuple[int, str]`` gives ``Pipeline[object]``), a tensor or array whose stubs declare
        no element type gives ``Pipeline[Any]``, and items that type checkers do not see as
        iterable are an error (``cast`` the pipeline to ``Pipeline[Any]`` first).
        """
        return cast("Pipeline[U]", self.with_stage(UnbatchSpec(name=name)))

    def prefetch(self, size: int, *, name: str | None = None) -> Self:
        """Keep up to ``size`` items ready ahead of the consumer."""
        return self.with_stage(PrefetchSpec(size=size, name=name))

    def shuffle(
        self, *, buffer_size: int = 1024, seed: int | None = None, name: str | None = None
    ) -> Self:
        """Shuffle items through a buffer of ``buffer_size``.

        With a ``seed`` the order is reproducible, and differs from epoch to epoch (it
        depends on the seed and the epoch number).
        """
        return self.with_stage(ShuffleSpec(buffer_size=buffer_size, seed=seed, name=name))

    def to_device(
        self, device: Any, *, non_blocking: bool = True, pool_size: int | None = None,
        then: Callable[[Any], Any] | None = None,
    ) -> Self:
        """Copy batches to ``device``: staged in pinned memory, copied on a side CUDA stream,
        waited for by the consumer's stream (see :func:`asyncflow.torch.to_device`);
        ``then(batch)`` runs on each batch once it is on the device, before the hand-off.

        Must be the last stage. ``"cpu"`` returns the pipeline unchanged.

        Raises:
            ConfigError: ``device`` is CUDA and CUDA is not available.
        """
        options: dict[str, Any] = {} if pool_size is None else {"pool_size": pool_size}
        to_device = feature("to_device")
        return cast(Self, to_device(self, device, non_blocking=non_blocking, then=then, **options))

    def cache(self, path: str | os.PathLike[str], **options: Any) -> Pipeline[T_co]:
        """Store the output on the first pass, replay it afterwards (see :mod:`asyncflow.cache`).

        Returns an ``asyncflow.cache.CachedPipeline[T]``; replayed items are rebuilt with the
        structure of the cached ones.
        """
        return cast("Pipeline[T_co]", feature("cache")(self, path, **options))

    def journal(self, path: str | os.PathLike[str], *, rank: int | None = None) -> Self:
        """Record each output's id ``(epoch, step, rank)`` and source items in ``path`` (one
        file per rank), for ``asyncflow.explain`` and ``asyncflow.rebuild`` (docs/journal.md)."""
        return self.with_hook(feature("journal")(self, path, rank=rank))

    def progress(self, **options: Any) -> Self:
        """Show a progress bar (tqdm: a widget in notebooks, a bar in terminals)."""
        return self.with_hook(feature("progress_hook")(**options))


def _workers_options(
    fn: Callable[[Any], Any], workers: str | Processes, concurrency: int, name: str | None
) -> dict[str, Any]:
    if workers != "auto":
        return {"processes": resolve_workers(workers)}
    processes, note = choose_workers(fn, concurrency, stage=name or fn_name(fn))
    return {"processes": processes, "note": note}
