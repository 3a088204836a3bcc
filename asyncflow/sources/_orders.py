"""The orders behind the samplers (NumPy arrays drawn from ``(seed, epoch)`` by
:func:`~asyncflow.pipeline.seeding.epoch_rng`, read in chunks),
and the checks of what defines them: the dataset or length, counts, the seed and the weights.

An order is a stream of *blocks* (``int64`` arrays, or ``range`` objects): one block for most
samplers, one permutation per block when a :class:`~asyncflow.RandomSampler` draws more indices
than the dataset holds. Blocks are drawn only when the stream reaches them, and
:func:`flatten` turns them into Python ints a chunk at a time, so that a ten-million-index
epoch costs one 80 MB array, not a list of ten million ints.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from .._errors import ConfigError, ConfigTypeError, check_int
from ..pipeline.seeding import epoch_rng, fresh_seed
from ..ranks import part_size
from ._randperm import torch_randperm

__all__ = [
    "Block",
    "check_num_samples",
    "check_seed",
    "check_source",
    "distributed_blocks",
    "flatten",
    "probabilities",
    "random_blocks",
    "read_length",
    "skip",
    "weighted_blocks",
]

Block: TypeAlias = "npt.NDArray[np.int64] | range"

# Indices turned into Python ints at a time: big enough that ``tolist`` dominates the loop,
# small enough (32 KiB of pointers) that a first index comes at once.
_CHUNK = 4096


def check_source(source: Sized | int) -> Sized | int:
    """``source`` itself, once it is known to be a dataset (``__len__``) or a length >= 0.

    Raises:
        ConfigTypeError: ``source`` is neither an int nor sized.
        ConfigError: ``source`` is a negative int.
    """
    if isinstance(source, bool) or not isinstance(source, int | Sized):
        raise ConfigTypeError(
            f"expected a dataset with __len__ or an int length, got {type(source).__name__}"
        )
    if isinstance(source, int) and source < 0:
        raise ConfigError(f"a dataset length must be >= 0, got {source}")
    return source


def check_num_samples(num_samples: Any) -> int:
    """``num_samples``, a positive int, checked with torch's message."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
        raise ConfigError(
            f"num_samples should be a positive integer value, but got num_samples={num_samples}"
        )
    return num_samples


def check_seed(seed: int | None) -> int:
    """``seed``, or a fresh random one for ``None``."""
    return fresh_seed() if seed is None else check_int("seed", seed, None, allow_none=True)


def probabilities(weights: Any, who: str = "") -> npt.NDArray[np.float64]:
    """``weights`` as probabilities, checked as torch checks them (and more: see
    :class:`~asyncflow.WeightedRandomSampler`); an error's message starts with ``who``
    (``"mix: "``), where given."""
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigTypeError(
            f"{who}weights should be a 1d sequence of numbers, got {type(weights).__name__}"
        ) from exc
    if w.ndim != 1:
        raise ConfigError(
            f"{who}weights should be a 1d sequence but given weights have shape "
            f"{tuple(w.shape)}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
        raise ConfigError(f"{who}weights must be finite, >= 0, and not all zero")
    if w.max() > np.finfo(np.float64).max / len(w):  # their sum would overflow to inf
        w = w / w.max()
    p: npt.NDArray[np.float64] = w / w.sum()
    return p


def read_length(source: Sized | int) -> int:
    """The length now: a dataset's ``len()``, read on every call, or the fixed int."""
    return source if isinstance(source, int) else len(source)


def random_blocks(
    n: int, num_samples: int, *, seed: int, epoch: int, replacement: bool
) -> Iterator[Block]:
    """``num_samples`` indices of ``range(n)``: uniform draws, or whole permutations in turn."""
    rng = epoch_rng(seed, epoch)
    if replacement:
        yield rng.integers(0, n, size=num_samples, dtype=np.int64)
        return
    for start in range(0, num_samples, n):
        yield rng.permutation(n)[: num_samples - start]


def weighted_blocks(
    p: npt.NDArray[np.float64], num_samples: int, *, seed: int, epoch: int, replacement: bool
) -> Iterator[Block]:
    """``num_samples`` indices drawn with probabilities ``p``."""
    drawn = epoch_rng(seed, epoch).choice(len(p), size=num_samples, replace=replacement, p=p)
    yield drawn.astype(np.int64, copy=False)


def distributed_blocks(
    n: int, rank: int, num_replicas: int, *, seed: int, epoch: int | None, drop_last: bool
) -> Iterator[Block]:
    """``rank``'s share, as torch's DistributedSampler takes it: the order (torch's
    ``randperm(n)`` from a generator seeded with ``seed + epoch``, or ``0 .. n-1`` when
    ``epoch`` is ``None``) padded cyclically to a multiple of ``num_replicas`` (or cut, with
    ``drop_last``), then every ``num_replicas``-th index from ``rank``."""
    # torch's rule is asyncflow.cut's: ceil(n / replicas) padded, n // replicas dropped
    total = part_size(n, num_replicas, remainder="drop" if drop_last else "pad") * num_replicas
    order = np.arange(n, dtype=np.int64) if epoch is None else torch_randperm(n, seed + epoch)
    order = order[:total] if total <= n else np.resize(order, total)
    yield order[rank:total:num_replicas]


def skip(blocks: Iterable[Block], count: int) -> Iterator[Block]:
    """The blocks without their first ``count`` indices; skipped blocks are still drawn, so
    that the random stream behind the later ones stays the same."""
    for block in blocks:
        if count < len(block):
            yield block[count:]
        count = max(0, count - len(block))
        del block  # not held while the next permutation is drawn: one array at a time


def _chunks(blocks: Iterable[Block]) -> Iterator[Iterable[int]]:
    for block in blocks:
        if isinstance(block, range):
            yield block
            continue
        for start in range(0, len(block), _CHUNK):
            yield block[start : start + _CHUNK].tolist()
        del block  # as in skip()


def flatten(blocks: Iterable[Block]) -> Iterator[int]:
    """Every index of ``blocks`` as a Python int, converted a chunk at a time."""
    return itertools.chain.from_iterable(_chunks(blocks))
