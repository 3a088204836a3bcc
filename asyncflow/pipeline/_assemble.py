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

Resuming: an assembler that also numbers its rows (``_protocols.PositionedAssembler``: each row's
position in the epoch, and the positions each released batch holds) gives the stage a ledger,
:class:`AssembleLedger`: a row is settled once its batch is, a failed row at once. The stage's
saved extras are the settled positions (``{"rows": span}``), which a resumed run hands to the
assembler (``resume``): those rows are not coming, and the batches keep their boundaries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._errors import ConfigError, check_flags, check_int
from ._ledger import Ledger
from ._node import NodeContext, Receiver, Sender, node_for
from ._protocols import Assembler, PositionedAssembler
from ._span import GrowingSpan, Span, runs
from ._spec import StageSpec
from ._stats import ItemGroup
from ._traits import StageTraits

__all__ = ["AssembleLedger", "AssembleNode", "AssembleSpec"]

_DRAIN = 4096


@dataclass(frozen=True, kw_only=True)
class AssembleSpec(StageSpec):
    """Tell ``assembler`` of each arriving row; put out the whole batches it completes, in
    batch order (see the module).

    ``batch_size`` and ``drop_last`` declare what comes out (batches of ``batch_size`` rows,
    less any failed ones; a shorter last one unless ``drop_last``): ``describe()`` shows them,
    and tools reading a description (``.cache()``) rely on them. The assembler keeps to them.
    """

    kind: ClassVar[str] = "assemble"
    assembler: Assembler[Any]
    batch_size: int
    drop_last: bool = False
    max_failures: int | float | None = None
    buffer: int | None = None
    buffer_bytes: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("batch_size", self.batch_size)
        check_flags(self, "drop_last")
        missing = [m for m in ("failure", "arrived")
                   if not callable(getattr(self.assembler, m, None))]
        if missing:
            raise ConfigError(
                f"assemble() needs an assembler with failure(row) and arrived(row, ok=...) "
                f"methods; {type(self.assembler).__name__} lacks {', '.join(missing)}"
            )

    @property
    def traits(self) -> StageTraits:
        positioned = isinstance(self.assembler, PositionedAssembler)  # state of its own
        return StageTraits(grouping="batches", stateful=positioned, worker="loop")

    def check_state(self, extras: dict[str, Any], what: str) -> None:
        if set(extras) != {"rows"}:  # its ledger's settled rows
            raise ConfigError(f"{what} must hold rows only, got {sorted(extras)}")
        Span.from_json(extras["rows"], f"{what}['rows']")

    def settings(self) -> dict[str, Any]:
        return {
            "assembler": type(self.assembler).__name__, "batch_size": self.batch_size,
            "drop_last": self.drop_last, "max_failures": self.max_failures,
            "buffer": self.buffer, "buffer_bytes": self.buffer_bytes,
        }


class AssembleLedger(Ledger):
    """Rows in (in arrival order), whole batches out: the input ordinals of each batch in
    flight; a failed row, or the rows of a batch released without output, settle at once.

    It also keeps the settled rows' *positions* (:attr:`positions`: those of an earlier run,
    then those settled here), which the stage saves and a resumed run's assembler skips.
    """

    def __init__(self, assembler: Any) -> None:
        super().__init__()
        self.assembler = assembler
        self.outputs: list[tuple[list[int], list[int]]] = []  # (ordinals, positions) per batch
        self.first_out = 0
        self.dead: list[tuple[list[int], list[int]]] = []  # as outputs, released without one
        self.positions = GrowingSpan()  # settled rows, an earlier run's included
        #: Set when a message held several rows: such a run cannot be resumed.
        self.grouped = False

    def released(self, ordinals: list[int], positions: Sequence[int], out: bool) -> None:
        """A batch of these rows was released: put out (``out``), or settled without output
        (as a failed row is)."""
        with self.lock:
            if not self.on:
                return
            (self.outputs if out else self.dead).append((ordinals, list(positions)))
        self.grew(1)

    def settle(self, outputs: list[tuple[int, int]], mark: int) -> list[tuple[int, int]]:
        done, self.dead = self.dead, []  # the batches settled: dead ones at once
        first, listed = self.first_out, len(self.outputs)
        for a, b in outputs:
            done.extend(self.outputs[max(a - first, 0) : max(b - first, 0)])
        self.positions.add(runs([p for _, settled in done for p in settled]))
        drop = min(listed, mark - first)
        if drop > 0:
            del self.outputs[:drop]
            self.first_out += drop
        return runs([o for rows, _ in done for o in rows])

    def inputs_of(self, ordinal: int) -> list[int]:
        index = ordinal - self.first_out
        return list(self.outputs[index][0]) if 0 <= index < len(self.outputs) else []

    def lowest(self, ordinal: int) -> int:
        start = max(0, ordinal - self.first_out)
        return min((min(rows, default=ordinal) for rows, _ in self.outputs[start:]),
                   default=1 << 62)

    def get_state(self) -> dict[str, Any] | None:
        if self.grouped:
            raise ConfigError(
                "this pipeline cannot be resumed: its assemble stage received several rows "
                "in one message (an ItemGroup); unbatch() them before assemble()"
            )
        return {"rows": self.positions.span().to_json()}

    def set_state(self, state: dict[str, Any]) -> None:
        positions = Span.from_json(state.get("rows"), "the assemble stage's settled rows")
        self.positions.add(positions.intervals())
        self.assembler.resume(positions)  # before the run starts: before any claim


@node_for(AssembleSpec)
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
        #: Present when the assembler numbers its rows (the run can then be resumed).
        self.ledger: AssembleLedger | None = (
            AssembleLedger(spec.assembler) if spec.traits.stateful else None
        )
        self._taken = 0  # rows (messages) read
        self._where: dict[int, int] = {}  # position -> input ordinal, rows not yet released

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        """Assemble until the input ends.

        Raises:
            Exception: A failed row once the failure budget is exceeded (with a note naming
                the stage), or what the assembler itself raised.
            FailureBudgetExceeded: At the end (the run checks every stage's budget), when
                every row failed or a fractional budget is exceeded.

        Cancellation:
            Waits on its input and, while downstream is full, on its output; cancelling
            either drops the batches in hand (the run is stopping).
        """
        assert inp is not None  # only the source gets None
        ledger = self.ledger
        while messages := await inp.get_many(_DRAIN):
            for message in messages:
                ordinal, self._taken = self._taken, self._taken + 1
                rows = message if message.__class__ is ItemGroup else (message,)
                if ledger is not None and len(rows) > 1:
                    ledger.grouped = True
                for row in rows:
                    await self._arrive(row, out, ordinal)

    def _release(self, row: Any, ordinal: int, error: Exception | None) -> list[Any]:
        """Tell a positioned assembler of ``row``, recording its batches in the ledger
        before they are put out."""
        assembler: Any = self.assembler
        ledger, where = self.ledger, self._where
        assert ledger is not None
        position = assembler.position(row)
        if error is None:
            where[position] = ordinal
        else:
            ledger.released([ordinal], [position], False)  # settled at once
        batches = []
        for batch, positions in assembler.release(row, ok=error is None):
            ordinals = [where.pop(p) for p in positions]
            ledger.released(ordinals, positions, batch is not None)
            if batch is not None:
                batches.append(batch)
        return batches

    async def _arrive(self, row: Any, out: Sender, ordinal: int) -> None:
        ctx, counters = self.ctx, self.ctx.counters
        counters.items_in += 1
        counters.chunks += 1
        start = time.perf_counter()
        error = self.assembler.failure(row)
        if self.ledger is not None:
            batches = self._release(row, ordinal, error)
        else:
            batches = list(self.assembler.arrived(row, ok=error is None))
        counters.busy += time.perf_counter() - start
        if batches:
            await out.put_many(list(batches))
            ctx.produced(len(batches))
        if error is not None:
            ctx.item_failed(row, error)  # after its batch: the batches it completed are out
