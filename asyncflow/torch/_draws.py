"""The random draws torch's DataLoader makes, made when and where it makes them.

torch's iterator draws a *base seed* (``torch.empty((), dtype=torch.int64).random_()``) from
the loader's ``generator``, or torch's global generator without one, each time an iterator
is created: every epoch, but only the first with persistent workers (torch resets that
iterator instead). Its ``RandomSampler`` then draws a seed of its own from the global
generator at its first index: a loader with workers takes it within ``iter()`` (its workers
fetch ahead), one without at the first batch, as asyncflow's always does (so that a
``set_epoch`` between ``iter()`` and the first batch still counts, as trainers expect).
Making the same draws in the same order gives torch's order under the same
``torch.manual_seed``, and leaves the global generator where torch's leaves it, so that the
code after a loop draws torch's numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import BatchSampler

from ._shuffle import ShuffleSampler

if TYPE_CHECKING:
    from ._facade import Loader
    from ._state import LoaderState

__all__ = ["TorchDraws", "worker_seed"]


def worker_seed(generator: torch.Generator | None) -> int:
    """The base of the workers' per-item seeds, drawing nothing from any generator.

    With ``generator``, its initial seed, as torch's workers follow it. Without, the base
    seed torch's global generator would give next (peeked from a copy of its state):
    reproducible under ``torch.manual_seed``, as torch's base seed is (two loaders made
    with nothing drawn between them share it; each item's seed also has its position).
    """
    return generator.initial_seed() if generator is not None else _peek_global(0)


def _peek_global(skip: int) -> int:
    """The int64 torch's global generator would give after ``skip`` draws (a copy of its
    state draws them: the global generator does not move)."""
    peek = torch.Generator()
    peek.set_state(torch.get_rng_state())
    for _ in range(skip):
        torch.empty((), dtype=torch.int64).random_(generator=peek)
    return int(torch.empty((), dtype=torch.int64).random_(generator=peek).item())


class TorchDraws:
    """What a loader draws at each epoch's start, and the generator states its order began
    from (for ``state_dict()``).

    Args:
        loader: The DataLoader.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.generator_start: torch.Tensor | None = None
        self.sampler_generator_start: torch.Tensor | None = None
        self._iterated = False
        self._drawn_already = False  # a restored in-epoch state is past its base seed draw
        # whether the state loaded last was saved between epochs (its dataset state is then
        # loaded before the next epoch's draws); None once an epoch has started
        self.loaded_between: bool | None = None

    def begin(self) -> None:
        """As torch's iterator does first: draw the base seed (unless torch would reuse
        the iterator of persistent workers), then note where the order's generators stand."""
        loader = self.loader
        reused = self._reuses_iterator()
        skip, self._iterated, self._drawn_already = self._drawn_already, True, False
        self.loaded_between = None
        if not (reused or skip):
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        if loader.generator is not None:
            self.generator_start = loader.generator.get_state()
        if (own := self.sampler_generator()) is not None:
            self.sampler_generator_start = own.get_state()

    def peek_sampler_seed(self) -> int:
        """The seed the next epoch's shuffle would draw from torch's global generator, were
        nothing else to draw first: after the base seed, unless that is not drawn."""
        return _peek_global(int(self.loader.generator is None and not self._reuses_iterator()))

    def _reuses_iterator(self) -> bool:
        """Whether torch would reuse its iterator at the next epoch (persistent workers, after
        the first), so that it draws no base seed. torch's ``num_workers`` is as given: ``0``
        when not given."""
        workers = self.loader.__dict__.get("_workers_asked")
        return bool(self.loader.persistent_workers and workers and self._iterated)

    def sampler_generator(self) -> torch.Generator | None:
        """The generator a user's torch sampler draws from, if it has one of its own."""
        sampler: Any = self.loader.sampler
        if isinstance(sampler, ShuffleSampler) or sampler is None:
            return None
        own = getattr(sampler, "generator", None)
        return own if isinstance(own, torch.Generator) and own is not self.loader.generator \
            else None

    def save(self, state: dict[str, Any], where: LoaderState) -> None:
        """Put what decides the order into a loader's ``state``: the samplers' states and the
        generators' (within an epoch, those its order began from, so that a resumed epoch
        draws it again; between epochs, those the next epoch's order will come from)."""
        loader, in_epoch = self.loader, where.in_epoch
        if not in_epoch and self.loaded_between is not False:
            state["between_epochs"] = True  # the next epoch's draws are still to come
            if isinstance(loader.sampler, ShuffleSampler):
                loader.sampler.fix_seed(where.next_epoch, self.peek_sampler_seed)
        for key, obj in zip(("sampler", "batch_sampler"), loader._samplers(), strict=True):
            if hasattr(obj, "state_dict") and not isinstance(obj, BatchSampler):
                state[key] = obj.state_dict()
            elif hasattr(obj, "epoch"):
                state[key] = {"epoch": obj.epoch}
            else:
                continue
            if not in_epoch and hasattr(obj, "next_epoch"):
                # between epochs: the order the sampler's next iteration draws, from its start
                state[key] = {**state[key], "epoch": obj.next_epoch}
                if "offset" in state[key]:
                    state[key]["offset"] = 0
        generator = loader.generator
        if generator is not None:
            if in_epoch and self.generator_start is not None:
                state["generator"] = self.generator_start.tolist()
                state["generator_drawn"] = True  # past the base seed: not drawn again
            else:
                state["generator"] = generator.get_state().tolist()
        if (own := self.sampler_generator()) is not None:
            start = self.sampler_generator_start if in_epoch else None
            state["sampler_generator"] = (own.get_state() if start is None else start).tolist()

    def load(self, state: dict[str, Any]) -> None:
        """Restore the samplers' and generators' states :meth:`save` put into ``state``."""
        for key, obj in zip(("sampler", "batch_sampler"), self.loader._samplers(), strict=True):
            sampler_state = state.get(key)
            if sampler_state is None or isinstance(obj, BatchSampler):
                continue
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict({**sampler_state, "offset": 0}
                                    if "offset" in sampler_state else sampler_state)
            elif hasattr(obj, "set_epoch") and "epoch" in sampler_state:
                obj.set_epoch(sampler_state["epoch"])
        self.loaded_between = bool(state.get("between_epochs"))
        generator, saved = self.loader.generator, state.get("generator")
        if generator is not None and saved is not None:
            generator.set_state(torch.as_tensor(saved, dtype=torch.uint8))
            self._drawn_already = bool(state.get("generator_drawn"))
        own, own_state = self.sampler_generator(), state.get("sampler_generator")
        if own is not None and own_state is not None:
            own.set_state(torch.as_tensor(own_state, dtype=torch.uint8))
