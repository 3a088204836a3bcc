"""``SourceNode``: feeds a run from the user's source, an item's source *position* (its place in
the epoch) counted as it goes, leaving out the positions a resumed run has settled already
(:class:`~asyncflow.pipeline._lineage.SourcePlan`): a sequence by slicing, an iterator by
reading past them. An iterator that names its items' seed keys (``seeding.KeyedIterator``: a
``Split`` share's) hands them to the run's stages in place of the positions. A run plan's
``gate`` holds the source unopened until it allows."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, MappingView, Sequence, Set
from typing import Any

from .._errors import ConfigError
from ..workers import SOURCE_CHUNK, aclose_iterator, next_chunk
from ._node import NodeContext, Receiver, Sender
from ._protocols import KeyedIterator, SourceGate
from ._stats import count_items, count_one

__all__ = ["SourceNode"]


def advance(it: Any, limit: int, stop: Any) -> tuple[list[Any], bool, Exception | None]:
    """:func:`next_chunk` on a worker; if the run stopped meanwhile, close the iterator here,
    since the loop cannot close a generator while this thread is running it."""
    items, done, error = next_chunk(it, limit)
    if stop.is_set() and not done:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return items, done, error


def _consume(it: Any, count: int) -> None:
    """Skip ``count`` items of ``it`` (on a worker: a resumed run's settled prefix)."""
    next(itertools.islice(it, count, count), None)


class SourceNode:
    """Feeds the run from an iterable, an async iterable, or a zero-argument callable, opened
    once ``gate`` (if any) allows."""

    def __init__(self, ctx: NodeContext, open_source: Callable[[], Any],
                 gate: SourceGate | None = None) -> None:
        self.ctx = ctx
        self._open = open_source
        self._gate = gate
        self.ledger = ctx.lineage.source  # its ordinals' positions (a resumed run skips some)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        if self._gate is not None and not await self._gate():
            return  # a feature decided that this run reads no source
        source = self._open()
        if hasattr(source, "__aiter__"):
            await self._run_async(source, out)
        elif isinstance(source, Sequence):
            await self._run_sequence(source, out)
        elif isinstance(source, Set | Mapping | MappingView):
            await self._run_sequence(list(source), out)  # type: ignore[arg-type]
        elif hasattr(source, "__iter__"):
            it = iter(source)
            self._keyed(it)
            await self._run_iterator(it, out)
        else:
            raise ConfigError(
                f"the source must be an iterable, an async iterable or a zero-argument "
                f"callable returning one; got {type(source).__name__}"
            )

    def _keyed(self, it: Any) -> None:
        if isinstance(it, KeyedIterator):
            self.ctx.item_keys.key = it.seed_key

    async def _run_async(self, source: Any, out: Sender) -> None:
        it = source.__aiter__()
        self._keyed(it)
        ledger, window = self.ctx.lineage.source, self.ctx.window
        position, skip = ledger.plan.first, ledger.plan.skip  # resumed: settled ones left out
        credit = 0  # the window's, taken before the item is read
        try:
            while window is None or credit or (credit := await window.take(1)):
                try:
                    item = await anext(it)
                except StopAsyncIteration:
                    return
                position += 1
                if position <= skip.mark or (skip.ranges and position - 1 in skip):
                    continue
                ledger.emitted += 1
                credit = 0
                await out.put(item)
                self.ctx.produced(count_one(item))
        finally:
            if window is not None:
                window.give(credit)
            await aclose_iterator(it)

    async def _run_sequence(self, seq: Sequence[Any], out: Sender) -> None:
        ledger = self.ctx.lineage.source
        first, plan = ledger.plan.first, ledger.plan  # resumed: settled positions left out
        window = self.ctx.window
        for low, high in plan.skip.gaps(plan.base, first + len(seq)):
            start, end = low - first, high - first
            while start < end:
                count = min(SOURCE_CHUNK, end - start)
                if window is not None and not (count := await window.take(count)):
                    return  # the run failed or is stopping
                chunk = list(seq[start : start + count])
                start += count
                ledger.emitted += len(chunk)
                await out.put_many(chunk)
                self.ctx.produced(count_items(chunk))

    async def _run_iterator(self, it: Any, out: Sender) -> None:
        # The iterator may do slow work (listing files, reading a manifest): advance it on a
        # worker thread, a chunk per hand-off.
        ctx, window = self.ctx, self.ctx.window
        running = False
        ledger = ctx.lineage.source
        plan, position = ledger.plan, ledger.plan.first  # resumed: settled ones left out
        try:
            if plan.base > position:
                running = True
                await ctx.run_sync(_consume, it, plan.base - position)
                running = False
                position = plan.base
            while True:
                limit = SOURCE_CHUNK  # a window's credits, taken before the items are read
                if window is not None and not (limit := await window.take(limit)):
                    return  # the run failed or is stopping
                running = True
                ctx.counters.in_flight = 1
                items, done, error = await ctx.run_sync(advance, it, limit, ctx.stop)
                ctx.counters.in_flight = 0
                running = False
                if plan.skip.ranges:
                    start, position = position, position + len(items)
                    items = [x for i, x in enumerate(items, start) if i not in plan.skip]
                if window is not None:
                    window.give(limit - len(items))  # the iterator ended, or skipped some
                ledger.emitted += len(items)
                if items:
                    await out.put_many(items)
                    ctx.produced(count_items(items))
                if error is not None:
                    raise error
                if done:
                    return
        finally:
            close = getattr(it, "close", None)
            if close is not None and not running:
                close()
