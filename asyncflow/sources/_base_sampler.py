"""What every index sampler shares: epochs, one-shot resume, state dicts and lazy iteration.

The samplers themselves (``_samplers.py``) say only which order an epoch has; this base class
decides which epoch an iteration draws, where a resumed one starts, and what
``state_dict()`` reports while it runs.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from typing import Any

from .._errors import ConfigError, check_int
from ._orders import Block, check_seed, flatten, skip

__all__ = ["Sampler"]


class Sampler(abc.ABC):
    """What every sampler shares: epochs, one-shot resume, state dicts and lazy iteration.

    Subclasses implement :meth:`_blocks` (the order of one epoch, checked when called and
    drawn lazily). Iteration yields it from the offset :meth:`load_state_dict` gave (once).
    """

    seed: int
    # Whether an iteration not preceded by set_epoch / load_state_dict is the next epoch.
    _advances = True

    def __init__(self) -> None:
        self.epoch = 0
        self._pinned = True  # the first iteration is epoch 0
        self._resume_offset = 0
        self._offset = 0
        self._serial = 0

    @abc.abstractmethod
    def _blocks(self, epoch: int) -> Iterator[Block]:
        """The order of ``epoch``; raises at once (not when drawn) if it cannot be drawn."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def indices(self, epoch: int | None = None) -> list[int]:
        """Every index of one epoch in order, as a list; ``epoch`` defaults to :attr:`epoch`
        (the latest iteration's, or the one :meth:`set_epoch` chose for the next)."""
        return list(flatten(self._blocks(self.epoch if epoch is None else epoch)))

    def __iter__(self) -> Iterator[int]:
        # Raise now if an order cannot be drawn (the dataset has become empty, say): _blocks
        # checks when called and draws only when read.
        self._blocks(self.next_epoch)
        return self._walk()

    def _walk(self) -> Iterator[int]:
        # The iteration (and its epoch) begins at its first index, not at iter(): torch's
        # DataLoader with workers calls iter() twice on its first epoch and drops one.
        blocks, start, serial = self._begin()
        for position, index in enumerate(flatten(blocks), start + 1):
            if serial == self._serial:  # an older, abandoned iterator does not move the state
                self._offset = position
            yield index

    def _begin(self) -> tuple[Iterable[Block], int, int]:
        epoch = self.next_epoch
        blocks = self._blocks(epoch)
        self.epoch, self._pinned, self._serial = epoch, False, self._serial + 1
        start, self._resume_offset = self._resume_offset, 0
        self._offset = start
        return skip(blocks, start), start, self._serial

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration draws."""
        return self.epoch + 1 if self._advances and not self._pinned else self.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``, from its first index (an iteration under
        way goes on with its own order, but no longer moves :meth:`state_dict`).

        Raises:
            ConfigError: ``epoch`` is negative (:class:`ConfigTypeError`: not an int).
        """
        self.epoch = check_int("epoch", epoch, 0)
        self._pinned = True
        self._resume_offset = self._offset = 0
        self._serial += 1  # an iteration under way no longer counts in state_dict()

    def state_dict(self) -> dict[str, Any]:
        """``epoch`` (of the iteration under way or last run, or the one :meth:`set_epoch`
        chose), ``seed``, and ``offset``: the indices that iteration has yielded so far.

        A loader that has handed out fewer items than the sampler yielded (prefetch) should
        overwrite ``offset`` with the number its consumer actually received.
        """
        return {"epoch": self.epoch, "seed": self.seed, "offset": self._offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``epoch`` and ``seed``: the next iteration is that epoch, skipping its first
        ``offset`` indices (the iteration after it goes on to the next epoch, from the start).

        Raises:
            ConfigError: A field is missing or out of range.
        """
        try:
            epoch, seed, offset = state["epoch"], state["seed"], state.get("offset", 0)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"not a sampler state dict: {state!r}") from exc
        self.set_epoch(epoch)
        self.seed = check_seed(seed)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= len(self):
            raise ConfigError(f"offset must be an int in [0, {len(self)}], got {offset!r}")
        self._resume_offset = self._offset = offset
