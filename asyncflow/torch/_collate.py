"""Collate functions: torch's ``default_collate``, and padding for variable-length fields; in
a DataLoader's worker processes, torch's tensor collate stacking into asyncflow's segments."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import collate as torch_collate

from .._errors import check_int
from ..pipeline.shm import allocate
from ._reducers import plain_cpu

__all__ = ["Padded", "collate_in_segments", "default_collate", "pad_collate"]

_torch_collate_tensor = torch_collate.collate_tensor_fn


def _collate_tensor(batch: Sequence[torch.Tensor], *,
                    collate_fn_map: dict[Any, Callable[..., Any]] | None = None) -> torch.Tensor:
    """torch's ``collate_tensor_fn``, stacking a batch of dense CPU tensors into a segment of
    this worker process (:func:`asyncflow.pipeline.shm.allocate`) that goes to the parent by
    name. torch's own stacks into shared memory of torch's, which the result's pickling would
    copy once more; anything else, or no segment to be had, goes to torch's."""
    elem = batch[0]
    numel = elem.numel()
    # tensors of unequal sizes go to torch's too, which says what is wrong
    if plain_cpu(elem) and numel > 0 and all(x.numel() == numel for x in batch):
        buffer = allocate(len(batch) * numel * elem.element_size())
        if buffer is not None:
            out = torch.frombuffer(buffer, dtype=torch.uint8).view(elem.dtype)
            return torch.stack(list(batch), 0, out=out.view(len(batch), *elem.shape))
    return _torch_collate_tensor(batch, collate_fn_map=collate_fn_map)  # type: ignore[no-any-return]


def collate_in_segments() -> None:
    """In a DataLoader's worker process: make torch's collate (``default_collate``, and a
    ``collate_fn`` that calls it) stack tensors into asyncflow's segments, where torch's
    would stack them into torch's shared memory (a copy each batch saved)."""
    torch_collate.default_collate_fn_map[torch.Tensor] = _collate_tensor


class Padded(NamedTuple):
    """A variable-length field of a batch, padded along its first dimension.

    Attributes:
        values: ``(batch, longest, *rest)``, each sample's data first, then padding.
        lengths: ``(batch,)`` int64, each sample's true length.
        mask: ``(batch, longest)`` bool, ``True`` over real data; ``None`` unless asked for.
    """

    values: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor | None = None


def _as_tensor(value: Any, where: str) -> torch.Tensor:
    try:
        return torch.as_tensor(value)  # a tensor (a subclass too) is returned as it is
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{where}: cannot pad a {type(value).__name__}") from exc


def _pad(
    values: Sequence[Any], where: str, pad_value: float, multiple_of: int, mask: bool
) -> Padded:
    tensors = [_as_tensor(v, where) for v in values]
    if any(t.dim() == 0 for t in tensors):
        raise TypeError(f"{where}: cannot pad a 0-dimensional value")
    rest = tensors[0].shape[1:]
    for t in tensors:
        if t.shape[1:] != rest:
            raise ValueError(
                f"{where}: only the first dimension may vary, got {tuple(tensors[0].shape)} "
                f"and {tuple(t.shape)}"
            )
    lengths = torch.tensor([t.shape[0] for t in tensors], dtype=torch.int64)
    longest = int(lengths.max()) if tensors else 0
    longest = -(-longest // multiple_of) * multiple_of
    # the samples' common dtype, as default_collate's stack promotes them (an int sample
    # first must not truncate a float one)
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    out = torch.full((len(tensors), longest, *rest), pad_value, dtype=dtype)
    for row, t in zip(out, tensors, strict=True):
        row[: t.shape[0]].copy_(t)
    keep = torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1) if mask else None
    return Padded(out, lengths, keep)


def _is_sequence_like(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray) and value.ndim >= 1


def pad_collate(
    batch: Sequence[Any],
    *,
    fields: Collection[str | int] | None = None,
    pad_value: float = 0,
    multiple_of: int = 1,
    mask: bool = False,
    collate: Callable[[list[Any]], Any] = default_collate,
) -> Any:
    """Collate samples whose fields differ in length, padding them to the longest in the batch.

    Use it as ``collate_fn=functools.partial(pad_collate, fields=["tokens"], mask=True)``.

    - Samples that are dicts give a dict. Each padded field ``f`` becomes a
      ``(batch, longest, ...)`` tensor, with ``f + "_lengths"`` (int64, ``(batch,)``) beside
      it and, with ``mask=True``, ``f + "_mask"`` (bool, ``(batch, longest)``).
    - Samples that are namedtuples give that namedtuple; tuples and lists give a list (as
      ``default_collate`` does), each padded field becoming a :class:`Padded`
      ``(values, lengths, mask)``.
    - Samples that are themselves tensors or arrays give one :class:`Padded`.

    Other fields go through ``collate`` (torch's ``default_collate`` by default).

    Args:
        batch: The samples.
        fields: Keys (dict samples) or positions (tuple samples) to pad. ``None`` pads every
            field holding a tensor or NumPy array of one or more dimensions. Name fields
            explicitly to pad lists of numbers or to leave fixed-size arrays to ``collate``.
        pad_value: The fill for padding positions.
        multiple_of: Round the padded length up to a multiple of this (for kernels that like
            lengths divisible by 8, say).
        mask: Also return a boolean mask of the real positions.
        collate: How the fields that are not padded are collated.

    Raises:
        ValueError: Samples of one field differ in a dimension other than the first, or a
            padded key's ``_lengths`` / ``_mask`` name is already taken.
        TypeError: A field named in ``fields`` holds something that cannot become a tensor.
    """
    check_int("multiple_of", multiple_of, 1)
    samples = list(batch)
    if not samples:
        return collate(samples)
    first = samples[0]

    def wanted(key: str | int, value: Any) -> bool:
        return key in fields if fields is not None else _is_sequence_like(value)

    def pad(key: str | int) -> Padded:
        return _pad([s[key] for s in samples], f"field {key!r}", pad_value, multiple_of, mask)

    if isinstance(first, Mapping):
        out: dict[Any, Any] = {}
        for key, value in first.items():
            if not wanted(key, value):
                out[key] = collate([s[key] for s in samples])
                continue
            padded = pad(key)
            extra: dict[str, torch.Tensor | None] = {f"{key}_lengths": padded.lengths}
            if mask:
                extra[f"{key}_mask"] = padded.mask
            for name in extra:
                if name in first:
                    raise ValueError(f"pad_collate would overwrite the sample's own {name!r}")
            out[key] = padded.values
            out.update(extra)
        return out
    if isinstance(first, tuple | list):
        columns = [
            pad(i) if wanted(i, value) else collate([s[i] for s in samples])
            for i, value in enumerate(first)
        ]
        if isinstance(first, tuple) and hasattr(first, "_fields"):
            return type(first)(*columns)
        return columns  # torch's default_collate also gives a list for tuple samples
    if _is_sequence_like(first):
        return _pad(samples, "samples", pad_value, multiple_of, mask)
    return collate(samples)
