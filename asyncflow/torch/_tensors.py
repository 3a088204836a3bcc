"""Take a batch apart into its tensors and put it back together.

A batch is a tensor, or a dict / list / tuple / namedtuple nesting them; anything else (ints,
strings, NumPy arrays, ``None``) is carried through untouched. The walking is
``asyncflow/_tree.py``'s, which the cache's schema shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _tree

__all__ = ["flatten"]

Rebuild = Callable[[list[torch.Tensor]], Any]


def flatten(batch: Any) -> tuple[list[torch.Tensor], Rebuild]:
    """The tensors of ``batch`` in a fixed order, and a function that rebuilds it from new ones.

    ``rebuild(flatten(batch)[0])`` equals ``batch``; dict subclasses, list subclasses and
    namedtuples keep their type where their constructor allows it.
    """
    tree, leaves = _tree.flatten(batch, is_leaf=_is_tensor)
    return leaves, tree.unflatten


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)
