"""The stage coroutines of a run: source, map / filter, flat_map, batch, unbatch, prefetch,
shuffle. Each reads chunks from its input channel and writes to its output (``map`` and
``filter`` are in ``_map.py``).

Counters count user items, not messages: an :class:`ItemGroup` (several items moving as one)
counts as its length (:func:`count_items`)."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Callable, Mapping, MappingView, Sequence, Set
from typing import Any

from .._errors import ConfigError
from ._channel import Channel
from ._node import NodeContext, Receiver, Sender
from ._offload import next_chunk
from ._spec import BatchSpec, MapSpec, PrefetchSpec, ShuffleSpec
from ._stats import ItemGroup, count_items, count_one

__all__ = [
    "BatchNode",
    "FlatMapNode",
    "PrefetchNode",
    "ShuffleNode",
    "SourceNode",
    "UnbatchNode",
]

_SOURCE_CHUNK = 256
_TARGET_CHUNK_SECONDS = 0.002
_MAX_CHUNK = 512
_DRAIN = 4096
_PER_PROCESS = 4  # chunks in flight per worker process


def _progress(ctx: NodeContext, produced: int) -> None:
    """Count ``produced`` items out (user items: see :func:`count_items`)."""
    ctx.counters.items_out += produced
    ctx.counters.last_progress = time.monotonic()


async def _aclose(obj: Any) -> None:
    aclose = getattr(obj, "aclose", None)
    if aclose is not None:
        await aclose()


def _advance(it: Any, limit: int, stop: Any) -> tuple[list[Any], bool, Exception | None]:
    """:func:`next_chunk` on a worker; if the run stopped meanwhile, close the iterator here,
    since the loop cannot close a generator while this thread is running it."""
    items, done, error = next_chunk(it, limit)
    if stop.is_set() and not done:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return items, done, error


class SourceNode:
    """Feeds the run from an iterable, an async iterable, or a zero-argument callable."""

    def __init__(self, ctx: NodeContext, open_source: Callable[[], Any]) -> None:
        self.ctx = ctx
        self._open = open_source

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        source = self._open()
        if hasattr(source, "__aiter__"):
            await self._run_async(source, out)
        elif isinstance(source, Sequence):
            await self._run_sequence(source, out)
        elif isinstance(source, Set | Mapping | MappingView):
            await self._run_sequence(list(source), out)  # type: ignore[arg-type]
        elif hasattr(source, "__iter__"):
            await self._run_iterator(iter(source), out)
        else:
            raise ConfigError(
                f"the source must be an iterable, an async iterable or a zero-argument "
                f"callable returning one; got {type(source).__name__}"
            )

    async def _run_async(self, source: Any, out: Sender) -> None:
        it = source.__aiter__()
        try:
            async for item in it:
                await out.put(item)
                _progress(self.ctx, count_one(item))
        finally:
            await _aclose(it)

    async def _run_sequence(self, seq: Sequence[Any], out: Sender) -> None:
        for start in range(0, len(seq), _SOURCE_CHUNK):
            chunk = list(seq[start : start + _SOURCE_CHUNK])
            await out.put_many(chunk)
            _progress(self.ctx, count_items(chunk))

    async def _run_iterator(self, it: Any, out: Sender) -> None:
        # The iterator may do slow work (listing files, reading a manifest): advance it on a
        # worker thread, a chunk per hand-off.
        ctx = self.ctx
        running = False
        try:
            while True:
                running = True
                ctx.counters.in_flight = 1
                items, done, error = await ctx.run_sync(_advance, it, _SOURCE_CHUNK, ctx.stop)
                ctx.counters.in_flight = 0
                running = False
                if items:
                    await out.put_many(items)
                    _progress(ctx, count_items(items))
                if error is not None:
                    raise error
                if done:
                    return
        finally:
            close = getattr(it, "close", None)
            if close is not None and not running:
                close()


def _expand_start(
    fn: Callable[[Any], Any], item: Any, limit: int
) -> tuple[Any, list[Any], bool, Exception | None]:
    """Call a flat_map function and take the first chunk of its result (on a worker)."""
    result = fn(item)
    if hasattr(result, "__aiter__"):
        return result, [], False, None
    it = iter(result)
    return (it, *next_chunk(it, limit))


class _Slot:
    __slots__ = ("channel", "error")

    def __init__(self, capacity: int) -> None:
        self.channel = Channel(capacity)
        self.error: BaseException | None = None


class FlatMapNode:
    """``flat_map``: each item becomes the items of the (async) iterable ``fn`` returns."""

    def __init__(self, ctx: NodeContext, spec: MapSpec, capacity: int) -> None:
        self.ctx = ctx
        self.fn = spec.fn
        self.ordered = spec.ordered
        self.concurrency = spec.concurrency
        self.is_async = spec.is_async
        self.capacity = capacity
        self._ticket = 0
        self._slots: dict[int, _Slot] = {}
        self._slot_added: asyncio.Event | None = None
        self._workers_left = 0
        ctx.counters.label(spec.fn)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        if self.concurrency == 1 or not self.ordered:
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.concurrency):
                    tg.create_task(self._direct_worker(inp, out))
        else:
            self._slot_added = asyncio.Event()
            self._workers_left = self.concurrency
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.concurrency):
                    tg.create_task(self._slot_worker(inp))
                tg.create_task(self._emitter(out))
        counters = self.ctx.counters
        self.ctx.budget.check_end(counters.failures, counters.items_in)

    async def _expand(self, item: Any, out: Sender) -> None:
        ctx = self.ctx
        start = time.perf_counter()
        ctx.counters.chunks += 1
        ctx.counters.in_flight += 1
        try:
            if self.is_async:
                result = self.fn(item)
                if inspect.isawaitable(result):
                    result = await result
                if hasattr(result, "__aiter__"):
                    it, chunk, done, error = result, list[Any](), False, None
                else:
                    it, chunk, done, error = iter(result), [], False, None
            else:
                it, chunk, done, error = await ctx.run_sync(
                    _expand_start, self.fn, item, _SOURCE_CHUNK
                )
            if hasattr(it, "__anext__"):
                try:
                    async for value in it:
                        await out.put(value)
                        _progress(ctx, count_one(value))
                finally:
                    await _aclose(it)
                return
            while True:
                if chunk:
                    await out.put_many(chunk)
                    _progress(ctx, count_items(chunk))
                if error is not None:
                    raise error
                if done:
                    return
                chunk, done, error = await ctx.run_sync(next_chunk, it, _SOURCE_CHUNK)
        finally:
            ctx.counters.in_flight -= 1
            ctx.counters.busy += time.perf_counter() - start

    async def _expand_or_fail(self, item: Any, out: Sender) -> None:
        try:
            await self._expand(item, out)
        except Exception as exc:
            self.ctx.item_failed(item, exc)

    async def _direct_worker(self, inp: Receiver, out: Sender) -> None:
        # A single worker takes what is queued in one go; several take one item each, so
        # that the expansions spread over them.
        limit = _SOURCE_CHUNK if self.concurrency == 1 else 1
        while True:
            items = await inp.get_many(limit)
            if not items:
                return
            for item in items:
                self.ctx.counters.items_in += count_one(item)
                await self._expand_or_fail(item, out)

    async def _slot_worker(self, inp: Receiver) -> None:
        assert self._slot_added is not None
        try:
            while True:
                items = await inp.get_many(1)
                if not items:
                    return
                self.ctx.counters.items_in += count_items(items)
                slot = _Slot(self.capacity)
                self._slots[self._ticket] = slot
                self._ticket += 1
                self._slot_added.set()
                try:
                    await self._expand_or_fail(items[0], slot.channel)
                except Exception as exc:
                    slot.error = exc  # raised by the emitter once earlier items are out
                    return
                finally:
                    slot.channel.close()
        finally:
            self._workers_left -= 1
            self._slot_added.set()

    async def _emitter(self, out: Sender) -> None:
        assert self._slot_added is not None
        ticket = 0
        while True:
            slot = self._slots.get(ticket)
            if slot is None:
                if self._workers_left == 0 and ticket not in self._slots:
                    return
                self._slot_added.clear()
                await self._slot_added.wait()
                continue
            while values := await slot.channel.get_many(_DRAIN):
                await out.put_many(values)
            del self._slots[ticket]
            if slot.error is not None:
                raise slot.error
            ticket += 1


class BatchNode:
    """Groups items into lists of ``size``; the last, shorter one unless ``drop_last``."""

    def __init__(self, ctx: NodeContext, spec: BatchSpec) -> None:
        self.ctx = ctx
        self.size = spec.size
        self.drop_last = spec.drop_last

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        size, pending = self.size, []
        counters = self.ctx.counters
        while items := await inp.get_many(_DRAIN):
            counters.items_in += count_items(items)
            pending.extend(items)
            if len(pending) >= size:
                full = len(pending) - len(pending) % size
                batches = [pending[i : i + size] for i in range(0, full, size)]
                pending = pending[full:]
                await out.put_many(batches)
                _progress(self.ctx, len(batches))
        if pending and not self.drop_last:
            await out.put(pending)
            _progress(self.ctx, 1)


class UnbatchNode:
    """Emits the elements of each item (a list, tuple, tensor or any iterable).

    Splitting an :class:`ItemGroup` hands on the items it already counted as, so an unbatch
    stage that receives only groups does nothing the user sees: it is internal."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        counters = self.ctx.counters
        only_groups = True
        while batches := await inp.get_many(64):
            counters.items_in += count_items(batches)
            only_groups = only_groups and all(b.__class__ is ItemGroup for b in batches)
            counters.internal = only_groups
            for batch in batches:
                try:
                    items = list(batch)
                except TypeError as exc:
                    self.ctx.item_failed(batch, exc)
                    continue
                await out.put_many(items)
                _progress(self.ctx, count_items(items))


class PrefetchNode:
    """Moves items on as they come; its output buffer keeps filling while the consumer works."""

    def __init__(self, ctx: NodeContext, spec: PrefetchSpec) -> None:
        self.ctx = ctx

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(_DRAIN):
            count = count_items(items)
            self.ctx.counters.items_in += count
            await out.put_many(items)
            _progress(self.ctx, count)


class ShuffleNode:
    """Shuffles through a bounded buffer; the order depends only on (seed, epoch)."""

    def __init__(self, ctx: NodeContext, spec: ShuffleSpec) -> None:
        self.ctx = ctx
        self.size = spec.buffer_size
        seed = spec.seed
        self.rng = random.Random(f"{seed}:{ctx.epoch}") if seed is not None else random.Random()

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        size, rng = self.size, self.rng
        pool: list[Any] = []
        while items := await inp.get_many(_SOURCE_CHUNK):
            self.ctx.counters.items_in += count_items(items)
            ready = []
            for item in items:
                if len(pool) < size:
                    pool.append(item)
                else:
                    index = rng.randrange(size)
                    ready.append(pool[index])
                    pool[index] = item
            if ready:
                await out.put_many(ready)
                _progress(self.ctx, count_items(ready))
        rng.shuffle(pool)
        await out.put_many(pool)
        _progress(self.ctx, count_items(pool))
