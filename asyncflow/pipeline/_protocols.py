"""The protocols a feature implements to plug its own logic into an engine stage.

A stage's spec (``_spec.py``) names the object it runs by one of these, and the stage's node
calls it; neither the spec nor a feature needs the node's module to type it.

* :class:`Assembler` / :class:`PositionedAssembler`: what ``Pipeline.assemble`` runs (rows in,
  whole batches out; positioned: resumable), implemented by ``image.folder``'s batch slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from ._span import Span

__all__ = ["Assembler", "PositionedAssembler"]

B_co = TypeVar("B_co", covariant=True)


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


class PositionedAssembler(Assembler[B_co], Protocol[B_co]):
    """An assembler whose rows have positions (their place in the epoch's order, which fixes
    their batch): what makes an ``assemble`` stage resumable.
    """

    def position(self, row: Any) -> int:
        """The position of ``row`` (failed or not)."""
        ...

    def release(self, row: Any, *, ok: bool) -> Sequence[tuple[B_co | None, Sequence[int]]]:
        """As :meth:`arrived`, each batch it releases paired with the positions of the rows
        it holds (those that arrived whole); ``None`` for a batch released without output
        (every row failed, or ``drop_last``'s short batch)."""
        ...

    def resume(self, settled: Span) -> None:
        """The next run's rows at ``settled`` positions will not arrive (delivered in an
        earlier run, or failed there): leave them out of their batches."""
        ...
