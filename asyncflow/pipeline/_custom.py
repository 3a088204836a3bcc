"""The spec of a stage whose node a feature or a user builds (EXTENDING.md): it names the
node's factory, so it sits with the node's context, above the plain specs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._node import Node, NodeContext
from ._spec import StageSpec

__all__ = ["CustomSpec"]


@dataclass(frozen=True, kw_only=True)
class CustomSpec(StageSpec):
    """A stage whose node is built by ``factory(ctx)`` for each run (see EXTENDING.md)."""

    kind: ClassVar[str] = "custom"
    label: str
    factory: Callable[[NodeContext], Node]
    options: Mapping[str, Any] = field(default_factory=dict)
    concurrency: int = 1
    buffer: int | None = None
    #: Source items behind each output item when it is fixed (1 for a 1:1 stage), which makes
    #: a pipeline ending in it resumable; ``None`` when unknown.
    items_per_output: int | None = None
    #: Whether stages may follow this one (a device transfer must come last).
    terminal: bool = False

    def default_name(self) -> str:
        return self.label

    def settings(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def concurrency_(self) -> int:
        return self.concurrency
