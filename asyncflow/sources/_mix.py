"""``asyncflow.mix``: draw items from several pipelines by weight (multi-dataset training)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .._errors import ConfigError

if TYPE_CHECKING:
    from ..pipeline import Pipeline, Run

__all__ = ["mix"]

_STOPS = ("first", "all", "cycle", "never")

T = TypeVar("T")


def _check_weights(weights: Sequence[float] | None, count: int) -> np.ndarray:
    if weights is None:
        return np.full(count, 1.0 / count)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (count,):
        raise ConfigError(f"mix: {count} pipelines need {count} weights, got {list(weights)!r}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(f"mix: weights must be finite, >= 0 and not all 0, got {list(w)!r}")
    return w / w.sum()  # type: ignore[no-any-return]


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
    order; the sources run concurrently, each on its own thread, and are read as picked.

    Args:
        pipelines: The sources; any ``asyncflow.Pipeline`` (apply ``to_device`` to the mix,
            not to its sources).
        weights: Relative weights, one per pipeline (default: equal).
        seed: Seeds the picks.
        stop: When the mix ends:

            - ``"first"`` (default): as soon as any source runs out, so the proportions hold
              to the end;
            - ``"all"``: when every source has run out; exhausted sources drop out and the
              others' weights are renormalized;
            - ``"cycle"``: an exhausted source starts a new epoch of itself, until every
              source has run out at least once;
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
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"mix: seed must be an int, got {seed!r}")
    epochs = itertools.count()

    def open_epoch() -> AsyncIterator[T]:
        rng = np.random.default_rng(np.random.SeedSequence([seed & (2**64 - 1), next(epochs)]))
        return _draw(sources, p_weights, rng, stop)

    return Pipeline(open_epoch, name="mix")


async def _draw(
    sources: list[Pipeline[T]], weights: np.ndarray, rng: np.random.Generator, stop: str
) -> AsyncIterator[T]:
    runs: list[Run[T] | None] = [p.open() for p in sources]
    active = weights.copy()
    ran_out = [False] * len(sources)
    fresh = [True] * len(sources)  # opened and nothing read yet: an empty epoch if it ends
    try:
        while active.sum() > 0:
            i = int(rng.choice(len(sources), p=active / active.sum()))
            run = runs[i]
            assert run is not None
            try:
                item = await run.__anext__()
            except StopAsyncIteration:
                ran_out[i] = True
                if stop == "first" or (stop == "cycle" and all(ran_out)):
                    return
                if stop == "all" or fresh[i]:  # restarting an empty source would spin
                    active[i], runs[i] = 0.0, None
                else:
                    runs[i], fresh[i] = sources[i].open(), True
                continue
            fresh[i] = False
            yield item
    finally:
        for run in runs:
            if run is not None:
                await run.aclose()
