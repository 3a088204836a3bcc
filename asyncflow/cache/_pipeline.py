"""``Pipeline.cache(path)``: a pipeline whose source is a cache of another pipeline's output."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Self, TypeVar

from .._errors import ConfigError
from ..pipeline import Pipeline, RunPlan
from ._fingerprint import canonical, fingerprint, state_of, summarize
from ._info import CacheInfo, info
from ._replay import finish
from ._source import CacheSource

__all__ = ["CachedPipeline", "cache"]

# Replayed batches waiting for a consumer that copies them itself (or views of the mapping).
_DEFERRED_BUFFER = 16

# Stages after a batch stage that keep its items lists of samples.
_KEEPS_LISTS = {"prefetch", "shuffle", "filter"}

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

    def run_plan(self) -> RunPlan:
        plan = super().run_plan()
        source = self._cache_source
        if self.stages or source.layout != "batches" or not source.ready():
            return plan
        # A replay whose batches go straight to the consumer: those that need a copy
        # (shuffled ones) are copied in its thread when it asks for them (why:
        # asyncflow.cache._replay). Until then they hold no memory, so more of them may wait.
        # ready() reads only the manifest (this runs in the consumer's thread); the epoch
        # checks and maps the files on a worker thread, and fills the cache should they fail.
        options = dataclasses.replace(plan.options, source_buffer=_DEFERRED_BUFFER)
        return RunPlan(open_source=source.replaying, options=options,
                       receive_hooks=(finish, *plan.receive_hooks))

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
        for hook in self.hooks:
            new = new.with_hook(hook)
        return new

    def describe(self) -> list[dict[str, Any]]:
        source = self._cache_source
        head = {"kind": "source", "name": "cache", "type": "cache", "path": str(source.path),
                "shuffle": source.shuffle, "seed": source.seed,
                "upstream": self._upstream.describe()}
        return [head, *super().describe()[1:]]


def _layout(pipe: Pipeline[Any], batched: bool | None) -> str:
    if batched is not None:
        if not isinstance(batched, bool):
            raise ConfigError(f"batched must be True, False or None, got {batched!r}")
        return "batches" if batched else "samples"
    stages = pipe.describe()
    for i in range(len(stages) - 1, -1, -1):
        kind = stages[i].get("kind")
        if kind == "batch":
            after = {s.get("kind") for s in stages[i + 1:]}
            return "lists" if after <= _KEEPS_LISTS else "batches"
        if kind in ("unbatch", "flat_map"):
            return "samples"
        if "batch_size" in stages[i]:
            return "batches"
    return "samples"


def _description(pipe: Pipeline[Any]) -> list[dict[str, Any]]:
    """``pipe.describe()``, each entry with the ``state`` of its source or stage function (see
    :func:`state_of`): the listing a source holds, the options a decode function carries."""
    stages = pipe.describe()
    if not stages:
        return stages
    stages[0] = {**stages[0], "state": state_of(pipe.source)}
    for i, spec in enumerate(pipe.stages, start=1):
        fn = getattr(spec, "fn", None) or getattr(spec, "factory", None)
        if fn is not None and i < len(stages):
            stages[i] = {**stages[i], "state": state_of(fn)}
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
            (default) decides from ``pipe.describe()``: a ``batch`` stage or a
            ``batch_size`` setting means batches (lists of samples straight from
            ``.batch()`` are replayed as lists).
        key: Anything JSON-able mixed into the fingerprint: change it to force a rebuild
            (for example a version of your decode code, which the fingerprint cannot see).
        wait: While another process writes the cache, wait for it and replay, instead of
            reading upstream meanwhile (default).
        durable: fsync the cache when it is committed, so it also survives a power loss.

    Raises:
        ConfigError: An option is invalid, or ``path`` is something other than a cache.
    """
    if not isinstance(pipe, Pipeline):
        raise ConfigError(f"cache() needs a Pipeline, got {type(pipe).__name__}")
    try:
        where = Path(os.fspath(path)).expanduser()
    except TypeError:
        raise ConfigError(f"path must be a str or os.PathLike, got {path!r}") from None
    for what, flag in (("wait", wait), ("durable", durable)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{what} must be True or False, got {flag!r}")
    layout = _layout(pipe, batched)
    description = _description(pipe)
    source = CacheSource(
        upstream=lambda: pipe, path=where, layout=layout,
        fingerprint=fingerprint(description, key), summary=summarize(description),
        key=canonical(key), wait=wait, durable=durable,
    )
    return CachedPipeline(source, upstream=pipe)
