"""Ordered assembly: rows that arrive in any order, whole batches out in batch order.

A library that knows, before decoding, which batch row each item lands in (``image.folder``
writes each image straight into its row of a preallocated batch) decodes unordered, so that
no worker waits for a slower neighbour, and still hands out batches in order and whole. The
bookkeeping is the library's :class:`Assembler`; the stage, :class:`AssembleNode`, tells it of
every row as the row arrives, on the run's loop, puts out the batches it completes, and
counts a failed row against the stage's failure budget.

``Pipeline.assemble(assembler, batch_size=..., drop_last=...)`` adds the stage; its
``describe()`` entry is of kind ``"assemble"`` and carries ``batch_size`` and ``drop_last``,
which tools reading a description (``.cache()``) take as "batches of this size come out".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from ._node import NodeContext, Receiver, Sender
from ._spec import AssembleSpec
from ._stats import ItemGroup

__all__ = ["AssembleNode", "Assembler"]

B_co = TypeVar("B_co", covariant=True)

_DRAIN = 4096


class Assembler(Protocol[B_co]):
    """Told of each row as it arrives; returns the batches it completes, in batch order.

    Both methods run on the run's event loop, one row at a time, in arrival order: keep them
    quick (bookkeeping, not copies of whole batches where that can be avoided).
    """

    def failure(self, row: Any) -> Exception | None:
        """The error a failed row carries (it is counted against ``max_failures``), or
        ``None`` for a row that arrived whole."""
        ...

    def arrived(self, row: Any, *, ok: bool) -> Sequence[B_co]:
        """Record ``row`` (``ok``: it arrived whole; else it failed and its batch is released
        without it) and return the batches now complete, in batch order (often none)."""
        ...


class AssembleNode:
    """The ``assemble`` stage of one run: each row to the assembler, the batches it
    completes to the output.

    Rows may arrive one per message or several in an :class:`ItemGroup` (each row is told
    apart). Counts: ``items_in`` rows, ``items_out`` batches, one ``chunk`` per row; the
    assembler's time is the stage's busy time.
    """

    def __init__(self, ctx: NodeContext, spec: AssembleSpec) -> None:
        self.ctx = ctx
        self.assembler: Assembler[Any] = spec.assembler

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        """Assemble until the input ends.

        Raises:
            Exception: A failed row once the failure budget is exceeded (with a note naming
                the stage), or what the assembler itself raised.
            FailureBudgetExceeded: At the end, when every row failed or a fractional budget
                is exceeded.

        Cancellation:
            Waits on its input and, while downstream is full, on its output; cancelling
            either drops the batches in hand (the run is stopping).
        """
        assert inp is not None  # only the source gets None
        counters = self.ctx.counters
        while messages := await inp.get_many(_DRAIN):
            for message in messages:
                if message.__class__ is ItemGroup:
                    for row in message:
                        await self._arrive(row, out)
                else:
                    await self._arrive(message, out)
        self.ctx.budget.check_end(counters.failures, counters.items_in)

    async def _arrive(self, row: Any, out: Sender) -> None:
        ctx, counters = self.ctx, self.ctx.counters
        counters.items_in += 1
        counters.chunks += 1
        start = time.perf_counter()
        error = self.assembler.failure(row)
        batches = self.assembler.arrived(row, ok=error is None)
        counters.busy += time.perf_counter() - start
        if batches:
            await out.put_many(list(batches))
            ctx.produced(len(batches))
        if error is not None:
            ctx.item_failed(row, error)  # after its batch: the batches it completed are out
