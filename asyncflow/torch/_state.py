"""Where a loader's iteration stands, and the iterator of one epoch that keeps it current."""

from __future__ import annotations

from types import TracebackType
from typing import Any, NamedTuple

from .._errors import ConfigError
from ..pipeline import PipelineStats, Run

__all__ = ["EpochIterator", "Indexed", "LoaderState", "Positioned"]


class Indexed(NamedTuple):
    """An epoch's batch of indices and its position; it shows as the indices (in failure
    records, as before)."""

    position: int
    indices: Any

    def __repr__(self) -> str:
        return repr(self.indices)


class Positioned(NamedTuple):
    """A batch and its position in the epoch's list of index batches."""

    position: int
    batch: Any


class LoaderState:
    """Which epoch is under way and how many of its batches the consumer has received.

    Only the latest epoch counts: an older iterator still being read does not move it.
    """

    def __init__(self) -> None:
        self.next_epoch = 0
        self.epoch = 0
        self.delivered = 0
        self.in_epoch = False
        self.serial = 0
        self._skip = 0

    def begin(self) -> tuple[int, int]:
        """Start the next epoch; returns ``(epoch, batches to skip)`` (non-zero on resume)."""
        epoch, skip = self.next_epoch, self._skip
        self.epoch, self.delivered, self._skip = epoch, skip, 0
        self.next_epoch = epoch + 1
        self.in_epoch = True
        self.serial += 1
        return epoch, skip

    def as_dict(self) -> dict[str, Any]:
        if self.in_epoch:
            return {"epoch": self.epoch, "batches": self.delivered}
        return {"epoch": self.next_epoch, "batches": self._skip}

    def load(self, state: dict[str, Any]) -> None:
        try:
            epoch, batches = state["epoch"], state["batches"]
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a DataLoader state dict: {state!r:.200}") from exc
        for what, value in (("epoch", epoch), ("batches", batches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"state {what} must be an int >= 0, got {value!r}")
        self.next_epoch, self._skip, self.in_epoch = epoch, batches, False
        self.serial += 1


class EpochIterator:
    """The iterator of one epoch: ``for`` and ``async for``, ``close()`` / ``aclose()``.

    Breaking out of the loop and dropping the iterator stops the epoch's pipeline; ``with``
    (or ``close()``) stops it at once.
    """

    def __init__(self, run: Run, state: LoaderState, length: int) -> None:
        self._run = run
        self._state = state
        self._serial = state.serial
        self._length = length

    def __len__(self) -> int:
        return self._length

    def _delivered(self, item: Positioned) -> Any:
        if self._state.serial == self._serial:
            # Every batch before this one was delivered or failed (fetch keeps their order).
            self._state.delivered = item.position + 1
        return item.batch

    def _ended(self) -> None:
        if self._state.serial == self._serial:
            self._state.in_epoch = False

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Any:
        try:
            item = next(self._run)
        except StopIteration:
            self._ended()
            raise
        return self._delivered(item)

    def __aiter__(self) -> EpochIterator:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._run.__anext__()
        except StopAsyncIteration:
            self._ended()
            raise
        return self._delivered(item)

    def close(self) -> None:
        """Stop the epoch's pipeline; the batches not yet received are dropped."""
        self._run.close()

    async def aclose(self) -> None:
        """Like :meth:`close`, without blocking the event loop."""
        await self._run.aclose()

    def __enter__(self) -> EpochIterator:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> EpochIterator:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def stats(self) -> PipelineStats:
        """Statistics of this epoch's pipeline so far."""
        return self._run.stats()
