"""How big a map stage's next chunk is, and whether a sync stage runs it inline on the loop.

A chunk grows (doubling) until one takes about :data:`TARGET_CHUNK_SECONDS` on its worker,
within ``max_chunk`` items; with a byte budget on the output, it shrinks as the measured output
size per item grows, so that what workers hold in hand stays within half of it.

A cheap sync function runs *inline* on the run's loop instead of paying a thread round trip
per chunk. The rule: a stage on the run's worker threads (no executor, no processes) whose
last :data:`_INLINE_AFTER` chunks on threads each took at most :data:`_INLINE_PER_ITEM`
seconds per item and at most half of :data:`_INLINE_CHUNK_LIMIT` in all runs its chunks on
the loop from then on; the first inline chunk that takes longer than
:data:`_INLINE_CHUNK_LIMIT` sends it back to the threads for the rest of the run. So the
loop is blocked at most once, by one chunk. A function that may block now and then (waits on
a lock or a condition, does I/O) opts out with the attribute ``asyncflow_inline = False``.
"""

from __future__ import annotations

from typing import Any

from ._channel import nbytes_of

__all__ = ["TARGET_CHUNK_SECONDS", "Chunking"]

#: Chunks a sync stage runs on threads, all cheap, before it may run inline on the loop.
_INLINE_AFTER = 3
#: The most seconds per item a chunk on threads may take to count as cheap.
_INLINE_PER_ITEM = 5e-6
#: An inline chunk that takes longer than this sends its stage back to the threads for good.
_INLINE_CHUNK_LIMIT = 0.001
TARGET_CHUNK_SECONDS = 0.002  # a chunk grows until one takes about this long on its worker


class Chunking:
    """One map stage's chunk size and inline state.

    Args:
        max_chunk: The largest chunk.
        max_bytes: The output's byte budget (``None``: none).
        holders: How many chunks the stage may hold at once (their share of the budget).
        may_inline: Whether the stage may ever run inline (see the module docstring).
    """

    def __init__(self, max_chunk: int, max_bytes: int | None, holders: int, *,
                 may_inline: bool) -> None:
        self.max_chunk = max_chunk
        self.max_bytes = max_bytes
        self.size = 1
        self._holders = holders
        self._per_item: float | None = None
        self._out_size: float | None = None
        # chunks seen cheap on threads so far, -1 once the stage may never run inline (again)
        self._cheap_chunks = 0 if may_inline else -1

    @property
    def inline(self) -> bool:
        """Whether the stage's sync chunks run on the run's loop now."""
        return self._cheap_chunks >= _INLINE_AFTER

    def adapt(self, elapsed: float, count: int) -> None:
        """A chunk of ``count`` items took ``elapsed`` seconds: size the next one."""
        per = elapsed / count
        self._per_item = per if self._per_item is None else 0.7 * self._per_item + 0.3 * per
        target = max(1, min(self.max_chunk, int(TARGET_CHUNK_SECONDS / max(self._per_item, 1e-8))))
        self.size = min(target, self.size * 2)

    def fit_bytes(self, values: list[Any]) -> float:
        """Shrink the chunk to the byte budget, given what a chunk put out; return the
        measured bytes of an output item (a running estimate, for the stage's ``Hand``)."""
        per = nbytes_of(values) / max(1, len(values))
        self._out_size = per if self._out_size is None else 0.7 * self._out_size + 0.3 * per
        if self._out_size > 0 and self.max_bytes is not None:
            share = self.max_bytes / 2 / self._holders
            self.size = max(1, min(self.size, int(share / self._out_size)))
        return self._out_size

    def note_cost(self, elapsed: float, count: int, was_inline: bool) -> None:
        """Move the stage onto the loop or back to the threads, as the rule says."""
        cheap = self._cheap_chunks
        if cheap < 0:
            return
        if was_inline:
            if elapsed > _INLINE_CHUNK_LIMIT:
                self._cheap_chunks = -1  # a slow call: threads from now on
        elif elapsed <= _INLINE_PER_ITEM * count and elapsed <= _INLINE_CHUNK_LIMIT / 2:
            self._cheap_chunks = cheap + 1
        else:
            self._cheap_chunks = 0
