"""The GPU decode path's batches before the GPU: rows grouped into :class:`Pending` batches.

:class:`PendingAssembler` is ``image.folder``'s :class:`~asyncflow.image._slots.BatchAssembler`
with one-byte rows: the same claims, order, resume and journal records, and each released
batch is a :class:`Pending` list of its rows' payloads (``_gpu_plan.py``), which the GPU stage
(``_gpu.py``) decodes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ._gpu_plan import Encoded, Payload, Planned
from ._rows import Failed
from ._slots import BatchAssembler

__all__ = ["Pending", "PendingAssembler"]


class Pending(NamedTuple):
    """A released batch, not yet decoded: its rows' payloads and labels, in row order."""

    key: tuple[int, int]  # (listing run, batch number)
    rows: list[Payload]
    labels: torch.Tensor
    paths: list[str]
    rows_at: list[int]  # each payload's row in its batch


class PendingAssembler(BatchAssembler):
    """:class:`BatchAssembler` bookkeeping for rows that are payloads, not pixels: batches
    are released in order, whole, as :class:`Pending` batches.

    A failed row stays in its batch as its :class:`~asyncflow.image._rows.Failed` record:
    the GPU stage, named ``"batch"`` as the CPU path's assembling stage is, counts it against
    ``max_failures`` with the rows that neither decoder could make, so that failures read
    alike on both paths. Its own buffers are one byte a row (the bookkeeping needs a row to
    claim).
    """

    def __init__(self, batch_size: int, count: int, *, drop_last: bool, ahead: int) -> None:
        super().__init__(batch_size, 1, 1, count, torch.uint8, drop_last=drop_last,
                         ahead=ahead, pool=max(4, ahead + 2))
        self._payloads: dict[tuple[int, int], dict[int, tuple[Payload, str]]] = {}

    @staticmethod
    def failure(row: Any) -> Exception | None:
        return None  # counted by the GPU stage (see the class docstring)

    def release(self, row: Any, *, ok: bool = True) -> list[tuple[Any, list[int]]]:
        if isinstance(row, Planned | Failed):
            ticket = row.ticket
            payload = row.payload if isinstance(row, Planned) else row
            name = payload.name if isinstance(payload, Encoded) else ""
            with self._lock:
                state = self._runs.get(ticket.run)
                entry = None if state is None else state.open.get(ticket.number)
                if entry is not None and ticket.row not in entry.absent:
                    rows = self._payloads.setdefault((ticket.run, ticket.number), {})
                    rows[ticket.row] = (payload, name)
            return super().release(ticket, ok=ok)
        raise TypeError(f"not a row of the GPU path: {row!r:.80}")

    def _release(self, entry: Any) -> Any:
        with self._lock:
            payloads = self._payloads.pop(entry.key, {})
        gone = set(entry.failed) | set(entry.absent)
        keep = [r for r in range(entry.rows) if r not in gone and r in payloads]
        labels = torch.from_numpy(entry.labels[keep].copy())
        pending = Pending(entry.key, [payloads[r][0] for r in keep], labels,
                          [payloads[r][1] for r in keep], keep)
        return self._logged(entry, (pending, labels))  # type: ignore[arg-type]

    def relog(self, before: torch.Tensor, after: torch.Tensor, failed: list[tuple[int, str]],
              decoder: str) -> None:
        """The GPU stage made ``after`` (its labels) of the batch logged under ``before``:
        note it there for a journal, with the rows that failed on the way and the decoder."""
        with self._lock:
            log = self.log
            logged = None if log is None else log.pop(id(before), None)
            if log is None or logged is None:
                return
            run, number, earlier, absent = logged
            log[id(after)] = (run, number, sorted([*earlier, *failed]), absent,  # type: ignore[assignment]
                              decoder)
