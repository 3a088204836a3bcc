"""The spec of a stage whose node a feature or a user builds (EXTENDING.md): it names the
node's factory, so it sits with the node's context, above the plain specs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._errors import ConfigError
from ._node import Node, NodeContext, node_for
from ._spec import StageSpec
from ._traits import StageTraits

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
    #: What the stage is, for the code around its node (``StageTraits``): nothing assumed
    #: by default (its calls on the run's threads).
    traits: StageTraits = StageTraits()  # noqa: RUF009 (frozen: sharing it is safe)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.traits, StageTraits):
            raise ConfigError(f"traits must be a StageTraits, got {self.traits!r}")

    def default_name(self) -> str:
        return self.label

    def settings(self) -> dict[str, Any]:
        return dict(self.options)


@node_for(CustomSpec)
def _custom_node(ctx: NodeContext, spec: CustomSpec) -> Node:
    return spec.factory(ctx)
