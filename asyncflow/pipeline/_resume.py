"""Resume arithmetic: how many source items lie behind each output, and a run's position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import ConfigError
from ._spec import BatchSpec, CustomSpec, MapSpec, PrefetchSpec, StageSpec

__all__ = ["items_per_output", "load_state", "state_of"]


def items_per_output(stages: Sequence[StageSpec], max_failures: int | float) -> int:
    """Source items behind each output item, when the stages make that a constant.

    Raises:
        ConfigError: A stage makes the count ambiguous.
    """
    factor = 1
    for spec in stages:
        budget = getattr(spec, "max_failures", None)
        budget = max_failures if budget is None else budget
        if isinstance(spec, MapSpec) and spec.mode == "map" and spec.ordered and not budget:
            continue
        if isinstance(spec, BatchSpec):
            factor *= spec.size
            continue
        if isinstance(spec, PrefetchSpec):
            continue
        if isinstance(spec, CustomSpec) and spec.items_per_output is not None:
            factor *= spec.items_per_output
            continue
        raise ConfigError(
            f"this pipeline cannot be resumed: stage {spec.name or spec.default_name()!r} "
            f"({spec.kind}) does not map source items to outputs in a fixed, ordered way "
            "(resumable pipelines use ordered maps with max_failures=0, batch and prefetch)"
        )
    return factor


def state_of(
    source: Any, stages: Sequence[StageSpec], max_failures: int | float, last: Any
) -> dict[str, Any]:
    """The sampler ``source``'s state, with ``offset`` counting the source items behind what
    the consumer of the latest run ``last`` (a ``Runtime``, or ``None``) has received."""
    if not callable(getattr(source, "state_dict", None)):
        raise ConfigError(
            f"state_dict() needs a sampler source (with state_dict/load_state_dict); "
            f"this pipeline reads a {type(source).__name__}"
        )
    factor = items_per_output(stages, max_failures)
    state = dict(source.state_dict())
    if last is not None:
        run = last.consumer() if last.consumer is not None else None
        delivered = run.delivered if run is not None else last.delivered
        state["offset"] = min(len(source), last.start_offset + delivered * factor)
    return state


def load_state(
    source: Any, stages: Sequence[StageSpec], max_failures: int | float, state: dict[str, Any]
) -> int:
    """Load ``state`` into the sampler ``source``; returns the offset to resume from."""
    if not callable(getattr(source, "load_state_dict", None)):
        raise ConfigError(
            f"load_state_dict() needs a sampler source; this pipeline reads a "
            f"{type(source).__name__}"
        )
    items_per_output(stages, max_failures)
    source.load_state_dict(state)
    return int(state.get("offset", 0))
