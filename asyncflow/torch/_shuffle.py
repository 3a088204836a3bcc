"""The sampler behind ``DataLoader(shuffle=True)``: torch's RandomSampler, drawn lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import RandomSampler as TorchRandomSampler

from .._errors import ConfigError, check_int
from ..pipeline.seeding import epoch_seed

__all__ = ["ShuffleSampler"]

_CHUNK = 4096  # indices turned into Python ints at a time


class ShuffleSampler(TorchRandomSampler):
    """``torch.utils.data.RandomSampler`` without replacement, iterated lazily and resumable.

    Without ``seed``, each iteration draws as torch's RandomSampler does: from
    ``generator``, or, without one, from a generator of its own seeded at its first index
    with a draw from torch's global generator, so that under the same ``torch.manual_seed``
    the order, and what the global generator gives afterwards, are torch's. An epoch keeps
    the seed it drew: one resumed, named again by :meth:`set_epoch`, or fixed by a state
    taken before it began replays that seed (still drawing one, so that the global generator
    moves on as torch's). With ``seed``, each epoch's order comes from ``(seed, epoch)`` and
    nothing global is drawn. Either way the permutation is kept as one int64 tensor (8 bytes
    an index) and turned into Python ints a chunk at a time, where
    torch's own sampler makes a list of every index first. The dataset's length is read at
    each iteration.

    Args:
        data_source: The dataset.
        generator: A ``torch.Generator`` to draw from, as torch's sampler does.
        seed: Seeds the orders (``None``: torch's draws).
    """

    def __init__(self, data_source: Sized, *, generator: torch.Generator | None = None,
                 seed: int | None = None) -> None:
        super().__init__(data_source, generator=generator)
        self.seed = seed
        self.epoch = 0
        self._pinned = True  # the first iteration is epoch 0
        self._own = torch.Generator()
        self._drawn: dict[int, int] = {}  # epoch -> the seed it drew from the global generator

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration draw epoch ``epoch``'s order (without it, each iteration
        takes the next epoch). Ignored when drawing from a given ``generator``."""
        check_int("epoch", epoch, 0)
        self.epoch, self._pinned = epoch, True

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration draws (without a given ``generator``)."""
        return self.epoch if self._pinned else self.epoch + 1

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            if not self._pinned:
                self.epoch += 1
            self._pinned = False
        return self._draw(self.epoch)

    def _draw(self, epoch: int) -> Iterator[int]:
        n = len(self.data_source)
        if n == 0:
            return
        generator = self.generator
        if generator is None:
            generator = self._own
            if self.seed is not None:
                generator.manual_seed(epoch_seed(self.seed, epoch))
            else:
                # torch's draw, at the first index as torch's, made by every iteration so
                # that the global generator moves on as torch's; an epoch with a seed already
                # (resumed, fixed by a state, named again) keeps it
                drawn = int(torch.empty((), dtype=torch.int64).random_().item())
                self._drawn.setdefault(epoch, drawn)
                generator.manual_seed(self._drawn[epoch])
        # the same draws as torch's RandomSampler: whole permutations, then a part of one
        # (drawn even when that part is empty, as torch does, so the generator ends alike)
        whole, rest = divmod(self.num_samples, n)
        for _ in range(whole):
            yield from _chunked(torch.randperm(n, generator=generator))
        yield from _chunked(torch.randperm(n, generator=generator)[:rest])

    def fix_seed(self, epoch: int, peek: Callable[[], int]) -> None:
        """Fix the seed epoch ``epoch`` will draw now: ``peek()``, what the global generator
        would give it if nothing else drew first (a state taken between epochs must say
        which order comes next). It still draws then, as torch's, and keeps this seed."""
        if self.seed is None and self.generator is None and epoch not in self._drawn:
            self._drawn[epoch] = peek()

    def state_dict(self) -> dict[str, Any]:
        """The latest (or, after :meth:`set_epoch`, the next) epoch, and what its order
        comes from: ``seed``, or the seed it drew (``drawn``)."""
        if self.seed is not None:
            return {"seed": self.seed, "epoch": self.epoch}
        state: dict[str, Any] = {"epoch": self.epoch}
        drawn = [[e, self._drawn[e]] for e in sorted({self.epoch, self.next_epoch})
                 if e in self._drawn]
        if drawn:
            state["drawn"] = drawn  # [epoch, seed] pairs: the latest epoch's, the next one's
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration draws the order ``state`` describes.

        Raises:
            ConfigError: ``state`` is not a shuffle sampler's.
        """
        try:
            epoch, seed = state["epoch"], state.get("seed")
            drawn = {e: s for e, s in state.get("drawn") or ()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a shuffle sampler state: {state!r:.200}") from exc
        for value in (seed, *drawn, *drawn.values()):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"not a shuffle sampler state: {state!r:.200}")
        self.set_epoch(epoch)
        self.seed = seed
        if epoch in drawn:  # the seed the order of the epoch to resume drew
            self._drawn[epoch] = drawn[epoch]

    def __repr__(self) -> str:
        source = "generator" if self.generator is not None else (
            "torch's global generator" if self.seed is None else f"seed={self.seed}")
        return f"ShuffleSampler({len(self.data_source)} items, {source})"


def _chunked(order: torch.Tensor) -> Iterator[int]:
    for start in range(0, len(order), _CHUNK):
        yield from order[start : start + _CHUNK].tolist()
