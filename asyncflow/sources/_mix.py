"""``asyncflow.mix``: draw items from several pipelines by weight (multi-dataset training).

The mix is an engine merge (``asyncflow.pipeline.Merge``): its inputs run as branches of the
mix's own run, and :class:`WeightedPicks` is the policy that chooses each item's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .._errors import ConfigError, check_int
from ..pipeline import BranchEnd, Merge
from ..pipeline.seeding import epoch_rng
from ._orders import probabilities

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["WeightedPicks", "mix"]

_STOPS = ("first", "all", "cycle", "never")
_DRAWS = 256  # uniform draws made at a time

T = TypeVar("T")


def _check_weights(weights: Sequence[float] | None, count: int) -> np.ndarray:
    if weights is None:
        return np.full(count, 1.0 / count)
    p = probabilities(weights, "mix: ")  # checked as a WeightedRandomSampler's are
    if p.shape != (count,):
        raise ConfigError(f"mix: {count} pipelines need {count} weights, got {list(weights)!r}")
    return p


@dataclass(frozen=True, eq=False)
class WeightedPicks:
    """The merge policy of :func:`mix`: each pick chooses an input by weight.

    Picks are reproducible: they depend on ``seed`` and the epoch (the merge's run number).
    """

    weights: np.ndarray
    seed: int
    stop: str

    def open(self, epoch: int, branches: int) -> _Picks:
        """The picks of the mix's run number ``epoch``."""
        rng = epoch_rng(self.seed, epoch)
        return _Picks(self.weights.copy(), rng, self.stop)


class _Picks:
    """One epoch's picks: a weighted choice among the inputs not dropped.

    Each pick is ``rng.choice(n, p=active / active.sum())``, computed as that call does (one
    uniform draw searched in the cumulative weights) with the draws made 256 at a time: the
    same picks, at a small fraction of the call's cost.
    """

    def __init__(self, weights: np.ndarray, rng: np.random.Generator, stop: str) -> None:
        self.active = weights
        self.rng = rng
        self.stop = stop
        # A source of weight 0 is never read, so never runs out: for "cycle" it has ended.
        self.ran_out = [bool(w == 0) for w in weights]
        self.cdf: np.ndarray | None = None
        self.draws = np.empty(0)
        self.next = 0

    def choose(self) -> int | None:
        cdf = self.cdf
        if cdf is None:
            total = self.active.sum()
            if total <= 0:
                return None
            cdf = self.cdf = (self.active / total).cumsum()
            cdf /= cdf[-1]
        if self.next >= len(self.draws):
            self.draws, self.next = self.rng.random(_DRAWS), 0
        draw = self.draws[self.next]
        self.next += 1
        return int(cdf.searchsorted(draw, side="right"))

    def ended(self, branch: int, *, empty: bool) -> BranchEnd:
        self.ran_out[branch] = True
        if self.stop == "first" or (self.stop == "cycle" and all(self.ran_out)):
            return "stop"
        if self.stop == "all" or empty:  # restarting an empty input would spin
            self.active[branch] = 0.0
            self.cdf = None
            return "drop"
        return "restart"


def mix(
    pipelines: Sequence[Pipeline[T]],
    weights: Sequence[float] | None = None,
    seed: int = 0,
    *,
    stop: str = "first",
) -> Pipeline[T]:
    """A pipeline whose items are drawn from ``pipelines``, each pick choosing one by weight.

    ``mix([web, books], weights=[0.7, 0.3], seed=0)`` gives about 70% items from ``web``.
    Picks are random but reproducible: they depend on ``seed`` and the epoch (each iteration
    of the returned pipeline is a new epoch, with new picks). Each source keeps its own
    order. The sources run concurrently as branches of the mix's own run (one loop, one
    pool of worker threads), and are read as picked; ``stats()`` names their stages after
    the source (``web/source``, ``web/decode``) and the picking stage ``mix``.

    Args:
        pipelines: The sources; any ``asyncflow.Pipeline`` (apply ``to_device`` and
            ``progress`` to the mix, not to its sources: a source's consumer hooks do not
            run). Name them (``Pipeline(..., name="web")``) to name their stages in stats.
        weights: Relative weights, one per pipeline (default: equal).
        seed: Seeds the picks.
        stop: When the mix ends:

            - ``"first"`` (default): as soon as any source runs out, so the proportions hold
              to the end;
            - ``"all"``: when every source has run out; exhausted sources drop out and the
              others' weights are renormalized;
            - ``"cycle"``: an exhausted source starts a new epoch of itself (in the same
              run), until every source has run out at least once;
            - ``"never"``: exhausted sources always restart; the mix never ends.

    Raises:
        ConfigError: No pipelines, weights that do not match, or an unknown ``stop``.
    """
    from ..pipeline import Pipeline

    sources = list(pipelines)
    if not sources:
        raise ConfigError("mix needs at least one pipeline")
    for p in sources:
        if not isinstance(p, Pipeline):
            raise ConfigError(f"mix takes asyncflow pipelines, got {type(p).__name__}")
    p_weights = _check_weights(weights, len(sources))
    if stop not in _STOPS:
        raise ConfigError(f"mix: stop must be one of {_STOPS}, got {stop!r}")
    check_int("mix: seed", seed, None)
    policy = WeightedPicks(weights=p_weights, seed=seed, stop=stop)
    return Pipeline(Merge(sources, policy, name="mix"), name="mix")
