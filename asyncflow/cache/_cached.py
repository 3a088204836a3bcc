"""``Pipeline.cache(path)``: a pipeline whose source is a cache of another pipeline's output."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from .._errors import ConfigError, check_bool
from ..pipeline import Pipeline, RunPlan, StageSpec
from ._epoch import CacheSource
from ._fill import Gate, cache_stage, one_shot_guard
from ._fingerprint import canonical, describe_value, summarize, upstream_fingerprint
from ._info import CacheInfo, info
from ._replay import finish

__all__ = ["CachedPipeline", "cache"]

# Replayed batches waiting for a consumer that copies them itself (or views of the mapping).
_DEFERRED_BUFFER = 16

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class CachedPipeline(Pipeline[T_co]):
    """A pipeline replaying a cache of ``upstream``'s output, filling it on the first pass.

    A ``CachedPipeline[T]`` caches a ``Pipeline[T]``: replayed items are rebuilt with the
    structure of the cached ones.

    Built by ``upstream.cache(path, ...)``. Each iteration is an epoch that replays a valid
    cache, or fills it while passing upstream's items through (see :func:`cache`).
    """

    def __init__(self, source: CacheSource, *, upstream: Pipeline[T_co]) -> None:
        # Replayed batches copied for stages after this one are large: a short queue keeps
        # their buffers few and reused.
        super().__init__(source, name=upstream.options.name,
                         stop_timeout=upstream.options.stop_timeout,
                         buffer=4 if source.layout == "batches" else None)
        self._cache_source = source
        self._upstream = upstream
        self._check_reuse = one_shot_guard(upstream.source)

    def run_plan(self) -> RunPlan:
        """This epoch's run: the cache's replay as its source when the manifest says the cache
        can be replayed; else upstream's source and stages, then the ``cache`` stage that
        fills it (or replays it after all: see _fill.py), then the stages after ``.cache()``.

        Runs in the consumer's thread: it reads only the manifest and ``stat``s the files;
        the epoch checks and maps them on the run's threads.
        """
        plan = super().run_plan()
        source = self._cache_source
        options = plan.options
        hooks = plan.receive_hooks
        # A replay whose batches go straight to the consumer: those that need a copy
        # (shuffled ones) are copied in its thread when it asks for them (why:
        # asyncflow.cache._replay). Until then they hold no memory, so more of them may wait.
        defer = not self.stages and source.layout == "batches"
        if defer:
            hooks = (finish, *hooks)
        if source.ready():
            if defer:
                options = dataclasses.replace(options, source_buffer=_DEFERRED_BUFFER)
            return RunPlan(open_source=functools.partial(source.run_epoch, None, defer=defer),
                           options=options, receive_hooks=hooks)
        up = self._upstream.run_plan()
        gate = Gate(self._check_reuse)
        stages = list(_upstream_stages(self._upstream, up))
        buffer = _DEFERRED_BUFFER if defer else options.source_buffer
        stages.append(cache_stage(source, gate, defer=defer, buffer=buffer,
                                  hooks=up.receive_hooks))
        options = dataclasses.replace(
            options, source_buffer=up.options.source_buffer,
            settings=(*up.options.settings, *options.settings),
            notes=(*up.options.notes, *options.notes),
        )
        return RunPlan(open_source=up.open_source, options=options, receive_hooks=hooks,
                       stages=(*stages, *self.stages), gate=gate.opened)

    @property
    def path(self) -> Path:
        """The cache directory."""
        return self._cache_source.path

    @property
    def upstream(self) -> Pipeline[T_co]:
        """The pipeline whose output is cached."""
        return self._upstream

    def info(self) -> CacheInfo:
        """What the cache holds now (see :func:`asyncflow.cache.info`)."""
        return info(self.path)

    def shuffle(
        self, *, buffer_size: int | None = None, seed: int | None = None, name: str | None = None
    ) -> Self:
        """Replay the cache in a random order, by sample index, then batch again.

        With a ``seed`` the order is reproducible and depends on the seed and the epoch
        (``pipe.shuffle(seed=epoch)`` each epoch, or one shuffled pipeline iterated many
        times). The filling epoch passes upstream's items in upstream's order. With stages
        after ``.cache()``, or a ``buffer_size``, this is ``Pipeline.shuffle``: a buffer
        shuffle of those stages' output.

        With nothing after it, each batch is gathered from the cache when the consumer asks
        for it, in the consumer's thread (on its loop, in ``async for``); add a stage, such
        as ``.prefetch(n)``, to have batches gathered ahead on the run's thread instead.
        """
        if self.stages or buffer_size is not None:
            return super().shuffle(buffer_size=1024 if buffer_size is None else buffer_size,
                                   seed=seed, name=name)
        new = type(self)(self._cache_source.shuffled(seed), upstream=self._upstream)
        # this pipeline's options (with_options()), hooks and one-shot upstream check
        return new._copy(_options=self._options, _hooks=self.hooks,
                         _check_reuse=self._check_reuse)

    def describe(self) -> list[dict[str, Any]]:
        source = self._cache_source
        head = {"kind": "source", "name": "cache", "type": "cache", "path": str(source.path),
                "shuffle": source.shuffle, "seed": source.seed,
                "upstream": self._upstream.describe()}
        return [head, *super().describe()[1:]]


def _layout(pipe: Pipeline[Any], batched: bool | None) -> str:
    """What ``pipe`` yields, as its stages' traits declare it (``batched`` overrides).

    The last stage that groups or splits items decides (``StageTraits.grouping``): one that
    makes batches (``assemble``) yields ``"batches"``; one that makes lists (``batch``)
    yields ``"lists"`` of samples, or ``"batches"`` once a stage that changes items (a
    collating map) follows it; one that splits items (``unbatch``, ``flat_map``) yields
    ``"samples"``, as does a pipeline with none of these.
    """
    if check_bool("batched", batched, allow_none=True) is not None:
        return "batches" if batched else "samples"
    stages = pipe.stages
    for i in range(len(stages) - 1, -1, -1):
        grouping = stages[i].traits.grouping
        if grouping == "lists":
            keeps = all(s.traits.keeps_items for s in stages[i + 1:])
            return "lists" if keeps else "batches"
        if grouping is not None:
            return "batches" if grouping == "batches" else "samples"
    return "samples"


def _upstream_stages(upstream: Pipeline[Any], plan: RunPlan) -> Iterator[StageSpec]:
    """Upstream's stages for a run of the cached pipeline, each with upstream's failure
    budget where it has none of its own (the run's options are the cached pipeline's)."""
    limit = plan.options.max_failures
    for spec in upstream.stages if plan.stages is None else plan.stages:
        if getattr(spec, "max_failures", limit) is None:
            spec = dataclasses.replace(spec, max_failures=limit)  # type: ignore[call-arg]
        yield spec


def _description(pipe: Pipeline[Any]) -> list[dict[str, Any]]:
    """``pipe.describe()``, each entry with ``what`` its source or stage function is (see
    :func:`describe_value`): the listing a source holds, the options a decode function carries."""
    stages = pipe.describe()
    if not stages:
        return stages
    stages[0] = {**stages[0], "what": describe_value(pipe.source)}
    for i, spec in enumerate(pipe.stages, start=1):
        fn = getattr(spec, "fn", None) or getattr(spec, "factory", None)
        if fn is not None and i < len(stages):
            stages[i] = {**stages[i], "what": describe_value(fn)}
    return stages


def cache(
    pipe: Pipeline[T],
    path: str | os.PathLike[str],
    *,
    batched: bool | None = None,
    key: Any = None,
    wait: bool = False,
    durable: bool = False,
) -> CachedPipeline[T]:
    """Store ``pipe``'s output at ``path`` on the first full pass; replay it afterwards.

    Every item must hold tensors, numpy arrays or numbers (in tuples, lists or dicts) of one
    fixed shape and dtype per field. An epoch stopped early writes nothing; the next one
    tries again. Random augmentations upstream are frozen into the cache: cache before them.

    Args:
        pipe: The upstream pipeline.
        path: The cache directory (created; its parent holds ``<name>.lock`` and, while
            writing, ``<name>.tmp-*``).
        batched: Whether items are collated batches (fields with a leading batch dimension),
            stored per sample and batched again to the same size on replay. ``None``
            (default) decides from the stages' traits: a ``batch`` or ``assemble`` stage (or
            a custom one whose ``StageTraits.grouping`` says it groups items) means batches
            (lists of samples straight from ``.batch()`` are replayed as lists).
        key: Anything JSON-able mixed into the fingerprint: change it to force a rebuild
            (for example a version of your decode code, which the fingerprint cannot see).
        wait: While another process writes the cache, wait for it and replay, instead of
            reading upstream meanwhile (default).
        durable: fsync the cache when it is committed, so it also survives a power loss.

    Raises:
        ConfigError: An option is invalid, or ``path`` is something other than a cache.
    """
    try:
        # absolute: "." names its folder, whose writer's lock file sits beside it
        where = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    except TypeError:
        raise ConfigError(f"path must be a str or os.PathLike, got {path!r}") from None
    check_bool("wait", wait)
    check_bool("durable", durable)
    layout = _layout(pipe, batched)
    description = _description(pipe)
    source = CacheSource(
        path=where, layout=layout,
        fingerprint=upstream_fingerprint(description, key), summary=summarize(description),
        key=canonical(key), wait=wait, durable=durable,
    )
    return CachedPipeline(source, upstream=pipe)
