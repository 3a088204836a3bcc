"""The sampler behind ``DataLoader(shuffle=True)``: torch's RandomSampler, drawn lazily."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import RandomSampler as TorchRandomSampler

from .._errors import ConfigError
from ..pipeline.seeding import epoch_seed

__all__ = ["ShuffleSampler"]

_CHUNK = 4096  # indices turned into Python ints at a time


class ShuffleSampler(TorchRandomSampler):
    """``torch.utils.data.RandomSampler`` without replacement, iterated lazily and resumable.

    Given a ``generator``, it draws exactly as torch's RandomSampler does, so a loader's
    order matches torch's DataLoader with an identically seeded generator. Without one, each
    epoch's order comes from ``(seed, epoch)``: reproducible, and replayed exactly on resume.
    Either way the permutation is kept as one int64 tensor (8 bytes an index) and turned into
    Python ints a chunk at a time, where torch's own sampler makes a list of every index
    first. The dataset's length is read at each iteration.

    Args:
        data_source: The dataset.
        generator: A ``torch.Generator`` to draw from, as torch's sampler does.
        seed: Seeds the orders when ``generator`` is None.
    """

    def __init__(self, data_source: Sized, *, generator: torch.Generator | None = None,
                 seed: int = 0) -> None:
        super().__init__(data_source, generator=generator)
        self.seed = seed
        self.epoch = 0
        self._pinned = True  # the first iteration is epoch 0
        self._own = torch.Generator()

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration draw epoch ``epoch``'s order (without it, each iteration
        takes the next epoch). Ignored when drawing from a given ``generator``."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch, self._pinned = epoch, True

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration draws (without a given ``generator``)."""
        return self.epoch if self._pinned else self.epoch + 1

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        if n == 0:
            return iter(())
        generator = self.generator
        if generator is None:
            if not self._pinned:
                self.epoch += 1
            self._pinned = False
            generator = self._own
            generator.manual_seed(epoch_seed(self.seed, self.epoch))
        return self._draw(n, generator)

    def _draw(self, n: int, generator: torch.Generator) -> Iterator[int]:
        # the same draws as torch's RandomSampler: whole permutations, then a part of one
        # (drawn even when that part is empty, as torch does, so the generator ends alike)
        whole, rest = divmod(self.num_samples, n)
        for _ in range(whole):
            yield from _chunked(torch.randperm(n, generator=generator))
        yield from _chunked(torch.randperm(n, generator=generator)[:rest])

    def state_dict(self) -> dict[str, Any]:
        """``seed`` and ``epoch`` of the latest (or, after :meth:`set_epoch`, the next) order."""
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration draws the order ``state`` describes.

        Raises:
            ConfigError: ``state`` lacks ``seed`` or ``epoch``.
        """
        try:
            seed, epoch = state["seed"], state["epoch"]
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a shuffle sampler state: {state!r:.200}") from exc
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.set_epoch(epoch)

    def __repr__(self) -> str:
        source = "generator" if self.generator is not None else f"seed={self.seed}"
        return f"ShuffleSampler({len(self.data_source)} items, {source})"


def _chunked(order: torch.Tensor) -> Iterator[int]:
    for start in range(0, len(order), _CHUNK):
        yield from order[start : start + _CHUNK].tolist()
