"""One iteration of a :class:`~asyncflow.Share`: its items, each keyed for seeding.

A share deals out a part of a list. Its iterator names each item's seed key, the item's index
in the whole list (``seeding.KeyedIterator``), and the engine seeds process workers from that
key rather than from the item's position in the pipeline's epoch, which is local to the part:
so an item draws the same random stream on any rank, under any world size, before and after
an elastic resume, and the items of two ranks never share a stream.
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from typing import TypeVar

__all__ = ["AsyncDealt", "Dealt"]

T = TypeVar("T")


class Dealt(Iterator[T]):
    """One iteration of a :class:`Share`: the items at ``positions`` of ``listed``, each
    keyed for seeding by its list position (``seeding.KeyedIterator``), so that an item's
    random draws are the same on any rank, under any world size, resumed or not."""

    __slots__ = ("_items", "positions")

    def __init__(self, listed: Sequence[T], positions: list[int]) -> None:
        self.positions = positions
        self._items = map(listed.__getitem__, positions)

    def __next__(self) -> T:
        return next(self._items)

    def seed_key(self, index: int) -> int:
        """The list position of this iteration's ``index``-th item: its seed key."""
        return self.positions[index]


class AsyncDealt(AsyncIterator[T]):
    """``split(async_iterable)``: every item of ``items`` is read, then this part's are
    yielded, each keyed by its list position as :class:`Dealt` keys it.

    Args:
        positions_of: The part's positions in a list of ``n`` items (asked once the list is
            read, so that the part is resolved as late as for a sequence).
        items: The whole list, the same on every rank.
    """

    def __init__(
        self, positions_of: Callable[[int], list[int]], items: AsyncIterable[T]
    ) -> None:
        self.positions: list[int] = []
        self._gen = self._deal(positions_of, items)

    def __anext__(self) -> Awaitable[T]:
        return self._gen.__anext__()

    async def aclose(self) -> None:
        """Close the listing, if it is still being read."""
        await self._gen.aclose()

    def seed_key(self, index: int) -> int:
        """The list position of this iteration's ``index``-th item: its seed key."""
        return self.positions[index]

    async def _deal(
        self, positions_of: Callable[[int], list[int]], items: AsyncIterable[T]
    ) -> AsyncGenerator[T]:
        """Every item of ``items``, then this part's.

        Cancellation:
            Cancelling the iterating task while the list is read closes ``items`` (when it
            has ``aclose``), releasing a listing's client.
        """
        close = getattr(items, "aclose", None)
        try:
            listed = [item async for item in items]
        finally:
            if close is not None:
                await close()
        self.positions = positions_of(len(listed))
        for i in self.positions:
            yield listed[i]
