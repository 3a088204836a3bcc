"""Take a nested value apart into its leaves and put it back together: the one structure
walker behind ``asyncflow.torch`` (a batch's tensors, moved to a device) and ``asyncflow.cache``
(an item's fields, and the structure its manifest stores).

A *container* is a tuple (namedtuples included), a list or a mapping, nested to any depth,
subclasses included; anything else is a *leaf* when the caller's ``is_leaf`` says so and a
*constant* otherwise (carried through untouched: a label string next to the tensors).
:func:`flatten` gives the leaves in a fixed order (depth first; a mapping's in its key order)
and a :class:`Tree`, the structure without them, which :meth:`Tree.unflatten` fills with new
leaves, keeping each container's type where its constructor allows it.

Why not torch's pytree or optree: torch 2.13 has no public pytree (``torch.utils._pytree`` is
private), optree is not a dependency, the cache must work without torch, and neither takes
apart any ``Mapping`` or names a leaf the way the cache's messages do (``item['image'][0]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from ._errors import ConfigError

__all__ = ["Tree", "flatten"]

Kind = Literal["leaf", "constant", "tuple", "list", "dict"]
_CONTAINERS = ("tuple", "list", "dict")


class Tree:
    """The structure of a nested value, without its leaves (treat it as immutable).

    Attributes:
        kind: ``leaf``, ``constant``, or the container's kind: ``tuple``, ``list``, ``dict``.
        children: A container's parts, in order.
        keys: A ``dict``'s keys, in order (a tuple's or list's are its indices).
        own: The container's own type, when it is not the plain kind (a namedtuple, an
            ``OrderedDict``); ``None`` rebuilds the plain one.
        value: A constant's value.
    """

    # A plain class with slots, not a frozen dataclass: a batch's tree is built for every
    # batch, and a frozen dataclass's __init__ costs twice as much.
    __slots__ = ("children", "keys", "kind", "own", "value")

    def __init__(self, kind: Kind, children: tuple[Tree, ...] = (), keys: tuple[Any, ...] = (),
                 own: type | None = None, value: Any = None) -> None:
        self.kind, self.children, self.keys, self.own, self.value = (
            kind, children, keys, own, value
        )

    def __repr__(self) -> str:
        return f"Tree({self.kind!r}, {len(self.children)} children)"

    def unflatten(self, leaves: Iterable[Any]) -> Any:
        """The value again, with ``leaves`` (in :func:`flatten`'s order) in place of its own."""
        return self._build(iter(leaves))

    def _build(self, leaves: Iterator[Any]) -> Any:
        if self.kind == "leaf":
            return next(leaves)
        if self.kind == "constant":
            return self.value
        items = [child._build(leaves) for child in self.children]
        plain: Any = (dict(zip(self.keys, items, strict=True)) if self.kind == "dict"
                      else tuple(items) if self.kind == "tuple" else items)
        if self.own is None:
            return plain
        try:  # a namedtuple takes its fields one by one, other types the plain container
            named = self.kind != "dict" and hasattr(self.own, "_fields")
            return self.own(*items) if named else self.own(plain)
        except TypeError:  # a type its constructor cannot remake: the plain container
            return plain

    def names(self, root: str) -> list[str]:
        """Each leaf's place, written as Python would index it: ``root[0]['image']``."""
        found: list[str] = []
        self._names(root, found)
        return found

    def _names(self, where: str, found: list[str]) -> None:
        if self.kind == "leaf":
            found.append(where)
        keys = self.keys if self.kind == "dict" else range(len(self.children))
        for key, child in zip(keys, self.children, strict=True):
            child._names(f"{where}[{key!r}]", found)

    def to_json(self, root: str = "item") -> dict[str, Any]:
        """The structure as JSON, leaves numbered in order: ``{"field": i}``, ``{"tuple":
        [...]}``, ``{"list": [...]}``, ``{"dict": [[key, node], ...]}`` (pairs keep the key
        order). Container types other than the plain ones are not kept.

        Raises:
            ConfigError: A dict key is not a string, or the value holds a constant.
        """
        return self._json(root, [0])

    def _json(self, where: str, count: list[int]) -> dict[str, Any]:
        if self.kind == "leaf":
            count[0] += 1
            return {"field": count[0] - 1}
        if self.kind == "constant":
            raise ConfigError(f"{where} is {self.value!r:.60}, which JSON cannot describe")
        if self.kind != "dict":
            return {self.kind: [c._json(f"{where}[{i}]", count)
                                for i, c in enumerate(self.children)]}
        pairs = []
        for key, child in zip(self.keys, self.children, strict=True):
            if not isinstance(key, str):
                raise ConfigError(
                    f"{where} has the key {key!r}: a stored structure needs string dict keys"
                )
            pairs.append([key, child._json(f"{where}[{key!r}]", count)])
        return {"dict": pairs}

    @classmethod
    def from_json(cls, node: Mapping[str, Any]) -> Tree:
        """The tree :meth:`to_json` wrote (plain container types)."""
        if "field" in node:
            return _LEAF
        if "dict" in node:
            pairs = node["dict"]
            return cls("dict", tuple(cls.from_json(n) for _, n in pairs),
                       tuple(key for key, _ in pairs))
        kind: Kind = "tuple" if "tuple" in node else "list"
        return cls(kind, tuple(cls.from_json(n) for n in node[kind]))


_LEAF = Tree("leaf")


def flatten(value: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> tuple[Tree, list[Any]]:
    """``value``'s structure and its leaves, in a fixed order.

    Args:
        value: The nested value.
        is_leaf: Which values are leaves, asked first (so it must say ``False`` of
            containers); other non-containers are constants, kept in the tree. ``None``: every
            non-container is a leaf.
    """
    leaves: list[Any] = []
    return _walk(value, is_leaf, leaves), leaves


def _walk(value: Any, is_leaf: Callable[[Any], bool] | None, leaves: list[Any]) -> Tree:
    if is_leaf is not None and is_leaf(value):
        leaves.append(value)
        return _LEAF
    if isinstance(value, tuple | list):
        kind: Kind = "tuple" if isinstance(value, tuple) else "list"
        sequence: type | None = None if type(value) in (tuple, list) else type(value)
        return Tree(kind, tuple([_walk(v, is_leaf, leaves) for v in value]), own=sequence)
    if isinstance(value, Mapping):
        children = tuple([_walk(v, is_leaf, leaves) for v in value.values()])
        mapping: type | None = None if type(value) is dict else type(value)
        return Tree("dict", children, tuple(value.keys()), mapping)
    if is_leaf is None:
        leaves.append(value)
        return _LEAF
    return Tree("constant", value=value)

