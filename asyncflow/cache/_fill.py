"""A filling epoch as stages of the cached pipeline's own run, not a nested run.

When the cache cannot be replayed as it stands, :class:`~asyncflow.cache.CachedPipeline`'s run
is built from upstream's source, upstream's stages, then the ``cache`` stage
(:class:`CacheNode`), then the stages after ``.cache()``::

    source (upstream's, behind a Gate) -> upstream's stages -> cache -> stages after it

The ``cache`` stage decides the epoch on the run's loop, with its file work on the run's
threads (:class:`~asyncflow.cache._epoch.CacheSource` does: take the writer lock, or wait for
another writer, or find a cache another writer just finished). Until it has decided,
upstream's source waits at its :class:`Gate` and reads nothing. Filling (or reading upstream
while another process writes), it opens the gate and passes upstream's items through, writing
each; it commits when upstream's stream ends complete. Replaying after all, it keeps the gate
shut (upstream's source ends at once, its stages see an empty stream) and puts out the cache's
items itself.

The gate is the run plan's ``gate`` (:meth:`Gate.opened`): the engine's source node awaits it
before it opens upstream's source, then reads it as any source (an async iterable on the loop,
any other iterator on the run's threads); a merge upstream (``mix(...).cache()``) awaits it
before it starts its branches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ..pipeline import (
    CustomSpec,
    NodeContext,
    ReceiveHook,
    Receiver,
    Sender,
    apply_hooks,
)

if TYPE_CHECKING:
    from ._epoch import CacheSource

__all__ = ["CacheNode", "Gate", "cache_stage", "one_shot_guard"]

_CHUNK = 256  # items taken from the channel of upstream's last stage at a time


class Gate:
    """What holds upstream's source for one run until the ``cache`` stage decides to read it.

    Args:
        check_reuse: Called before upstream's source is opened; raises when it cannot be
            read again (:func:`one_shot_guard`).
    """

    def __init__(self, check_reuse: Callable[[], None]) -> None:
        self._check_reuse = check_reuse
        self._read = False
        self._decided = asyncio.Event()  # bound to the run's loop when first awaited

    def release(self, read: bool) -> None:
        """Let upstream's source read (``True``) or end at once (``False``); the first call
        decides (on the run's loop)."""
        if not self._decided.is_set():
            self._read = read
            self._decided.set()

    async def opened(self) -> bool:
        """Wait for the decision; True when upstream may be read (checked for reuse first).

        The run plan's ``gate``: awaited by the run's source node, or by the merge node of
        a :class:`~asyncflow.pipeline.Merge` upstream (``mix(...).cache()``).

        Cancellation:
            Safe: stops waiting; the decision stands for the run.
        """
        await self._decided.wait()
        if not self._read:
            return False
        self._check_reuse()
        return True


class CacheNode:
    """The ``cache`` stage: replays, fills (writing what passes), or passes upstream through.

    Args:
        ctx: The stage's context.
        source: The cache.
        gate: The gate of this run's upstream source.
        defer: Replayed batches that need a copy come as deferred copies, made in the
            consumer's thread (the stage is the run's last).
        hooks: Upstream's receive hooks (what its consumer would have applied), applied to
            upstream's items before they are written.
    """

    def __init__(self, ctx: NodeContext, *, source: CacheSource, gate: Gate,
                 defer: bool, hooks: Sequence[ReceiveHook]) -> None:
        self.ctx = ctx
        self._source = source
        self._gate = gate
        self._defer = defer
        self._hooks = tuple(hooks)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        ctx = self.ctx
        upstream = functools.partial(self._receive, inp)
        try:
            epoch = self._source.run_epoch(upstream, defer=self._defer)
            async with contextlib.aclosing(epoch) as items:
                async for item in items:
                    await out.put(item)
                    ctx.produced()
        finally:
            self._gate.release(False)  # never read: upstream's source ends at once

    async def _receive(self, inp: Receiver) -> AsyncGenerator[Any, None]:
        """Upstream's items, once the gate lets its source read (the epoch reads upstream)."""
        self._gate.release(True)
        counters = self.ctx.counters
        while items := await inp.get_many(_CHUNK):
            counters.items_in += len(items)
            if self._hooks:
                items = await self.ctx.run_timed(apply_hooks, self._hooks, items)
            for item in items:
                yield item


def cache_stage(source: CacheSource, gate: Gate, *, defer: bool, buffer: int | None,
                hooks: Sequence[ReceiveHook]) -> CustomSpec:
    """The ``cache`` stage of one filling run (see :class:`CacheNode`)."""
    return CustomSpec(
        label="cache",
        factory=functools.partial(CacheNode, source=source, gate=gate, defer=defer,
                                  hooks=hooks),
        options={"path": str(source.path)},
        buffer=buffer,
    )


def one_shot_guard(source: Any) -> Callable[[], None]:
    """The check a filling epoch makes before it reads upstream's ``source``: for an
    iterator (read once), it raises ``ConfigError`` when a second one would read it again.
    A class (an iterator class too) is a factory: each epoch calls it for a fresh one."""
    one_shot = not isinstance(source, type) and (
        (hasattr(source, "__next__") and iter(source) is source) or hasattr(source, "__anext__"))
    opened = itertools.count()

    def check() -> None:
        if next(opened) and one_shot:
            raise ConfigError(
                f"the upstream source {type(source).__name__} is an iterator, so it can be "
                "read once, and an earlier epoch has read it without finishing the cache; "
                "pass a list, or a zero-argument callable that returns a fresh iterable"
            )

    return check
