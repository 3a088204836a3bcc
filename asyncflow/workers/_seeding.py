"""Every random stream in asyncflow, derived from ``(seed, epoch[, item])`` in one place.

A stream is named by its *key*: the user's base seed (any int, taken modulo 2**64), the epoch
and, for per-item streams, the item's position in its epoch. The key alone fixes the stream,
whichever thread, worker process or machine draws from it, and in whatever order items are
taken. Each function below turns a key into the object a caller draws from:

========================  =============================  =========================================
function                  returns                        used by
========================  =============================  =========================================
:func:`epoch_rng`         ``numpy.random.Generator``     sampler orders, ``mix``, a cache's
                          (``SeedSequence([seed, e])``)  shuffled replay, ``image.folder``'s order
:func:`epoch_random`      ``random.Random``              ``Pipeline.shuffle``'s buffer
:func:`epoch_seed`        a 63-bit int                   ``DataLoader(shuffle=True)``'s
                                                         ``torch.Generator`` (no ``generator=``)
:func:`item_seed`         a 63-bit int                   process workers: the global generators
                                                         before each item (:func:`seed_everything`)
:func:`item_random`       ``random.Random``              random crops and flips
:func:`fresh_seed`        a 63-bit int                   a base seed when the user gave none
========================  =============================  =========================================

**Seed keys that follow the item.** A pipeline numbers its items by their position in its own
epoch, which is the item's place in the epoch only when the pipeline reads the whole source. A
source that deals out a share of a list (:class:`asyncflow.Split`) gives each item's key
itself: the iterator it returns has a ``seed_key(i)`` method (:class:`KeyedIterator`), the key
of its ``i``-th item (its index in the whole list), and the engine seeds process workers from
that key instead of the position. So an item draws the same stream on any rank, under any
world size, before and after an elastic resume, and two ranks' items never share a stream.
Sources without the method are keyed by position, as before.

The forms differ because their consumers do (NumPy takes a ``SeedSequence``; ``random`` and
torch take an int), and each keeps the numbers it gave before this module existed, so that
orders, crops and checkpoints stay reproducible across versions. torch's own seeding
(``DataLoader``'s base seed drawn from its generator, ``base_seed + worker_id``) stays
torch's: ``asyncflow.torch`` follows it as torch does.

The standard library and NumPy (imported on first use: ``import asyncflow`` stays light)
only: no torch import. Public as ``asyncflow.pipeline.seeding``; it lives below the engine, in
``asyncflow.workers``, because worker processes draw their per-item seeds from it.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import struct
import sys
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "SEED_MASK",
    "KeyedIterator",
    "epoch_random",
    "epoch_rng",
    "epoch_seed",
    "fresh_seed",
    "item_random",
    "item_seed",
    "seed_everything",
]

#: A key's seed is taken modulo 2**64 (``seed & SEED_MASK``): negative seeds are valid.
SEED_MASK = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / the golden ratio: splitmix64's increment


@runtime_checkable
class KeyedIterator(Protocol):
    """An iterator (or async iterator) a source returns that names each item's seed key.

    The engine asks it for the key of the item at index ``i`` of the iteration (counted from
    0, settled items a resumed run skips included) after the item was read, and seeds a
    process worker's generators from ``item_seed(seed, epoch, key)`` instead of the item's
    position. Keys must differ between the different items of an epoch (a repeat of an item
    may share its key) and must not depend on which process reads the item.
    """

    def seed_key(self, index: int) -> int:
        """The seed key of the iteration's ``index``-th item: an int ``>= 0``."""
        ...


def fresh_seed() -> int:
    """A new base seed from the OS's entropy: ``0 <= seed < 2**63`` (fits an int64)."""
    return secrets.randbits(63)


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """NumPy's generator for ``(seed, epoch)``: ``default_rng(SeedSequence([seed, epoch]))``.

    ``np.random.default_rng([seed, epoch])`` is the same generator for ``0 <= seed < 2**64``.
    """
    import numpy as np

    return np.random.default_rng(np.random.SeedSequence([seed & SEED_MASK, epoch]))


def epoch_random(seed: int, epoch: int) -> random.Random:
    """A ``random.Random`` for ``(seed, epoch)`` (seeded from the string ``"seed:epoch"``)."""
    return random.Random(f"{seed}:{epoch}")


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit int for ``(seed, epoch)``, to seed a generator that takes an int (torch's).

    One splitmix64 step: neighbouring epochs get unrelated seeds.
    """
    return _splitmix64((seed + _GOLDEN * epoch) & SEED_MASK) & _MASK63


def item_seed(seed: int, epoch: int, item: int) -> int:
    """A 63-bit int for one item: BLAKE2b of the key, stable across processes and Pythons."""
    key = struct.pack("<QQQ", seed & SEED_MASK, epoch, item)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def item_random(seed: int, epoch: int, item: int) -> random.Random:
    """A ``random.Random`` for one item, seeded by a splitmix64 chain over the key."""
    x = (seed & SEED_MASK) ^ _GOLDEN
    for part in (epoch, item):
        x = _splitmix64((x + (part & SEED_MASK)) & SEED_MASK)
    return random.Random(x)


def seed_everything(seed: int) -> None:
    """Seed ``random``, and NumPy's and torch's global generators if they are imported."""
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed"):
        torch.manual_seed(seed)


def _splitmix64(x: int) -> int:
    x = (x + _GOLDEN) & SEED_MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & SEED_MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & SEED_MASK
    return x ^ (x >> 31)
