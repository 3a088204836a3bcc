"""Run-wide settings (``RunOptions``) and how a run opens its source (``RunPlan``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import check_int
from ._protocols import ReceiveHook, SourceGate
from ._spec import StageSpec

__all__ = ["RunOptions", "RunPlan"]


@dataclass(frozen=True)
class RunOptions:
    """Pipeline-wide settings of a run (see :class:`~asyncflow.Pipeline`)."""

    name: str = "pipeline"
    max_failures: int | float = 0
    stall_timeout: float | None = None
    report_every: float | None = None
    stop_timeout: float = 2.0
    settings: tuple[tuple[str, Any], ...] = ()
    source_buffer: int | None = None
    notes: tuple[str, ...] = ()
    buffer_bytes: int | None = None
    #: Items between the source and the consumer at most (``Pipeline(window=...)``).
    window: int | None = None

    def __post_init__(self) -> None:
        check_int("window", self.window, allow_none=True)


@dataclass(frozen=True)
class RunPlan:
    """How one run opens: what :meth:`Pipeline.run_plan` returns, in the consumer's thread,
    when the run starts.

    Attributes:
        open_source: Returns the iterable (or async iterable) the run reads, called once on
            the run's loop thread; or a :class:`~asyncflow.pipeline.Merge`, whose inputs the
            run builds as branches of its own graph.
        options: The run's settings.
        receive_hooks: ``item -> item`` functions applied in the consumer's thread to every
            item before it is yielded, before the stages' own receive hooks and the pipeline's
            consumer hooks (``with_hook``).
        stages: The stages the run builds after its source; ``None``: the pipeline's own.
            A feature that runs another pipeline's stages in the same run (a cache fill
            runs upstream's source and stages, then its writer) lists them here.
        gate: Awaited on the run's loop before the source is read: ``False`` ends the
            source at once, never opened (a merge's branches never started). A feature that
            decides on the run's loop whether to read the source at all (a cache fill, which
            may replay after all) holds it here. ``None``: read it at once.
    """

    # A ``Merge`` is one too (called, it refuses to be opened as a plain source).
    open_source: Callable[[], Any]
    options: RunOptions
    receive_hooks: tuple[ReceiveHook, ...] = ()
    stages: tuple[StageSpec, ...] | None = None
    gate: SourceGate | None = None
