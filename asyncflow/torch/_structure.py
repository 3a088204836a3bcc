"""Take a batch apart into its tensors and put it back together.

A batch is a tensor, or a dict / list / tuple / namedtuple nesting them; anything else (ints,
strings, NumPy arrays, ``None``) is carried through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["flatten", "map_tensors"]

Rebuild = Callable[[list[torch.Tensor]], Any]


def flatten(batch: Any) -> tuple[list[torch.Tensor], Rebuild]:
    """The tensors of ``batch`` in a fixed order, and a function that rebuilds it from new ones.

    ``rebuild(flatten(batch)[0])`` equals ``batch``; dict subclasses, list subclasses and
    namedtuples keep their type where their constructor allows it.
    """
    leaves: list[torch.Tensor] = []
    build = _walk(batch, leaves)
    return leaves, lambda new: build(iter(new))


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with every tensor replaced by ``fn(tensor)``."""
    leaves, rebuild = flatten(batch)
    return rebuild([fn(t) for t in leaves])


def _walk(obj: Any, leaves: list[torch.Tensor]) -> Callable[[Any], Any]:
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return next
    if isinstance(obj, Mapping):
        parts = [(key, _walk(value, leaves)) for key, value in obj.items()]
        return lambda it: _remake_mapping(obj, {key: part(it) for key, part in parts})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        tuple_parts = [_walk(value, leaves) for value in obj]
        return lambda it: type(obj)(*(part(it) for part in tuple_parts))
    if isinstance(obj, list | tuple):
        seq_parts = [_walk(value, leaves) for value in obj]
        return lambda it: _remake_sequence(obj, [part(it) for part in seq_parts])
    return lambda it: obj


def _remake_mapping(original: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    if type(original) is dict:
        return items
    try:
        return type(original)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


def _remake_sequence(original: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    if type(original) in (list, tuple):
        return type(original)(items)
    try:
        return type(original)(items)
    except TypeError:
        return items if isinstance(original, list) else tuple(items)
