"""How a list of ``n`` items is cut into parts: the one rule behind every split, fresh or
resumed (a pure function of the length, the part and the remainder policy)."""

from __future__ import annotations

from typing import Literal

from .._errors import ConfigError, check_int

__all__ = ["Remainder", "cut", "padding", "part_size"]

Remainder = Literal["pad", "drop"]


def cut(n: int, index: int, count: int, *, remainder: Remainder = "pad") -> list[int]:
    """The positions, out of ``n``, that part ``index`` of ``count`` takes (in order).

    Every part gets ``ceil(n / count)`` positions with ``"pad"`` (the list extended
    cyclically: position ``n + k`` is position ``k``), ``n // count`` with ``"drop"`` (the
    last ``n % count`` positions left out), as torch's ``DistributedSampler`` without and
    with ``drop_last``. An empty list gives every part nothing.

    Raises:
        ConfigError: ``n < 0``, ``count < 1``, ``index`` outside ``[0, count)`` or an
            unknown ``remainder``.
    """
    check_int("n", n, 0)
    check_int("count", count, 1)
    check_int("index", index, 0)
    if index >= count:
        raise ConfigError(f"part index {index} is outside [0, {count - 1}] ({count} parts)")
    if remainder not in ("pad", "drop"):
        raise ConfigError(f"remainder must be 'pad' or 'drop', got {remainder!r}")
    if n == 0:
        return []
    total = part_size(n, count, remainder=remainder) * count
    return [position % n for position in range(index, total, count)]


def part_size(n: int, count: int, *, remainder: Remainder = "pad") -> int:
    """How many positions of ``n`` each of ``count`` parts takes (:func:`cut`'s rule)."""
    return -(-n // count) if remainder == "pad" else n // count


def padding(n: int, count: int, *, remainder: Remainder = "pad") -> int:
    """How many items ``"pad"`` repeats (or ``"drop"`` leaves out) for ``n`` items in
    ``count`` parts: the repeats are positions ``0, 1, ...`` of the list, cyclically."""
    return abs(part_size(n, count, remainder=remainder) * count - n)
