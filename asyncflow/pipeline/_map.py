"""``map`` and ``filter``: sync functions on worker threads or processes in adaptive chunks,
async functions on the loop, ``concurrency`` at a time, in input order when ``ordered``.

Per-item overhead is paid per chunk wherever the semantics allow it:

* An async function at ``concurrency=1`` is awaited directly, a chunk of items after another,
  with no task or future per item. Each call is stepped once by hand (``_stepped.py``): a call
  that completes at once costs no wake-up; before waiting on one that suspends, the results
  done so far are handed on if the output has room, so a slow call never holds finished
  items back. The chunk adapts to the time per item as a sync stage's does.
* A cheap sync function runs *inline* on the run's loop instead of paying a thread round trip
  per chunk (the rule, and how a chunk's size adapts, are in ``_chunking.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from types import CoroutineType
from typing import Any

from .._errors import ConfigError
from ..workers import FAILED, run_chunk, run_chunk_remote
from ._chunking import TARGET_CHUNK_SECONDS, Chunking
from ._hand import Hand
from ._ledger import MapLedger
from ._node import NodeContext, Receiver, Sender, node_for
from ._protocols import runs_inline
from ._reorder import Reorder
from ._spec import MapSpec
from ._stats import count_items
from ._stepped import Resume

__all__ = ["MapNode"]


@node_for(MapSpec)
class MapNode:
    """``map`` and ``filter``: sync functions on worker threads in adaptive chunks, async
    functions on the loop, ``concurrency`` at a time, in input order when ``ordered``."""

    def __init__(self, ctx: NodeContext, spec: MapSpec) -> None:
        self.ctx = ctx
        self.fn = spec.fn
        self.filter = spec.mode == "filter"
        worker = spec.traits.worker
        self.is_async = worker == "loop"
        self.processes = ctx.processes  # a ``ProcessPool`` when ``worker == "processes"``
        self.remote = isinstance(spec.executor, ProcessPoolExecutor)
        # With worker processes, several chunks per worker: one running, the next ones in its
        # pipe, so that a worker has work in hand while the parent's loop waits for the GIL
        # (a training step's Python holds it for milliseconds at a time).
        concurrency = spec.concurrency * (_PER_PROCESS if worker == "processes" else 1)
        self.concurrency = concurrency
        reordered = spec.ordered and concurrency > 1
        self._reorder = Reorder(self._emit, 2 * concurrency) if reordered else None
        self._taken = ctx.start  # an item's position in the stage's input (its seed)
        self._checked = False
        # Results in workers' hands stay within half the output queue's capacity, so memory
        # stays bounded by the queues however cheap the function is (an ordered stage holds
        # up to 2 x concurrency chunks: those in workers and those in its reorder buffer).
        holders = 2 * concurrency * (2 if reordered else 1)
        # With a byte budget on the output, what workers hold in hand stays within half of
        # it too: chunks shrink as the measured output size per item grows.
        max_bytes = getattr(ctx.counters.output, "max_bytes", None)
        # What a sync stage holds, wherever it is (in workers, on its way back from a worker
        # process, in the reorder buffer), stays within half its output queue's capacity and
        # half its byte budget: taken before its items are, given back once they are put out.
        self._hand = None if self.is_async else Hand(
            ctx.counters.capacity, max_bytes,
            floor=2 * spec.concurrency if self.processes is not None else 1,
        )
        self.chunking = Chunking(
            max(1, min(_MAX_CHUNK, ctx.counters.capacity // holders)), max_bytes, holders,
            may_inline=worker == "threads" and runs_inline(spec.fn),
        )
        # state: which inputs each output came from, recorded before it is put out; concurrent
        # workers emit one at a time, so that the records follow the output order
        self.ledger = MapLedger.of(spec, concurrency, ctx.budget.limit)
        self._emit_lock = contextlib.nullcontext() if self.ledger.in_order else asyncio.Lock()
        ctx.counters.label(spec.fn)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        worker = self._async_worker if self.is_async else self._sync_worker
        if self.processes is not None:
            await self.ctx.run_sync(self.processes.start)
        if self.concurrency == 1:
            await worker(inp, out)
        else:
            async with asyncio.TaskGroup() as tg:
                workers = [tg.create_task(worker(inp, out)) for _ in range(self.concurrency)]
                if self._reorder is not None:
                    tg.create_task(self._reorder.emit_all(workers, out))

    def _check_result(self, values: list[Any]) -> None:
        self._checked = True
        coroutines = [value for value in values if inspect.iscoroutine(value)]
        if coroutines:
            for coroutine in coroutines:
                coroutine.close()  # never awaited: closed without a warning
            raise ConfigError(
                f"stage {self.ctx.name!r}: the function returned a coroutine; declare it "
                "with `async def` so that it runs on the event loop"
            )

    def _outputs(self, items: list[Any], values: list[Any], upto: int, clean: bool) -> list[Any]:
        if self.filter:
            pairs = zip(items[:upto], values[:upto], strict=False)  # values end early on stop
            return [x for x, keep in pairs if keep is not FAILED and keep]
        if clean:
            return values if upto >= len(values) else values[:upto]
        return [v for v in values[:upto] if v is not FAILED]

    async def _emit(self, result: _Single, out: Sender) -> None:
        items, values, failures = result
        try:
            self.ledger.emit(items, values, failures)
            for index, exc in failures:
                try:
                    self.ctx.item_failed(items[index], exc)
                except BaseException:
                    before = self._outputs(items, values, index, clean=False)
                    if before:
                        await out.put_many(before)
                        self.ctx.produced(count_items(before))
                    raise
            outs = self._outputs(items, values, len(values), clean=not failures)
            if self.filter:
                self.ctx.dropped(len(values) - len(failures) - len(outs))
            if outs:
                await out.put_many(outs)
            self.ctx.produced(count_items(outs))
        finally:
            if self._hand is not None:  # a sync stage's chunk: out of its hands now
                self._hand.give(len(items))

    async def _deliver(self, ticket: int, result: _Single, out: Sender) -> None:
        if self._reorder is not None:
            self._reorder.put(ticket, result)
        else:
            async with self._emit_lock:
                await self._emit(result, out)

    async def _take(self, inp: Receiver, limit: int) -> tuple[int, list[Any]]:
        """The next chunk of input (``[]`` at its end), counted, and its ticket."""
        if self._reorder is not None:
            await self._reorder.room()
        if self.processes is not None:  # a chunk's seeds are consecutive positions
            limit = self.ctx.positions(self._taken, limit)[1]
        items = await inp.get_many(limit)
        if not items:
            return -1, items
        ticket = self._reorder.ticket() if self._reorder is not None else 0
        self._taken += len(items)
        self.ledger.take(items)
        self.ctx.counters.items_in += count_items(items)
        self.ctx.counters.chunks += 1
        return ticket, items

    def _submit(self, items: list[Any]) -> Any:
        """Run the function on a chunk: in a worker process, the stage's executor or a thread."""
        ctx = self.ctx
        if self.processes is not None:
            # positions are assigned with no await since the take: items[0] is _taken - len
            first = ctx.positions(self._taken - len(items), len(items))[0]
            keys = ctx.seed_keys(first, len(items))  # a Split share's: the items' list indices
            return self.processes.submit(items, first, ctx.epoch, keys=keys)
        if self.remote:
            return ctx.run_sync(run_chunk_remote, self.fn, items)
        return ctx.run_sync(run_chunk, self.fn, items, ctx.stop)

    async def _sync_worker(self, inp: Receiver, out: Sender) -> None:
        # One call per chunk: the chunk's items and results are locals of that call only, so
        # nothing handed on stays referenced while the worker waits for its next chunk.
        while await self._sync_chunk(inp, out):
            pass

    async def _sync_chunk(self, inp: Receiver, out: Sender) -> bool:
        """Take, run and hand on one chunk; ``False`` at the end of the input."""
        hand = self._hand
        assert hand is not None  # a sync stage's
        chunking = self.chunking
        room = hand.take_now(chunking.size) or await hand.take(chunking.size)
        items: list[Any] = []
        try:
            ticket, items = await self._take(inp, room)
        finally:
            hand.give(room - len(items))  # all of it if the take failed
        if not items:
            return False
        counters = self.ctx.counters
        counters.in_flight += 1
        inline = chunking.inline
        try:
            if inline:
                values, failures, elapsed = run_chunk(self.fn, items, self.ctx.stop)
            else:
                values, failures, elapsed = await self._submit(items)
        finally:
            counters.in_flight -= 1
        counters.busy += elapsed
        chunking.adapt(elapsed, len(items))
        chunking.note_cost(elapsed, len(items), inline)
        if chunking.max_bytes is not None:  # a filter hands its inputs on
            hand.measured(chunking.fit_bytes(items if self.filter else values))
        if not self._checked:
            self._check_result(values)
        if self.filter:
            values, failures = _truths(values, failures)
        await self._deliver(ticket, (items, values, failures), out)
        return True

    async def _async_worker(self, inp: Receiver, out: Sender) -> None:
        """An async function, awaited directly: a chunk at a time by a lone worker, an item at
        a time by each of several.

        A call that completes without suspending costs no wake-up at all. Before a lone
        worker's chunk waits on a call that does suspend, the results done so far are handed
        on if the output has room now, so that a slow or stuck call never holds back finished
        items.

        Cancellation:
            Cancels the call in progress; the chunk's other items are dropped (the run is
            stopping).
        """
        alone = self.concurrency == 1  # its outputs in order with no reorder buffer or lock
        offer = getattr(out, "try_put_many", None) if alone else None
        ticket, carry = 0, list[Any]()  # items taken but not yet run (a chunk cut short)
        while True:
            if not carry:
                ticket, carry = await self._take(inp, self.chunking.size if alone else 1)
                if not carry:
                    return
            # the chunk lives in that call only (see _sync_worker); what it returns is left
            carry = await self._async_chunk(carry, ticket, out, offer)

    async def _async_chunk(
        self, items: list[Any], ticket: int, out: Sender,
        offer: Callable[[list[Any]], bool] | None,
    ) -> list[Any]:
        """Run and hand on ``items``, taken as ``ticket`` (see :meth:`_async_worker`); return
        the items left to run when the chunk was cut short."""
        counters, fn, perf_counter = self.ctx.counters, self.fn, time.perf_counter
        carry: list[Any] = []
        values: list[Any] = []
        failures: list[tuple[int, BaseException]] = []
        base = 0  # items[:base] were handed on already
        end = len(items)
        counters.in_flight += 1
        start = perf_counter()
        try:
            for index, item in enumerate(items):
                try:
                    value = fn(item)
                    if isinstance(value, CoroutineType):  # inspect.iscoroutine, less a call
                        try:
                            signal = value.send(None)
                        except StopIteration as done:
                            value = done.value
                        else:
                            if (values and not failures and offer is not None
                                    and self._offer(offer, items[base:index], values, value)):
                                base, values = index, []
                            value = await Resume(value, signal)
                    elif inspect.isawaitable(value):
                        value = await value
                    if self.filter:
                        value = bool(value)  # an array's raises: the item's failure
                except Exception as exc:
                    value = FAILED
                    failures.append((index - base, exc))
                values.append(value)
                if perf_counter() - start > TARGET_CHUNK_SECONDS and index + 1 < end:
                    carry, end = items[index + 1:], index + 1  # slow: hand on what is done
                    break
        finally:
            counters.in_flight -= 1
            elapsed = perf_counter() - start
            counters.busy += elapsed
        self.chunking.adapt(elapsed, end)
        if base or end < len(items):  # else the very list taken, which an unordered
            items = items[base:end]  # ledger knows its chunk by (``MapLedger.take``)
        await self._deliver(ticket, (items, values, failures), out)
        return carry

    def _offer(
        self, offer: Callable[[list[Any]], bool], items: list[Any], values: list[Any],
        running: Coroutine[Any, Any, Any],
    ) -> bool:
        """Hand on the results of ``items`` (none failed) if the output has room now, with no
        wait; close the ``running`` call should the output be aborted."""
        outs = self._outputs(items, values, len(values), clean=True)
        token = self.ledger.emit(items, values, [])
        try:
            if outs and not offer(outs):
                self.ledger.undo(token)
                return False
        except Exception:
            running.close()
            raise
        self.ctx.produced(count_items(outs))
        if self.filter:
            self.ctx.dropped(len(values) - len(outs))
        return True


_Single = tuple[list[Any], list[Any], list[tuple[int, BaseException]]]


def _truths(
    values: list[Any], failures: list[tuple[int, BaseException]]
) -> tuple[list[Any], list[tuple[int, BaseException]]]:
    """A predicate's results as bools; one whose truth cannot be told (``bool`` of an array
    raises) is its item's failure, counted and named as a failed call is."""
    failed = dict(failures)
    truths: list[Any] = []
    for index, value in enumerate(values):
        if value is not FAILED:
            try:
                value = bool(value)
            except Exception as exc:
                value, failed[index] = FAILED, exc
        truths.append(value)
    return truths, sorted(failed.items(), key=lambda pair: pair[0])

_MAX_CHUNK, _PER_PROCESS = 512, 4  # the largest chunk; chunks in flight per worker process
