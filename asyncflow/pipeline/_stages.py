"""The stage coroutines of a run: flat_map, batch, unbatch, prefetch, shuffle. Each reads
chunks from its input channel and writes to its output (the source is in ``_source_node.py``,
``map`` and ``filter`` in ``_map.py``). Each keeps a ledger of what its outputs came from
(``_ledger.py``), written before the outputs are put out.

Counters count user items, not messages: an :class:`ItemGroup` (several items moving as one)
counts as its length (:func:`count_items`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ..workers import SOURCE_CHUNK, aclose_iterator, epoch_random
from ._channel import Channel, ChannelAborted
from ._expansion import SplitLedger
from ._ledger import FixedLedger, Passthrough, ShuffleLedger
from ._node import NodeContext, Receiver, Sender, node_for
from ._source_node import advance
from ._spec import BatchSpec, FlatMapSpec, PrefetchSpec, ShuffleSpec, UnbatchSpec
from ._stats import ItemGroup, count_items, count_one

__all__ = [
    "BatchNode",
    "FlatMapNode",
    "PrefetchNode",
    "ShuffleNode",
    "UnbatchNode",
]

_DRAIN = 4096


def _expand_start(
    fn: Callable[[Any], Any], item: Any, limit: int, stop: threading.Event
) -> tuple[Any, list[Any], bool, Exception | None]:
    """Call a flat_map function and take the first chunk of its result (on a worker; closed
    there if the run stopped meanwhile, as :func:`advance` does). An async iterable, or a
    coroutine (awaited first), is returned as it is, for the loop."""
    result = fn(item)
    if hasattr(result, "__aiter__") or inspect.isawaitable(result):
        return result, [], False, None
    it = iter(result)
    return (it, *advance(it, limit, stop))


@node_for(FlatMapSpec)
class FlatMapNode:
    """``flat_map``: each item becomes the items of the (async) iterable ``fn`` returns
    (each one's items buffered as deep as the stage's output queue)."""

    def __init__(self, ctx: NodeContext, spec: FlatMapSpec) -> None:
        self.ctx = ctx
        self.spec = spec
        self.is_async = spec.is_async
        self.ledger = SplitLedger()
        # workers that put out directly record and put one at a time: a put that waits
        # for room must not let another's items in between its own
        self._put_lock: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Lock() if spec.concurrency > 1 and not spec.ordered
            else contextlib.nullcontext())
        ctx.counters.label(spec.fn)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        concurrency = self.spec.concurrency
        if concurrency == 1 or not self.spec.ordered:
            async with asyncio.TaskGroup() as tg:
                for _ in range(concurrency):
                    tg.create_task(self._direct_worker(inp, out))
        else:  # each item's expansion into a channel of its own, emitted in input order
            slots: asyncio.Queue[Channel | None] = asyncio.Queue()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._emitter(slots, out))
                async with asyncio.TaskGroup() as workers:
                    for _ in range(concurrency):
                        workers.create_task(self._slot_worker(inp, slots))
                slots.put_nowait(None)  # no more slots

    async def _put(self, ordinal: int | None, values: list[Any], out: Sender) -> None:
        """Put out the next ``values`` of input ``ordinal``, recorded in the ledger first
        (``None``: into an ordered slot, whose emitter records them)."""
        if ordinal is None:
            await out.put_many(values)
        else:
            async with self._put_lock:
                values = self.ledger.keep(ordinal, values)
                if values:
                    await out.put_many(values)
        self.ctx.produced(count_items(values))

    async def _expand(self, item: Any, out: Sender, ordinal: int | None) -> None:
        """Put out the items ``fn(item)`` makes; a failure of the item's is counted against
        the budget (:meth:`NodeContext.item_failed` raises once it is exceeded)."""
        ctx = self.ctx
        start = time.perf_counter()
        ctx.counters.chunks += 1
        ctx.counters.in_flight += 1
        it: Any = None
        running = False  # on a worker, which closes it if the run stops meanwhile
        try:
            if self.is_async:
                it, chunk, done, error = self.spec.fn(item), list[Any](), False, None
            else:
                running = True
                it, chunk, done, error = await ctx.run_sync(
                    _expand_start, self.spec.fn, item, SOURCE_CHUNK, ctx.stop
                )
                running = False
            if inspect.isawaitable(it):  # an async def's, or a plain function's coroutine
                it = await it
            it = aiter(it) if hasattr(it, "__aiter__") else iter(it)
            if hasattr(it, "__anext__"):
                try:
                    async for value in it:
                        await self._put(ordinal, [value], out)
                finally:
                    await aclose_iterator(it)
                return
            while True:
                if chunk:
                    await self._put(ordinal, chunk, out)
                if error is not None:
                    raise error
                if done:
                    return
                running = True
                chunk, done, error = await ctx.run_sync(advance, it, SOURCE_CHUNK, ctx.stop)
                running = False
        except ChannelAborted:
            raise  # the run is stopping: not the item's failure
        except Exception as exc:
            ctx.item_failed(item, exc)
        finally:
            # a generator left in part (the run stopped, or it failed) is closed now, not by
            # the garbage collector: it may hold a file or a connection open
            if not running and not hasattr(it, "__anext__") and hasattr(it, "close"):
                it.close()
            ctx.counters.in_flight -= 1
            ctx.counters.busy += time.perf_counter() - start

    async def _direct_worker(self, inp: Receiver, out: Sender) -> None:
        # A single worker takes what is queued in one go; several take one item each, so
        # that the expansions spread over them.
        limit = SOURCE_CHUNK if self.spec.concurrency == 1 else 1
        while items := await inp.get_many(limit):
            for item in items:
                self.ctx.counters.items_in += count_one(item)
                ordinal = self.ledger.begin()
                try:
                    await self._expand(item, out, ordinal)
                finally:
                    self.ledger.end(ordinal)
            del items, item  # handed on: not kept alive while the worker waits for more

    async def _slot_worker(self, inp: Receiver, slots: asyncio.Queue[Channel | None]) -> None:
        while items := await inp.get_many(1):
            self.ctx.counters.items_in += count_items(items)
            self.ledger.begin()  # its ordinal is its slot's place in the queue
            slot = Channel(self.ctx.counters.capacity)
            slots.put_nowait(slot)  # with no await since the get: slots follow the items
            try:
                await self._expand(items[0], slot, None)
            except Exception as exc:
                slot.close(exc)  # raised by the emitter once earlier items are out
                return
            finally:
                slot.close()  # (a slot closed with an error keeps it)

    async def _emitter(self, slots: asyncio.Queue[Channel | None], out: Sender) -> None:
        ticket = 0
        while (slot := await slots.get()) is not None:
            while values := await slot.get_many(_DRAIN):
                values = self.ledger.keep(ticket, values)
                if values:
                    await out.put_many(values)
            self.ledger.end(ticket)
            error = slot.take_pending()  # what its expansion raised, if it failed
            if error is not None:
                raise error
            ticket += 1


@node_for(BatchSpec)
class BatchNode:
    """Groups items into lists of ``size``; the last, shorter one unless ``drop_last``."""

    def __init__(self, ctx: NodeContext, spec: BatchSpec) -> None:
        self.ctx = ctx
        self.spec = spec
        self.ledger = FixedLedger(spec.size)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        size, pending = self.spec.size, []
        counters = self.ctx.counters
        ledger = self.ledger
        while items := await inp.get_many(_DRAIN):
            counters.items_in += count_items(items)
            ledger.take(len(items))
            pending.extend(items)
            if len(pending) >= size:
                full = len(pending) - len(pending) % size
                batches = [pending[i : i + size] for i in range(0, full, size)]
                pending = pending[full:]
                await out.put_many(batches)
                self.ctx.produced(len(batches))
                del batches  # handed on: not kept alive while the next chunk is awaited
            del items
        if pending and not self.spec.drop_last:
            await out.put(pending)
            self.ctx.produced(1)
        else:
            ledger.drop_rest(len(pending))


@node_for(UnbatchSpec)
class UnbatchNode:
    """Emits the elements of each item (a list, tuple, tensor or any iterable).

    Splitting an :class:`ItemGroup` hands on the items it already counted as, so an unbatch
    stage that receives only groups does nothing the user sees: it is internal."""

    def __init__(self, ctx: NodeContext, spec: UnbatchSpec) -> None:
        self.ctx = ctx
        self.ledger = SplitLedger(elementwise=True)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        counters = self.ctx.counters
        ledger = self.ledger
        only_groups = True
        while batches := await inp.get_many(64):
            counters.items_in += count_items(batches)
            only_groups = only_groups and all(b.__class__ is ItemGroup for b in batches)
            counters.internal = only_groups
            for batch in batches:
                ordinal = ledger.begin()
                try:
                    items = ledger.keep(ordinal, list(batch))
                except Exception as exc:  # not iterable, or its iteration failed
                    self.ctx.item_failed(batch, exc)
                    continue
                finally:
                    ledger.end(ordinal)
                if items:
                    await out.put_many(items)
                self.ctx.produced(count_items(items))
                del items  # handed on: not kept alive while the next ones are awaited
            del batch, batches


@node_for(PrefetchSpec)
class PrefetchNode:
    """Moves items on as they come; its output buffer keeps filling while the consumer works."""

    def __init__(self, ctx: NodeContext, spec: PrefetchSpec) -> None:
        self.ctx = ctx
        self.ledger = Passthrough()

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(_DRAIN):
            count = count_items(items)
            self.ctx.counters.items_in += count
            await out.put_many(items)
            self.ctx.produced(count)
            del items  # handed on: not kept alive while the next chunk is awaited


@node_for(ShuffleSpec)
class ShuffleNode:
    """Shuffles through a bounded buffer; the order depends only on (seed, epoch)."""

    def __init__(self, ctx: NodeContext, spec: ShuffleSpec) -> None:
        self.ctx = ctx
        self.size = spec.buffer_size
        self.rng = random.Random() if spec.seed is None else epoch_random(spec.seed, ctx.epoch)
        self.ledger = ShuffleLedger()

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        size, rng, ledger = self.size, self.rng, self.ledger
        pool: list[Any] = []
        ordinals: list[int] = []  # each pooled item's input ordinal, for the ledger
        taken = 0
        while items := await inp.get_many(SOURCE_CHUNK):
            self.ctx.counters.items_in += count_items(items)
            ready, ready_ordinals = [], []
            for ordinal, item in enumerate(items, taken):
                if len(pool) < size:
                    pool.append(item)
                    ordinals.append(ordinal)
                else:
                    index = rng.randrange(size)
                    ready.append(pool[index])
                    ready_ordinals.append(ordinals[index])
                    pool[index], ordinals[index] = item, ordinal
            taken += len(items)
            if ready:
                ledger.record(ready_ordinals)
                await out.put_many(ready)
                self.ctx.produced(count_items(ready))
            del items, item, ready  # handed on: not kept alive while the next are awaited
        order = list(range(len(pool)))
        rng.shuffle(order)  # the same permutation as shuffling the pool itself
        ledger.record([ordinals[i] for i in order])
        pool = [pool[i] for i in order]
        await out.put_many(pool)
        self.ctx.produced(count_items(pool))
