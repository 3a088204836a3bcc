"""What one cached item looks like: its structure (tuples, lists, dicts) and its fields.

A *field* is one leaf of the structure: a tensor, a numpy array or a number, with a fixed
dtype and shape. An item is flattened into its fields when written and rebuilt from them when
replayed, so a replayed item has the structure, types and shapes of the one that was cached.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _tree
from .._errors import ConfigError

__all__ = ["Field", "Schema", "as_array", "flatten"]

# Structure nodes, as stored in the manifest: {"field": i}, {"tuple": [...]}, {"list": [...]},
# {"dict": [[key, node], ...]} (a list of pairs keeps the key order).
Node = dict[str, Any]

_NUMBER_KINDS = {bool: "bool", int: "int", float: "float"}
_NUMBER_DTYPES = {"bool": "bool", "int": "int64", "float": "float64"}


@dataclass(frozen=True)
class Field:
    """One leaf of a cached item.

    Attributes:
        name: Where the leaf sits in the item, written as Python would index it
            (``item[0]``, ``item['image']``); ``item`` for an item that is one leaf.
        kind: ``tensor``, ``ndarray``, ``scalar`` (a numpy scalar) or ``bool``/``int``/
            ``float`` (a Python number).
        dtype: The numpy dtype name (``uint8``, ``float32``...).
        shape: The shape of one sample (without the batch dimension).
        device: For tensors, the device they came from (replayed tensors go back to it).
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    device: str = "cpu"

    @functools.cached_property
    def sample_bytes(self) -> int:
        """Bytes one sample of this field takes."""
        return np.dtype(self.dtype).itemsize * math.prod(self.shape)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Field:
        """The field a manifest holds (``dataclasses.asdict(field)``, as JSON)."""
        return cls(name=str(data["name"]), kind=str(data["kind"]), dtype=str(data["dtype"]),
                   shape=tuple(int(n) for n in data["shape"]),
                   device=str(data.get("device", "cpu")))


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is imported
    return torch is not None and isinstance(value, torch.Tensor)


def flatten(item: Any, name: str = "item") -> tuple[Node, list[tuple[str, Any]]]:
    """Split ``item`` into its structure and its ``(name, leaf)`` pairs, in a fixed order
    (``asyncflow/_tree.py`` walks it, as it walks batches for ``to_device``; a replay
    rebuilds items with ``_tree.Tree.from_json(structure).unflatten(leaves)``).

    Raises:
        ConfigError: A dict key is not a string.
    """
    tree, leaves = _tree.flatten(item)
    return tree.to_json(name), list(zip(tree.names(name), leaves, strict=True))


def as_array(value: Any) -> np.ndarray:
    """The leaf's data as a numpy array on the CPU (a view where it already is one)."""
    if _is_tensor(value):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return tensor.numpy()  # type: ignore[no-any-return]
    return np.asarray(value)


def _tensor_dtype(name: str, tensor: Any) -> str:
    import torch

    try:
        return str(torch.empty((), dtype=tensor.dtype).numpy().dtype)
    except TypeError:  # bfloat16 and other types numpy lacks
        raise ConfigError(
            f"{name} is a {tensor.dtype} tensor, which numpy cannot hold; convert it (e.g. to "
            "float32) before .cache()"
        ) from None


def _describe_leaf(name: str, value: Any, *, batched: bool) -> Field:
    if _is_tensor(value):
        dtype, shape = _tensor_dtype(name, value), tuple(value.shape)
        kind, device = "tensor", str(value.device)
    elif isinstance(value, np.ndarray):
        kind, dtype, shape, device = "ndarray", str(value.dtype), value.shape, "cpu"
    elif isinstance(value, np.generic) and not batched:
        kind, dtype, shape, device = "scalar", str(value.dtype), (), "cpu"
    elif type(value) in _NUMBER_KINDS and not batched:
        kind = _NUMBER_KINDS[type(value)]
        dtype, shape, device = _NUMBER_DTYPES[kind], (), "cpu"
    else:
        what = "batched item" if batched else "item"
        raise ConfigError(
            f"the cache stores tensors, numpy arrays and numbers; {name} of the {what} is "
            f"{type(value).__name__}: {value!r:.60}. Drop or convert it with .map() before "
            ".cache()" + (" (in a batch, every field must be an array with a batch dimension)"
                          if batched else "")
        )
    if np.dtype(value.dtype if kind in ("ndarray", "scalar") else dtype).names is not None:
        raise ConfigError(f"{name} has dtype {dtype}, a structured one; the cache stores "
                          "plain dtypes only: store each of its fields as an array of its own")
    if np.dtype(dtype).hasobject:
        raise ConfigError(f"{name} has dtype {dtype}; the cache stores numeric arrays only")
    if batched:
        if not shape:
            raise ConfigError(
                f"{name} of the batch has no batch dimension (shape ()); pass batched=False "
                "to cache single items"
            )
        shape = shape[1:]
    return Field(name=name, kind=kind, dtype=dtype, shape=tuple(int(n) for n in shape),
                 device=device)


@dataclass(frozen=True)
class Schema:
    """The structure and fields every cached item must share."""

    structure: Node
    fields: tuple[Field, ...]

    @classmethod
    def of(cls, item: Any, *, batched: bool) -> Schema:
        """The schema of ``item`` (one batch when ``batched``, else one sample)."""
        structure, leaves = flatten(item)
        if not leaves:
            raise ConfigError("the item holds no tensor, array or number to cache")
        fields = tuple(_describe_leaf(name, v, batched=batched) for name, v in leaves)
        return cls(structure, fields)

    def arrays(self, item: Any, *, batched: bool, index: int) -> tuple[list[np.ndarray], int]:
        """The fields of ``item`` as CPU arrays, and how many samples it holds.

        Raises:
            ConfigError: ``item`` differs from the schema: another structure, dtype or shape
                (the cache stores fixed shapes only), or fields with different batch sizes.
        """
        structure, leaves = flatten(item)
        if structure != self.structure:
            raise ConfigError(
                f"item {index} has another structure than the first item: "
                f"{_shape_text(structure)} vs {_shape_text(self.structure)}"
            )
        arrays, count = [], None
        for spec, (name, value) in zip(self.fields, leaves, strict=True):
            array = as_array(value)
            shape = array.shape[1:] if batched else array.shape
            if str(array.dtype) != spec.dtype:
                raise ConfigError(
                    f"{name} changed dtype from {spec.dtype} to {array.dtype} at item {index}; "
                    "the cache stores one dtype per field"
                )
            if batched and array.ndim == 0:
                raise ConfigError(f"{name} of item {index} has no batch dimension (shape ())")
            if shape != spec.shape:
                raise ConfigError(
                    f"{name} changed shape from {spec.shape} to {shape} at item {index}: the "
                    "cache stores fixed-shape samples only. Resize or crop to one size "
                    "before .cache() (for images, e.g. image.folder(..., size=224))"
                )
            if batched:
                if count is not None and array.shape[0] != count:
                    raise ConfigError(
                        f"item {index}: {name} holds {array.shape[0]} samples but "
                        f"{self.fields[0].name} holds {count}; every field of a batch needs "
                        "the same batch size"
                    )
                count = array.shape[0]
            arrays.append(array)
        return arrays, (count if batched else 1) or 0


def _shape_text(node: Node) -> str:
    if "field" in node:
        return "leaf"
    if "dict" in node:
        return "{" + ", ".join(f"{k!r}: {_shape_text(n)}" for k, n in node["dict"]) + "}"
    kind = "tuple" if "tuple" in node else "list"
    inner = ", ".join(_shape_text(n) for n in node[kind])
    return f"({inner})" if kind == "tuple" else f"[{inner}]"
